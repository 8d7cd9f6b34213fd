/*
 * Virtual memory management of the CUDA double: reservations, physical handles, mappings,
 * per-device access, sharing through POSIX file descriptors.
 *
 * The simulated device of each CUDA device keeps the memory rules (alignment, capacity, which
 * ranges are mapped, contents that follow the handle). The double adds what CUDA has on top:
 * handle values unique over devices and reference counted (cuMemRetainAllocationHandle), a
 * reservation that belongs to the device whose context was current, and per-device access masks
 * (the simulator makes memory reachable to everyone at the first cuMemSetAccess; the masks decide
 * what each device may touch, see cd_dev_can_touch).
 *
 * Which device: a handle lives on prop->location.id's device; a reservation on the device of the
 * context current at cuMemAddressReserve. Mapping a handle of one device into a reservation of
 * another is legal CUDA (reservations are process-wide address space) that the double cannot
 * model, since each simulated device owns its reservations: it aborts, saying so.
 *
 * None of these calls needs a current context except cuMemAddressReserve (cuda.h lists no
 * CUDA_ERROR_INVALID_CONTEXT for them; cuMemAddressReserve needs one to pick the device).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cd_internal.h"

/* Identity of every memory exported, for imports to find the exporter's device and properties. */
typedef struct exported {
    dev_t st_dev;
    ino_t st_ino;
    int dev;
    CUmemAllocationProp prop;
} exported;

static exported *exports;
static size_t n_exports;

static const uint64_t SEQ_MASK = ((uint64_t)1 << 48) - 1;

static bool granule_aligned(uintptr_t x) { return (x & (cd.gran - 1)) == 0; }

static cd_mapping *mapping_at(uintptr_t va) { return cd_map_get(&cd.pages, (uint64_t)(va >> cd.gran_shift)); }

/* ---- handles ---------------------------------------------------------------------------------- */

static bool issued(CUmemGenericAllocationHandle v)
{
    uint64_t dev = v >> 48, seq = v & SEQ_MASK;
    return dev >= 1 && dev <= (uint64_t)cd.ndev && seq >= 1 && seq <= cd.next_handle;
}

/* The live handle v names (lock held), or abort: cuMemRelease, "If handle is not a valid handle
 * the behavior is undefined"; cuMemExportToShareableHandle, "uses of the CUDA handle afterward will
 * lead to undefined behavior". */
static cd_handle *handle_get(const char *call, CUmemGenericAllocationHandle v)
{
    cd_handle *h = cd_map_get(&cd.handles, v);
    if (h && h->refs)
        return h;
    if (h || issued(v))
        cd_undefined(call, "handle %#llx was already released; cuda.h, cuMemRelease: \"If handle is "
                     "not a valid handle the behavior is undefined.\"", (unsigned long long)v);
    cd_undefined(call, "%#llx is not a handle this driver made; cuda.h, cuMemRelease: \"If handle is "
                 "not a valid handle the behavior is undefined.\"", (unsigned long long)v);
}

/* Released and unmapped: the memory goes back to the device (lock held). */
static void handle_maybe_free(cd_handle *h)
{
    if (h->refs || h->maps)
        return;
    cd_device *d = cd_dev(h->dev);
    /* cuMemRelease: "The memory allocation will be freed when all outstanding mappings to the
     * memory are unmapped and when all outstanding references to the handle (including it's
     * shareable counterparts) are also released." */
    d->ops->mem_release(d->sim, h->sim);
    cd_map_del(&cd.handles, h->value);
    free(h);
}

/* A new handle on simulator handle `sim` of device d (lock held); the caller releases `sim` on
 * failure. */
static CUresult handle_new(cd_device *d, vmm_phys sim, size_t size, const CUmemAllocationProp *prop,
                           CUmemGenericAllocationHandle *out)
{
    cd_handle *h = calloc(1, sizeof *h);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    h->value = ((uint64_t)(d->ordinal + 1) << 48) | (cd.next_handle + 1);
    h->dev = d->ordinal;
    h->sim = sim;
    h->size = size;
    h->refs = 1;
    h->prop = *prop;
    if (cd_map_put(&cd.handles, h->value, h)) {
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    cd.next_handle++;
    *out = h->value;
    return CUDA_SUCCESS;
}

/* ---- allocation properties -------------------------------------------------------------------- */

/* The checks of CUmemAllocationProp shared by cuMemCreate and cuMemGetAllocationGranularity; *out
 * gets the device. */
static CUresult prop_check(const CUmemAllocationProp *p, cd_device **out)
{
    /* CUmemAllocationType: only PINNED memory is modelled; MANAGED is a memory-pool type. */
    if (p->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    switch (p->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        /* Host-located VMM memory: CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
         * and ..._HOST_NUMA_... read 0 on the double's devices. */
        return CUDA_ERROR_NOT_SUPPORTED;
    default:
        /* "Specifying CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT as the CUmemLocation::type will
         * result in CUDA_ERROR_INVALID_VALUE." (and so for a type that is no location) */
        return CUDA_ERROR_INVALID_VALUE;
    }
    cd_device *d = cd_dev(p->location.id);
    if (!d)
        return CUDA_ERROR_INVALID_DEVICE; /* in cuMemCreate's list */
    const unsigned known = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |
                           CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC;
    unsigned types = (unsigned)p->requestedHandleTypes;
    if (types & ~known)
        return CUDA_ERROR_INVALID_VALUE;
    /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: "Permitted only on POSIX systems", so Win32 ones
     * are not; FABRIC needs CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED (0 here); POSIX needs
     * CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: "Device supports exporting
     * memory to a posix file descriptor with cuMemExportToShareableHandle, if requested via
     * cuMemCreate". cuda.h names no error code for an unsupported one: NOT_SUPPORTED ("the
     * attempted operation is not supported on the current system or device"). */
    if (types & (CU_MEM_HANDLE_TYPE_WIN32 | CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC))
        return CUDA_ERROR_NOT_SUPPORTED;
    if ((types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) && !d->posix_fd)
        return CUDA_ERROR_NOT_SUPPORTED;
    /* win32HandleMetaData: "In all other cases, this field is required to be zero." */
    if (p->win32HandleMetaData)
        return CUDA_ERROR_INVALID_VALUE;
    /* compressionType: "Allocation hint for requesting compressible memory ... Applications are
     * expected to query allocation property of the handle obtained with cuMemCreate using
     * cuMemGetAllocationPropertiesFromHandle to validate if the obtained allocation is compressible
     * or not." A hint: GENERIC is accepted and not granted (GENERIC_COMPRESSION_SUPPORTED is 0). */
    if (p->allocFlags.compressionType != CU_MEM_ALLOCATION_COMP_NONE &&
        p->allocFlags.compressionType != CU_MEM_ALLOCATION_COMP_GENERIC)
        return CUDA_ERROR_INVALID_VALUE;
    /* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: "Device supports specifying the
     * GPUDirect RDMA flag with cuMemCreate". Without it: NOT_SUPPORTED (cuda.h names none). */
    if (p->allocFlags.gpuDirectRDMACapable && !d->rdma)
        return CUDA_ERROR_NOT_SUPPORTED;
    /* usage: TILE_POOL is for sparse CUDA arrays (SPARSE_CUDA_ARRAY_SUPPORTED 0), HW_DECOMPRESS for
     * the decompression engine (MEM_DECOMPRESS_ALGORITHM_MASK 0). */
    unsigned usage = p->allocFlags.usage;
    if (usage & ~(unsigned)(CU_MEM_CREATE_USAGE_TILE_POOL | CU_MEM_CREATE_USAGE_HW_DECOMPRESS))
        return CUDA_ERROR_INVALID_VALUE;
    if (usage)
        return CUDA_ERROR_NOT_SUPPORTED;
    /* reserved[]: cuda.h does not say; like its every "reserved, must be zero" field, zero. */
    for (size_t i = 0; i < sizeof p->allocFlags.reserved; i++)
        if (p->allocFlags.reserved[i])
            return CUDA_ERROR_INVALID_VALUE;
    *out = d;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option)
{
    CD_CALL(cuMemGetAllocationGranularity);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!granularity || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return CUDA_ERROR_INVALID_VALUE;
    cd_device *d;
    cd_lock();
    r = prop_check(prop, &d);
    if (!r && !d->vmm)
        r = CUDA_ERROR_NOT_SUPPORTED;
    cd_unlock();
    if (r)
        return r;
    /* CUDADOUBLE_GRANULARITY_KB is both: "recommended is the same" (cudadouble.h). */
    *granularity = cd.gran;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    CD_CALL(cuMemCreate);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    r = cd_capture_unsafe();
    cd_device *d = NULL;
    /* flags: "flags for future use, must be zero now." */
    if (!r && (!handle || !prop || flags != 0))
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r)
        r = prop_check(prop, &d);
    if (!r && !d->vmm)
        r = CUDA_ERROR_NOT_SUPPORTED;
    /* "The size of this allocation must be a multiple of the the value given via
     * cuMemGetAllocationGranularity with the CU_MEM_ALLOC_GRANULARITY_MINIMUM flag." */
    if (!r && (size == 0 || !granule_aligned(size)))
        r = CUDA_ERROR_INVALID_VALUE;
    vmm_phys sim = 0;
    if (!r)
        r = (CUresult)d->ops->mem_create(d->sim, size, &sim);
    if (!r) {
        CUmemAllocationProp got = *prop;
        got.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_NONE; /* the hint is not granted */
        got.allocFlags.gpuDirectRDMACapable = prop->allocFlags.gpuDirectRDMACapable ? 1 : 0;
        r = handle_new(d, sim, size, &got, handle);
        if (r)
            d->ops->mem_release(d->sim, sim);
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CD_CALL(cuMemRelease);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    r = cd_capture_unsafe();
    if (!r) {
        cd_handle *h = handle_get("cuMemRelease", handle);
        /* "Each time a recipient process imports a shareable handle, it needs to pair it with
         * cuMemRelease for the handle to be freed." Retains count the same way. */
        h->refs--;
        handle_maybe_free(h);
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                        CUmemGenericAllocationHandle handle)
{
    CD_CALL(cuMemGetAllocationPropertiesFromHandle);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    cd_lock();
    *prop = handle_get("cuMemGetAllocationPropertiesFromHandle", handle)->prop;
    cd_unlock();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CD_CALL(cuMemRetainAllocationHandle);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    cd_lock();
    /* "The address addr, can be any address in a range previously mapped by cuMemMap, and not
     * necessarily the start address." "If the address requested is not mapped, the function will
     * fail." "The handle is guaranteed to be the same handle value used to map the memory."
     * That holds after the handle's own release while it is still mapped: the mapping keeps it. */
    cd_mapping *m = mapping_at((uintptr_t)addr);
    if (m) {
        m->h->refs++; /* "The returned handle must be released with corresponding number of calls
                       * to cuMemRelease." */
        *handle = m->h->value;
    }
    cd_unlock();
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- reservations ----------------------------------------------------------------------------- */

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags)
{
    CD_CALL(cuMemAddressReserve);
    CUresult r = cd_check_init();
    if (r)
        return r;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    cd_ctx *c = NULL;
    cd_lock();
    /* The device is the current context's: cuda.h lists no INVALID_CONTEXT here (a reservation is
     * process-wide on a GPU), but each simulated device owns its address ranges. */
    r = cd_enter(&c);
    if (!r)
        r = cd_capture_unsafe();
    /* "The size and address parameters must be a multiple of the host page size and the alignment
     * must be a power of two or zero for default alignment." flags: "Currently unused, must be
     * zero". */
    if (!r && (!ptr || size == 0 || size % page || addr % page || (alignment & (alignment - 1)) ||
               flags != 0))
        r = CUDA_ERROR_INVALID_VALUE;
    cd_device *d = r ? NULL : cd_ctx_dev(c);
    if (!r && !d->vmm)
        r = CUDA_ERROR_NOT_SUPPORTED;
    /* The simulator reserves whole granules: a page-multiple size is rounded up (the tail granule
     * is then usable on the double and perhaps not on a GPU). "If addr is 0, then the driver
     * chooses the address ... when it is non-zero then the driver treats it as a hint": the double
     * always chooses. */
    size_t sim_size = (size + cd.gran - 1) & ~(cd.gran - 1);
    size_t sim_align = alignment > cd.gran ? alignment : 0;
    uintptr_t va = 0;
    if (!r)
        r = (CUresult)d->ops->va_reserve(d->sim, sim_size, sim_align, &va);
    if (!r) {
        cd_res *res = calloc(1, sizeof *res);
        if (res) {
            *res = (cd_res){{va, sim_size}, size, d->ordinal, 0};
            if (cd_ranges_add(&cd.res, &res->r) == 0) {
                *ptr = va;
            } else {
                free(res);
                res = NULL;
            }
        }
        if (!res) {
            d->ops->va_free(d->sim, va, sim_size);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CD_CALL(cuMemAddressFree);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    r = cd_capture_unsafe();
    cd_res *res = r ? NULL : (cd_res *)cd_ranges_find(&cd.res, ptr);
    /* "The size must match what was given to memAddressReserve and the ptr given must match what
     * was returned from memAddressReserve." */
    if (!r && (!res || res->r.start != ptr || res->asked != size))
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r && res->maps)
        cd_undefined("cuMemAddressFree", "[%#llx, +%zu) still has %u mapping(s); cuda.h documents no "
                     "result for freeing a reservation that is mapped (cuMemAddressFree: \"Frees a "
                     "virtual address range reserved by cuMemAddressReserve\"; cuMemUnmap: \"When "
                     "cuMemUnmap returns successfully the address range is converted to an address "
                     "reservation\"): unmap first", (unsigned long long)ptr, size, res->maps);
    if (!r) {
        cd_device *d = cd_dev(res->dev);
        r = (CUresult)d->ops->va_free(d->sim, res->r.start, res->r.len);
        if (!r) {
            cd_ranges_remove(&cd.res, &res->r);
            free(res);
        }
    }
    cd_unlock();
    return r;
}

/* ---- mappings --------------------------------------------------------------------------------- */

static void pages_del(uintptr_t va, size_t size)
{
    for (size_t off = 0; off < size; off += cd.gran)
        cd_map_del(&cd.pages, (uint64_t)((va + off) >> cd.gran_shift));
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags)
{
    CD_CALL(cuMemMap);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    r = cd_capture_unsafe();
    /* flags: "flags for future use, must be zero now." offset: "Note: currently must be zero." */
    if (!r && (flags != 0 || offset != 0))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r) {
        cd_unlock();
        return r;
    }
    cd_handle *h = handle_get("cuMemMap", handle);
    /* "Both ptr, size, and offset must be a multiple of the value given via
     * cuMemGetAllocationGranularity with the CU_MEM_ALLOC_GRANULARITY_MINIMUM flag." "This range
     * must be an address reservation previously reserved with cuMemAddressReserve, and offset +
     * size must be less than the size of the memory allocation." */
    cd_res *res = (cd_res *)cd_ranges_find(&cd.res, ptr);
    if (size == 0 || !granule_aligned(ptr) || !granule_aligned(size) || !res ||
        size > res->r.len - (ptr - res->r.start) || size > h->size) {
        cd_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t off = 0; off < size; off += cd.gran)
        if (mapping_at(ptr + off))
            cd_undefined("cuMemMap", "[%#llx, +%zu) overlaps a mapping; cuda.h: \"cuMemMap can only "
                         "create mappings on VA range reservations that are not currently mapped.\" "
                         "and promises no error code for it", (unsigned long long)ptr, size);
    if (size < h->size)
        cd_limitation("cuMemMap", "mapping %zu bytes of a %zu-byte allocation: the simulator maps "
                      "whole handles", size, h->size);
    if (h->dev != res->dev)
        cd_limitation("cuMemMap", "a handle of device %d mapped into a reservation made with device "
                      "%d's context current: each simulated device owns its reservations", h->dev,
                      res->dev);
    cd_device *d = cd_dev(h->dev);
    cd_mapping *m = calloc(1, sizeof *m);
    uint16_t *access = calloc(size >> cd.gran_shift, sizeof *access);
    r = m && access ? (CUresult)d->ops->mem_map(d->sim, ptr, size, 0, h->sim) : CUDA_ERROR_OUT_OF_MEMORY;
    size_t off = 0;
    if (!r) {
        *m = (cd_mapping){ptr, size, h, res, access};
        for (; off < size; off += cd.gran)
            if (cd_map_put(&cd.pages, (uint64_t)((ptr + off) >> cd.gran_shift), m))
                break;
        if (off < size) {
            pages_del(ptr, off);
            d->ops->mem_unmap(d->sim, ptr, size);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (r) {
        free(m);
        free(access);
    } else {
        h->maps++;
        res->maps++;
        cd.n_mappings++;
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CD_CALL(cuMemUnmap);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    r = cd_capture_unsafe();
    cd_mapping *m = r || !granule_aligned(ptr) ? NULL : mapping_at(ptr);
    /* "The range must be the entire contiguous address range that was mapped to. In other words,
     * cuMemUnmap cannot unmap a sub-range of an address range mapped by cuMemCreate / cuMemMap." */
    if (!r && (!m || m->va != ptr || m->size != size))
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r) {
        cd_device *d = cd_dev(m->h->dev);
        r = (CUresult)d->ops->mem_unmap(d->sim, ptr, size);
    }
    if (!r) {
        /* "Any new mapping to this virtual address will need to have access granted through
         * cuMemSetAccess, as all mappings start with no accessibility setup." The access masks
         * go with the mapping. */
        pages_del(ptr, size);
        cd_handle *h = m->h;
        h->maps--;
        m->res->maps--;
        cd.n_mappings--;
        free(m->access);
        free(m);
        /* "Any backing memory allocations will be freed if there are no existing mappings and
         * there are no unreleased memory handles." */
        handle_maybe_free(h);
    }
    cd_unlock();
    return r;
}

/* ---- access ----------------------------------------------------------------------------------- */

enum { ACC_R = 1, ACC_W = 2 };

static unsigned access_bits(const cd_mapping *m, uintptr_t va, int dev)
{
    return (unsigned)(m->access[(va - m->va) >> cd.gran_shift] >> (2 * dev)) & 3u;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    CD_CALL(cuMemSetAccess);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    r = cd_capture_unsafe();
    if (!r && (!desc || count == 0 || size == 0 || !granule_aligned(ptr) || !granule_aligned(size)))
        r = CUDA_ERROR_INVALID_VALUE;
    /* "The range must be a fully mapped address range containing all allocations created by
     * cuMemMap / cuMemCreate." The double, as the simulator, also takes a granule-aligned part of
     * a mapping (cuda.h does not say a part is refused). */
    int mem_dev = -1;
    for (size_t off = 0; !r && off < size; off += cd.gran) {
        cd_mapping *m = mapping_at(ptr + off);
        if (!m)
            r = CUDA_ERROR_INVALID_VALUE;
        else if (mem_dev >= 0 && m->h->dev != mem_dev)
            cd_limitation("cuMemSetAccess", "one call over memory of devices %d and %d", mem_dev,
                          m->h->dev);
        else
            mem_dev = m->h->dev;
    }
    bool grants = false;
    for (size_t i = 0; !r && i < count; i++) {
        const CUmemAccessDesc *a = &desc[i];
        /* "Users cannot specify CU_MEM_LOCATION_TYPE_HOST_NUMA accessibility for allocations
         * created on with other location types." Host access to device memory is not modelled
         * either: only device locations. */
        if (a->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            r = CUDA_ERROR_INVALID_VALUE;
        else if (!cd_dev(a->location.id))
            r = CUDA_ERROR_INVALID_DEVICE;
        else if (a->flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && a->flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
                 a->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            r = CUDA_ERROR_INVALID_VALUE;
        /* A device that cannot access the memory's device (cuDeviceCanAccessPeer 0): cuda.h is
         * silent; INVALID_DEVICE, in its list. */
        else if (a->flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && !cd_can_access(a->location.id, mem_dev))
            r = CUDA_ERROR_INVALID_DEVICE;
        else
            grants |= a->flags != CU_MEM_ACCESS_FLAGS_PROT_NONE;
    }
    /* The simulator opens the memory to the process on its set_access (it has one "device"); the
     * masks below say which of the double's devices may touch it. */
    if (!r && grants) {
        cd_device *d = cd_dev(mem_dev);
        r = (CUresult)d->ops->set_access(d->sim, ptr, size);
    }
    for (size_t off = 0; !r && off < size; off += cd.gran) {
        cd_mapping *m = mapping_at(ptr + off);
        uint16_t *acc = &m->access[(ptr + off - m->va) >> cd.gran_shift];
        for (size_t i = 0; i < count; i++) { /* a later entry for the same device wins */
            int dev = desc[i].location.id;
            unsigned bits = desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? ACC_R | ACC_W
                            : desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? ACC_R
                                                                                : 0u;
            *acc = (uint16_t)((*acc & ~(3u << (2 * dev))) | bits << (2 * dev));
        }
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
    CD_CALL(cuMemGetAccess);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cd_dev(location->id))
        return CUDA_ERROR_INVALID_DEVICE;
    cd_lock();
    cd_mapping *m = mapping_at(ptr);
    if (m) {
        unsigned bits = access_bits(m, ptr, location->id);
        *flags = bits & ACC_W ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                 : bits & ACC_R ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    }
    cd_unlock();
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; /* not mapped: cuda.h is silent */
}

/* Every granule of [p, p+n) is mapped, and (dev >= 0) grants dev what it needs. */
static bool mapped_for(int dev, uintptr_t p, size_t n, bool write)
{
    uintptr_t end = p + n;
    if (end < p)
        return false;
    for (uintptr_t a = p & ~(uintptr_t)(cd.gran - 1); a < end; a += cd.gran) {
        cd_mapping *m = mapping_at(a);
        if (!m)
            return false;
        if (dev >= 0 && !(access_bits(m, a, dev) & (write ? ACC_W : ACC_R)))
            return false;
    }
    return true;
}

bool cd_dev_can_touch(int dev, uintptr_t p, size_t n, bool write)
{
    if (n == 0)
        return true;
    if (mapping_at(p))
        return mapped_for(dev, p, n, write);
    /* cuMemAlloc memory: its own device (peer access needs cuCtxEnablePeerAccess, which the double
     * does not export). */
    cd_linear *l = cd_linear_at(p, n);
    if (l)
        return l->dev == dev;
    /* cuMemHostAlloc: "all host memory allocated using cuMemHostAlloc() will automatically be
     * immediately accessible to all contexts on all devices which support unified addressing". */
    return cd_host_at(p, n) != NULL;
}

bool cd_known_memory(uintptr_t p, size_t n)
{
    if (n == 0)
        return true;
    if (mapping_at(p))
        return mapped_for(-1, p, n, false);
    return cd_linear_at(p, n) || cd_host_at(p, n);
}

bool cd_device_space(uintptr_t p, size_t n)
{
    return cd_ranges_overlap(&cd.res, p, n) || cd_ranges_overlap(&cd.linear, p, n);
}

CUresult cd_hook_device_access(int dev, CUdeviceptr p, size_t n, void *buf, int write)
{
    if (!atomic_load(&cd.initialized))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cd_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!buf && n)
        return CUDA_ERROR_INVALID_VALUE;
    cd_lock();
    bool ok = cd_dev_can_touch(dev, p, n, write != 0);
    if (ok && n) { /* under the lock: nothing can unmap it meanwhile */
        if (write)
            memcpy((void *)p, buf, n);
        else
            memcpy(buf, (const void *)p, n);
    }
    cd_unlock();
    return ok ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_ADDRESS;
}

/* ---- sharing ---------------------------------------------------------------------------------- */

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType, unsigned long long flags)
{
    CD_CALL(cuMemExportToShareableHandle);
    CUresult r = cd_check_init();
    if (r)
        return r;
    /* flags: "Reserved, must be zero" */
    if (!shareableHandle || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    cd_lock();
    cd_handle *h = handle_get("cuMemExportToShareableHandle", handle);
    if (handleType == CU_MEM_HANDLE_TYPE_WIN32 || handleType == CU_MEM_HANDLE_TYPE_WIN32_KMT ||
        handleType == CU_MEM_HANDLE_TYPE_FABRIC)
        r = CUDA_ERROR_NOT_SUPPORTED; /* never granted at cuMemCreate on the double */
    else if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        r = CUDA_ERROR_INVALID_VALUE;
    /* A handle created without the type: CU_MEM_HANDLE_TYPE_NONE "Does not allow any export
     * mechanism". cuda.h names no code: INVALID_VALUE (handleType is not one this handle has). */
    else if (!(h->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        r = CUDA_ERROR_INVALID_VALUE;
    int fd = -1;
    cd_device *d = cd_dev(h->dev);
    if (!r)
        r = (CUresult)vmm_sim_driver_export_fd(d->sim, h->sim, &fd);
    struct stat st;
    if (!r && !h->have_ino && fstat(fd, &st) == 0) {
        exported *v = realloc(exports, (n_exports + 1) * sizeof *v);
        if (v) {
            exports = v;
            exports[n_exports++] = (exported){st.st_dev, st.st_ino, h->dev, h->prop};
            h->have_ino = true;
        }
    }
    cd_unlock();
    /* POSIX_FILE_DESCRIPTOR: "Allows a file descriptor to be used for exporting. ... (int)". */
    if (!r)
        *(int *)shareableHandle = fd;
    return r;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                CUmemAllocationHandleType shHandleType)
{
    CD_CALL(cuMemImportFromShareableHandle);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType == CU_MEM_HANDLE_TYPE_WIN32 || shHandleType == CU_MEM_HANDLE_TYPE_WIN32_KMT ||
        shHandleType == CU_MEM_HANDLE_TYPE_FABRIC)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    /* A file descriptor travels by value in the pointer, as CUDA's samples pass it:
     * (void *)(uintptr_t)fd. */
    int fd = (int)(intptr_t)osHandle;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    cd_lock();
    /* The exporter's device and properties when this process exported it; otherwise it came from
     * another process and the double cannot tell its device: the current context's, else device 0
     * (a choice; "If the current process cannot support the memory described by this shareable
     * handle, this API will error as CUDA_ERROR_NOT_SUPPORTED" has nothing to go on). */
    const exported *x = NULL;
    for (size_t i = 0; i < n_exports && !x; i++)
        if (exports[i].st_dev == st.st_dev && exports[i].st_ino == st.st_ino)
            x = &exports[i];
    cd_ctx *cur = cd_current();
    cd_device *d = cd_dev(x ? x->dev : cur ? cur->dev : 0);
    CUmemAllocationProp prop;
    if (x) {
        prop = x->prop;
    } else {
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = d->ordinal;
    }
    vmm_phys sim = 0;
    r = d->vmm ? (CUresult)vmm_sim_driver_import_fd(d->sim, fd, &sim) : CUDA_ERROR_NOT_SUPPORTED;
    /* "There is no guarantee that the contents of handle will be the same CUDA memory handle for the
     * same given OS shareable handle": each import is a new handle, released on its own. */
    if (!r) {
        r = handle_new(d, sim, (size_t)st.st_size, &prop, handle);
        if (r)
            d->ops->mem_release(d->sim, sim);
    }
    cd_unlock();
    return r;
}
