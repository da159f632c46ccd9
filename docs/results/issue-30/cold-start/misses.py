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
JOIN_MS = 30_000
every = list(csv.DictReader(open(sys.argv[1])))
rows = [r for r in every if r["client"] == "0"]


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

print()
print("Pods that joined at 30 s: requests each client sent slow-5 (30 ms, never within")
print("the SLO) after the join, and how long after it the client's first request to fast-6 started.")
print()
print("| variant | client | to slow-5 | first to fast-6 after the join |")
print("|---|---|---:|---:|")
for variant in sorted({r["variant"] for r in every}, reverse=True):
    for client in sorted({r["client"] for r in every}, key=int):
        mine = [r for r in every if r["variant"] == variant and r["client"] == client and float(r["start_ms"]) >= JOIN_MS]
        slow = sum(r["instance"] == "slow-5" for r in mine)
        fast = min((float(r["start_ms"]) for r in mine if r["instance"] == "fast-6"), default=None)
        after = "never" if fast is None else f"{(fast - JOIN_MS) / 1000:.2f} s"
        print(f"| {variant} | {['fresh', 'steady-5', 'steady-6'][int(client)]} | {slow} | {after} |")
