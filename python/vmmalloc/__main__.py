"""python -m vmmalloc: what this installation is, and the tools that go with it.

    python -m vmmalloc [info] [--json] [--no-devices]
        the version, the library loaded and how it was found, the configuration in force (from
        PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF, VMMALLOC_CONF) and the CUDA devices, read
        through libcuda and checked by creating a vmmalloc allocator on each (torch is not imported)
    python -m vmmalloc viz SNAPSHOT.pickle|TRACE.csv [-o OUT.html] [--title T] [--max-segments N]
        a self-contained HTML page of a snapshot or trace (vmm-viz, shipped in this package)
    python -m vmmalloc replay TRACE [vmm-bench replay options]
        replay a trace (PyTorch trace CSV, snapshot pickle, RMM log) through vmmalloc (vmm-bench)
    python -m vmmalloc plan [vmm-plan options]
        the offline memory planner (vmm-plan)

vmm-bench and vmm-plan are C programs of the source tree (cmake --build build): they are found on
PATH or in the build directories of the source tree this package lies in; --help says where each
tool is, or how to get it.
"""

import argparse
import ctypes
import glob
import json
import os
import runpy
import shutil
import sys

import vmmalloc

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.dirname(os.path.dirname(HERE))  # when the package lies in python/ of the tree


def _in_source_tree():
    return os.path.exists(os.path.join(SOURCE_ROOT, "CMakeLists.txt")) and \
        os.path.exists(os.path.join(SOURCE_ROOT, "src", "internal.h"))


def find_program(name, subdir):
    """A C program of the project: PATH, then build*/SUBDIR/NAME of the source tree."""
    p = shutil.which(name)
    if p:
        return p
    if _in_source_tree():
        for pattern in ("build", "build*"):
            for c in sorted(glob.glob(os.path.join(SOURCE_ROOT, pattern, subdir, name))):
                if os.access(c, os.X_OK):
                    return c
    return None


def find_viz():
    """The vmm-viz script: in this package (installed, or python/vmmalloc of the source tree), or
    vmm-viz on PATH (cmake --install)."""
    for c in (os.path.join(HERE, "_vmm_viz.py"),):
        if os.path.exists(c):
            return c
    return shutil.which("vmm-viz")


HOW_TO_BUILD = ("build it from the vmmalloc sources: cmake -S . -B build && cmake --build build "
                "(./tools/deps.sh installs what that needs)")

TOOLS = (
    ("viz", "render a snapshot or trace as one HTML page (vmm-viz)", lambda: find_viz(), None),
    ("replay", "replay a trace through vmmalloc's expandable and classic modes (vmm-bench replay)",
     lambda: find_program("vmm-bench", "bench"), "build/bench/vmm-bench"),
    ("plan", "offline memory planner for a trace (vmm-plan)", lambda: find_program("vmm-plan", "tools"),
     "build/tools/vmm-plan"),
)


# ---- devices ----------------------------------------------------------------------------------------

CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102


def cuda_devices():
    """(devices, error): each device as {index, name, total_bytes, vmm_supported}, read from
    libcuda.so.1 with ctypes (the library vmmalloc drives too); error says why none can be read."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return [], "libcuda.so.1 cannot be loaded (%s): no NVIDIA driver" % e
    c_int = ctypes.c_int
    if cu.cuInit(0) != 0:
        return [], "cuInit failed: no usable CUDA device"
    n = c_int()
    if cu.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return [], "cuDeviceGetCount failed"
    out = []
    for i in range(n.value):
        dev = c_int()
        if cu.cuDeviceGet(ctypes.byref(dev), i) != 0:
            continue
        name = ctypes.create_string_buffer(256)
        cu.cuDeviceGetName(name, len(name), dev)
        total = ctypes.c_size_t()
        cu.cuDeviceTotalMem_v2(ctypes.byref(total), dev)
        vmm = c_int()
        cu.cuDeviceGetAttribute(ctypes.byref(vmm), CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev)
        out.append({"index": i, "name": name.value.decode("utf-8", "replace"), "total_bytes": total.value,
                    "vmm_supported": bool(vmm.value)})
    return out, None if out else "the driver reports no device"


def allocator_check(index):
    """Create (and destroy) a vmmalloc allocator on device `index` with the configuration in force:
    None when it works, else the library's message."""
    lib = vmmalloc.load()
    a = ctypes.c_void_p()
    rc = lib.vmm_create(("device:%d" % index).encode(), ctypes.byref(a))
    if rc < 0:
        return (lib.vmm_last_error() or b"").decode("utf-8", "replace") or str(rc)
    lib.vmm_destroy(a)
    return None


# ---- info -------------------------------------------------------------------------------------------

def gather_info(devices=True):
    info = {"version": vmmalloc.__version__, "python": sys.version.split()[0]}
    try:
        info["library"] = vmmalloc.library_path()
        info["library_found"] = vmmalloc.library_source()
        vmmalloc.load()
    except (OSError, RuntimeError) as e:
        info["library"] = None
        info["library_error"] = str(e)
        return info
    info["environment"] = {k: os.environ[k] for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
                                                      "VMMALLOC_CONF", "VMMALLOC_LIB", "VMMALLOC_LIBRARY")
                           if k in os.environ}
    try:
        c = vmmalloc.config_in_force()
        info["config"] = c["config"]
        info["driver_error"] = c["error"]
    except vmmalloc.VmmError as e:
        info["config"] = None
        info["config_error"] = str(e)
    sim = "driver:sim" in (info.get("config") or "") and not info.get("driver_error")
    if devices and not sim:
        devs, err = cuda_devices()
        for d in devs:
            d["vmmalloc_error"] = allocator_check(d["index"]) if info.get("config") else "bad configuration"
        info["devices"] = devs
        info["devices_error"] = err
    elif sim:
        info["devices"] = []
        info["devices_error"] = "driver:sim: a simulated device (no GPU used)"
    info["tools"] = {name: find() for name, _, find, _ in TOOLS}
    return info


def split_config(conf):
    """"k:v,k:[a,b],..." into its items (commas inside brackets belong to the value)."""
    items, depth, cur = [], 0, ""
    for ch in conf:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += (ch == "[") - (ch == "]")
        cur += ch
    if cur:
        items.append(cur)
    return items


def _gib(n):
    return "%.1f GiB" % (n / float(1 << 30))


def print_info(info):
    print("vmmalloc %s (Python %s)" % (info["version"], info["python"]))
    if not info.get("library"):
        print("library: not found: %s" % info.get("library_error"))
        return 1
    print("library: %s (%s)" % (info["library"], info["library_found"]))
    env = info.get("environment") or {}
    for k, v in env.items():
        print("  %s=%s" % (k, v))
    if info.get("config") is None:
        print("config: invalid: %s" % info.get("config_error"))
        return 1
    print("config in force:")
    items = split_config(info["config"])
    stand_in = bool(info.get("driver_error"))  # read through a simulated allocator
    real_sim = not stand_in and "driver:sim" in items
    for item in items:
        if item.startswith("sim_") and not real_sim:
            continue  # settings of the simulated device: they do not apply to a GPU
        if item == "driver:sim" and stand_in:
            item = "driver:cuda (cannot start here: %s)" % info["driver_error"]
        print("  " + item)
    if "devices" in info:
        if info["devices"]:
            print("devices:")
            for d in info["devices"]:
                status = "vmmalloc ok" if not d["vmmalloc_error"] else "vmmalloc: " + d["vmmalloc_error"]
                print("  cuda:%d %s, %s, virtual memory management %s; %s"
                      % (d["index"], d["name"], _gib(d["total_bytes"]),
                         "supported" if d["vmm_supported"] else "NOT supported", status))
        else:
            print("devices: none (%s)" % info.get("devices_error"))
    for name, what, _, _ in TOOLS:
        where = info["tools"].get(name)
        print("%-7s %s" % (name + ":", where or "not found"))
    return 0


# ---- tool wrappers ----------------------------------------------------------------------------------

def run_viz(argv):
    path = find_viz()
    if not path:
        print("vmmalloc viz: vmm-viz not found (it ships in the installed package as "
              "vmmalloc/_vmm_viz.py, python/vmmalloc/_vmm_viz.py in the sources)", file=sys.stderr)
        return 2
    sys.argv = ["vmm-viz"] + list(argv)
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def run_program(name, subdir, sub, argv):
    prog = find_program(name, subdir)
    if not prog:
        print("vmmalloc %s: %s not found on PATH%s; %s" % (
            sub, name, " or in the source tree's build directories" if _in_source_tree() else "",
            HOW_TO_BUILD), file=sys.stderr)
        return 2
    args = [prog] + ([sub] if name == "vmm-bench" else []) + list(argv)
    sys.stdout.flush()
    os.execv(prog, args)
    return 1  # not reached


def viz_main():
    """Console script vmm-viz (installed by pip)."""
    sys.exit(run_viz(sys.argv[1:]))


def _help_epilog():
    lines = ["subcommands:"]
    for name, what, find, built in TOOLS:
        where = find()
        lines.append("  %-8s %s" % (name, what))
        lines.append("  %-8s   %s" % ("", ("found: " + where) if where else
                                      "not found: " + ("it is built at %s; %s" % (built, HOW_TO_BUILD) if built else "")))
    lines.append("  %-8s %s" % ("info", "version, library, configuration in force, devices (the default)"))
    lines.append("")
    lines.append("Arguments after a tool's subcommand go to the tool (python -m vmmalloc replay --help).")
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "viz":
        return run_viz(argv[1:])
    if argv and argv[0] == "replay":
        return run_program("vmm-bench", "bench", "replay", argv[1:])
    if argv and argv[0] == "plan":
        return run_program("vmm-plan", "tools", "plan", argv[1:])
    ap = argparse.ArgumentParser(prog="python -m vmmalloc", description=__doc__.split("\n\n")[0],
                                 epilog=_help_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", default="info", choices=["info"], help="info (the default)")
    ap.add_argument("--json", action="store_true", help="print the information as one JSON object")
    ap.add_argument("--no-devices", action="store_true", help="do not look for CUDA devices")
    ap.add_argument("--version", action="version", version="vmmalloc " + vmmalloc.__version__)
    args = ap.parse_args(argv)
    info = gather_info(devices=not args.no_devices)
    if args.json:
        print(json.dumps(info, indent=1, sort_keys=True))
        return 0 if info.get("library") and info.get("config") is not None else 1
    return print_info(info)


if __name__ == "__main__":
    sys.exit(main())
