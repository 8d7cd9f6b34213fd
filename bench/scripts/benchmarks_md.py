#!/usr/bin/env python3
"""Write docs/benchmarks.md from vmm-bench runs: every number in the document is program output,
shown under the command that produced it; the target checks are computed from the --json output.
Standard library only.

usage: bench/scripts/benchmarks_md.py BUILD_DIR [--out docs/benchmarks.md] [--quick] [--workloads DIR]
Run from the repository root, with a Release build (cmake -DCMAKE_BUILD_TYPE=Release).
--workloads: the directory of PyTorch traces (*.trace.csv, *.pickle) replayed for the targets;
default $VMM_WORKLOADS, else workloads/pytorch (the copies in this repository, workloads/README.md).
The document names that directory `$W` and says where each trace comes from publicly (TRACE_SOURCES).
"""

import argparse
import datetime
import filecmp
import glob
import json
import os
import platform
import shlex
import subprocess
import sys


def sh(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"benchmarks_md: {shlex.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    return p.stdout


def machine():
    model, cores = "unknown", os.cpu_count()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) / 2**20
    gpu = "no GPU" if not glob.glob("/dev/nvidia[0-9]*") else "GPU present (not used: simulated device)"
    load = os.getloadavg()
    return (f"{cores}-core VM, CPU \"{model}\", {mem:.0f} GiB RAM, {gpu}; Linux {platform.release()}; "
            f"load average at start {load[0]:.1f} (other jobs shared the machine)")


# Where each trace replayed for the targets comes from (the licence files travel with the traces).
BCRAFTON = ("`memory_snapshot.pickle` from github.com/bcrafton/assignment2-systems, commit 0c0e8a7 (MIT): a "
            "`torch.cuda.memory._dump_snapshot` of one AdamW training step of GPT-2 small (d_model 768, "
            "12 layers, vocab 50257, `torch.compile`, batch 1, context 64) recorded after 10 warm-up steps")
OCTREE = ("from github.com/HugePandaCoder/octree-nca-groupeq (MIT), flattened to the same CSV: inference of an "
          "octree neural cellular automaton on whole-slide pathology images, coarse to fine, with few tensors of "
          "1-7 GiB.")
NIU = ("from github.com/NiuHuangxiaozi/assignment2-systems, commit 9d868b9 (MIT), flattened to the same CSV: a small "
       "Transformer LM (d_model 512, 4 layers, vocab 10000, batch 10) recorded from its creation on: ")
BOLONG = ("from github.com/bolongcheng/assignment2-systems, commit 2baa5ff (MIT), flattened to the same CSV: one "
          "forward pass (gradients on) of the XL Transformer LM after warm-up, ")
LINYUN = ("from github.com/LINYUNLinYun/CS336-assignment2-systems, commit d7b9b89 (MIT), flattened to the same CSV: "
          "the XL Transformer LM (d_model 2560, 32 layers, batch 4) after 5 warm-up steps, ")
TRACE_SOURCES = {
    "cs336_bcrafton_memory_snapshot.pickle": BCRAFTON + ".",
    "cs336_bcrafton_gpt2small_compiled_trainstep.trace.csv":
        "the device trace of " + BCRAFTON + ", flattened to `action,addr,size,stream,time_us` by "
        "`bench/scripts/snapshot_to_trace.py`.",
    "decomfl_opt_zo_fedft.trace.csv":
        "`memory.pickle` from github.com/ZidongLiu/DeComFL, commit edd30e0 (Apache-2.0), flattened to the "
        "same CSV: a multi-step zeroth-order federated fine-tuning run of an OPT language model.",
    "cs336_wedsonlin_medium1024_train.trace.csv":
        "`results/medium_1024_training_memory_snapshot.pickle` from github.com/Wedsonlin/assignment2-systems, "
        "commit 8630bcf (MIT), flattened to the same CSV: one full training step of a medium Transformer LM "
        "at context 1024, recorded after warm-up steps.",
    "cs336_silmont2000_mem_snapshot.trace.csv":
        "`mem_snapshot.pickle` from github.com/silmont2000/assignment2-systems, commit 75d09aa (MIT), flattened "
        "to the same CSV: memory profiling of a Transformer LM (97 trace entries).",
    "cs336_silmont2000_memory_forward_bf16_128.trace.csv":
        "`memory_forward_bf16_128.pickle` from github.com/silmont2000/assignment2-systems, commit 75d09aa (MIT), "
        "flattened to the same CSV: a forward pass of a Transformer LM at context 128 in bf16.",
    "cs336_silmont2000_memory_forward_fp32_128.trace.csv":
        "`memory_forward_fp32_128.pickle` from github.com/silmont2000/assignment2-systems, commit 75d09aa (MIT), "
        "flattened to the same CSV: the same forward pass in fp32.",
    "cs336_magma27_trainstep.trace.csv":
        "`memory_snapshot.pickle` from github.com/MAGMA27/assignment2-systems, commit 15883f2 (MIT), flattened to "
        "the same CSV: one forward and backward pass of a 12-layer Transformer LM (d_model 768, batch 32, "
        "context 256, fp32) after 5 warm-up steps.",
    "cs336_nothanmin_trainstep.trace.csv":
        "`memory_snapshot.pickle` from github.com/notHanmin/assignment2-systems, commit 33be88e (MIT), flattened "
        "to the same CSV: one AdamW training step of a Transformer LM, batch 4.",
    "cs336_nothanmin_forward.trace.csv":
        "`memory_snapshot_forward.pickle` from github.com/notHanmin/assignment2-systems, commit bbd2972 (MIT), "
        "flattened to the same CSV: a forward pass that keeps its activations (presumably under bf16 autocast).",
    "cs336_nothanmin_forward_without_mixed.trace.csv":
        "`memory_snapshot_forward_without_mixed.pickle` from github.com/notHanmin/assignment2-systems, commit "
        "bbd2972 (MIT), flattened to the same CSV: the same forward pass in fp32.",
    "octree_nca_peso_inference.trace.csv":
        "`mem_snapshots/inference2_peso_oct.pickle` of commit 3e8aa21 " + OCTREE,
    "octree_nca_wsi_0cc7299.trace.csv":
        "`my_snapshot.pickle` of commit 0cc7299 " + OCTREE,
    "octree_nca_wsi_db23ad8.trace.csv":
        "`my_snapshot.pickle` of commit db23ad8 " + OCTREE,
    "octree_nca_wsi_d47727a.trace.csv":
        "`my_snapshot.pickle` of commit d47727a " + OCTREE,
    "octree_nca_wsi_752276c.trace.csv":
        "`my_snapshot.pickle` of commit 752276c " + OCTREE,
    "octree_nca_wsi_b602628.trace.csv":
        "`my_snapshot.pickle` of commit b602628 " + OCTREE,
    "octree_nca_single_step.trace.csv":
        "`mem_snapshots/traditional_single_step.pickle` of commit 3e8aa21 (one NCA step) " + OCTREE,
    "cs336_niu_forward_ctx100.trace.csv":
        "`cs336_systems/profile_memory/forward_memory_snapshot_100.pickle` " + NIU + "three forward passes at context 100.",
    "cs336_niu_train3_ctx100.trace.csv":
        "`cs336_systems/profile_memory/forward_and_backward_memory_snapshot_100.pickle` " + NIU + "three training steps (Adam) at context 100.",
    "cs336_niu_forward_ctx150.trace.csv":
        "`cs336_systems/profile_memory/forward_memory_snapshot_150.pickle` " + NIU + "three forward passes at context 150.",
    "cs336_niu_train3_ctx150.trace.csv":
        "`cs336_systems/profile_memory/forward_and_backward_memory_snapshot_150.pickle` " + NIU + "three training steps (Adam) at context 150.",
    "cs336_niu_forward_ctx200.trace.csv":
        "`cs336_systems/profile_memory/forward_memory_snapshot_200.pickle` " + NIU + "three forward passes at context 200.",
    "cs336_niu_train3_ctx200.trace.csv":
        "`cs336_systems/profile_memory/forward_and_backward_memory_snapshot_200.pickle` " + NIU + "three training steps (Adam) at context 200.",
    "cs336_niu_forward_ctx200_mixed.trace.csv":
        "`cs336_systems/profile_memory/forward_memory_snapshot_200_mixed_precision.pickle` " + NIU + "three forward passes at context 200 under bf16 autocast.",
    "cs336_niu_train3_ctx200_mixed.trace.csv":
        "`cs336_systems/profile_memory/forward_and_backward_memory_snapshot_200_mixed_precision.pickle` " + NIU + "three training steps at context 200 under bf16 autocast.",
    "cs336_bolongcheng_xl_forward_ctx128_fp32.trace.csv":
        "`benchmarks/memory_snapshot_xl_fwd_cl128_dtypetorch.float32.pickle` " + BOLONG + "context 128, in fp32.",
    "cs336_bolongcheng_xl_forward_ctx512_fp32.trace.csv":
        "`benchmarks/memory_snapshot_xl_fwd_cl512_dtypetorch.float32.pickle` " + BOLONG + "context 512, in fp32.",
    "cs336_bolongcheng_xl_forward_ctx512_bf16.trace.csv":
        "`benchmarks/memory_snapshot_xl_fwd_cl512_dtypetorch.bfloat16.pickle` " + BOLONG + "context 512, under bf16 autocast.",
    "cs336_linyun_xl_forward_ctx128_fp32.trace.csv":
        "`cs336_systems/results/memory_profiles/xl_ctx128_forward_none.pickle` " + LINYUN + "one inference forward pass (no_grad) at context 128 in fp32.",
    "cs336_linyun_xl_forward_ctx128_bf16.trace.csv":
        "`cs336_systems/results/memory_profiles/xl_ctx128_forward_bf16.pickle` " + LINYUN + "one inference forward pass (no_grad) at context 128 under bf16 autocast.",
    "cs336_linyun_xl_forward_ctx512_fp32.trace.csv":
        "`cs336_systems/results/memory_profiles/xl_ctx512_forward_none.pickle` " + LINYUN + "one inference forward pass (no_grad) at context 512 in fp32.",
    "cs336_linyun_xl_forward_ctx512_bf16.trace.csv":
        "`cs336_systems/results/memory_profiles/xl_ctx512_forward_bf16.pickle` " + LINYUN + "one inference forward pass (no_grad) at context 512 under bf16 autocast.",
    "cs336_linyun_xl_forward_ctx1024_fp32.trace.csv":
        "`cs336_systems/results/memory_profiles/xl_ctx1024_forward_none.pickle` " + LINYUN + "one inference forward pass (no_grad) at context 1024 in fp32.",
    "cs336_linyun_xl_forward_ctx1024_bf16.trace.csv":
        "`cs336_systems/results/memory_profiles/xl_ctx1024_forward_bf16.pickle` " + LINYUN + "one inference forward pass (no_grad) at context 1024 under bf16 autocast.",
    "cs336_linyun_xl_forward_ctx2048_fp32.trace.csv":
        "`cs336_systems/results/memory_profiles/xl_ctx2048_forward_none.pickle` " + LINYUN + "one inference forward pass (no_grad) at context 2048 in fp32.",
    "cs336_linyun_xl_forward_ctx2048_bf16.trace.csv":
        "`cs336_systems/results/memory_profiles/xl_ctx2048_forward_bf16.pickle` " + LINYUN + "one inference forward pass (no_grad) at context 2048 under bf16 autocast.",
    "cs336_linyun_xl_fullstep_ctx128_fp32.trace.csv":
        "`cs336_systems/results/memory_profiles/xl_ctx128_full_step_none.pickle` " + LINYUN + "one training step at context 128 in fp32.",
    "cs336_linyun_xl_fullstep_ctx128_bf16.trace.csv":
        "`cs336_systems/results/memory_profiles/xl_ctx128_full_step_bf16.pickle` " + LINYUN + "one training step at context 128 under bf16 autocast.",
    "cs336_linyun_xl_fullstep_ctx512_fp32.trace.csv":
        "`cs336_systems/results/memory_profiles/xl_ctx512_full_step_none.pickle` " + LINYUN + "one training step at context 512 in fp32.",
    "cs336_linyun_xl_fullstep_ctx512_bf16.trace.csv":
        "`cs336_systems/results/memory_profiles/xl_ctx512_full_step_bf16.pickle` " + LINYUN + "one training step at context 512 under bf16 autocast.",
}
IN_REPO = "bench/data/gpt2small_trainstep.trace.csv"


def block(cmd, out, shown=None):
    return f"```\n$ {shown or shlex.join(cmd)}\n{out.rstrip()}\n```\n"


def shown_cmd(cmd, path):
    """The command as the document shows it: the workloads directory written as $W."""
    return shlex.join(cmd).replace(shlex.quote(path), "$W/" + os.path.basename(path))


def workloads_intro(traces):
    lines = ["`$W` below is a directory holding these traces (by default `workloads/pytorch` in this "
             "repository, with their licences; workloads/README.md); each is public:\n"]
    for t in traces:
        name = os.path.basename(t)
        src = TRACE_SOURCES.get(name, "source not recorded in bench/scripts/benchmarks_md.py (TRACE_SOURCES).")
        if os.path.exists(IN_REPO) and filecmp.cmp(t, IN_REPO, shallow=False):
            src += f" Byte-identical to `{IN_REPO}` in this repository."
        lines.append(f"- `{name}`: {src}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--out", default="docs/benchmarks.md")
    ap.add_argument("--quick", action="store_true", help="small latency/scale runs (for trying the script)")
    ap.add_argument("--workloads", default=os.environ.get("VMM_WORKLOADS",
                                                          os.path.join("workloads", "pytorch")),
                    help="directory of the PyTorch traces replayed for the targets (shown as $W)")
    a = ap.parse_args()
    bench = os.path.join(a.build, "bench", "vmm-bench")
    if not os.access(bench, os.X_OK):
        sys.exit(f"benchmarks_md: no {bench}; build first")
    build_type = "unknown"
    cache = os.path.join(a.build, "CMakeCache.txt")
    if os.path.exists(cache):
        for line in open(cache):
            if line.startswith("CMAKE_BUILD_TYPE:"):
                build_type = line.split("=", 1)[1].strip()
    wdir = a.workloads
    traces = sorted(glob.glob(os.path.join(wdir, "*.trace.csv")) + glob.glob(os.path.join(wdir, "*.pickle")))
    if not traces:
        sys.exit(f"benchmarks_md: no traces in {wdir}")

    doc = []
    w = doc.append
    w("# Benchmarks\n")
    w("Written by `bench/scripts/benchmarks_md.py` from `vmm-bench` runs; every number below is program output under\n"
      "the command that printed it. Regenerate with\n"
      f"`python3 bench/scripts/benchmarks_md.py {a.build}` after a Release build. Do not edit numbers by hand.\n")
    w(f"- Date: {datetime.date.today().isoformat()}\n- Machine: {machine()}\n"
      f"- Build: `{a.build}`, CMAKE_BUILD_TYPE={build_type}\n"
      "- The machine was shared with other jobs while these ran (see the load average): medians are\n"
      "  robust to that, p99s much less so. glibc's numbers for mixed sizes include mmap/munmap calls\n"
      "  (sizes above its mmap threshold), which is why they swing by orders of magnitude.\n"
      "- Device: vmmalloc's simulated driver (`driver:sim`, unbacked): driver calls are counted and given a\n"
      "  modeled cost; host times are real.\n")

    # ---- replay ---------------------------------------------------------------------------------
    w("## Replay: the GPT-2 training step (README quick start line 1)\n")
    cmd = [bench, "replay", "bench/data/gpt2small_trainstep.trace.csv", "--min-capacity", "--no-progress"]
    w(block(cmd, sh(cmd)))
    w("Peak allocated can differ between the modes: classic mode's large pool keeps a remainder of up to\n"
      "1 MiB inside an unsplit block and counts it as allocated (PyTorch's rule); expandable mode splits\n"
      "every remainder of 512 B or more. The lower bound is the trace's own peak of live bytes.\n")
    w("## Replay targets on the published PyTorch traces\n")
    w(workloads_intro(traces))
    w("Targets for expandable mode: peak reserved / peak allocated <= 1.02, min capacity <= 1.03 x peak live\n"
      "bytes (the lower bound), zero synchronizations. Classic mode measured beside it.\n")
    rows, summary = [], []
    for t in traces:
        cmd = [bench, "replay", t, "--min-capacity", "--json", "--no-progress"]
        out = sh(cmd)
        w(block(cmd, out, shown_cmd(cmd, t)))
        for line in out.splitlines():
            r = json.loads(line)
            rows.append((os.path.basename(t), r))
    w("| trace | mode | reserved/allocated | target <= 1.02 | min capacity / lower bound | target <= 1.03 |"
      " syncs (device+stream) | event waits | OOMs |")
    w("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        ratio = r["peak_reserved_bytes"] / r["peak_allocated_bytes"]
        mc = r.get("min_capacity_over_lower_bound")
        syncs = r["device_syncs"] + r["stream_syncs"]
        exp = r["mode"] == "expandable"

        def verdict(ok, value, limit):
            if not exp:
                return "(classic: no target)"
            return "met" if ok else f"MISSED by {value - limit:.3f}"
        if exp:
            summary.append(f"- {name}: expandable reserved/allocated {ratio:.4f} (<= 1.02: "
                           f"{'met' if ratio <= 1.02 else f'MISSED by {ratio - 1.02:.4f}'}); min capacity / lower bound "
                           f"{'n/a' if mc is None else f'{mc:.4f}'} (<= 1.03: "
                           f"{'n/a' if mc is None else ('met' if mc <= 1.03 else f'MISSED by {mc - 1.03:.4f}')}); "
                           f"synchronizations {syncs} (0: {'met' if syncs == 0 else 'MISSED'})")
        w(f"| {name} | {r['mode']} | {ratio:.4f} | {verdict(ratio <= 1.02, ratio, 1.02)} | "
          f"{'n/a' if mc is None else f'{mc:.4f}'} | "
          f"{'n/a' if mc is None else verdict(mc <= 1.03, mc, 1.03)} | "
          f"{syncs}{' (target 0: ' + ('met' if syncs == 0 else 'MISSED') + ')' if exp else ''} | "
          f"{r['event_syncs']} | {r['ooms']} |")
    w("")

    # ---- latency --------------------------------------------------------------------------------
    w("## Latency: malloc+free pair with a live set held\n")
    w("Each cell: 1, 2 or 4 threads, each holding its share of the live set. Pair patterns (small, large,\n"
      "mixed): each thread allocates and immediately frees one block of the pattern's size. Ring: each thread\n"
      "keeps its live blocks in a FIFO; each step frees the oldest and allocates the next size of a fixed\n"
      "table, log-uniform 512 B .. 64 KiB (a pair = that free + that malloc), so blocks of mixed sizes stay in\n"
      "flight and are freed in allocation order. The ring is filled before the clock starts, and every\n"
      "allocator gets the same size sequence. Pairs run in batches of 256 timed with clock_gettime; median and\n"
      "p99 are over the per-pair means of every thread's batches. Mp/s is the aggregate throughput: pairs done\n"
      "by all threads / wall time from the earliest thread's start to the latest one's end, in 10^6 pairs/s.\n"
      "Small and ring run with 1, 2 and 4 threads (4 threads oversubscribe this 2-core VM on purpose), large\n"
      "and mixed with 1 and 2. On vmmalloc every thread allocates on its own stream (vmm_sim_stream_create,\n"
      "thread 0 included); glibc and jemalloc use their per-thread arenas and caches. glibc's malloc/free are\n"
      "looked up in libc.so.6 (the program links jemalloc, which replaces malloc); jemalloc runs\n"
      "mallocx/dallocx. Host allocators are skipped (n/a) where their live set would exceed 32 GiB of host\n"
      "memory. Targets (expandable mode): fast path (small, 1 thread, 10^3 live) <= 1.5x glibc; ring, 1\n"
      "thread, <= 1.5x glibc at 10^3 live and at 10^6 live; cost at 10^6 live blocks <= 2x the cost at 10^3\n"
      "(1 thread, every pattern); each thread on its own stream, at 10^3 live: aggregate throughput of 2\n"
      "threads >= 1.5x one thread's, of 4 threads >= one thread's (small and ring). The program prints the\n"
      "verdicts at the end.\n")
    cmd = [bench, "latency"] + (["--quick", "--max-live", "10000"] if a.quick else [])
    out = sh(cmd)
    w(block(cmd, out))
    summary += ["- " + line.strip() for line in out.splitlines() if "-> met" in line or "-> MISSED" in line]

    # ---- scale ----------------------------------------------------------------------------------
    w("## Scaling: replay time vs trace length\n")
    w("Generated traces (`vmm-bench gen` writes the same ones as CSV) replayed in both modes; the target is\n"
      "linear growth, i.e. a constant cost per event.\n")
    cmd = [bench, "scale"] + (["--max-events", "1000000"] if a.quick else [])
    out = sh(cmd)
    w(block(cmd, out))
    summary += ["- " + line.strip() for line in out.splitlines() if "-> met" in line or "-> MISSED" in line]
    # The summary goes after the header block: lines copied from the outputs below.
    at = doc.index("## Replay: the GPT-2 training step (README quick start line 1)\n")
    doc[at:at] = ["## Targets at a glance\n", "Copied from the program outputs below.\n", "\n".join(summary) + "\n"]

    with open(a.out, "w") as f:
        f.write("\n".join(doc))
    print(f"benchmarks_md: wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
