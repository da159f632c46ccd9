#!/usr/bin/env bash
# Provision the outside conformance tools of tests/conformance.rs (issue 29):
#
#   * h2spec $H2SPEC_VERSION, built from the Go module proxy
#     (`go install github.com/summerwind/h2spec/cmd/h2spec`): HTTP/2 conformance of the
#     proxy's client side, every case of RFC 7540/7541 and the generic ones;
#   * smugglex $SMUGGLEX_VERSION, built from crates.io (`cargo install smugglex`): an
#     HTTP/1.1 request-smuggling scanner (CL.TE, TE.CL, TE.TE, H2 downgrades, ...), run
#     against the proxy in front of a real origin;
#   * nginx (Debian package nginx-light) as that origin.
#
# Binaries are cached as ${PROXIMA_CACHE:-$HOME/.cache/proxima}/h2spec-<version> and
# .../smugglex-<version>. Anything that cannot be provisioned is an error (non-zero exit),
# never a skip: the test fails when a tool is missing.
set -euo pipefail

H2SPEC_VERSION="v2.2.1+incompatible" # the newest the Go module proxy serves (h2spec 2.2.1)
SMUGGLEX_VERSION="0.4.0"
CACHE="${PROXIMA_CACHE:-$HOME/.cache/proxima}"
H2SPEC="$CACHE/h2spec-${H2SPEC_VERSION%%+*}"
SMUGGLEX="$CACHE/smugglex-$SMUGGLEX_VERSION"

log() { printf '[conformance] %s\n' "$*" >&2; }
die() { printf '[conformance] ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo -n "$@"
    else die "need root to run: $*"; fi
}

mkdir -p "$CACHE"
exec 9>"$CACHE/.conformance.lock"
flock 9

# --- h2spec -----------------------------------------------------------------------------
if [ -x "$H2SPEC" ]; then
    log "h2spec: cached $H2SPEC"
else
    command -v go >/dev/null || die "go is needed to build h2spec (none on PATH)"
    log "building h2spec $H2SPEC_VERSION with $(go version)"
    bin="$(mktemp -d "$CACHE/h2spec.XXXXXX")"
    CGO_ENABLED=0 GOBIN="$bin" GOFLAGS=-buildvcs=false \
        go install "github.com/summerwind/h2spec/cmd/h2spec@$H2SPEC_VERSION" \
        || { rm -rf "$bin"; die "go install h2spec@$H2SPEC_VERSION failed"; }
    mv -f "$bin/h2spec" "$H2SPEC"
    rm -rf "$bin"
    log "built $H2SPEC"
fi
"$H2SPEC" --dryrun >/dev/null 2>&1 || die "$H2SPEC does not run"

# --- smugglex ---------------------------------------------------------------------------
if [ -x "$SMUGGLEX" ]; then
    log "smugglex: cached $SMUGGLEX"
else
    command -v cargo >/dev/null || die "cargo is needed to build smugglex"
    log "building smugglex $SMUGGLEX_VERSION from crates.io (a few minutes on 2 cores)"
    root="$(mktemp -d "$CACHE/smugglex.XXXXXX")"
    # Its own target dir, so that it never shares (or invalidates) the workspace's.
    CARGO_TARGET_DIR="$root/target" cargo install --quiet --locked \
        --version "$SMUGGLEX_VERSION" --root "$root" smugglex \
        || { rm -rf "$root"; die "cargo install smugglex@$SMUGGLEX_VERSION failed"; }
    mv -f "$root/bin/smugglex" "$SMUGGLEX"
    rm -rf "$root"
    log "built $SMUGGLEX"
fi
"$SMUGGLEX" --version >/dev/null 2>&1 || die "$SMUGGLEX does not run"

# --- nginx, the origin behind the proxy -------------------------------------------------
if ! PATH="$PATH:/usr/sbin:/sbin" command -v nginx >/dev/null; then
    log "nginx missing; installing Debian package nginx-light"
    as_root apt-get update -q || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends nginx-light \
        || die "apt-get install nginx-light failed"
fi
log "nginx: $(PATH="$PATH:/usr/sbin:/sbin" nginx -v 2>&1)"
log "ready: $H2SPEC, $SMUGGLEX"
