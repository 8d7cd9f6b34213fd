"""vmmalloc.graphs without PyTorch: run by tests/python/test_graphs_python.c with VMMALLOC_LIB pointing at the
built shared library and VMMALLOC_CONF selecting the simulated driver. A fake ``torch`` module in
sys.modules plays the pluggable allocator object (recording the hooks set on it, as addresses), the
CUDAGraph class and torch.cuda.MemPool. Checks:
  - attach() builds the C++ shim (the plain compiler: the fake torch has no cpp_extension), sets the
    pool hooks of a recent PyTorch (or the older stream-based ones) plus the record-stream and reset hooks,
    every address nonzero and the shim's;
  - a PyTorch without the setters: capture is refused (CUDAGraph.capture_begin raises, saying why),
    and vmm_torch_malloc on a capturing stream no pool routes fails with that explanation, while
    other allocations still work; mode="hooks" raises instead;
  - mem_pool() hands MemPool the pluggable allocator's object;
  - the libvmmalloc entry points the hooks call, through ctypes: begin / end / release with pool
    ids, errors kept for vmm_torch_last_error.
Exits 0 when every check passes, 1 otherwise (each failure printed)."""

import atexit
import ctypes
import os
import shutil
import sys
import tempfile
import types

ROOT = os.environ.get("VMM_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
if "VMMALLOC_CACHE_DIR" not in os.environ:  # the shim is built here, not in ~/.cache
    os.environ["VMMALLOC_CACHE_DIR"] = tempfile.mkdtemp(prefix="vmmalloc-graphs-")
    atexit.register(shutil.rmtree, os.environ["VMMALLOC_CACHE_DIR"], True)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


class FakeHooks:
    """torch._C._cuda_CUDAAllocator of a pluggable allocator: records set_* calls."""

    def __init__(self, setters):
        self.calls = {}
        for name in setters:
            setattr(self, name, self._recorder(name))

    def _recorder(self, name):
        def record(addr):
            self.calls[name] = addr
        return record


def make_torch(setters):
    torch = types.ModuleType("torch")
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    graphs = types.ModuleType("torch.cuda.graphs")

    class CUDAPluggableAllocator:
        def __init__(self, path, alloc_fn_name, free_fn_name):
            self.path, self.names = path, (alloc_fn_name, free_fn_name)
            self._allocator = FakeHooks(setters)

        def allocator(self):
            return self._allocator

    class CUDAGraph:
        def capture_begin(self, pool=None, capture_error_mode="global"):
            return "captured"

    class MemPool:
        def __init__(self, allocator=None, use_on_oom=False):
            self.allocator, self.use_on_oom = allocator, use_on_oom

    memory.CUDAPluggableAllocator = CUDAPluggableAllocator
    graphs.CUDAGraph = CUDAGraph
    cuda.memory, cuda.graphs, cuda.CUDAGraph, cuda.MemPool = memory, graphs, CUDAGraph, MemPool
    torch.cuda = cuda
    sys.modules.update({"torch": torch, "torch.cuda": cuda, "torch.cuda.memory": memory,
                        "torch.cuda.graphs": graphs})
    return torch


def fresh_graphs():
    """vmmalloc.graphs with a clean state (each scenario sets its own fake torch)."""
    for name in list(sys.modules):
        if name == "vmmalloc.graphs":
            del sys.modules[name]
    import vmmalloc.graphs as g  # noqa: PLC0415
    return g


def main():
    import vmmalloc as v  # noqa: PLC0415
    lib = v.load()
    c_int, c_void_p, u64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64
    lib.vmm_torch_begin_allocate_to_pool.argtypes = [c_int, u64, u64, c_void_p, c_void_p]
    lib.vmm_torch_end_allocate_to_pool.argtypes = [c_int, u64, u64]
    lib.vmm_torch_release_pool.argtypes = [c_int, u64, u64]
    for f in (lib.vmm_torch_begin_allocate_to_pool, lib.vmm_torch_end_allocate_to_pool,
              lib.vmm_torch_release_pool):
        f.restype = c_int

    # the C entry points the shim calls, through ctypes (a NULL filter routes every stream)
    check(lib.vmm_torch_begin_allocate_to_pool(0, 0, 1, None, None) == 0, "begin (0, 1)")
    check(lib.vmm_torch_begin_allocate_to_pool(0, 0, 1, None, None) < 0, "a second begin is refused")
    check("already" in v.last_error(), "the refusal is kept for last_error: %r" % v.last_error())
    p = lib.vmm_torch_malloc(4096, 0, None)
    check(bool(p), "malloc while routed")
    check(lib.vmm_torch_end_allocate_to_pool(0, 0, 1) == 0, "end (0, 1)")
    check(lib.vmm_torch_end_allocate_to_pool(0, 0, 1) < 0, "end without begin is refused")
    lib.vmm_torch_free(p, 4096, 0, None)
    check(lib.vmm_torch_release_pool(0, 0, 1) == 0, "release (0, 1)")
    check(lib.vmm_torch_release_pool(0, 0, 1) < 0, "a second release is refused")
    check(lib.vmm_torch_end_allocate_to_pool(63, 0, 1) < 0, "end on a device without allocator")
    check(lib.vmm_torch_begin_allocate_to_pool(0, 0, 0, None, None) < 0, "pool id (0, 0) is refused")

    # a recent PyTorch: the pool hooks from Python
    setters = ["set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool",
               "set_record_stream_fn", "set_reset_fn"]
    torch = make_torch(setters)
    g = fresh_graphs()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(v.loaded_path(), "vmm_torch_malloc", "vmm_torch_free")
    st = g.attach(alloc, lib)
    check(st["hooks"] and st["mode"] == "hooks", "hooks set: %r" % (st,))
    calls = alloc._allocator.calls
    for s in setters:
        check(s in calls and calls[s], "%s got an address" % s)
    shim = ctypes.CDLL(st["shim"])
    shim.vmm_graph_hook.restype = c_void_p
    shim.vmm_graph_hook.argtypes = [ctypes.c_char_p]
    check(calls.get("set_begin_allocate_to_pool") == shim.vmm_graph_hook(b"set_begin_allocate_to_pool"),
          "the begin hook is the shim's")
    check(calls.get("set_record_stream_fn") == ctypes.cast(lib.vmm_torch_record_stream, c_void_p).value,
          "record_stream hook is vmm_torch_record_stream")
    check(torch.cuda.graphs.CUDAGraph().capture_begin() == "captured", "capture is not refused with hooks")
    check(os.path.dirname(st["shim"]) == os.environ["VMMALLOC_CACHE_DIR"], "the shim was built in the cache")

    # older releases: the stream-based hooks
    torch = make_torch(["set_begin_allocate_stream_to_pool", "set_end_allocate_stream_to_pool_fn",
                        "set_release_pool", "set_record_stream_fn"])
    g = fresh_graphs()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(v.loaded_path(), "vmm_torch_malloc", "vmm_torch_free")
    st = g.attach(alloc, lib)
    check(st["hooks"] and "set_begin_allocate_stream_to_pool" in st["set"], "stream-based hooks: %r" % (st,))

    # mem_pool: the second mode
    pool = g.mem_pool()
    check(isinstance(pool.allocator, FakeHooks), "MemPool got the pluggable allocator's object")

    # a PyTorch without the setters: mode "hooks" raises, "auto" refuses capture
    torch = make_torch(["set_record_stream_fn"])
    g = fresh_graphs()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(v.loaded_path(), "vmm_torch_malloc", "vmm_torch_free")
    try:
        g.attach(alloc, lib, mode="hooks")
        check(False, "mode='hooks' raises without the setters")
    except RuntimeError as e:
        check("set_begin_allocate_to_pool" in str(e), "the error says why: %s" % e)
    st = g.attach(alloc, lib)
    check(st["mode"] == "refuse" and not st["hooks"], "refused: %r" % (st,))
    try:
        torch.cuda.graphs.CUDAGraph().capture_begin()
        check(False, "capture_begin raises when refused")
    except RuntimeError as e:
        check("CUDA graph capture is refused" in str(e) and "mem_pool" in str(e), "message: %s" % e)
    # ... and the C guard: a capturing stream without a route gets no memory (simulated device)
    a = c_void_p()
    check(lib.vmm_torch_get_allocator(0, ctypes.byref(a)) == 0, "allocator of device 0")
    lib.vmm_sim_stream_create.argtypes = [c_void_p, ctypes.POINTER(c_void_p)]
    lib.vmm_sim_capture_begin.argtypes = [c_void_p, c_void_p, c_int]
    lib.vmm_sim_capture_end.argtypes = [c_void_p, c_void_p, ctypes.POINTER(c_void_p)]
    lib.vmm_sim_graph_destroy.argtypes = [c_void_p]
    s = c_void_p()
    check(lib.vmm_sim_stream_create(a, ctypes.byref(s)) == 0, "sim stream")
    check(lib.vmm_sim_capture_begin(a, s, 0) == 0, "capture begins")
    check(not lib.vmm_torch_malloc(1 << 20, 0, s), "malloc on the capturing stream is refused")
    check("graph hooks" in v.last_error(), "why: %r" % v.last_error())
    q = lib.vmm_torch_malloc(1 << 20, 0, None)
    check(bool(q), "another stream still allocates")
    g.undo(lib)  # an install that failed after attach takes the refusal back
    check(torch.cuda.graphs.CUDAGraph().capture_begin() == "captured", "undo restores capture_begin")
    r = lib.vmm_torch_malloc(1 << 20, 0, s)
    check(bool(r), "undo turns the C guard off")
    lib.vmm_torch_free(r, 1 << 20, 0, s)
    graph = c_void_p()
    check(lib.vmm_sim_capture_end(a, s, ctypes.byref(graph)) == 0, "the capture stayed valid")
    lib.vmm_sim_graph_destroy(graph)
    lib.vmm_torch_free(q, 1 << 20, 0, None)
    lib.vmm_torch_shutdown()

    if failures:
        print("%d check(s) failed" % len(failures), file=sys.stderr)
        return 1
    print("vmmalloc.graphs: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
