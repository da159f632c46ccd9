#!/usr/bin/env bash
# Interleaved A/B of Proxima builds: each build runs at once behind one nginx origin, and
# every round runs wrk against each in turn, reading the build's CPU time from /proc
# before and after. Compare builds measured side by side, never across runs: the machine
# is shared and noisy, and CPU time per request moves less than throughput.
#
# Usage: benches/load/ab.sh NAME=BINARY [NAME=BINARY ...]
#   e.g. benches/load/ab.sh before=/tmp/proxima-49df21c after=target/dist/proxima
# Environment (defaults in brackets):
#   WORKERS [1] (TOKIO_WORKER_THREADS of each build)  THREADS [1]  CONNS [32]
#   R [5] rounds  D [8s] per run  WITH_NGINX [0] (1: an nginx proxy joins the rounds)
#   WITH_HAPROXY [0] (1: an HAProxy joins the rounds)
# Prints one line per round and build (req/s, user/kernel/total µs per request, wrk's
# p99, and the whole host's busy CPU per request: the proxy's own plus what it costs the
# origin, wrk and the kernel elsewhere), then the medians.
set -euo pipefail
WORKERS=${WORKERS:-1}; CONNS=${CONNS:-32}; THREADS=${THREADS:-1}; R=${R:-5}; D=${D:-8s}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
(($# > 0)) || { sed -n '2,13p' "$0"; exit 2; }
# shellcheck source=benches/load/configs.sh
source "$ROOT/benches/load/configs.sh"
work_dir ab

# configs.sh reads these; its nginx proxy is started only with WITH_NGINX=1.
ORIGIN_WORKERS=1 ORIGIN_PORT=19280 NGINX_PORT=19281 HAPROXY_PORT=19282 CONNECTIONS=$CONNS
write_configs
nginx -e "$WORK/origin.err" -p "$WORK" -c "$WORK/origin.conf" & PIDS+=($!)
declare -A PORT PID
names=()
if [[ ${WITH_NGINX:-0} == 1 ]]; then
    nginx -e "$WORK/nginx.err" -p "$WORK" -c "$WORK/nginx.conf" & PIDS+=($!)
    names+=(nginx)
    PORT[nginx]=$NGINX_PORT
fi
port=19290
for arg in "$@"; do
    name=${arg%%=*}
    bin=${arg#*=}
    [[ -x $bin ]] || { echo "$bin is not an executable" >&2; exit 1; }
    TOKIO_WORKER_THREADS=$WORKERS "$bin" run --listen "127.0.0.1:$port" --admin "127.0.0.1:$((port + 1))" \
        --discovery "file:$WORK/discovery.yaml" --log-level warn >"$WORK/$name.out" 2>&1 & PIDS+=($!)
    PID[$name]=$!
    PORT[$name]=$port
    names+=("$name")
    port=$((port + 2))
done
sleep 2
if [[ ${WITH_HAPROXY:-0} == 1 ]]; then
    haproxy -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.out" 2>&1 & PIDS+=($!)
    names+=(haproxy)
    PORT[haproxy]=$HAPROXY_PORT
    PID[haproxy]=$!
fi
sleep 1
if [[ ${WITH_NGINX:-0} == 1 ]]; then PID[nginx]=$(pgrep -P "$(cat "$WORK/nginx.pid")" | tr '\n' ' '); fi
for name in "${names[@]}"; do
    wrk -t"$THREADS" -c"$CONNS" -d2s -H 'x-service: bench' "http://127.0.0.1:${PORT[$name]}/" >/dev/null
done

# utime and stime in ticks, summed over the given processes.
ticks() {
    local user=0 system=0 u s
    for pid in $1; do
        read -r u s < <(awk '{ print $14, $15 }' "/proc/$pid/stat")
        user=$((user + u))
        system=$((system + s))
    done
    echo "$user $system"
}
# Busy ticks of the whole host (user, nice, system, irq, softirq, steal).
host_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
HZ=$(getconf CLK_TCK)
ROWS=$WORK/rows
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= R; r++)); do
    for name in "${names[@]}"; do
        read -r u0 s0 < <(ticks "${PID[$name]}")
        h0=$(host_ticks)
        out=$(wrk -t"$THREADS" -c"$CONNS" -d"$D" --latency -H 'x-service: bench' "http://127.0.0.1:${PORT[$name]}/")
        read -r u1 s1 < <(ticks "${PID[$name]}")
        h1=$(host_ticks)
        requests=$(awk '/requests in/ { print $1 }' <<<"$out")
        rps=$(awk '/Requests\/sec/ { print $2 }' <<<"$out")
        p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
        awk -v r="$r" -v n="$name" -v rps="$rps" -v q="$requests" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v hz="$HZ" -v p99="$p99" -v h=$((h1 - h0)) \
            'BEGIN { us = 1e6 / hz / q; printf "%d %s rps %.0f user %.2f sys %.2f cpu %.2f p99 %s host %.2f\n", r, n, rps, u * us, s * us, (u + s) * us, p99, h * us }' |
            tee -a "$ROWS"
    done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "medians (req/s, user, kernel, total, host µs per request):"
for name in "${names[@]}"; do
    printf '  %s:' "$name"
    for column in 4 6 8 10 14; do
        awk -v n="$name" -v c="$column" '$2 == n { print $c }' "$ROWS" | sort -g |
            awk '{ v[NR] = $1 } END { printf " %s", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
    done
    echo
done
