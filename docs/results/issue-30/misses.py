#!/usr/bin/env python3
"""Where the reachable requests of a `proxima-testbed run --raw` went, and which missed.

    docs/results/issue-30/misses.py RUN_DIR [SERVICE]

For each run (label) and service: the requests some instance could have answered within
the SLO ("reachable") and how many of them did not get such an answer; then the same
per client and instance, so that a loss can be traced to the pods it went to (an empty
instance is a request no pod answered: a timeout or a refused connection). Reads
`requests.csv`, `clients.csv` and `services.csv` of RUN_DIR.
"""
import collections
import csv
import sys


def main(run, only=None):
    clients = collections.defaultdict(list)
    for row in csv.DictReader(open(f"{run}/clients.csv")):
        clients[row["label"]].append((row["client"], row["node"], row["service"]))
    slo = {row["service"]: float(row["slo_ms"]) for row in csv.DictReader(open(f"{run}/services.csv"))}
    per_instance = collections.defaultdict(lambda: [0, 0])
    per_service = collections.defaultdict(lambda: [0, 0])
    for row in csv.DictReader(open(f"{run}/requests.csv")):
        if row["reachable"] not in ("true", "1"):
            continue
        name, node, service = clients[row["label"]][int(row["client"])]
        if only and only not in service:
            continue
        missed = row["error"] != "" or float(row["latency_ms"]) > slo[service]
        for key, table in (
            ((row["label"], service), per_service),
            ((row["label"], service, f"{name}@{node}", row["instance"] or "-"), per_instance),
        ):
            table[key][0] += 1
            table[key][1] += missed
    for (label, service), (n, missed) in sorted(per_service.items()):
        print(f"{label:28} {service:16} reachable {n:6} missed {missed:5}  {100 * (1 - missed / n):.2f}%")
    print()
    for (label, service, client, instance), (n, missed) in sorted(per_instance.items()):
        if missed:
            print(f"{label:28} {service:16} {client:18} {instance:10} {n:6} missed {missed:5}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
