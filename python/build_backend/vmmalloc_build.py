"""PEP 517 build backend of the vmmalloc Python package (standard library only).

pyproject.toml at the repository root names it (backend-path python/build_backend), so
``pip install .``, ``pip wheel .`` and ``python -m build`` work offline, with or without build
isolation: the backend needs no package from an index (no setuptools, no wheel), only CMake >= 3.20
and a C compiler on PATH, the same as the C build (./tools/deps.sh installs them on Debian).

build_wheel configures the C library with CMake in a temporary directory (Release, tests off),
builds the target ``vmmalloc`` and writes a wheel holding the package python/vmmalloc with
``libvmmalloc.so`` inside it (vmm-viz is ``vmmalloc/_vmm_viz.py``). The wheel is tagged
py3-none-<platform>: the library is loaded with ctypes, so any CPython 3 can use it, but it is
machine code for one platform.

Knobs (environment variables, or pip's ``--config-settings KEY=VALUE``):
  VMMALLOC_CMAKE_ARGS / cmake-args   extra arguments for the CMake configure step (shell words),
                                     e.g. "-DCMAKE_BUILD_TYPE=RelWithDebInfo" or a CUDA toolkit path
  VMMALLOC_BUILD_DIR / build-dir     reuse this CMake build directory instead of a temporary one

Editable installs (PEP 660) are not offered: for development put python/ on PYTHONPATH next to a
CMake build (the package finds build*/libvmmalloc.so in its source tree).
"""

import base64
import csv
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG_DIR = os.path.join(ROOT, "python", "vmmalloc")
NAME = "vmmalloc"
SUMMARY = ("A CUDA caching allocator over expandable virtual-memory segments, with a PyTorch "
           "pluggable-allocator integration")

__all__ = ["get_requires_for_build_wheel", "get_requires_for_build_sdist",
           "prepare_metadata_for_build_wheel", "build_wheel", "build_sdist"]


# ---- metadata ---------------------------------------------------------------------------------------

def version():
    """__version__ of python/vmmalloc/__init__.py, which must equal CMakeLists.txt's project VERSION."""
    with open(os.path.join(PKG_DIR, "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if not m:
        raise RuntimeError("vmmalloc build: no __version__ in python/vmmalloc/__init__.py")
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        c = re.search(r"project\(vmmalloc VERSION ([0-9.]+)", f.read())
    if c and c.group(1) != m.group(1):
        raise RuntimeError("vmmalloc build: python/vmmalloc/__init__.py says %s, CMakeLists.txt %s"
                           % (m.group(1), c.group(1)))
    return m.group(1)


def metadata_text():
    lines = [
        "Metadata-Version: 2.1",
        "Name: " + NAME,
        "Version: " + version(),
        "Summary: " + SUMMARY,
        "Requires-Python: >=3.8",
        "Classifier: Programming Language :: Python :: 3",
        "Classifier: Programming Language :: C",
        "Classifier: Operating System :: POSIX :: Linux",
        "Description-Content-Type: text/markdown",
        "",
    ]
    readme = os.path.join(ROOT, "README.md")
    body = ""
    if os.path.exists(readme):
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n" + body


def wheel_tag():
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "py3-none-" + plat


def dist_info_name():
    return "%s-%s.dist-info" % (NAME, version())


def wheel_text():
    return ("Wheel-Version: 1.0\nGenerator: vmmalloc_build %s\nRoot-Is-Purelib: false\nTag: %s\n"
            % (version(), wheel_tag()))


ENTRY_POINTS = """[console_scripts]
vmmalloc = vmmalloc.__main__:main
vmm-viz = vmmalloc.__main__:viz_main
"""


# ---- the C library ----------------------------------------------------------------------------------

def _setting(config_settings, key, env):
    if config_settings and config_settings.get(key):
        return config_settings[key]
    return os.environ.get(env, "")


def build_library(config_settings=None):
    """Configure and build libvmmalloc.so with CMake; returns (path of the real file, tempdir or
    None)."""
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("vmmalloc build: cmake (>= 3.20) is not on PATH; on Debian run "
                           "./tools/deps.sh (or apt-get install cmake gcc make)")
    build_dir = _setting(config_settings, "build-dir", "VMMALLOC_BUILD_DIR")
    tmp = None
    if not build_dir:
        tmp = tempfile.mkdtemp(prefix="vmmalloc-cmake-")
        build_dir = tmp
    args = [cmake, "-S", ROOT, "-B", build_dir, "-DVMM_BUILD_TESTS=OFF", "-DCMAKE_BUILD_TYPE=Release"]
    args += shlex.split(_setting(config_settings, "cmake-args", "VMMALLOC_CMAKE_ARGS"))
    jobs = str(os.cpu_count() or 2)
    try:
        _run(args)
        _run([cmake, "--build", build_dir, "--target", "vmmalloc", "-j", jobs])
    except Exception:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    lib = os.path.join(build_dir, "libvmmalloc.so")
    if not os.path.exists(lib):
        raise RuntimeError("vmmalloc build: CMake did not produce %s" % lib)
    return os.path.realpath(lib), tmp


def _run(args):
    print("vmmalloc build: " + " ".join(shlex.quote(a) for a in args), file=sys.stderr)
    r = subprocess.run(args, stdout=sys.stderr, stderr=sys.stderr)
    if r.returncode:
        raise RuntimeError("vmmalloc build: command failed (status %d): %s" % (r.returncode, " ".join(args)))


# ---- wheel writing ----------------------------------------------------------------------------------

class _Wheel:
    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.records = []

    def add(self, arcname, data, mode=0o644):
        if isinstance(data, str):
            data = data.encode("utf-8")
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (mode | 0o100000) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.records.append((arcname, "sha256=" + digest, str(len(data))))

    def add_file(self, arcname, path, mode=0o644):
        with open(path, "rb") as f:
            self.add(arcname, f.read(), mode)

    def close(self, record_name):
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        for r in self.records:
            w.writerow(r)
        w.writerow((record_name, "", ""))
        info = zipfile.ZipInfo(record_name, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o644 | 0o100000) << 16
        self.zip.writestr(info, out.getvalue())
        self.zip.close()


def package_files():
    """The package's Python sources: python/vmmalloc/*.py (no caches)."""
    return sorted(n for n in os.listdir(PKG_DIR) if n.endswith(".py"))


def _write_dist_info(add, di):
    add(di + "/METADATA", metadata_text())
    add(di + "/WHEEL", wheel_text())
    add(di + "/entry_points.txt", ENTRY_POINTS)
    add(di + "/top_level.txt", NAME + "\n")


# ---- PEP 517 hooks ----------------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    di = dist_info_name()
    d = os.path.join(metadata_directory, di)
    os.makedirs(d, exist_ok=True)

    def add(name, text):
        with open(os.path.join(metadata_directory, name), "w", encoding="utf-8") as f:
            f.write(text)
    _write_dist_info(add, di)
    return di


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    ver = version()
    lib, tmp = build_library(config_settings)
    try:
        name = "%s-%s-%s.whl" % (NAME, ver, wheel_tag())
        path = os.path.join(wheel_directory, name)
        w = _Wheel(path)
        for f in package_files():
            w.add_file("vmmalloc/" + f, os.path.join(PKG_DIR, f))
        w.add_file("vmmalloc/libvmmalloc.so", lib, 0o755)
        for src in sorted(os.listdir(os.path.join(PKG_DIR, "csrc"))):  # the C++ shims, built at run time
            if src.endswith(".cpp"):
                w.add_file("vmmalloc/csrc/" + src, os.path.join(PKG_DIR, "csrc", src))
        di = dist_info_name()
        _write_dist_info(w.add, di)
        w.close(di + "/RECORD")
        return name
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


# What an sdist needs to build the library and the package (tests, bench and stress are not built).
SDIST_TREES = ("cmake", "include", "src", "python/vmmalloc", "python/build_backend")
SDIST_FILES = ("pyproject.toml", "CMakeLists.txt", "README.md")


def build_sdist(sdist_directory, config_settings=None):
    ver = version()
    base = "%s-%s" % (NAME, ver)
    name = base + ".tar.gz"
    path = os.path.join(sdist_directory, name)

    def keep(rel):
        return "__pycache__" not in rel and not rel.endswith(".pyc")
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        def add(rel):
            info = tar.gettarinfo(os.path.join(ROOT, rel), arcname=base + "/" + rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 1577836800
            with open(os.path.join(ROOT, rel), "rb") as f:
                tar.addfile(info, f)
        for rel in SDIST_FILES:
            add(rel)
        for tree in SDIST_TREES:
            for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, tree)):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for fn in sorted(filenames):
                    rel = os.path.relpath(os.path.join(dirpath, fn), ROOT)
                    if keep(rel):
                        add(rel)
        pkg_info = metadata_text().encode("utf-8")
        info = tarfile.TarInfo(base + "/PKG-INFO")
        info.size = len(pkg_info)
        info.mtime = 1577836800
        tar.addfile(info, io.BytesIO(pkg_info))
    return name
