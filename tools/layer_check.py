#!/usr/bin/env python3
"""The layer check: reads the library's objects with nm and fails on any call that runs back up.

    tools/layer_check.py [--nm NM] [--src SRCDIR] OBJDIR_OR_OBJECTS...
    tools/layer_check.py --self-test CC      (shows that it catches what it is for)

A module is one object of src/ (src/core/pool.c -> core/pool); its layer is its folder. Rules
(docs/design.md, "Layers"):
  1. layers bottom up: base < driver < core < features < api; a module calls its own layer and
     those below, never one above;
  2. above the driver, code calls the driver contract only (a vmm_driver's ops, reached through
     pointers, which nm does not see, and the modules in DRIVER_CONTRACT: driver/driver, whose
     vmm_driver_open opens the driver the configuration names, and driver/sim_options, data
     without a device); only api/sim_api,
     the simulator's own API, calls the simulator's functions;
  3. src/planner stands on base only, and nothing in the library calls it (vmm-plan and the
     public vmm_plan_* functions are its users); inside it, each file is a module with a rank
     (PLANNER_RANK: plan > heuristics, exact, improve, tile, csv > tree, place, naive, verify >
     problem, reuse, generate) and calls its own rank or those below;
  4. no loop between modules, within a layer or across: the module graph is acyclic;
  5. every object lies in a layer folder (a new file goes in one: docs/design.md says how);
  6. with --src, includes obey rules 1 and 3 too: a file of src/ that #includes a header of a
     higher layer (or the planner's from the library, or a library header from the planner, or
     the umbrella src/internal.h, which is for the tests) fails, reported as file:line.
Edges are undefined symbols (nm's U) of one object defined by another: direct calls and data.
Calls through function pointers (hooks registered at setup) are invisible to nm by design: that
is how a lower layer signals up. Exit status 0 clean, 1 violations (each printed with the symbol
and both files), 2 usage or tool errors.
"""
import os
import re
import subprocess
import sys
import tempfile

LAYERS = ["base", "driver", "core", "features", "api"]
RANK = {name: i for i, name in enumerate(LAYERS)}
PLANNER = "planner"
# What code above the driver may call of the driver layer by name: the contract's modules.
# driver/driver is its one entry, vmm_driver_open (alloc.c opens the driver the configuration
# names with it, never naming the simulator or CUDA); driver/sim_options, the simulated device's
# options as data (defaults, call-kind names, cost tables: no device), which the configuration
# parses. Everything else goes through the vmm_driver's ops table.
DRIVER_CONTRACT = {"driver/driver", "driver/sim_options"}
SIM_API = ("api/sim_api", "driver/drv_sim")
# The planner's files, bottom up (planner.h, "Modules call downward only"); a new file gets a rank
# here (docs/design.md, "Adding a module").
PLANNER_RANK = {"problem": 0, "reuse": 0, "generate": 0,
                "tree": 1, "place": 1, "naive": 1, "verify": 1,
                "heuristics": 2, "exact": 2, "improve": 2, "tile": 2, "csv": 2,
                "plan": 3}


def module_of(path):
    """(module, source file) of an object path such as .../src/core/pool.c.o; module None when
    the object is not under src/."""
    parts = os.path.normpath(path).split(os.sep)
    if "src" not in parts:
        return None, path
    rel = parts[len(parts) - 1 - parts[::-1].index("src") + 1:]
    src = "src/" + "/".join(rel)
    if src.endswith(".o"):
        src = src[:-2]
    if src.endswith(".obj"):
        src = src[:-4]
    if len(rel) == 1:
        return "(no layer)/" + rel[0].split(".")[0], src
    if rel[0] == PLANNER:
        return PLANNER + "/" + rel[-1].split(".")[0], src
    return rel[0] + "/" + rel[-1].split(".")[0], src


def layer_of(module):
    return module.split("/")[0]


def read_objects(nm, objects):
    defs, undefs, files = {}, {}, {}
    for o in objects:
        mod, src = module_of(o)
        if mod is None:
            continue
        files.setdefault(mod, set()).add(src)
        try:
            out = subprocess.run([nm, o], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            print("layer_check: %s %s: %s" % (nm, o, e), file=sys.stderr)
            sys.exit(2)
        for line in out.splitlines():
            f = line.split()
            if len(f) == 2 and f[0] == "U":
                undefs.setdefault((mod, src), set()).add(f[1])
            elif len(f) == 3 and f[1] in "TDBRVWGSC":
                defs[f[2]] = (mod, src)
    return defs, undefs, files


def check(nm, objects, out=sys.stdout, srcdir=None):
    defs, undefs, files = read_objects(nm, objects)
    if not files:
        print("layer_check: no objects of src/ found", file=sys.stderr)
        return 2
    bad = check_includes(srcdir) if srcdir else []
    edges = {}  # module -> {module: (symbol, from file, to file)}
    for mod in sorted(files):
        if layer_of(mod) == PLANNER and mod.split("/")[1] not in PLANNER_RANK:
            bad.append("%s: a planner file without a rank: add it to PLANNER_RANK in "
                       "tools/layer_check.py (docs/design.md, \"Adding a module\")"
                       % sorted(files[mod])[0])
        if mod.startswith("(no layer)"):
            bad.append("%s: not in a layer folder (src/base, driver, core, features, api): move it "
                       "to the layer it belongs to (docs/design.md, \"Adding a module\")"
                       % sorted(files[mod])[0])
    for (mod, src), syms in sorted(undefs.items()):
        for sym in sorted(syms):
            if sym not in defs:
                continue
            tmod, tsrc = defs[sym]
            if tmod == mod:
                continue
            edges.setdefault(mod, {}).setdefault(tmod, (sym, src, tsrc))
            lf, lt = layer_of(mod), layer_of(tmod)
            why = None
            if lf.startswith("(") or lt.startswith("("):
                continue  # reported above
            if lf == PLANNER and lt == PLANNER:
                rf = PLANNER_RANK.get(mod.split("/")[1])
                rt = PLANNER_RANK.get(tmod.split("/")[1])
                if rf is not None and rt is not None and rt > rf:
                    why = "%s may not call %s (a planner module above)" % (mod, tmod)
            elif lf == PLANNER and lt != "base":
                why = "the planner stands on base only"
            elif lt == PLANNER and lf != PLANNER:
                why = "nothing in the library calls the planner"
            elif lf != PLANNER and lt != PLANNER and RANK[lt] > RANK[lf]:
                why = "%s may not call %s (a layer above)" % (lf, lt)
            elif lt == "driver" and lf != "driver" \
                    and tmod not in DRIVER_CONTRACT and (mod, tmod) != SIM_API:
                why = ("above the driver, only the contract (driver.h's ops, driver/driver's "
                       "vmm_driver_open, driver/sim_options)")
            if why:
                bad.append("%s -> %s: %s (%s)" % (src, tsrc, sym, why))
    # loops: strongly connected components of the module graph (Tarjan, iterative)
    index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]
    nodes = sorted(set(files) | {t for m in edges for t in edges[m]})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, {}))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, {})))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))
    for comp in sccs:
        lines = ["loop between modules: " + ", ".join(comp)]
        for m in comp:
            for t in sorted(edges.get(m, {})):
                if t in comp:
                    sym, s, ts = edges[m][t]
                    lines.append("    %s -> %s: %s" % (s, ts, sym))
        bad.append("\n".join(lines))
    for b in bad:
        print("layer_check: " + b, file=out)
    if bad:
        print("layer_check: %d violation(s); layers and allowed edges: docs/design.md, \"Layers\""
              % len(bad), file=out)
        return 1
    n_edges = sum(len(v) for v in edges.values())
    print("layer_check: %d modules, %d edges between them: every call goes down a layer or "
          "across one without a loop%s" % (len(files), n_edges,
                                           "; every include of src/ too" if srcdir else ""),
          file=out)
    return 0


INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def check_includes(srcdir):
    """Violations of rule 6, each "src/FILE:LINE: ..."; srcdir is the library's src/."""
    bad = []
    for root, _, names in sorted(os.walk(srcdir)):
        for name in sorted(names):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, srcdir).replace(os.sep, "/")
            lf = rel.split("/")[0] if "/" in rel else None
            if lf is None or (lf not in RANK and lf != PLANNER):
                continue  # the umbrella internal.h; stray files are rule 5's
            with open(path, errors="replace") as f:
                for no, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if inc == "internal.h":
                        why = "the umbrella of every layer (for the tests): include the headers used"
                    elif "/" not in inc:
                        continue  # beside the file, or a public header of include/
                    else:
                        lt = inc.split("/")[0]
                        why = None
                        if lt not in RANK and lt != PLANNER:
                            continue
                        if lf == PLANNER and lt not in ("base", PLANNER):
                            why = "the planner stands on base only"
                        elif lt == PLANNER and lf != PLANNER:
                            why = "nothing in the library uses the planner"
                        elif lf != PLANNER and lt != PLANNER and RANK[lt] > RANK[lf]:
                            why = "%s may not include %s (a layer above)" % (lf, lt)
                    if why:
                        bad.append("src/%s:%d: includes \"%s\" (%s)" % (rel, no, inc, why))
    return bad


def objects_in(args):
    objs = []
    for a in args:
        if os.path.isdir(a):
            for root, _, names in os.walk(a):
                objs += [os.path.join(root, n) for n in sorted(names) if n.endswith((".o", ".obj"))]
        else:
            objs.append(a)
    return objs


def self_test(cc, nm):
    """Objects with one upward call, one loop, a call into the simulator, a driver opened by name
    from above the driver (vmm_driver_open, the contract's entry, is allowed), a file outside the
    layers, an upward call and a loop among the planner's files, and headers that include upward:
    each must be reported, and the same tree without them must pass."""
    files = {
        "src/base/b.c": "int b_fn(void) { return 1; }\n",
        "src/core/c.c": "int b_fn(void); int api_fn(void);\n"
                        "int c_fn(void) { return b_fn() + api_fn(); }\n",
        "src/core/d.c": "int e_fn(void); int d_fn(void) { return e_fn(); }\n",
        "src/core/e.c": "int d_fn(void); int e_fn(void) { return d_fn(); }\n",
        "src/driver/drv_sim.c": "int vmm_sim_secret(void) { return 3; }\n",
        "src/driver/sim_options.c": "int vmm_sim_opt(void) { return 5; }\n",
        "src/core/o.c": "int vmm_sim_opt(void); int o_fn(void) { return vmm_sim_opt(); }\n",
        "src/features/f.c": "int vmm_sim_secret(void); int f_fn(void) { return vmm_sim_secret(); }\n",
        "src/driver/drv_cuda.c": "int vmm_driver_cuda_open(void) { return 7; }\n",
        "src/driver/driver.c": "int vmm_driver_cuda_open(void);\n"
                               "int vmm_driver_open(void) { return vmm_driver_cuda_open(); }\n",
        "src/api/opener.c": "int vmm_driver_open(void); int op_fn(void) { return vmm_driver_open(); }\n",
        "src/api/byname.c": "int vmm_driver_cuda_open(void);\n"
                            "int bn_fn(void) { return vmm_driver_cuda_open(); }\n",
        "src/api/a.c": "int c_fn(void); int api_fn(void) { return 2; } int a2(void) { return c_fn(); }\n",
        "src/stray.c": "int stray_fn(void) { return 4; }\n",
        "src/planner/problem.c": "int p_fn(void) { return 6; }\n",
        "src/planner/plan.c": "int p_fn(void); int plan_fn(void) { return p_fn(); }\n",
        "src/planner/tree.c": "int naive_fn(void); int tree_fn(void) { return naive_fn(); }\n",
        "src/planner/naive.c": "int tree_fn(void); int naive_fn(void) { return tree_fn(); }\n",
        "src/planner/verify.c": "int plan_fn(void); int v_fn(void) { return plan_fn(); }\n",
        "src/planner/unranked.c": "int p_fn(void); int u_fn(void) { return p_fn(); }\n",
    }
    headers = {  # read by the include check only
        "src/core/x.h": "#include \"base/y.h\"\n#include \"driver/driver.h\"\n",
        "src/base/y.h": "#include <stddef.h>\n",
        "src/base/up.h": "/* upward */\n#include \"core/x.h\"\n",
        "src/planner/pl.h": "#include \"base/y.h\"\n#include \"internal.h\"\n",
    }
    expect = ["api_fn (core may not call api", "loop between modules: core/d, core/e",
              "vmm_sim_secret (above the driver", "vmm_driver_cuda_open (above the driver",
              "src/stray.c: not in a layer folder",
              "loop between modules: planner/naive, planner/tree",
              "plan_fn (planner/verify may not call planner/plan",
              'src/base/up.h:2: includes "core/x.h" (base may not include core',
              'src/planner/pl.h:2: includes "internal.h"',
              "src/planner/unranked.c: a planner file without a rank"]
    unexpected = ["vmm_sim_opt", "src/api/opener.c", "core/x.h:", "planner/plan.c.o ->",
                  "planner/plan.c ->"]
    bad_objs = ("c.c.o", "d.c.o", "e.c.o", "f.c.o", "stray.c.o", "tree.c.o", "naive.c.o",
                "verify.c.o", "unranked.c.o", "byname.c.o")
    with tempfile.TemporaryDirectory() as tmp:
        objs = []
        for rel, text in files.items():
            p = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
            subprocess.run([cc, "-c", p, "-o", p + ".o"], check=True)
            objs.append(p + ".o")
        for rel, text in headers.items():
            with open(os.path.join(tmp, rel), "w") as f:
                f.write(text)
        import io
        buf = io.StringIO()
        rc = check(nm, objs, buf, srcdir=os.path.join(tmp, "src"))
        text = buf.getvalue()
        missing = [e for e in expect if e not in text]
        extra = [e for e in unexpected if e in text]
        if rc != 1 or missing or extra:
            print(text)
            print("layer_check self-test: FAILED (rc %d, not reported: %s, wrongly reported: %s)"
                  % (rc, missing, extra))
            return 1
        clean = [o for o in objs if not o.endswith(bad_objs)]
        os.remove(os.path.join(tmp, "src/base/up.h"))
        os.remove(os.path.join(tmp, "src/planner/pl.h"))
        buf = io.StringIO()
        rc = check(nm, clean, buf, srcdir=os.path.join(tmp, "src"))
        if rc != 0:
            print(buf.getvalue())
            print("layer_check self-test: FAILED (a clean tree was refused)")
            return 1
    print("layer_check self-test: the upward call, the loop, the simulator call, the stray file, "
          "the planner's upward call, loop and unranked file, and the upward includes were reported; the "
          "options module and the clean tree passed")
    return 0


def main(argv):
    nm = "nm"
    args = argv[1:]
    if len(args) >= 2 and args[0] == "--nm":
        nm, args = args[1], args[2:]
    srcdir = None
    if len(args) >= 2 and args[0] == "--src":
        srcdir, args = args[1], args[2:]
        if not os.path.isdir(srcdir):
            print("layer_check: --src %s: not a folder" % srcdir, file=sys.stderr)
            return 2
    if len(args) == 2 and args[0] == "--self-test":
        return self_test(args[1], nm)
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    return check(nm, objects_in(args), srcdir=srcdir)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
