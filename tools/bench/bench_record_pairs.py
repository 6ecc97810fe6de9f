#!/usr/bin/env python3
"""Paired, per-round view of a tools/bench/bench_record.sh run (its results.jsonl).

The summary table takes the median over rounds of each percentile; this prints every round's
added latency (target percentile minus direct's in the same round) and, for two targets A and B,
the per-round differences A - B with the median, a 95 % bootstrap interval of that median and how
many rounds A was lower. Round-to-round noise on this machine is about +-0.1 ms at p50 and more
at p99 (even direct moves by a millisecond at p99), so a difference is only a difference when
its interval excludes 0.

With the fault and preemption counts bench_record.sh records per phase, it also
prints each proxy's per-round TTFT p99 beside its minor/major page faults and involuntary
context switches over that phase; with the VM's steal ticks per phase, the
stolen time of each phase too (10 ms per tick), direct's included: a round with steal in one
target's phase and not in the others' is not a fair comparison of that round.

Usage: tools/bench/bench_record_pairs.py RESULTS.jsonl [A B]   (default A=retrace B=nginx)
"""
import json
import random
import statistics
import sys


def main():
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    a, b = (sys.argv[2], sys.argv[3]) if len(sys.argv) == 4 else ("retrace", "nginx")
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    st = [r for r in rows if r.get("kind") == "stream"]
    rounds = sorted({r["round"] for r in st})
    by = {(r["label"], r["round"]): r for r in st}
    labels = []
    for r in st:
        if r["label"] != "direct" and r["label"] not in labels:
            labels.append(r["label"])
    for t in (a, b):
        if t not in labels:
            sys.exit(f"{sys.argv[1]}: no stream rows for target {t!r} (have {', '.join(labels)})")
    full = [r for r in rounds if all((t, r) in by for t in labels + ["direct"])]
    for k, q in [("ttft_ms", "p50"), ("ttft_ms", "p99"), ("itl_ms", "p99")]:
        print(f"== added {k} {q} per round (target - direct, same round), ms")
        for t in labels:
            v = [by[(t, r)][k][q] - by[("direct", r)][k][q] for r in full]
            print(f"  {t:14} median {statistics.median(v):+.3f}  " + " ".join(f"{x:+.3f}" for x in v))
        d = [by[(a, r)][k][q] - by[(b, r)][k][q] for r in full]
        rng = random.Random(1)
        boots = sorted(statistics.median(rng.choices(d, k=len(d))) for _ in range(10000))
        lo, hi = boots[250], boots[9749]
        print(f"  {a} - {b}: median {statistics.median(d):+.3f} ms, 95% bootstrap CI [{lo:+.3f}, {hi:+.3f}], "
              f"{a} lower in {sum(x < 0 for x in d)}/{len(d)} rounds")
    # Faults and preemptions of each proxy over each stream phase (bench_record.sh), beside its
    # TTFT p99: does a round whose tail jumps also fault or get preempted more?
    if any("nvcsw" in by[(t, r)] for t in labels for r in full):
        print("== per round: added TTFT p99 ms / minor faults / major faults / involuntary switches")
        for t in labels:
            cells = []
            for r in full:
                x = by[(t, r)]
                add = x["ttft_ms"]["p99"] - by[("direct", r)]["ttft_ms"]["p99"]
                cells.append(f"{add:+.2f}/{x.get('minflt', 0)}/{x.get('majflt', 0)}/{x.get('nvcsw', 0)}")
            print(f"  {t:14} " + "  ".join(cells))
    if any("steal_ticks" in by[(t, r)] for t in labels for r in full):
        print("== per round: the VM's steal ticks (10 ms each) during each target's stream phase")
        for t in ["direct"] + labels:
            print(f"  {t:14} " + " ".join(f"{by[(t, r)].get('steal_ticks', 0):>3}" for r in full))


if __name__ == "__main__":
    main()
