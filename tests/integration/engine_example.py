#!/usr/bin/env python3
"""The inference-engine example (examples/engine.c, docs/inference.md) against
a real gpumemd with a small capacity: `publish` loads the weights and exits,
`run` drives engines A and B (as two other uids, their own tenants, when this
runs as root), and afterwards the daemon's books hold nothing but the
published object, charged to the publisher's tenant and mapped by nobody
(`gpumemctl shared list`). The daemon's exit status
(0 only when gm_broker_check holds at exit) is checked too.

Usage: engine_example.py GPUMEMD GPUMEMCTL GPUMEM_ENGINE BACKEND
(cuda: the emulated driver comes from $GPUMEM_LIBCUDA and NVML from
$GPUMEM_LIBNVML; every process shares one emulated device through a pool
file in this run's directory, so the daemon verifies give-backs by each
process's figure as on a GPU)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
CAPACITY = 512 * MiB
WEIGHTS_MIB = 64
USERS = ["65534", "65533"]  # nobody, and a uid of no user: two tenants


def wait_listening(proc, path):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"gpumemd exited with {proc.returncode}")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                s.connect(path)
            return
        except OSError:
            time.sleep(0.02)
    sys.exit(f"gpumemd did not listen on {path}")


def run(*args):
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=240)
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    return out


def main():
    gpumemd, gpumemctl, engine, backend = sys.argv[1:5]
    root = tempfile.mkdtemp(prefix="gpumem-engine-")
    os.chmod(root, 0o755)  # the engines' uids reach the socket
    sock = os.path.join(root, "gpu0.sock")
    conf = os.path.join(root, "gpumemd.conf")
    with open(conf, "w") as f:
        f.write(f"[daemon]\nstate_dir = {root}/state\n")
    os.environ["FAKECUDA_POOL"] = os.path.join(root, "fakecuda-pool")  # read by the emulator only
    log = open(os.path.join(root, "gpumemd.log"), "wb")
    daemon = subprocess.Popen([gpumemd, "--backend", backend, "--socket", sock, "--capacity", str(CAPACITY),
                               "--config", conf, "--metrics-listen", "none", "-v"], stderr=log,
                              stdout=subprocess.DEVNULL)
    failures = []
    try:
        wait_listening(daemon, sock)
        publish = run(engine, "-s", sock, "publish", "weights", str(WEIGHTS_MIB))
        if publish.returncode != 0:
            failures.append(f"publish exited {publish.returncode}")
        users = USERS if os.geteuid() == 0 else []
        walk = run(engine, "-s", sock, "run", "weights", *users)
        if walk.returncode != 0:
            failures.append(f"run exited {walk.returncode}")
        for step in ("opened weights", "claimed", "nothing over-committed", "sleep keeping", "grew by", "woke",
                     "every check held"):
            if step not in walk.stdout:
                failures.append(f"run printed no '{step}' line")
        tenants = json.loads(subprocess.run([gpumemctl, "-s", sock, "quota", "list", "--json"], capture_output=True,
                                            text=True, check=True, timeout=60).stdout)
        charged = {t["tenant"]: t["reserved_bytes"] for t in tenants}
        claimed = {t["tenant"]: t["claimed_bytes"] for t in tenants}
        publisher = f"uid:{os.geteuid()}"
        engines = [f"uid:{u}" for u in users]
        print(f"engine_example: charged after the run: {charged}")
        if charged.get(publisher) != WEIGHTS_MIB * MiB:
            failures.append(f"{publisher} (the publisher) is charged {charged.get(publisher)}, not the weights'"
                            f" {WEIGHTS_MIB * MiB} bytes")
        shared = json.loads(subprocess.run([gpumemctl, "-s", sock, "shared", "list", "--json"], capture_output=True,
                                           text=True, check=True, timeout=60).stdout)["objects"]
        print(f"engine_example: shared objects after the run: {shared}")
        if [(o["name"], o["tenant"], o["size"], o["mappers"], o["state"]) for o in shared] != \
                [("weights", publisher, charged.get(publisher), 0, "published")]:
            failures.append("the weights are not the one published object, of the publisher's charge, unmapped")
        for tenant in engines:
            if charged.get(tenant, 0) != 0 or claimed.get(tenant, 0) != 0:
                failures.append(f"{tenant} still holds {charged.get(tenant)} bytes, claims {claimed.get(tenant)}")
    finally:
        daemon.send_signal(signal.SIGTERM)
        status = daemon.wait(timeout=60)
        log.close()
        if status != 0:
            failures.append(f"gpumemd exited {status} (books inconsistent at exit?)")
        if failures:
            sys.stdout.write(open(os.path.join(root, "gpumemd.log"), errors="replace").read()[-4000:])
        shutil.rmtree(root)
    for failure in failures:
        print(f"engine_example: FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
