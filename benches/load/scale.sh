#!/usr/bin/env bash
# Memory and telemetry of one Proxima at the scale of an edge cluster (issue 9):
# SERVICES Services x PODS pods, every pod a distinct address 127.0.X.Y:ORIGIN_PORT
# (one nginx listens on all of them and answers a small 200), and wrk sending each
# request to a random service (x-service: svc-N). Reports, per worker count, the
# proxy's RSS (now and peak, from /proc), the requests/s, the size and series count
# of /metrics, and the idle upstream connections kept.
#
# Usage: benches/load/scale.sh
# Environment (defaults in brackets):
#   SERVICES [100]  PODS [10]  DURATION [20s]  CONNECTIONS [32]  WORKERS ["1 2"]
#   BASE_PORT [18180] (origin port; proxy and admin use the next two)
#   PROXIMA_ARGS [] extra flags for `proxima run` (e.g. --upstream-max-idle 256)
#   PROXIMA_BIN [target/dist/proxima, built first] another build to measure (an older
#   one too: the worker count goes in TOKIO_WORKER_THREADS, which every build reads)
#   RESULTS_DIR [benches/load/results]
#   SMAPS_DIR [] if set, /proc/PID/smaps of the proxy is copied there after the load
#   (smaps-WORKERS.txt), read right after the RSS figures: which mapping holds the bytes
#
# IDLE=1 measures idle endpoints instead (issue 29): for each size in ENDPOINTS
# ["1000 10000 50000"], ENDPOINTS/PODS Services of PODS pods from file discovery, one
# worker (the first of WORKERS), no client traffic. It waits until every pod has had
# its first probe (counted in the origin's access log) and SETTLE [15] seconds more
# (the proxy trims its heap every 10 s), then reports RSS, RssAnon and RssFile, and
# the bytes per endpoint over the smallest size. /metrics is scraped only after the
# figures are read: rendering it at 50,000 endpoints allocates megabytes of its own.
# The origin listens on the wildcard address (one socket answers every 127.x.y.z,
# where 50,000 listening sockets would pass the open-file limit) and answers only
# loopback clients.
set -euo pipefail

SERVICES=${SERVICES:-100}
PODS=${PODS:-10}
DURATION=${DURATION:-20s}
CONNECTIONS=${CONNECTIONS:-32}
WORKERS=${WORKERS:-"1 2"}
BASE_PORT=${BASE_PORT:-18180}
ORIGIN_PORT=$BASE_PORT
PROXY_PORT=$((BASE_PORT + 1))
ADMIN_PORT=$((BASE_PORT + 2))

IDLE=${IDLE:-0}
ENDPOINTS=${ENDPOINTS:-"1000 10000 50000"}
SETTLE=${SETTLE:-15}

NAME=scale
# shellcheck source=benches/load/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
BIN=${PROXIMA_BIN:-}

for tool in wrk nginx curl; do
    command -v "$tool" >/dev/null || die "$tool is missing (benches/load/run.sh installs it)"
done
if [[ -z $BIN ]]; then
    BIN=$ROOT/target/dist/proxima
    log "building proxima (profile dist: fat LTO, a few minutes)"
    (cd "$ROOT" && cargo build --profile dist -p proxima) >"$WORK/build.log" 2>&1 ||
        { cat "$WORK/build.log" >&2; die "build failed"; }
fi

# Run a fresh copy of the binary. How much of its code is resident depends on how its
# file's pages entered the page cache: after something read the whole file (nm, a cp
# from it, a checksum), the kernel holds it in large folios and maps a whole folio on a
# fault, so the same build shows ~1.5 MB more code resident than when it was just
# written, as a container image's files are, or read cold from disk.
cp "$BIN" "$WORK/proxima"
RUN_BIN=$WORK/proxima

# write_discovery SERVICES FILE: SERVICES Services of PODS pods each (common.sh).
write_discovery() { write_pods_discovery "$1" "$PODS" "$ORIGIN_PORT" 100ms "$2"; }
kib() { awk -v k="$2" '$1 == k":" { print $2 }' "/proc/$1/status"; }
mb() { printf '%.1f' "$(echo "$1 / 1024" | bc -l)"; }
describe_build() {
    echo "${PROXIMA_BIN:-$(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet || echo ' (uncommitted changes)')}"
}

if [[ $IDLE == 1 ]]; then
    workers=${WORKERS%% *}
    cat >"$WORK/origin.conf" <<CONF
worker_processes 1; daemon off; pid $WORK/origin.pid;
events { worker_connections 4096; }
http { access_log $WORK/access.log; server {
  listen $ORIGIN_PORT;
  allow 127.0.0.0/8; deny all;
  location / { return 200 "hello from origin\n"; } } }
CONF
    nginx -e "$WORK/origin-error.log" -p "$WORK" -c "$WORK/origin.conf" &
    PIDS+=($!)
    RESULT=$RESULTS_DIR/${STAMP}-scale-idle.md
    mkdir -p "$RESULTS_DIR"
    {
        echo "# Proxima with idle endpoints (file discovery, $PODS pods per Service), $STAMP"
        echo
        echo "proxima $(describe_build)${PROXIMA_ARGS:+ with \`$PROXIMA_ARGS\`}, $workers worker; RSS read ${SETTLE} s after every pod's first probe, no client traffic; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)."
        echo
        echo "| endpoints | RSS (MB) | anonymous (MB) | file (MB) | peak RSS (MB) | RSS per endpoint above the first size (B) | anonymous per endpoint above the first size (B) | first probes seen | /metrics afterwards (KB) |"
        echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    } >"$RESULT"
    first_rss='' first_anon='' first_n=''
    for n in $ENDPOINTS; do
        write_discovery $((n / PODS)) "$WORK/discovery-$n.yaml"
        : >"$WORK/access.log"
        TOKIO_WORKER_THREADS=$workers "$RUN_BIN" run --listen "127.0.0.1:$PROXY_PORT" --admin "127.0.0.1:$ADMIN_PORT" \
            --discovery "file:$WORK/discovery-$n.yaml" --log-level warn ${PROXIMA_ARGS:-} >"$WORK/proxima-$n.log" 2>&1 &
        pid=$!
        PIDS+=("$pid")
        for _ in $(seq 600); do
            (($(wc -l <"$WORK/access.log") >= n)) && break
            kill -0 "$pid" 2>/dev/null || die "proxima exited; see $WORK/proxima-$n.log"
            sleep 1
        done
        probes=$(wc -l <"$WORK/access.log")
        log "$n endpoints: $probes first probes seen; settling for ${SETTLE} s"
        sleep "$SETTLE"
        rss=$(kib "$pid" VmRSS) anon=$(kib "$pid" RssAnon) file=$(kib "$pid" RssFile) hwm=$(kib "$pid" VmHWM)
        bytes=$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | wc -c)
        per='-' per_anon='-'
        if [[ -z $first_n ]]; then
            first_rss=$rss first_anon=$anon first_n=$n
        else
            per=$(((rss - first_rss) * 1024 / (n - first_n)))
            per_anon=$(((anon - first_anon) * 1024 / (n - first_n)))
        fi
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %d |\n' "$n" "$(mb "$rss")" "$(mb "$anon")" "$(mb "$file")" \
            "$(mb "$hwm")" "$per" "$per_anon" "$probes" $((bytes / 1024)) >>"$RESULT"
        log "$n endpoints: RSS $(mb "$rss") MB (anonymous $(mb "$anon"), file $(mb "$file"), peak $(mb "$hwm"))"
        kill "$pid"
        wait "$pid" 2>/dev/null || true
    done
    echo >>"$RESULT"
    echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg). Command: \`IDLE=1 ENDPOINTS=\"$ENDPOINTS\" benches/load/scale.sh\`." >>"$RESULT"
    cat "$RESULT"
    exit 0
fi

# The load: one nginx listening on every pod's address.
TOTAL=$((SERVICES * PODS))
write_pods_origin "$TOTAL" "$ORIGIN_PORT" "$WORK/origin.conf"
cat >"$WORK/random-service.lua" <<EOF
math.randomseed(os.time())
request = function()
    return wrk.format(nil, nil, { ["x-service"] = "svc-" .. math.random(0, $((SERVICES - 1))) })
end
EOF

write_discovery "$SERVICES" "$WORK/discovery.yaml"
nginx -e "$WORK/origin-error.log" -p "$WORK" -c "$WORK/origin.conf" &
PIDS+=($!)

RESULT=$RESULTS_DIR/${STAMP}-scale.md
mkdir -p "$RESULTS_DIR"
{
    echo "# Proxima at $SERVICES Services x $PODS pods, $STAMP"
    echo
    echo "proxima $(describe_build)${PROXIMA_ARGS:+ with \`$PROXIMA_ARGS\`}; wrk -t1 -c$CONNECTIONS -d$DURATION, a random service per request; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo
    echo "| workers | req/s | RSS after load (MB) | of it anonymous (MB) | of it file (MB) | peak RSS (MB) | /metrics (KB) | series | idle upstream connections |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} >"$RESULT"
for workers in $WORKERS; do
    TOKIO_WORKER_THREADS=$workers "$RUN_BIN" run --listen "127.0.0.1:$PROXY_PORT" --admin "127.0.0.1:$ADMIN_PORT" \
        --discovery "file:$WORK/discovery.yaml" --log-level warn ${PROXIMA_ARGS:-} >"$WORK/proxima-$workers.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    for _ in $(seq 100); do
        [[ $(curl -s -o /dev/null -w '%{http_code}' -H 'x-service: svc-0' "http://127.0.0.1:$PROXY_PORT/") == 200 ]] && break
        sleep 0.2
    done
    log "workers=$workers: RSS before load $(($(kib "$pid" VmRSS) / 1024)) MB; running wrk for $DURATION"
    wrk -t1 -c"$CONNECTIONS" -d"$DURATION" -s "$WORK/random-service.lua" "http://127.0.0.1:$PROXY_PORT/" >"$WORK/wrk-$workers.txt"
    rps=$(awk '/Requests\/sec/ { print $2 }' "$WORK/wrk-$workers.txt")
    rss=$(kib "$pid" VmRSS)
    hwm=$(kib "$pid" VmHWM)
    anon=$(kib "$pid" RssAnon)
    file=$(kib "$pid" RssFile)
    [[ -n ${SMAPS_DIR:-} ]] && mkdir -p "$SMAPS_DIR" && cp "/proc/$pid/smaps" "$SMAPS_DIR/smaps-$workers.txt"
    curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" >"$WORK/metrics-$workers.txt"
    bytes=$(wc -c <"$WORK/metrics-$workers.txt")
    series=$(grep -vc '^#' "$WORK/metrics-$workers.txt")
    idle=$(awk '$1 == "proxima_upstream_idle_connections" { print $2 }' "$WORK/metrics-$workers.txt")
    printf '| %s | %.0f | %.1f | %.1f | %.1f | %.1f | %d | %d | %s |\n' "$workers" "$rps" "$(echo "$rss / 1024" | bc -l)" \
        "$(echo "$anon / 1024" | bc -l)" "$(echo "$file / 1024" | bc -l)" \
        "$(echo "$hwm / 1024" | bc -l)" $((bytes / 1024)) "$series" "${idle:-?}" >>"$RESULT"
    log "workers=$workers: $rps req/s, RSS $((rss / 1024)) MB (peak $((hwm / 1024)) MB), /metrics $((bytes / 1024)) KB"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
done
echo >>"$RESULT"
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg). Command: \`benches/load/scale.sh\`." >>"$RESULT"
cat "$RESULT"
