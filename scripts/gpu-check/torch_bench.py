#!/usr/bin/env python3
"""PyTorch's own caching allocator, timed as gpu_client bench times gpumemd:
median ns of torch.empty(size) + del (a cached block after the first) for the
same sizes, medians of 7 rounds of 200. Prints "SIZE: NS ns" per size."""
import statistics
import time

import torch

SIZES = [4096, 1 << 20, 64 << 20]
ROUNDS, OPS = 7, 200

torch.cuda.init()
for size in SIZES:
    torch.empty(size, dtype=torch.uint8, device="cuda")  # warm: the block is cached
    medians = []
    for _ in range(ROUNDS):
        times = []
        for _ in range(OPS):
            t0 = time.perf_counter_ns()
            x = torch.empty(size, dtype=torch.uint8, device="cuda")
            del x
            times.append(time.perf_counter_ns() - t0)
        medians.append(statistics.median(times))
    print(f"{size}: {statistics.median(medians):.0f} ns")
