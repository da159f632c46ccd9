#!/usr/bin/env bash
# CPU time per request, user and kernel apart: Proxima vs nginx vs HAProxy as one-worker
# reverse proxies in front of one nginx origin, under the same wrk load. Throughput on
# a shared 2-core machine moves with whatever else runs; CPU time per request moves
# less, and the user/kernel split shows where a proxy's own cost is (the kernel's
# share, the socket work, is about the same for every proxy).
#
# Each round runs wrk against each proxy in turn and reads the proxy's utime/stime
# from /proc before and after; the report gives per-round figures and medians.
#
# Usage: benches/load/cpu.sh
# Environment (defaults in brackets):
#   DURATION [8s]  CONNECTIONS [32]  ROUNDS [5]  BASE_PORT [18280]
#   PROXIMA_BIN [target/dist/proxima, built if missing]; an older build works too (the
#   worker count goes in TOKIO_WORKER_THREADS, which every build reads)
set -euo pipefail

DURATION=${DURATION:-8s}
CONNECTIONS=${CONNECTIONS:-32}
ROUNDS=${ROUNDS:-5}
BASE_PORT=${BASE_PORT:-18280}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PROXIMA_BIN=${PROXIMA_BIN:-$ROOT/target/dist/proxima}
# shellcheck source=benches/load/configs.sh
source "$ROOT/benches/load/configs.sh"
work_dir cpu
ORIGIN=$BASE_PORT
declare -A PORT=([nginx]=$((BASE_PORT + 1)) [haproxy]=$((BASE_PORT + 2)) [proxima]=$((BASE_PORT + 3)))
TARGETS=(nginx haproxy proxima)

log() { printf '[cpu %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

for tool in wrk nginx haproxy curl; do
    command -v "$tool" >/dev/null || { log "$tool is missing (benches/load/run.sh installs it)"; exit 1; }
done
[[ -x $PROXIMA_BIN ]] || (cd "$ROOT" && cargo build --profile dist -p proxima)

# The same configs as run.sh, with one worker each.
WORKERS=1 ORIGIN_WORKERS=1 ORIGIN_PORT=$ORIGIN NGINX_PORT=${PORT[nginx]} HAPROXY_PORT=${PORT[haproxy]}
write_configs

nginx -e "$WORK/origin.err" -p "$WORK" -c "$WORK/origin.conf" & PIDS+=($!)
nginx -e "$WORK/nginx.err" -p "$WORK" -c "$WORK/nginx.conf" & PIDS+=($!)
haproxy -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.out" 2>&1 & PIDS+=($!)
declare -A PID=([haproxy]=$!)
TOKIO_WORKER_THREADS=1 "$PROXIMA_BIN" run --listen "127.0.0.1:${PORT[proxima]}" --admin "127.0.0.1:$((BASE_PORT + 4))" \
    --discovery "file:$WORK/discovery.yaml" --log-level warn >"$WORK/proxima.out" 2>&1 & PIDS+=($!)
PID[proxima]=$!
sleep 2
PID[nginx]=$(pgrep -P "$(cat "$WORK/nginx.pid")")
for t in "${TARGETS[@]}"; do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-service: bench' "http://127.0.0.1:${PORT[$t]}/")
    [[ $code == 200 ]] || { log "$t answers $code"; exit 1; }
    wrk -t1 -c"$CONNECTIONS" -d2s -H 'x-service: bench' "http://127.0.0.1:${PORT[$t]}/" >/dev/null
done

ticks() { awk '{ print $14, $15 }' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| round | proxy | req/s | user µs/req | kernel µs/req | total µs/req |"
echo "|---:|---|---:|---:|---:|---:|"
ROWS=$WORK/rows
for ((r = 1; r <= ROUNDS; r++)); do
    for t in "${TARGETS[@]}"; do
        read -r u0 s0 < <(ticks "${PID[$t]}")
        out=$(wrk -t1 -c"$CONNECTIONS" -d"$DURATION" -H 'x-service: bench' "http://127.0.0.1:${PORT[$t]}/")
        read -r u1 s1 < <(ticks "${PID[$t]}")
        requests=$(awk '/requests in/ { print $1 }' <<<"$out")
        rps=$(awk '/Requests\/sec/ { print $2 }' <<<"$out")
        awk -v r="$r" -v t="$t" -v rps="$rps" -v n="$requests" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v hz="$HZ" \
            'BEGIN { us = 1e6 / hz / n; printf "| %d | %s | %.0f | %.1f | %.1f | %.1f |\n", r, t, rps, u * us, s * us, (u + s) * us }' |
            tee -a "$ROWS"
    done
done
echo
echo "Medians over $ROUNDS rounds:"
echo
echo "| proxy | req/s | user µs/req | kernel µs/req | total µs/req |"
echo "|---|---:|---:|---:|---:|"
for t in "${TARGETS[@]}"; do
    median() { grep "| $t |" "$ROWS" | awk -F'|' -v c="$1" '{ print $c + 0 }' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
    echo "| $t | $(median 4) | $(median 5) | $(median 6) | $(median 7) |"
done
echo
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg); proxima ${PROXIMA_BIN#"$ROOT"/} at $(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet || echo ' (uncommitted changes)')"
