/*
 * Sharing blocks across processes.
 *
 * Export. A block's pages are physical handles created exportable (the ipc key, driver op
 * set_exportable); vmm_ipc_get_handle exports each page the block spans as a POSIX file descriptor
 * (cuMemExportToShareableHandle) and adds a descriptor of the block's reference counter: a small
 * memfd shared between the processes, holding the number of references outstanding (PyTorch keeps
 * the same kind of counter in CudaIPCRefCountersFile). Each handle made counts one.
 *
 * Import. vmm_ipc_open imports each descriptor (cuMemImportFromShareableHandle), maps the handles
 * side by side in a reservation of its own and grants access (device and peers, as for the
 * allocator's memory). The mapping is not an allocator block: it is on the import list until
 * vmm_ipc_close, which gives the reference back.
 *
 * Keep-alive. vmm_free of an exported block whose counter is not zero leaves the block allocated,
 * in limbo, and registers the collector (a free-memory callback, run on cache misses, as PyTorch's
 * CudaIPCCollect): it frees the blocks whose counter came down to zero. Exports whose counter is
 * zero are forgotten when their block is freed.
 *
 * This file is the public entry points (vmmalloc.h's vmm_ipc_*); the export and import records
 * they keep, which the core consults, are features/ipc.c.
 *
 * Locking: the export and import lists are under the allocator's lock. Handles are plain heap
 * objects of the caller's, with no allocator.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/metadata.h"
#include "core/callbacks.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/types.h"
#include "driver/driver.h"
#include "features/ipc.h"

enum {
    FDS_PER_MSG = 250,      /* descriptors per message (Linux allows SCM_MAX_FD = 253) */
    CHUNK_MAGIC = 0x766d6d63, /* "vmmc": a message carrying more descriptors */
};

struct vmm_ipc_handle {
    vmm_ipc_desc d;
    int *fds;                 /* n_pages + 1: the pages, then the counter */
    size_t n_fds;
    int consumed;             /* its reference went to a mapping (vmm_ipc_open) */
};

typedef struct vmm_ipc ipc_state;

/* ---- export ------------------------------------------------------------------------------------- */

static void handle_close_fds(vmm_ipc_handle *h)
{
    for (size_t i = 0; i < h->n_fds; i++)
        if (h->fds[i] >= 0)
            close(h->fds[i]);
}

static vmm_ipc_handle *handle_new(size_t n_fds)
{
    vmm_ipc_handle *h = calloc(1, sizeof *h);
    int *fds = calloc(n_fds ? n_fds : 1, sizeof *fds);
    if (!h || !fds) {
        free(h);
        free(fds);
        return NULL;
    }
    for (size_t i = 0; i < n_fds; i++)
        fds[i] = -1;
    h->fds = fds;
    h->n_fds = n_fds;
    return h;
}

static int collect_cb(void *ctx) { return vmm_ipc_collect(ctx) > 0; }

VMM_API int vmm_ipc_get_handle(vmm_allocator *a, const void *ptr, vmm_ipc_handle **out)
{
    if (!a || !out)
        return vmm_fail(VMM_EINVAL, "vmm_ipc_get_handle: NULL argument");
    *out = NULL;
    vmm_lock(a);
    const vmm_driver_ops *ops = a->drv->ops;
    int rc = VMM_OK;
    vmm_ipc_handle *h = NULL;
    vmm_block *b = vmm_live_find(a, (uintptr_t)ptr);
    vmm_ipc_export *rec = NULL;
    if (!b) {
        rc = vmm_fail(VMM_EBADPTR, "vmm_ipc_get_handle: %p is not a live block of this allocator", ptr);
        goto out;
    }
    vmm_segment *seg = b->seg;
    rec = vmm_ipc_export_find(a->ipc, b->addr);
    if (rec && rec->limbo) {
        rc = vmm_fail(VMM_EBADPTR, "vmm_ipc_get_handle: the block at %p was freed", ptr);
        goto out;
    }
    if (!seg->expandable) {
        rc = vmm_fail(VMM_ENOTSUP, "vmm_ipc_get_handle: %p is in a classic (cuMemAlloc) segment, which "
                                   "has no exportable pages: use expandable_segments:true", ptr);
        goto out;
    }
    if (seg->asleep) {
        rc = vmm_fail(VMM_EINVAL, "vmm_ipc_get_handle: the block at %p sleeps", ptr);
        goto out;
    }
    if (!ops->export_fd || !a->dev.posix_fd_handles) {
        rc = vmm_fail(VMM_ENOTSUP, "vmm_ipc_get_handle: pages of device %d (%s) are not created "
                                   "exportable (config key ipc:%s; the device%s supports POSIX file "
                                   "descriptor handles)", a->dev.ordinal, a->dev.name,
                      a->cfg.ipc < 0 ? "auto" : a->cfg.ipc ? "true" : "false",
                      ops->export_fd && a->cfg.ipc == 0 ? "" : " may not");
        goto out;
    }
    ipc_state *I = vmm_ipc_state(a);
    size_t ps = seg->page_size, off = b->addr - seg->base;
    size_t p0 = off / ps, p1 = (off + b->size + ps - 1) / ps, n = p1 - p0;
    h = handle_new(n + 1);
    if (!I || !h) {
        rc = vmm_fail(VMM_EHOSTMEM, "vmm_ipc_get_handle: out of host memory");
        goto out;
    }
    for (size_t k = 0; k < n && !rc; k++) {
        int r = ops->export_fd(a->drv, seg->pages[p0 + k], &h->fds[k]);
        if (r)
            rc = r == VMM_DRV_INVALID_VALUE
                     ? vmm_fail(VMM_ENOTSUP, "vmm_ipc_get_handle: a page of %p was not created exportable "
                                             "(the system refused exportable pages earlier)", ptr)
                     : vmm_fail_drv(r, "vmm_ipc_get_handle: export_fd");
    }
    if (!rc && !rec)
        rc = vmm_ipc_export_add(a, b, &rec);
    if (!rc && (h->fds[n] = fcntl(rec->fd, F_DUPFD_CLOEXEC, 0)) < 0)
        rc = vmm_fail(VMM_EHOSTMEM, "vmm_ipc_get_handle: dup: %s", strerror(errno));
    if (!rc && !I->collector) {
        rc = vmm_cb_add_free_locked(a, collect_cb, a);
        I->collector = rc == VMM_OK;
    }
    if (rc) {
        if (rec && atomic_load(rec->count) == 0)
            vmm_ipc_export_drop(a, rec);
        goto out;
    }
    atomic_fetch_add(rec->count, 1);
    h->d = (vmm_ipc_desc){VMM_IPC_MAGIC, VMM_IPC_VERSION, a->dev.ordinal, (int32_t)getpid(), rec->id,
                          b->size, b->addr - (seg->base + p0 * ps), ps, n};
    vmm_ipc_stats_update(a);
out:
    vmm_unlock(a);
    if (rc && h) {
        handle_close_fds(h);
        free(h->fds);
        free(h);
        h = NULL;
    }
    *out = h;
    return rc;
}

VMM_API int vmm_ipc_collect(vmm_allocator *a)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_ipc_collect: allocator is NULL");
    enum { BATCH = 64 };
    uintptr_t addrs[BATCH];
    int total = 0;
    for (;;) {
        size_t n = 0;
        vmm_lock(a);
        ipc_state *I = a->ipc;
        for (size_t i = 0; I && i < I->n_ex && n < BATCH; i++) {
            vmm_ipc_export *r = &I->ex[i];
            if (r->limbo && !r->releasing && atomic_load(r->count) <= 0) {
                r->releasing = 1;
                addrs[n++] = r->addr;
            }
        }
        vmm_unlock(a);
        for (size_t i = 0; i < n; i++)
            if (a->hooks.free(a, (void *)addrs[i]) == VMM_OK)
                total++;
        if (n < BATCH)
            return total;
    }
}

/* ---- handles ---------------------------------------------------------------------------------- */

VMM_API int vmm_ipc_handle_desc(const vmm_ipc_handle *h, vmm_ipc_desc *desc, const int **fds, size_t *n_fds)
{
    if (!h)
        return vmm_fail(VMM_EINVAL, "vmm_ipc_handle_desc: handle is NULL");
    if (desc)
        *desc = h->d;
    if (fds)
        *fds = h->fds;
    if (n_fds)
        *n_fds = h->n_fds;
    return VMM_OK;
}

static int desc_valid(const vmm_ipc_desc *d, size_t n_fds)
{
    return d->magic == VMM_IPC_MAGIC && d->version == VMM_IPC_VERSION && d->page_size &&
           d->n_pages && d->n_pages < ((uint64_t)1 << 40) && n_fds == d->n_pages + 1 &&
           d->offset < d->page_size && d->size && d->size <= d->n_pages * d->page_size - d->offset;
}

VMM_API int vmm_ipc_handle_from(const vmm_ipc_desc *desc, const int *fds, size_t n_fds, vmm_ipc_handle **out)
{
    if (!desc || !fds || !out)
        return vmm_fail(VMM_EINVAL, "vmm_ipc_handle_from: NULL argument");
    *out = NULL;
    if (!desc_valid(desc, n_fds))
        return vmm_fail(VMM_EINVAL, "vmm_ipc_handle_from: not a vmmalloc IPC handle (or %zu descriptors "
                                    "for %llu pages)", n_fds, (unsigned long long)desc->n_pages);
    vmm_ipc_handle *h = handle_new(n_fds);
    if (!h)
        return vmm_fail(VMM_EHOSTMEM, "vmm_ipc_handle_from: out of host memory");
    h->d = *desc;
    memcpy(h->fds, fds, n_fds * sizeof *fds);
    *out = h;
    return VMM_OK;
}

VMM_API void vmm_ipc_handle_free(vmm_ipc_handle *h)
{
    if (!h)
        return;
    handle_close_fds(h);
    free(h->fds);
    free(h);
}

VMM_API int vmm_ipc_handle_release(vmm_ipc_handle *h)
{
    if (!h)
        return vmm_fail(VMM_EINVAL, "vmm_ipc_handle_release: handle is NULL");
    if (h->consumed)
        return vmm_fail(VMM_EINVAL, "vmm_ipc_handle_release: the handle was opened: vmm_ipc_close the "
                                    "mapping instead");
    _Atomic int64_t *c = vmm_ipc_counter_map(h->fds[h->n_fds - 1]);
    if (c) {
        atomic_fetch_sub(c, 1);
        vmm_ipc_counter_unmap(c);
    }
    vmm_ipc_handle_free(h);
    return c ? VMM_OK : vmm_fail(VMM_EHOSTMEM, "vmm_ipc_handle_release: cannot map the counter: %s",
                                 strerror(errno));
}

/* ---- sockets ------------------------------------------------------------------------------------ */

static int send_part(int sock, const void *bytes, size_t len, const int *fds, size_t n)
{
    char cbuf[CMSG_SPACE(FDS_PER_MSG * sizeof(int))];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {(void *)(uintptr_t)bytes, len};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (n) {
        m.msg_control = cbuf;
        m.msg_controllen = CMSG_SPACE(n * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(n * sizeof(int));
        memcpy(CMSG_DATA(c), fds, n * sizeof(int));
    }
    ssize_t w;
    do
        w = sendmsg(sock, &m, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w < 0)
        return vmm_fail(VMM_EDRIVER, "vmm_ipc_send: sendmsg: %s", strerror(errno));
    /* a stream socket may take part of the bytes: the descriptors went with the first */
    for (size_t done = (size_t)w; done < len;) {
        ssize_t k = send(sock, (const char *)bytes + done, len - done, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return vmm_fail(VMM_EDRIVER, "vmm_ipc_send: send: %s", strerror(errno));
        done += (size_t)k;
    }
    return VMM_OK;
}

VMM_API int vmm_ipc_send(int sock, const vmm_ipc_handle *h)
{
    if (!h || !desc_valid(&h->d, h->n_fds))
        return vmm_fail(VMM_EINVAL, "vmm_ipc_send: not a handle");
    size_t first = h->n_fds < FDS_PER_MSG ? h->n_fds : FDS_PER_MSG;
    int rc = send_part(sock, &h->d, sizeof h->d, h->fds, first);
    for (size_t i = first; !rc && i < h->n_fds; i += FDS_PER_MSG) {
        size_t k = h->n_fds - i < FDS_PER_MSG ? h->n_fds - i : FDS_PER_MSG;
        uint32_t hdr[2] = {CHUNK_MAGIC, (uint32_t)k};
        rc = send_part(sock, hdr, sizeof hdr, h->fds + i, k);
    }
    return rc;
}

/* Receive exactly len bytes; descriptors that come with them are appended to fds (up to max). */
static int recv_part(int sock, void *bytes, size_t len, int *fds, size_t max, size_t *got)
{
    size_t done = 0;
    while (done < len) {
        char cbuf[CMSG_SPACE(FDS_PER_MSG * sizeof(int))];
        struct iovec iov = {(char *)bytes + done, len - done};
        struct msghdr m = {0};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = cbuf;
        m.msg_controllen = sizeof cbuf;
        ssize_t r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return vmm_fail(r == 0 ? VMM_EINVAL : VMM_EDRIVER, "vmm_ipc_recv: recvmsg: %s",
                            r == 0 ? "the other side closed the socket" : strerror(errno));
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            int *in = (int *)CMSG_DATA(c);
            for (size_t i = 0; i < k; i++) {
                if (*got < max)
                    fds[(*got)++] = in[i];
                else
                    close(in[i]);
            }
        }
        if (m.msg_flags & MSG_CTRUNC)
            return vmm_fail(VMM_EINVAL, "vmm_ipc_recv: descriptors were cut off");
        done += (size_t)r;
    }
    return VMM_OK;
}

VMM_API int vmm_ipc_recv(int sock, vmm_ipc_handle **out)
{
    if (!out)
        return vmm_fail(VMM_EINVAL, "vmm_ipc_recv: out is NULL");
    *out = NULL;
    vmm_ipc_desc d;
    int first[FDS_PER_MSG];
    size_t got = 0;
    int rc = recv_part(sock, &d, sizeof d, first, FDS_PER_MSG, &got);
    if (!rc && !desc_valid(&d, d.n_pages + 1))
        rc = vmm_fail(VMM_EINVAL, "vmm_ipc_recv: the message is not a vmmalloc IPC handle");
    vmm_ipc_handle *h = NULL;
    if (!rc && !(h = handle_new(d.n_pages + 1)))
        rc = vmm_fail(VMM_EHOSTMEM, "vmm_ipc_recv: out of host memory");
    if (rc) {
        for (size_t i = 0; i < got; i++)
            close(first[i]);
        return rc;
    }
    h->d = d;
    memcpy(h->fds, first, got * sizeof *first);
    size_t n = got;
    while (!rc && n < h->n_fds) {
        uint32_t hdr[2];
        size_t before = n;
        rc = recv_part(sock, hdr, sizeof hdr, h->fds, h->n_fds, &n);
        if (!rc && (hdr[0] != CHUNK_MAGIC || n - before != hdr[1]))
            rc = vmm_fail(VMM_EINVAL, "vmm_ipc_recv: malformed continuation message");
    }
    if (!rc && n != h->n_fds)
        rc = vmm_fail(VMM_EINVAL, "vmm_ipc_recv: %zu descriptors for %zu", n, h->n_fds);
    if (rc) {
        vmm_ipc_handle_free(h);
        return rc;
    }
    *out = h;
    return VMM_OK;
}

/* ---- import ------------------------------------------------------------------------------------ */

VMM_API int vmm_ipc_open(vmm_allocator *a, vmm_ipc_handle *h, void **ptr)
{
    if (!a || !h || !ptr)
        return vmm_fail(VMM_EINVAL, "vmm_ipc_open: NULL argument");
    *ptr = NULL;
    if (!desc_valid(&h->d, h->n_fds))
        return vmm_fail(VMM_EINVAL, "vmm_ipc_open: not a vmmalloc IPC handle");
    const vmm_driver_ops *ops = a->drv->ops;
    if (!ops->import_fd)
        return vmm_fail(VMM_ENOTSUP, "vmm_ipc_open: the %s driver cannot import memory", ops->name);
    if (h->d.device != a->dev.ordinal)
        return vmm_fail(VMM_EINVAL, "vmm_ipc_open: the block is on device %d: open it with that "
                                    "device's allocator (this one is device %d's)", h->d.device,
                        a->dev.ordinal);
    size_t ps = (size_t)h->d.page_size, n = (size_t)h->d.n_pages, va_size = n * ps;
    size_t g = a->dev.granularity ? a->dev.granularity : 1;
    if (ps % g)
        return vmm_fail(VMM_EINVAL, "vmm_ipc_open: page size %zu is not a multiple of this device's "
                                    "granularity %zu", ps, g);
    vmm_phys *hs = vmm_meta_alloc(a->meta, n * sizeof *hs);
    if (!hs)
        return vmm_fail(VMM_EHOSTMEM, "vmm_ipc_open: out of host memory");
    vmm_lock(a);
    int rc = VMM_OK;
    uintptr_t base = 0;
    size_t got = 0, mapped = 0;
    _Atomic int64_t *c = NULL;
    if (vmm_ipc_import_room(a))
        rc = vmm_fail(VMM_EHOSTMEM, "vmm_ipc_open: out of host memory");
    int r = rc ? 0 : ops->va_reserve(a->drv, va_size, 0, &base);
    if (r) {
        rc = vmm_fail_drv(r, "vmm_ipc_open: va_reserve");
        base = 0;
        va_size = 0;
    }
    for (; !rc && got < n; got++) {
        r = ops->import_fd(a->drv, h->fds[got], &hs[got]);
        if (r)
            rc = vmm_fail_drv(r, "vmm_ipc_open: import_fd");
        if (r)
            break;
    }
    for (; !rc && mapped < n; mapped++) {
        r = ops->mem_map(a->drv, base + mapped * ps, ps, 0, hs[mapped]);
        if (r)
            rc = vmm_fail_drv(r, "vmm_ipc_open: mem_map");
        if (r)
            break;
    }
    if (!rc && (r = ops->set_access(a->drv, base, n * ps)) != VMM_DRV_SUCCESS)
        rc = vmm_fail_drv(r, "vmm_ipc_open: set_access");
    if (!rc && !(c = vmm_ipc_counter_map(h->fds[n])))
        rc = vmm_fail(VMM_EHOSTMEM, "vmm_ipc_open: cannot map the reference counter: %s", strerror(errno));
    if (rc) {
        vmm_ipc_import_undo(a, base, ps, hs, got, mapped, va_size);
        vmm_meta_free(a->meta, hs, n * sizeof *hs);
        vmm_unlock(a);
        return rc;
    }
    if (h->consumed)
        atomic_fetch_add(c, 1); /* opened again: one more reference */
    h->consumed = 1;
    uintptr_t p = base + (size_t)h->d.offset;
    ipc_state *I = a->ipc;
    I->im[I->n_im++] = (vmm_ipc_import){base, n, ps, p, hs, c};
    vmm_ipc_stats_update(a);
    vmm_unlock(a);
    *ptr = (void *)p;
    return VMM_OK;
}

VMM_API int vmm_ipc_close(vmm_allocator *a, void *ptr)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_ipc_close: allocator is NULL");
    vmm_lock(a);
    ipc_state *I = a->ipc;
    size_t i = 0;
    while (I && i < I->n_im && I->im[i].ptr != (uintptr_t)ptr)
        i++;
    if (!I || i == I->n_im) {
        vmm_unlock(a);
        return vmm_fail(VMM_EBADPTR, "vmm_ipc_close: %p was not opened with vmm_ipc_open", ptr);
    }
    vmm_ipc_import r = I->im[i];
    I->im[i] = I->im[--I->n_im];
    vmm_ipc_import_release(a, &r);
    vmm_ipc_stats_update(a);
    vmm_unlock(a);
    return VMM_OK;
}

