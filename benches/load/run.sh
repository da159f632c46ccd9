#!/usr/bin/env bash
# Load comparison: Proxima vs nginx vs HAProxy as reverse proxies, with wrk.
#
# All three proxies forward to ONE shared origin (an nginx answering a fixed
# small 200) over keep-alive upstream connections, each with 2 workers /
# threads, on 127.0.0.1. wrk runs the same load against the origin directly
# (the ceiling) and against each proxy, ROUNDS times interleaved; the report
# gives the median of each metric. Everything runs from a temp dir: no system
# service file, pid file or log is touched, and every process started here is
# stopped on exit.
#
# Usage: benches/load/run.sh
# Environment (defaults in brackets):
#   DURATION [15s]  CONNECTIONS [64]  THREADS [2] (wrk threads)  WARMUP [3s]
#   ROUNDS [3]      WORKERS [2] (proxy workers/threads)  ORIGIN_WORKERS [2]
#   BASE_PORT [18080] (uses BASE_PORT..BASE_PORT+4)
#   PROXIMA [auto]  auto: include Proxima if `proxima run` exists; skip; require
#   PIN_CPUS [no]   yes: every proxy's workers pinned one per CPU (nginx
#                   `worker_cpu_affinity auto`, HAProxy `cpu-map`, Proxima
#                   `--worker-cpus pinned`); the origin and wrk are not pinned
#   PROXIMA_ARGS    more flags for `proxima run` (e.g. `--worker-yield-after 0s`)
#   RESULTS_DIR [benches/load/results]
set -euo pipefail

DURATION=${DURATION:-15s}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
WARMUP=${WARMUP:-3s}
ROUNDS=${ROUNDS:-3}
WORKERS=${WORKERS:-2}
ORIGIN_WORKERS=${ORIGIN_WORKERS:-2}
BASE_PORT=${BASE_PORT:-18080}
PROXIMA=${PROXIMA:-auto}
PIN_CPUS=${PIN_CPUS:-no}
PROXIMA_ARGS=${PROXIMA_ARGS:-}
PROXIMA_PIN=()
[[ $PIN_CPUS == yes ]] && PROXIMA_PIN=(--worker-cpus pinned)

ORIGIN_PORT=$BASE_PORT
NGINX_PORT=$((BASE_PORT + 1))
HAPROXY_PORT=$((BASE_PORT + 2))
PROXIMA_PORT=$((BASE_PORT + 3))
PROXIMA_ADMIN_PORT=$((BASE_PORT + 4))

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RESULTS_DIR=${RESULTS_DIR:-$ROOT/benches/load/results}
STAMP=$(date +%Y-%m-%d_%H%M%S)
WORK=$(mktemp -d /tmp/proxima-load.XXXXXX)

log() { printf '[load %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------- cleanup
PIDS=()
stop_pid() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local status=$?
    for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
    PIDS=()
    if [[ $status -ne 0 ]]; then
        log "failed (exit $status); logs kept in $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- tools
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
APT_UPDATED=
apt_install() {
    [[ -n $APT_UPDATED ]] || { as_root apt-get update -qq; APT_UPDATED=1; }
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
# The packages' system services are never started: only the binaries are used.
command -v wrk >/dev/null || { log "installing wrk"; apt_install wrk; }
command -v nginx >/dev/null || { log "installing nginx-light"; apt_install nginx-light; }
command -v haproxy >/dev/null || { log "installing haproxy"; apt_install haproxy; }
command -v curl >/dev/null || { log "installing curl"; apt_install curl; }
if ! command -v gnuplot >/dev/null; then
    log "installing gnuplot-nox (for the chart)"
    apt_install gnuplot-nox || log "gnuplot unavailable: no chart"
fi

for port in $ORIGIN_PORT $NGINX_PORT $HAPROXY_PORT $PROXIMA_PORT $PROXIMA_ADMIN_PORT; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        die "port $port is busy; set BASE_PORT"
    fi
done

# ---------------------------------------------------------------- proxima
PROXIMA_BIN=$ROOT/target/dist/proxima
PROXIMA_NOTE="Proxima was skipped (PROXIMA=skip)."
if [[ $PROXIMA != skip ]]; then
    log "building proxima (profile dist: fat LTO, a few minutes)"
    if (cd "$ROOT" && cargo build --profile dist -p proxima) >"$WORK/cargo-build.log" 2>&1 &&
        "$PROXIMA_BIN" run --help >/dev/null 2>&1; then
        PROXIMA=yes
    else
        [[ $PROXIMA == require ]] && { cat "$WORK/cargo-build.log" >&2; die "proxima is not available"; }
        PROXIMA_NOTE="Proxima was not measured: \`cargo build --profile dist -p proxima\` failed or the binary has no \`run\` subcommand yet."
        log "$PROXIMA_NOTE"
        PROXIMA=skip
    fi
fi

# ---------------------------------------------------------------- configs
# shellcheck source=benches/load/configs.sh
source "$ROOT/benches/load/configs.sh"
write_configs

# ---------------------------------------------------------------- processes
START_PID=
start() { # $1 = name, rest = command; sets START_PID
    local name=$1; shift
    "$@" >"$WORK/$name.out" 2>&1 &
    START_PID=$!
    PIDS+=("$START_PID")
}
wait_ready() { # $1 = name, $2 = port, $3 = pid
    local deadline=$((SECONDS + 30)) code
    while ((SECONDS < deadline)); do
        kill -0 "$3" 2>/dev/null || { cat "$WORK/$1.out" >&2; die "$1 exited during start-up"; }
        code=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-service: bench' "http://127.0.0.1:$2/" || true)
        [[ $code == 200 ]] && return 0
        sleep 0.2
    done
    cat "$WORK/$1.out" >&2
    die "$1 did not answer 200 on port $2 within 30 s"
}
stop() { # $1 = pid
    stop_pid "$1"
    local kept=()
    for pid in "${PIDS[@]}"; do [[ $pid == "$1" ]] || kept+=("$pid"); done
    PIDS=("${kept[@]}")
}
start_target() { # $1 = target; sets TARGET_PID (empty for the origin) and TARGET_PORT
    TARGET_PID=
    case $1 in
    origin) TARGET_PORT=$ORIGIN_PORT; return 0 ;;
    nginx) TARGET_PORT=$NGINX_PORT; start nginx nginx -e "$WORK/nginx-error.log" -p "$WORK" -c "$WORK/nginx.conf" ;;
    haproxy) TARGET_PORT=$HAPROXY_PORT; start haproxy haproxy -db -f "$WORK/haproxy.cfg" ;;
    proxima)
        TARGET_PORT=$PROXIMA_PORT
        start proxima env TOKIO_WORKER_THREADS="$WORKERS" "$PROXIMA_BIN" run \
            --listen "127.0.0.1:$PROXIMA_PORT" --admin "127.0.0.1:$PROXIMA_ADMIN_PORT" \
            --discovery "file:$WORK/discovery.yaml" --log-level warn \
            "${PROXIMA_PIN[@]}" $PROXIMA_ARGS
        ;;
    esac
    TARGET_PID=$START_PID
    wait_ready "$1" "$TARGET_PORT" "$TARGET_PID"
}

# ---------------------------------------------------------------- wrk
# Prints "rps p50_ms p99_ms errors" for one wrk --latency output on stdin.
parse_wrk() {
    awk '
        function ms(v) {
            if (v ~ /us$/) return substr(v, 1, length(v) - 2) / 1000
            if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0
            if (v ~ /m$/)  return substr(v, 1, length(v) - 1) * 60000
            if (v ~ /s$/)  return substr(v, 1, length(v) - 1) * 1000
            return v + 0
        }
        $1 == "50%" { p50 = ms($2) }
        $1 == "99%" { p99 = ms($2) }
        $1 == "Requests/sec:" { rps = $2 }
        /Non-2xx or 3xx responses:/ { errors += $NF }
        /Socket errors:/ { for (i = 3; i <= NF; i += 2) { gsub(",", "", $(i + 1)); errors += $(i + 1) } }
        END { printf "%.0f %.3f %.3f %d\n", rps, p50, p99, errors }
    '
}

TARGETS=(origin nginx haproxy)
[[ $PROXIMA == yes ]] && TARGETS+=(proxima)
WRK_ARGS=(-t"$THREADS" -c"$CONNECTIONS" --latency -H 'x-service: bench')

log "starting the shared origin (nginx, $ORIGIN_WORKERS workers) on :$ORIGIN_PORT"
start origin nginx -e "$WORK/origin-error.log" -p "$WORK" -c "$WORK/origin.conf"
wait_ready origin "$ORIGIN_PORT" "$START_PID"

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
RAW=$WORK/raw.csv
echo "round,target,requests_per_s,p50_ms,p99_ms,errors" >"$RAW"
log "targets: ${TARGETS[*]}; wrk -t$THREADS -c$CONNECTIONS -d$DURATION --latency (warm-up $WARMUP), $ROUNDS round(s)"
for round in $(seq "$ROUNDS"); do
    for target in "${TARGETS[@]}"; do
        start_target "$target"
        url="http://127.0.0.1:$TARGET_PORT/"
        log "round $round/$ROUNDS: $target warm-up ($WARMUP)"
        wrk "${WRK_ARGS[@]}" -d"$WARMUP" "$url" >/dev/null
        log "round $round/$ROUNDS: $target measuring ($DURATION)"
        wrk "${WRK_ARGS[@]}" -d"$DURATION" "$url" >"$WORK/wrk-$target-$round.txt"
        read -r rps p50 p99 errors < <(parse_wrk <"$WORK/wrk-$target-$round.txt")
        log "round $round/$ROUNDS: $target: $rps req/s, p50 $p50 ms, p99 $p99 ms, errors $errors"
        echo "$round,$target,$rps,$p50,$p99,$errors" >>"$RAW"
        if [[ -n $TARGET_PID ]]; then stop "$TARGET_PID"; fi
    done
done

# ---------------------------------------------------------------- report
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p "$RESULTS_DIR"
MD=$RESULTS_DIR/$STAMP.md
CSV=$RESULTS_DIR/$STAMP.csv
PNG=$RESULTS_DIR/$STAMP.png
cp "$RAW" "$RESULTS_DIR/$STAMP.raw.csv"

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
column_of() { # $1 = target, $2 = column number in raw.csv, $3 = printf format
    awk -F, -v t="$1" -v c="$2" 'NR > 1 && $2 == t { print $c }' "$RAW" | median | xargs printf "$3"
}
echo "target,requests_per_s,p50_ms,p99_ms,errors" >"$CSV"
declare -A RPS P50 P99
for target in "${TARGETS[@]}"; do
    RPS[$target]=$(column_of "$target" 3 %.0f)
    P50[$target]=$(column_of "$target" 4 %.3f)
    P99[$target]=$(column_of "$target" 5 %.3f)
    errors=$(awk -F, -v t="$target" 'NR > 1 && $2 == t { s += $6 } END { print s + 0 }' "$RAW")
    echo "$target,${RPS[$target]},${P50[$target]},${P99[$target]},$errors" >>"$CSV"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

{
    echo "# Load comparison, $STAMP"
    echo
    echo "Reverse proxies on 127.0.0.1 in front of one shared origin (nginx, fixed small 200),"
    echo "keep-alive upstream connections, $WORKERS workers/threads per proxy$([[ $PIN_CPUS == yes ]] && echo ', each pinned to its own CPU (nginx \`worker_cpu_affinity auto\`, HAProxy \`cpu-map\`, Proxima \`--worker-cpus pinned\`)')."
    [[ -n $PROXIMA_ARGS ]] && echo "Proxima's extra flags: \`$PROXIMA_ARGS\`."
    echo "Load: \`wrk -t$THREADS -c$CONNECTIONS -d$DURATION --latency -H 'x-service: bench'\`"
    echo "after a $WARMUP warm-up; $ROUNDS round(s), targets interleaved; medians over rounds."
    echo "Errors = non-2xx/3xx responses + socket errors, summed over rounds."
    echo
    echo "| target | requests/s | p50 (ms) | p99 (ms) | errors |"
    echo "|---|---:|---:|---:|---:|"
    tail -n +2 "$CSV" | while IFS=, read -r target rps p50 p99 errors; do
        label=$target; [[ $target == origin ]] && label="origin (direct, ceiling)"
        echo "| $label | $rps | $p50 | $p99 | $errors |"
    done
    echo
    if [[ $PROXIMA == yes ]]; then
        echo "| ratio | requests/s | p50 | p99 |"
        echo "|---|---:|---:|---:|"
        for other in nginx haproxy; do
            echo "| proxima / $other | $(ratio "${RPS[proxima]}" "${RPS[$other]}") | $(ratio "${P50[proxima]}" "${P50[$other]}") | $(ratio "${P99[proxima]}" "${P99[$other]}") |"
        done
        echo
    else
        echo "$PROXIMA_NOTE"
        echo
    fi
    echo "Machine: $(nproc) CPU(s), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), kernel $(uname -r)."
    echo "Versions: $(nginx -v 2>&1 | sed 's/.*: //'), $(haproxy -v | head -1 | awk '{print "haproxy " $3}'), wrk $(wrk -v 2>&1 | head -1 | awk '{print $2}'),"
    echo "proxima $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)$(cd "$ROOT" && git diff --quiet 2>/dev/null || echo ' (uncommitted changes)')."
    echo "All processes share the same $(nproc) cores (wrk included), so absolute numbers are"
    echo "bounded by CPU contention; compare the ratios. Load average (1/5/15 min) before the"
    echo "first round: $LOAD_BEFORE; after the last: $LOAD_AFTER (the second includes the benchmark's"
    echo "own 5-6 busy threads; a higher first value means other work skewed the results)."
    echo
    echo "Raw rounds: \`$(basename "$RESULTS_DIR/$STAMP.raw.csv")\`."
    if command -v gnuplot >/dev/null; then echo; echo "![req/s and p99]($(basename "$PNG"))"; fi
} >"$MD"

if command -v gnuplot >/dev/null; then
    tail -n +2 "$CSV" | tr ',' ' ' >"$WORK/plot.dat"
    gnuplot <<EOF || log "gnuplot failed: no chart"
set terminal pngcairo size 1100,450 font ",10"
set output "$PNG"
set multiplot layout 1,2 title "Reverse proxy load test: wrk -t$THREADS -c$CONNECTIONS -d$DURATION (median of $ROUNDS)"
set style fill solid 0.8 border -1
set boxwidth 0.6
set grid ytics
set yrange [0:*]
set xtics nomirror
unset key
set title "throughput (requests/s, higher is better)"
plot "$WORK/plot.dat" using 0:2:xtic(1) with boxes lc rgb "#4e79a7", \
     "" using 0:2:(sprintf("%.0f", \$2)) with labels offset 0,0.7
set title "p99 latency (ms, lower is better)"
plot "$WORK/plot.dat" using 0:4:xtic(1) with boxes lc rgb "#e15759", \
     "" using 0:4:(sprintf("%.2f", \$4)) with labels offset 0,0.7
unset multiplot
EOF
fi

cat "$MD"
if [[ -f $PNG ]]; then log "written: $MD, $CSV, $PNG"; else log "written: $MD, $CSV"; fi
