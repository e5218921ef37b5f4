"""gpumem.claim() (issue 27): two engine processes started together size
their KV caches from mem_get_info() and claim them without over-committing
the daemon; mem_get_info() counts the claims."""
import os
import subprocess
import sys

from conftest import CAPACITY, pytorch_env

MiB = 1 << 20
BLOCK = 16 * MiB  # above 10 MiB: one segment of its own size each

# One engine: measures, waits at the barrier (a line on stdin), claims 90% of
# what it saw, allocates what it was given in blocks, reports, and holds its
# memory until its stdin closes.
ENGINE = r"""
import sys
import gpumem
BLOCK = %d
free, total = gpumem.mem_get_info()
print(free, flush=True)
sys.stdin.readline()
claimed = gpumem.claim(free // 10 * 9)
print(claimed, flush=True)
lib = gpumem._lib.torch_lib
held, refused = [], 0
for _ in range(claimed // BLOCK):
    ptr = lib.gpumem_torch_alloc(BLOCK, 0, None)
    if ptr:
        held.append(ptr)
    else:
        refused += 1
print(refused, gpumem.mem_get_info()[0], flush=True)
sys.stdin.read()
for ptr in held:
    lib.gpumem_torch_free(ptr, BLOCK, 0, None)
""" % BLOCK


def test_two_engines_claim_without_over_committing(gpumem, daemons):
    engines = [subprocess.Popen([sys.executable, "-c", ENGINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=pytorch_env()) for _ in range(2)]
    try:
        seen = [int(e.stdout.readline()) for e in engines]  # both measured: the barrier opens
        assert seen[0] > 0 and seen[0] == seen[1]
        for e in engines:
            e.stdin.write("go\n")
            e.stdin.flush()
        claimed = [int(e.stdout.readline()) for e in engines]
        assert sum(claimed) <= CAPACITY
        second = 0 if claimed[0] < claimed[1] else 1
        assert claimed[second] < seen[second]
        assert claimed[1 - second] == seen[1 - second] // 10 * 9
        reports = [e.stdout.readline().split() for e in engines]
        assert [int(r[0]) for r in reports] == [0, 0]  # neither allocation refused
        # What is left of the claims is still theirs: mem_get_info offers this
        # process none of it.
        left = sum(c % BLOCK for c in claimed)
        device = daemons.ctl_json(0, "stats", "--json")
        assert device["claimed_bytes"] == left
        assert gpumem.mem_get_info()[0] <= CAPACITY - device["reserved_bytes.all.current"] - left
        tenant = gpumem.get_quota()["tenant"]
        assert daemons.ctl_json(0, "quota", "get", tenant, "--json")[0]["claimed_bytes"] == left
    finally:
        for e in engines:
            e.stdin.close()
            assert e.wait(timeout=60) == 0
    # Their claims lapsed with their sessions (ended as their connections closed).
    assert wait_for(lambda: daemons.ctl_json(0, "stats", "--json")["claimed_bytes"] == 0)


def test_claim_is_mem_get_info_of_its_own(gpumem, daemons):
    free, _ = gpumem.mem_get_info()
    want = min(free, 64 * MiB)
    assert gpumem.claim(want) == want
    try:
        assert gpumem.mem_get_info()[0] == free  # its own claim is free to it
        mine = [c for c in daemons.ctl_json(0, "clients", "--json") if c["pid"] == os.getpid()]
        assert sum(c["claimed_bytes"] for c in mine) == want
        assert gpumem.claim(0) == 0
        assert gpumem.mem_get_info()[0] == free
    finally:
        gpumem.claim(0)


def wait_for(predicate, timeout=10.0):
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
