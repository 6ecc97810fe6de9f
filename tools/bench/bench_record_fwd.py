"""The forwarding-delay table of tools/bench/bench_record.sh and tools/bench/bench_record_h2.sh.

retrace record's admin histogram `retrace_record_forward_delay_seconds` is read before (`fwd0`) and
after (`fwd1`) each streaming phase as `;`-joined bucket lines; the table holds, per round, the
bucket bounds that the p50/p90/p99/p99.9 of the phase's chunks fall under.
"""
import re


def parse(h):
    """`le -> cumulative count` of one `;`-joined histogram scrape."""
    d = {}
    for part in h.split(";"):
        m = re.match(r'.*le=([^}]+)\} (\d+)', part)
        if m:
            d[m.group(1)] = int(m.group(2))
    return d


def table(rows, note, count_label):
    """Markdown lines for the retrace rows (labels `retrace`, `retrace-hyper`, ...) of `rows` that
    carry both scrapes (empty if none)."""
    fw = [r for r in rows if r["label"].startswith("retrace") and r.get("fwd1")]
    if not fw:
        return []
    out = [f"\nretrace's own per-chunk forwarding delay (upstream socket read -> client socket write completed), {note}; a percentile is the upper bound of its bucket:\n",
           f"| target | round | {count_label} | p50 ≤ | p90 ≤ | p99 ≤ | p99.9 ≤ |",
           "|---|---|---|---|---|---|---|"]
    for r in fw:
        a, b = parse(r["fwd0"]), parse(r["fwd1"])
        les = sorted((k for k in b if k != "+Inf"), key=float) + ["+Inf"]
        cum = [(le, b.get(le, 0) - a.get(le, 0)) for le in les]
        n = cum[-1][1]

        def q(p):
            for le, c in cum:
                if c >= p * n:
                    return "> 1 s" if le == "+Inf" else f"{float(le) * 1e3:g} ms"
            return "?"
        out.append(f"| {r['label']} | {r['round']} | {n} | {q(0.5)} | {q(0.9)} | {q(0.99)} | {q(0.999)} |")
    return out


if __name__ == "__main__":
    # Self-check on a made-up pair of scrapes (quotes already stripped, as the scripts do):
    # 100 chunks, 50 under 0.1 ms, 99 under 1 ms.
    before = 'x{le=0.0001} 0;x{le=0.001} 0;x{le=+Inf} 0'
    after = 'x{le=0.0001} 50;x{le=0.001} 99;x{le=+Inf} 100'
    lines = table([{"label": "retrace", "round": 1, "fwd0": before, "fwd1": after}], "test", "chunks")
    assert lines[-1] == "| retrace | 1 | 100 | 0.1 ms | 1 ms | 1 ms | > 1 s |", lines[-1]
    print("ok")
