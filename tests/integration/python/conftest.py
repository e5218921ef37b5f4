"""Fixtures of the gpumem Python suite: two real gpumemd processes (host
backend, devices 0 and 1) found through GPUMEM_SOCKET_TEMPLATE, and
gpumemctl to read their figures independently.

The paths come from the environment ctest sets (tests/integration/torch.cmake):
GPUMEMD_BIN, GPUMEMCTL_BIN, GPUMEM_LIBRARY_DIR, GM_SNAPSHOT_CHECK.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

CAPACITY = 512 << 20


class Daemons:
    def __init__(self, root):
        self.root = root
        self.procs = []
        self.sockets = []

    def start(self, device):
        sock = os.path.join(self.root, f"gpu{device}.sock")
        conf = os.path.join(self.root, f"gpumemd{device}.conf")
        with open(conf, "w") as f:
            f.write(f"[daemon]\nstate_dir = {self.root}/state{device}\n")
        log = open(os.path.join(self.root, f"gpumemd{device}.log"), "wb")
        proc = subprocess.Popen(
            [os.environ["GPUMEMD_BIN"], "--backend", "host", "--device", str(device), "--socket", sock,
             "--capacity", str(CAPACITY), "--config", conf, "--metrics-listen", "none", "-v"],
            stderr=log, stdout=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # readiness: the socket accepts a connection
            if proc.poll() is not None:
                raise RuntimeError(f"gpumemd exited with {proc.returncode}; see {self.root}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                    s.connect(sock)
                break
            except OSError:
                time.sleep(0.02)
        else:
            raise RuntimeError(f"gpumemd did not listen on {sock}")
        self.procs.append(proc)
        self.sockets.append(sock)

    def ctl(self, device, *args, check=True):
        """gpumemctl's stdout for a command on a device's daemon."""
        out = subprocess.run([os.environ["GPUMEMCTL_BIN"], "-s", self.sockets[device], *args],
                             capture_output=True, text=True, timeout=60)
        if check and out.returncode != 0:
            raise AssertionError(f"gpumemctl {' '.join(args)}: exit {out.returncode}: {out.stderr}")
        return out.stdout

    def ctl_json(self, device, *args):
        return json.loads(self.ctl(device, *args))

    def stop(self):
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=30) for proc in self.procs]
        assert codes == [0] * len(codes), f"gpumemd exit statuses {codes}"


@pytest.fixture(scope="session")
def daemons():
    root = tempfile.mkdtemp(prefix="gpumem-py-")
    os.chmod(root, 0o755)  # clients of other users reach the sockets too
    d = Daemons(root)
    try:
        d.start(0)
        d.start(1)
        os.environ["GPUMEM_SOCKET_TEMPLATE"] = os.path.join(root, "gpu%d.sock")
        yield d
    finally:
        d.stop()
        shutil.rmtree(root)


@pytest.fixture(scope="session")
def gpumem(daemons):
    """The package, imported once the daemons are up (its sessions connect on first use)."""
    import gpumem as module
    return module


def pytorch_env(extra_path=None):
    """The environment for a child Python that imports gpumem the way this one does."""
    env = dict(os.environ)
    paths = [p for p in (extra_path, env.get("PYTHONPATH")) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env
