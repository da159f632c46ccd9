#!/usr/bin/env bash
# Run a command inside the cluster tests/cluster/up.sh started:
#   tests/cluster/in.sh CMD...            on the node (its network, mount and PID
#                                         namespaces), with KUBECONFIG set and kubectl on PATH
#   tests/cluster/in.sh --device CMD...   on the device: a client on the node's network
#                                         (10.250.0.2), as an IoT device sending to the node
# PROXIMA_CLUSTER_DIR names another cluster directory than up.sh's default.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
where=node
if [ "${1:-}" = "--device" ]; then where=device; shift; fi
[ $# -gt 0 ] || die "usage: tests/cluster/in.sh [--device] CMD..."
dir="$(cluster_dir "")"
[ -f "$dir/env" ] || die "no cluster is up in $dir (tests/cluster/up.sh)"
# Relative paths mean what they mean here.
export KUBECONFIG="$dir/admin.kubeconfig" PATH="$dir/bin:$PATH" IN_NODE_WD="$PWD"
"in_$where" "$dir" "$@"
