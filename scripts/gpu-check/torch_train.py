#!/usr/bin/env python3
"""torch_train.py: a few training steps of a small model with gpumemd as
PyTorch's CUDA allocator and with PyTorch's own, on a real GPU.

    python3 scripts/gpu-check/torch_train.py [--build BUILD] [--socket SOCK] [--device N] [--steps N]

With --socket (or $GPUMEM_SOCKET, as scripts/gpu-check.sh passes it) it uses
that running gpumemd, the one of GPU N (--device, else $GPUMEM_CHECK_DEVICE,
else 0); without, it starts `gpumemd --backend cuda` of BUILD (a build
directory: daemon/gpumemd, lib/libgpumem*.so) on a temporary socket and
stops it at the end. libgpumem comes from BUILD/lib, else
$GPUMEM_LIBRARY_DIR, else where it was installed. Each run is a subprocess of
its own, since PyTorch takes its allocator before the first CUDA tensor.

Prints one PASS/FAIL line per stage, the step times (median and spread of the
timed steps, after warm-up) and the memory figures of both runs, and
"RESULT: PASS" or "RESULT: FAIL". Step times are reported, never judged.
Exits 0 with a last line "SKIP ..." when PyTorch (2.0 or later) or CUDA is
absent; 1 when a stage failed.
"""
import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WARMUP = 3


def skip(reason):
    print(f"SKIP  torch_train: {reason}")
    sys.exit(0)


# ---- the child: one training run ----

def build_model(torch):
    """A small transformer language model: embeddings, two encoder layers, a head."""
    nn = torch.nn

    class TinyLM(nn.Module):
        def __init__(self, vocab=4096, dim=256, heads=4, layers=2):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers)
            self.head = nn.Linear(dim, vocab)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)))
    return TinyLM()


def train_step(torch, model, opt, tokens):
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def child(mode, device, steps):
    """Trains `steps` steps and prints one JSON line of results."""
    result = {"mode": mode}
    if mode == "gpumem":
        sys.path.insert(0, os.path.join(REPO, "python"))
        import gpumem
        import gpumem.torch
        gpumem.torch.use(device)  # before torch touches CUDA
    import torch
    torch.manual_seed(0)
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    model = build_model(torch).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cpu").manual_seed(1)
    batches = [torch.randint(0, 4096, (16, 129), generator=gen).to(dev) for _ in range(4)]
    times, losses = [], []
    for i in range(steps):
        if mode == "gpumem" and i == steps - 1:
            gpumem._record_memory_history(max_entries=100000)  # the last step, with Python frames
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = train_step(torch, model, opt, batches[i % len(batches)])
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    timed = times[WARMUP:] or times
    result["step_ms_median"] = statistics.median(timed) * 1e3
    result["step_ms_min"] = min(timed) * 1e3
    result["step_ms_max"] = max(timed) * 1e3
    result["losses"] = losses
    result["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    if mode == "native":
        result["max_allocated"] = torch.cuda.max_memory_allocated(dev)
        result["reserved"] = torch.cuda.memory_reserved(dev)
        result["allocations"] = torch.cuda.memory_stats(dev)["allocation.all.allocated"]
    else:
        stats = gpumem.memory_stats(device)
        result["max_allocated"] = stats["allocated_bytes.all.peak"]
        result["reserved"] = stats["reserved_bytes.all.current"]
        result["allocations"] = stats["allocation.all.allocated"]
        result["summary_lines"] = len(gpumem.memory_summary(device).splitlines())
        snap = gpumem._snapshot(device)
        gpumem._record_memory_history(None)
        allocs = [e for e in snap["device_traces"][-1] if e["action"] == "alloc"]
        names = {f["name"] for e in allocs for f in e.get("frames", [])}
        result["traced_allocs"] = len(allocs)
        result["frames_name_train_step"] = "train_step" in names
        try:  # PyTorch's own readers of a snapshot (none of them needs the network)
            from torch.cuda import _memory_viz
            result["memory_viz_bytes"] = sum(len(getattr(_memory_viz, fn)(snap))
                                             for fn in ("segsum", "trace", "trace_plot") if hasattr(_memory_viz, fn))
        except Exception as exc:  # reported as a stage failure by the parent
            result["memory_viz_error"] = repr(exc)
        refusal = gpumem.last_refusal(device)
        result["refusal"] = str(refusal) if refusal else None
        torch.cuda.synchronize()
        del model, opt, batches, loss
        result["reserved_before_empty_cache"] = gpumem.memory_reserved(device)
        gpumem.empty_cache(device)
        result["reserved_after_empty_cache"] = gpumem.memory_reserved(device)
    print(json.dumps(result), flush=True)


# ---- the parent: stages ----

class Report:
    def __init__(self):
        self.failed = False

    def stage(self, ok, text):
        print(f"{'PASS' if ok else 'FAIL'}  {text}", flush=True)
        self.failed |= not ok


def start_daemon(build, device, work):
    sock = os.path.join(work, f"gpu{device}.sock")
    log = open(os.path.join(work, "gpumemd.log"), "wb")
    proc = subprocess.Popen([os.path.join(build, "daemon", "gpumemd"), "--backend", "cuda", "--device", str(device),
                             "--socket", sock, "--config", "/dev/null", "--metrics-listen", "none"],
                            stderr=log, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None and not os.path.exists(sock):
        time.sleep(0.05)
    return proc, sock


def run_child(mode, args, env):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, "--device", str(args.device),
                          "--steps", str(args.steps)], capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return None, (out.stderr.strip().splitlines() or ["no output"])[-1]
    return json.loads(lines[-1]), None


def parent(args):
    try:
        import torch
    except ImportError:
        skip("PyTorch is not installed")
    major = int(torch.__version__.split(".")[0])
    if major < 2 or not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        skip(f"PyTorch {torch.__version__} has no pluggable CUDA allocator (2.0 or later needed)")
    if not torch.cuda.is_available():
        skip("CUDA is not available")
    if not args.socket and not args.build:
        print("FAIL  torch_train: give --socket (a running gpumemd) or --build DIR (to start one)")
        return 1
    report = Report()
    work = tempfile.mkdtemp(prefix="gpumem-torch-train-")
    proc, sock = None, args.socket
    if not sock:
        proc, sock = start_daemon(args.build, args.device, work)
    report.stage(os.path.exists(sock), f"gpumemd for cuda:{args.device} at {sock}")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.build:
        env["GPUMEM_LIBRARY_DIR"] = os.path.join(args.build, "lib")
    name = os.path.basename(sock)
    if name == f"gpu{args.device}.sock":
        env["GPUMEM_SOCKET_TEMPLATE"] = os.path.join(os.path.dirname(sock), "gpu%d.sock")
    else:
        env["GPUMEM_SOCKET"] = sock
    try:
        native, why = run_child("native", args, env)
        report.stage(native is not None, f"PyTorch's own allocator trains {args.steps} steps" + (f": {why}" if why else ""))
        ours, why = run_child("gpumem", args, env)
        report.stage(ours is not None, f"gpumemd's allocator trains {args.steps} steps" + (f": {why}" if why else ""))
        if native and ours:
            finite = all(math.isfinite(x) for x in ours["losses"])
            close = all(math.isclose(a, b, rel_tol=1e-2, abs_tol=1e-3) for a, b in zip(ours["losses"], native["losses"]))
            report.stage(finite and close, f"same losses (first {native['losses'][0]:.4f}, last native "
                         f"{native['losses'][-1]:.4f}, gpumemd {ours['losses'][-1]:.4f})")
            report.stage(ours["allocations"] > 0 and ours["max_allocated"] >= ours["param_bytes"],
                         f"tensors came from gpumemd ({ours['allocations']} allocations, peak "
                         f"{ours['max_allocated']} bytes >= parameters {ours['param_bytes']})")
            report.stage(ours["summary_lines"] > 10, "gpumem.memory_summary() of the session")
            report.stage(ours["traced_allocs"] > 0 and ours["frames_name_train_step"],
                         f"snapshot of the last step: {ours['traced_allocs']} traced allocations with Python frames")
            report.stage("memory_viz_bytes" in ours,
                         "torch.cuda._memory_viz renders the snapshot" + (
                             f": {ours.get('memory_viz_error')}" if "memory_viz_error" in ours else ""))
            report.stage(ours["refusal"] is None, f"no refusal ({ours['refusal']})")
            report.stage(ours["reserved_after_empty_cache"] < ours["reserved_before_empty_cache"],
                         f"gpumem.empty_cache() gives back cached memory ({ours['reserved_before_empty_cache']} -> "
                         f"{ours['reserved_after_empty_cache']} bytes)")
            example = os.path.join(REPO, "examples", "train_with_gpumemd.py")
            snap = os.path.join(work, "example.pickle")
            out = subprocess.run([sys.executable, example, "--steps", "5", "--snapshot", snap], capture_output=True,
                                 text=True, timeout=300,
                                 # The example uses the current device: make it GPU N (found by its UUID).
                                 env=dict(env, PYTHONPATH=os.path.join(REPO, "python"),
                                          CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES",
                                                                              str(args.device))))
            check = subprocess.run([sys.executable, os.path.join(REPO, "tests", "snapshot_check.py"), snap],
                                   capture_output=True, text=True) if out.returncode == 0 else None
            report.stage(out.returncode == 0 and check.returncode == 0,
                         "examples/train_with_gpumemd.py trains and writes a snapshot that passes snapshot_check.py"
                         + ("" if out.returncode == 0 else f": {(out.stderr.strip().splitlines() or ['?'])[-1]}")
                         + ("" if not check or check.returncode == 0 else f": {check.stderr.strip()}"))
            print()
            print(f"step time (ms, median [min..max] of {args.steps - WARMUP} steps after {WARMUP} warm-up):")
            for r in (native, ours):
                print(f"  {r['mode']:7s} {r['step_ms_median']:8.3f} [{r['step_ms_min']:.3f}..{r['step_ms_max']:.3f}]")
            print(f"  ratio gpumemd/native {ours['step_ms_median'] / native['step_ms_median']:.3f}")
            print("memory (bytes):           native       gpumemd")
            for key in ("max_allocated", "reserved", "allocations"):
                print(f"  {key:20s} {native[key]:12d} {ours[key]:12d}")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            report.stage(proc.wait(timeout=30) == 0, "gpumemd exits cleanly")
    print("RESULT: " + ("FAIL" if report.failed else "PASS"))
    return 1 if report.failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.environ.get("GPUMEM_BUILD"))
    ap.add_argument("--socket", default=os.environ.get("GPUMEM_SOCKET"))
    ap.add_argument("--device", type=int, default=int(os.environ.get("GPUMEM_CHECK_DEVICE", "0")))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--child", choices=("native", "gpumem"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.device, args.steps)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
