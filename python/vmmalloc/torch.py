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
           "record_stream", "snapshot", "record_memory_history", "oom_report", "pinned_stats"]

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


def install(conf=None, lib_path=None):
    """Make vmmalloc PyTorch's CUDA allocator. Call before the first CUDA allocation.

    conf: "key:value,..." (PyTorch's syntax; docs/user-guide.md lists the keys), applied after the
    VMMALLOC_CONF environment variable; each device's allocator gets "device:N" added.
    lib_path: the shared library; default: VMMALLOC_LIB, next to this package, the build dir.
    Returns the path of the library installed. Calling it again with the same library is a no-op.
    """
    global _installed_path
    torch = _torch()
    path = _v.library_path(lib_path)
    if _installed_path is not None:
        if _installed_path != path:
            raise RuntimeError("vmmalloc.torch.install: %s is installed already" % _installed_path)
        return path
    if not torch.cuda.is_available():
        raise RuntimeError("vmmalloc.torch.install: torch.cuda.is_available() is False")
    # PyTorch initialises its native allocator with CUDA (lazily, at the first CUDA tensor or
    # call that needs a context) and refuses to swap an initialised allocator.
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "vmmalloc.torch.install: CUDA is already initialised in this process, so PyTorch's "
            "native allocator is in use and cannot be replaced; call install() before creating "
            "any CUDA tensor (or anything that initialises CUDA)")
    _v.load(path)
    _v.configure(conf)  # checks conf and VMMALLOC_CONF now, rather than at the first allocation
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "vmm_torch_malloc", "vmm_torch_free")
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise RuntimeError("vmmalloc.torch.install: PyTorch refused the allocator: %s" % e) from e
    _installed_path = path
    return path


def _current_device(device):
    if device is not None:
        if hasattr(device, "index"):  # torch.device
            return 0 if device.index is None else device.index
        return int(device)
    try:
        return _torch().cuda.current_device()
    except ImportError:
        return 0


def memory_stats(device=None):
    """torch.cuda.memory_stats() for vmmalloc: a dict with PyTorch's key names (plus vmmalloc's
    own). device: an index or torch.device; default the current device."""
    return _v.memory_stats(_current_device(device))


def pinned_stats(device=None):
    """Counters of the pinned host memory cache of the device's allocator."""
    return _v.pinned_stats(_current_device(device))


def empty_cache(device=None):
    """torch.cuda.empty_cache() for vmmalloc (torch.cuda.empty_cache() does not reach a pluggable
    allocator). Default: every device in use."""
    _v.empty_cache(None if device is None else _current_device(device))


def reset_peak_memory_stats(device=None):
    """Reset the peaks of one device (default: every device in use)."""
    _v.reset_peak_memory_stats(None if device is None else _current_device(device))


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
    return _v.snapshot(path, _current_device(device))


def record_memory_history(max_entries, device=None):
    """torch.cuda.memory._record_memory_history() for vmmalloc: keep the last ``max_entries``
    allocator events for snapshot()'s trace (0 or None stops). No stack frames are recorded."""
    _v.record_memory_history(max_entries, _current_device(device))


def oom_report():
    """Text of the last out-of-memory failure ("" when none). PyTorch shows only a generic error
    for a pluggable allocator's failed allocation; this says what was asked, what was free and
    what vmmalloc tried."""
    return _v.oom_report()
