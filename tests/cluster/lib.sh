# Shared by tests/cluster/{up,down,in,images}.sh: where a cluster lives and how to reach it.
# Sourced, not run.

CLUSTER_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$CLUSTER_HERE/../.." && pwd)"
CACHE="${PROXIMA_CACHE:-$HOME/.cache/proxima}"
K8S_VERSION="1.31.4"

# The node, its network and its pods. These addresses exist only inside the network
# namespaces the cluster makes (tests/cluster/up.sh); nothing routes them out.
NODE_NAME="proxima-node"
NODE_IP="10.250.0.1"      # the node's own interface (edge0), towards the devices
DEVICE_IP="10.250.0.2"    # a device on the node's network (another namespace)
POD_CIDR="10.244.0.0/24"  # the CNI bridge cni0, 10.244.0.1
SERVICE_CIDR="10.96.0.0/16"
API_SERVICE_IP="10.96.0.1"
API_PORT=6443

cluster_dir() {
    local dir="${1:-${PROXIMA_CLUSTER_DIR:-${TMPDIR:-/tmp}/proxima-cluster}}"
    mkdir -p "$dir" && (cd "$dir" && pwd)
}

say() { printf '[cluster %4ss] %s\n' "$(( $(date +%s) - ${CLUSTER_STARTED:-$(date +%s)} ))" "$*" >&2; }
die() { printf '[cluster] ERROR: %s\n' "$*" >&2; exit 1; }

# The host pid of a namespace holder's first process, from the state file.
state_get() { sed -n "s/^$2=//p" "$1/state" 2>/dev/null | tail -1; }

# Run a command inside the node: its network, mount and PID namespaces.
in_node() {
    local dir="$1"; shift
    local pid; pid="$(state_get "$dir" NODE_NS_PID)"
    [ -n "$pid" ] && [ -d "/proc/$pid" ] || die "no cluster is up in $dir (tests/cluster/up.sh)"
    nsenter -t "$pid" --net --mount --pid --wd="${IN_NODE_WD:-$dir}" -- "$@"
}

# Run a command on the device: its own network namespace, linked to the node's.
in_device() {
    local dir="$1"; shift
    local pid; pid="$(state_get "$dir" DEVICE_NS_PID)"
    [ -n "$pid" ] && [ -d "/proc/$pid" ] || die "no cluster is up in $dir (tests/cluster/up.sh)"
    nsenter -t "$pid" --net -- "$@"
}
