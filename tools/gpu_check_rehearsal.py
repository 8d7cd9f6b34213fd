#!/usr/bin/env python3
"""The GPU kit's rehearsal (ctest gpu_check_rehearsal; docs/gpu.md): tools/gpu-check on the CUDA
driver double, from this build, then the report's shape:

  - report.json: every phase present with a status; on the double facts, costs, tests, replay and
    features pass and pytorch is skipped saying why; the probe loaded the double;
  - costs.json: a "sim_cost_table" of [kind, size, ns] items, sized points for the VMM calls, which
    the simulator loads (a replay with sim_cost_file models a different driver time than without);
  - report.md names every phase; logs.tar.gz holds the phases' logs;
  - without a driver on the loader's path (and no --double) the kit exits 77 saying so.

    gpu_check_rehearsal.py BUILD_DIR OUT_DIR
"""

import json
import os
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIT = os.path.join(ROOT, "tools", "gpu-check")
PHASES = ("facts", "costs", "tests", "replay", "pytorch", "features")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def main():
    build, out = sys.argv[1], sys.argv[2]
    p = subprocess.run([sys.executable, KIT, "--double", "--quick", "--no-build", "--build-dir", build, "--out", out],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    print(p.stderr[-3000:], file=sys.stderr)
    check(p.returncode == 0, "gpu-check --double exit %d (want 0)" % p.returncode)
    for f in ("report.md", "report.json", "costs.json", "logs.tar.gz"):
        check(os.path.exists(os.path.join(out, f)), "%s written" % f)
    if failures:
        return 1

    with open(os.path.join(out, "report.json")) as f:
        rep = json.load(f)
    check(rep.get("double") is True, "report says it ran on the double")
    check(rep.get("overall") == "pass", "overall pass, got %r" % rep.get("overall"))
    ph = rep.get("phases", {})
    for name in PHASES:
        check(name in ph, "phase %s in the report" % name)
        st = ph.get(name, {}).get("status")
        check(st in ("pass", "skip", "fail", "timeout", "error"), "phase %s has a status (%r)" % (name, st))
        check(isinstance(ph.get(name, {}).get("seconds"), (int, float)), "phase %s timed" % name)
    for name in ("facts", "costs", "tests", "replay", "features"):
        check(ph.get(name, {}).get("status") == "pass", "phase %s passes on the double: %r" % (name, ph.get(name)))
    py = ph.get("pytorch", {})
    check(py.get("status") == "skip" and "double" in py.get("reason", ""), "pytorch skipped with the reason: %r" % py)
    facts = (ph.get("facts", {}).get("probe") or {}).get("facts", {})
    check(facts.get("cuda_double") is True, "the probe loaded the double")
    al = facts.get("alias_two_views", {})
    check(al.get("view1_sees_view0_write") is True and al.get("view0_sees_view1_memset") is True and
          al.get("other_view_data_kept") is True, "one handle at two places coherent on the double: %r" % al)
    for k in ("map_nonzero_offset", "set_access_spanning_handles", "alias_two_views", "largest_reserve", "new_memory_zero",
              "mem_get_info_around_release", "rdma_pointer_attribute", "posix_fd_export", "granularity"):
        check(k in facts, "fact %s measured" % k)
    # the offset fact comes from the probe's child process: complete, merged, the double's answer
    off = facts.get("map_nonzero_offset", {})
    check(off.get("map_result") == "CUDA_ERROR_INVALID_VALUE" and off.get("context_after") == "CUDA_SUCCESS",
          "nonzero-offset cuMemMap refused by the double and the child's context clean: %r" % off)
    tests = ph.get("tests", {}).get("results", {})
    check("test_gpu_driver_double" in tests and "test_cudadouble" in tests, "tests phase ran the double tests")
    rows = ph.get("replay", {}).get("traces", [])
    check(len(rows) >= 2, "replay compared traces (%d rows)" % len(rows))
    check(all(r.get("peaks_agree") for r in rows), "peaks agree between the double and the simulator")
    check(all("sim_costs_modeled_driver_ns" in r for r in rows), "replays modeled with costs.json")

    with open(os.path.join(out, "costs.json")) as f:
        costs = json.load(f)
    table = costs.get("sim_cost_table", [])
    check(all(isinstance(t, list) and len(t) == 3 for t in table), "table items are [kind, size, ns]")
    sized = {}
    for kind, size, ns in table:
        if size:
            sized.setdefault(kind, set()).add(size)
    for kind in ("mem_create", "mem_map", "set_access", "mem_unmap", "mem_release", "va_reserve", "mem_alloc"):
        check(len(sized.get(kind, ())) >= 2, "%s costed at 2+ sizes" % kind)
    # The simulator loads it, and a replay's modeled driver time follows it.
    bench = os.path.join(build, "bench", "vmm-bench")
    trace = os.path.join(ROOT, "bench", "data", "gpt2small_trainstep.trace.csv")
    runs = []
    for extra in ([], ["--conf", "sim_cost_file:" + os.path.join(out, "costs.json")]):
        r = subprocess.run([bench, "replay", trace, "--json", "--no-progress", "--mode", "expandable"] + extra,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        check(r.returncode == 0, "replay %s: exit %d %s" % (extra, r.returncode, r.stderr[-300:]))
        runs.append(json.loads(r.stdout.splitlines()[0]) if r.returncode == 0 else {})
    if len(runs) == 2 and runs[0] and runs[1]:
        check(runs[0]["driver_time_ns"] != runs[1]["driver_time_ns"],
              "costs.json changes the modeled driver time (%s vs %s)" % (runs[0]["driver_time_ns"],
                                                                         runs[1]["driver_time_ns"]))
        check(runs[0]["peak_reserved_bytes"] == runs[1]["peak_reserved_bytes"], "costs do not change the peak")

    with open(os.path.join(out, "report.md")) as f:
        md = f.read()
    for name in PHASES:
        check("| %s |" % name in md, "report.md names phase %s" % name)
    with tarfile.open(os.path.join(out, "logs.tar.gz")) as tf:
        names = tf.getnames()
    for name in ("facts", "costs", "tests", "replay"):
        check("logs/%s.log" % name in names, "logs.tar.gz has logs/%s.log" % name)

    # No GPU: exit 77 and a clear line, nothing else run (only where no real driver is loadable).
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
        print("a libcuda.so.1 is loadable here: the no-GPU exit is not checked")
    except OSError:
        env = dict(os.environ)
        env.pop("LD_LIBRARY_PATH", None)
        r = subprocess.run([sys.executable, KIT, "--no-build", "--build-dir", build, "--out", out + "-nogpu"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=60)
        check(r.returncode == 77, "no GPU: exit %d (want 77)" % r.returncode)
        check("no GPU" in r.stderr, "no GPU: the message says so: %r" % r.stderr)
        check(not os.path.exists(os.path.join(out + "-nogpu", "report.json")), "no GPU: no report pretending a run")

    if failures:
        print("%d check(s) failed" % len(failures), file=sys.stderr)
        return 1
    print("gpu-check rehearsal: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
