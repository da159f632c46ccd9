#!/usr/bin/env bash
# Instructions per request in Proxima's connection tasks, counted by valgrind's
# callgrind: one build per call, one worker, behind the same nginx origin as the other
# load scripts, under `wrk -t1 -c8`. Unlike times, the count does not depend on what
# else the machine is doing, so builds can be compared across runs (same binary, same
# inputs: the same count within a fraction of a percent). It counts user-space work
# only, from the connection task's entry (`server::drive`) down: the kernel's share and
# the runtime's scheduling between tasks are not in it.
#
# Usage: benches/load/instructions.sh [BINARY]   (default target/dist/proxima)
# Environment: D [15s] wrk's duration; TOP [25] functions listed (self cost).
# Needs valgrind (callgrind_annotate), nginx and wrk.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${1:-$ROOT/target/dist/proxima}
D=${D:-15s}
TOP=${TOP:-25}
[[ -x $BIN ]] || { echo "$BIN is not an executable" >&2; exit 1; }
for tool in valgrind callgrind_annotate nginx wrk; do
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
    --collect-atstart=no --toggle-collect='proxima_proxy::server::drive*' \
    "$BIN" run --listen 127.0.0.1:19490 --admin 127.0.0.1:19491 \
    --discovery "file:$WORK/discovery.yaml" --log-level warn >"$WORK/proxima.out" 2>&1 &
PROXIMA=$!
PIDS+=("$PROXIMA")
echo "waiting for Proxima under valgrind..." >&2
for _ in $(seq 60); do
    curl -s -o /dev/null -H 'x-service: bench' http://127.0.0.1:19490/ && break
    sleep 1
done
echo "wrk -t1 -c8 -d$D..." >&2
requests=$(wrk -t1 -c8 -d"$D" -H 'x-service: bench' http://127.0.0.1:19490/ |
    awk '/requests in/ { print $1 }')
kill -INT "$PROXIMA"
wait "$PROXIMA" 2>/dev/null || true
# The readiness probe above is one more request in the count.
requests=$((requests + 1))
total=$(callgrind_annotate "$WORK/out.cg" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
echo "build: $BIN"
echo "requests: $requests"
awk -v t="$total" -v r="$requests" 'BEGIN { printf "instructions per request: %.0f\n", t / r }'
echo "top functions by their own instructions, per request:"
callgrind_annotate "$WORK/out.cg" 2>/dev/null | grep -E '^ *[0-9,]+ \( *[0-9.]+%\) ' |
    grep -v 'PROGRAM TOTALS' | awk -v top="$TOP" 'NR <= top' |
    awk -v r="$requests" '{ n = $1; gsub(",", "", n); line = $0
        sub(/^ *[0-9,]+ \( *[0-9.]+%\) +/, "", line); printf "%8.0f  %s\n", n / r, line }' |
    sed -E 's|/root/.cargo/registry/src/[^/]+/||; s|/rustc/[0-9a-f]+/library/||'
