/*
 * The simulated device's options: defaults, the modeled cost of a call, call-kind names and the
 * cost table a sim_cost_file holds. Data only, no device: the configuration (core/config.c) parses
 * and prints the sim_* keys through these, so nothing above the driver names the simulator itself
 * (docs/design.md, "Layers"). drv_sim.c charges calls with vmm_sim_cost_of.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "base/errors.h"
#include "driver/driver.h"

/* ---- defaults -------------------------------------------------------------------------------- */

enum {
    SIM_DEFAULT_GRANULARITY = 2 << 20, /* cuMemGetAllocationGranularity on current GPUs */
};
#define SIM_DEFAULT_CAPACITY ((size_t)80 << 30) /* an 80 GiB A100/H100 */

/*
 * Modeled cost per call, nanoseconds. Measured (kvcached's benchmarks/bench_vmm, its sample output on
 * an A100, 2 MiB pages, averages): va_reserve 19 us, mem_create 193 us, mem_map 1.45 us, set_access
 * 36 us, mem_unmap 25.6 us; cudaMalloc ~50 us. The others have no measurement at hand and are
 * estimates:
 *  - mem_free 30 us: cuMemFree tears down the same page-table entries as cuMemUnmap (25.6 us) plus
 *    returns the memory; the device synchronization it implies is counted separately (device_syncs),
 *    not in this figure.
 *  - mem_release 5 us, va_free 5 us: bookkeeping-only calls once the range is unmapped.
 *  - stream_create / stream_destroy 5 us: driver object creation, host side only.
 *  - launch_host, memset, memcpy 3 us: the usual host-side cost of a kernel / copy launch.
 *  - every query, event and sync call 1 us: the host-side cost of a cheap driver call (a sync's
 *    waiting time is real time in the simulation, not modeled cost).
 */
static const uint64_t sim_default_cost_ns[VMM_SIM_CALL_COUNT] = {
    [VMM_SIM_CALL_DEVICE_INFO] = 1000,
    [VMM_SIM_CALL_MEM_GET_INFO] = 1000,
    [VMM_SIM_CALL_VA_RESERVE] = 19000,
    [VMM_SIM_CALL_VA_FREE] = 5000,
    [VMM_SIM_CALL_MEM_CREATE] = 193000,
    [VMM_SIM_CALL_MEM_RELEASE] = 5000,
    [VMM_SIM_CALL_MEM_MAP] = 1450,
    [VMM_SIM_CALL_MEM_UNMAP] = 25600,
    [VMM_SIM_CALL_SET_ACCESS] = 36000,
    [VMM_SIM_CALL_MEM_ALLOC] = 50000,
    [VMM_SIM_CALL_MEM_FREE] = 30000,
    [VMM_SIM_CALL_STREAM_CREATE] = 5000,
    [VMM_SIM_CALL_STREAM_DESTROY] = 5000,
    [VMM_SIM_CALL_STREAM_SYNC] = 1000,
    [VMM_SIM_CALL_DEVICE_SYNC] = 1000,
    [VMM_SIM_CALL_EVENT_CREATE] = 1000,
    [VMM_SIM_CALL_EVENT_RECORD] = 1000,
    [VMM_SIM_CALL_EVENT_QUERY] = 1000,
    [VMM_SIM_CALL_EVENT_SYNC] = 1000,
    [VMM_SIM_CALL_EVENT_DESTROY] = 1000,
    [VMM_SIM_CALL_STREAM_WAIT_EVENT] = 1000,
    [VMM_SIM_CALL_LAUNCH_HOST] = 3000,
    [VMM_SIM_CALL_MEMSET] = 3000,
    [VMM_SIM_CALL_MEMCPY] = 3000,
    /* Estimates, no measurement at hand: pinning host pages costs about what creating device
     * pages does per call (mem_create 193 us would be the pessimistic end); 100 us is taken.
     * host_free 30 us as mem_free, its device synchronization counted apart. */
    [VMM_SIM_CALL_HOST_ALLOC] = 100000,
    [VMM_SIM_CALL_HOST_FREE] = 30000,
};
_Static_assert(sizeof sim_default_cost_ns / sizeof sim_default_cost_ns[0] == VMM_SIM_CALL_COUNT,
               "one cost per call kind");

void vmm_sim_default_options(vmm_sim_options *o)
{
    memset(o, 0, sizeof *o);
    o->capacity = SIM_DEFAULT_CAPACITY;
    o->granularity = SIM_DEFAULT_GRANULARITY;
    o->backed = 1;
    o->vmm_supported = 1;
    o->cost_model = 1;
    memcpy(o->cost_ns, sim_default_cost_ns, sizeof o->cost_ns);
    o->fail_kind = -2;
    o->fail_p = 0.0;
    o->fail_seed = 0;
}

uint64_t vmm_sim_cost_of(const vmm_sim_options *o, int kind, uint64_t size)
{
    /* the two points of this kind around size (lo: largest at or below, hi: smallest above), and
     * the two largest for sizes past the table */
    const struct vmm_sim_cost_point *lo = NULL, *hi = NULL, *last = NULL, *prev = NULL;
    for (int i = 0; i < o->n_cost_points; i++) {
        const struct vmm_sim_cost_point *q = &o->cost_points[i];
        if (q->kind != kind)
            continue;
        if (q->size <= size && (!lo || q->size > lo->size))
            lo = q;
        if (q->size > size && (!hi || q->size < hi->size))
            hi = q;
        if (!last || q->size > last->size) {
            prev = last;
            last = q;
        } else if (!prev || q->size > prev->size) {
            prev = q;
        }
    }
    if (!last)
        return o->cost_ns[kind];
    if (!lo)
        return hi->ns; /* below the table: its first point */
    if (hi) {
        double f = (double)(size - lo->size) / (double)(hi->size - lo->size);
        return (uint64_t)((double)lo->ns + f * ((double)hi->ns - (double)lo->ns) + 0.5);
    }
    if (!prev || last->size == prev->size)
        return last->ns;
    double slope = ((double)last->ns - (double)prev->ns) / (double)(last->size - prev->size);
    double x = (double)last->ns + slope * (double)(size - last->size);
    return x > (double)last->ns ? (uint64_t)(x + 0.5) : last->ns;
}

static const char *const sim_call_names[VMM_SIM_CALL_COUNT] = {
#define SIM_CALL_NAME_(name, str) [VMM_SIM_CALL_##name] = str,
    VMM_SIM_CALL_MAP(SIM_CALL_NAME_)
#undef SIM_CALL_NAME_
};

VMM_API const char *vmm_sim_call_name(int kind)
{
    if (kind < 0 || kind >= VMM_SIM_CALL_COUNT)
        return NULL;
    return sim_call_names[kind];
}

int vmm_sim_call_kind(const char *name, size_t len)
{
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++) {
        const char *lit = sim_call_names[k];
        size_t i = 0;
        if (strlen(lit) != len)
            continue;
        while (i < len && tolower((unsigned char)name[i]) == lit[i])
            i++;
        if (i == len)
            return k;
    }
    return -3;
}

/* ---- sim_cost_file: a JSON file with "sim_cost_table": [["kind", size_bytes, ns], ...] ------------
 * (tools/gpu-check writes it as costs.json). Only that array is read, with a scanner for exactly
 * that shape: the file's other members may be anything. Size 0 sets the kind's flat cost (as
 * sim_cost_ns does); other sizes are cost points (driver.h, vmm_sim_options). */
static const char *json_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

int vmm_sim_cost_table_parse(vmm_sim_options *o, const char *key, const char *path, const char *text)
{
    const char *p = strstr(text, "\"sim_cost_table\"");
    if (!p)
        return vmm_fail(VMM_ECONFIG, "config key '%s': %s has no \"sim_cost_table\" member", key, path);
    p = json_ws(p + strlen("\"sim_cost_table\""));
    if (*p != ':' || *(p = json_ws(p + 1)) != '[')
        return vmm_fail(VMM_ECONFIG, "config key '%s': %s: \"sim_cost_table\" is not an array", key, path);
    o->n_cost_points = 0;
    p = json_ws(p + 1);
    while (*p != ']') {
        char name[64];
        size_t n = 0;
        unsigned long long size, ns;
        int used = 0;
        if (*p != '[' || *(p = json_ws(p + 1)) != '"')
            goto bad;
        for (p++; *p && *p != '"' && n + 1 < sizeof name; p++)
            name[n++] = *p;
        name[n] = 0;
        if (*p != '"' || *(p = json_ws(p + 1)) != ',')
            goto bad;
        p = json_ws(p + 1);
        if (sscanf(p, "%llu%n", &size, &used) != 1 || *p == '-')
            goto bad;
        if (*(p = json_ws(p + used)) != ',')
            goto bad;
        p = json_ws(p + 1);
        if (sscanf(p, "%llu%n", &ns, &used) != 1 || *p == '-')
            goto bad;
        if (*(p = json_ws(p + used)) != ']')
            goto bad;
        int kind = vmm_sim_call_kind(name, n);
        if (kind < 0)
            return vmm_fail(VMM_ECONFIG, "config key '%s': %s: unknown call kind '%s'", key, path, name);
        if (size == 0) {
            o->cost_ns[kind] = ns;
        } else {
            if (o->n_cost_points == VMM_SIM_COST_POINTS_MAX)
                return vmm_fail(VMM_ECONFIG, "config key '%s': %s: more than %d sized costs", key, path,
                                VMM_SIM_COST_POINTS_MAX);
            o->cost_points[o->n_cost_points++] = (struct vmm_sim_cost_point){kind, size, ns};
        }
        p = json_ws(p + 1);
        if (*p == ',')
            p = json_ws(p + 1);
        else if (*p != ']')
            goto bad;
    }
    return VMM_OK;
bad:
    return vmm_fail(VMM_ECONFIG,
                    "config key '%s': %s: \"sim_cost_table\" must hold [\"kind\", size_bytes, nanoseconds] "
                    "items; bad item at byte %ld",
                    key, path, (long)(p - text));
}
