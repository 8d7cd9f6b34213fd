"""The vmmalloc Python package without PyTorch: run by tests/python/test_pytorch_python.c with
VMMALLOC_LIB pointing at the built shared library and VMMALLOC_CONF selecting the simulated driver.
Exits 0 when every check passes, 1 otherwise (each failure printed).

It also runs itself again with --fake-torch: a fresh process (install() must come before any
allocator exists) where a fake ``torch`` module in sys.modules records every torch.cuda call, to
check that vmmalloc.torch.install() and the device defaults never initialize CUDA, that install()
refuses clearly once CUDA is initialized, and that tests/gpu_torch_train.py fails a vmmalloc run
that vmmalloc did not serve."""

import glob
import os
import subprocess
import sys
import types

ROOT = os.environ.get("VMM_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def raises(exc, fn, *args):
    try:
        fn(*args)
    except exc as e:
        return e
    return None


class FakeDevice:
    """What vmmalloc needs of a torch.device: .type and .index."""

    def __init__(self, type_, index=None):
        self.type, self.index = type_, index

    def __repr__(self):
        return "device(type=%r, index=%r)" % (self.type, self.index)


# torch.cuda functions that initialize PyTorch's CUDA state (torch/cuda/__init__.py: each runs
# _lazy_init(), directly or through cudart(); set_device's C++ side does the same). is_initialized,
# is_available and device_count do not.
INITIALIZING = ("_lazy_init", "init", "current_device", "set_device", "synchronize",
                "current_stream", "get_device_properties", "mem_get_info")


def make_fake_torch(initialized=False, current=0):
    """A fake torch whose torch.cuda records each call in .calls; the initializing ones set
    _initialized as PyTorch's _lazy_init() does. Any other torch.cuda attribute is recorded as
    "unexpected:NAME" and counted as initializing."""
    torch = types.ModuleType("torch")

    class Cuda(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)

            def unexpected(*a, **k):
                self.calls.append("unexpected:" + name)
                self._initialized = True
            return unexpected

    cuda = Cuda("torch.cuda")
    cuda.calls, cuda._initialized, cuda.current = [], initialized, current

    def recorder(name, fn):
        def f(*a, **k):
            cuda.calls.append(name)
            return fn(*a, **k)
        return f

    def lazy_init():
        cuda._initialized = True

    def set_device(i):
        lazy_init()
        cuda.current = i

    cuda.is_initialized = recorder("is_initialized", lambda: cuda._initialized)
    cuda.is_available = recorder("is_available", lambda: True)
    cuda.device_count = recorder("device_count", lambda: 2)
    cuda._lazy_init = recorder("_lazy_init", lazy_init)
    cuda.init = recorder("init", lazy_init)
    cuda.current_device = recorder("current_device", lambda: (lazy_init(), cuda.current)[1])
    cuda.set_device = recorder("set_device", set_device)
    for name in INITIALIZING[4:]:
        setattr(cuda, name, recorder(name, lambda *a, **k: lazy_init()))

    memory = types.ModuleType("torch.cuda.memory")

    class CUDAPluggableAllocator:
        def __init__(self, path, alloc_fn, free_fn):
            cuda.calls.append("CUDAPluggableAllocator")
            self.args = (path, alloc_fn, free_fn)

    def change_current_allocator(alloc):
        cuda.calls.append("change_current_allocator")
        if cuda._initialized:
            raise RuntimeError("Can't swap an already initialized allocator")
        memory.current = alloc

    memory.CUDAPluggableAllocator = CUDAPluggableAllocator
    memory.change_current_allocator = change_current_allocator
    memory.current = None
    cuda.memory = memory
    torch.cuda = cuda
    torch.device = FakeDevice
    return torch


def use_fake_torch(torch):
    sys.modules["torch"] = torch
    sys.modules["torch.cuda"] = torch.cuda
    sys.modules["torch.cuda.memory"] = torch.cuda.memory
    return torch.cuda


def initializing_calls(calls):
    return [c for c in calls if c in INITIALIZING or c.startswith("unexpected:")]


def fake_torch_checks():
    """Run in a fresh process (no allocator exists yet), with a fake torch."""
    import vmmalloc.torch as vt  # noqa: PLC0415
    lib = vmmalloc.load()

    # 1. CUDA already initialized: a clear RuntimeError, and nothing touched before it
    cuda = use_fake_torch(make_fake_torch(initialized=True))
    e = raises(RuntimeError, vt.install)
    check(e is not None and "already initialized" in str(e) and "install() before" in str(e),
          "install() after CUDA init -> clear RuntimeError: %r" % e)
    check(cuda.calls[:1] == ["is_initialized"],
          "install() checks torch.cuda.is_initialized() before any other torch.cuda call: %r" % cuda.calls)
    check("change_current_allocator" not in cuda.calls and "CUDAPluggableAllocator" not in cuda.calls,
          "no allocator swap attempted once CUDA is initialized: %r" % cuda.calls)
    check(not vt.is_installed(), "not installed after the refusal")

    # 2. the device defaults before install() never initialize CUDA (they would make install fail)
    cuda = use_fake_torch(make_fake_torch(current=1))
    check(vt.device_index() == 0 and vt.device_index("cuda") == 0
          and vt.device_index(FakeDevice("cuda")) == 0, "current device before CUDA init: 0")
    check(vt.device_index(FakeDevice("cuda", 1)) == 1, "torch.device('cuda', 1) -> 1")
    e = raises(ValueError, vt.device_index, FakeDevice("cpu"))
    check(e is not None and "not a CUDA device" in str(e), "torch.device('cpu') -> ValueError: %r" % e)
    check(initializing_calls(cuda.calls) == [],
          "device lookups before install() must not initialize CUDA: %r" % cuda.calls)

    # 3. install(): nothing before change_current_allocator initializes CUDA
    cuda.calls.clear()
    path = vt.install("expandable_segments:true")
    check(vt.is_installed() and os.path.samefile(path, os.environ["VMMALLOC_LIB"]), "installed: %r" % path)
    check("change_current_allocator" in cuda.calls, "change_current_allocator called: %r" % cuda.calls)
    before = cuda.calls[:cuda.calls.index("change_current_allocator")] \
        if "change_current_allocator" in cuda.calls else cuda.calls
    check(before[:1] == ["is_initialized"], "install() checks is_initialized first: %r" % cuda.calls)
    check(initializing_calls(before) == [], "install() initialized CUDA before swapping: %r" % cuda.calls)
    alloc = cuda.memory.current
    # the fake torch has no torch.utils.cpp_extension: the shim is the plain compiler's, whose
    # out of memory raises RuntimeError (tests/cxx/test_torch_alloc.cpp checks what it throws)
    st = vt.status()
    check(st["oom"] == "runtime_error" and st["alloc_shim"]
          and os.path.dirname(st["alloc_shim"]) == os.environ["VMMALLOC_CACHE_DIR"],
          "out-of-memory shim built in the cache: %r" % st)
    check(alloc is not None and alloc.args == (st["alloc_shim"], "vmm_torch_alloc_malloc", "vmm_torch_alloc_free"),
          "CUDAPluggableAllocator(shim, vmm_torch_alloc_malloc, vmm_torch_alloc_free): %r"
          % (getattr(alloc, "args", None),))
    check(st["installed"] and st["memory_api"] == {"patched": [], "missing": sorted(
        __import__("vmmalloc.torch_memory").torch_memory.ENTRY_POINTS), "rebound": 0},
          "a torch without torch._C: nothing patched, every entry point named missing: %r" % (st["memory_api"],))
    check(vt.install() == path, "install() again: a no-op")

    # 4. after install, before CUDA init: the default device is 0, still without initializing
    cuda.calls.clear()
    p = lib.vmm_torch_malloc(1 << 20, 1, None)
    check(vt.memory_stats()["allocation.all.current"] == 0, "default device 0 before CUDA init")
    check(initializing_calls(cuda.calls) == [], "memory_stats() initialized CUDA: %r" % cuda.calls)

    # 5. once PyTorch has initialized CUDA, None / "cuda" / torch.device("cuda") follow its
    # current device; explicit devices in every accepted form
    cuda._initialized, cuda.current = True, 1
    for dev in (None, "cuda", FakeDevice("cuda"), 1, "1", "cuda:1", FakeDevice("cuda", 1)):
        st = vt.memory_stats(dev)
        check(st["allocation.all.current"] == 1, "memory_stats(%r) reads device 1" % (dev,))
    check("current_device" in cuda.calls, "torch.cuda.current_device() used once CUDA is initialized")
    for dev in (0, "0", "cuda:0", FakeDevice("cuda", 0)):
        check(vt.memory_stats(dev)["allocation.all.current"] == 0, "memory_stats(%r) reads device 0" % (dev,))
    check(vmmalloc.memory_stats()["allocation.all.current"] == 1, "vmmalloc.memory_stats() too")
    snap = vt.snapshot(device="cuda")
    check([b["size"] for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
          == [1 << 20], "snapshot(device='cuda'): the current device's block")
    vt.record_memory_history(4, FakeDevice("cuda", 1))
    vt.record_memory_history(0, "cuda:1")
    vt.reset_peak_memory_stats("cuda:1")
    vt.empty_cache(FakeDevice("cuda", 1))
    check(vt.pinned_stats("cuda").get("pinned.reserved_bytes.current") == 0, "pinned_stats('cuda')")
    for fn in (vt.memory_stats, vt.empty_cache, vt.reset_peak_memory_stats, vt.pinned_stats,
               lambda d: vt.snapshot(None, d), lambda d: vt.record_memory_history(8, d)):
        for bad in ("cpu", FakeDevice("cpu"), "cuda:x", "cuda:-1"):
            e = raises(ValueError, fn, bad)
            check(e is not None, "%r refused with ValueError" % (bad,))
    lib.vmm_torch_free(p, 1 << 20, 1, None)

    # 6. tests/gpu_torch_train.py: a vmmalloc run that vmmalloc did not serve fails
    import contextlib  # noqa: PLC0415
    import importlib.util  # noqa: PLC0415
    import io  # noqa: PLC0415
    spec = importlib.util.spec_from_file_location("gpu_torch_train",
                                                  os.path.join(ROOT, "tests", "gpu_torch_train.py"))
    gt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gt)

    def fake_results(peak_vmm, installed=True):
        base = {"losses": [3.0, 2.5, 2.0], "step_time_s": 0.01, "device": "fake", "torch": "fake",
                "peak_reserved": 4 << 20, "peak_allocated": 3 << 20, "num_ooms": 0}
        res = {m: dict(base, mode=m) for m in gt.MODES}
        res["vmmalloc"].update(peak_allocated=peak_vmm, installed=installed, num_allocations=7)
        return res

    def run_main(results):
        gt.run_mode = lambda mode, steps, seed, timeout: results[mode]
        out, err = io.StringIO(), io.StringIO()
        argv = sys.argv
        sys.argv = ["gpu_torch_train.py", "--steps", "3"]
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = gt.main()
        finally:
            sys.argv = argv
        return rc, out.getvalue(), err.getvalue()

    use_fake_torch(make_fake_torch())
    rc, out, err = run_main(fake_results(3 << 20))
    check(rc == 0 and "vmmalloc served the vmmalloc run: yes" in out, "served run passes: %d %r" % (rc, err))
    rc, out, err = run_main(fake_results(0))
    check(rc == 1 and "allocated_bytes.all.peak" in err and "served the vmmalloc run: NO" in out,
          "a vmmalloc run with vmmalloc's peak allocated 0 fails: rc %d, %r" % (rc, err))
    rc, out, err = run_main(fake_results(3 << 20, installed=False))
    check(rc == 1 and "is_installed() is False" in err, "a run without install fails: rc %d" % rc)
    check(gt.vmmalloc_unserved({"peak_allocated": 1}) is None
          and gt.vmmalloc_unserved({}) is not None, "vmmalloc_unserved")


import vmmalloc  # noqa: E402

if sys.argv[1:] == ["--fake-torch"]:
    import atexit  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415
    os.environ["VMMALLOC_CACHE_DIR"] = tempfile.mkdtemp(prefix="vmmalloc-helper-")  # shims built here
    atexit.register(shutil.rmtree, os.environ["VMMALLOC_CACHE_DIR"], True)
    fake_torch_checks()
    print("fake torch: %d failure(s)" % len(failures))
    sys.exit(1 if failures else 0)

import vmmalloc.torch as vt  # noqa: E402

check("torch" not in sys.modules, "importing vmmalloc.torch must not import torch")

# devices: every form parsed by one function, without torch
for dev, want in ((0, 0), (3, 3), ("cuda", 0), ("cuda:2", 2), ("2", 2), (None, 0),
                  (FakeDevice("cuda", 5), 5), (FakeDevice("cuda"), 0)):
    try:
        got = vmmalloc.device_index(dev)
    except Exception as e:  # noqa: BLE001 (reported as a failure)
        got = e
    check(got == want, "device_index(%r): %r, expected %d" % (dev, got, want))
for bad in ("cpu", "cpu:0", "mps", FakeDevice("cpu"), FakeDevice("meta", 0)):
    e = raises(ValueError, vmmalloc.device_index, bad)
    check(e is not None and "not a CUDA device" in str(e), "non-CUDA %r -> ValueError: %r" % (bad, e))
for bad in ("", "cuda:", "cuda:x", "cuda:-1", "gpu1", "cuda1", " 1", "cuda:1:2", -1, FakeDevice("cuda", -2)):
    e = raises(ValueError, vmmalloc.device_index, bad)
    check(e is not None and ("malformed" in str(e) or ">= 0" in str(e)), "bad %r -> ValueError: %r" % (bad, e))
for bad in (1.0, True, [0]):
    check(raises(TypeError, vmmalloc.device_index, bad) is not None, "%r -> TypeError" % (bad,))

lib = vmmalloc.load()
check(os.path.samefile(vmmalloc.loaded_path(), os.environ["VMMALLOC_LIB"]), "library from VMMALLOC_LIB")

# bad conf: a clear error naming the key
e = raises(vmmalloc.VmmError, vmmalloc.configure, "bogus_key:1")
check(e is not None and e.status == "ECONFIG" and "bogus_key" in str(e), "bad conf -> ECONFIG: %r" % e)
vmmalloc.configure("sim_backed:true")

# the PyTorch entry points, as PyTorch calls them
p = lib.vmm_torch_malloc(3 << 20, 0, None)
q = lib.vmm_torch_malloc(1000, 0, None)
check(bool(p) and bool(q), "vmm_torch_malloc returns pointers")

TORCH_FAMILIES = ["allocation", "segment", "active", "inactive_split", "allocated_bytes",
                  "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"]
stats = vt.memory_stats(0)
missing = ["%s.%s.%s" % (f, pool, m) for f in TORCH_FAMILIES
           for pool in ("all", "large_pool", "small_pool")
           for m in ("current", "peak", "allocated", "freed")
           if "%s.%s.%s" % (f, pool, m) not in stats]
missing += [k for k in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                        "num_device_free", "max_split_size", "num_event_waits") if k not in stats]
check(not missing, "PyTorch stats keys missing: %s" % missing[:10])
check(stats.get("allocation.all.current") == 2, "two live blocks: %r" % stats.get("allocation.all.current"))
check(stats.get("allocation.large_pool.current") == 1 and stats.get("allocation.small_pool.current") == 1,
      "one large, one small")
check(stats.get("requested_bytes.all.current") == (3 << 20) + 1000, "requested bytes")
check(list(stats) == sorted(stats), "keys sorted like torch.cuda.memory_stats()")

# record_stream on a live block, and on something else
vt.record_stream(p, 0)
e = raises(vmmalloc.VmmError, vt.record_stream, p + 16, None)
check(e is not None and e.status == "EBADPTR", "record_stream(interior) -> EBADPTR: %r" % e)

lib.vmm_torch_free(p, 3 << 20, 0, None)
lib.vmm_torch_free(q, 1000, 0, None)
stats = vmmalloc.memory_stats(0)
check(stats["allocation.all.current"] == 0 and stats["allocated_bytes.all.peak"] >= 3 << 20, "after free")
vt.reset_peak_memory_stats(0)
check(vmmalloc.memory_stats(0)["allocated_bytes.all.peak"] == 0, "reset peaks")
vt.empty_cache()
vt.empty_cache(0)

# configure is refused once an allocator exists
e = raises(vmmalloc.VmmError, vmmalloc.configure, "sim_backed:false")
check(e is not None and e.status == "EINVAL", "configure after first use -> EINVAL: %r" % e)

# out of memory: NULL and a report
check(vt.oom_report() == "", "no OOM report before an OOM")
big = lib.vmm_torch_malloc(4 << 30, 1, None)
check(big is None, "4 GiB on a 1 GiB device fails")
rep = vt.oom_report()
check("out of memory" in rep and "4096.00 MiB" in rep, "OOM report: %r" % rep[:200])
check(vmmalloc.memory_stats(1)["num_ooms"] == 1, "num_ooms counted")
check(vmmalloc.last_error() != "", "last_error set")

# pinned stats (the cache exists once pinned memory is used; zeros before)
ps = vt.pinned_stats(0)
check(ps.get("pinned.reserved_bytes.current") == 0 and "pinned.num_host_alloc" in ps, "pinned stats: %r" % ps)

# history and snapshots on device 2 (a fresh allocator): record, allocate, free, snapshot
vt.record_memory_history(64, 2)
s1 = lib.vmm_torch_malloc(5 << 20, 2, None)
s2 = lib.vmm_torch_malloc(700, 2, None)
lib.vmm_torch_free(s2, 700, 2, None)
snap = vt.snapshot(device=2)
check(isinstance(snap, dict) and set(snap) >= {"segments", "device_traces", "allocator_settings"},
      "snapshot keys: %r" % sorted(snap) if isinstance(snap, dict) else snap)
blocks = [b for seg in snap.get("segments", []) for b in seg["blocks"]]
live = [b for b in blocks if b["state"] == "active_allocated"]
check([(b["address"], b["requested_size"]) for b in live] == [(s1, 5 << 20)],
      "the one live block in the snapshot: %r" % live)
# the ordinal is the driver's (the simulated driver has one device, reported as 0): one trace
# list per ordinal up to it, the last one this allocator's
traces = snap.get("device_traces", [])
check(traces and all(seg["device"] == len(traces) - 1 for seg in snap.get("segments", [])),
      "segments' device matches the trace lists: %d" % len(traces))
trace = traces[-1] if traces else []
acts = [(t["action"], t["addr"]) for t in trace]
check(("alloc", s1) in acts and ("alloc", s2) in acts and ("free_requested", s2) in acts,
      "trace holds the allocs and the free: %r" % acts)
check(snap.get("allocator_settings", {}).get("allocator") == "vmmalloc", "allocator_settings")
# the ring keeps the newest entries: resize to 1, then stop
vt.record_memory_history(1, 2)
check(len(vt.snapshot(device=2)["device_traces"][-1]) == 1, "history resized to 1 entry")
vt.record_memory_history(0, 2)
check(vt.snapshot(device=2)["device_traces"][-1] == [], "history off: empty trace")
# device 0 never recorded: its trace is empty
check(all(t == [] for t in vt.snapshot(device=0)["device_traces"]), "device 0 without history")
# with a path: the pickle on disk, the same state, read back by the restricted loader
import tempfile  # noqa: E402
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "s.pickle")
    check(vt.snapshot(path, 2) is None, "snapshot(path) returns None")
    disk = vmmalloc.load_snapshot(path)
    check([b["address"] for seg in disk["segments"] for b in seg["blocks"]
           if b["state"] == "active_allocated"] == [s1], "snapshot file: the live block")
    # the restricted unpickler refuses anything naming a class
    import pickle  # noqa: E402
    evil = os.path.join(d, "evil.pickle")
    with open(evil, "wb") as f:
        pickle.dump({"segments": [os.getcwd]}, f, protocol=2)
    e = raises(pickle.UnpicklingError, vmmalloc.load_snapshot, evil)
    check(e is not None and "only plain data" in str(e), "class reference refused: %r" % e)
    e = raises(vmmalloc.VmmError, vt.snapshot, os.path.join(d, "no-such-dir", "s.pickle"), 2)
    check(e is not None and e.status == "EINVAL" and "no-such-dir" in str(e),
          "unwritable path -> EINVAL naming it: %r" % e)
e = raises(vmmalloc.VmmError, vt.snapshot, None, 99)
check(e is not None and e.status == "EINVAL" and "device 99" in str(e), "bad device: %r" % e)
e = raises(ValueError, vt.record_memory_history, 8, -3)
check(e is not None and ">= 0" in str(e), "record_memory_history negative device -> ValueError: %r" % e)
check(lib.vmm_torch_record_history(-3, 8) == -2, "the library itself refuses device -3 (EINVAL)")
e = raises(vmmalloc.VmmError, vt.memory_stats, "cuda:99")
check(e is not None and e.status == "EINVAL" and "device 99" in str(e), "device 'cuda:99': %r" % e)
lib.vmm_torch_free(s1, 5 << 20, 2, None)

# the package's version is the project's; how the library was found; VMMALLOC_LIBRARY as an alias
import re  # noqa: E402
with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
    cm = re.search(r"project\(vmmalloc VERSION ([0-9.]+)", f.read())
check(cm and vmmalloc.__version__ == cm.group(1), "__version__ %s != CMakeLists.txt" % vmmalloc.__version__)
check(vmmalloc.library_source() == "the VMMALLOC_LIB environment variable", vmmalloc.library_source())
saved = os.environ.pop("VMMALLOC_LIB")
os.environ["VMMALLOC_LIBRARY"] = saved
check(vmmalloc.library_path() == os.path.abspath(saved) and "VMMALLOC_LIBRARY" in vmmalloc.library_source(),
      "VMMALLOC_LIBRARY alias: %s" % vmmalloc.library_source())
del os.environ["VMMALLOC_LIBRARY"]
if glob.glob(os.path.join(ROOT, "build*", "libvmmalloc.so*")):
    here = vmmalloc.library_path()  # the source tree: the package dir has no library, a build dir does
    check(vmmalloc.library_source() == "the source tree's build directory", "without the variable: %s (%s)"
          % (here, vmmalloc.library_source()))
else:
    print("note: the build directory is not named build*: the build-directory fallback is not checked")
os.environ["VMMALLOC_LIB"] = saved
cf = vmmalloc.config_in_force()
check("driver:sim" in cf["config"] and "sim_capacity:1G" in cf["config"] and cf["error"] is None,
      "config_in_force: %r" % cf)
cf = vmmalloc.config_in_force("expandable_segments:false")
check("expandable_segments:false" in cf["config"], "config_in_force(conf): %r" % cf)
check(raises(vmmalloc.VmmError, vmmalloc.config_in_force, "nope:1") is not None, "config_in_force(bad)")

# python -m vmmalloc from the source tree: info (text and JSON), --help, viz, replay
import json  # noqa: E402
env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"),
           PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True,backend:native")
bindir = os.environ.get("VMM_BINARY_DIR")
if bindir:  # the vmm-bench of this build first
    env["PATH"] = os.path.join(bindir, "bench") + os.pathsep + env.get("PATH", "")


def run_main(*args):
    r = subprocess.run([sys.executable, "-m", "vmmalloc"] + list(args), env=env, cwd=tempfile.gettempdir(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return r.returncode, r.stdout, r.stderr


rc, out, err = run_main("--json")
info = json.loads(out) if rc == 0 else {}
check(rc == 0 and info.get("library") == os.path.abspath(saved), "python -m vmmalloc --json: %s %s" % (rc, err))
check(info.get("version") == vmmalloc.__version__, "version in --json")
check("driver:sim" in info.get("config", "") and info.get("devices") == [], "config / devices: %r" % info)
check(info.get("environment", {}).get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True,backend:native",
      "environment shown")
check(err.count("ignoring 'backend:native'") == 1, "PyTorch-only key warned once: %r" % err)
rc, out, err = run_main()
check(rc == 0 and out.startswith("vmmalloc %s" % vmmalloc.__version__) and "library: " in out
      and "config in force:" in out and "  expandable_segments:true" in out, "python -m vmmalloc:\n" + out + err)
rc, out, err = run_main("--help")
check(rc == 0 and all(w in out for w in ("viz", "replay", "plan", "info")), "--help:\n" + out)
rc, out, err = run_main("--version")
check(rc == 0 and out.strip() == "vmmalloc " + vmmalloc.__version__, "--version: %r" % out)
with tempfile.TemporaryDirectory() as d:
    vt.record_memory_history(100, 2)
    v1 = lib.vmm_torch_malloc(3 << 20, 2, None)
    vt.snapshot(os.path.join(d, "v.pickle"), 2)
    lib.vmm_torch_free(v1, 3 << 20, 2, None)
    vt.record_memory_history(0, 2)
    rc, out, err = run_main("viz", os.path.join(d, "v.pickle"), "-o", os.path.join(d, "v.html"))
    check(rc == 0 and os.path.getsize(os.path.join(d, "v.html")) > 1000, "python -m vmmalloc viz: %s" % err)
    rc, out, err = run_main("viz", os.path.join(d, "missing.pickle"))
    check(rc != 0 and "missing.pickle" in err, "viz of a missing file: %r" % err)
    csvp = os.path.join(d, "t.csv")
    with open(csvp, "w") as f:
        f.write("action,addr,size,stream,time_us\nalloc,4096,4096,0,1\nalloc,12288,8192,0,2\n"
                "free_completed,4096,4096,0,3\nfree_completed,12288,8192,0,4\n")
    rc, out, err = run_main("replay", csvp, "--mode", "expandable", "--no-progress")
    if bindir:
        check(rc == 0 and "expandable" in out, "python -m vmmalloc replay: %s %s" % (out[-300:], err[-300:]))

# python -m vmmalloc on "GPUs": the CUDA driver double (tests/cudadouble, a libcuda.so.1 on the
# simulator with 2 devices) when this build has it: devices read through libcuda, each checked by
# creating a vmmalloc allocator with the cuda driver
double = os.environ.get("VMM_CUDADOUBLE_DIR")
if double and os.path.exists(os.path.join(double, "libcuda.so.1")):
    denv = {k: v for k, v in env.items() if k not in ("VMMALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    denv.update(LD_LIBRARY_PATH=double + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""),
                CUDADOUBLE_DEVICES="2")
    r = subprocess.run([sys.executable, "-m", "vmmalloc", "--json"], env=denv, cwd=tempfile.gettempdir(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    info = json.loads(r.stdout) if r.returncode == 0 else {}
    devs = info.get("devices") or []
    check(r.returncode == 0 and "driver:cuda" in info.get("config", "") and not info.get("driver_error"),
          "python -m vmmalloc on the CUDA double: %s %s" % (r.stdout[-500:], r.stderr[-500:]))
    print("CUDA double: %d device(s) listed by python -m vmmalloc" % len(devs))
    check(len(devs) == 2 and all(d["vmmalloc_error"] is None and d["vmm_supported"] and d["total_bytes"] > 0
                                 for d in devs), "devices on the CUDA double: %r" % devs)

# install needs torch; without it, a clear ImportError
try:
    import torch  # noqa: F401
    have_torch = True
except ImportError:
    have_torch = False
if not have_torch:
    e = raises(ImportError, vt.install)
    check(e is not None and "PyTorch is not installed" in str(e), "install without torch: %r" % e)
    check(not vt.is_installed(), "not installed")

# a missing library is reported clearly
e = raises(FileNotFoundError, vmmalloc.library_path, "/nonexistent/libvmmalloc.so")
check(e is not None and "does not exist" in str(e), "missing lib_path")

# the checks that need a fresh process and a fake torch
child = subprocess.run([sys.executable, os.path.abspath(__file__), "--fake-torch"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
sys.stdout.write(child.stdout)
check(child.returncode == 0, "the --fake-torch checks failed (exit %d)" % child.returncode)

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
