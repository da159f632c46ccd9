"""Cold-start misses of a cold-start run (requests.csv from `proxima-testbed run --raw`):
for the client of the restarted node, the requests it started in the 5 s after each
proxy restart, how many missed the SLO (late or failed), and to which pods they went;
the same for the 5 s before as a control."""
import csv
import sys
from collections import Counter

SLO_MS = 20.0
RESTARTS_MS = [20_000, 40_000]
WINDOW_MS = 5_000
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["client"] == "0"]


def missed(r):
    return r["status"] != "200" or float(r["latency_ms"]) > SLO_MS


print("| variant | window | requests | missed | of them failed | pods of the misses |")
print("|---|---|---:|---:|---:|---|")
for variant in sorted({r["variant"] for r in rows}, reverse=True):
    mine = [r for r in rows if r["variant"] == variant]
    for at in RESTARTS_MS:
        for label, lo, hi in [("5 s before", at - WINDOW_MS, at), ("5 s after", at, at + WINDOW_MS)]:
            inside = [r for r in mine if lo <= float(r["start_ms"]) < hi]
            misses = [r for r in inside if missed(r)]
            failed = sum(r["status"] != "200" for r in misses)
            pods = Counter(r["instance"] or "-" for r in misses)
            where = ", ".join(f"{p} {n}" for p, n in sorted(pods.items())) or "-"
            print(f"| {variant} | {label} restart at {at // 1000} s | {len(inside)} | {len(misses)} | {failed} | {where} |")
