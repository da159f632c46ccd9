#!/usr/bin/env bash
# Build the images the one-node cluster runs, without a registry, and save them as
# archives that `ctr images import` takes (tests/cluster/up.sh imports them):
#
#   registry.k8s.io/pause:3.10                     the pod sandbox: tests/cluster/images/pause.c,
#                                                  gcc -static, FROM scratch
#   registry.k8s.io/e2e-test-images/agnhost:2.52   agnhost from the k8s.io/kubernetes module
#                                                  (tests/k8s/provision.sh builds it static),
#                                                  FROM scratch
#   localhost/fortio:1.68.2                        Fortio's server (provision.sh builds it
#                                                  static): a backend whose answers take as long
#                                                  as a request asks (?delay=2s), FROM scratch
#   localhost/proxima-base:debian12                what gcr.io/distroless/cc-debian12 holds for a
#                                                  Rust binary, assembled from Debian's libc6 and
#                                                  libgcc-s1 packages (apt-get download)
#   localhost/proxima:dev-<sha256 of the binary>   deploy/Dockerfile itself, its `context` stage:
#                                                  the release binary cargo built
#                                                  (target/dist/proxima, the profile the Dockerfile's
#                                                  own builder stage uses, debug info stripped as
#                                                  that stage does), on that base
#
# The names and tags of pause and agnhost are the ones the manifests and containerd's
# sandbox_image use, so with imagePullPolicy IfNotPresent nothing is ever pulled.
#
#   tests/cluster/images.sh OUT_DIR      writes OUT_DIR/<name>.tar and OUT_DIR/images.env
#                                        (PROXIMA_IMAGE=..., sizes), prints the image sizes
#
# PROXIMA_IMAGE_BINARY names another proxima binary. Without it, target/dist/proxima is
# built with cargo first unless PROXIMA_NO_CARGO=1 (the tests set it: cargo test holds the
# build lock, and tests/run.sh builds the binary before the tests run).
# podman keeps its storage in ${PROXIMA_CACHE:-~/.cache/proxima}/podman, not in
# /var/lib/containers; podman's RLIMIT quirk here (no CAP_SYS_RESOURCE) does not apply:
# these builds run no container (no RUN step).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
CLUSTER_STARTED=$(date +%s)

out="${1:?usage: tests/cluster/images.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/proxima-images.XXXXXX")"
trap 'rm -rf "$work"' EXIT

podman_() {
    podman --root "$CACHE/podman/root" --runroot "$CACHE/podman/run" \
        --storage-driver overlay --cgroup-manager cgroupfs --events-backend file "$@"
}
build() { # tag context [podman build args...]
    local tag="$1" ctx="$2"; shift 2
    podman_ build --quiet --pull=never --network=none "$@" -t "$tag" "$ctx" >"$work/build.log" 2>&1 \
        || { cat "$work/build.log" >&2; die "podman build of $tag failed"; }
}
save() { # tag file
    rm -f "$out/$2"
    podman_ save --format docker-archive -o "$out/$2" "$1" >"$work/save.log" 2>&1 \
        || { cat "$work/save.log" >&2; die "podman save of $1 failed"; }
}
size_of() { podman_ image inspect --format '{{.Size}}' "$1"; }

# --- pause ----------------------------------------------------------------------------
mkdir -p "$work/pause"
gcc -static -Os -Wall -Wextra -Werror -o "$work/pause/pause" "$CLUSTER_HERE/images/pause.c" \
    || die "gcc -static pause.c failed (Debian's libc6-dev carries the static libc)"
strip "$work/pause/pause"
cat > "$work/pause/Containerfile" <<'EOF'
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
EOF
PAUSE_IMAGE="registry.k8s.io/pause:3.10"
build "$PAUSE_IMAGE" "$work/pause"
save "$PAUSE_IMAGE" pause.tar
cp "$work/pause/pause" "$out/pause"   # up.sh's PID 1 of the cluster's namespaces
say "image $PAUSE_IMAGE: $(size_of "$PAUSE_IMAGE") bytes"

# --- agnhost --------------------------------------------------------------------------
agnhost="$CACHE/agnhost-v$K8S_VERSION"
[ -x "$agnhost" ] || die "$agnhost missing: run tests/k8s/provision.sh"
mkdir -p "$work/agnhost/tmp"
cp "$agnhost" "$work/agnhost/agnhost"
# agnhost's own image is Alpine with tools; the servers the tests use (netexec) need only
# the binary and a writable /tmp.
cat > "$work/agnhost/Containerfile" <<'EOF'
FROM scratch
COPY agnhost /agnhost
COPY tmp /tmp
ENTRYPOINT ["/agnhost"]
CMD ["pause"]
EOF
chmod 1777 "$work/agnhost/tmp"
AGNHOST_IMAGE="registry.k8s.io/e2e-test-images/agnhost:2.52"
build "$AGNHOST_IMAGE" "$work/agnhost"
save "$AGNHOST_IMAGE" agnhost.tar
say "image $AGNHOST_IMAGE: $(size_of "$AGNHOST_IMAGE") bytes"

# --- fortio ---------------------------------------------------------------------------
fortio="$CACHE/fortio-v1.68.2"
[ -x "$fortio" ] || die "$fortio missing: run tests/k8s/provision.sh"
ldd "$fortio" >/dev/null 2>&1 \
    && die "$fortio is not static: delete it and run tests/k8s/provision.sh again"
mkdir -p "$work/fortio/tmp"
chmod 1777 "$work/fortio/tmp"
cp "$fortio" "$work/fortio/fortio"
cat > "$work/fortio/Containerfile" <<'EOF'
FROM scratch
COPY fortio /fortio
COPY tmp /tmp
ENTRYPOINT ["/fortio"]
CMD ["server", "-http-port", "8080", "-grpc-port", "disabled", "-redirect-port", "disabled", "-tcp-port", "disabled", "-udp-port", "disabled", "-data-dir", "/tmp", "-max-echo-delay", "60s"]
EOF
FORTIO_IMAGE="localhost/fortio:1.68.2"
build "$FORTIO_IMAGE" "$work/fortio"
save "$FORTIO_IMAGE" fortio.tar
say "image $FORTIO_IMAGE: $(size_of "$FORTIO_IMAGE") bytes"

# --- the base: libc and libgcc from Debian's packages -----------------------------------
# The same packages, at the versions installed here, that the binary was linked against
# (distroless/cc-debian12 is built from the same two packages).
debs="$CACHE/debs"
mkdir -p "$debs"
for pkg in libc6 libgcc-s1; do
    version="$(dpkg-query -W -f='${Version}' "$pkg")" || die "$pkg is not installed"
    dest="$debs/$pkg-$version"
    if ! ls "$dest"/*.deb >/dev/null 2>&1; then
        mkdir -p "$dest"
        (cd "$dest" && apt-get download -q "$pkg=$version" >/dev/null 2>&1) \
            || { apt-get update -q >/dev/null 2>&1 && (cd "$dest" && apt-get download -q "$pkg=$version"); } \
            || die "apt-get download $pkg=$version failed"
    fi
    debs_used="${debs_used:-} $(basename "$dest"/*.deb)"
done
root="$work/base/rootfs"
mkdir -p "$root" "$work/base/x"
for pkg in libc6 libgcc-s1; do dpkg-deb -x "$debs/$pkg-$(dpkg-query -W -f='${Version}' "$pkg")"/*.deb "$work/base/x"; done
# Shared libraries and the dynamic linker only: no gconv modules, locales, tools or docs.
(cd "$work/base/x" && find . \( -name '*.so' -o -name '*.so.*' \) \( -type f -o -type l \) \
    ! -path '*/gconv/*' ! -path '*/audit/*' -print0 | xargs -0 cp -a --parents -t "$root")
[ -e "$root/lib64/ld-linux-x86-64.so.2" ] || [ -e "$root/usr/lib64/ld-linux-x86-64.so.2" ] \
    || die "no dynamic linker in Debian's libc6 package"
mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot"
chmod 1777 "$root/tmp"
chown 65532:65532 "$root/home/nonroot"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' > "$root/etc/group"
printf 'hosts: files dns\n' > "$root/etc/nsswitch.conf"
# The CA bundle Debian's ca-certificates package generates (proxima's Kubernetes client
# reads the system roots when a kubeconfig names an https server without its own CA).
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
fi
cat > "$work/base/Containerfile" <<EOF
FROM scratch
COPY rootfs /
LABEL org.opencontainers.image.description="glibc and libgcc from Debian:$debs_used"
USER 65532:65532
EOF
BASE_IMAGE="localhost/proxima-base:debian12"
build "$BASE_IMAGE" "$work/base"
say "image $BASE_IMAGE: $(size_of "$BASE_IMAGE") bytes"

# --- proxima: deploy/Dockerfile, its `context` stage ------------------------------------
binary="${PROXIMA_IMAGE_BINARY:-$REPO/target/dist/proxima}"
if [ -z "${PROXIMA_IMAGE_BINARY:-}" ] && [ "${PROXIMA_NO_CARGO:-0}" != 1 ]; then
    say "cargo build --profile dist -p proxima (the image's binary)"
    (cd "$REPO" && cargo build --profile dist --locked -p proxima) || die "cargo build --profile dist failed"
fi
[ -x "$binary" ] || die "$binary missing: build it with cargo build --profile dist -p proxima (tests/run.sh does)"
mkdir -p "$work/proxima"
# As the Dockerfile's own builder stage does: the code as built, without debug info.
objcopy --strip-debug "$binary" "$work/proxima/proxima" || die "objcopy --strip-debug $binary failed"
tag="dev-$(sha256sum "$binary" | cut -c1-12)"
PROXIMA_IMAGE="localhost/proxima:$tag"
build "$PROXIMA_IMAGE" "$work/proxima" -f "$REPO/deploy/Dockerfile" \
    --build-arg BINARY=context --build-arg BASE_IMAGE="$BASE_IMAGE"
save "$PROXIMA_IMAGE" proxima.tar
proxima_size="$(size_of "$PROXIMA_IMAGE")"
say "image $PROXIMA_IMAGE: $proxima_size bytes (binary $(stat -c %s "$binary"), without debug info $(stat -c %s "$work/proxima/proxima"); archive $(stat -c %s "$out/proxima.tar"))"

{
    echo "PAUSE_IMAGE=$PAUSE_IMAGE"
    echo "AGNHOST_IMAGE=$AGNHOST_IMAGE"
    echo "FORTIO_IMAGE=$FORTIO_IMAGE"
    echo "PROXIMA_IMAGE=$PROXIMA_IMAGE"
    echo "PROXIMA_IMAGE_BYTES=$proxima_size"
    echo "PROXIMA_BINARY_BYTES=$(stat -c %s "$work/proxima/proxima")"
} > "$out/images.env"
cat "$out/images.env"
