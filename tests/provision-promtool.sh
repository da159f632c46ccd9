#!/usr/bin/env bash
# Make `promtool` available for tests/dashboard.rs, which checks that every query of the
# Grafana dashboard in deploy/grafana/ parses and uses only metrics the proxy exports.
#
#   1. `promtool` on PATH is used as it is;
#   2. else the Debian package `prometheus` (it ships /usr/bin/promtool) is installed
#      with apt-get (its service is never started: only the binary is used);
#   3. else, where apt has no such package, promtool v$PROMTOOL_GO_VERSION is built from
#      the Go module proxy (`go install github.com/prometheus/prometheus/cmd/promtool`).
#
# The result is linked as ${PROXIMA_CACHE:-$HOME/.cache/proxima}/promtool, where the test
# looks first. Anything that cannot be provisioned is an error (non-zero exit), never a
# skip.
set -euo pipefail

# The Go module of Prometheus 2.x is versioned v0.<minor>.<patch>.
PROMTOOL_GO_VERSION="v0.54.1"
CACHE="${PROXIMA_CACHE:-$HOME/.cache/proxima}"
LINK="$CACHE/promtool"

log() { printf '[promtool] %s\n' "$*" >&2; }
die() { printf '[promtool] ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo -n "$@"
    else return 1; fi
}

mkdir -p "$CACHE"
exec 9>"$CACHE/.promtool.lock"
flock 9

found="$(command -v promtool || true)"
if [ -z "$found" ] && apt-cache show prometheus >/dev/null 2>&1; then
    log "installing the Debian package prometheus (for /usr/bin/promtool)"
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends prometheus \
        || die "apt-get install prometheus failed"
    found="$(command -v promtool || true)"
fi
if [ -z "$found" ]; then
    command -v go >/dev/null || die "no promtool, no Debian package prometheus and no go to build it"
    log "building promtool $PROMTOOL_GO_VERSION from the Go module proxy (takes minutes)"
    bin="$(mktemp -d "$CACHE/promtool.XXXXXX")"
    GOBIN="$bin" GOFLAGS=-buildvcs=false \
        go install "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_GO_VERSION" \
        || { rm -rf "$bin"; die "go install promtool@$PROMTOOL_GO_VERSION failed"; }
    mv -f "$bin/promtool" "$CACHE/promtool-$PROMTOOL_GO_VERSION"
    rm -rf "$bin"
    found="$CACHE/promtool-$PROMTOOL_GO_VERSION"
fi
version="$("$found" --version 2>&1 | head -1)" || die "$found does not run: $version"
ln -sfn "$found" "$LINK"
log "ready: $LINK -> $found ($version)"
echo "PROMTOOL=$LINK"
