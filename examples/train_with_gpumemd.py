#!/usr/bin/env python3
"""Trains a small model with gpumemd as PyTorch's CUDA allocator.

Needs PyTorch 2.x with CUDA, a running gpumemd for the GPU (systemctl start
gpumemd@0, or gpumemd --backend cuda) and the gpumem package (installed with
gpumemd, or PYTHONPATH=python GPUMEM_LIBRARY_DIR=build/lib from a build).

    python3 examples/train_with_gpumemd.py [--steps 50] [--snapshot train.pickle]

The snapshot (memory history needs admin rights on the daemon) opens at
https://pytorch.org/memory_viz, as one of PyTorch's own does.
"""
import argparse

import gpumem
import gpumem.torch

gpumem.torch.use()  # first: PyTorch takes its allocator before the first CUDA tensor

import torch  # noqa: E402 (after use(), on purpose)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--snapshot", help="write a memory snapshot of the run here")
    args = ap.parse_args()

    if args.snapshot:
        gpumem._record_memory_history(max_entries=100000)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")
    y = torch.randn(256, 1024, device="cuda")
    for step in range(args.steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}  allocated {gpumem.memory_allocated() >> 20} MiB  "
                  f"reserved {gpumem.memory_reserved() >> 20} MiB")

    print(gpumem.memory_summary(abbreviated=True))
    for client in gpumem.list_clients():
        print(f"session {client['session_id']} pid {client['pid']} tenant {client['tenant']}: "
              f"{client['allocated_bytes'] >> 20} MiB allocated, {client['cached_bytes'] >> 20} MiB cached")
    refusal = gpumem.last_refusal()
    if refusal:
        print(f"refused {refusal.count} time(s); last: {refusal}")
    if args.snapshot:
        gpumem._dump_snapshot(args.snapshot)
        gpumem._record_memory_history(None)
        print(f"snapshot written to {args.snapshot}")


if __name__ == "__main__":
    main()
