#!/usr/bin/env python3
"""Check a vmmalloc snapshot pickle against PyTorch's snapshot format and against what the C test
expected (test_snapshot.c). Standard library only. Usage:

    snapshot_check.py SNAPSHOT.pickle EXPECT.json [TRACE.csv]

The pickle is read with an Unpickler whose find_class raises: a snapshot holds only dicts, lists,
tuples, ints, floats, strings, bools and None, never a class reference. EXPECT.json lists the live,
pending and fused blocks the allocator handed out and its stats; TRACE.csv is the history written
by vmm_history_csv, which must equal the pickle's device trace entry for entry.
Exits 0 when every check passes, 1 with one line per failure otherwise.
"""
import csv
import io
import json
import pickle
import sys

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


class NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("snapshot refers to %s.%s" % (module, name))


def load(path):
    with open(path, "rb") as f:
        return NoGlobals(io.BytesIO(f.read())).load()


SEG_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
            "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
STATES = {"active_allocated", "active_pending_free", "inactive"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom"}


def check_segments(snap, exp):
    segs = snap["segments"]
    check(isinstance(segs, list), "segments is not a list")
    blocks = {}
    prev_end = 0
    sums = {"total": 0, "allocated": 0, "active": 0}
    for i, s in enumerate(segs):
        where = "segment %d (0x%x)" % (i, s.get("address", 0))
        check(set(s) == SEG_KEYS, "%s keys %s" % (where, sorted(set(s) ^ SEG_KEYS)))
        check(s["device"] == exp["device"], where + " device")
        check(s["segment_type"] in ("small", "large"), where + " segment_type")
        check(s["segment_pool_id"] in ((0, 0), [0, 0]), where + " segment_pool_id")
        check(s["is_expandable"] is exp["expandable"], where + " is_expandable")
        check(s["frames"] == [], where + " frames")
        check(s["address"] >= prev_end, where + " overlaps the previous segment or is out of order")
        bl = s["blocks"]
        check(len(bl) > 0, where + " has no blocks")
        addr = s["address"]
        alloc = active = req = 0
        for b in bl:
            extra = set(b) - BLOCK_KEYS
            check(BLOCK_KEYS <= set(b) and extra <= {"parts"}, where + " block keys %s" % sorted(b))
            check(b["state"] in STATES, where + " block state %r" % b["state"])
            check(b["address"] == addr, where + " blocks do not tile the segment at 0x%x" % addr)
            check(b["size"] > 0 and b["size"] % 512 == 0, where + " block size %d" % b["size"])
            addr = b["address"] + b["size"]
            if b["state"] == "active_allocated":
                alloc += b["size"]
            if b["state"] != "inactive":
                active += b["size"]
                req += b["requested_size"]
                check(b["requested_size"] <= b["size"], where + " requested > size")
            blocks[b["address"]] = b
        check(addr == s["address"] + s["total_size"],
              where + " block sizes sum to %d, total_size %d" % (addr - s["address"], s["total_size"]))
        check(alloc == s["allocated_size"], where + " allocated_size")
        check(active == s["active_size"], where + " active_size")
        check(req == s["requested_size"], where + " requested_size")
        if exp["expandable"]:
            check(s["total_size"] % exp["page_size_min"] == 0, where + " not whole pages")
        prev_end = s["address"] + s["total_size"]
        sums["total"] += s["total_size"]
        sums["allocated"] += s["allocated_size"]
        sums["active"] += s["active_size"]
    check(sums["total"] == exp["segment_bytes"],
          "segments sum to %d bytes, allocator maps %d" % (sums["total"], exp["segment_bytes"]))
    check(sums["allocated"] == exp["allocated_bytes"], "allocated bytes %d != stats %d"
          % (sums["allocated"], exp["allocated_bytes"]))
    check(sums["active"] == exp["active_bytes"], "active bytes %d != stats %d"
          % (sums["active"], exp["active_bytes"]))
    n_alloc = sum(1 for b in blocks.values() if b["state"] == "active_allocated")
    n_pend = sum(1 for b in blocks.values() if b["state"] == "active_pending_free")
    check(n_alloc == len(exp["live"]), "%d allocated blocks, expected %d" % (n_alloc, len(exp["live"])))
    check(n_pend == len(exp["pending"]), "%d pending blocks, expected %d" % (n_pend, len(exp["pending"])))
    check(any(b["state"] == "inactive" for b in blocks.values()), "no inactive block")
    for addr, size, requested in exp["live"]:
        b = blocks.get(addr)
        if check(b is not None, "live block 0x%x missing" % addr):
            check(b["state"] == "active_allocated", "live block 0x%x state %s" % (addr, b["state"]))
            check(b["size"] == size, "live block 0x%x size %d != %d" % (addr, b["size"], size))
            check(b["requested_size"] == requested, "live block 0x%x requested" % addr)
    for addr, size in exp["pending"]:
        b = blocks.get(addr)
        if check(b is not None, "pending block 0x%x missing" % addr):
            check(b["state"] == "active_pending_free", "pending block 0x%x state %s" % (addr, b["state"]))
            check(b["size"] == size, "pending block 0x%x size" % addr)
    grouped = [b for b in blocks.values() if "parts" in b]
    check(len(grouped) == len(exp["groups"]), "%d fused blocks, expected %d"
          % (len(grouped), len(exp["groups"])))
    for addr, parts in exp["groups"]:
        b = blocks.get(addr)
        if not check(b is not None and "parts" in b, "fused block 0x%x has no parts" % addr):
            continue
        got = [[p["offset"], p["size"]] for p in b["parts"]]
        check(got == parts, "fused block 0x%x parts %s != %s" % (addr, got, parts))
        check(len(b["frames"]) == 1 and "fused" in b["frames"][0]["name"], "fused block frame")
        check(parts[-1][0] + parts[-1][1] <= b["size"], "parts overflow the block")


def check_traces(snap, exp, csv_path):
    tr = snap["device_traces"]
    check(isinstance(tr, list) and len(tr) == exp["device"] + 1, "device_traces has one list per device")
    t = tr[exp["device"]]
    check(len(t) == exp["trace_len"], "trace has %d entries, history %d" % (len(t), exp["trace_len"]))
    last = -1
    live = set()
    for e in t:
        if e.get("action") == "oom":  # PyTorch's oom entries name the free bytes
            check(set(e) == TRACE_KEYS | {"device_free"} and e["device_free"] == e["addr"],
                  "oom entry %s" % e)
        else:
            check(set(e) == TRACE_KEYS, "trace keys %s" % sorted(e))
        check(e["action"] in ACTIONS, "trace action %r" % e["action"])
        check(e["time_us"] >= last, "trace times go back")
        last = e["time_us"]
        check(e["frames"] == [], "trace frames")
        if e["action"] == "alloc":
            check(e["addr"] not in live, "alloc of a live address 0x%x" % e["addr"])
            live.add(e["addr"])
        elif e["action"] == "free_requested":
            check(e["addr"] in live, "free_requested of 0x%x never allocated" % e["addr"])
            live.discard(e["addr"])
    for a in exp["trace_actions"]:
        check(any(e["action"] == a for e in t), "no %s in the trace" % a)
    if csv_path:
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        check(len(rows) == len(t), "csv has %d rows, trace %d" % (len(rows), len(t)))
        for r, e in zip(rows, t):
            same = (r["action"] == e["action"] and int(r["addr"], 16) == e["addr"] and
                    int(r["size"]) == e["size"] and int(r["stream"], 16) == e["stream"] and
                    int(r["time_us"]) == e["time_us"])
            if not check(same, "csv row %s != trace entry %s" % (dict(r), e)):
                break


def main():
    snap = load(sys.argv[1])
    with open(sys.argv[2]) as f:
        exp = json.load(f)
    csv_path = sys.argv[3] if len(sys.argv) > 3 else None
    keys = {"segments", "device_traces", "allocator_settings", "external_annotations"}
    check(isinstance(snap, dict) and set(snap) == keys, "top-level keys %s" % sorted(snap))
    check(snap["external_annotations"] == [], "external_annotations")
    st = snap["allocator_settings"]
    check(isinstance(st.get("PYTORCH_CUDA_ALLOC_CONF"), str) and
          ("expandable_segments:%s" % ("true" if exp["expandable"] else "false"))
          in st["PYTORCH_CUDA_ALLOC_CONF"], "allocator_settings conf string %r" % st)
    check(st.get("expandable_segments") is exp["expandable"], "allocator_settings expandable")
    check(isinstance(st.get("garbage_collection_threshold"), float), "gc threshold is a float")
    check_segments(snap, exp)
    check_traces(snap, exp, csv_path)
    for msg in failures:
        print("snapshot_check: " + msg)
    print("snapshot_check: %s: %d segment(s), %d trace entries, %s" % (
        sys.argv[1], len(snap["segments"]), len(snap["device_traces"][-1]),
        "FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
