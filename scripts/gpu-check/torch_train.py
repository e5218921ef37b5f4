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

A third child checks the hooks gpumem.torch.use() installs, each a stage:
tensor.record_stream (no early reuse while the side stream runs),
torch.cuda.memory_allocated() and the rest of the memory API,
torch.cuda.empty_cache(), a CUDA graph captured and replayed after eager
allocations, torch.compile(mode="reduce-overhead") (with inductor's CUDA
graph trees off: they need allocator calls a pluggable allocator lacks),
set_per_process_memory_fraction and an out-of-memory that raises
torch.cuda.OutOfMemoryError with gpumemd's diagnosis.

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


def hooks_child(device):
    """The hooks use() installs, each checked on the GPU as a PyTorch program
    would use it; prints one JSON line {stage: [ok, text]}."""
    sys.path.insert(0, os.path.join(REPO, "python"))
    import gpumem
    import gpumem.torch
    gpumem.torch.use(device)
    import torch
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    stages = {}

    def stage(name, fn):
        try:
            ok, text = fn()
        except Exception as exc:  # a stage that raises fails, the others still run
            ok, text = False, f"{type(exc).__name__}: {exc}"
        stages[name] = [bool(ok), text]

    stage("hooks", lambda: (len(gpumem.torch.hooks()) == len(gpumem.torch.HOOKS),
                            f"use() installed {', '.join(gpumem.torch.hooks())}; OOM mode {gpumem.torch.oom_mode()}"))

    def record_stream():
        side = torch.cuda.Stream()
        x = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
        addr = x.data_ptr()
        with torch.cuda.stream(side):
            torch.cuda._sleep(500_000_000)  # the side stream is still busy with x
            x.fill_(1)
        x.record_stream(side)
        del x
        y = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
        early = y.data_ptr() == addr and not side.query()
        torch.cuda.synchronize()
        return not early, f"tensor.record_stream(s): the block is {'re' if early else 'not re'}used while s runs"
    stage("record_stream", record_stream)

    def memory_api():
        a = torch.empty(32 << 20, dtype=torch.uint8, device=dev)
        got = torch.cuda.memory_allocated(dev)
        peak = torch.cuda.max_memory_allocated(dev)
        stats = torch.cuda.memory_stats(dev)
        summary = torch.cuda.memory_summary(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        del a
        return (got >= 32 << 20 and peak >= got and stats["allocated_bytes.all.current"] >= 32 << 20 and summary,
                f"torch.cuda.memory_allocated() {got}, max {peak}, memory_stats, memory_summary, reset_peak")
    stage("memory_api", memory_api)

    def empty_cache():
        t = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        del t
        torch.cuda.synchronize()
        before = gpumem.memory_reserved(device)
        torch.cuda.empty_cache()
        after = gpumem.memory_reserved(device)
        return after < before, f"torch.cuda.empty_cache(): reserved {before} -> {after} bytes"
    stage("empty_cache", empty_cache)

    def graph():
        eager = [torch.randn(1 << 20, device=dev) for _ in range(4)]  # eager blocks first
        static_in = torch.randn(1 << 20, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                static_out = (static_in * 2).sin()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = (static_in * 2).sin()
        del eager
        after = [torch.zeros(1 << 20, device=dev) for _ in range(8)]  # eager allocations after capture
        static_in.copy_(torch.arange(1 << 20, device=dev, dtype=torch.float32))
        g.replay()
        torch.cuda.synchronize()
        want = (static_in * 2).sin()
        clean = all(bool((t == 0).all()) for t in after)
        ok = torch.allclose(static_out, want) and clean
        del g
        return ok, f"torch.cuda.graph capture and replay after eager allocations (eager tensors untouched: {clean})"
    stage("graph", graph)

    def compiled():
        # CUDA graph trees (inductor's default for reduce-overhead) call
        # _cuda_checkPoolLiveAllocations and _cuda_getCheckpointState, which a
        # pluggable allocator does not have in PyTorch 2.11 (pytorch#163257);
        # without them inductor captures through torch.cuda.graph, whose pool
        # hooks use() installs.
        import torch._inductor.config as inductor_config
        trees = inductor_config.triton.cudagraph_trees
        inductor_config.triton.cudagraph_trees = False
        try:
            fn = torch.compile(lambda x: (x * 3).cos() + 1, mode="reduce-overhead")
            x = torch.randn(1 << 16, device=dev)
            for _ in range(4):
                y = fn(x)
            torch.cuda.synchronize()
        finally:
            inductor_config.triton.cudagraph_trees = trees
        return (torch.allclose(y, (x * 3).cos() + 1),
                'torch.compile(mode="reduce-overhead"), cudagraph_trees off, runs and matches eager')
    stage("compile", compiled)

    def fraction():
        torch.cuda.set_per_process_memory_fraction(0.05, dev)
        try:
            torch.empty(int(torch.cuda.get_device_properties(dev).total_memory * 0.1), dtype=torch.uint8, device=dev)
            return False, "set_per_process_memory_fraction(0.05): 10% was allocated"
        except torch.cuda.OutOfMemoryError as exc:
            return "memory fraction" in str(exc), "set_per_process_memory_fraction(0.05) refuses 10%: OutOfMemoryError"
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, dev)
    stage("fraction", fraction)

    def oom():
        try:
            torch.empty(1 << 50, dtype=torch.uint8, device=dev)
            return False, "1 PiB was allocated"
        except torch.cuda.OutOfMemoryError as exc:
            diagnosis = str(gpumem.last_refusal(device))
            return diagnosis in str(exc), f"torch.cuda.OutOfMemoryError with gpumemd's diagnosis: {str(exc)[:120]}"
        except RuntimeError as exc:
            return False, f"RuntimeError, not OutOfMemoryError (oom mode {gpumem.torch.oom_mode()}): {str(exc)[:120]}"
    stage("oom", oom)
    print(json.dumps(stages), flush=True)


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


def run_hooks_child(args, env):
    """The stages of hooks_child, or None and why it gave none."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "hooks", "--device", str(args.device)],
                         capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return None, (out.stderr.strip().splitlines() or [f"exit {out.returncode}, no output"])[-1]
    return json.loads(lines[-1]), None


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
        hooks, why = run_hooks_child(args, env)
        report.stage(hooks is not None, "gpumem.torch.use()'s hooks on the GPU" + (f": {why}" if why else ""))
        for ok, text in (hooks or {}).values():
            report.stage(ok, text)
        if native and ours:
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
    ap.add_argument("--child", choices=("native", "gpumem", "hooks"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "hooks":
        hooks_child(args.device)
    elif args.child:
        child(args.child, args.device, args.steps)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
