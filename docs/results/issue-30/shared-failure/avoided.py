"""Per client of a shared-failure run (requests.csv from `proxima-testbed run --raw`):
requests to the failing pod while it failed (T1..T2), failures, and how long after T1
the client's proxy last sent it one."""
import csv
import sys

T1_MS, T2_MS = 15_000, 45_000
rows = list(csv.DictReader(open(sys.argv[1])))
names = {}
print("| variant | client | requests T1..T2 | to api-3 | not 200 | last to api-3 after T1 |")
print("|---|---|---:|---:|---:|---:|")
for variant in ["shared", "alone"]:
    for client in sorted({r["client"] for r in rows}, key=int):
        mine = [r for r in rows if r["variant"] == variant and r["client"] == client]
        during = [r for r in mine if T1_MS <= float(r["start_ms"]) < T2_MS]
        to_failing = [r for r in during if r["instance"] == "api-3"]
        failed = [r for r in during if r["status"] != "200"]
        last = max((float(r["start_ms"]) for r in to_failing), default=None)
        after = "never" if last is None else f"{(last - T1_MS) / 1000:.2f} s"
        label = "busy" if client == "0" else f"quiet-{int(client) + 3}"
        print(f"| {variant} | {label} | {len(during)} | {len(to_failing)} | {len(failed)} | {after} |")
