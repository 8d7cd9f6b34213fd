"""vmmalloc: Python access to the vmmalloc shared library (standard library only, ctypes).

The functions here work with or without PyTorch: they talk to the per-device allocators that
libvmmalloc's PyTorch entry points (vmm_torch_malloc / vmm_torch_free) create on first use.
``vmmalloc.torch.install()`` plugs those entry points into PyTorch; see docs/pytorch.md.

Finding the library (first match wins): the ``lib_path`` argument, the ``VMMALLOC_LIB`` environment
variable (``VMMALLOC_LIBRARY`` is read too), ``libvmmalloc.so*`` inside this package (where
``pip install`` puts it) or in its parent directory, then the build directories (``build*/``) of
the source tree this package lies in. ``python -m vmmalloc`` prints which one is used.

Devices: every ``device`` argument takes an int, "cuda", "cuda:N", "N" or a ``torch.device``
(device_index() parses them). None (the default), "cuda" and ``torch.device("cuda")`` mean the
current device: PyTorch's once PyTorch has initialized CUDA in this process, else 0; looking it
up never initializes CUDA. A non-CUDA device ("cpu") or a malformed string raises ValueError.
empty_cache() and reset_peak_memory_stats() with no device act on every device in use.
"""

import ctypes
import glob
import json
import operator
import os
import pickle
import re
import sys
import tempfile
import threading

__version__ = "0.1.0"  # = CMakeLists.txt's project VERSION (the wheel build checks)

__all__ = [
    "VmmError", "library_path", "library_source", "load", "configure", "memory_stats",
    "pinned_stats", "empty_cache", "reset_peak_memory_stats", "record_stream", "oom_report",
    "last_error", "snapshot", "load_snapshot", "record_memory_history", "device_index",
    "__version__",
]

_LIB_ENV = ("VMMALLOC_LIB", "VMMALLOC_LIBRARY")

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


def _find(lib_path=None):
    """(path, how it was found) of the library that would be loaded."""
    if lib_path:
        if not os.path.exists(lib_path):
            raise FileNotFoundError("vmmalloc: library %r does not exist" % lib_path)
        return os.path.abspath(lib_path), "the lib_path argument"
    for var in _LIB_ENV:
        env = os.environ.get(var)
        if env:
            if not os.path.exists(env):
                raise FileNotFoundError("vmmalloc: %s=%r does not exist" % (var, env))
            return os.path.abspath(env), "the %s environment variable" % var
    here = os.path.dirname(os.path.abspath(__file__))
    for c in _candidates():
        c = os.path.abspath(c)
        if os.path.dirname(c) == here:
            how = "inside the package"
        elif os.path.dirname(c) == os.path.dirname(here):
            how = "next to the package"
        else:
            how = "the source tree's build directory"
        return c, how
    raise FileNotFoundError(
        "vmmalloc: libvmmalloc.so not found: install the package with pip (pip install . in the "
        "vmmalloc source tree builds it in), build it with CMake next to this source tree, or set "
        "VMMALLOC_LIB to its path")


def library_path(lib_path=None):
    """Path of the shared library that would be loaded (see the module docstring)."""
    return _find(lib_path)[0]


def library_source(lib_path=None):
    """How library_path() found the library: "inside the package", "the VMMALLOC_LIB environment
    variable", "the source tree's build directory", ..."""
    return _find(lib_path)[1]


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
        "vmm_record_history_ex": (c_int, [c_void_p, c_size, ctypes.c_uint]),
        "vmm_create": (c_int, [c_char_p, ctypes.POINTER(c_void_p)]),
        "vmm_destroy": (None, [c_void_p]),
        "vmm_config_string": (c_int, [c_void_p, c_char_p, c_size]),
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


_DEVICE_RE = re.compile(r"(?:cuda(?::(\d+))?|(\d+))", re.ASCII)
# PyTorch's other device types: named in the error instead of "malformed".
_OTHER_DEVICE_TYPES = ("cpu", "mps", "xpu", "xla", "meta", "hip", "hpu", "ipu", "mtia", "maia",
                       "lazy", "vulkan", "ve", "fpga", "opengl", "opencl", "ideep", "mkldnn",
                       "privateuseone")


def device_index(device):
    """The CUDA device index that ``device`` names; every function of vmmalloc and vmmalloc.torch
    that takes a device goes through here.

    Accepted: an int (or anything with ``__index__``) >= 0; a string "cuda", "cuda:N" or "N"; a
    ``torch.device`` or any object whose ``.type`` is "cuda" and whose ``.index`` is an int or
    None. None, "cuda" and a CUDA device without an index mean the current device: PyTorch's
    ``torch.cuda.current_device()`` if PyTorch is imported and has initialized CUDA in this
    process, else 0. Finding it never initializes CUDA and never imports torch.

    Raises ValueError for a device that is not CUDA ("cpu", torch.device("cpu"), "mps:0", ...),
    a malformed string ("cuda:", "cuda:x", "gpu1", "") or a negative index, and TypeError for
    other types (float, bool, list, ...)."""
    if device is None:
        return _current_device()
    if isinstance(device, bool):  # an int subclass, but True is no device
        raise TypeError("vmmalloc: device must be an int, a str or a torch.device, not bool")
    if isinstance(device, str):
        m = _DEVICE_RE.fullmatch(device)
        if m is None:
            if device.split(":", 1)[0] in _OTHER_DEVICE_TYPES:
                raise ValueError("vmmalloc: device %r is not a CUDA device (vmmalloc manages CUDA "
                                 "memory only)" % device)
            raise ValueError("vmmalloc: malformed device string %r: expected \"cuda\", "
                             "\"cuda:N\" or \"N\" with N >= 0" % device)
        digits = m.group(1) or m.group(2)
        return _current_device() if digits is None else int(digits)
    dtype = getattr(device, "type", None)
    if isinstance(dtype, str) and hasattr(device, "index"):  # torch.device, or alike
        if dtype != "cuda":
            raise ValueError("vmmalloc: device %r is not a CUDA device (type %r; vmmalloc manages "
                             "CUDA memory only)" % (device, dtype))
        if device.index is None:
            return _current_device()
        return _nonnegative(device.index, device)
    try:
        index = operator.index(device)
    except TypeError:
        raise TypeError("vmmalloc: device must be an int, a str (\"cuda\", \"cuda:N\", \"N\") or a "
                        "torch.device, not %s" % type(device).__name__) from None
    return _nonnegative(index, device)


def _nonnegative(index, device):
    index = operator.index(index)
    if index < 0:
        raise ValueError("vmmalloc: device index must be >= 0, got %r" % (device,))
    return index


def _current_device():
    """PyTorch's current device once PyTorch has initialized CUDA, else 0. Calling
    torch.cuda.current_device() earlier would initialize CUDA (it runs torch.cuda._lazy_init()),
    after which PyTorch refuses to swap in vmmalloc; before that, the current device is 0 anyway
    (torch.cuda.set_device() initializes CUDA itself)."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    if is_initialized is not None and is_initialized():
        return _nonnegative(cuda.current_device(), "torch.cuda.current_device()")
    return 0


def _device_or_all(device):
    """None means every device in use (-1 for the library); anything else as device_index."""
    return -1 if device is None else device_index(device)


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
    torch.cuda.memory_stats() returns them. Creates the device's allocator if needed.
    device: see device_index(); default the current device."""
    stats = _json_call(load().vmm_torch_stats_json, device_index(device))
    return dict(sorted(stats.items()))


def _allocator(device):
    lib = load()
    a = ctypes.c_void_p()
    _check(lib.vmm_torch_get_allocator(device_index(device), ctypes.byref(a)))
    return a


def pinned_stats(device=None):
    """Counters of the device allocator's pinned host memory cache ("pinned.*" keys)."""
    a = _allocator(device)
    stats = _json_call(lambda buf, n: load().vmm_pinned_stats_json(a, buf, n), check=_check_here)
    return dict(sorted(stats.items()))


def empty_cache(device=None):
    """Return cached memory of one device (default: every device in use) to the driver."""
    _check(load().vmm_torch_empty_cache(_device_or_all(device)))


def reset_peak_memory_stats(device=None):
    """Reset the peaks of one device (default: every device in use) to their current values."""
    _check(load().vmm_torch_reset_peaks(_device_or_all(device)))


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
    with pytorch.org/memory_viz or vmm-viz) and returns None. Without: returns the dict.
    The trace is empty unless record_memory_history() is on. Raises VmmError (EINVAL naming the
    path when it cannot be written)."""
    index = device_index(device)
    lib = load()
    if path is not None:
        _check(lib.vmm_torch_snapshot(index, os.fsencode(path)))
        return None
    fd, tmp = tempfile.mkstemp(prefix="vmmalloc-snapshot-", suffix=".pickle")
    os.close(fd)
    try:
        _check(lib.vmm_torch_snapshot(index, os.fsencode(tmp)))
        return load_snapshot(tmp)
    finally:
        os.unlink(tmp)


# vmm_record_history_ex flags (include/vmmalloc.h)
_STACKS = {None: 0, "native": 1, "python": 2, "all": 3}
_CONTEXT = {"all": 0, "alloc": 4, "state": 8}
DEFAULT_MAX_ENTRIES = 100000


def record_memory_history(max_entries=DEFAULT_MAX_ENTRIES, device=None, stacks="all",
                          context="all", enabled="all"):
    """Keep the device allocator's last ``max_entries`` events (allocs, frees, segment maps and
    unmaps, OOMs) for snapshot()'s device_traces, each with the call stack it happened in; 0 (or
    None, or enabled=None) stops recording and drops them. Resizing keeps the newest entries.

    The arguments follow torch.cuda.memory._record_memory_history:
      stacks: "all" (default): Python frames and native (C/C++) frames; "python": Python frames
        only; "native": native frames only; None: no frames (events only).
      context: "all" (default): frames on live blocks and on every trace entry; "alloc": not on
        frees; "state": on live blocks only; None: no frames (same as stacks=None).
      enabled: "all" (default) records the trace; "state" keeps frames of live blocks but only the
        newest event; None stops recording.
    Frames are read from the thread that allocates: Python frames when it runs Python code (a
    PyTorch op called from Python; docs/snapshots.md says when they are missing). They appear in
    snapshot() under PyTorch's keys, so pytorch.org/memory_viz shows them on hover.
    Raises ValueError for an unknown stacks / context / enabled, VmmError otherwise."""
    if isinstance(max_entries, str):  # PyTorch's order: _record_memory_history("all", ...)
        enabled, max_entries = max_entries, DEFAULT_MAX_ENTRIES
    if enabled not in ("all", "state", None):
        raise ValueError("vmmalloc: enabled must be 'all', 'state' or None, not %r" % (enabled,))
    if stacks not in _STACKS:
        raise ValueError("vmmalloc: stacks must be 'all', 'python', 'native' or None, not %r" % (stacks,))
    if context is not None and context not in _CONTEXT:
        raise ValueError("vmmalloc: context must be 'all', 'alloc', 'state' or None, not %r" % (context,))
    entries = 0 if enabled is None or not max_entries else int(max_entries)
    if enabled == "state" and entries:
        entries = 1
    flags = 0 if context is None else _STACKS[stacks] | (_CONTEXT[context] if _STACKS[stacks] else 0)
    lib = load()
    a = _allocator(device)
    rc = lib.vmm_record_history_ex(a, entries, flags)
    if rc == -3 and stacks == "all":  # ENOTSUP: a Python older than 3.10 has no API for its frames
        import warnings  # noqa: PLC0415
        warnings.warn("vmmalloc: Python frames need CPython 3.10 or later; recording native frames only",
                      RuntimeWarning, stacklevel=2)
        rc = lib.vmm_record_history_ex(a, entries, flags & ~_STACKS["python"])
    _check_here(rc)


def config_in_force(conf=None):
    """The configuration an allocator created now would use (PyTorch's variables, VMMALLOC_CONF,
    then conf), as {"config": "key:value,...", "error": None}; when the default driver cannot
    start here (no GPU), the keys come from a simulated allocator with the same settings and
    "error" says why ("driver": "sim" then). Raises VmmError for a bad configuration."""
    lib = load()

    def create(text):
        a = ctypes.c_void_p()
        rc = lib.vmm_create(text.encode() if text else None, ctypes.byref(a))
        msg = (lib.vmm_last_error() or b"").decode("utf-8", "replace")
        return rc, a, msg

    rc, a, msg = create(conf)
    err = None
    if rc == -5:  # ECONFIG
        raise VmmError(rc, msg)
    if rc < 0:
        err = "%s: %s" % (_STATUS.get(rc, rc), msg)
        rc, a, msg = create(((conf + ",") if conf else "") + "driver:sim,sim_backed:false")
        if rc < 0:
            raise VmmError(rc, msg)
    try:
        buf = ctypes.create_string_buffer(1 << 14)
        _check_here(lib.vmm_config_string(a, buf, len(buf)))
        return {"config": buf.value.decode(), "error": err}
    finally:
        lib.vmm_destroy(a)
from .sleepwake import sleep, wake, sleeping, use_tag, set_tag, get_tag, tag_of, is_asleep  # noqa: E402,F401
