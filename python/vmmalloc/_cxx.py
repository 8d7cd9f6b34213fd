"""Building the package's small C++ shims (csrc/) once, cached in ~/.cache/vmmalloc.

With torch importable, torch.utils.cpp_extension builds them with torch's own flags and headers
(VMM_WITH_C10 defined, so a shim may use c10's headers); the cache key then includes
torch.__version__, since such a build holds that release's C++ ABI. Otherwise the plain C++
compiler on PATH ($CXX, c++, g++, clang++) builds the header-free variant.
"""

import hashlib
import os
import shutil
import subprocess
import sys

CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")


def cache_dir():
    d = os.environ.get("VMMALLOC_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "vmmalloc")
    os.makedirs(d, exist_ok=True)
    return d


def _key(source, extra):
    h = hashlib.sha256()
    with open(source, "rb") as f:
        h.update(f.read())
    h.update(extra.encode())
    return h.hexdigest()[:16]


def compile_plain(source, out, defines=()):
    """source -> shared library `out` with the C++ compiler on PATH. Raises RuntimeError."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise RuntimeError("no C++ compiler found ($CXX, c++, g++, clang++)")
    tmp = out + ".%d.tmp" % os.getpid()
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden"]
    cmd += ["-D" + d for d in defines] + [source, "-o", tmp]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (" ".join(cmd), p.stdout))
    os.replace(tmp, out)
    return out


def _compile_torch(source, name, verbose):
    from torch.utils import cpp_extension  # noqa: PLC0415
    path = cpp_extension.load(name=name, sources=[source], is_python_module=False,
                              extra_cflags=["-O2", "-std=c++17", "-DVMM_WITH_C10"], verbose=verbose)
    if isinstance(path, str) and os.path.isfile(path):
        return path
    build_dir = cpp_extension._get_build_directory(name, verbose)  # noqa: SLF001 (older torch returns None)
    path = os.path.join(build_dir, name + ".so")
    if not os.path.isfile(path):
        raise RuntimeError("torch.utils.cpp_extension built %s but no %s.so is there" % (name, name))
    return path


def build(filename, use_torch, verbose=False):
    """(path, with_torch) of csrc/<filename> built as a shared library. use_torch: try
    torch.utils.cpp_extension first (torch must be imported already). Raises RuntimeError with
    every attempt's failure when none worked."""
    source = os.path.join(CSRC, filename)
    stem = os.path.splitext(filename)[0]
    errors = []
    torch = sys.modules.get("torch") if use_torch else None
    if torch is not None and getattr(torch, "__version__", None):
        key = _key(source, "torch-" + str(torch.__version__))
        cached = os.path.join(cache_dir(), "vmmalloc_%s-torch-%s.so" % (stem, key))
        if os.path.isfile(cached):
            return cached, True
        try:
            built = _compile_torch(source, "vmmalloc_%s_%s" % (stem, key), verbose)
            shutil.copyfile(built, cached + ".tmp")
            os.replace(cached + ".tmp", cached)
            return cached, True
        except Exception as e:  # noqa: BLE001 (any build failure: try the plain compiler)
            errors.append("torch.utils.cpp_extension: %s" % e)
    key = _key(source, "plain")
    cached = os.path.join(cache_dir(), "vmmalloc_%s-%s.so" % (stem, key))
    if os.path.isfile(cached):
        return cached, False
    try:
        return compile_plain(source, cached), False
    except (RuntimeError, OSError) as e:
        errors.append(str(e))
    raise RuntimeError("vmmalloc: cannot build %s: %s" % (source, "; ".join(errors)))
