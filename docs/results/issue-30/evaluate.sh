#!/usr/bin/env bash
# Issue 30's evaluation: generated scenarios (4 regions, every event kind once, the
# busy-host phase among them) at several sizes and seeds, each strategy run one after
# the other on a quiet host, then `proxima-testbed compare` over all of them; and one
# scenario again with proxies that share nothing and with no network coordinates.
#
#   docs/results/issue-30/evaluate.sh                  # everything below, ~45 min
#   RUNS="20:1" STRATEGIES=qos-pool,local FULL= docs/results/issue-30/evaluate.sh
#
# TESTBED  the binary [target/release/proxima-testbed]
# OUT      where the scenarios, runs and comparison go [target/issue-30-eval]
# RUNS     size:seed pairs ["20:1 20:2 20:3 50:1 50:2 100:1"]
# DURATION seconds the clients send [60]
# STRATEGIES  every run: the lead first, then the strong baselines
# WEAK        the baselines far behind on every scenario so far (10-55 points), run
#             only on the FULL size:seed pairs ["20:1"] to keep the whole under an hour
# ONOFF    the size:seed run again with sharing off and with coordinates off ["50:1"]
# REPEAT   rounds of every run (`proxima-testbed run --repeat`) [1]
#
# Each run's progress line is the testbed's own; `uptime` is logged before and after
# each scenario, as the numbers mean little on a busy host (see the lag column).
set -euo pipefail
cd "$(dirname "$0")/../../.."
TESTBED=${TESTBED:-target/release/proxima-testbed}
OUT=${OUT:-target/issue-30-eval}
RUNS=${RUNS:-"20:1 20:2 20:3 50:1 50:2 100:1"}
DURATION=${DURATION:-60}
STRATEGIES=${STRATEGIES:-"qos-pool:spread=slack,qos-pool:spread=even,local,rap"}
WEAK=${WEAK:-"proximity:alpha=0.8,p2c-ewma,round-robin,kube-proxy"}
FULL=${FULL:-"20:1"}
ONOFF=${ONOFF:-"50:1"}
REPEAT=${REPEAT:-1}
LEAD=${LEAD:-${STRATEGIES%%,*}}

[[ -x $TESTBED ]] || { echo "no $TESTBED: cargo build --release -p proxima-testbed" >&2; exit 1; }
mkdir -p "$OUT/scenarios" "$OUT/runs"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/log.txt" >&2; }

# The generator's defaults, as in docs/results/issue-30.md: 5 services at 20 nodes, 4 above.
generate() { # $1 nodes, $2 seed, $3 file
    local services=4
    (($1 <= 20)) && services=5
    "$TESTBED" generate --nodes "$1" --regions 4 --services "$services" --seed "$2" \
        --duration "$DURATION" --out "$3"
}

dirs=()
run_scenario() { # $1 name, $2 file, $3 strategies, $4 what to log
    log "$1: $4; $(uptime)"
    "$TESTBED" run "$2" --strategies "$3" --repeat "$REPEAT" --no-plots --out "$OUT/runs/$1" \
        > "$OUT/runs/$1.txt"
    log "$1 done; $(uptime)"
    dirs+=("$OUT/runs/$1")
}

for run in $RUNS; do
    nodes=${run%%:*} seed=${run##*:}
    name=n$nodes-seed$seed
    file=$OUT/scenarios/$name.yaml
    generate "$nodes" "$seed" "$file"
    strategies=$STRATEGIES
    [[ " $FULL " == *" $run "* ]] && strategies=$strategies,$WEAK
    run_scenario "$name" "$file" "$strategies" "$strategies"
done

for run in $ONOFF; do
    nodes=${run%%:*} seed=${run##*:}
    name=n$nodes-seed$seed-onoff
    file=$OUT/scenarios/$name.yaml
    generate "$nodes" "$seed" "$file"
    # The same scenario three ways: as generated, proxies that share nothing, and
    # proxies without network coordinates (an RTT not probed is unknown).
    sed -i -E 's/^testbed: \{ /testbed: { peer-share-bytes: ${share}, peer-coordinates: ${coords}, /' "$file"
    cat >> "$file" <<'EOF'
variants:
  - { name: shared, share: 4096, coords: true }
  - { name: alone, share: 0, coords: true }
  - { name: no-coordinates, share: 4096, coords: false }
EOF
    run_scenario "$name" "$file" "$LEAD" "$LEAD, sharing and coordinates on and off"
done

"$TESTBED" compare "${dirs[@]}" --lead "$LEAD" --out "$OUT"
log "wrote $OUT/compare.md, compare.csv, compare.png"
