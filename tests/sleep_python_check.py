"""vmmalloc's sleep / wake and tags from Python (python/vmmalloc/sleepwake.py), without PyTorch:
run by tests/python/test_sleep_python.c with VMMALLOC_LIB at the built library and VMMALLOC_CONF selecting
the simulated driver (backed: its device memory is host memory, so ctypes can write and read it).
Exits 0 when every check passes, 1 otherwise (each failure printed)."""

import ctypes
import os
import sys

ROOT = os.environ.get("VMM_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import vmmalloc  # noqa: E402
from vmmalloc import sleepwake as sw  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


lib = vmmalloc.load()
MiB = 1 << 20


def malloc(n):
    p = lib.vmm_torch_malloc(n, 0, None)
    check(p, "vmm_torch_malloc(%d): %s" % (n, vmmalloc.last_error()))
    return p


def pattern(n, seed):
    return bytes((seed + i * 7) & 0xFF for i in range(256)) * (n // 256)


# tags
check(sw.get_tag() == "", "untagged at first")
with sw.use_tag("weights"):
    check(sw.get_tag() == "weights", "use_tag sets the tag")
    w = malloc(8 * MiB)
    w2 = malloc(4096)
check(sw.get_tag() == "", "use_tag restores the tag")
with sw.use_tag("kv_cache"):
    k = malloc(4 * MiB)
u = malloc(2 * MiB)
check(sw.tag_of(w) == "weights" and sw.tag_of(k) == "kv_cache" and sw.tag_of(u) == "", "tag_of")

data_w, data_k, data_u = pattern(8 * MiB, 1), pattern(4 * MiB, 2), pattern(2 * MiB, 3)
ctypes.memmove(w, data_w, len(data_w))
ctypes.memmove(k, data_k, len(data_k))
ctypes.memmove(u, data_u, len(data_u))

usable = lib.vmm_usable_size if hasattr(lib, "vmm_usable_size") else None
stats0 = vmmalloc.memory_stats()
check("sleeping_bytes.current" in stats0 and stats0["sleeping_bytes.current"] == 0, "sleeping_bytes key")

# sleep with backup, discard, staged wake
sw.sleep(tags="weights", backup=True)
check(sw.is_asleep("weights") and not sw.is_asleep("kv_cache"), "weights asleep")
st = vmmalloc.memory_stats()
check(st["sleeping_bytes.current"] >= 8 * MiB + 4096, "sleeping bytes counted: %d" % st["sleeping_bytes.current"])
check(st["reserved_bytes.all.current"] < stats0["reserved_bytes.all.current"], "memory released")
with sw.use_tag("weights"):
    check(lib.vmm_torch_malloc(1000, 0, None) is None, "no allocation under a sleeping tag")
    check("asleep" in vmmalloc.last_error(), "the message says why: " + vmmalloc.last_error())
sw.sleep(tags=["kv_cache"], backup=False)
check(ctypes.string_at(u, len(data_u)) == data_u, "untagged memory untouched")
sw.wake(tags="weights")
check(ctypes.string_at(w, len(data_w)) == data_w, "weights restored at the same address")
check(sw.is_asleep("kv_cache"), "kv_cache still asleep after a staged wake")
sw.wake()
check(not sw.is_asleep("kv_cache"), "kv_cache awake")
ctypes.memmove(k, data_k, len(data_k))  # discarded: write it again

# the context manager, keep_host
with sw.sleeping(tags=["weights", "kv_cache"], keep_host=True):
    check(sw.is_asleep("weights") and sw.is_asleep("kv_cache"), "asleep inside sleeping()")
check(not sw.is_asleep("weights"), "awake after sleeping()")
check(ctypes.string_at(w, len(data_w)) == data_w and ctypes.string_at(k, len(data_k)) == data_k,
      "both restored after sleeping()")
check(vmmalloc.memory_stats()["backup_bytes"] > 0, "keep_host keeps the host buffer")

# errors
try:
    sw.sleep(tags="nope")
    check(False, "an unknown tag raises")
except vmmalloc.VmmError as e:
    check(e.status == "EINVAL" and "nope" in str(e), "EINVAL naming the tag: %s" % e)
try:
    sw.set_tag(3)
    check(False, "a non-str tag raises TypeError")
except TypeError:
    pass

# the package-level names, once __init__.py re-exports them
if hasattr(vmmalloc, "wake"):
    vmmalloc.sleep(tags="weights")
    vmmalloc.wake(tags="weights")
    check(ctypes.string_at(w, len(data_w)) == data_w, "vmmalloc.sleep / vmmalloc.wake")

for p in (w, w2, k, u):
    lib.vmm_torch_free(p, 0, 0, None)
check(vmmalloc.memory_stats()["allocated_bytes.all.current"] == 0, "all freed")
sys.exit(1 if failures else 0)
