"""vmmalloc: Python access to the vmmalloc shared library (standard library only, ctypes).

The functions here work with or without PyTorch: they talk to the per-device allocators that
libvmmalloc's PyTorch entry points (vmm_torch_malloc / vmm_torch_free) create on first use.
``vmmalloc.torch.install()`` plugs those entry points into PyTorch; see docs/pytorch.md.

Finding the library (first match wins): the ``lib_path`` argument, the ``VMMALLOC_LIB`` environment
variable, ``libvmmalloc.so*`` next to this package or in its parent directory, then the build
directories (``build*/``) of the source tree this package lies in.
"""

import ctypes
import glob
import json
import os
import pickle
import tempfile
import threading

__all__ = [
    "VmmError", "library_path", "load", "configure", "memory_stats", "pinned_stats", "empty_cache",
    "reset_peak_memory_stats", "record_stream", "oom_report", "last_error", "snapshot",
    "load_snapshot", "record_memory_history",
]

# Status codes of include/vmmalloc.h (VMM_STATUS_MAP).
_STATUS = {
    0: "OK", -1: "ENOMEM", -2: "EINVAL", -3: "ENOTSUP", -4: "EDRIVER", -5: "ECONFIG",
    -6: "EBADPTR", -7: "ENODEV", -8: "ECORRUPT", -9: "EHOSTMEM", -10: "ERANGE",
}
_ERANGE = -10
_MESSAGE_MAX = 4096        # room for the OOM report (2 KiB in the library)
_STATS_JSON_START = 1 << 16  # grown on VMM_ERANGE

_lock = threading.Lock()
_lib = None
_lib_path = None


class VmmError(RuntimeError):
    """A vmmalloc call failed; ``status`` is the VMM_E* name, the message the library's text."""

    def __init__(self, status, message):
        self.status = _STATUS.get(status, str(status))
        super().__init__("vmmalloc %s: %s" % (self.status, message))


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    names = ("libvmmalloc.so", "libvmmalloc.so.*")
    for d in (here, os.path.dirname(here)):
        for n in names:
            yield from sorted(glob.glob(os.path.join(d, n)))
    # python/vmmalloc/ inside the source tree: the tree's build directories
    # (build/ first: sibling build dirs may be sanitizer builds, which python cannot load)
    root = os.path.dirname(os.path.dirname(here))
    for pattern in ("build", "build*"):
        for n in names:
            yield from sorted(glob.glob(os.path.join(root, pattern, n)))


def library_path(lib_path=None):
    """Path of the shared library that would be loaded (see the module docstring)."""
    if lib_path:
        if not os.path.exists(lib_path):
            raise FileNotFoundError("vmmalloc: library %r does not exist" % lib_path)
        return os.path.abspath(lib_path)
    env = os.environ.get("VMMALLOC_LIB")
    if env:
        if not os.path.exists(env):
            raise FileNotFoundError("vmmalloc: VMMALLOC_LIB=%r does not exist" % env)
        return os.path.abspath(env)
    for c in _candidates():
        return os.path.abspath(c)
    raise FileNotFoundError(
        "vmmalloc: libvmmalloc.so not found; set VMMALLOC_LIB to its path or pass lib_path")


def _declare(lib):
    c_int, c_size, c_void_p, c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
    sigs = {
        "vmm_torch_malloc": (c_void_p, [ctypes.c_ssize_t, c_int, c_void_p]),
        "vmm_torch_free": (None, [c_void_p, ctypes.c_ssize_t, c_int, c_void_p]),
        "vmm_torch_configure": (c_int, [c_char_p]),
        "vmm_torch_get_allocator": (c_int, [c_int, ctypes.POINTER(c_void_p)]),
        "vmm_torch_stats_json": (c_int, [c_int, c_char_p, c_size]),
        "vmm_torch_empty_cache": (c_int, [c_int]),
        "vmm_torch_reset_peaks": (c_int, [c_int]),
        "vmm_torch_record_stream": (c_int, [c_void_p, c_void_p]),
        "vmm_torch_last_error": (c_int, [c_char_p, c_size]),
        "vmm_torch_oom_report": (c_int, [c_char_p, c_size]),
        "vmm_torch_snapshot": (c_int, [c_int, c_char_p]),
        "vmm_torch_record_history": (c_int, [c_int, c_size]),
        "vmm_pinned_stats_json": (c_int, [c_void_p, c_char_p, c_size]),
        "vmm_strerror": (c_char_p, [c_int]),
        "vmm_last_error": (c_char_p, []),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


def load(lib_path=None):
    """Load (once) and return the ctypes handle of libvmmalloc."""
    global _lib, _lib_path
    with _lock:
        if _lib is None:
            path = library_path(lib_path)
            _lib = _declare(ctypes.CDLL(path))
            _lib_path = path
        elif lib_path and os.path.realpath(lib_path) != os.path.realpath(_lib_path):
            raise RuntimeError("vmmalloc: %s is loaded already; cannot switch to %s"
                               % (_lib_path, lib_path))
        return _lib


def loaded_path():
    """Path of the loaded library, or None."""
    return _lib_path


def _text(fn):
    buf = ctypes.create_string_buffer(_MESSAGE_MAX)
    fn(buf, len(buf))
    return buf.value.decode("utf-8", "replace")


def last_error():
    """Text of the last failed vmm_torch_* call in this process (any thread); "" when none."""
    return _text(load().vmm_torch_last_error)


def oom_report():
    """The last out-of-memory report (request, capacity, free, allocated, reserved-but-unallocated,
    what was tried); "" when no allocation failed yet."""
    return _text(load().vmm_torch_oom_report)


def _check(status):
    if status < 0:
        raise VmmError(status, last_error())
    return status


def _check_here(status):
    """For calls outside vmm_torch_*: their message is this thread's vmm_last_error()."""
    if status < 0:
        raise VmmError(status, (load().vmm_last_error() or b"").decode("utf-8", "replace"))
    return status


def configure(conf=None):
    """Set the conf ("key:value,...") for allocators created from now on; VMMALLOC_CONF applies
    first. Raises VmmError (ECONFIG naming the key, or EINVAL once an allocator exists)."""
    _check(load().vmm_torch_configure(conf.encode() if conf else None))


def _device(device):
    return 0 if device is None else int(device)


def _json_call(fn, *args, check=_check):
    size = _STATS_JSON_START
    while True:
        buf = ctypes.create_string_buffer(size)
        n = fn(*args, buf, size)
        if n == _ERANGE:
            size *= 4
            continue
        check(n)
        return json.loads(buf.value.decode())


def memory_stats(device=None):
    """The device allocator's counters as a dict with PyTorch's key names
    ("allocated_bytes.all.current", "reserved_bytes.large_pool.peak", "num_ooms", ...) plus
    vmmalloc's own ("num_event_waits", "mapped_bytes.all.current", ...), sorted by key as
    torch.cuda.memory_stats() returns them. Creates the device's allocator if needed."""
    stats = _json_call(load().vmm_torch_stats_json, _device(device))
    return dict(sorted(stats.items()))


def _allocator(device):
    lib = load()
    a = ctypes.c_void_p()
    _check(lib.vmm_torch_get_allocator(_device(device), ctypes.byref(a)))
    return a


def pinned_stats(device=None):
    """Counters of the device allocator's pinned host memory cache ("pinned.*" keys)."""
    a = _allocator(device)
    stats = _json_call(lambda buf, n: load().vmm_pinned_stats_json(a, buf, n), check=_check_here)
    return dict(sorted(stats.items()))


def empty_cache(device=None):
    """Return cached memory of one device (default: every device in use) to the driver."""
    _check(load().vmm_torch_empty_cache(-1 if device is None else int(device)))


def reset_peak_memory_stats(device=None):
    """Reset the peaks of one device (default: every device in use) to their current values."""
    _check(load().vmm_torch_reset_peaks(-1 if device is None else int(device)))


def record_stream(ptr, stream):
    """Mark the block at the integer address ``ptr`` as used on ``stream`` (an integer
    cudaStream_t; 0 or None is the default stream). Raises VmmError(EBADPTR) for a pointer that is
    not the start of a live vmmalloc block."""
    _check(load().vmm_torch_record_stream(ctypes.c_void_p(int(ptr)), ctypes.c_void_p(int(stream or 0))))


class _DataOnlyUnpickler(pickle.Unpickler):
    """The snapshot holds only dicts, lists, strings and numbers: any class reference means the
    file is not one of ours, and loading it could run code."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            "vmmalloc: snapshot refers to %s.%s; only plain data is accepted" % (module, name))


def load_snapshot(path):
    """Read a snapshot pickle (vmm_snapshot_pickle's or snapshot(path)'s) as a dict, refusing any
    pickle that names a class or function."""
    with open(path, "rb") as f:
        return _DataOnlyUnpickler(f).load()


def snapshot(path=None, device=None):
    """The device allocator's state in the format of PyTorch's torch.cuda.memory._snapshot()
    (segments, device_traces, allocator_settings, ...; docs/snapshots.md).

    With ``path``: writes the pickle there (what torch.cuda.memory._dump_snapshot writes; open it
    with pytorch.org/memory_viz or tools/vmm_viz.py) and returns None. Without: returns the dict.
    The trace is empty unless record_memory_history() is on. Raises VmmError (EINVAL naming the
    path when it cannot be written)."""
    lib = load()
    if path is not None:
        _check(lib.vmm_torch_snapshot(_device(device), os.fsencode(path)))
        return None
    fd, tmp = tempfile.mkstemp(prefix="vmmalloc-snapshot-", suffix=".pickle")
    os.close(fd)
    try:
        _check(lib.vmm_torch_snapshot(_device(device), os.fsencode(tmp)))
        return load_snapshot(tmp)
    finally:
        os.unlink(tmp)


def record_memory_history(max_entries, device=None):
    """Keep the device allocator's last ``max_entries`` events (allocs, frees, segment maps and
    unmaps, OOMs) for snapshot()'s device_traces; 0 (or None) stops recording and drops them.
    Resizing keeps the newest entries that fit."""
    _check(load().vmm_torch_record_history(_device(device), int(max_entries or 0)))
