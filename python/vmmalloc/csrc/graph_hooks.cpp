// vmmalloc graph hooks: PyTorch's CUDAPluggableAllocator pool hooks over libvmmalloc's C entry points.
//
// PyTorch's CUDA graphs call the current allocator's beginAllocateToPool(device, MempoolId_t,
// filter) before a capture begins, endAllocateToPool(device, MempoolId_t) after it ended, and
// releasePool(device, MempoolId_t) when a graph (or a MemPool) goes. A pluggable allocator forwards
// them to the functions set with set_begin_allocate_to_pool, set_end_allocate_to_pool_fn and
// set_release_pool; its Python object (torch._C._cuda_CUDAAllocator, in recent releases) takes each as
// an address and calls it as (torch/csrc/cuda/Module.cpp)
//     void(int, c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>)
//     void(int, c10::cuda::MempoolId_t)
// where MempoolId_t is std::pair<unsigned long long, unsigned long long> and cudaStream_t is
// CUstream_st *. C cannot take a std::pair or a std::function, so this file adapts: it defines
// functions of exactly those types that call libvmmalloc's vmm_torch_begin_allocate_to_pool (id as
// two uint64, the filter as a C function and a context) & co. Older releases had stream-based
// hooks (set_begin_allocate_stream_to_pool: void(int, cudaStream_t, MempoolId_t),
// set_end_allocate_stream_to_pool_fn: void(int, cudaStream_t)); they are here too. The reset hook
// (set_reset_fn, void()) makes torch.cuda.empty_cache() reach vmmalloc.
//
// Only the standard library is used: the types above are spelled out, not taken from torch's
// headers, so the file builds with any C++17 compiler, with or without torch (the Python helper
// uses torch.utils.cpp_extension when it can, the plain compiler otherwise), and the test
// tests/test_graph_hooks.cpp calls it through the same function types PyTorch casts to.
//
// The libvmmalloc functions are handed over at run time (vmm_graph_hooks_init, from Python's
// ctypes): nothing links libvmmalloc, which the Python package loads with RTLD_LOCAL.
//
// Errors: a failing begin / end / release throws std::runtime_error with vmmalloc's message; PyTorch
// lets it propagate from CUDAGraph::capture_begin / capture_end / reset (RuntimeError in Python).
// A filter that throws counts as "not this capture".

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

struct CUstream_st;
using cudaStream_t = CUstream_st *;                                  // cuda_runtime_api.h
using MempoolId_t = std::pair<unsigned long long, unsigned long long>; // c10::cuda::MempoolId_t
using StreamFilter = std::function<bool(cudaStream_t)>;

namespace {

// libvmmalloc's entry points (include/vmmalloc.h).
using c_filter_t = int (*)(void *ctx, void *stream);
using begin_c_t = int (*)(int device, uint64_t id0, uint64_t id1, c_filter_t filter, void *ctx);
using pool_c_t = int (*)(int device, uint64_t id0, uint64_t id1);
using empty_c_t = int (*)(int device);
using error_c_t = int (*)(char *buf, size_t len);

struct Entry {
    begin_c_t begin = nullptr;
    pool_c_t end = nullptr;
    pool_c_t release = nullptr;
    empty_c_t empty_cache = nullptr;
    error_c_t last_error = nullptr;
} g;

// The filters PyTorch hands over, kept alive while their route is in force (keyed by device and
// pool id; a pool has one route at a time). With the stream-based hooks: the stream and the pool.
struct Route {
    StreamFilter filter;
    cudaStream_t stream = nullptr;
    MempoolId_t pool{0, 0};
};
std::mutex mu;
std::map<std::tuple<int, unsigned long long, unsigned long long>, std::unique_ptr<Route>> routes;
std::map<std::pair<int, cudaStream_t>, MempoolId_t> stream_pools; // stream-based hooks only

std::string message()
{
    char buf[2048] = "";
    if (g.last_error)
        g.last_error(buf, sizeof buf);
    return buf;
}

void check(int rc, const char *what, const MempoolId_t &id)
{
    if (rc == 0)
        return;
    throw std::runtime_error(std::string("vmmalloc: ") + what + "(pool (" + std::to_string(id.first) + ", " +
                             std::to_string(id.second) + ")): " + message());
}

void need_init()
{
    if (!g.begin || !g.end || !g.release)
        throw std::runtime_error("vmmalloc graph hooks: vmm_graph_hooks_init was not called");
}

int call_filter(void *ctx, void *stream) noexcept
{
    auto *r = static_cast<Route *>(ctx);
    try {
        if (r->filter)
            return r->filter(static_cast<cudaStream_t>(stream)) ? 1 : 0;
        return static_cast<cudaStream_t>(stream) == r->stream ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

void begin_route(int device, MempoolId_t id, std::unique_ptr<Route> r)
{
    need_init();
    auto key = std::make_tuple(device, id.first, id.second);
    void *ctx = r.get();
    std::lock_guard<std::mutex> lock(mu);
    // the C side refuses a second route to the same pool; an entry left by such a refusal is
    // not replaced while the first route may still call its filter
    int rc = g.begin(device, id.first, id.second, call_filter, ctx);
    check(rc, "beginAllocateToPool", id);
    routes[key] = std::move(r);
}

void end_route(int device, MempoolId_t id)
{
    need_init();
    std::lock_guard<std::mutex> lock(mu);
    int rc = g.end(device, id.first, id.second);
    // the route is gone (or never was): its filter may go
    routes.erase(std::make_tuple(device, id.first, id.second));
    check(rc, "endAllocateToPool", id);
}

// ---- the hooks, with the exact types PyTorch casts the addresses to -----------------------------

void begin_allocate_to_pool(int device, MempoolId_t id, StreamFilter filter)
{
    auto r = std::make_unique<Route>();
    r->filter = std::move(filter);
    r->pool = id;
    begin_route(device, id, std::move(r));
}

void end_allocate_to_pool(int device, MempoolId_t id) { end_route(device, id); }

void release_pool(int device, MempoolId_t id)
{
    need_init();
    check(g.release(device, id.first, id.second), "releasePool", id);
}

// Older releases: one stream per capture, and the end names the stream, not the pool.
void begin_allocate_stream_to_pool(int device, cudaStream_t stream, MempoolId_t id)
{
    auto r = std::make_unique<Route>();
    r->stream = stream;
    r->pool = id;
    begin_route(device, id, std::move(r));
    std::lock_guard<std::mutex> lock(mu);
    stream_pools[std::make_pair(device, stream)] = id;
}

void end_allocate_stream_to_pool(int device, cudaStream_t stream)
{
    MempoolId_t id{0, 0};
    {
        std::lock_guard<std::mutex> lock(mu);
        auto it = stream_pools.find(std::make_pair(device, stream));
        if (it == stream_pools.end())
            throw std::runtime_error("vmmalloc: endAllocateStreamToPool: no pool was begun on this stream");
        id = it->second;
        stream_pools.erase(it);
    }
    end_route(device, id);
}

void reset() noexcept
{
    if (g.empty_cache)
        (void)g.empty_cache(-1); // every device's allocator
}

// Type checks against what PyTorch's Module.cpp casts to.
using begin_fn = void(int, MempoolId_t, StreamFilter);
using pool_fn = void(int, MempoolId_t);
using begin_stream_fn = void(int, cudaStream_t, MempoolId_t);
using end_stream_fn = void(int, cudaStream_t);
using reset_fn = void();
static_assert(std::is_same<decltype(&begin_allocate_to_pool), begin_fn *>::value, "begin hook type");
static_assert(std::is_same<decltype(&end_allocate_to_pool), pool_fn *>::value, "end hook type");
static_assert(std::is_same<decltype(&release_pool), pool_fn *>::value, "release hook type");
static_assert(std::is_same<decltype(&begin_allocate_stream_to_pool), begin_stream_fn *>::value, "stream-based begin hook type");
static_assert(std::is_same<decltype(&end_allocate_stream_to_pool), end_stream_fn *>::value, "stream-based end hook type");

} // namespace

extern "C" {

// Hand over libvmmalloc's entry points (addresses of vmm_torch_begin_allocate_to_pool,
// vmm_torch_end_allocate_to_pool, vmm_torch_release_pool, vmm_torch_empty_cache and
// vmm_torch_last_error; empty_cache may be NULL). Returns 0, or -1 when one is missing.
__attribute__((visibility("default"))) int vmm_graph_hooks_init(void *begin, void *end, void *release,
                                                                void *empty_cache, void *last_error)
{
    if (!begin || !end || !release || !last_error)
        return -1;
    g.begin = reinterpret_cast<begin_c_t>(begin);
    g.end = reinterpret_cast<pool_c_t>(end);
    g.release = reinterpret_cast<pool_c_t>(release);
    g.empty_cache = reinterpret_cast<empty_c_t>(empty_cache);
    g.last_error = reinterpret_cast<error_c_t>(last_error);
    return 0;
}

// Address of a hook, by the name of the CUDAPluggableAllocator setter it is for
// ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool",
// "set_begin_allocate_stream_to_pool", "set_end_allocate_stream_to_pool_fn", "set_reset_fn"), or NULL.
__attribute__((visibility("default"))) void *vmm_graph_hook(const char *setter)
{
    const std::string s = setter ? setter : "";
    if (s == "set_begin_allocate_to_pool")
        return reinterpret_cast<void *>(&begin_allocate_to_pool);
    if (s == "set_end_allocate_to_pool_fn")
        return reinterpret_cast<void *>(&end_allocate_to_pool);
    if (s == "set_release_pool")
        return reinterpret_cast<void *>(&release_pool);
    if (s == "set_begin_allocate_stream_to_pool")
        return reinterpret_cast<void *>(&begin_allocate_stream_to_pool);
    if (s == "set_end_allocate_stream_to_pool_fn")
        return reinterpret_cast<void *>(&end_allocate_stream_to_pool);
    if (s == "set_reset_fn")
        return reinterpret_cast<void *>(&reset);
    return nullptr;
}

// Routes whose filter is still held (for tests).
__attribute__((visibility("default"))) int vmm_graph_hooks_routes(void)
{
    std::lock_guard<std::mutex> lock(mu);
    return static_cast<int>(routes.size());
}

} // extern "C"
