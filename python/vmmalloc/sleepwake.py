"""Tags, sleep and wake of vmmalloc's per-device allocators (the ones vmmalloc.torch.install() plugs
into PyTorch). docs/user-guide.md, "Sleep and wake", has the semantics; in short:

    with vmmalloc.use_tag("weights"):          # allocations made inside carry the tag
        model = load_model()
    with vmmalloc.use_tag("kv_cache"):
        cache = make_kv_cache()

    vmmalloc.sleep(tags="kv_cache", backup=False)   # contents dropped (vLLM level 2 for it)
    vmmalloc.sleep(tags="weights", backup=True)     # contents copied to pinned host memory
    ...                                             # the GPU memory is free for someone else
    vmmalloc.wake(tags="weights")                   # same addresses, contents restored
    vmmalloc.wake(tags="kv_cache")                  # staged: the KV cache later

    with vmmalloc.sleeping(tags=["weights", "kv_cache"]):   # sleep on entry, wake on exit
        train_step()

Addresses stay valid while asleep (tensors, captured CUDA graphs), but touching a sleeping tensor is
an error (the GPU faults). Tags are allocator-wide (every thread allocating on that device), as
vLLM's use_memory_pool(tag=...). Standard library only (ctypes); errors raise vmmalloc.VmmError.
"""

import contextlib
import ctypes

from . import VmmError, device_index, load

__all__ = ["DISCARD", "BACKUP", "KEEP_HOST", "set_tag", "get_tag", "tag_of", "use_tag", "sleep",
           "wake", "is_asleep", "sleeping"]

# vmm_sleep_mode of include/vmmalloc.h
DISCARD, BACKUP, KEEP_HOST = 0, 1, 2
_TAG_MAX = 64

_declared = None


def _lib():
    global _declared
    lib = load()
    if _declared is not lib:
        c_int, c_size, c_void_p, c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
        tags = ctypes.POINTER(c_char_p)
        sigs = {
            "vmm_set_tag": (c_int, [c_void_p, c_char_p]),
            "vmm_get_tag": (c_int, [c_void_p, c_char_p, c_size]),
            "vmm_tag_of": (c_int, [c_void_p, c_void_p, c_char_p, c_size]),
            "vmm_sleep": (c_int, [c_void_p, tags, c_size, c_int]),
            "vmm_wake": (c_int, [c_void_p, tags, c_size]),
            "vmm_is_asleep": (c_int, [c_void_p, c_char_p]),
        }
        for name, (res, args) in sigs.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        _declared = lib
    return lib


def _check(status):
    """These calls report through this thread's vmm_last_error() (ctypes calls on this thread)."""
    if status < 0:
        raise VmmError(status, (load().vmm_last_error() or b"").decode("utf-8", "replace"))
    return status


def _allocator(device):
    lib = _lib()
    a = ctypes.c_void_p()
    status = lib.vmm_torch_get_allocator(device_index(device), ctypes.byref(a))
    if status < 0:
        from . import last_error  # vmm_torch_* calls keep their message process wide
        raise VmmError(status, last_error())
    return a


def _encode(tag):
    if tag is None:
        return b""
    if isinstance(tag, bytes):
        return tag
    if not isinstance(tag, str):
        raise TypeError("vmmalloc: a tag is a str, not %s" % type(tag).__name__)
    return tag.encode("utf-8")


def _tag_array(tags):
    """None: every tag (NULL, 0); a str: that tag; an iterable of str: those tags."""
    if tags is None:
        return None, 0
    if isinstance(tags, (str, bytes)):
        tags = [tags]
    names = [_encode(t) for t in tags]
    if not names:
        return None, 0
    arr = (ctypes.c_char_p * len(names))(*names)
    return ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)), len(names)


def set_tag(tag, device=None):
    """Make `tag` ("" or None: untagged) the tag of allocations made from now on on the device
    (default: the current one); returns the previous tag."""
    a = _allocator(device)
    prev = get_tag(device)
    _check(_lib().vmm_set_tag(a, _encode(tag)))
    return prev


def get_tag(device=None):
    """The device allocator's current tag ("" when untagged)."""
    a = _allocator(device)
    buf = ctypes.create_string_buffer(_TAG_MAX + 1)
    _check(_lib().vmm_get_tag(a, buf, len(buf)))
    return buf.value.decode("utf-8")


def tag_of(ptr, device=None):
    """The tag of the live block at the integer address ``ptr`` (a tensor's data_ptr())."""
    a = _allocator(device)
    buf = ctypes.create_string_buffer(_TAG_MAX + 1)
    _check(_lib().vmm_tag_of(a, ctypes.c_void_p(int(ptr)), buf, len(buf)))
    return buf.value.decode("utf-8")


@contextlib.contextmanager
def use_tag(tag, device=None):
    """Allocations made inside the block carry `tag` (vLLM's use_memory_pool(tag=...))."""
    prev = set_tag(tag, device)
    try:
        yield
    finally:
        set_tag(prev, device)


def sleep(tags=None, backup=True, keep_host=False, device=None):
    """Release the device memory of the blocks of `tags` (a str, a list, or None for every tag)
    while keeping their addresses. backup=True copies their contents to page-locked host memory
    (restored by wake); False drops them. keep_host=True keeps the host buffer after the wake for
    the next sleep (no re-pinning then; host memory held meanwhile). Waits only for the work that
    still uses those blocks."""
    a = _allocator(device)
    mode = (BACKUP | (KEEP_HOST if keep_host else 0)) if backup else DISCARD
    arr, n = _tag_array(tags)
    _check(_lib().vmm_sleep(a, arr, n, mode))


def wake(tags=None, device=None):
    """Map memory back under the blocks of `tags` (None: every sleeping tag), at the same addresses,
    with their backed-up contents. Raises VmmError (ENOMEM) when the device cannot hold them: then
    nothing stays mapped and the tags stay asleep; wake again once memory is free."""
    a = _allocator(device)
    arr, n = _tag_array(tags)
    _check(_lib().vmm_wake(a, arr, n))


def is_asleep(tag, device=None):
    """True while `tag` sleeps."""
    a = _allocator(device)
    return bool(_check(_lib().vmm_is_asleep(a, _encode(tag))))


@contextlib.contextmanager
def sleeping(tags=None, backup=True, keep_host=False, device=None):
    """Sleep on entry, wake on exit (also when the block raises)."""
    sleep(tags, backup=backup, keep_host=keep_host, device=device)
    try:
        yield
    finally:
        wake(tags, device=device)
