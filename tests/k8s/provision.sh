#!/usr/bin/env bash
# Make a real Kubernetes available on this machine, for the tests in tests/k8s_*.rs,
# crates/proxima-k8s and the one-node cluster of tests/cluster/ (tests/k8s_node.rs), and
# the Fortio load generator for the rollout tests.
#
#   * etcd 3.4 from Debian (`etcd-server`, /usr/bin/etcd), installed with apt if missing.
#   * nftables (`nft`) from Debian, installed with apt if missing: the testbed's
#     `blackhole` and `node-down` events drop packets with it (crates/proxima-testbed).
#   * For the one-node cluster (tests/cluster/up.sh), from Debian: containerd, runc, the
#     CNI plugins (bridge, host-local, portmap, loopback), iptables and conntrack (which
#     kube-proxy and the kubelet call), podman (builds the images), gcc's static libc
#     (the pause image) and binutils (objcopy strips the image's binary of debug info).
#   * Every Kubernetes component v1.31.4, built from the Go module proxy: a throwaway
#     module requires k8s.io/kubernetes v1.31.4 and replaces every staging module (the
#     list comes from k8s.io/kubernetes' own go.mod) with its published v0.31.4. One build
#     makes kube-apiserver, kubectl, kube-controller-manager, kube-scheduler, kubelet and
#     kube-proxy, and agnhost (test/images/agnhost in the same module, the e2e test server
#     examples/kubernetes runs; static, for a FROM scratch image).
#   * Fortio 1.68.2 (`go install fortio.org/fortio@v1.68.2`). The paper's rollout
#     experiment used 1.38.4, whose checksum the Go checksum database does not serve
#     here; releases from 1.69 on need grol.io modules the module proxy refuses. 1.68.2
#     has the same `load` flags (-c, -qps, -t, -json) and JSON result format.
#
# Binaries are cached as
#     ${PROXIMA_CACHE:-$HOME/.cache/proxima}/<component>-v1.31.4   (kube-apiserver, kubectl, ...)
#     ${PROXIMA_CACHE:-$HOME/.cache/proxima}/agnhost-v1.31.4
#     ${PROXIMA_CACHE:-$HOME/.cache/proxima}/fortio-v1.68.2
# so a second run builds nothing; only missing ones are built. Anything that cannot be
# provisioned is an error (non-zero exit); nothing is skipped silently.
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

# --- the cluster's Debian packages ------------------------------------------------------
# command -> package; /usr/sbin is searched too (iptables, conntrack live there).
missing_pkgs=""
for pair in containerd:containerd runc:runc podman:podman iptables:iptables \
        conntrack:conntrack gcc:gcc objcopy:binutils; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "${pair%%:*}" >/dev/null \
        || missing_pkgs="$missing_pkgs ${pair#*:}"
done
for plugin in bridge host-local portmap loopback; do
    [ -x "/usr/lib/cni/$plugin" ] || { missing_pkgs="$missing_pkgs containernetworking-plugins"; break; }
done
# gcc -static needs the static C library (libc6-dev carries libc.a).
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || [ -n "$(find /usr/lib -name libc.a -print -quit 2>/dev/null)" ] \
    || missing_pkgs="$missing_pkgs libc6-dev"
if [ -n "$missing_pkgs" ]; then
    log "installing Debian packages for the one-node cluster:$missing_pkgs"
    as_root apt-get update -q || die "apt-get update failed"
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q $missing_pkgs \
        || die "apt-get install$missing_pkgs failed"
fi
log "cluster packages: $(containerd --version | cut -d' ' -f3), runc $(runc --version | head -1 | cut -d' ' -f3), $(podman --version)"

# --- Kubernetes components --------------------------------------------------------------
mkdir -p "$CACHE"
# One build at a time, even if several test runs provision at once.
exec 9>"$CACHE/.provision.lock"
flock 9

# name -> Go package. agnhost is built static (CGO off) because its image is FROM scratch.
COMPONENTS="kube-apiserver:cmd/kube-apiserver kubectl:cmd/kubectl
kube-controller-manager:cmd/kube-controller-manager kube-scheduler:cmd/kube-scheduler
kubelet:cmd/kubelet kube-proxy:cmd/kube-proxy agnhost:test/images/agnhost"
missing=""
for c in $COMPONENTS; do
    name="${c%%:*}"
    if [ -x "$CACHE/$name-v$K8S_VERSION" ]; then log "$name: cached $CACHE/$name-v$K8S_VERSION"
    else missing="$missing $c"; fi
done

if [ -n "$missing" ]; then
    command -v go >/dev/null || die "go is needed to build Kubernetes (none on PATH)"
    log "building$(for c in $missing; do printf ' %s' "${c%%:*}"; done) v$K8S_VERSION with $(go version) (takes minutes)"
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
    {
        echo "//go:build tools"
        echo
        echo "package tools"
        echo
        echo "import ("
        for c in $missing; do echo "	_ \"k8s.io/kubernetes/${c#*:}\""; done
        echo ")"
    } > tools.go

    log "go mod tidy"
    GOFLAGS=-mod=mod go mod tidy >tidy.log 2>&1 || { cat tidy.log >&2; die "go mod tidy failed"; }

    ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags="$ldflags -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1"
        ldflags="$ldflags -X $pkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
        ldflags="$ldflags -X $pkg.gitTreeState=clean"
    done
    mkdir -p bin
    dynamic="" static=""
    for c in $missing; do
        case "${c%%:*}" in
            agnhost) static="$static k8s.io/kubernetes/${c#*:}" ;;
            *) dynamic="$dynamic k8s.io/kubernetes/${c#*:}" ;;
        esac
    done
    if [ -n "$dynamic" ]; then
        log "go build$dynamic"
        # shellcheck disable=SC2086
        GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath -ldflags "$ldflags" -o bin/ $dynamic \
            || die "go build of$dynamic failed"
    fi
    if [ -n "$static" ]; then
        log "go build (static)$static"
        # shellcheck disable=SC2086
        CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath -ldflags "$ldflags" -o bin/ $static \
            || die "go build of$static failed"
    fi
    for c in $missing; do
        name="${c%%:*}"
        mv -f "bin/$name" "$CACHE/$name-v$K8S_VERSION"
        log "built $CACHE/$name-v$K8S_VERSION"
    done
    cd - >/dev/null
fi

# --- fortio ------------------------------------------------------------------------------
# A cached build from before it was static is built again.
if [ -x "$FORTIO" ] && ! ldd "$FORTIO" >/dev/null 2>&1; then
    log "fortio: cached $FORTIO"
else
    command -v go >/dev/null || die "go is needed to build fortio (none on PATH)"
    log "building fortio v$FORTIO_VERSION with $(go version)"
    fortio_bin="$(mktemp -d "$CACHE/fortio.XXXXXX")"
    # Static (CGO off): tests/cluster/images.sh also puts it in a FROM scratch image, as
    # the slow backend of the node tests (its echo server takes ?delay=).
    CGO_ENABLED=0 GOBIN="$fortio_bin" GOFLAGS=-buildvcs=false go install "fortio.org/fortio@v$FORTIO_VERSION" \
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
for c in $COMPONENTS; do
    name="${c%%:*}"
    case "$name" in kube-apiserver|kubectl) continue ;; esac
    "$CACHE/$name-v$K8S_VERSION" --help >/dev/null 2>&1 || [ "$name" = agnhost ] \
        || die "$CACHE/$name-v$K8S_VERSION does not run"
    printf '%s=%s\n' "$(echo "$name" | tr 'a-z-' 'A-Z_')" "$CACHE/$name-v$K8S_VERSION"
done
echo "FORTIO=$FORTIO"
