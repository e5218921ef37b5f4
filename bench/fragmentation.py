#!/usr/bin/env python3
"""Fragmentation and page-reuse cost on every shipped trace (a benchmark, not a test).

Usage: fragmentation.py GPUMEM_REPLAY TRACES_DIR [--callgrind]

For each trace and mode (native, expandable segments, expandable segments with
gpumemd_page_reuse) prints peak reserved / peak requested, the page moves per
thousand allocations and the replay's median ns per event (--runs 5). With
--callgrind it also counts the instructions spent inside gm_heap_alloc and
gm_heap_free (valgrind --tool=callgrind, inclusive, load-independent) and
prints instructions per operation for expandable and page reuse and their
ratio, in all and without the in-memory provider's callbacks (the backend's
share: fake_create, fake_create_run, fake_release, fake_release_run, fake_remap,
fake_stream_fence). A page-reuse replay makes one extra timing run, so its
counts are divided by twice the events.
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

MODES = (("native", ""), ("expandable", "expandable_segments:True"),
         ("reuse", "expandable_segments:True,gpumemd_page_reuse:True"))


def replay(tool, conf, trace, runs=5):
    out = subprocess.run([tool, "--runs", str(runs), "--alloc-conf", conf, trace], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


# Only the function list's lines (they name the binary): the auto-annotated
# source's call lines name the callees again and would count them twice.
PROVIDER = re.compile(r"^\s*([\d,]+) .*fake_provider\.c:fake_(create|create_run|release|release_run|remap|stream_fence) \[")


def instructions(tool, conf, trace):
    """(all, provider) Ir inside gm_heap_alloc + gm_heap_free over one replay (two for page
    reuse); provider = inclusive Ir of the provider callbacks."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                        "--toggle-collect=gm_heap_alloc", "--toggle-collect=gm_heap_free",
                        tool, "--runs", "1", "--alloc-conf", conf, trace],
                       check=True, capture_output=True, text=True)
        total = None
        with open(out) as f:
            for line in f:
                if line.startswith("summary:") or line.startswith("totals:"):
                    total = int(line.split()[1])
                    break
        ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out], check=True,
                             capture_output=True, text=True).stdout
        provider = sum(int(m.group(1).replace(",", "")) for m in map(PROVIDER.match, ann.splitlines()) if m)
    if total is None:
        raise RuntimeError("no callgrind summary")
    return total, provider


def main():
    tool, traces_dir = sys.argv[1], sys.argv[2]
    callgrind = "--callgrind" in sys.argv[3:]
    traces = sorted(glob.glob(os.path.join(traces_dir, "*.csv")))
    print("| trace | peak requested | native | expandable | page reuse | moves / 1k allocs "
          "| ns/event exp. / reuse" + (" | Ir/op exp. | Ir/op reuse | ratio | ratio without provider"
                                         if callgrind else "") + " |")
    for trace in traces:
        res = {name: replay(tool, conf, trace) for name, conf in MODES}
        reuse = res["reuse"]["page_reuse"]
        row = [os.path.basename(trace), f"{res['native']['peak_requested_bytes'] / 2**20:,.1f} MiB"]
        row += [f"{res[name]['fragmentation']:.3f}" for name, _ in MODES]
        row += [f"{reuse['moves_per_1k_allocs']:.1f}",
                f"{res['expandable']['ns_per_op']:.0f} / {res['reuse']['ns_per_op']:.0f}"]
        if callgrind:
            events = res["reuse"]["events"]
            exp, exp_prov = (n / events for n in instructions(tool, MODES[1][1], trace))
            rus, rus_prov = (n / (2 * events) for n in instructions(tool, MODES[2][1], trace))
            row += [f"{exp:,.0f}", f"{rus:,.0f}", f"{rus / exp:.2f}", f"{(rus - rus_prov) / (exp - exp_prov):.2f}"]
        print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
