#!/usr/bin/env python3
"""vmm-viz: render a vmmalloc snapshot or trace as one self-contained HTML page with inline SVG.

    vmm-viz FILE [-o OUT.html] [--title TEXT] [--max-segments N]

FILE is either a snapshot pickle (vmm_snapshot_pickle, or torch.cuda.memory._dump_snapshot: the
same format) or a trace CSV with the header "action,addr,size,stream,time_us" (vmm_history_csv).
The page shows memory over time (allocated, active and reserved bytes, from the trace) and, for
a snapshot, the live memory by allocation site (from the blocks' call stacks, when history was
recorded with them) and the address map of every segment with its blocks coloured by state
(hover a block for its frames).

Standard library only. The pickle is read with an Unpickler that refuses every global, so a file
from elsewhere cannot run code.
"""
import argparse
import csv
import html
import io
import pickle
import sys
import time

COLORS = {
    "active_allocated": "#4e79a7",
    "rounding": "#a0bcd8",          # bytes of an allocated block beyond its request
    "active_pending_free": "#e15759",
    "inactive": "#e6e6e6",
    "allocated": "#4e79a7",
    "active": "#f28e2c",
    "reserved": "#59a14f",
    "oom": "#d62728",
}
STATE_LABEL = {
    "active_allocated": "allocated",
    "active_pending_free": "pending free (waiting for other streams)",
    "inactive": "free (cached)",
}


class NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("refusing global %s.%s in a snapshot" % (module, name))


def fmt_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024
    return "%.1f TiB" % n


def fmt_time(us):
    if us >= 1e6:
        return "%.2f s" % (us / 1e6)
    if us >= 1e3:
        return "%.1f ms" % (us / 1e3)
    return "%d us" % us


def fmt_start(us):
    """When the trace starts: a date for microseconds since the epoch (what vmmalloc and PyTorch
    write), else an offset (traces of older vmmalloc versions counted from vmm_create)."""
    if us > 946684800 * 10**6:  # after 2000-01-01
        return "at " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(us / 1e6))
    return "from %s" % fmt_time(us)


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:1] == b"\x80":
        snap = NoGlobals(io.BytesIO(data)).load()
        if not isinstance(snap, dict) or "segments" not in snap:
            raise ValueError("%s: not a memory snapshot (no 'segments')" % path)
        return snap
    rows = list(csv.DictReader(io.StringIO(data.decode("utf-8"))))
    need = {"action", "addr", "size", "stream", "time_us"}
    if not rows or not need <= set(rows[0]):
        raise ValueError("%s: neither a snapshot pickle nor a trace CSV (%s)" % (path, ",".join(sorted(need))))
    trace = [{"action": r["action"], "addr": int(r["addr"], 0), "size": int(r["size"]),
              "stream": int(r["stream"], 0), "time_us": int(r["time_us"])} for r in rows]
    return {"segments": None, "device_traces": [trace]}


# ---- memory over time ----------------------------------------------------------------------------

DELTAS = {  # action -> (allocated, active, reserved) sign
    "alloc": (1, 1, 0),
    "free_requested": (-1, 0, 0),
    "free_completed": (0, -1, 0),
    "segment_alloc": (0, 0, 1),
    "segment_map": (0, 0, 1),
    "segment_free": (0, 0, -1),
    "segment_unmap": (0, 0, -1),
}


def series(trace, end_values):
    """Points (time, allocated, active, reserved) after each event. The trace may start after the
    allocator did: the start is chosen so that the series ends at the snapshot's totals, or (for a
    bare trace) so that no value goes below zero."""
    net = [0, 0, 0]
    low = [0, 0, 0]
    for e in trace:
        d = DELTAS.get(e["action"])
        if d:
            for k in range(3):
                net[k] += d[k] * e["size"]
                low[k] = min(low[k], net[k])
    start = [end_values[k] - net[k] if end_values else -low[k] for k in range(3)]
    start = [max(s, -low[k]) for k, s in enumerate(start)]
    cur = list(start)
    t0 = trace[0]["time_us"] if trace else 0
    pts = [(t0, *cur)]
    for e in trace:
        d = DELTAS.get(e["action"])
        if d:
            for k in range(3):
                cur[k] += d[k] * e["size"]
            pts.append((e["time_us"], *cur))
    return pts


def nice_step(span, n):
    raw = span / max(n, 1)
    mag = 1
    while mag * 10 <= raw:
        mag *= 10
    while mag > raw and mag > 1:
        mag //= 10
    for m in (1, 2, 5, 10):
        if mag * m >= raw:
            return mag * m
    return mag * 10


def byte_step(top, n):
    """A tick step in bytes that is a round number of KiB / MiB / GiB."""
    for unit in (1 << 30, 1 << 20, 1 << 10, 1):
        if top >= 2 * unit:
            return nice_step(top / unit, n) * unit
    return 1


def timeline_svg(trace, end_values):
    W, H, L, R, T, B = 1100, 300, 90, 20, 20, 40
    pts = series(trace, end_values)
    if len(pts) < 2:
        return '<p class="note">No trace: record history with vmm_record_history() before the snapshot.</p>'
    t0, t1 = pts[0][0], pts[-1][0]
    span = max(t1 - t0, 1)
    top = max(max(p[1], p[2], p[3]) for p in pts) or 1
    step = byte_step(top, 5)
    top = (top // step + 1) * step
    x = lambda t: L + (t - t0) * (W - L - R) / span
    y = lambda v: T + (H - T - B) * (1 - v / top)
    out = ['<svg class="chart" viewBox="0 0 %d %d" width="%d" height="%d" xmlns="http://www.w3.org/2000/svg">' % (W, H, W, H)]
    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="#fafafa" stroke="#ccc"/>' % (L, T, W - L - R, H - T - B))
    v = 0
    while v <= top:
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' % (L, W - R, y(v), y(v)))
        out.append('<text x="%d" y="%.1f" class="tick" text-anchor="end">%s</text>' % (L - 6, y(v) + 4, fmt_bytes(v)))
        v += step
    tstep = nice_step(span, 8)
    t = 0
    while t <= span:
        out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#bbb"/>' % (x(t0 + t), x(t0 + t), H - B, H - B + 5))
        out.append('<text x="%.1f" y="%d" class="tick" text-anchor="middle">%s</text>' % (x(t0 + t), H - B + 18, fmt_time(t)))
        t += tstep
    # step lines (a value holds until the next event); active under allocated, wider, so the
    # pending bytes between them show
    for k, name, width in ((3, "reserved", 2), (2, "active", 5), (1, "allocated", 2)):
        d = ["M%.1f,%.1f" % (x(pts[0][0]), y(pts[0][k]))]
        for p in pts[1:]:
            d.append("H%.1f V%.1f" % (x(p[0]), y(p[k])))
        out.append('<path d="%s" fill="none" stroke="%s" stroke-width="%d" stroke-linejoin="round">'
                   '<title>%s</title></path>' % (" ".join(d), COLORS[name], width, name))
    for e in trace:
        if e["action"] == "oom":
            out.append('<g><line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s" stroke-dasharray="4 3" stroke-width="2"/>'
                       '<title>out of memory: %s requested</title></g>'
                       % (x(e["time_us"]), x(e["time_us"]), T, H - B, COLORS["oom"], fmt_bytes(e["size"])))
    out.append('<text x="%d" y="%d" class="axis" text-anchor="middle">time since the first event recorded, %s</text>'
               % ((L + W - R) // 2, H - 4, html.escape(fmt_start(t0))))
    out.append("</svg>")
    last = pts[-1]
    legend = "".join('<span class="key"><i style="background:%s"></i>%s (%s at the end, peak %s)</span>'
                     % (COLORS[n], n, fmt_bytes(last[k]), fmt_bytes(max(p[k] for p in pts)))
                     for k, n in ((1, "allocated"), (2, "active"), (3, "reserved")))
    if any(e["action"] == "oom" for e in trace):
        legend += '<span class="key"><i style="background:%s"></i>out of memory</span>' % COLORS["oom"]
    return '<div class="legend">%s</div>%s' % (legend, "".join(out))


# ---- call stacks -----------------------------------------------------------------------------------

MAX_TIP_FRAMES = 14
# frames that say nothing about the program: what pytorch.org/memory_viz hides too
HIDE_NAMES = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "_start", "__libc_start_main",
              "PyEval_", "PyObject_", "PyFunction_")
HIDE_FILES = ("core/boxing", "/Register", "/Redispatch", "pythonrun.c", "Modules/main.c", "Objects/call.c",
              "Objects/methodobject.c", "pycore_ceval.h", "ceval.c", "cpython/abstract.h")


def shown_frames(frames):
    return [f for f in frames if not any(h in f.get("name", "") for h in HIDE_NAMES)
            and not any(h in f.get("filename", "") for h in HIDE_FILES)]


def fmt_frame(f):
    line = f.get("line") or 0
    return "%s  %s%s" % (f.get("name", "??"), f.get("filename", "??"), (":%d" % line) if line else "")


def site_of(frames):
    """The allocation site a block is charged to: its innermost Python frame (what the program
    wrote), else its innermost named native frame."""
    frames = shown_frames(frames)
    for f in frames:
        # a comprehension is its own frame in Python 3.11: charge its function instead
        if f.get("line") and f.get("name") not in ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"):
            return fmt_frame(f)
    for f in frames:
        if f.get("line"):
            return fmt_frame(f)
    for f in frames:
        if not f.get("name", "??").startswith("??"):
            return fmt_frame(f)
    return None


def sites_html(segs, top=15):
    """Live memory by allocation site (from the blocks' frames)."""
    sites, unknown, total = {}, 0, 0
    for s in segs or []:
        for b in s["blocks"]:
            if b["state"] == "inactive":
                continue
            size = b.get("requested_size") or b["size"]
            total += size
            site = site_of(b.get("frames") or [])
            if site is None:
                unknown += size
            else:
                n, nb = sites.get(site, (0, 0))
                sites[site] = (n + 1, nb + size)
    if not sites:
        return ('<p class="note">No block has call stacks: record them with vmm_record_history_ex(a, n, '
                'VMM_HISTORY_STACKS_ALL) or vmmalloc.torch.record_memory_history() before allocating.</p>')
    rows = sorted(sites.items(), key=lambda kv: -kv[1][1])[:top]
    out = ['<table class="sites"><tr><th>bytes</th><th>share</th><th>blocks</th><th>allocated at</th></tr>']
    for site, (n, nb) in rows:
        out.append("<tr><td>%s</td><td>%.0f%%</td><td>%d</td><td><code>%s</code></td></tr>"
                   % (fmt_bytes(nb), 100.0 * nb / total if total else 0, n, html.escape(site)))
    out.append("</table>")
    if unknown:
        out.append('<p class="note">%s of live memory has no call stack (allocated before recording began).</p>'
                   % fmt_bytes(unknown))
    return "".join(out)


# ---- address map ---------------------------------------------------------------------------------

def segment_svg(seg, width):
    H = 34
    total = seg["total_size"] or 1
    sx = lambda n: n * width / total
    out = ['<svg class="seg" viewBox="0 0 %d %d" width="%d" height="%d" xmlns="http://www.w3.org/2000/svg">' % (width, H, width, H)]
    for b in seg["blocks"]:
        bx = sx(b["address"] - seg["address"])
        bw = max(sx(b["size"]), 0.5)
        state = b["state"]
        tip = "0x%x: %s, %s" % (b["address"], fmt_bytes(b["size"]), STATE_LABEL.get(state, state))
        if state != "inactive":
            tip += ", %s requested" % fmt_bytes(b["requested_size"])
        frames = shown_frames(b.get("frames") or [])
        for fr in frames[:MAX_TIP_FRAMES]:
            tip += "\n  %s" % fmt_frame(fr)
        if len(frames) > MAX_TIP_FRAMES:
            tip += "\n  ... %d more frames" % (len(frames) - MAX_TIP_FRAMES)
        out.append('<g><title>%s</title>' % html.escape(tip))
        out.append('<rect x="%.2f" y="2" width="%.2f" height="%d" fill="%s"/>' % (bx, bw, H - 4, COLORS.get(state, "#999")))
        if state == "active_allocated" and b["requested_size"] < b["size"]:
            rw = sx(b["size"] - b["requested_size"])
            out.append('<rect x="%.2f" y="2" width="%.2f" height="%d" fill="%s"/>'
                       % (bx + bw - rw, rw, H - 4, COLORS["rounding"]))
        for part in (b.get("parts") or [])[1:]:  # fused buffers: a tick where each member starts
            px = bx + sx(part["offset"])
            out.append('<line x1="%.2f" x2="%.2f" y1="2" y2="%d" stroke="#fff" stroke-width="1.5"/>' % (px, px, H - 2))
        if bw >= 3:
            out.append('<line x1="%.2f" x2="%.2f" y1="2" y2="%d" stroke="#fff" stroke-width="1"/>' % (bx, bx, H - 2))
        out.append("</g>")
    out.append('<rect x="0.5" y="1.5" width="%d" height="%d" fill="none" stroke="#555"/>' % (width - 1, H - 3))
    out.append("</svg>")
    return "".join(out)


def segments_html(segs, max_segments):
    if segs is None:
        return '<p class="note">A trace CSV has no address map; write a snapshot with vmm_snapshot_pickle().</p>'
    if not segs:
        return '<p class="note">No segments: nothing is mapped.</p>'
    shown = sorted(segs, key=lambda s: -s["total_size"])[:max_segments]
    shown.sort(key=lambda s: s["address"])
    rows = []
    for s in shown:
        blocks = s["blocks"]
        n = {k: sum(1 for b in blocks if b["state"] == k) for k in STATE_LABEL}
        label = ("<b>0x%x</b> %s %s%s, stream 0x%x<br>%s allocated, %s pending, %s free; %d block%s"
                 % (s["address"], fmt_bytes(s["total_size"]), s["segment_type"],
                    " (expandable)" if s.get("is_expandable") else "", s["stream"],
                    fmt_bytes(s["allocated_size"]), fmt_bytes(s["active_size"] - s["allocated_size"]),
                    fmt_bytes(s["total_size"] - s["active_size"]), len(blocks), "" if len(blocks) == 1 else "s"))
        if n["active_pending_free"]:
            label += ", %d pending" % n["active_pending_free"]
        fused = sum(1 for b in blocks if b.get("parts"))
        if fused:
            label += ", %d fused" % fused
        rows.append('<div class="segrow"><div class="seglabel">%s</div>%s</div>' % (label, segment_svg(s, 760)))
    note = ""
    if len(segs) > len(shown):
        note = '<p class="note">Showing the %d largest of %d segments.</p>' % (len(shown), len(segs))
    keys = "".join('<span class="key"><i style="background:%s"></i>%s</span>' % (COLORS[k], v)
                   for k, v in (("active_allocated", "allocated"), ("rounding", "allocated beyond the request (rounding)"),
                                ("active_pending_free", "pending free"), ("inactive", "free (cached)")))
    keys += '<span class="key"><i style="background:#4e79a7;border-left:2px solid #fff"></i>white tick: block or fused-buffer boundary</span>'
    return '<div class="legend">%s</div>%s%s' % (keys, note, "".join(rows))


CSS = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;margin-bottom:12px;font-size:12px;overflow-wrap:anywhere} .note{color:#777;font-style:italic}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:120px;background:#f8f9fb}
.card b{display:block;font-size:18px} .card span{color:#666;font-size:12px}
.legend{margin:6px 0 10px} .key{margin-right:16px;white-space:nowrap;font-size:13px}
.key i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px;border-radius:2px}
.tick{font-size:11px;fill:#555} .axis{font-size:12px;fill:#444}
.segrow{display:flex;align-items:center;margin:4px 0} .seglabel{width:330px;font-size:12px;color:#333;padding-right:10px}
svg{display:block}
table.sites{border-collapse:collapse;font-size:13px} .sites td,.sites th{padding:2px 10px;text-align:left;border-bottom:1px solid #eee}
.sites td:first-child,.sites td:nth-child(2),.sites td:nth-child(3){text-align:right;white-space:nowrap}
"""


def render(data, title, max_segments):
    segs = data.get("segments")
    traces = data.get("device_traces") or [[]]
    dev = max(range(len(traces)), key=lambda i: len(traces[i])) if traces else 0
    trace = traces[dev] if traces else []
    end = None
    cards = []
    if segs is not None:
        reserved = sum(s["total_size"] for s in segs)
        alloc = sum(s["allocated_size"] for s in segs)
        active = sum(s["active_size"] for s in segs)
        end = [alloc, active, reserved]
        nblocks = sum(len(s["blocks"]) for s in segs)
        frag = 1 - alloc / reserved if reserved else 0
        cards += [("segments", str(len(segs))), ("reserved (mapped)", fmt_bytes(reserved)),
                  ("allocated", fmt_bytes(alloc)), ("pending free", fmt_bytes(active - alloc)),
                  ("free in segments", "%s (%.0f%%)" % (fmt_bytes(reserved - active), 100 * frag)),
                  ("blocks", str(nblocks))]
    cards.append(("trace events", str(len(trace))))
    ooms = sum(1 for e in trace if e["action"] == "oom")
    if ooms:
        cards.append(("out of memory", str(ooms)))
    settings = data.get("allocator_settings") or {}
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if len(conf) > 300:  # cut at a key boundary
        conf = conf[:conf.rfind(",", 0, 300)] + ", ..."
    sub = html.escape(conf)
    parts = ['<!DOCTYPE html><html><head><meta charset="utf-8"><title>%s</title><style>%s</style></head><body>'
             % (html.escape(title), CSS),
             "<h1>%s</h1>" % html.escape(title)]
    if sub:
        parts.append('<div class="sub">%s</div>' % sub)
    parts.append('<div class="cards">%s</div>' % "".join(
        '<div class="card"><b>%s</b><span>%s</span></div>' % (html.escape(v), html.escape(k)) for k, v in cards))
    parts.append("<h2>Memory over time (device %d)</h2>" % dev)
    parts.append(timeline_svg(trace, end))
    if segs is not None:
        parts.append("<h2>Live memory by allocation site</h2>")
        parts.append(sites_html(segs))
    parts.append("<h2>Address map (one row per segment, scaled to its size)</h2>")
    parts.append(segments_html(segs, max_segments))
    parts.append("</body></html>\n")
    return "".join(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="vmm-viz", description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="snapshot pickle or trace CSV")
    ap.add_argument("-o", "--output", help="HTML file to write (default: FILE.html)")
    ap.add_argument("--title", help="page title (default: the file name)")
    ap.add_argument("--max-segments", type=int, default=200, help="segments drawn at most (the largest)")
    args = ap.parse_args(argv)
    try:
        data = load(args.file)
    except (OSError, ValueError, pickle.UnpicklingError, EOFError, KeyError) as e:
        print("vmm-viz: %s" % e, file=sys.stderr)
        return 1
    out = args.output or args.file + ".html"
    page = render(data, args.title or args.file.rsplit("/", 1)[-1], args.max_segments)
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
    print("vmm-viz: wrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
