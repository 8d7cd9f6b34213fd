#!/usr/bin/env bash
# Installs what building vmmalloc needs (and with --test, what its test suite needs too), from
# Debian's packages. As root it runs apt-get; otherwise it prints the exact command and stops with
# status 1. Idempotent and quiet when all is there.
set -euo pipefail
tests=0
[ "${1:-}" = "--test" ] && tests=1

need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_cmd cmake || need+=(cmake)
have_cmd cc || need+=(gcc)
have_cmd make || need+=(make)
have_cmd pkg-config || need+=(pkg-config)
have_cmd python3 || need+=(python3)
have_cmd gnuplot || need+=(gnuplot-nox)
[ -f /usr/include/jemalloc/jemalloc.h ] || need+=(libjemalloc-dev)
# libunwind.so.8: call stacks of the allocation history unwind ~20x faster with it (optional at run time)
{ command -v ldconfig >/dev/null 2>&1 || [ -x /sbin/ldconfig ]; } &&
    ! { ldconfig -p 2>/dev/null || /sbin/ldconfig -p; } | grep -q 'libunwind\.so\.8 ' && need+=(libunwind8)
if [ $tests -eq 1 ]; then
    have_cmd chromium || need+=(chromium) # headless render check of vmm-viz output
    # the pip install test (tests/python/test_pip_install.c): pip and venv (with ensurepip) of the
    # system's python3, which the tests run (tests/testutil.c: vmm_test_python)
    py=python3
    [ -x /usr/bin/python3 ] && py=/usr/bin/python3
    "$py" -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
    "$py" -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
fi

[ ${#need[@]} -eq 0 ] && exit 0

cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${need[*]}"
if [ "$(id -u)" -ne 0 ]; then
    echo "vmmalloc needs: ${need[*]}. Run as root:" >&2
    echo "  $cmd" >&2
    exit 1
fi
echo "vmmalloc: installing ${need[*]}" >&2
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
