"""PyTorch integration: install vmmalloc as PyTorch's CUDA allocator, with torch.cuda's memory API
(memory_stats & co., resets, _record_memory_history, _snapshot, the memory fraction) answered by
vmmalloc (vmmalloc.torch_memory) and out of memory raised as torch.OutOfMemoryError
(csrc/torch_alloc.cpp); plus vmmalloc's own views (memory_stats with its extra keys, the OOM report,
record_stream, snapshots of one device).

This module imports torch only inside the functions that need it, so ``import vmmalloc.torch``
works on machines without PyTorch.

    import vmmalloc.torch
    vmmalloc.torch.install("expandable_segments:true")   # before the first CUDA allocation
    x = torch.empty(1 << 20, device="cuda")
    print(torch.cuda.max_memory_reserved())               # answered by vmmalloc
"""

import ctypes
import os
import warnings

import vmmalloc as _v

__all__ = ["install", "is_installed", "status", "memory_stats", "empty_cache", "reset_peak_memory_stats",
           "record_stream", "snapshot", "record_memory_history", "oom_report", "pinned_stats",
           "device_index"]

_installed_path = None
_status = {"installed": False, "oom": None, "alloc_shim": None, "oom_reason": "",
           "memory_fraction_hook": False, "memory_api": None}
_alloc_shim = None  # ctypes handle of csrc/torch_alloc.cpp's library, kept for the process


def _torch():
    try:
        import torch  # noqa: PLC0415 (imported on demand: the package must import without torch)
    except ImportError as e:
        raise ImportError("vmmalloc.torch: PyTorch is not installed (%s)" % e) from e
    return torch


def is_installed():
    """True once install() has made vmmalloc PyTorch's CUDA allocator in this process."""
    return _installed_path is not None


def _require_uninitialized(cuda):
    # PyTorch initializes its CUDA state, and with it the caching allocator, lazily at the first
    # CUDA tensor or call that needs a context (torch.cuda._lazy_init); change_current_allocator
    # then refuses ("Can't swap an already initialized allocator"). is_initialized() only reads
    # a flag.
    if cuda.is_initialized():
        raise RuntimeError(
            "vmmalloc.torch.install: CUDA is already initialized in this process, so PyTorch's "
            "native allocator is in use and cannot be replaced; call vmmalloc.torch.install() "
            "before any CUDA tensor or CUDA call that initializes it (torch.cuda.current_device(), "
            "set_device(), synchronize(), .cuda(), ...): first thing after importing torch")


def status():
    """What install() did: {"installed", "oom": "c10" (out of memory raises torch.OutOfMemoryError)
    | "runtime_error" (a RuntimeError: the shim was built without torch's headers) | "null" (PyTorch
    gets NULL) | None, "alloc_shim": path, "oom_reason", "memory_fraction_hook": bool,
    "memory_api": vmmalloc.torch_memory.patched() or None, "graphs": vmmalloc.graphs.status()}."""
    from vmmalloc import graphs as _graphs  # noqa: PLC0415
    out = dict(_status)
    out["graphs"] = _graphs.status()
    return out


def _raising_allocator(torch, lib, oom):
    """CUDAPluggableAllocator over csrc/torch_alloc.cpp (vmm_torch_malloc that throws PyTorch's
    OutOfMemoryError), or over libvmmalloc's own entry points when oom="null" or the shim cannot be
    had (then out of memory hands PyTorch a NULL, and a warning says why). Returns the allocator."""
    global _alloc_shim
    memory = torch.cuda.memory
    path = _v.loaded_path()
    if oom == "null":
        _status.update(oom="null", alloc_shim=None, oom_reason="install(oom='null')")
        return memory.CUDAPluggableAllocator(path, "vmm_torch_malloc", "vmm_torch_free")
    try:
        env = os.environ.get("VMMALLOC_TORCH_ALLOC")
        if env:
            if not os.path.isfile(env):
                raise RuntimeError("VMMALLOC_TORCH_ALLOC=%s: no such file" % env)
            shim_path = env
        else:
            from vmmalloc import _cxx  # noqa: PLC0415
            shim_path = _cxx.build("torch_alloc.cpp", use_torch=True)[0]
        shim = ctypes.CDLL(shim_path)
        shim.vmm_torch_alloc_init.restype = ctypes.c_int
        shim.vmm_torch_alloc_init.argtypes = [ctypes.c_void_p] * 4
        shim.vmm_torch_alloc_raises_c10.restype = ctypes.c_int

        def addr(name):
            return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value

        if shim.vmm_torch_alloc_init(addr("vmm_torch_malloc"), addr("vmm_torch_free"),
                                     addr("vmm_torch_malloc_status"), addr("vmm_last_error")) != 0:
            raise RuntimeError("the shim refused libvmmalloc's entry points")
        raises_c10 = bool(shim.vmm_torch_alloc_raises_c10())
    except (RuntimeError, OSError) as e:
        if oom == "raise":
            raise RuntimeError("vmmalloc.torch.install: cannot build the out-of-memory shim: %s" % e) from e
        warnings.warn("vmmalloc: out of memory will reach PyTorch as a NULL pointer, not as "
                      "torch.OutOfMemoryError, because the shim python/vmmalloc/csrc/torch_alloc.cpp "
                      "could not be built or loaded (%s); check vmmalloc.torch.oom_report() after a "
                      "failure" % e, RuntimeWarning, stacklevel=3)
        _status.update(oom="null", alloc_shim=None, oom_reason=str(e))
        return memory.CUDAPluggableAllocator(path, "vmm_torch_malloc", "vmm_torch_free")
    _alloc_shim = shim
    if not raises_c10:
        warnings.warn("vmmalloc: the out-of-memory shim was built without torch's headers: out of "
                      "memory raises RuntimeError('CUDA out of memory. ...'), not torch.OutOfMemoryError",
                      RuntimeWarning, stacklevel=3)
    _status.update(oom="c10" if raises_c10 else "runtime_error", alloc_shim=shim_path, oom_reason="")
    return memory.CUDAPluggableAllocator(shim_path, "vmm_torch_alloc_malloc", "vmm_torch_alloc_free")


def _set_fraction_hook(alloc, lib):
    """torch.cuda.set_per_process_memory_fraction -> allocator->setMemoryFraction -> this hook
    (CUDAPluggableAllocator calls it only when set), for C++ callers too."""
    hooks = getattr(alloc, "_allocator", None)
    setter = getattr(hooks, "set_memory_fraction_fn", None)
    if setter is None:
        return False
    setter(ctypes.cast(lib.vmm_torch_set_memory_fraction, ctypes.c_void_p).value)
    return True


def install(conf=None, lib_path=None, graphs="auto", oom="auto", memory_api=True):
    """Make vmmalloc PyTorch's CUDA allocator. Call before the first CUDA allocation.

    conf: "key:value,..." (PyTorch's syntax; docs/user-guide.md lists the keys), applied after the
    VMMALLOC_CONF environment variable; each device's allocator gets "device:N" added.
    lib_path: the shared library; default: VMMALLOC_LIB, next to this package, the build dir.
    graphs: CUDA graphs (docs/pytorch.md, "CUDA graphs"): "auto" sets the graph hooks (private
    pools for captures; the C++ shim is built once, see vmmalloc.graphs) and, when they cannot be
    set, refuses capture with a clear error instead; "hooks" raises RuntimeError when they cannot
    be set; "refuse" never builds them and refuses capture. vmmalloc.graphs.status() says which.
    oom: "auto" (default): out of memory raises torch.OutOfMemoryError carrying vmmalloc's report,
    through the C++ shim csrc/torch_alloc.cpp (built once with the C++ compiler against torch's
    headers and libc10, cached in ~/.cache/vmmalloc; without them it raises RuntimeError("CUDA out
    of memory. ..."), and when it cannot be built at all PyTorch gets NULL, with a warning); "raise": RuntimeError from install() when the shim
    cannot be had; "null": no shim, NULL as before. status()["oom"] says which.
    memory_api: True (default) wires torch.cuda's memory functions (memory_stats, memory_allocated,
    max_memory_*, memory_summary, reset_peak_memory_stats, _record_memory_history, _snapshot,
    _dump_snapshot, set/get_per_process_memory_fraction, empty_cache) to vmmalloc
    (vmmalloc.torch_memory); False leaves them as PyTorch has them (raising for a pluggable allocator).
    Returns the path of the library installed. Calling it again with the same library is a no-op.

    Raises RuntimeError when CUDA is already initialized in this process (PyTorch cannot swap
    its allocator then), when CUDA is not available, or when PyTorch refuses the allocator.
    Nothing install() calls before change_current_allocator initializes PyTorch's CUDA state:
    torch.cuda.is_initialized() reads a flag, torch.cuda.is_available() counts devices
    (cudaGetDeviceCount, or NVML with PYTORCH_NVML_BASED_CUDA_CHECK=1) without torch's lazy
    init, and CUDAPluggableAllocator only loads the library.
    """
    global _installed_path
    torch = _torch()
    path = _v.library_path(lib_path)
    if _installed_path is not None:
        if _installed_path != path:
            raise RuntimeError("vmmalloc.torch.install: %s is installed already" % _installed_path)
        return path
    _require_uninitialized(torch.cuda)
    if not torch.cuda.is_available():
        raise RuntimeError("vmmalloc.torch.install: torch.cuda.is_available() is False")
    if oom not in ("auto", "raise", "null"):
        raise ValueError("vmmalloc.torch.install: oom must be 'auto', 'raise' or 'null', not %r" % (oom,))
    lib = _v.load(path)
    _v.configure(conf)  # checks conf and VMMALLOC_CONF now, rather than at the first allocation
    from vmmalloc import torch_memory as _tm  # noqa: PLC0415
    _tm._lib()  # noqa: SLF001 (declares the entry points the hooks below take the addresses of)
    alloc = _raising_allocator(torch, lib, oom)
    from vmmalloc import graphs as _graphs  # noqa: PLC0415
    _graphs.attach(alloc, lib, mode=graphs)  # the hooks go on the allocator before PyTorch takes it
    fraction_hook = _set_fraction_hook(alloc, lib)
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        _graphs.undo(lib)
        raise RuntimeError("vmmalloc.torch.install: PyTorch refused the allocator: %s" % e) from e
    _installed_path = path
    _status.update(installed=True, memory_fraction_hook=fraction_hook)
    if memory_api:
        try:
            _status["memory_api"] = _tm.patch(torch)
        except Exception as e:  # noqa: BLE001 (a PyTorch we do not know: warn, never fail the install)
            warnings.warn("vmmalloc: torch.cuda's memory functions could not be wired to vmmalloc (%s: %s); "
                          "use vmmalloc.torch.memory_stats & co." % (type(e).__name__, e),
                          RuntimeWarning, stacklevel=2)
    return path


def device_index(device=None):
    """The device index a device argument names (see vmmalloc.device_index): an int, "cuda",
    "cuda:N", "N" or a torch.device; None, "cuda" and torch.device("cuda") mean the current
    device, which is looked up without initializing CUDA. ValueError for "cpu" and the like."""
    return _v.device_index(device)


def memory_stats(device=None):
    """torch.cuda.memory_stats() for vmmalloc: a dict with PyTorch's key names (plus vmmalloc's
    own). device: an index, "cuda:N" or torch.device; default the current device."""
    return _v.memory_stats(device)


def pinned_stats(device=None):
    """Counters of the pinned host memory cache of the device's allocator."""
    return _v.pinned_stats(device)


def empty_cache(device=None):
    """torch.cuda.empty_cache() for vmmalloc (torch.cuda.empty_cache() does not reach a pluggable
    allocator). Default: every device in use."""
    _v.empty_cache(device)


def reset_peak_memory_stats(device=None):
    """Reset the peaks of one device (default: every device in use)."""
    _v.reset_peak_memory_stats(device)


def record_stream(tensor_or_ptr, stream):
    """Tensor.record_stream() for vmmalloc (PyTorch's own call is a no-op for a pluggable
    allocator): the tensor's storage block is not reused before the work queued on ``stream`` up
    to its free has run. tensor_or_ptr: a CUDA tensor (its storage's base address is used) or an
    integer address of a block start. stream: a torch.cuda.Stream, an integer cudaStream_t, or
    None for the default stream."""
    if isinstance(tensor_or_ptr, int):
        ptr = tensor_or_ptr
    elif hasattr(tensor_or_ptr, "untyped_storage"):
        ptr = tensor_or_ptr.untyped_storage().data_ptr()
    else:
        ptr = tensor_or_ptr.data_ptr()
    handle = getattr(stream, "cuda_stream", stream)
    _v.record_stream(ptr, handle or 0)


def snapshot(path=None, device=None):
    """torch.cuda.memory._snapshot() for vmmalloc (PyTorch's own raises for a pluggable
    allocator): the allocator's state as a dict, or, with ``path``, written there as the pickle
    torch.cuda.memory._dump_snapshot writes (returns None then). See vmmalloc.snapshot."""
    return _v.snapshot(path, device)


def record_memory_history(max_entries=_v.DEFAULT_MAX_ENTRIES, device=None, stacks="all",
                          context="all", enabled="all"):
    """torch.cuda.memory._record_memory_history() for vmmalloc (PyTorch's own raises for a
    pluggable allocator): keep the last ``max_entries`` allocator events for snapshot()'s trace,
    with the Python and native frames of each (stacks="all", the default; "python", "native" or
    None), on live blocks and trace entries (context="all"; "alloc", "state" or None). 0, None or
    enabled=None stops. See vmmalloc.record_memory_history."""
    _v.record_memory_history(max_entries, device, stacks=stacks, context=context, enabled=enabled)


def oom_report():
    """Text of the last out-of-memory failure ("" when none). PyTorch shows only a generic error
    for a pluggable allocator's failed allocation; this says what was asked, what was free and
    what vmmalloc tried."""
    return _v.oom_report()
