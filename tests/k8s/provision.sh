#!/usr/bin/env bash
# Make a real Kubernetes control plane (etcd + kube-apiserver) and kubectl available on
# this machine, for the tests in tests/k8s_*.rs and crates/proxima-k8s, and the Fortio
# load generator for tests/k8s_rollout.rs.
#
#   * etcd 3.4 from Debian (`etcd-server`, /usr/bin/etcd), installed with apt if missing.
#   * nftables (`nft`) from Debian, installed with apt if missing: the testbed's
#     `blackhole` and `node-down` events drop packets with it (crates/proxima-testbed).
#   * kube-apiserver and kubectl v1.31.4 built from the Go module proxy: a throwaway module
#     requires k8s.io/kubernetes v1.31.4 and replaces every staging module (the list comes
#     from k8s.io/kubernetes' own go.mod) with its published v0.31.4.
#   * Fortio 1.68.2 (`go install fortio.org/fortio@v1.68.2`). The paper's rollout
#     experiment used 1.38.4, whose checksum the Go checksum database does not serve
#     here; releases from 1.69 on need grol.io modules the module proxy refuses. 1.68.2
#     has the same `load` flags (-c, -qps, -t, -json) and JSON result format.
#
# Binaries are cached as
#     ${PROXIMA_CACHE:-$HOME/.cache/proxima}/kube-apiserver-v1.31.4
#     ${PROXIMA_CACHE:-$HOME/.cache/proxima}/kubectl-v1.31.4
#     ${PROXIMA_CACHE:-$HOME/.cache/proxima}/fortio-v1.68.2
# so a second run builds nothing. Anything that cannot be provisioned is an error
# (non-zero exit); nothing is skipped silently.
#
# Usage: tests/k8s/provision.sh            (prints the paths it provisioned at the end)
set -euo pipefail

K8S_VERSION="1.31.4"
STAGING_VERSION="v0.${K8S_VERSION#1.}"          # 1.31.4 -> v0.31.4
CACHE="${PROXIMA_CACHE:-$HOME/.cache/proxima}"
APISERVER="$CACHE/kube-apiserver-v$K8S_VERSION"
KUBECTL="$CACHE/kubectl-v$K8S_VERSION"
FORTIO_VERSION="1.68.2"
FORTIO="$CACHE/fortio-v$FORTIO_VERSION"
ETCD="${PROXIMA_ETCD:-/usr/bin/etcd}"

started=$(date +%s)
log() { printf '[provision %3ss] %s\n' "$(( $(date +%s) - started ))" "$*" >&2; }
die() { printf '[provision] ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo -n "$@"
    else die "need root to run: $*"; fi
}

# --- etcd -------------------------------------------------------------------------------
if [ -x "$ETCD" ]; then
    log "etcd: $ETCD ($("$ETCD" --version | head -1))"
else
    log "etcd: $ETCD missing; installing Debian package etcd-server"
    as_root apt-get update -q || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q etcd-server \
        || die "apt-get install etcd-server failed"
    [ -x "$ETCD" ] || die "etcd-server installed but $ETCD is not there"
    log "etcd: installed $("$ETCD" --version | head -1)"
fi

# --- nftables (the testbed's packet drops) ---------------------------------------------
if PATH="$PATH:/usr/sbin:/sbin" command -v nft >/dev/null; then
    log "nft: $(PATH="$PATH:/usr/sbin:/sbin" nft --version)"
else
    log "nft missing; installing Debian package nftables"
    as_root apt-get update -q || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q nftables \
        || die "apt-get install nftables failed"
    PATH="$PATH:/usr/sbin:/sbin" command -v nft >/dev/null \
        || die "nftables installed but nft is not there"
    log "nft: installed $(PATH="$PATH:/usr/sbin:/sbin" nft --version)"
fi

command -v openssl >/dev/null || die "openssl is needed to make service-account keys"

# --- kube-apiserver and kubectl ---------------------------------------------------------
mkdir -p "$CACHE"
# One build at a time, even if several test runs provision at once.
exec 9>"$CACHE/.provision.lock"
flock 9

if [ -x "$APISERVER" ] && [ -x "$KUBECTL" ]; then
    log "kube-apiserver: cached $APISERVER"
    log "kubectl: cached $KUBECTL"
else
    command -v go >/dev/null || die "go is needed to build kube-apiserver (none on PATH)"
    log "building kube-apiserver and kubectl v$K8S_VERSION with $(go version) (takes minutes)"
    work="$(mktemp -d "$CACHE/build.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    cd "$work"

    # The staging modules k8s.io/kubernetes replaces with ./staging/src/...: the proxy
    # serves each of them as k8s.io/<name> v0.<minor>.<patch>.
    log "fetching k8s.io/kubernetes v$K8S_VERSION go.mod from the module proxy"
    go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" > download.json \
        || die "go mod download k8s.io/kubernetes@v$K8S_VERSION failed"
    gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' download.json)"
    [ -f "$gomod" ] || die "no go.mod for k8s.io/kubernetes in: $(cat download.json)"
    staging="$(sed -n 's#^[[:space:]]*\(k8s.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$gomod")"
    [ -n "$staging" ] || die "found no staging replacements in $gomod"
    log "replacing $(echo "$staging" | wc -l) staging modules with $STAGING_VERSION"

    {
        echo "module proxima.local/k8sbuild"
        echo
        echo "go 1.22.0"
        echo
        echo "require k8s.io/kubernetes v$K8S_VERSION"
        echo
        echo "replace ("
        for m in $staging; do echo "	$m => $m $STAGING_VERSION"; done
        echo ")"
    } > go.mod
    cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO

    log "go mod tidy"
    GOFLAGS=-mod=mod go mod tidy >tidy.log 2>&1 || { cat tidy.log >&2; die "go mod tidy failed"; }

    ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags="$ldflags -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1"
        ldflags="$ldflags -X $pkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
        ldflags="$ldflags -X $pkg.gitTreeState=clean"
    done
    mkdir -p bin
    log "go build kube-apiserver kubectl"
    GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath -ldflags "$ldflags" -o bin/ \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl \
        || die "go build of kube-apiserver/kubectl failed"
    mv -f bin/kube-apiserver "$APISERVER"
    mv -f bin/kubectl "$KUBECTL"
    log "built $APISERVER and $KUBECTL"
fi

# --- fortio ------------------------------------------------------------------------------
if [ -x "$FORTIO" ]; then
    log "fortio: cached $FORTIO"
else
    command -v go >/dev/null || die "go is needed to build fortio (none on PATH)"
    log "building fortio v$FORTIO_VERSION with $(go version)"
    fortio_bin="$(mktemp -d "$CACHE/fortio.XXXXXX")"
    GOBIN="$fortio_bin" GOFLAGS=-buildvcs=false go install "fortio.org/fortio@v$FORTIO_VERSION" \
        || { rm -rf "$fortio_bin"; die "go install fortio.org/fortio@v$FORTIO_VERSION failed"; }
    mv -f "$fortio_bin/fortio" "$FORTIO"
    rm -rf "$fortio_bin"
    log "built $FORTIO"
fi
fortio_version="$("$FORTIO" version 2>&1)" || die "$FORTIO does not run: $fortio_version"
[ "$fortio_version" = "$FORTIO_VERSION" ] || die "$FORTIO reports version $fortio_version"

apiserver_version="$("$APISERVER" --version 2>&1)" || die "$APISERVER does not run: $apiserver_version"
kubectl_version="$("$KUBECTL" version --client 2>&1)" || die "$KUBECTL does not run: $kubectl_version"
log "ready: $apiserver_version; kubectl $(echo "$kubectl_version" | tr '\n' ' '); fortio $fortio_version"
echo "ETCD=$ETCD"
echo "KUBE_APISERVER=$APISERVER"
echo "KUBECTL=$KUBECTL"
echo "FORTIO=$FORTIO"
