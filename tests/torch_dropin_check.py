"""torch.cuda's memory API answered by vmmalloc (vmmalloc.torch_memory, wired by install()), on the
simulated driver: run by tests/test_torch_dropin_python.c with VMMALLOC_LIB and VMMALLOC_CONF set.

No PyTorch with CUDA runs here, so two stand-ins are used, and the test says which checks come from
which:
  A. A stand-in ``torch`` written for this test that mimics PyTorch 2.11's API where vmmalloc meets
     it: torch._C's entry points raising as a pluggable allocator's do ("CUDAPluggableAllocator does
     not yet support ..."), and Python wrappers in torch.cuda.memory / torch.accelerator that call
     them at each call, as torch/cuda/memory.py does (memory_stats flattens the nested dict and sorts
     it; memory_allocated & co. read one key; _record_memory_history passes ten arguments; _snapshot
     passes None, memory_snapshot a (0, 0, True) tuple; set_per_process_memory_fraction calls
     _cuda_setMemoryFraction). install() runs against it (fake CUDAPluggableAllocator with hook
     setters). It is NOT PyTorch: the shapes it checks are the ones read in PyTorch's sources.
  B. The real PyTorch Python layer when one is importable (Debian's python3-torch 1.13, CPU only, on
     the machine this was written on): its own torch.cuda.memory wrappers, memory_summary's table
     included, run over vmmalloc's entry points, which are set on its torch._C first (a CPU build
     has none) and then patched. Skipped, saying so, without torch.

Exits 0 when every check passes, 1 otherwise (each failure printed).
"""

import ctypes
import os
import shutil
import sys
import tempfile
import types
import warnings

ROOT = os.environ.get("VMM_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ["VMMALLOC_CACHE_DIR"] = tempfile.mkdtemp(prefix="vmmalloc-dropin-")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def raises(exc, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        return e
    return None


def pluggable_refusal(what):
    def refuse(*args, **kwargs):
        raise RuntimeError("CUDAPluggableAllocator does not yet support %s. If you need it, please "
                           "file an issue describing your use case." % what)
    return refuse


# ---- A. the stand-in for PyTorch 2.11 ---------------------------------------------------------

def make_torch_211(with_history=True):
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+standin"
    C = types.ModuleType("torch._C")
    refusals = {
        "_cuda_memoryStats": "getDeviceStats", "_cuda_resetPeakMemoryStats": "resetPeakStats",
        "_cuda_resetAccumulatedMemoryStats": "resetAccumulatedStats", "_cuda_memorySnapshot": "snapshot",
        "_cuda_record_memory_history": "recordHistory", "_cuda_record_memory_history_legacy": "recordHistory",
        "_cuda_getMemoryFraction": "getMemoryFraction", "_accelerator_getDeviceStats": "getDeviceStats",
        "_accelerator_resetPeakStats": "resetPeakStats",
        "_accelerator_resetAccumulatedStats": "resetAccumulatedStats",
    }
    for name, what in refusals.items():
        setattr(C, name, pluggable_refusal(what))
    C.fraction_calls = []
    C._cuda_setMemoryFraction = lambda f, d: C.fraction_calls.append((f, d))  # reaches the hook in C++
    C._cuda_emptyCache = lambda: None
    C._accelerator_emptyCache = lambda: None
    if not with_history:
        del C._cuda_record_memory_history
    torch._C = C

    cuda = types.ModuleType("torch.cuda")
    cuda.is_initialized = lambda: cuda._initialized
    cuda._initialized = False
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 2
    cuda.current_device = lambda: 0
    cuda.mem_get_info = lambda device=None: (111, 222)  # the driver's; never vmmalloc's

    def device_index(device):
        return 0 if device is None else int(getattr(device, "index", device))

    memory = types.ModuleType("torch.cuda.memory")

    class Allocator:  # torch._C._cuda_CUDAAllocator with the hook setters of Module.cpp
        def __init__(self):
            self.hooks = {}

        def set_memory_fraction_fn(self, addr):
            self.hooks["set_memory_fraction_fn"] = addr

    class CUDAPluggableAllocator:
        def __init__(self, path, alloc_fn, free_fn):
            self.args = (path, alloc_fn, free_fn)
            self._allocator = Allocator()

        def allocator(self):
            return self._allocator

    def change_current_allocator(alloc):
        memory.current = alloc

    def memory_stats_as_nested_dict(device=None):
        if not cuda.is_initialized():
            return {}
        return torch._C._cuda_memoryStats(device_index(device))

    def memory_stats(device=None):
        flat = []

        def walk(prefix, obj):
            if isinstance(obj, dict):
                for k, v in obj.items():
                    walk(prefix + "." + k if prefix else k, v)
            else:
                flat.append((prefix, obj))
        walk("", memory_stats_as_nested_dict(device))
        flat.sort()
        return dict(flat)

    memory.CUDAPluggableAllocator = CUDAPluggableAllocator
    memory.change_current_allocator = change_current_allocator
    memory.current = None
    memory.memory_stats = memory_stats
    memory.memory_stats_as_nested_dict = memory_stats_as_nested_dict
    memory.memory_allocated = lambda device=None: memory_stats(device).get("allocated_bytes.all.current", 0)
    memory.max_memory_allocated = lambda device=None: memory_stats(device).get("allocated_bytes.all.peak", 0)
    memory.memory_reserved = lambda device=None: memory_stats(device).get("reserved_bytes.all.current", 0)
    memory.max_memory_reserved = lambda device=None: memory_stats(device).get("reserved_bytes.all.peak", 0)
    memory.reset_peak_memory_stats = lambda device=None: torch._C._cuda_resetPeakMemoryStats(device_index(device))
    memory.reset_accumulated_memory_stats = \
        lambda device=None: torch._C._cuda_resetAccumulatedMemoryStats(device_index(device))
    memory.memory_snapshot = lambda mempool_id=None, include_traces=True: torch._C._cuda_memorySnapshot(
        (0, 0, include_traces) if mempool_id is None else (mempool_id[0], mempool_id[1], include_traces))["segments"]
    memory._snapshot = lambda device=None: torch._C._cuda_memorySnapshot(None)

    def _dump_snapshot(filename="dump_snapshot.pickle"):
        import pickle  # noqa: PLC0415
        with open(filename, "wb") as f:
            pickle.dump(memory._snapshot(), f)

    def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                               device=None, clear_history=False, compile_context=False,
                               global_record_annotations=False, skip_actions=None,
                               record_pinned_host_memory=False, record_cuda=True):
        if isinstance(enabled, bool):
            return torch._C._cuda_record_memory_history_legacy(enabled, context, stacks, max_entries,
                                                                False, False, False, False, [], False, True)
        torch._C._cuda_record_memory_history(enabled, context, stacks, max_entries, clear_history,
                                             compile_context, global_record_annotations,
                                             skip_actions or [], record_pinned_host_memory, record_cuda)

    def set_per_process_memory_fraction(fraction, device=None):
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        torch._C._cuda_setMemoryFraction(fraction, device_index(device))

    memory._dump_snapshot = _dump_snapshot
    memory._record_memory_history = _record_memory_history
    memory.set_per_process_memory_fraction = set_per_process_memory_fraction
    memory.get_per_process_memory_fraction = lambda device=None: torch._C._cuda_getMemoryFraction(device_index(device))
    memory.empty_cache = lambda: torch._C._cuda_emptyCache() if cuda.is_initialized() else None
    for name in ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
                 "set_per_process_memory_fraction", "get_per_process_memory_fraction", "empty_cache",
                 "memory_snapshot"):
        setattr(cuda, name, getattr(memory, name))
    cuda.memory = memory
    torch.cuda = cuda

    accelerator = types.ModuleType("torch.accelerator")
    accelerator.memory_stats = lambda d=None: dict(sorted(_flat(torch._C._accelerator_getDeviceStats(d or 0))))
    accelerator.reset_peak_memory_stats = lambda d=None: torch._C._accelerator_resetPeakStats(d or 0)
    torch.accelerator = accelerator
    return torch


def _flat(nested, prefix=""):
    for k, v in nested.items():
        key = prefix + "." + k if prefix else k
        if isinstance(v, dict):
            yield from _flat(v, key)
        else:
            yield key, v


def use(torch):
    for name in ("torch", "torch._C", "torch.cuda", "torch.cuda.memory", "torch.accelerator"):
        sys.modules.pop(name, None)
    sys.modules["torch"] = torch
    sys.modules["torch._C"] = torch._C
    sys.modules["torch.cuda"] = torch.cuda
    sys.modules["torch.cuda.memory"] = torch.cuda.memory
    sys.modules["torch.accelerator"] = torch.accelerator


# PyTorch's memory_stats keys (torch/csrc/cuda/Module.cpp's dict, flattened): 9 stat arrays by
# pool and metric, 2 single stats by metric, 6 counters, and num_oom_rejections of recent releases.
ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
          "active_bytes", "inactive_split_bytes", "requested_bytes")
TORCH_KEYS = sorted(["%s.%s.%s" % (a, p, m) for a in ARRAYS for p in ("all", "small_pool", "large_pool")
                     for m in ("current", "peak", "allocated", "freed")]
                    + ["%s.%s" % (s, m) for s in ("oversize_allocations", "oversize_segments")
                       for m in ("current", "peak", "allocated", "freed")]
                    + ["num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams",
                       "num_device_alloc", "num_device_free", "num_oom_rejections"])


def standin_checks():
    import vmmalloc  # noqa: PLC0415
    import vmmalloc.torch as vt  # noqa: PLC0415
    from vmmalloc import torch_memory as tm  # noqa: PLC0415
    torch = make_torch_211()
    use(torch)
    # names imported before install: a wrapper (calls through torch._C at each call) and an entry point
    early_max = torch.cuda.max_memory_allocated
    holder = types.ModuleType("user_module_imported_early")
    holder.stats_entry = torch._C._cuda_memoryStats
    sys.modules[holder.__name__] = holder

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vt.install("expandable_segments:true")
    st = vt.status()
    check(st["installed"] and st["memory_fraction_hook"], "installed, fraction hook set: %r" % st)
    mine = [str(w.message) for w in caught if "has no torch._C" in str(w.message)]
    check(mine == [], "2.11 stand-in: no entry point reported missing: %r" % mine)
    check(sorted(st["memory_api"]["patched"]) == sorted(tm._REPLACEMENTS), "every entry point patched: %r"
          % st["memory_api"])
    check(holder.stats_entry is torch._C._cuda_memoryStats, "a name bound earlier is rebound")
    hook = torch.cuda.memory.current._allocator.hooks.get("set_memory_fraction_fn")
    lib = vmmalloc.load()
    check(hook == ctypes.cast(lib.vmm_torch_set_memory_fraction, ctypes.c_void_p).value,
          "set_memory_fraction_fn got vmm_torch_set_memory_fraction's address")

    cuda = torch.cuda
    check(cuda.memory_stats() == {}, "before CUDA init: {} (PyTorch's memory_stats_as_nested_dict)")
    cuda._initialized = True

    # allocations as PyTorch makes them (vmm_torch_malloc: the shim adds only the exception)
    p0 = [lib.vmm_torch_malloc(n, 0, None) for n in (3 << 20, 1000, 512 << 10)]
    p1 = lib.vmm_torch_malloc(5 << 20, 1, None)
    check(all(p0) and p1, "allocations served")
    own0, own1 = vmmalloc.memory_stats(0), vmmalloc.memory_stats(1)
    stats0 = cuda.memory_stats(0)
    check(list(stats0) == TORCH_KEYS, "memory_stats(): exactly PyTorch's keys, sorted (%d vs %d)"
          % (len(stats0), len(TORCH_KEYS)))
    theirs = [k for k in TORCH_KEYS if k != "num_oom_rejections"]
    check(all(stats0[k] == own0.get(k, -12345) for k in theirs) and stats0["num_oom_rejections"] == 0,
          "every value is vmmalloc's own: %r" % [k for k in theirs if stats0[k] != own0.get(k)])
    check(cuda.memory_allocated(0) == own0["allocated_bytes.all.current"] > (3 << 20) + (512 << 10),
          "memory_allocated(0) = vmmalloc's allocated_bytes.all.current")
    check(cuda.memory_allocated(1) == own1["allocated_bytes.all.current"] == 5 << 20,
          "memory_allocated(1) is device 1's")
    check(cuda.memory_reserved(0) == own0["reserved_bytes.all.current"] >= cuda.memory_allocated(0),
          "memory_reserved(0)")
    check(stats0["allocation.all.current"] == 3 and stats0["allocation.small_pool.current"] == 2
          and stats0["allocation.large_pool.current"] == 1, "allocations by pool: %r"
          % [stats0[k] for k in ("allocation.all.current", "allocation.small_pool.current")])
    check(stats0["requested_bytes.all.current"] == (3 << 20) + 1000 + (512 << 10), "requested bytes")
    check(stats0["max_split_size"] == -1 and stats0["num_ooms"] == 0, "counters")
    nested = torch._C._cuda_memoryStats(0)
    check(set(nested["allocated_bytes"]) == {"all", "small_pool", "large_pool"}
          and set(nested["allocated_bytes"]["all"]) == {"current", "peak", "allocated", "freed"}
          and isinstance(nested["num_ooms"], int), "nested dict in _cuda_memoryStats's shape")

    peak = cuda.max_memory_allocated(0)
    lib.vmm_torch_free(p0[0], 3 << 20, 0, None)
    check(cuda.max_memory_allocated(0) == peak > cuda.memory_allocated(0), "the peak stays after a free")
    check(early_max(0) == peak, "max_memory_allocated imported before install answers too")
    cuda.reset_peak_memory_stats(0)
    check(cuda.max_memory_allocated(0) == cuda.memory_allocated(0), "reset_peak_memory_stats(0)")
    check(cuda.max_memory_allocated(1) == 5 << 20, "device 1's peak untouched")
    check(cuda.memory_stats(0)["allocation.all.allocated"] == 3, "cumulative before reset")
    cuda.reset_accumulated_memory_stats(0)
    s = cuda.memory_stats(0)
    check(s["allocation.all.allocated"] == 0 and s["allocation.all.freed"] == 0
          and s["allocation.all.current"] == 2 and s["allocated_bytes.all.peak"] == cuda.memory_allocated(0),
          "reset_accumulated_memory_stats: counters 0, current and peak kept")

    # a device vmmalloc never served: zeros, and no allocator (no CUDA context) made for the question
    check(cuda.memory_allocated(3) == 0 and cuda.memory_stats(3)["segment.all.current"] == 0
          and not lib.vmm_torch_has_allocator(3), "unused device 3: zeros, no allocator created")
    acc = torch.accelerator.memory_stats(1)
    check(acc["allocated_bytes.all.current"] == 5 << 20, "torch.accelerator.memory_stats(1)")
    torch.accelerator.reset_peak_memory_stats(1)

    # history and snapshots, as users call them
    cuda.memory._record_memory_history(max_entries=1000, stacks="python")
    q = lib.vmm_torch_malloc(2 << 20, 0, None)
    lib.vmm_torch_free(q, 2 << 20, 0, None)
    r = lib.vmm_torch_malloc(7 << 20, 1, None)
    snap = cuda.memory._snapshot()
    check(set(snap) >= {"segments", "device_traces", "allocator_settings"}, "snapshot keys: %r" % sorted(snap))
    check(len(snap["device_traces"]) == 2, "one trace per device: %d" % len(snap["device_traces"]))
    t0 = [e["action"] for e in snap["device_traces"][0]]
    t1 = [e for e in snap["device_traces"][1] if e["action"] == "alloc"]
    check("alloc" in t0 and "free_requested" in t0, "device 0's trace: %r" % t0)
    check([e["size"] for e in t1] == [7 << 20], "device 1's trace has its alloc: %r" % t1)
    frames = [f["filename"] for e in snap["device_traces"][0] if e["action"] == "alloc" for f in e["frames"]]
    if sys.version_info >= (3, 10):
        check(any(f.endswith("torch_dropin_check.py") for f in frames),
              "stacks='python': the allocating Python line is in the frames: %r" % frames[:4])
    devices = {seg["device"] for seg in snap["segments"]}
    check(devices == {0, 1}, "segments of both devices: %r" % devices)
    live = sorted(b["requested_size"] for seg in snap["segments"] for b in seg["blocks"]
                  if b["state"] == "active_allocated")
    check(live == sorted([1000, 512 << 10, 5 << 20, 7 << 20]), "live blocks of both devices: %r" % live)
    check(cuda.memory_snapshot() == snap["segments"], "memory_snapshot() = _snapshot()['segments']")
    path = os.path.join(os.environ["VMMALLOC_CACHE_DIR"], "dump.pickle")
    cuda.memory._dump_snapshot(path)
    dumped = vmmalloc.load_snapshot(path)
    check(dumped["segments"] == snap["segments"] and len(dumped["device_traces"]) == 2,
          "_dump_snapshot(path) writes the same snapshot")
    no_traces = torch._C._cuda_memorySnapshot((0, 0, False))
    check(all(t == [] for t in no_traces["device_traces"]), "include_traces=False: empty traces")
    cuda.memory._record_memory_history(enabled=None)
    n_before = len(cuda.memory._snapshot()["device_traces"][0])
    x = lib.vmm_torch_malloc(4096, 0, None)
    lib.vmm_torch_free(x, 4096, 0, None)
    check(n_before == 0 and cuda.memory._snapshot()["device_traces"][0] == [],
          "enabled=None stops recording and drops the trace")
    cuda.memory._record_memory_history(True, True, 50)  # the bool form (_legacy)
    x = lib.vmm_torch_malloc(4096, 0, None)
    check(any(e["action"] == "alloc" for e in cuda.memory._snapshot()["device_traces"][0]),
          "legacy form: recording with 50 entries")
    lib.vmm_torch_free(x, 4096, 0, None)
    cuda.memory._record_memory_history(False)
    # 2.0's bool form under the same name (defaults of that form: 1 entry, Python frames on state)
    torch._C._cuda_record_memory_history(True)
    x = lib.vmm_torch_malloc(4096, 0, None)
    trace = cuda.memory._snapshot()["device_traces"][0]
    check(len(trace) == 1, "2.0 form _cuda_record_memory_history(True): one entry kept: %r" % trace)
    lib.vmm_torch_free(x, 4096, 0, None)
    torch._C._cuda_record_memory_history(False)
    e = raises(ValueError, cuda.memory._record_memory_history, "everything")
    check(e is not None, "a bad enabled is refused as PyTorch does")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cuda.memory._record_memory_history(max_entries=10 ** 9)
    check(any("ring limit" in str(w.message) for w in caught), "a huge max_entries is capped, with a warning")
    cuda.memory._record_memory_history(None)

    # memory fraction: set through PyTorch's wrapper caps vmmalloc on that device only
    cuda.set_per_process_memory_fraction(0.25, 1)
    check(abs(cuda.get_per_process_memory_fraction(1) - 0.25) < 1e-12, "get_per_process_memory_fraction(1)")
    check(cuda.get_per_process_memory_fraction(0) == 1.0, "device 0 keeps the whole device")
    lib.vmm_torch_malloc_status.restype = ctypes.c_int
    check(not lib.vmm_torch_malloc(300 << 20, 1, None) and lib.vmm_torch_malloc_status() == -1,
          "300 MiB over device 1's 256 MiB cap: out of memory")
    check("this allocator may use 256.00 MiB" in vmmalloc.oom_report(), "the report names the cap")
    check(cuda.memory_stats(1)["num_ooms"] == 1, "num_ooms counts it")
    y = lib.vmm_torch_malloc(300 << 20, 0, None)
    check(bool(y), "device 0 still serves 300 MiB")
    lib.vmm_torch_free(y, 300 << 20, 0, None)
    check(cuda.mem_get_info(1) == (111, 222), "mem_get_info stays the driver's (not wired to vmmalloc)")
    # what C++ callers reach: PyTorch's setMemoryFraction calls the hook with (fraction, device)
    ctypes.CFUNCTYPE(None, ctypes.c_double, ctypes.c_int)(hook)(0.5, 1)
    check(cuda.get_per_process_memory_fraction(1) == 0.5, "the C hook sets device 1's fraction")
    cuda.set_per_process_memory_fraction(1.0, 1)

    cuda.empty_cache()  # reaches vmm_torch_empty_cache(-1); must not raise
    for p in (p0[1], p0[2]):
        lib.vmm_torch_free(p, 0, 0, None)
    lib.vmm_torch_free(p1, 5 << 20, 1, None)
    lib.vmm_torch_free(r, 7 << 20, 1, None)
    check(cuda.memory_allocated(0) == 0 and cuda.memory_allocated(1) == 0, "everything freed")
    tm.unpatch()
    e = raises(RuntimeError, cuda.memory_stats, 0)
    check(e is not None and "does not yet support" in str(e), "unpatch() puts PyTorch's entry points back")
    check(holder.stats_entry is torch._C._cuda_memoryStats, "and the early name with them")

    # a release without one of the entry points: a warning naming it, the rest wired, no error
    torch = make_torch_211(with_history=False)
    use(torch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = tm.patch(torch)
    msgs = [str(w.message) for w in caught]
    check(got["missing"] == ["_cuda_record_memory_history"]
          and any("torch._C._cuda_record_memory_history" in m and "2.11.0+standin" in m for m in msgs),
          "missing entry point named in a warning: %r %r" % (got, msgs))
    check("_cuda_memoryStats" in got["patched"], "the others are patched")
    tm.unpatch()


# ---- B. the real PyTorch Python layer (whatever version is installed) ------------------------

def real_torch_checks():
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        del sys.modules[name]
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        print("B skipped: PyTorch is not importable here (%s)" % e)
        return
    import vmmalloc  # noqa: PLC0415
    from vmmalloc import torch_memory as tm  # noqa: PLC0415
    print("B: PyTorch %s (CUDA %s)" % (torch.__version__, torch.version.cuda))
    mem = torch.cuda.memory
    # a CPU build has no _cuda_* entry points; give it the ones a CUDA build has, refusing as
    # the pluggable allocator does, so that patch() replaces real names under real wrappers
    added = []
    for name in ("_cuda_memoryStats", "_cuda_resetPeakMemoryStats", "_cuda_resetAccumulatedMemoryStats",
                 "_cuda_memorySnapshot", "_cuda_setMemoryFraction", "_cuda_emptyCache"):
        if not hasattr(torch._C, name):
            setattr(torch._C, name, pluggable_refusal(name))
            added.append(name)
    saved_init = mem.is_initialized
    mem.is_initialized = lambda: True  # the wrappers answer only once CUDA is initialized
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = tm.patch(torch)
        msgs = [str(w.message) for w in caught]
        missing = [m for m in tm.ENTRY_POINTS if not hasattr(torch._C, m) or m in got["missing"]]
        check(sorted(got["missing"]) == sorted(set(missing)), "patch() reports what this release lacks: %r" % got)
        if got["missing"]:
            check(any("torch._C." + got["missing"][0] in m for m in msgs), "and warns naming it: %r" % msgs)
        lib = vmmalloc.load()
        p = lib.vmm_torch_malloc(3 << 20, 0, None)
        q = lib.vmm_torch_malloc(1000, 0, None)
        own = vmmalloc.memory_stats(0)
        check(mem.memory_allocated(0) == own["allocated_bytes.all.current"], "real memory_allocated(0)")
        check(mem.max_memory_reserved(0) == own["reserved_bytes.all.peak"], "real max_memory_reserved(0)")
        stats = mem.memory_stats(0)
        check(all(stats[k] == own.get(k, 0) for k in TORCH_KEYS if k in stats) and "num_ooms" in stats,
              "real memory_stats(0) = vmmalloc's values")
        summary = mem.memory_summary(0)
        print(summary)
        check("PyTorch CUDA memory summary, device ID 0" in summary, "real memory_summary's table")
        line = [x for x in summary.splitlines() if x.startswith("| Allocated memory")]
        cur = line[0].split("|")[2].split() if line else []
        kib = {"B": 1 / 1024, "KB": 1, "KiB": 1, "MB": 1024, "MiB": 1024}.get(cur[1] if len(cur) > 1 else "", 0)
        check(cur and int(cur[0]) * kib <= own["allocated_bytes.all.current"] / 1024 < (int(cur[0]) + 1) * kib,
              "Allocated memory row shows vmmalloc's allocated bytes: %r vs %d" % (line, own["allocated_bytes.all.current"]))
        lib.vmm_torch_free(p, 3 << 20, 0, None)
        mem.reset_peak_memory_stats(0)
        check(mem.max_memory_allocated(0) == mem.memory_allocated(0) == own["allocated_bytes.all.current"] - (3 << 20),
              "real reset_peak_memory_stats(0)")
        segs = mem.memory_snapshot()
        if isinstance(segs, dict):  # 1.13's memory_snapshot returns the whole dict, 2.x its "segments"
            segs = segs["segments"]
        check(any(b["state"] == "active_allocated" for s in segs for b in s["blocks"]),
              "real memory_snapshot(): segments with the live block")
        lib.vmm_torch_free(q, 1000, 0, None)
        # the out-of-memory shim built against this torch's headers and libc10, as install() builds it
        from vmmalloc import _cxx  # noqa: PLC0415
        path, with_torch = _cxx.build("torch_alloc.cpp", use_torch=True)
        check(with_torch and "-torch-" in os.path.basename(path), "shim built with torch's headers: %s" % path)
        shim = ctypes.CDLL(path)
        shim.vmm_torch_alloc_raises_c10.restype = ctypes.c_int
        check(shim.vmm_torch_alloc_raises_c10() == 1, "and it raises c10::OutOfMemoryError")
        check(_cxx.build("torch_alloc.cpp", use_torch=True) == (path, True), "cached: built once")
    finally:
        tm.unpatch()
        mem.is_initialized = saved_init
        for name in added:
            delattr(torch._C, name)


try:
    standin_checks()
    real_torch_checks()
finally:
    shutil.rmtree(os.environ["VMMALLOC_CACHE_DIR"], True)
print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
