#!/usr/bin/env bash
# Runs every test of the workspace, provisioning what the tests need first:
# etcd (Debian package), kube-apiserver + kubectl and Fortio (built from Go modules, cached),
# promtool (Debian package prometheus, or built from Go modules).
# Fails, never skips, when something cannot be provisioned.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> provisioning etcd, kube-apiserver, kubectl, Fortio and nftables for the Kubernetes and testbed tests"
bash tests/k8s/provision.sh

echo "==> provisioning promtool for the dashboard check (tests/dashboard.rs)"
bash tests/provision-promtool.sh

echo "==> building the binaries the end-to-end tests start"
cargo build --workspace --bins

echo "==> running the tests"
cargo test --workspace "$@"
