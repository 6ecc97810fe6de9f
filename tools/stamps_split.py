#!/usr/bin/env python3
"""Splits the client-to-server path of each request from RETRACE_STAMPS files.

Usage: tools/stamps_split.py DIR   (DIR holds replay-<pid>.tsv and mock-<pid>.tsv of ONE run)

Rows (nanoseconds of CLOCK_MONOTONIC, shared by both processes):
  replay PORT sent written head_read first_read first_seen
  mock   PORT first_byte_read arrival handed_to_engine   (arrival: what the mock's timings count
         from: the kernel's receive timestamp of the read that completed the request, so usually
         before first_byte_read)
  mock_first PORT due sent        (the stream's first event: scheduled, handed to the socket)
A connection carries its requests one after another, so the k-th row of a port on each side is
the same request. Prints mean / p50 / p99 (ms) of each stage and the TTFT they add up to.
"""
import collections, glob, os, sys

def load(pattern):
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    for path in glob.glob(pattern):
        for line in open(path):
            f = line.split("\t")
            if len(f) >= 3:
                rows[f[0]][int(f[1])].append([int(x) for x in f[2:]])
    return rows

d = sys.argv[1]
rows = load(os.path.join(d, "*.tsv"))
for tag in rows:
    for port in rows[tag]:
        rows[tag][port].sort()
stages = collections.defaultdict(list)
joined = 0
for port, reqs in rows["replay"].items():
    mocks, firsts = rows["mock"].get(port, []), rows["mock_first"].get(port, [])
    for k, r in enumerate(reqs):
        if len(r) < 5 or k >= len(mocks) or k >= len(firsts):
            continue
        sent, written, head, fread, fseen = r[:5]
        mread, arrival, handed = mocks[k]
        due, msent = firsts[k]
        if not (sent <= written <= mread and arrival <= due):
            continue
        joined += 1
        s = stages
        s["client: sent stamp -> request written"].append(written - sent)
        s["kernel+server wake: written -> server read"].append(mread - written)
        s["server: arrival stamp -> read (<0: arrival after read)"].append(mread - arrival)
        s["server: read -> handed to engine"].append(handed - mread)
        s["server TTFT (due - arrival, fixed)"].append(due - arrival)
        s["server: first event late (socket - due)"].append(msent - due)
        s["kernel+client wake: server send -> client read"].append(fread - msent)
        s["client: socket read -> first content seen"].append(fseen - fread)
        s["TTFT (first content seen - sent stamp)"].append(fseen - sent)
        s["  of which outside the server (TTFT - due + arrival)"].append(fseen - sent - (due - arrival))
print(f"joined requests: {joined}")
print(f"{'stage':<55} {'mean':>8} {'p50':>8} {'p99':>8} {'max':>8}  (ms)")
for name, v in stages.items():
    v = sorted(v)
    n = len(v)
    q = lambda p: v[min(n - 1, int(p * (n - 1) + 0.5))] / 1e6
    print(f"{name:<55} {sum(v) / n / 1e6:8.3f} {q(0.5):8.3f} {q(0.99):8.3f} {v[-1] / 1e6:8.3f}")
