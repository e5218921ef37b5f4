#!/usr/bin/env python3
"""Writes gpumem-replay's shipped traces, deterministically (fixed seeds).

Usage: make_traces.py [OUTDIR]   (default: this script's folder)

Our CSV format is `seq,action,id,size,stream` (action alloc|free; a free's size
repeats the block's size); rmm_*.csv use RMM's logging_resource_adaptor format
`Thread,Time,Action,Pointer,Size,Stream`. Running it twice gives identical files.
"""
import os
import random
import sys

MIB = 1 << 20


class Trace:
    """Our CSV: ids are handed out in order and never reused."""

    def __init__(self):
        self.rows = []
        self.live = {}
        self.next_id = 0

    def alloc(self, size, stream=0):
        assert size > 0
        i = self.next_id
        self.next_id += 1
        self.live[i] = (size, stream)
        self.rows.append(("alloc", i, size, stream))
        return i

    def free(self, i):
        size, stream = self.live.pop(i)
        self.rows.append(("free", i, size, stream))

    def free_each(self, ids):
        for i in ids:
            self.free(i)

    def free_all(self):
        for i in sorted(self.live):
            self.free(i)

    def write(self, path):
        with open(path, "w", newline="\n") as f:
            f.write("seq,action,id,size,stream\n")
            for seq, (action, i, size, stream) in enumerate(self.rows):
                f.write(f"{seq},{action},{i},{size},{stream}\n")


def training(path):
    """A transformer training loop: long-lived weights and Adam state, per-step
    activations whose size follows a varying sequence length, gradients that
    live from backward to the next zero_grad, all-reduce buckets on stream 1."""
    rng = random.Random(1)
    t = Trace()
    hidden, layers, vocab, batch, heads, f32 = 768, 12, 32000, 4, 12, 4
    shapes = [3 * hidden * hidden, 3 * hidden, hidden * hidden, hidden, 4 * hidden * hidden, 4 * hidden,
              4 * hidden * hidden, hidden, hidden, hidden, hidden, hidden]
    params = [vocab * hidden, 1024 * hidden] + shapes * layers + [hidden, hidden]
    weights = [t.alloc(n * f32) for n in params]
    adam, grads = [], []
    for step in range(8):
        seq = rng.choice([256, 384, 512, 768, 1024])
        tokens = batch * seq
        for g in grads:  # zero_grad(set_to_none=True)
            t.free(g)
        grads = []
        saved = [t.alloc(tokens * 8)]  # input ids
        x = t.alloc(tokens * hidden * f32)
        saved.append(x)
        per_layer = []
        for _ in range(layers):
            acts = [t.alloc(tokens * hidden * f32)]                    # layernorm out
            acts.append(t.alloc(3 * tokens * hidden * f32))            # qkv
            scores = t.alloc(batch * heads * seq * seq * f32)          # attention scores
            acts.append(t.alloc(batch * heads * seq * seq * f32))      # softmax (saved)
            t.free(scores)
            acts.append(t.alloc(tokens * hidden * f32))                # attention out
            acts.append(t.alloc(tokens * hidden * f32))                # residual
            acts.append(t.alloc(4 * tokens * hidden * f32))            # mlp up
            acts.append(t.alloc(4 * tokens * hidden * f32))            # gelu
            acts.append(t.alloc(tokens * hidden * f32))                # mlp out / residual
            per_layer.append(acts)
        logits = t.alloc(tokens * vocab * f32)
        loss = t.alloc(f32)
        dlogits = t.alloc(tokens * vocab * f32)
        t.free(logits)
        dx = t.alloc(tokens * hidden * f32)
        t.free(dlogits)
        bucket, bucket_bytes, buckets = [], 0, []
        for layer in reversed(range(layers)):
            for n in shapes:
                grads.append(t.alloc(n * f32))
                bucket_bytes += n * f32
            if bucket_bytes >= 25 * MIB:  # DDP bucket handed to the comm stream
                buckets.append(t.alloc(bucket_bytes, 1))
                bucket_bytes = 0
            tmp = [t.alloc(4 * tokens * hidden * f32), t.alloc(batch * heads * seq * seq * f32)]
            ndx = t.alloc(tokens * hidden * f32)
            for a in tmp + per_layer[layer]:
                t.free(a)
            t.free(dx)
            dx = ndx
            if len(buckets) > 2:
                t.free(buckets.pop(0))
        grads += [t.alloc(params[0] * f32), t.alloc(params[1] * f32)]
        for a in [dx, loss] + saved + buckets:
            t.free(a)
        if not adam:  # Adam's exp_avg and exp_avg_sq appear at the first step
            adam = [t.alloc(n * f32) for n in params for _ in range(2)]
        scratch = [t.alloc(max(n * f32 // 8, 512)) for n in params[:6]]  # foreach temporaries
        for s in scratch:
            t.free(s)
    for g in grads:
        t.free(g)
    for a in adam + weights:
        t.free(a)
    t.write(path)


def inference(path):
    """Batched generation with a dynamic KV cache: requests of random prompt
    length join while slots are free; each keeps one cache block sized for a
    whole number of 128-token chunks and, when full, copies it into a block one
    chunk larger (alloc new, free old); per-step activations come and go."""
    rng = random.Random(2)
    t = Trace()
    hidden, layers, vocab, f16 = 1024, 16, 32000, 2
    kv_per_token = 2 * layers * hidden * f16
    chunk = 128
    weights = [t.alloc(vocab * hidden * f16)]
    for _ in range(layers):
        weights += [t.alloc(4 * hidden * hidden * f16), t.alloc(8 * hidden * hidden * f16), t.alloc(hidden * f16)]
    pending = [(rng.randint(16, 1500), rng.randint(8, 300)) for _ in range(40)]
    active = []  # [tokens, capacity, remaining, block]
    while pending or active:
        while pending and len(active) < 8:
            prompt, gen = pending.pop(0)
            cap = -(-prompt // chunk) * chunk
            block = t.alloc(cap * kv_per_token)
            tmp = [t.alloc(prompt * hidden * f16), t.alloc(4 * prompt * hidden * f16)]
            logits = t.alloc(prompt * vocab * f16)
            for a in tmp + [logits]:
                t.free(a)
            active.append([prompt, cap, gen, block])
        n = len(active)
        step = [t.alloc(n * hidden * f16), t.alloc(4 * n * hidden * f16), t.alloc(n * vocab * f16)]
        for r in active:
            r[0] += 1
            r[2] -= 1
            if r[0] > r[1]:
                r[1] += chunk
                grown = t.alloc(r[1] * kv_per_token)
                t.free(r[3])
                r[3] = grown
        for a in step:
            t.free(a)
        for r in [r for r in active if r[2] == 0]:
            t.free(r[3])
            active.remove(r)
    for w in weights:
        t.free(w)
    t.write(path)


def fragmentation(path):
    """8 x 16 MiB, every other one freed, then 4 x 32 MiB: 64 MiB is free in
    16 MiB holes that no 32 MiB request fits."""
    t = Trace()
    blocks = [t.alloc(16 * MIB) for _ in range(8)]
    for i in blocks[::2]:
        t.free(i)
    big = [t.alloc(32 * MIB) for _ in range(4)]
    for i in blocks[1::2] + big:
        t.free(i)
    t.write(path)


def convnet(path):
    """A fixed-shape convnet training loop (ResNet-like, batch 64, 224x224
    fp16 input, four stages halving the resolution and doubling the
    channels): the same sizes every step, activations saved for backward,
    cuDNN workspaces, gradients, SGD momentum from the first step."""
    t = Trace()
    batch, f16, f32 = 64, 2, 4
    stages = [(64, 56, 3), (128, 28, 4), (256, 14, 6), (512, 7, 3)]  # channels, resolution, blocks
    layer_shapes = []
    cin = 64
    for ch, _, blocks in stages:
        for b in range(blocks):
            layer_shapes += [ch * cin * 9, ch * ch * 9] if b == 0 else [ch * ch * 9, ch * ch * 9]
            cin = ch
    weights = [t.alloc(64 * 3 * 49 * f32)] + [t.alloc(n * f32) for n in layer_shapes] + [t.alloc(512 * 1000 * f32)]
    momentum = []
    for step in range(6):
        x = t.alloc(batch * 3 * 224 * 224 * f16)
        saved = [t.alloc(batch * 64 * 112 * 112 * f16)]
        for ch, res, blocks in stages:
            for _ in range(2 * blocks):
                ws = t.alloc(32 * 1024 * 1024)  # conv workspace
                saved.append(t.alloc(batch * ch * res * res * f16))   # conv out
                saved.append(t.alloc(batch * ch * res * res * f16))   # bn out
                t.free(ws)
        logits = t.alloc(batch * 1000 * f32)
        grads = []
        dx = t.alloc(batch * 512 * 7 * 7 * f16)
        for i, n in enumerate(reversed(layer_shapes)):
            ws = t.alloc(32 * 1024 * 1024)
            grads.append(t.alloc(n * f32))
            t.free(ws)
            if saved:
                t.free(saved.pop())
            if saved and i % 2:
                t.free(saved.pop())
        t.free_each(saved + [dx, logits, x])
        if not momentum:
            momentum = [t.alloc(n * f32) for n in layer_shapes]
        t.free_each(grads)
    t.free_each(momentum + weights)
    t.write(path)


def sawtooth(path):
    """Adversarial: a buffer regrown 3 % at a time (allocate the larger one,
    copy, free the old), from 64 MiB for 60 steps, beside a few long-lived
    small tensors allocated along the way. Every request is larger than any
    block freed before it."""
    t = Trace()
    size, old, keep = 64 * MIB, None, []
    for step in range(60):
        new = t.alloc(size)
        if old is not None:
            t.free(old)
        old = new
        if step % 10 == 0:
            keep.append(t.alloc(3 * MIB + step * 4096))
        size = (size * 103 // 100 + 511) // 512 * 512
    t.free(old)
    for k in keep:
        t.free(k)
    t.write(path)


def rmm_log(path):
    """A cuDF-like workload in RMM's log format: two threads on two streams
    building and dropping columns of varying row counts; pointers come from a
    simple address model (a freed range of the same size is reused, LIFO), and
    a few 'allocate failure' rows (which replay skips)."""
    rng = random.Random(3)
    base, reuse, rows = 0x7F0000000000, {}, []
    streams = {140001: "0x0", 140002: "0x55d0c8a1b2c0"}
    clock = 36000.0
    live = {tid: [] for tid in streams}

    def emit(tid, action, ptr, size):
        nonlocal clock
        clock += rng.uniform(0.000001, 0.0002)
        h, rest = divmod(clock, 3600)
        m, s = divmod(rest, 60)
        rows.append(f"{tid},{int(h):02d}:{int(m):02d}:{s:09.6f},{action},{ptr:#x},{size},{streams[tid]}")

    for _ in range(6000):
        tid = rng.choice(list(streams))
        mine = live[tid]
        if mine and (len(mine) > 60 or rng.random() < 0.45):
            ptr, size = mine.pop(rng.randrange(len(mine)))
            reuse.setdefault(size, []).append(ptr)
            emit(tid, "free", ptr, size)
            continue
        rows_n = rng.choice([1000, 4096, 65536, 100000, 1 << 20, 3_000_000])
        size = rows_n * rng.choice([1, 4, 8]) + rng.choice([0, 0, 64, 100])
        if rng.random() < 0.004:
            emit(tid, "allocate failure", 0, size * 512)
            continue
        if reuse.get(size):
            ptr = reuse[size].pop()
        else:
            ptr = base
            base += (size + 255) // 256 * 256
        mine.append((ptr, size))
        emit(tid, "allocate", ptr, size)
    for tid, mine in live.items():
        for ptr, size in mine:
            emit(tid, "free", ptr, size)
    with open(path, "w", newline="\n") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        f.write("\n".join(rows) + "\n")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    training(os.path.join(out, "train_loop.csv"))
    inference(os.path.join(out, "infer_kv.csv"))
    fragmentation(os.path.join(out, "frag_16m_32m.csv"))
    convnet(os.path.join(out, "convnet.csv"))
    sawtooth(os.path.join(out, "sawtooth.csv"))
    rmm_log(os.path.join(out, "rmm_cudf.csv"))


if __name__ == "__main__":
    main()
