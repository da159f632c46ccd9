#!/usr/bin/env bash
# Install Proxima and its example on the cluster tests/cluster/up.sh started, the way the
# README's "In Kubernetes" section says, with the image up.sh built:
#
#   kubectl create namespace proxima-system
#   kubectl -n proxima-system create secret generic proxima-admin --from-literal=token=...
#   kubectl apply -k <overlay>          deploy/, its image set by a kustomize overlay (what
#                                       `kustomize edit set image` writes, without editing deploy/)
#   kubectl apply -k examples/kubernetes/
#   kubectl rollout status daemonset/proxima, deployment/dps
#
#   tests/cluster/install.sh [TOKEN]    TOKEN: the admin token (default: a random one);
#                                       it is written to DIR/admin-token
# PROXIMA_CLUSTER_DIR names another cluster directory than up.sh's default.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
CLUSTER_STARTED=$(date +%s)

dir="$(cluster_dir "")"
[ -f "$dir/env" ] || die "no cluster is up in $dir (tests/cluster/up.sh)"
. "$dir/env"
token="${1:-$(openssl rand -hex 16)}"
printf '%s\n' "$token" > "$dir/admin-token"
kubectl() { in_node "$dir" "$KUBECTL" --kubeconfig "$dir/admin.kubeconfig" "$@"; }

# The admin Secret before the DaemonSet: the proxies read it when they start.
kubectl create namespace proxima-system
kubectl -n proxima-system create secret generic proxima-admin --from-literal=token="$token"

overlay="$dir/deploy-overlay"
mkdir -p "$overlay"
# kustomize takes a base by a path relative to the overlay.
base="$(realpath --relative-to="$overlay" "$REPO/deploy")"
cat > "$overlay/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $base
images:
  - name: ghcr.io/proxima-edge/proxima
    newName: ${PROXIMA_IMAGE%:*}
    newTag: ${PROXIMA_IMAGE##*:}
EOF
kubectl apply -k "$overlay"
kubectl apply -k "$REPO/examples/kubernetes"
kubectl -n proxima-system rollout status daemonset/proxima --timeout=180s
kubectl -n default rollout status deployment/dps --timeout=180s
say "Proxima ($PROXIMA_IMAGE) and examples/kubernetes installed"
cat >&2 <<EOF
  tests/cluster/in.sh --device curl -H 'x-service: dps.default' http://$NODE_IP:8080/hostname
  tests/cluster/in.sh --device curl -H "Authorization: Bearer \$(cat $dir/admin-token)" http://$NODE_IP:9901/debug/pools
  tests/cluster/in.sh kubectl -n proxima-system logs daemonset/proxima
EOF
