# Sourced by scale.sh and idle.sh (set NAME first): the repository's paths, the run's
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
