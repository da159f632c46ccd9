#!/usr/bin/env bash
# Instructions per request in Proxima, counted by valgrind's callgrind: one build per
# call, one worker, behind the same nginx origin as the other load scripts. Unlike times,
# the count does not depend on what else the machine is doing, so builds can be compared
# across runs (same binary, same inputs: the same count within about a percent). It
# counts the whole process in user space (the connections' tasks, the runtime, timers,
# the pod side) from the end of a warm-up to the end of the load; the kernel's share is
# not in it.
#
# Usage: benches/load/instructions.sh [BINARY]   (default target/dist/proxima)
# Environment: PROTOCOL [h1] (h1: `wrk -t1 -c8` for D [15s]; h2: `h2load -c16 -m STREAMS
#   [16]` for REQUESTS [20000], h2c with prior knowledge); TOP [25] functions listed
#   (self cost); KEEP: a path to copy callgrind's profile to, for callgrind_annotate
#   --inclusive=yes or --tree=caller (which allocations a request makes, and where).
# Needs valgrind (callgrind_annotate, callgrind_control), nginx, and wrk or h2load.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${1:-$ROOT/target/dist/proxima}
D=${D:-15s}
TOP=${TOP:-25}
PROTOCOL=${PROTOCOL:-h1}
REQUESTS=${REQUESTS:-20000}
STREAMS=${STREAMS:-16}
[[ -x $BIN ]] || { echo "$BIN is not an executable" >&2; exit 1; }
case $PROTOCOL in
    h1) client=wrk ;;
    h2) client=h2load ;;
    *) echo "PROTOCOL must be h1 or h2, not $PROTOCOL" >&2; exit 1 ;;
esac
for tool in valgrind callgrind_annotate callgrind_control nginx "$client"; do
    command -v "$tool" >/dev/null || { echo "$tool is missing" >&2; exit 1; }
done
# shellcheck source=benches/load/configs.sh
source "$ROOT/benches/load/configs.sh"
work_dir instructions

# configs.sh reads these; only its origin and discovery file are used here.
WORKERS=1 ORIGIN_WORKERS=1 ORIGIN_PORT=19480 NGINX_PORT=19481 HAPROXY_PORT=19482 CONNECTIONS=8
write_configs
nginx -e "$WORK/origin.err" -p "$WORK" -c "$WORK/origin.conf" & PIDS+=($!)
TOKIO_WORKER_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$WORK/out.cg" \
    "$BIN" run --listen 127.0.0.1:19490 --admin 127.0.0.1:19491 \
    --discovery "file:$WORK/discovery.yaml" --log-level warn >"$WORK/proxima.out" 2>&1 &
PROXIMA=$!
PIDS+=("$PROXIMA")
echo "waiting for Proxima under valgrind..." >&2
for _ in $(seq 60); do
    curl -s -o /dev/null -H 'x-service: bench' http://127.0.0.1:19490/ && break
    sleep 1
done
# `load warm|measured`: runs the clients (the warm-up for 2 s or a tenth of the requests)
# and prints the number of requests answered.
load() {
    local duration=$D requests=$REQUESTS
    [[ $1 == warm ]] && duration=2s requests=$((REQUESTS / 10))
    echo "$1: $client..." >&2
    if [[ $PROTOCOL == h1 ]]; then
        wrk -t1 -c8 -d"$duration" -H 'x-service: bench' http://127.0.0.1:19490/ |
            awk '/requests in/ { print $1 }'
    else
        h2load -n "$requests" -c 16 -m "$STREAMS" -H 'x-service: bench' http://127.0.0.1:19490/ |
            awk '/^requests:/ { print $8 }'
    fi
}
load warm >/dev/null
callgrind_control -z "$PROXIMA" >/dev/null
requests=$(load measured)
callgrind_control -d "$PROXIMA" >/dev/null
kill -INT "$PROXIMA"
wait "$PROXIMA" 2>/dev/null || true
out=$WORK/out.cg.1
[[ -n ${KEEP:-} ]] && cp "$out" "$KEEP"
total=$(awk '/^totals:/ { print $2 }' "$out")
echo "build: $BIN"
echo "clients: $PROTOCOL; requests answered: $requests"
awk -v t="$total" -v r="$requests" 'BEGIN { printf "instructions per request: %.0f\n", t / r }'
echo "top functions by their own instructions, per request:"
callgrind_annotate --threshold=100 "$out" 2>/dev/null | grep -E '^ *[0-9,]+ \( *[0-9.]+%\) ' |
    grep -v -E 'PROGRAM TOTALS|clone\.S:|pthread_create\.c:|thread_start|vtable\.shim|__rust_begin_short_backtrace' |
    awk -v top="$TOP" 'NR <= top' |
    awk -v r="$requests" '{ n = $1; gsub(",", "", n); line = $0
        sub(/^ *[0-9,]+ \( *[0-9.]+%\) +/, "", line); printf "%8.0f  %s\n", n / r, line }' |
    sed -E 's|/root/.cargo/registry/src/[^/]+/||; s|/rustc/[0-9a-f]+/library/||'
