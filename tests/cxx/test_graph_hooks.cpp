// ctest: test_graph_hooks (tests/cxx/CMakeLists.txt)
//
// The PyTorch graph-hooks shim (python/vmmalloc/csrc/graph_hooks.cpp) as PyTorch drives it: each
// hook's address is cast to the function type torch/csrc/cuda/Module.cpp casts it to, wrapped in a
// std::function as CUDAPluggableAllocator keeps it, and called in the order CUDAGraph calls them:
// beginAllocateToPool(device, MempoolId_t, filter) before the capture begins (the filter compares a
// stream's capture id with the graph's, known only once the capture began), allocations and frees
// through vmm_torch_malloc / vmm_torch_free during the capture, endAllocateToPool after it ended,
// releasePool when the graph goes. Also: the record-stream hook (vmm_torch_record_stream cast to
// void(void *, cudaStream_t)), the reset hook (torch.cuda.empty_cache), the errors PyTorch would
// see as exceptions, and older releases' stream-based hooks. libvmmalloc runs on the simulated
// device (VMMALLOC_CONF is not needed: the conf is set here).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "vmmalloc.h"
#include "vmmalloc_sim.h"

struct CUstream_st;
using cudaStream_t = CUstream_st *;
using MempoolId_t = std::pair<unsigned long long, unsigned long long>;

extern "C" int vmm_graph_hooks_init(void *begin, void *end, void *release, void *empty_cache, void *last_error);
extern "C" void *vmm_graph_hook(const char *setter);
extern "C" int vmm_graph_hooks_routes(void);

static int failures = 0;
#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);             \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

// torch/csrc/cuda/Module.cpp: reinterpret_cast<FuncType*>(func_ptr), kept as std::function.
template <typename F> static std::function<F> hook(const char *setter)
{
    void *p = vmm_graph_hook(setter);
    CHECK(p != nullptr);
    return std::function<F>(reinterpret_cast<F *>(p));
}

static int in_pool(vmm_allocator *a, const void *p, uint64_t want0, uint64_t want1)
{
    uint64_t i0 = 9, i1 = 9;
    return vmm_pool_lookup(a, p, &i0, &i1) == VMM_OK && i0 == want0 && i1 == want1;
}

template <typename Fn> static std::string throws(Fn fn)
{
    try {
        fn();
    } catch (const std::runtime_error &e) {
        return e.what();
    }
    return "";
}

int main()
{
    CHECK(vmm_torch_configure("driver:sim,sim_backed:true,sim_capacity:256M") == VMM_OK);
    vmm_allocator *a = nullptr;
    CHECK(vmm_torch_get_allocator(0, &a) == VMM_OK);
    if (!a)
        return 1;
    CHECK(vmm_graph_hooks_init(nullptr, nullptr, nullptr, nullptr, nullptr) == -1);
    CHECK(vmm_graph_hooks_init(reinterpret_cast<void *>(&vmm_torch_begin_allocate_to_pool),
                               reinterpret_cast<void *>(&vmm_torch_end_allocate_to_pool),
                               reinterpret_cast<void *>(&vmm_torch_release_pool),
                               reinterpret_cast<void *>(&vmm_torch_empty_cache),
                               reinterpret_cast<void *>(&vmm_torch_last_error)) == 0);
    auto begin = hook<void(int, MempoolId_t, std::function<bool(cudaStream_t)>)>("set_begin_allocate_to_pool");
    auto end = hook<void(int, MempoolId_t)>("set_end_allocate_to_pool_fn");
    auto release = hook<void(int, MempoolId_t)>("set_release_pool");
    auto reset = hook<void()>("set_reset_fn");
    CHECK(vmm_graph_hook("set_no_such_thing") == nullptr);
    // set_record_stream_fn(address of vmm_torch_record_stream): called as void(void *, cudaStream_t)
    void *rs_addr = reinterpret_cast<void *>(&vmm_torch_record_stream);
    std::function<void(void *, cudaStream_t)> record_stream(reinterpret_cast<void (*)(void *, cudaStream_t)>(rs_addr));

    vmm_stream cap = nullptr, side = nullptr;
    CHECK(vmm_sim_stream_create(a, &cap) == VMM_OK);
    CHECK(vmm_sim_stream_create(a, &side) == VMM_OK);

    // CUDAGraph::capture_begin: the filter first, the capture id once the capture began
    uint64_t capture_id = 0;
    auto filter = [&](cudaStream_t s) {
        int capturing = 0;
        uint64_t id = 0;
        return vmm_sim_stream_capture_info(a, s, &capturing, &id) == VMM_OK && capturing && id == capture_id;
    };
    const MempoolId_t pool{0, 1}; // graph_pool_handle()
    begin(0, pool, filter);
    CHECK(vmm_graph_hooks_routes() == 1);
    CHECK(vmm_sim_capture_begin(a, cap, VMM_SIM_CAPTURE_GLOBAL) == VMM_OK);
    int capturing = 0;
    CHECK(vmm_sim_stream_capture_info(a, cap, &capturing, &capture_id) == VMM_OK && capturing);
    void *p = vmm_torch_malloc(1 << 20, 0, cap);
    void *t = vmm_torch_malloc(3 << 20, 0, cap);
    void *q = vmm_torch_malloc(1 << 20, 0, side); // another thread's eager tensor
    CHECK(p && t && q);
    CHECK(in_pool(a, p, 0, 1) && in_pool(a, t, 0, 1));
    CHECK(in_pool(a, q, 0, 0));
    CHECK(vmm_sim_memset32(a, p, 0x5a5a5a5au, (1 << 20) / 4, cap) == VMM_OK);
    record_stream(t, reinterpret_cast<cudaStream_t>(side)); // a use outside the capture
    vmm_torch_free(t, 3 << 20, 0, cap);                  // deferred: captures underway
    // a second begin of the same pool while its route is in force: refused, as PyTorch's own
    std::string e = throws([&] { begin(0, pool, filter); });
    CHECK(e.find("already") != std::string::npos);
    vmm_sim_graph *g = nullptr;
    CHECK(vmm_sim_capture_end(a, cap, &g) == VMM_OK); // the hooks broke no capture rule
    end(0, pool);                                       // CUDAGraph::capture_end, after EndCapture
    CHECK(vmm_graph_hooks_routes() == 0);
    CHECK(throws([&] { end(0, pool); }).find("no allocations are routed") != std::string::npos);

    // a second graph shares the pool (torch.cuda.graph(pool=g1.pool()))
    begin(0, pool, filter);
    CHECK(vmm_sim_capture_begin(a, cap, VMM_SIM_CAPTURE_THREAD_LOCAL) == VMM_OK);
    CHECK(vmm_sim_stream_capture_info(a, cap, &capturing, &capture_id) == VMM_OK);
    void *p2 = vmm_torch_malloc(1 << 20, 0, cap);
    CHECK(in_pool(a, p2, 0, 1));
    vmm_sim_graph *g2 = nullptr;
    CHECK(vmm_sim_capture_end(a, cap, &g2) == VMM_OK);
    end(0, pool);
    vmm_pool_stats ps;
    CHECK(vmm_pool_get_stats(a, 0, 1, &ps) == VMM_OK && ps.use_count == 2);

    // replays, then CUDAGraph::reset of each graph
    CHECK(vmm_sim_graph_launch(a, g, cap) == VMM_OK);
    CHECK(vmm_sim_synchronize(a) == VMM_OK);
    CHECK(*static_cast<uint32_t *>(p) == 0x5a5a5a5au);
    vmm_torch_free(p, 1 << 20, 0, cap);
    vmm_torch_free(p2, 1 << 20, 0, cap);
    release(0, pool);
    CHECK(vmm_pool_get_stats(a, 0, 1, &ps) == VMM_OK && ps.use_count == 1);
    release(0, pool); // the last user: the memory goes back to the default pools
    CHECK(vmm_pool_get_stats(a, 0, 1, &ps) == VMM_EINVAL);
    CHECK(in_pool(a, p, 0, 0));
    CHECK(throws([&] { release(0, pool); }).find("releasePool") != std::string::npos);
    reset(); // torch.cuda.empty_cache()

    // older PyTorch releases: stream-based hooks
    auto begin_s = hook<void(int, cudaStream_t, MempoolId_t)>("set_begin_allocate_stream_to_pool");
    auto end_s = hook<void(int, cudaStream_t)>("set_end_allocate_stream_to_pool_fn");
    const MempoolId_t pool2{7, 0}; // an id from cudaStreamGetCaptureInfo, as older releases used
    begin_s(0, reinterpret_cast<cudaStream_t>(cap), pool2);
    void *r = vmm_torch_malloc(4096, 0, cap);
    void *r2 = vmm_torch_malloc(4096, 0, side);
    CHECK(in_pool(a, r, 7, 0) && in_pool(a, r2, 0, 0));
    end_s(0, reinterpret_cast<cudaStream_t>(cap));
    CHECK(throws([&] { end_s(0, reinterpret_cast<cudaStream_t>(cap)); }).find("no pool") != std::string::npos);
    vmm_torch_free(r, 4096, 0, cap);
    vmm_torch_free(r2, 4096, 0, side);
    vmm_torch_free(q, 1 << 20, 0, side);
    release(0, pool2);

    CHECK(vmm_check(a) == VMM_OK);
    vmm_sim_graph_destroy(g);
    vmm_sim_graph_destroy(g2);
    CHECK(vmm_sim_stream_destroy(a, cap) == VMM_OK);
    CHECK(vmm_sim_stream_destroy(a, side) == VMM_OK);
    vmm_torch_shutdown();
    if (failures) {
        std::fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    std::printf("graph hooks: OK\n");
    return 0;
}
