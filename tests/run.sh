#!/usr/bin/env bash
# Runs every test of the workspace, provisioning what the tests need first:
# etcd (Debian package), every Kubernetes component + agnhost and Fortio (built from Go
# modules, cached), containerd, runc, the CNI plugins and podman (Debian packages) for the
# one-node cluster of tests/k8s_node.rs, promtool (Debian package prometheus, or built from
# Go modules), h2spec and smugglex (Go module proxy, crates.io) with nginx for the outside
# conformance suites, and the release binary the Proxima image is built from.
# Fails, never skips, when something cannot be provisioned.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> provisioning etcd, Kubernetes, containerd, Fortio and nftables for the Kubernetes and testbed tests"
bash tests/k8s/provision.sh

echo "==> provisioning promtool for the dashboard check (tests/dashboard.rs)"
bash tests/provision-promtool.sh

echo "==> provisioning h2spec, smugglex and nginx for the conformance suites (tests/conformance.rs)"
bash tests/conformance/provision.sh

echo "==> building the binaries the end-to-end tests start"
cargo build --workspace --bins

# tests/k8s_node.rs builds the Proxima image from it (tests/cluster/images.sh) and runs it
# on a one-node cluster (tests/cluster/up.sh): the binary users get, not a debug build.
echo "==> building the release binary of the image (cargo build --profile dist -p proxima)"
cargo build --profile dist --locked -p proxima

echo "==> running the tests"
cargo test --workspace "$@"

# The pool list's seqlock under the loom model checker (crates/proxima-core/src/pool_list.rs):
# a build of its own (`--cfg loom` swaps std's atomics for loom's), in its own target dir.
echo "==> the pool list's seqlock under loom (every interleaving of a reader and two writers)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --locked -p proxima-core --lib loom_model
