#!/usr/bin/env python3
"""Check a vmmalloc snapshot pickle against PyTorch's snapshot format, against what PyTorch's
memory viewer does with it, and against what the test that wrote it expected. Standard library
only. Usage:

    snapshot_check.py SNAPSHOT.pickle EXPECT.json [TRACE.csv]
    snapshot_check.py --pytorch-only SNAPSHOT.pickle     (a snapshot PyTorch wrote: format and viewer)

or, from Python, ``failures = check(snapshot_dict, expect_dict, csv_path=None)``.

The pickle is read with an Unpickler whose find_class raises: a snapshot holds only dicts, lists,
tuples, ints, floats, strings, bools and None, never a class reference. Then:

- the format: every key and type of torch.cuda.memory._snapshot() (torch/cuda/memory.py documents
  it; torch/csrc/cuda/memory_snapshot.cpp writes it): segments with their blocks, device_traces
  entries with action, addr, size, stream, time_us (microseconds since the epoch), frames,
  compile_context and user_metadata, frames as {filename, line, name};
- the viewer: the parts of pytorch.org/memory_viz (torch/utils/viz/MemoryViz.js) that read the
  snapshot, redone here step by step: annotate_snapshot (free_requested + free_completed folded
  into "free"), the "Allocator State History" replay of the trace backwards from the segments at
  every event (a free_requested of an unknown block, an unmap outside every segment, or a block
  outside every segment throws in the viewer), the "Active Memory Timeline" and "Active Cached
  Segment Timeline" element lists, and format_frames with the viewer's frame filter. Pending
  blocks must show their requested size (the viewer draws size - requested_size as "free space
  lost due to rounding");
- the expectation (EXPECT.json, written by tests/api/test_snapshot.c or tests/snapshot_frames.py):
  the live, pending and fused blocks, stats sums, trace actions, the time window and which
  frames must appear (see EXPECT_KEYS below);
- TRACE.csv (vmm_history_csv) must equal the trace entry for entry.

Exits 0 when every check passes, 1 with one line per failure otherwise.
"""
import csv
import io
import json
import pickle
import sys

# EXPECT.json keys: device, expandable, page_size_min, segment_bytes, allocated_bytes,
# active_bytes, trace_len, trace_actions, live [[addr, size, requested]], pending
# [[addr, size, requested]], groups [[addr, [[offset, size]...]]]; optional: time_window
# [first_us, last_us] (epoch microseconds the trace must lie in), frames: "none" | "some" (every
# block and trace entry recorded with stacks has frames), frame_names [names that must appear in
# some block's frames], frame_files [file name endings that must appear], no_frame_files
# [substrings no frame's filename may contain], python_lines {function: line} (a frame of that
# function must name that line), stacked [addresses of live blocks allocated with stacks on].
EXPECT_KEYS = {"device", "expandable", "page_size_min", "segment_bytes", "allocated_bytes",
               "active_bytes", "trace_len", "trace_actions", "live", "pending", "groups"}

TOP_KEYS = {"segments", "device_traces", "allocator_settings", "external_annotations"}
SEG_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
            "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
STATES = {"active_allocated", "active_pending_free", "inactive"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames", "compile_context",
              "user_metadata"}
FRAME_KEYS = {"filename", "line", "name"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom"}


class NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("snapshot refers to %s.%s" % (module, name))


def load(path):
    with open(path, "rb") as f:
        return NoGlobals(io.BytesIO(f.read())).load()


class Checker:
    def __init__(self):
        self.failures = []

    def __call__(self, cond, msg):
        if not cond:
            self.failures.append(msg)
        return cond


# ---- the format ------------------------------------------------------------------------------------

def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_frames(check, frames, where):
    if not check(isinstance(frames, list), "%s: frames is not a list" % where):
        return
    for f in frames:
        if not check(isinstance(f, dict) and set(f) == FRAME_KEYS, "%s: frame %r" % (where, f)):
            return
        # PyTorch writes "" for a C++ frame whose file it does not know: strings, maybe empty
        check(isinstance(f["filename"], str), "%s: frame filename %r" % (where, f))
        check(isinstance(f["name"], str) and f["name"], "%s: frame name %r" % (where, f))
        check(is_int(f["line"]) and f["line"] >= 0, "%s: frame line %r" % (where, f))


def check_format(check, snap):
    if not check(isinstance(snap, dict) and set(snap) == TOP_KEYS, "top-level keys %s" % sorted(snap)):
        return False
    check(isinstance(snap["external_annotations"], list), "external_annotations")
    for i, s in enumerate(snap["segments"]):
        where = "segment %d (0x%x)" % (i, s.get("address", 0))
        check(set(s) == SEG_KEYS, "%s keys %s" % (where, sorted(set(s) ^ SEG_KEYS)))
        for k in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                  "stream"):
            check(is_int(s.get(k)), "%s: %s is not an int" % (where, k))
        check(s["segment_type"] in ("small", "large"), where + " segment_type")
        check(s["segment_pool_id"] in ((0, 0), [0, 0]), where + " segment_pool_id")
        check(isinstance(s["is_expandable"], bool), where + " is_expandable")
        check_frames(check, s["frames"], where)
        for b in s["blocks"]:
            extra = set(b) - BLOCK_KEYS
            check(BLOCK_KEYS <= set(b) and extra <= {"parts"}, where + " block keys %s" % sorted(b))
            check(b["state"] in STATES, where + " block state %r" % b["state"])
            for k in ("address", "size", "requested_size"):
                check(is_int(b.get(k)), "%s: block %s is not an int" % (where, k))
            check_frames(check, b["frames"], "%s block 0x%x" % (where, b["address"]))
    for d, trace in enumerate(snap["device_traces"]):
        check(isinstance(trace, list), "device_traces[%d] is not a list" % d)
        for e in trace:
            keys = TRACE_KEYS | ({"device_free"} if e.get("action") == "oom" else set())
            check(set(e) == keys, "trace keys %s" % sorted(set(e) ^ keys))
            check(e.get("action") in ACTIONS, "trace action %r" % e.get("action"))
            for k in ("addr", "size", "stream", "time_us"):
                check(is_int(e.get(k)), "trace %s is not an int: %r" % (k, e))
            check(isinstance(e.get("compile_context"), str) and isinstance(e.get("user_metadata"), str),
                  "compile_context / user_metadata are not strings: %r" % e)
            if e.get("action") == "oom":
                check(is_int(e["device_free"]) and e["device_free"] == e["addr"], "oom entry %s" % e)
            check_frames(check, e.get("frames"), "trace entry %s" % e.get("action"))
    st = snap["allocator_settings"]
    check(isinstance(st.get("PYTORCH_CUDA_ALLOC_CONF"), str), "allocator_settings conf string")
    check(isinstance(st.get("expandable_segments"), bool), "allocator_settings expandable")
    check(isinstance(st.get("garbage_collection_threshold"), float), "gc threshold is a float")
    check(is_int(st.get("max_split_size")), "max_split_size")
    rp = st.get("roundup_power2_divisions")
    check(isinstance(rp, dict) and all(isinstance(k, str) and is_int(v) for k, v in rp.items())
          and "1" in rp, "roundup_power2_divisions %r" % (rp,))
    return True


# ---- the viewer (torch/utils/viz/MemoryViz.js), step by step -----------------------------------

def annotate(snap):
    """annotate_snapshot: default frames, stream names, free_requested + free_completed -> free.
    Returns new traces and the segments' stream names (the input is left alone)."""
    stream_names = {0: 0}

    def stream_name(s):
        if s not in stream_names:
            stream_names[s] = len(stream_names)
        return stream_names[s]
    traces = []
    for device_trace in snap["device_traces"]:
        new_trace = []
        for t in device_trace:
            t = dict(t)
            t.setdefault("frames", [])
            t["stream"] = stream_name(t["stream"])
            if t["action"] == "free_completed" and new_trace:
                prev = new_trace[-1]
                if prev["action"] == "free_requested" and prev["addr"] == t["addr"]:
                    prev["action"] = "free"
                    continue
            t["idx"] = len(new_trace)
            new_trace.append(t)
        traces.append(new_trace)
    # then the segments' streams, through the same names (so that merges compare like with like)
    seg_streams = [stream_name(seg["stream"]) for seg in snap["segments"]]
    return traces, seg_streams


class ViewerError(Exception):
    pass


def simulate_memory(snap, annotated, device, idx):
    """MemoryView.simulate_memory(idx) then the lookups draw() makes: the segments and blocks the
    "Allocator State History" view draws when event idx is selected. Raises ViewerError where the
    viewer would throw (or silently draw the wrong thing)."""
    traces, seg_streams = annotated
    segs = sorted(({"addr": s["address"], "size": s["total_size"], "stream": seg_streams[i]}
                   for i, s in enumerate(snap["segments"]) if s["device"] == device), key=lambda s: s["addr"])
    blocks = {}
    for s in snap["segments"]:
        if s["device"] != device:
            continue
        addr = s["address"]
        for b in s["blocks"]:
            if b["state"] in ("active_pending_free", "active_allocated"):
                blocks[addr] = {"addr": addr, "size": b["size"], "requested_size": b["requested_size"],
                                "free_requested": b["state"] == "active_pending_free"}
            addr += b["size"]

    def map_segment(merge, seg):
        i = next((k for k, e in enumerate(segs) if e["addr"] > seg["addr"]), len(segs))
        segs.insert(i, seg)
        if not merge:
            return
        if i + 1 < len(segs):
            nxt = segs[i + 1]
            if seg["addr"] + seg["size"] == nxt["addr"] and seg["stream"] == nxt["stream"]:
                seg["size"] += nxt["size"]
                del segs[i + 1]
        if i > 0:
            prev = segs[i - 1]
            if prev["addr"] + prev["size"] == seg["addr"] and prev["stream"] == seg["stream"]:
                prev["size"] += seg["size"]
                del segs[i]

    def unmap_segment(merge, seg):
        if not merge:
            i = next((k for k, e in enumerate(segs) if e["addr"] == seg["addr"]), -1)
            if i < 0:
                raise ViewerError("segment_alloc of 0x%x: no such segment before it" % seg["addr"])
            del segs[i]
            return
        end = seg["addr"] + seg["size"]
        i = next((k for k, e in enumerate(segs) if e["addr"] <= seg["addr"] and end <= e["addr"] + e["size"]), -1)
        if i < 0:
            raise ViewerError("segment_map of [0x%x, 0x%x) lies in no segment" % (seg["addr"], end))
        ex = segs[i]
        ex_end = ex["addr"] + ex["size"]
        if ex["addr"] == seg["addr"]:
            ex["addr"] += seg["size"]
            ex["size"] -= seg["size"]
            if ex["size"] == 0:
                del segs[i]
        elif ex_end == end:
            ex["size"] -= seg["size"]
        else:
            ex["size"] = seg["addr"] - ex["addr"]
            seg["addr"] = end
            seg["size"] = ex_end - end
            segs.insert(i + 1, seg)

    events = traces[device]
    for i in range(len(events) - 1, idx, -1):
        e = events[i]
        a = e["action"]
        if a == "free":
            blocks[e["addr"]] = {"addr": e["addr"], "size": e["size"], "requested_size": e["size"],
                                 "free_requested": False}
        elif a == "free_requested":
            if e["addr"] not in blocks:
                raise ViewerError("free_requested of 0x%x: no such block after it" % e["addr"])
            blocks[e["addr"]]["free_requested"] = False
        elif a == "free_completed":
            blocks[e["addr"]] = {"addr": e["addr"], "size": e["size"], "requested_size": e["size"],
                                 "free_requested": True}
        elif a == "alloc":
            blocks.pop(e["addr"], None)
        elif a in ("segment_free", "segment_unmap"):
            map_segment(a == "segment_unmap", {"addr": e["addr"], "size": e["size"], "stream": e["stream"]})
        elif a in ("segment_alloc", "segment_map"):
            unmap_segment(a == "segment_map", {"addr": e["addr"], "size": e["size"], "stream": e["stream"]})
    for b in blocks.values():
        seg = next((s for s in segs if s["addr"] <= b["addr"] < s["addr"] + s["size"]), None)
        if seg is None:  # draw(): b.segment = find_segment(b.addr); b.segment.occupied throws
            raise ViewerError("block 0x%x lies in no segment at event %d" % (b["addr"], idx))
        if b["requested_size"] > b["size"] or b["requested_size"] < 0:
            raise ViewerError("block 0x%x requested_size %d, size %d" % (b["addr"], b["requested_size"], b["size"]))
    return segs, blocks


def frame_filter(f):
    omit_functions = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "_start",
                      "__libc_start_main", "PyEval_", "PyObject_", "PyFunction_")
    omit_files = ("core/boxing", "/Register", "/Redispatch", "pythonrun.c", "Modules/main.c",
                  "Objects/call.c", "Objects/methodobject.c", "pycore_ceval.h", "ceval.c",
                  "cpython/abstract.h")
    return not any(o in f["name"] for o in omit_functions) and not any(o in f["filename"] for o in omit_files)


def format_frames(frames):
    if not frames:
        return "<block was allocated before _record_history was enabled>"
    return "\n".join("%s:%s:%s" % (f["filename"], f["line"], f["name"]) for f in frames if frame_filter(f))


def process_alloc_data(snap, traces, device, plot_segments):
    """The element list of the "Active Memory Timeline" (plot_segments False) and "Active Cached
    Segment Timeline" (True), with the text shown on hover of each."""
    alloc = "segment_alloc" if plot_segments else "alloc"
    free, free_completed = ("segment_free", "segment_free") if plot_segments else ("free", "free_completed")
    elements, addr_to_alloc = [], {}
    for e in traces[device]:
        if e["action"] == alloc:
            elements.append(e)
            addr_to_alloc[e["addr"]] = len(elements) - 1
        elif e["action"] in (free, free_completed):
            if e["addr"] in addr_to_alloc:
                del addr_to_alloc[e["addr"]]
            else:
                elements.append(e)
    for s in snap["segments"]:
        if s["device"] != device:
            continue
        if plot_segments:
            if s["address"] not in addr_to_alloc:
                elements.append({"action": "alloc", "addr": s["address"], "size": s["total_size"],
                                 "frames": [], "stream": s["stream"]})
        else:
            addr = s["address"]
            for b in s["blocks"]:
                if b["state"] == "active_allocated" and addr not in addr_to_alloc:
                    elements.append({"action": "alloc", "addr": addr, "size": b["requested_size"],
                                     "frames": b["frames"], "stream": s["stream"]})
                addr += b["size"]
    return [format_frames(el["frames"]) for el in elements]


def check_viewer(check, snap):
    try:
        annotated = annotate(snap)
        traces = annotated[0]
    except (KeyError, TypeError) as e:
        check(False, "viewer annotate_snapshot fails: %r" % e)
        return
    devices = {s["device"] for s in snap["segments"]} | {i for i, t in enumerate(traces) if t}
    for device in sorted(devices):
        n = len(traces[device]) if device < len(traces) else 0
        # the view selects the last event first; the replay must work from every event
        for idx in range(max(n - 1, 0), -1, -1) if n < 2000 else (n - 1, n // 2, 0):
            try:
                simulate_memory(snap, annotated, device, idx)
            except ViewerError as e:
                check(False, "viewer (Allocator State History, device %d): %s" % (device, e))
                break
            except (KeyError, TypeError, IndexError) as e:
                check(False, "viewer replay fails at event %d: %r" % (idx, e))
                break
        for plot_segments in (False, True):
            try:
                process_alloc_data(snap, traces, device, plot_segments)
            except (KeyError, TypeError) as e:
                check(False, "viewer timeline (segments=%s) fails: %r" % (plot_segments, e))


# ---- the expectation -------------------------------------------------------------------------------

def block_index(snap):
    blocks = {}
    for s in snap["segments"]:
        for b in s["blocks"]:
            blocks[b["address"]] = b
    return blocks


def check_segments(check, snap, exp):
    blocks = {}
    prev_end = 0
    sums = {"total": 0, "allocated": 0, "active": 0}
    for i, s in enumerate(snap["segments"]):
        where = "segment %d (0x%x)" % (i, s["address"])
        check(s["device"] == exp["device"], where + " device")
        check(s["is_expandable"] is exp["expandable"], where + " is_expandable")
        check(s["address"] >= prev_end, where + " overlaps the previous segment or is out of order")
        bl = s["blocks"]
        check(len(bl) > 0, where + " has no blocks")
        addr = s["address"]
        alloc = active = req = 0
        for b in bl:
            check(b["address"] == addr, where + " blocks do not tile the segment at 0x%x" % addr)
            check(b["size"] > 0 and b["size"] % 512 == 0, where + " block size %d" % b["size"])
            addr = b["address"] + b["size"]
            if b["state"] == "active_allocated":
                alloc += b["size"]
            if b["state"] != "inactive":
                active += b["size"]
                req += b["requested_size"]
                check(0 < b["requested_size"] <= b["size"],
                      where + " block 0x%x requested %d, size %d" % (b["address"], b["requested_size"], b["size"]))
            else:
                check(b["frames"] == [] and b["requested_size"] == 0, where + " inactive block with frames or a request")
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
    for addr, size, requested in exp["pending"]:
        b = blocks.get(addr)
        if check(b is not None, "pending block 0x%x missing" % addr):
            check(b["state"] == "active_pending_free", "pending block 0x%x state %s" % (addr, b["state"]))
            check(b["size"] == size, "pending block 0x%x size" % addr)
            # the viewer draws a pending block as its request plus "free space lost due to rounding"
            check(b["requested_size"] == requested, "pending block 0x%x requested_size %d, asked %d"
                  % (addr, b["requested_size"], requested))
    grouped = [b for b in blocks.values() if "parts" in b]
    check(len(grouped) == len(exp["groups"]), "%d fused blocks, expected %d" % (len(grouped), len(exp["groups"])))
    for addr, parts in exp["groups"]:
        b = blocks.get(addr)
        if not check(b is not None and "parts" in b, "fused block 0x%x has no parts" % addr):
            continue
        got = [[p["offset"], p["size"]] for p in b["parts"]]
        check(got == parts, "fused block 0x%x parts %s != %s" % (addr, got, parts))
        check(len(b["frames"]) >= 1 and "fused" in b["frames"][0]["name"], "fused block frame")
        check(parts[-1][0] + parts[-1][1] <= b["size"], "parts overflow the block")


def check_traces(check, snap, exp, csv_path):
    tr = snap["device_traces"]
    check(isinstance(tr, list) and len(tr) == exp["device"] + 1, "device_traces has one list per device")
    t = tr[exp["device"]]
    check(len(t) == exp["trace_len"], "trace has %d entries, history %d" % (len(t), exp["trace_len"]))
    last = -1
    live = set()
    window = exp.get("time_window")
    for e in t:
        check(e["time_us"] >= last, "trace times go back")
        last = e["time_us"]
        if window:
            check(window[0] <= e["time_us"] <= window[1], "time_us %d outside [%d, %d] (microseconds "
                  "since the epoch)" % (e["time_us"], window[0], window[1]))
        if e["action"] == "alloc":
            check(e["addr"] not in live, "alloc of a live address 0x%x" % e["addr"])
            live.add(e["addr"])
        elif e["action"] == "free_requested":
            check(e["addr"] in live, "free_requested of 0x%x never allocated" % e["addr"])
            live.discard(e["addr"])
        check(e["compile_context"] == "" and e["user_metadata"] == "", "compile_context / user_metadata")
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


def all_frames(snap):
    for s in snap["segments"]:
        yield from s["frames"]
        for b in s["blocks"]:
            yield from b["frames"]
    for t in snap["device_traces"]:
        for e in t:
            yield from e["frames"]


def check_expected_frames(check, snap, exp):
    mode = exp.get("frames", "none")
    blocks = block_index(snap)
    trace = snap["device_traces"][exp["device"]]
    if mode == "none":
        groups = {g[0] for g in exp["groups"]}
        for f_owner in [b for a, b in blocks.items() if a not in groups]:
            check(f_owner["frames"] == [], "block 0x%x has frames, none recorded" % f_owner["address"])
        check(all(e["frames"] == [] for e in trace), "trace frames without stacks")
        return
    for addr in exp.get("stacked", []):
        b = blocks.get(addr)
        if check(b is not None, "stacked block 0x%x missing" % addr):
            fr = [f for f in b["frames"] if "fused" not in f["name"]]
            check(len(fr) > 0, "block 0x%x allocated with stacks on has no frames" % addr)
            # what the viewer prints on hover: something must survive its filter
            check(format_frames(fr).strip() != "", "block 0x%x: every frame filtered by the viewer" % addr)
    allocs = [e for e in trace if e["action"] == "alloc"]
    check(len(allocs) > 0 and all(e["frames"] for e in allocs), "alloc entries without frames")
    names = {f["name"] for f in all_frames(snap)}
    files = {f["filename"] for f in all_frames(snap)}
    for n in exp.get("frame_names", []):
        check(n in names, "no frame named %r (names: %s)" % (n, sorted(names)[:40]))
    for suffix in exp.get("frame_files", []):
        check(any(f.endswith(suffix) for f in files), "no frame from a file ending %r (%s)" % (suffix, sorted(files)))
    for bad in exp.get("no_frame_files", []):
        check(not any(bad in f for f in files), "a frame from %r: %s" % (bad, sorted(f for f in files if bad in f)))
    for func, line in exp.get("python_lines", {}).items():
        lines = {f["line"] for f in all_frames(snap) if f["name"] == func}
        check(line in lines, "frames of %s name lines %s, expected %d" % (func, sorted(lines), line))
    # segments were mapped inside recorded calls: their frames are where memory was first needed
    if exp.get("segment_frames"):
        check(any(s["frames"] for s in snap["segments"]), "no segment has frames")


def check(snap, exp, csv_path=None):
    """Every check above; returns the list of failures (empty when all pass)."""
    c = Checker()
    if not check_format(c, snap):
        return c.failures
    c(snap["external_annotations"] == [], "external_annotations")
    c(all(f["filename"] for f in all_frames(snap)), "a frame without a file name")
    st = snap["allocator_settings"]
    c(("expandable_segments:%s" % ("true" if exp["expandable"] else "false")) in st["PYTORCH_CUDA_ALLOC_CONF"],
      "allocator_settings conf string %r" % st)
    c(st.get("expandable_segments") is exp["expandable"], "allocator_settings expandable")
    check_segments(c, snap, exp)
    check_traces(c, snap, exp, csv_path)
    check_expected_frames(c, snap, exp)
    check_viewer(c, snap)
    return c.failures


def main():
    if sys.argv[1] == "--pytorch-only":
        # a snapshot written by PyTorch itself: the format and viewer checks must hold for it too,
        # which keeps this checker honest about what PyTorch writes
        snap = load(sys.argv[2])
        c = Checker()
        if check_format(c, snap):
            check_viewer(c, snap)
        for msg in c.failures[:30]:
            print("snapshot_check: " + msg)
        print("snapshot_check: %s (PyTorch's): %d trace entries, %s" % (
            sys.argv[2], sum(len(t) for t in snap.get("device_traces", [])), "FAILED" if c.failures else "ok"))
        return 1 if c.failures else 0
    snap = load(sys.argv[1])
    with open(sys.argv[2]) as f:
        exp = json.load(f)
    csv_path = sys.argv[3] if len(sys.argv) > 3 else None
    failures = check(snap, exp, csv_path)
    for msg in failures[:60]:
        print("snapshot_check: " + msg)
    if len(failures) > 60:
        print("snapshot_check: ... %d more" % (len(failures) - 60))
    traces = snap.get("device_traces") or [[]] if isinstance(snap, dict) else [[]]
    print("snapshot_check: %s: %d segment(s), %d trace entries, %s" % (
        sys.argv[1], len(snap.get("segments", [])) if isinstance(snap, dict) else 0, len(traces[-1]),
        "FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
