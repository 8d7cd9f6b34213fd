#!/bin/sh
# Packaging test: install a vmmalloc build into a temporary prefix, then build and run a tiny
# consumer program against it three ways: find_package with vmmalloc::vmmalloc (shared) and
# vmmalloc::vmmalloc_static, and pkg-config. Also checks what the installed shared library
# exports (vmm_* only) and that it does not depend on libcuda at link time.
#
# Usage: run_consumer_test.sh BUILD_DIR      (CMAKE=/path/to/cmake to pick the cmake; default: PATH)
# Exit 0 when everything passes, 1 on a failure (the failing step is printed).
set -eu

build=${1:?usage: run_consumer_test.sh BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
cmake=${CMAKE:-cmake}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmm_consumer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

fail() { echo "run_consumer_test: FAILED: $*" >&2; exit 1; }
step() { echo "run_consumer_test: $*"; }

cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
[ -f "$build/CMakeCache.txt" ] || fail "$build is not a CMake build directory"
cc=$(cache_value CMAKE_C_COMPILER)
generator=$(cache_value CMAKE_GENERATOR)
# A sanitizer build's library needs the sanitizer runtime first in the program: build the consumer
# with the same flags.
case "$(cache_value VMM_SANITIZE)" in
    address) san="-fsanitize=address,undefined" ;;
    thread) san="-fsanitize=thread" ;;
    *) san="" ;;
esac

prefix="$tmp/prefix"
step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "install"; }

lib=$(find "$prefix" -name 'libvmmalloc.so.*' -type f | head -n 1)
[ -n "$lib" ] || fail "no libvmmalloc.so.* installed"
libdir=$(dirname "$lib")
for f in "$prefix/include/vmmalloc.h" "$libdir/libvmmalloc.a" "$libdir/libvmmalloc.so" \
         "$libdir/cmake/vmmalloc/vmmallocConfig.cmake" "$libdir/pkgconfig/vmmalloc.pc"; do
    [ -e "$f" ] || fail "not installed: $f"
done

step "checking the shared library's dependencies and exports"
if readelf -d "$lib" | grep -q 'NEEDED.*libcuda'; then
    fail "$lib depends on libcuda at link time (it must dlopen it)"
fi
# Every exported function or object is public API (vmm_*); everything else is hidden.
others=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBR]$/ && $3 !~ /^vmm_/ { print $3 }')
[ -z "$others" ] || fail "symbols exported without the vmm_ prefix: $others"

try_create=OFF
if nm -D --defined-only "$lib" | grep -q ' T vmm_create$'; then
    try_create=ON
else
    step "note: the library does not export vmm_create yet; the consumer will not call it"
fi

step "building the consumer with find_package(vmmalloc)"
"$cmake" -S "$here" -B "$tmp/cmake-build" -G "$generator" -DCMAKE_C_COMPILER="$cc" \
      -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" \
      -DCONSUMER_TRY_CREATE=$try_create >"$tmp/configure.log" 2>&1 ||
    { cat "$tmp/configure.log"; fail "configure the consumer"; }
"$cmake" --build "$tmp/cmake-build" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "build the consumer"; }

# The CMake-built programs carry the library's directory as RPATH: no environment needed.
step "running consumer_shared (vmmalloc::vmmalloc)"
"$tmp/cmake-build/consumer_shared" || fail "consumer_shared"
step "running consumer_static (vmmalloc::vmmalloc_static)"
if ldd "$tmp/cmake-build/consumer_static" | grep -q libvmmalloc; then
    fail "consumer_static links libvmmalloc.so"
fi
"$tmp/cmake-build/consumer_static" || fail "consumer_static"

step "building the consumer with pkg-config"
command -v pkg-config >/dev/null 2>&1 || fail "pkg-config is not installed (Debian: apt-get install pkgconf)"
PKG_CONFIG_PATH="$libdir/pkgconfig"
export PKG_CONFIG_PATH
flags=$(pkg-config --cflags --libs vmmalloc) || fail "pkg-config --cflags --libs vmmalloc"
step "pkg-config --cflags --libs vmmalloc: $flags"
define=""
[ "$try_create" = ON ] && define="-DCONSUMER_TRY_CREATE"
# shellcheck disable=SC2086 # flags are words
"$cc" -std=c11 $san $define -o "$tmp/consumer_pkgconfig" "$here/main.c" $flags ||
    fail "compile and link with pkg-config flags"
step "running consumer_pkgconfig"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/consumer_pkgconfig" ||
    fail "consumer_pkgconfig"

step "all passed"
