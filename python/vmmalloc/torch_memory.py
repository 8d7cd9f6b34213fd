"""torch.cuda's memory API answered by vmmalloc (docs/pytorch.md, "torch.cuda's memory functions").

With a pluggable allocator PyTorch's memory functions raise ("CUDAPluggableAllocator does not yet
support getDeviceStats", ...) or do nothing. Every one of them is a thin Python wrapper over an
entry point of ``torch._C`` that it looks up at each call (torch/cuda/memory.py, e.g.
``memory_allocated`` -> ``memory_stats`` -> ``memory_stats_as_nested_dict`` ->
``torch._C._cuda_memoryStats(device)``). patch() replaces those entry points with functions that
answer from vmmalloc in the shape PyTorch's C++ returns (a nested dict for the stats, the snapshot
dict, ...), so the wrappers, their formatting (``memory_summary``) and every caller that imported them
earlier work unchanged. Only entry points this PyTorch has are replaced; one it lacks is named in a
single warning, never an error.

    entry point (torch._C)                  reached from
    _cuda_memoryStats(device)               memory_stats, memory_stats_as_nested_dict,
                                            memory_allocated, max_memory_allocated,
                                            memory_reserved, max_memory_reserved, memory_summary
    _cuda_resetPeakMemoryStats(device)      reset_peak_memory_stats, reset_max_memory_*
    _cuda_resetAccumulatedMemoryStats       reset_accumulated_memory_stats
    _cuda_memorySnapshot(arg)               memory._snapshot, _dump_snapshot, memory_snapshot
    _cuda_record_memory_history(...)        memory._record_memory_history (str form; the bool
    _cuda_record_memory_history_legacy      form in 2.0 and through the _legacy name later)
    _cuda_setMemoryFraction / _getMemory..  set_per_process_memory_fraction / get_...
    _cuda_emptyCache                        empty_cache
    _accelerator_getDeviceStats & co.       torch.accelerator.memory_stats & co. (recent releases)

torch is never imported here: patch() takes the module.
"""

import ctypes
import sys
import warnings

import vmmalloc as _v

__all__ = ["patch", "unpatch", "patched", "nested_stats", "snapshot_all", "ENTRY_POINTS"]

# PyTorch's DeviceStats as torch._C._cuda_memoryStats returns it (torch/csrc/cuda/Module.cpp):
# per-pool arrays, two single stats, and counters.
_ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
           "active_bytes", "inactive_split_bytes", "requested_bytes")
_POOLS = ("all", "small_pool", "large_pool")
_FIELDS = ("current", "peak", "allocated", "freed")
_SINGLES = ("oversize_allocations", "oversize_segments")
_COUNTERS = ("num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams",
             "num_device_alloc", "num_device_free")

# PyTorch's default max_entries is sys.maxsize ("keep everything"); vmmalloc's ring is allocated
# up front (40 bytes an entry, 4 more with stacks), so "everything" is taken as this many.
UNLIMITED_ENTRIES = 1000000

# name -> what it serves; the first group is what every 2.x release has and a missing one warns.
ENTRY_POINTS = {
    "_cuda_memoryStats": "memory_stats / memory_allocated / max_memory_* / memory_summary",
    "_cuda_resetPeakMemoryStats": "reset_peak_memory_stats",
    "_cuda_resetAccumulatedMemoryStats": "reset_accumulated_memory_stats",
    "_cuda_memorySnapshot": "memory._snapshot / _dump_snapshot / memory_snapshot",
    "_cuda_record_memory_history": "memory._record_memory_history",
    "_cuda_setMemoryFraction": "set_per_process_memory_fraction",
    "_cuda_emptyCache": "empty_cache",
}
OPTIONAL_ENTRY_POINTS = {
    "_cuda_record_memory_history_legacy": "memory._record_memory_history(True/False, ...) (releases with the string form keep the bool form here)",
    "_cuda_getMemoryFraction": "get_per_process_memory_fraction (recent releases)",
    "_accelerator_getDeviceStats": "torch.accelerator.memory_stats (recent releases)",
    "_accelerator_resetPeakStats": "torch.accelerator.reset_peak_memory_stats",
    "_accelerator_resetAccumulatedStats": "torch.accelerator.reset_accumulated_memory_stats",
    "_accelerator_emptyCache": "torch.accelerator.empty_cache",
}

_originals = {}   # name -> PyTorch's function
_state = {"torch": None, "patched": [], "missing": [], "rebound": 0}


_declared = []  # the library whose entry points _lib() declared


def _lib():
    lib = _v.load()
    if _declared and _declared[0] is lib:
        return lib
    c_int, c_size, c_double = ctypes.c_int, ctypes.c_size_t, ctypes.c_double
    sigs = {
        "vmm_torch_has_allocator": (c_int, [c_int]),
        "vmm_torch_reset_accumulated": (c_int, [c_int]),
        "vmm_torch_record_history_ex": (c_int, [c_int, c_size, ctypes.c_uint]),
        "vmm_torch_set_memory_fraction": (None, [c_double, c_int]),
        "vmm_torch_get_memory_fraction": (c_int, [c_int, ctypes.POINTER(c_double), ctypes.POINTER(c_size)]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    _declared[:] = [lib]
    return lib


def _device(device):
    return _v.device_index(device)


def _devices_in_use():
    lib = _lib()
    return [d for d in range(64) if lib.vmm_torch_has_allocator(d)]


def nested_stats(flat):
    """PyTorch's nested stats dict (torch._C._cuda_memoryStats) from vmmalloc's flat one; keys
    vmmalloc has and PyTorch does not are left out (vmmalloc.torch.memory_stats has them)."""
    out = {c: int(flat.get(c, 0)) for c in _COUNTERS}
    if "max_split_size" not in flat:
        out["max_split_size"] = -1
    # recent releases count allocations their throw_on_cudamalloc_oom policy rejected before trying;
    # vmmalloc has no such policy (past the cap it fails, counted in num_ooms)
    out["num_oom_rejections"] = 0
    for name in _ARRAYS:
        out[name] = {p: {f: int(flat.get("%s.%s.%s" % (name, p, f), 0)) for f in _FIELDS} for p in _POOLS}
    for name in _SINGLES:
        out[name] = {f: int(flat.get("%s.%s" % (name, f), 0)) for f in _FIELDS}
    return out


def _memory_stats(device=None):
    d = _device(device)
    if not _lib().vmm_torch_has_allocator(d):
        # a device vmmalloc never served: zeros, as PyTorch's for an unused device (asking the
        # library would create an allocator, and a CUDA context, on it)
        return nested_stats({})
    return nested_stats(_v.memory_stats(d))


def _for_device(fn_name):
    def reset(device=None):
        d = _device(device)
        lib = _lib()
        if lib.vmm_torch_has_allocator(d):
            _v._check(getattr(lib, fn_name)(d))  # noqa: SLF001
    return reset


def snapshot_all(include_traces=True, pool_id=None):
    """torch.cuda.memory._snapshot() over every device vmmalloc serves: segments of all devices
    (each names its device), device_traces[d] the trace of device d, allocator_settings of the
    first. pool_id (a pair): only the segments of that private pool, as PyTorch's
    memory_snapshot(mempool_id)."""
    result = {"segments": [], "device_traces": []}
    for d in _devices_in_use():
        s = _v.snapshot(device=d)
        # one allocator's snapshot: its segments, and its trace as the last list of device_traces
        # (at the driver's ordinal, which a simulated device gives as 0); both go under d
        for seg in s.get("segments", []):
            seg["device"] = d
            result["segments"].append(seg)
        traces = s.get("device_traces", [])
        while len(result["device_traces"]) <= d:
            result["device_traces"].append([])
        if traces and include_traces:
            result["device_traces"][d] = traces[-1]
        for k, v in s.items():
            if k not in result:
                result[k] = v
    torch = _state["torch"]
    try:
        n = int(torch.cuda.device_count()) if torch is not None else 0
    except Exception:  # noqa: BLE001 (a count is a nicety here)
        n = 0
    while len(result["device_traces"]) < n:
        result["device_traces"].append([])
    if pool_id is not None and tuple(pool_id) != (0, 0):
        want = tuple(int(x) for x in pool_id)
        result["segments"] = [s for s in result["segments"]
                              if tuple(s.get("segment_pool_id", (0, 0))) == want]
    return result


def _memory_snapshot(*args):
    # 2.0 .. 2.5: no argument; later: None or (id0, id1[, include_traces])
    arg = args[0] if args else None
    if isinstance(arg, (tuple, list)):
        include = bool(arg[2]) if len(arg) > 2 else True
        return snapshot_all(include_traces=include, pool_id=arg[:2])
    return snapshot_all()


_STACKS = {"python": _v._STACKS["python"], "all": _v._STACKS["all"]}  # noqa: SLF001 (PyTorch's choices)


def _history_flags(context, stacks):
    if context is None:
        return 0
    return _STACKS[stacks] | _v._CONTEXT[context]  # noqa: SLF001


def _apply_history(entries, flags, clear=False):
    lib = _lib()
    if clear:
        _v._check(lib.vmm_torch_record_history_ex(-1, 0, 0))  # noqa: SLF001
    rc = lib.vmm_torch_record_history_ex(-1, entries, flags)
    if rc == -3 and flags & _v._STACKS["python"]:  # noqa: SLF001 (ENOTSUP: CPython < 3.10)
        warnings.warn("vmmalloc: Python frames need CPython 3.10 or later; recording native frames only",
                      RuntimeWarning, stacklevel=3)
        rc = lib.vmm_torch_record_history_ex(-1, entries, flags & ~_v._STACKS["python"])  # noqa: SLF001
    _v._check(rc)  # noqa: SLF001


def _entries(max_entries):
    n = int(max_entries)
    if n <= 0:
        return 0
    if n > UNLIMITED_ENTRIES:
        if n != sys.maxsize:
            warnings.warn("vmmalloc: max_entries=%d is above vmmalloc's ring limit; keeping the newest %d"
                          % (n, UNLIMITED_ENTRIES), RuntimeWarning, stacklevel=3)
        return UNLIMITED_ENTRIES
    return n


def _record_legacy(enabled, record_context=True, trace_alloc_max_entries=1, trace_alloc_record_context=False,
                   record_context_cpp=False, clear_history=False, *rest, **kwargs):  # noqa: ARG001
    # _record_memory_history(True/False, ...): 1 entry is "state only" (no trace)
    if not enabled:
        _apply_history(0, 0)
        return
    context = None if not record_context else ("alloc" if trace_alloc_record_context else "state")
    stacks = "all" if record_context_cpp else "python"
    _apply_history(_entries(trace_alloc_max_entries), _history_flags(context, stacks), bool(clear_history))


def _record_memory_history(*args, **kwargs):
    """_cuda_record_memory_history(enabled, context, stacks, max_entries[, clear_history,
    compile_context, global_record_annotations, skip_actions, record_pinned_host_memory,
    record_cuda]) as 2.1 .. 2.11 pass it; a bool first argument is 2.0's form of the same name
    (enabled, record_context, trace_alloc_max_entries, trace_alloc_record_context,
    record_context_cpp), whose own defaults then apply."""
    first = args[0] if args else kwargs.get("enabled", "all")
    if isinstance(first, bool):
        _record_legacy(*args, **kwargs)
        return
    _record_str(*args, **kwargs)


def _record_str(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, *rest, **kwargs):
    if enabled not in (None, "state", "all"):
        raise ValueError("enabled must be None, 'state' or 'all', not %r" % (enabled,))
    if context not in (None, "state", "alloc", "all"):
        raise ValueError("context must be None, 'state', 'alloc' or 'all', not %r" % (context,))
    if stacks not in ("python", "all"):
        raise ValueError("stacks must be 'python' or 'all', not %r" % (stacks,))
    clear = bool(rest[0]) if rest else bool(kwargs.get("clear_history", False))
    record_cuda = rest[5] if len(rest) > 5 else kwargs.get("record_cuda", True)
    if enabled is None or not record_cuda:
        _apply_history(0, 0)
        return
    entries = 1 if enabled == "state" else _entries(max_entries)
    _apply_history(entries, _history_flags(context, stacks), clear)


def _set_memory_fraction(fraction, device):
    d = _device(device)
    lib = _lib()
    lib.vmm_torch_set_memory_fraction(float(fraction), d)
    f = ctypes.c_double()
    _v._check(lib.vmm_torch_get_memory_fraction(d, ctypes.byref(f), None))  # noqa: SLF001
    if f.value != float(fraction):
        raise _v.VmmError(-2, _v.last_error())


def _get_memory_fraction(device):
    f = ctypes.c_double()
    _v._check(_lib().vmm_torch_get_memory_fraction(_device(device), ctypes.byref(f), None))  # noqa: SLF001
    return f.value


def _empty_cache(*args):  # noqa: ARG001
    _v.empty_cache(None)


_REPLACEMENTS = {
    "_cuda_memoryStats": _memory_stats,
    "_cuda_resetPeakMemoryStats": _for_device("vmm_torch_reset_peaks"),
    "_cuda_resetAccumulatedMemoryStats": _for_device("vmm_torch_reset_accumulated"),
    "_cuda_memorySnapshot": _memory_snapshot,
    "_cuda_record_memory_history": _record_memory_history,
    "_cuda_record_memory_history_legacy": _record_legacy,
    "_cuda_setMemoryFraction": _set_memory_fraction,
    "_cuda_getMemoryFraction": _get_memory_fraction,
    "_cuda_emptyCache": _empty_cache,
    "_accelerator_getDeviceStats": _memory_stats,
    "_accelerator_resetPeakStats": _for_device("vmm_torch_reset_peaks"),
    "_accelerator_resetAccumulatedStats": _for_device("vmm_torch_reset_accumulated"),
    "_accelerator_emptyCache": _empty_cache,
}


def _rebind(swap):
    """Names bound to one of PyTorch's functions elsewhere (``from torch._C import
    _cuda_memoryStats`` done before install): point them at the replacement. swap: {id(old):
    [(old, new, entry point name), ...]} (one replacement may serve two names: unpatch picks the
    original of the name the module used); one pass over the modules' globals. Returns how many
    were rebound."""
    n = 0
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for k, v in list(d.items()):
            hits = swap.get(id(v))
            if not hits or hits[0][0] is not v:
                continue
            new = next((h[1] for h in hits if h[2] == k), hits[0][1])
            try:
                setattr(mod, k, new)
                n += 1
            except (AttributeError, TypeError):
                pass
    return n


def patch(torch):
    """Replace torch._C's memory entry points (ENTRY_POINTS, OPTIONAL_ENTRY_POINTS) with vmmalloc's,
    for the ones this PyTorch has. Returns {"patched": [...], "missing": [...], "rebound": n}.
    A missing ENTRY_POINTS name gives one RuntimeWarning naming it and what it serves; nothing
    raises. Idempotent."""
    C = getattr(torch, "_C", None)
    _state["torch"] = torch
    if C is None:
        warnings.warn("vmmalloc: this torch has no torch._C; torch.cuda's memory functions are not "
                      "wired to vmmalloc (use vmmalloc.torch.memory_stats & co.)", RuntimeWarning, stacklevel=2)
        _state["missing"] = sorted(ENTRY_POINTS)
        return patched()
    missing, swap = [], {}
    for name, fn in _REPLACEMENTS.items():
        current = getattr(C, name, None)
        if current is None:
            if name in ENTRY_POINTS:
                missing.append(name)
            continue
        if name in _originals:
            continue
        _originals[name] = current
        setattr(C, name, fn)
        swap.setdefault(id(current), []).append((current, fn, name))
        _state["patched"].append(name)
    _state["rebound"] += _rebind(swap)
    _state["missing"] = missing
    if missing:
        version = getattr(torch, "__version__", "?")
        warnings.warn("vmmalloc: PyTorch %s has no %s; %s will not answer from vmmalloc (the rest "
                      "do; vmmalloc.torch.memory_stats, snapshot and record_memory_history always do)"
                      % (version, ", ".join("torch._C." + m for m in missing),
                         "; ".join(ENTRY_POINTS[m] for m in missing)), RuntimeWarning, stacklevel=2)
    return patched()


def unpatch():
    """Put PyTorch's entry points back (tests; an install that failed after patching)."""
    torch = _state["torch"]
    C = getattr(torch, "_C", None)
    swap = {}
    for name, fn in list(_originals.items()):
        if C is not None:
            mine = getattr(C, name, None)
            setattr(C, name, fn)
            if mine is not None:
                swap.setdefault(id(mine), []).append((mine, fn, name))
        del _originals[name]
    _rebind(swap)
    _state.update(patched=[], missing=[], rebound=0)


def patched():
    """What patch() did: {"patched": [names], "missing": [names], "rebound": n}."""
    return {"patched": list(_state["patched"]), "missing": list(_state["missing"]),
            "rebound": _state["rebound"]}
