#!/usr/bin/env bash
# Writes crates/proxima/symbol-order.txt, the link order of the proxima binary's
# functions (issue 29, RSS at 100 Services x 10 pods): every function that ran while a
# dist build served a representative load under callgrind, the most instructions first.
# crates/proxima/build.rs hands the file to the linker (lld --symbol-ordering-file), so
# the code a running proxy executes sits in one contiguous run of pages instead of being
# spread over the whole 12 MB text, where the kernel maps it by 64 KB windows
# (benches/load/README.md, "The binary's pages"). Functions missing from the file keep
# the linker's default place; a stale file costs memory, never correctness.
#
# The load, all through one proxy with file discovery (scale.sh's 100 Services x 10 pods
# on loopback addresses, one nginx answering on all of them):
#   - start, first probes of every pod, the discovery file rewritten once (a reload);
#   - HTTP/1.1 keep-alive clients (wrk, a random service per request) and curl;
#   - HTTP/2 clients with prior knowledge (h2load), several streams per connection;
#   - the answers a proxy gives without a pod: unknown service (404), oversized head (431);
#   - the admin port: /metrics, /debug/pools, /healthz, /readyz;
#   - a graceful stop (SIGTERM).
# Not in the load, so left where the linker puts them: the Kubernetes watchers, tunnels
# (CONNECT, WebSocket upgrades), gRPC and the HTTP/2 upstream.
#
# Regenerate after a toolchain upgrade or a change in dependencies (their symbol hashes
# change), or when the code the load runs has moved a lot:
#   benches/load/symbol-order.sh [DIST_BINARY]   (default: target/dist/proxima, built first)
# then rebuild (cargo build --profile dist -p proxima) and check with scale.sh. Takes a few
# minutes: callgrind runs the proxy about 50 times slower. BASE_PORT [18780].
set -euo pipefail

SERVICES=100
PODS=10
BASE_PORT=${BASE_PORT:-18780}
ORIGIN_PORT=$BASE_PORT
PROXY_PORT=$((BASE_PORT + 1))
ADMIN_PORT=$((BASE_PORT + 2))

NAME=symbol-order
# shellcheck source=benches/load/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OUT=$ROOT/crates/proxima/symbol-order.txt

for tool in valgrind nginx wrk h2load curl python3; do
    command -v "$tool" >/dev/null || die "$tool is missing (valgrind; nginx and wrk: benches/load/run.sh installs them; h2load is in nghttp2-client)"
done
dist_binary "${1:-}"
BIN=$PROXIMA

write_discovery() { write_pods_discovery "$SERVICES" "$PODS" "$ORIGIN_PORT" "$1" "$WORK/discovery.yaml"; }
write_pods_origin $((SERVICES * PODS)) "$ORIGIN_PORT" "$WORK/origin.conf"
cat >"$WORK/random-service.lua" <<EOF
request = function()
    return wrk.format(nil, nil, { ["x-service"] = "svc-" .. math.random(0, $((SERVICES - 1))) })
end
EOF
write_discovery 100ms
nginx -e "$WORK/origin-error.log" -p "$WORK" -c "$WORK/origin.conf" &
PIDS+=($!)

log "starting the proxy under callgrind"
TOKIO_WORKER_THREADS=1 valgrind --tool=callgrind --demangle=no --compress-strings=no \
    --compress-pos=no --callgrind-out-file="$WORK/callgrind.out" \
    "$BIN" run --listen "127.0.0.1:$PROXY_PORT" --admin "127.0.0.1:$ADMIN_PORT" \
    --discovery "file:$WORK/discovery.yaml" --log-level warn >"$WORK/proxima.log" 2>&1 &
pid=$!
PIDS+=("$pid")
ready=''
for _ in $(seq 600); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-service: svc-0' "http://127.0.0.1:$PROXY_PORT/" || true)
    [[ $code == 200 ]] && { ready=1; break; }
    kill -0 "$pid" 2>/dev/null || die "proxima exited; see $WORK/proxima.log"
    sleep 1
done
[[ -n $ready ]] || die "no 200 through the proxy after 600 s; see $WORK/proxima.log"

admin() { curl -s -o /dev/null "http://127.0.0.1:$ADMIN_PORT$1"; }
log "HTTP/1.1: wrk for 20 s"
wrk -t1 -c32 -d20s -s "$WORK/random-service.lua" "http://127.0.0.1:$PROXY_PORT/" >"$WORK/wrk.txt"
log "  $(grep 'requests in' "$WORK/wrk.txt" | xargs)$(grep -h 'Non-2xx' "$WORK/wrk.txt" | sed 's/^ */; /')"
admin /metrics; admin /debug/pools; admin /healthz; admin /readyz; admin /
log "HTTP/2: h2load"
for s in 0 1 2 3; do
    h2load -n 400 -c 4 -m 8 -H "x-service: svc-$s" "http://127.0.0.1:$PROXY_PORT/" >"$WORK/h2load-$s.txt"
done
log "  $(cat "$WORK"/h2load-*.txt | grep -c '400 succeeded') of 4 h2load runs with all 400 requests answered"
log "answers without a pod, a discovery reload"
curl -s -o /dev/null -H 'x-service: no-such-service' "http://127.0.0.1:$PROXY_PORT/"
curl -s -o /dev/null -H "x-service: svc-1" -H "x-big: $(head -c 70000 /dev/zero | tr '\0' a)" "http://127.0.0.1:$PROXY_PORT/"
curl -s -o /dev/null -X POST --data 'reading=42' -H 'x-service: svc-2' "http://127.0.0.1:$PROXY_PORT/"
write_discovery 50ms
sleep 15
wrk -t1 -c8 -d5s -s "$WORK/random-service.lua" "http://127.0.0.1:$PROXY_PORT/" >"$WORK/wrk-2.txt"
admin /metrics; admin "/debug/pools?service=svc-3"
log "stopping the proxy (callgrind writes its counts at exit)"
kill -TERM "$pid"
wait "$pid" || true
[[ -s $WORK/callgrind.out ]] || die "callgrind wrote nothing; see $WORK/proxima.log"

# Self cost per function of the binary itself (not libc): the cost line after `calls=`
# is the call's inclusive cost and belongs to the callee, so it is skipped.
python3 - "$WORK/callgrind.out" "$BIN" "$OUT" <<'PY'
import collections, os, sys
out_path, binary, order_path = sys.argv[1:]
binary = os.path.realpath(binary)
cost = collections.Counter()
ob = fn = None
skip = False
with open(out_path) as f:
    for line in f:
        if line.startswith("ob="):
            ob = os.path.realpath(line[3:].strip())
        elif line.startswith("fn="):
            fn = line[3:].strip() if ob == binary else None
        elif line.startswith("calls="):
            skip = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            if skip:
                skip = False
            elif fn is not None:
                parts = line.split()
                cost[fn] += int(parts[1]) if len(parts) > 1 else 0
names = [name for name, _ in sorted(cost.items(), key=lambda kv: (-kv[1], kv[0]))
         if not name.startswith("0x")]
with open(order_path, "w") as f:
    f.write("".join(name + "\n" for name in names))
print(f"{len(names)} functions ran; {sum(cost.values())} instructions", file=sys.stderr)
PY
log "wrote $OUT ($(wc -l <"$OUT") functions, $(du -k "$OUT" | cut -f1) KB)"
