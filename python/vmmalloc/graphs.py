"""CUDA graphs with vmmalloc as PyTorch's allocator (docs/pytorch.md, "CUDA graphs").

While PyTorch captures a CUDA graph it routes the capture's allocations to a private pool through
the current allocator's beginAllocateToPool / endAllocateToPool / releasePool. A pluggable
allocator reaches them only through hooks set on it (CUDAPluggableAllocator's
set_begin_allocate_to_pool, set_end_allocate_to_pool_fn, set_release_pool; recent releases take
their addresses from Python), whose C++ types (a std::pair pool id, a std::function filter) C
cannot take. A small C++ shim (csrc/graph_hooks.cpp, standard library only) adapts them to libvmmalloc's
vmm_torch_begin_allocate_to_pool & co.; this module builds it (vmmalloc._cxx: the C++ compiler on PATH or $CXX,
with torch's flags when torch is imported), loads it and sets the hooks, with the record-stream
hook (Tensor.record_stream reaches vmmalloc) and the reset hook (torch.cuda.empty_cache does).

Without a shim (no compiler, or a PyTorch without the hooks) graph capture would hand graph memory
to eager code between replays; vmmalloc then refuses capture instead: CUDAGraph.capture_begin raises
a RuntimeError saying why, and vmm_torch_malloc fails on a capturing stream that no pool routes.

The second mode needs none of this: torch.cuda.MemPool(allocator=...) keeps PyTorch's own caching
allocator (and its graph handling) and takes only that pool's segments from vmmalloc:

    pool = vmmalloc.graphs.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.empty(1 << 20, device="cuda")      # from vmmalloc; everything else is PyTorch's

torch is imported only inside the functions that need it.
"""

import ctypes
import os
import sys
import threading

import vmmalloc as _v
from vmmalloc import _cxx

__all__ = ["attach", "build_hooks", "refuse_capture", "undo", "mem_pool", "status", "HOOK_SOURCE"]

HOOK_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "graph_hooks.cpp")

# setter -> name in the shim (vmm_graph_hook), in the order they are set
_POOL_HOOKS = ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool")
_STREAM_POOL_HOOKS = ("set_begin_allocate_stream_to_pool", "set_end_allocate_stream_to_pool_fn",
                      "set_release_pool")

_lock = threading.Lock()
_shim = None          # ctypes handle of the loaded shim (kept for the life of the process)
_state = {"mode": None, "hooks": False, "reason": "vmmalloc.graphs.attach() was not called",
          "shim": None, "set": []}
_patched = []         # (class, original capture_begin or None) of refuse_capture


def status():
    """What attach() did: {"mode": "hooks" | "refuse" | None, "hooks": bool, "reason": str,
    "shim": path or None, "set": [setters called]}."""
    return dict(_state)


def build_hooks(verbose=False, use_torch=True):
    """Path of the graph hooks shim, built if needed: $VMMALLOC_GRAPH_HOOKS when set, else the package's
    shim builder (vmmalloc._cxx: cached in ~/.cache/vmmalloc, keyed by the source; with torch's compile
    flags first when use_torch and torch is imported, else the plain C++ compiler). Raises RuntimeError
    when it cannot be had."""
    env = os.environ.get("VMMALLOC_GRAPH_HOOKS")
    if env:
        if not os.path.isfile(env):
            raise RuntimeError("VMMALLOC_GRAPH_HOOKS=%s: no such file" % env)
        return env
    if use_torch and "torch" not in sys.modules and _torch_importable():
        import torch  # noqa: F401,PLC0415 (_cxx builds with torch's flags only when torch is imported)
    try:
        path, _ = _cxx.build(os.path.basename(HOOK_SOURCE), use_torch, verbose)
    except RuntimeError as e:
        raise RuntimeError("vmmalloc: cannot build the graph hooks shim (%s): %s" % (HOOK_SOURCE, e)) from e
    return path


def _torch_importable():
    try:
        import importlib.util  # noqa: PLC0415
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def _address(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _load_shim(path, lib):
    global _shim
    shim = ctypes.CDLL(path)
    shim.vmm_graph_hooks_init.restype = ctypes.c_int
    shim.vmm_graph_hooks_init.argtypes = [ctypes.c_void_p] * 5
    shim.vmm_graph_hook.restype = ctypes.c_void_p
    shim.vmm_graph_hook.argtypes = [ctypes.c_char_p]
    shim.vmm_graph_hooks_routes.restype = ctypes.c_int
    shim.vmm_graph_hooks_routes.argtypes = []
    rc = shim.vmm_graph_hooks_init(_address(lib, "vmm_torch_begin_allocate_to_pool"),
                                   _address(lib, "vmm_torch_end_allocate_to_pool"),
                                   _address(lib, "vmm_torch_release_pool"),
                                   _address(lib, "vmm_torch_empty_cache"),
                                   _address(lib, "vmm_torch_last_error"))
    if rc != 0:
        raise RuntimeError("vmmalloc: the graph hooks shim refused libvmmalloc's entry points")
    _shim = shim
    return shim


def refuse_capture(reason, lib=None):
    """Make CUDA graph capture fail clearly instead of corrupting memory: CUDAGraph.capture_begin
    raises RuntimeError(reason), and vmm_torch_malloc refuses a capturing stream no pool routes."""
    lib = lib or _v.load()
    lib.vmm_torch_set_capture_guard.restype = ctypes.c_int
    lib.vmm_torch_set_capture_guard.argtypes = [ctypes.c_int]
    lib.vmm_torch_set_capture_guard(1)
    message = ("vmmalloc: CUDA graph capture is refused: %s. Graphs would get memory that eager "
               "code reuses while replays write it. Build the graph hooks (a C++ compiler; "
               "vmmalloc.graphs.build_hooks() says what failed), or keep PyTorch's allocator and "
               "take vmmalloc memory for chosen tensors with vmmalloc.graphs.mem_pool()." % reason)

    def capture_begin(self, *args, **kwargs):  # noqa: ARG001
        raise RuntimeError(message)

    # torch.cuda.graphs.CUDAGraph (torch.cuda.CUDAGraph is the same class), found through
    # sys.modules: looking it up through torch.cuda must not run torch's lazy CUDA machinery
    graphs_mod = sys.modules.get("torch.cuda.graphs")
    cls = getattr(graphs_mod, "CUDAGraph", None) if graphs_mod is not None else None
    targets = [cls] if cls is not None else []
    for cls in targets:
        if not any(c is cls for c, _ in _patched):
            _patched.append((cls, cls.__dict__.get("capture_begin")))
        cls.capture_begin = capture_begin
    _state.update(mode="refuse", hooks=False, reason=reason)
    return message


def undo(lib=None):
    """Take back what refuse_capture did (for an install that failed after attach): capture_begin
    as it was, the C capture guard off. Hooks set on an allocator object stay (harmless)."""
    lib = lib or _v.load()
    lib.vmm_torch_set_capture_guard.restype = ctypes.c_int
    lib.vmm_torch_set_capture_guard.argtypes = [ctypes.c_int]
    lib.vmm_torch_set_capture_guard(0)
    while _patched:
        cls, original = _patched.pop()
        if original is None:
            try:
                del cls.capture_begin
            except AttributeError:
                pass
        else:
            cls.capture_begin = original
    _state.update(mode=None, hooks=False, reason="undone", shim=None, set=[])


def attach(allocator, lib=None, mode="auto", verbose=False):
    """Set the graph hooks on a torch.cuda.memory.CUDAPluggableAllocator made over libvmmalloc,
    before change_current_allocator. mode: "auto" (hooks when the shim builds and PyTorch has the
    setters, else refuse_capture), "hooks" (raise RuntimeError when they cannot be set), "refuse".
    Returns status()."""
    if mode not in ("auto", "hooks", "refuse"):
        raise ValueError("vmmalloc.graphs.attach: mode must be 'auto', 'hooks' or 'refuse'")
    lib = lib or _v.load()
    with _lock:
        hooks = getattr(allocator, "_allocator", None)
        if mode == "refuse":
            refuse_capture("graphs='refuse' was asked for", lib)
            return status()
        reason = None
        setters = None
        if hooks is None:
            reason = "the pluggable allocator has no _allocator object (unknown PyTorch)"
        elif all(hasattr(hooks, s) for s in _POOL_HOOKS):
            setters = _POOL_HOOKS
        elif all(hasattr(hooks, s) for s in _STREAM_POOL_HOOKS):
            setters = _STREAM_POOL_HOOKS  # older releases
        else:
            reason = ("this PyTorch cannot set a pluggable allocator's pool hooks from Python "
                      "(its allocator object has no set_begin_allocate_to_pool & co.: a newer PyTorch "
                      "has them)")
        shim_path = None
        if setters:
            try:
                shim_path = build_hooks(verbose=verbose)
                shim = _shim or _load_shim(shim_path, lib)
            except (RuntimeError, OSError) as e:
                reason = str(e)
                setters = None
        if not setters:
            if mode == "hooks":
                raise RuntimeError("vmmalloc: the CUDA graph hooks cannot be set: %s" % reason)
            refuse_capture(reason, lib)
            return status()
        done = []
        for s in setters:
            addr = shim.vmm_graph_hook(s.encode())
            if not addr:
                raise RuntimeError("vmmalloc: the shim has no hook for %s" % s)
            getattr(hooks, s)(addr)
            done.append(s)
        if hasattr(hooks, "set_record_stream_fn"):
            # int vmm_torch_record_stream(void *, void *) as void(void *, cudaStream_t)
            hooks.set_record_stream_fn(_address(lib, "vmm_torch_record_stream"))
            done.append("set_record_stream_fn")
        if hasattr(hooks, "set_reset_fn"):
            hooks.set_reset_fn(shim.vmm_graph_hook(b"set_reset_fn"))
            done.append("set_reset_fn")
        _state.update(mode="hooks", hooks=True, reason="", shim=shim_path, set=done)
        return status()


def mem_pool(lib_path=None, **kwargs):
    """A torch.cuda.MemPool whose memory comes from vmmalloc while PyTorch's own caching allocator
    stays the current one (its graph handling included): tensors made inside
    torch.cuda.use_mem_pool(pool) take their segments from vmm_torch_malloc. kwargs go to MemPool
    (use_on_oom=...). Needs a PyTorch with torch.cuda.MemPool(allocator=...)."""
    import torch  # noqa: PLC0415
    path = _v.library_path(lib_path)
    _v.load(path)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "vmm_torch_malloc", "vmm_torch_free")
    mempool = getattr(torch.cuda, "MemPool", None)
    if mempool is None:
        raise RuntimeError("vmmalloc.graphs.mem_pool: this PyTorch has no torch.cuda.MemPool")
    return mempool(alloc.allocator(), **kwargs)


def _selftest_build():
    """python -m vmmalloc.graphs: build the shim and print its path (a check for installs)."""
    print(build_hooks(verbose=True, use_torch=_torch_importable()))


if __name__ == "__main__":
    _selftest_build()
