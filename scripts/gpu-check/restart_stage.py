#!/usr/bin/env python3
"""The restart stage of scripts/gpu-check.sh: plays systemd for gpumemd.

It owns the control socket (passed as LISTEN_FDS "control", so clients keep
connecting while no daemon runs) and a NOTIFY_SOCKET whose FDSTORE=1 fds it
keeps, as systemd's fd store does. A client fills blocks (gpu_client hold),
the daemon is SIGKILLed, a new one starts with the stored fds
(LISTEN_FDS/LISTEN_FDNAMES) and adopts them, and the client must find every
byte, re-attach and allocate again. Prints one PASS or FAIL line with figures.

usage: restart_stage.py GPUMEMD GPU_CLIENT WORKDIR
"""
import array
import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time


class FakeSystemd:
    def __init__(self, gpumemd, workdir):
        self.gpumemd, self.workdir = gpumemd, workdir
        self.control_path = os.path.join(workdir, "gpu0.sock")
        self.notify_path = os.path.join(workdir, "notify")
        self.config = os.path.join(workdir, "gpumemd.conf")
        self.log = os.path.join(workdir, "gpumemd.log")
        with open(self.config, "w") as f:
            f.write(f"[daemon]\nstate_dir = {workdir}/state\nreattach_grace_ms = 10000\n")
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.control.bind(self.control_path)
        self.control.listen(64)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.notify.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.notify.settimeout(0.05)
        self.store = []  # (name, fd)
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self.stop = False
        self.daemon = None
        self.pump = threading.Thread(target=self.pump_main, daemon=True)
        self.pump.start()

    def pump_main(self):
        space = socket.CMSG_SPACE(64 * 4) + socket.CMSG_SPACE(12)
        while not self.stop:
            try:
                msg, anc, _, _ = self.notify.recvmsg(4096, space)
            except socket.timeout:
                continue
            text = msg.decode(errors="replace")
            fds = array.array("i")
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
            name = fields.get("FDNAME", "stored")
            with self.lock:
                if fields.get("FDSTOREREMOVE") == "1":
                    for n, fd in [x for x in self.store if x[0] == name]:
                        os.close(fd)
                    self.store = [x for x in self.store if x[0] != name]
                if fields.get("FDSTORE") == "1":
                    self.store += [(name, fd) for fd in fds]
                    fds = array.array("i")
            for fd in fds:
                os.close(fd)
            if fields.get("READY") == "1":
                self.ready.set()

    def start(self):
        with self.lock:
            names = ["control"] + [n for n, _ in self.store]
            sources = [self.control.fileno()] + [fd for _, fd in self.store]
            self.ready.clear()
            log = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            pid = os.fork()
            if pid == 0:
                try:
                    # Above the target range first, then into 3.. (dup2 makes them inheritable).
                    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3 + len(sources)) for fd in sources]
                    for i, fd in enumerate(high):
                        os.dup2(fd, 3 + i)
                    os.dup2(log, 2)
                    env = dict(os.environ, LISTEN_FDS=str(len(sources)), LISTEN_PID=str(os.getpid()),
                               LISTEN_FDNAMES=":".join(names), NOTIFY_SOCKET=self.notify_path)
                    os.execve(self.gpumemd, [self.gpumemd, "--backend", "cuda", "--socket", self.control_path,
                                             "--config", self.config, "--metrics-listen", "none", "-v"], env)
                finally:
                    os._exit(127)
            os.close(log)
            self.daemon = pid
        if not self.ready.wait(60):
            raise RuntimeError("no READY=1 from gpumemd (log: %s)" % self.log)

    def kill(self, sig):
        os.kill(self.daemon, sig)
        _, status = os.waitpid(self.daemon, 0)
        self.daemon = None
        return status

    def stored(self):
        with self.lock:
            return len(self.store)

    def close(self):
        if self.daemon:
            self.kill(signal.SIGTERM)
        self.stop = True
        self.pump.join()
        for _, fd in self.store:
            os.close(fd)


def main():
    gpumemd, client, workdir = sys.argv[1:4]
    meet = os.path.join(workdir, "meet")
    os.makedirs(meet, exist_ok=True)
    sd = FakeSystemd(gpumemd, workdir)
    proc = None
    try:
        sd.start()
        proc = subprocess.Popen([client, "hold", sd.control_path, meet], stdout=subprocess.PIPE, text=True)
        for _ in range(1200):
            if os.path.exists(os.path.join(meet, "ready")) or proc.poll() is not None:
                break
            time.sleep(0.1)
        if not os.path.exists(os.path.join(meet, "ready")):
            out = proc.communicate(timeout=10)[0] if proc.poll() is not None else ""
            print("FAIL restart: the client did not fill its blocks: " + out.strip().splitlines()[-1:][0]
                  if out.strip() else "FAIL restart: the client did not fill its blocks")
            return 1
        stored = sd.stored()
        t0 = time.monotonic()
        sd.kill(signal.SIGKILL)
        sd.start()
        restart_ms = (time.monotonic() - t0) * 1000
        open(os.path.join(meet, "go"), "w").close()
        out, _ = proc.communicate(timeout=180)
        last = (out.strip().splitlines() or ["(no output)"])[-1]
        if proc.returncode != 0:
            print(f"FAIL restart: {last} (daemon log: {sd.log})")
            return 1
        print(f"PASS restart: SIGKILL with {stored} fds in the store, a new gpumemd adopted them and was ready "
              f"in {restart_ms:.0f} ms; {last}")
        return 0
    except Exception as e:  # one FAIL line, whatever broke
        print(f"FAIL restart: {e}")
        return 1
    finally:
        if proc and proc.poll() is None:
            proc.kill()
        sd.close()


if __name__ == "__main__":
    sys.exit(main())
