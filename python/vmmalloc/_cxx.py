"""Building the package's small C++ shims (csrc/) once, cached in ~/.cache/vmmalloc.

The C++ compiler on PATH ($CXX, c++, g++, clang++) builds them. With torch imported, first with
torch's headers and libc10 (the include and library paths torch.utils.cpp_extension reports, torch's
C++ ABI flag, VMM_WITH_C10 defined; no ninja needed); the cache key then includes torch.__version__,
since such a build holds that release's C++ ABI. Otherwise, or when that fails, the header-free
variant.
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


def compile_plain(source, out, flags=(), link=()):
    """source -> shared library `out` with the C++ compiler on PATH. Raises RuntimeError."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise RuntimeError("no C++ compiler found ($CXX, c++, g++, clang++)")
    tmp = out + ".%d.tmp" % os.getpid()
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden"]
    cmd += list(flags) + [source, "-o", tmp] + list(link)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (" ".join(cmd), p.stdout[-4000:]))
    os.replace(tmp, out)
    return out


def torch_flags(torch):
    """(compile flags, link flags) for code using c10's headers and libc10, as torch.utils.cpp_extension
    would give them (its include and library paths, torch's C++ ABI), without needing ninja."""
    from torch.utils import cpp_extension  # noqa: PLC0415
    inc = [p for p in cpp_extension.include_paths() if os.path.isdir(p)]
    libs = [p for p in cpp_extension.library_paths() if os.path.isdir(p)]
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))  # noqa: SLF001
    flags = ["-DVMM_WITH_C10", "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi] + ["-I" + p for p in inc]
    link = ["-L" + p for p in libs] + ["-Wl,-rpath," + p for p in libs] + ["-lc10"]
    return flags, link


def build(filename, use_torch, verbose=False):
    """(path, with_torch) of csrc/<filename> built as a shared library. use_torch: first with torch's
    headers and libc10 (torch must be imported already; torch_flags), cached per torch version.
    Then the header-free build. Raises RuntimeError with every attempt's failure when none worked."""
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
            flags, link = torch_flags(torch)
            if verbose:
                print("vmmalloc: building %s with torch %s's headers" % (filename, torch.__version__), file=sys.stderr)
            return compile_plain(source, cached, flags, link), True
        except Exception as e:  # noqa: BLE001 (any failure: try the header-free build)
            errors.append("with torch's headers: %s" % e)
    key = _key(source, "plain")
    cached = os.path.join(cache_dir(), "vmmalloc_%s-%s.so" % (stem, key))
    if os.path.isfile(cached):
        return cached, False
    try:
        return compile_plain(source, cached), False
    except (RuntimeError, OSError) as e:
        errors.append(str(e))
    raise RuntimeError("vmmalloc: cannot build %s: %s" % (source, "; ".join(errors)))
