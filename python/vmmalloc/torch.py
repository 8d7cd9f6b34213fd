"""PyTorch integration: install vmmalloc as PyTorch's CUDA allocator and reach what the pluggable
allocator path does not offer (memory_stats, empty_cache, record_stream, the OOM report).

This module imports torch only inside the functions that need it, so ``import vmmalloc.torch``
works on machines without PyTorch.

    import vmmalloc.torch
    vmmalloc.torch.install("expandable_segments:true")   # before the first CUDA allocation
    x = torch.empty(1 << 20, device="cuda")
    print(vmmalloc.torch.memory_stats()["reserved_bytes.all.peak"])
"""

import vmmalloc as _v

__all__ = ["install", "is_installed", "memory_stats", "empty_cache", "reset_peak_memory_stats",
           "record_stream", "snapshot", "record_memory_history", "oom_report", "pinned_stats",
           "device_index"]

_installed_path = None


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


def install(conf=None, lib_path=None, graphs="auto"):
    """Make vmmalloc PyTorch's CUDA allocator. Call before the first CUDA allocation.

    conf: "key:value,..." (PyTorch's syntax; docs/user-guide.md lists the keys), applied after the
    VMMALLOC_CONF environment variable; each device's allocator gets "device:N" added.
    lib_path: the shared library; default: VMMALLOC_LIB, next to this package, the build dir.
    graphs: CUDA graphs (docs/pytorch.md, "CUDA graphs"): "auto" sets the graph hooks (private
    pools for captures; the C++ shim is built once, see vmmalloc.graphs) and, when they cannot be
    set, refuses capture with a clear error instead; "hooks" raises RuntimeError when they cannot
    be set; "refuse" never builds them and refuses capture. vmmalloc.graphs.status() says which.
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
    lib = _v.load(path)
    _v.configure(conf)  # checks conf and VMMALLOC_CONF now, rather than at the first allocation
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "vmm_torch_malloc", "vmm_torch_free")
    from vmmalloc import graphs as _graphs  # noqa: PLC0415
    _graphs.attach(alloc, lib, mode=graphs)  # the hooks go on the allocator before PyTorch takes it
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        _graphs.undo(lib)
        raise RuntimeError("vmmalloc.torch.install: PyTorch refused the allocator: %s" % e) from e
    _installed_path = path
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
