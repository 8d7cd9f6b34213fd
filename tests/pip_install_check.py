#!/usr/bin/env python3
"""pip install, as a user does it, offline: run by tests/python/test_pip_install.c with the system's python3.

1. pip wheel --no-deps --no-build-isolation --no-index from the source tree (the build backend
   python/build_backend/vmmalloc_build.py runs CMake): the wheel holds the package, libvmmalloc.so
   and vmm-viz, with a valid RECORD.
2. The sdist (the backend's build_sdist) installed with pip into a fresh virtual environment, with
   build isolation and no index: what "pip install ." does on a machine without network, and proof
   that the sdist has everything the build needs.
3. The wheel of step 1 installed into a second fresh virtual environment.
4. From another directory, without VMMALLOC_LIB or PYTHONPATH: import vmmalloc finds the library
   inside the package and allocates on driver:sim; a snapshot with Python frames is written;
   python -m vmmalloc (--json, --help) and the vmm-viz console script work.

Exits 0 when all pass; 1 with the failures; 2 when pip or venv is missing (run ./tools/deps.sh --test).
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

SRC = os.environ.get("VMM_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def run(args, cwd=None, env=None, timeout=240):
    t = time.time()
    r = subprocess.run(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout)
    out = r.stdout.decode("utf-8", "replace")
    print("+ %s  (%.1f s, status %d)" % (" ".join(args), time.time() - t, r.returncode))
    if r.returncode:
        print(out[-6000:])
    return r.returncode, out


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("VMMALLOC_LIB", "VMMALLOC_LIBRARY", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV",
                        "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")}
    # no network, no cache, no prompt: what must work on a machine without an index
    env.update(PIP_NO_INDEX="1", PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    env.update(extra)
    return env


USER_SCRIPT = r'''
import ctypes, os, sys, json
import vmmalloc
here = os.path.dirname(os.path.abspath(vmmalloc.__file__))
lib = vmmalloc.library_path()
out = {"file": vmmalloc.__file__, "lib": lib, "found": vmmalloc.library_source(),
       "lib_in_package": os.path.dirname(lib) == here and os.path.basename(lib) == "libvmmalloc.so",
       "version": vmmalloc.__version__}
L = vmmalloc.load()
# a PyTorch-like caller that keeps the GIL while it allocates
P = ctypes.PyDLL(lib)
P.vmm_torch_malloc.restype = ctypes.c_void_p
P.vmm_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
P.vmm_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
vmmalloc.record_memory_history(1000, 0)
def make_weights():
    return P.vmm_torch_malloc(3 << 20, 0, None)
p = make_weights()
out["allocated"] = vmmalloc.memory_stats(0)["allocated_bytes.all.current"]
vmmalloc.snapshot(sys.argv[1])
snap = vmmalloc.load_snapshot(sys.argv[1])
names = {f["name"] for s in snap["segments"] for b in s["blocks"] for f in b["frames"]}
out["frame_names"] = sorted(n for n in names if not n.startswith("??"))
P.vmm_torch_free(p, 3 << 20, 0, None)
out["after_free"] = vmmalloc.memory_stats(0)["allocated_bytes.all.current"]
print("RESULT " + json.dumps(out))
'''


def check_install(py, tag, work):
    """The installed package, used from a directory that is not the source tree."""
    venv_dir = os.path.dirname(os.path.dirname(py))
    env = clean_env(VMMALLOC_CONF="driver:sim,sim_capacity:256M")
    snap = os.path.join(work, "snap-%s.pickle" % tag)
    rc, out = run([py, "-c", USER_SCRIPT, snap], cwd=work, env=env)
    res = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
    if not check(rc == 0 and res, "%s: import vmmalloc and allocate failed" % tag):
        return
    check(res["file"].startswith(venv_dir), "%s: vmmalloc imported from %s, not the venv" % (tag, res["file"]))
    check(res["lib_in_package"] and res["found"] == "inside the package",
          "%s: library %s (%s), not the one inside the package" % (tag, res["lib"], res["found"]))
    check(res["allocated"] == 3 << 20 and res["after_free"] == 0, "%s: stats %s" % (tag, res))
    check("make_weights" in res["frame_names"], "%s: no Python frame in the snapshot: %s" % (tag, res["frame_names"]))
    # python -m vmmalloc
    rc, out = run([py, "-m", "vmmalloc", "--json"], cwd=work, env=env)
    if check(rc == 0, "%s: python -m vmmalloc --json failed" % tag):
        info = json.loads(out[out.index("{"):])
        check(info["library"] == res["lib"] and info["library_found"] == "inside the package",
              "%s: python -m vmmalloc library %s" % (tag, info.get("library")))
        check(info["version"] == res["version"], "%s: version" % tag)
        check("driver:sim" in info["config"] and "sim_capacity:256M" in info["config"],
              "%s: config in force %r" % (tag, info["config"]))
        check(info["tools"]["viz"] and info["tools"]["viz"].startswith(venv_dir),
              "%s: vmm-viz not shipped in the package: %s" % (tag, info["tools"]))
    rc, out = run([py, "-m", "vmmalloc"], cwd=work, env=env)
    check(rc == 0 and "library: " + res["lib"] in out and "config in force:" in out,
          "%s: python -m vmmalloc output:\n%s" % (tag, out))
    rc, out = run([py, "-m", "vmmalloc", "--help"], cwd=work, env=env)
    check(rc == 0 and all(w in out for w in ("viz", "replay", "plan")), "%s: --help lists no tools" % tag)
    # the console script and the viz subcommand
    html = os.path.join(work, "snap-%s.html" % tag)
    rc, out = run([os.path.join(os.path.dirname(py), "vmm-viz"), snap, "-o", html], cwd=work, env=env)
    check(rc == 0 and os.path.getsize(html) > 1000, "%s: vmm-viz console script" % tag)
    rc, out = run([py, "-m", "vmmalloc", "viz", snap, "-o", html + "2"], cwd=work, env=env)
    check(rc == 0 and os.path.exists(html + "2"), "%s: python -m vmmalloc viz" % tag)


def main():
    py = sys.executable
    missing = []
    if subprocess.run([py, "-m", "pip", "--version"], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode:
        missing.append("pip (Debian: python3-pip)")
    if subprocess.run([py, "-c", "import ensurepip, venv"], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode:
        missing.append("venv with ensurepip (Debian: python3-venv)")
    if missing:
        print("pip_install_check: %s lacks %s: run ./tools/deps.sh --test" % (py, " and ".join(missing)),
              file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="vmm_pip_")
    t0 = time.time()
    try:
        wheels = os.path.join(work, "wheels")
        # 1. wheel from the tree
        rc, out = run([py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, SRC],
                      cwd=work, env=clean_env())
        found = glob.glob(os.path.join(wheels, "vmmalloc-*.whl"))
        if not check(rc == 0 and len(found) == 1, "pip wheel failed"):
            return 1
        whl = found[0]
        check("-py3-none-" in os.path.basename(whl), "wheel tag of %s" % os.path.basename(whl))
        with zipfile.ZipFile(whl) as z:
            names = set(z.namelist())
            record = [n for n in names if n.endswith(".dist-info/RECORD")]
            for need in ("vmmalloc/__init__.py", "vmmalloc/torch.py", "vmmalloc/__main__.py",
                         "vmmalloc/libvmmalloc.so", "vmmalloc/_vmm_viz.py", "vmmalloc/csrc/graph_hooks.cpp",
                         "vmmalloc/csrc/torch_alloc.cpp", "vmmalloc/torch_memory.py", "vmmalloc/_cxx.py"):
                check(need in names, "wheel lacks %s" % need)
            if check(len(record) == 1, "wheel has no RECORD"):
                listed = {l.split(",")[0] for l in z.read(record[0]).decode().splitlines()}
                check(listed == names, "RECORD lists %s, wheel holds %s" % (sorted(listed ^ names), ""))
        # 2. sdist -> fresh venv, isolated build, no index
        sys.path.insert(0, os.path.join(SRC, "python", "build_backend"))
        import vmmalloc_build  # noqa: E402
        sdist = os.path.join(work, vmmalloc_build.build_sdist(work))
        venv1 = os.path.join(work, "venv-sdist")
        rc, _ = run([py, "-m", "venv", venv1], cwd=work, env=clean_env())
        if check(rc == 0, "python3 -m venv failed (Debian: python3-venv; ./tools/deps.sh --test)"):
            vpy = os.path.join(venv1, "bin", "python")
            rc, _ = run([vpy, "-m", "pip", "install", "--no-index", sdist], cwd=work, env=clean_env())
            if check(rc == 0, "pip install of the sdist (isolated, offline) failed"):
                check_install(vpy, "sdist", work)
        # 3. the wheel -> second fresh venv
        venv2 = os.path.join(work, "venv-wheel")
        rc, _ = run([py, "-m", "venv", venv2], cwd=work, env=clean_env())
        if check(rc == 0, "python3 -m venv failed"):
            vpy = os.path.join(venv2, "bin", "python")
            rc, _ = run([vpy, "-m", "pip", "install", "--no-index", "--no-deps", whl], cwd=work, env=clean_env())
            if check(rc == 0, "pip install of the wheel failed"):
                check_install(vpy, "wheel", work)
    finally:
        if failures or os.environ.get("VMM_PIP_KEEP"):
            print("kept %s" % work, file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("pip_install_check: %s in %.0f s" % ("FAILED" if failures else "ok", time.time() - t0))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
