#!/usr/bin/env bash
# A real one-node Kubernetes cluster on this machine, in namespaces of its own:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy
# (iptables mode) v1.31.4 built from the k8s.io/kubernetes module (tests/k8s/provision.sh),
# containerd + runc + the CNI bridge/portmap plugins from Debian, and the images built
# from this repository (tests/cluster/images.sh) imported into containerd.
#
#   tests/cluster/up.sh [DIR]                  start, wait until usable, print how to use it
#   tests/cluster/up.sh --install [DIR]        the same, then install Proxima and its example
#                                              as the README says (tests/cluster/install.sh)
#   tests/cluster/up.sh --foreground [DIR]     start, then stay until stdin closes or
#                                              SIGTERM/SIGINT, and take it all down (what the
#                                              tests use: a killed test takes its cluster along)
#   tests/cluster/down.sh [DIR]                stop it
#   tests/cluster/in.sh [--device] CMD...      run CMD on the node (or on the device)
#
# DIR defaults to $PROXIMA_CLUSTER_DIR, else ${TMPDIR:-/tmp}/proxima-cluster; it holds
# the certificates, the data of etcd, containerd and the kubelet, every component's log
# (DIR/logs) and DIR/env (KUBECONFIG, NODE_IP, ... for scripts).
#
# Where it lives. Everything runs in a network + mount + PID namespace made here (the
# node), with PID 1 the pause binary (it reaps the orphans containerd's shims leave):
#   - network: lo; edge0 = 10.250.0.1/24, the node's address, a veth whose other end
#     (10.250.0.2) is in a second network namespace, the device (a client on the node's
#     network, as an IoT device would be); cni0 = 10.244.0.1/24, the pods' bridge. There
#     is no route out: the node's default route is the device, which forwards nothing, so
#     traffic reaches loopback, the two namespaces and the pods only.
#   - mount: private, so the overlay mounts of containers, the pods' netns bind mounts
#     and a tmpfs over /run and /var/log (containerd's and runc's state, iptables' lock,
#     the kubelet's container log links) vanish with it; / is made rshared inside only.
#   - PID: when its PID 1 dies, every process left in it dies, containers included.
# So what is left to undo by hand is small: the cgroup tree (/sys/fs/cgroup/*/proxima-*),
# removed by down.sh, which also kills every component by process id.
#
# Kernel settings. The kubelet sets six sysctls that are not per-namespace
# (vm.overcommit_memory, vm.panic_on_oom, kernel.panic, kernel.panic_on_oops,
# kernel.keys.root_maxkeys/root_maxbytes) unless they already hold its values; inside the
# node's mount namespace those /proc/sys files are covered by files holding the values it
# wants, so it reads them and leaves the host's kernel alone.
#
# Host facts this relies on (../shared/notes/real-cluster.md): cgroup v1 with the cgroupfs
# driver (no systemd), no CAP_SYS_RESOURCE (containerd's restrict_oom_score_adj, the
# kubelet's oomScoreAdj 0), iptables-nft, no IPVS.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
CLUSTER_STARTED=$(date +%s)

foreground=false install=false
case "${1:-}" in
    --foreground) foreground=true; shift ;;
    --install) install=true; shift ;;
esac
dir="$(cluster_dir "${1:-}")"
[ "$(id -u)" = 0 ] || die "the cluster needs root (namespaces, mounts, cgroups, iptables)"
if [ -f "$dir/state" ]; then
    die "a cluster is already up in $dir, or was not taken down: tests/cluster/down.sh $dir"
fi
mkdir -p "$dir"/{logs,pki,bin,etcd,containerd,kubelet,pod-logs,cni/net.d,cni/ipam,images,sysctl,volume-plugins}
: > "$dir/pids"
echo "CLUSTER_DIR=$dir" > "$dir/state"

# On any failure from here on: say which component, show the end of its log, take down
# what was started, exit 1.
failed_component=""
on_exit() {
    local rc=$?
    if [ "$rc" != 0 ]; then
        if [ -n "$failed_component" ] && [ -f "$dir/logs/$failed_component.log" ]; then
            printf '[cluster] %s failed; the end of %s:\n' "$failed_component" "$dir/logs/$failed_component.log" >&2
            tail -n 40 "$dir/logs/$failed_component.log" | sed 's/^/    /' >&2
        fi
        say "taking down what was started"
        PROXIMA_KEEP_CLUSTER_DIR=1 bash "$CLUSTER_HERE/down.sh" "$dir" >&2 || true
    fi
}
trap on_exit EXIT
fail() { failed_component="$1"; shift; die "$failed_component: $*"; }

# --- binaries and images -------------------------------------------------------------
say "provisioning binaries (tests/k8s/provision.sh)"
eval "$(bash "$REPO/tests/k8s/provision.sh" 2>"$dir/logs/provision.log" | grep -E '^[A-Z_]+=')" \
    || fail provision "tests/k8s/provision.sh failed"
# PROXIMA_<COMPONENT> (PROXIMA_KUBELET, PROXIMA_KUBE_PROXY, ...) runs another binary.
for b in ETCD KUBE_APISERVER KUBECTL KUBE_CONTROLLER_MANAGER KUBE_SCHEDULER KUBELET KUBE_PROXY; do
    override="PROXIMA_$b"
    [ -n "${!override:-}" ] && printf -v "$b" '%s' "${!override}"
    [ -x "${!b:-}" ] || fail provision "no $b binary"
done
ln -sf "$KUBECTL" "$dir/bin/kubectl"
say "building the images (tests/cluster/images.sh)"
bash "$CLUSTER_HERE/images.sh" "$dir/images" >"$dir/logs/images.log" 2>&1 \
    || fail images "tests/cluster/images.sh failed"
. "$dir/images/images.env"
PAUSE="$dir/images/pause"

# --- namespaces ----------------------------------------------------------------------
# unshare forks PID 1 of the new PID namespace (pause) and SIGKILLs it when unshare itself
# is killed: down.sh kills unshare, the namespace's init dies, the kernel kills the rest.
holder() { # name, unshare flags...
    local name="$1"; shift
    unshare "$@" --fork --kill-child -- "$PAUSE" >"$dir/logs/$name.log" 2>&1 &
    local launcher=$! pid=""
    for _ in $(seq 1 100); do
        pid="$(pgrep -P "$launcher" || true)"
        [ -n "$pid" ] && break
        sleep 0.02
    done
    [ -n "$pid" ] || fail "$name" "unshare $* did not start (root, or CAP_SYS_ADMIN, is needed)"
    echo "$name $launcher" >> "$dir/pids"
    echo "$pid"
}
NODE_NS_PID="$(holder node-namespace --net --mount --pid --mount-proc --propagation private)"
echo "NODE_NS_PID=$NODE_NS_PID" >> "$dir/state"
DEVICE_NS_PID="$(holder device-namespace --net --pid)"
echo "DEVICE_NS_PID=$DEVICE_NS_PID" >> "$dir/state"
say "namespaces: node (pid $NODE_NS_PID), device (pid $DEVICE_NS_PID)"

node() { in_node "$dir" "$@"; }
device() { in_device "$dir" "$@"; }

# Mounts, inside the node only.
desired_sysctl() { # path value
    printf '%s\n' "$2" > "$dir/sysctl/$(echo "$1" | tr / _)"
    echo "mount --bind $dir/sysctl/$(echo "$1" | tr / _) /proc/sys/$1"
}
node sh -euc "
    mount --make-rshared /
    mount -t tmpfs -o mode=755 proxima-run /run
    mkdir -p /run/netns /run/lock
    mount -t tmpfs -o mode=755 proxima-var-log /var/log
    $(desired_sysctl vm/overcommit_memory 1)
    $(desired_sysctl vm/panic_on_oom 0)
    $(desired_sysctl kernel/panic 10)
    $(desired_sysctl kernel/panic_on_oops 1)
    $(desired_sysctl kernel/keys/root_maxkeys 1000000)
    $(desired_sysctl kernel/keys/root_maxbytes 25000000)
" 2>"$dir/logs/node-mounts.log" || fail node-mounts "cannot set up the node's mounts"

# Network: the node's address on a veth to the device, forwarding on (hostPort traffic
# from the device is routed to the pods' bridge). The node's default route leads to the
# device, which forwards nothing: a node needs one (a Service's ClusterIP is routed before
# kube-proxy's DNAT rewrites it), and this one leads nowhere outside.
ip link add edge0 netns "/proc/$NODE_NS_PID/ns/net" type veth peer name dev0 netns "/proc/$DEVICE_NS_PID/ns/net" \
    2>"$dir/logs/network.log" || fail network "cannot make the veth pair"
node sh -euc "
    ip link set lo up
    ip addr add $NODE_IP/24 dev edge0
    ip link set edge0 up
    ip route add default via $DEVICE_IP dev edge0
    sysctl -qw net.ipv4.ip_forward=1
" 2>>"$dir/logs/network.log" || fail network "cannot configure the node's network"
device sh -euc "
    ip link set lo up
    ip addr add $DEVICE_IP/24 dev dev0
    ip link set dev0 up
    sysctl -qw net.ipv4.ip_forward=0
" 2>>"$dir/logs/network.log" || fail network "cannot configure the device's network"

# --- cgroups -------------------------------------------------------------------------
# The kubelet's cgroupRoot: a tree of its own in every v1 hierarchy, so that down.sh
# removes exactly what this cluster made. cpuset needs its cpus and mems copied in.
CGROUP_ROOT="proxima-$(basename "$dir")-$$"
echo "CGROUP_ROOT=$CGROUP_ROOT" >> "$dir/state"
for h in /sys/fs/cgroup/*/; do
    h="${h%/}"
    [ "$(basename "$h")" = unified ] && continue
    [ -f "$h/cgroup.procs" ] || continue
    mkdir -p "$h/$CGROUP_ROOT" || fail cgroups "cannot create $h/$CGROUP_ROOT"
    if [ -f "$h/cpuset.cpus" ]; then
        cat "$h/cpuset.cpus" > "$h/$CGROUP_ROOT/cpuset.cpus"
        cat "$h/cpuset.mems" > "$h/$CGROUP_ROOT/cpuset.mems"
    fi
done

# --- certificates and credentials -----------------------------------------------------
say "certificates"
pki="$dir/pki"
openssl genrsa -out "$pki/ca.key" 2048 2>/dev/null
openssl req -x509 -new -key "$pki/ca.key" -days 30 -subj "/CN=proxima-cluster-ca" -out "$pki/ca.crt" 2>/dev/null
cert() { # name subject san
    openssl genrsa -out "$pki/$1.key" 2048 2>/dev/null
    openssl req -new -key "$pki/$1.key" -subj "$2" -out "$pki/$1.csr" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n%s\n' \
        "${3:+subjectAltName=$3}" > "$pki/$1.ext"
    openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
        -days 30 -extfile "$pki/$1.ext" -out "$pki/$1.crt" 2>/dev/null
}
cert apiserver "/CN=kube-apiserver" \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:$API_SERVICE_IP,IP:$NODE_IP,IP:127.0.0.1"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
cert kubelet "/CN=$NODE_NAME" "DNS:$NODE_NAME,IP:$NODE_IP"
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null

token() { openssl rand -hex 16; }
admin_token=$(token) kcm_token=$(token) sched_token=$(token) node_token=$(token) proxy_token=$(token)
cat > "$pki/tokens.csv" <<EOF
$admin_token,admin,admin,system:masters
$kcm_token,system:kube-controller-manager,kube-controller-manager
$sched_token,system:kube-scheduler,kube-scheduler
$node_token,system:node:$NODE_NAME,kubelet,system:nodes
$proxy_token,system:kube-proxy,kube-proxy
EOF
kubeconfig() { # file token
    cat > "$dir/$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: proxima-cluster
  cluster:
    server: https://$NODE_IP:$API_PORT
    certificate-authority: $pki/ca.crt
users:
- name: user
  user:
    token: $2
contexts:
- name: proxima-cluster
  context:
    cluster: proxima-cluster
    user: user
current-context: proxima-cluster
EOF
}
kubeconfig admin.kubeconfig "$admin_token"
kubeconfig controller-manager.kubeconfig "$kcm_token"
kubeconfig scheduler.kubeconfig "$sched_token"
kubeconfig kubelet.kubeconfig "$node_token"
kubeconfig kube-proxy.kubeconfig "$proxy_token"
export KUBECONFIG="$dir/admin.kubeconfig"

# --- starting components ----------------------------------------------------------------
# Each runs in the node's namespaces; DIR/pids gets its host process id.
start() { # name command...
    local name="$1"; shift
    nsenter -t "$NODE_NS_PID" --net --mount --pid --wd="$dir" -- "$@" >"$dir/logs/$name.log" 2>&1 &
    local launcher=$! pid=""
    for _ in $(seq 1 100); do
        pid="$(pgrep -P "$launcher" || true)"
        [ -n "$pid" ] && break
        kill -0 "$launcher" 2>/dev/null || break
        sleep 0.02
    done
    [ -n "$pid" ] || fail "$name" "exited as soon as it started"
    echo "$name $pid" >> "$dir/pids"
}
running() { local pid; pid="$(awk -v n="$1" '$1 == n { print $2 }' "$dir/pids")"; [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }
# wait_for name seconds what command...: poll until the command succeeds; fail the
# component when it exits or the time is up.
wait_for() {
    local name="$1" seconds="$2" what="$3"; shift 3
    local deadline=$(( $(date +%s) + seconds ))
    until "$@" >/dev/null 2>&1; do
        running "$name" || fail "$name" "exited while waiting for $what"
        [ "$(date +%s)" -lt "$deadline" ] || fail "$name" "$what: not after ${seconds}s"
        sleep 0.2
    done
    say "$name: $what"
}
kubectl_() { node "$KUBECTL" --kubeconfig "$dir/admin.kubeconfig" --request-timeout=5s "$@"; }

# --- etcd --------------------------------------------------------------------------------
start etcd "$ETCD" --name=proxima-node --data-dir="$dir/etcd" \
    --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
    --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
    --initial-cluster=proxima-node=http://127.0.0.1:2380 --listen-metrics-urls=http://127.0.0.1:2381
wait_for etcd 60 "healthy" node curl -fsS --max-time 3 http://127.0.0.1:2381/health

# --- kube-apiserver ------------------------------------------------------------------------
start kube-apiserver "$KUBE_APISERVER" \
    --etcd-servers=http://127.0.0.1:2379 --bind-address=0.0.0.0 --advertise-address="$NODE_IP" \
    --secure-port="$API_PORT" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" --token-auth-file="$pki/tokens.csv" \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true --profiling=false \
    --endpoint-reconciler-type=lease
wait_for kube-apiserver 120 "ready" kubectl_ get --raw /readyz

# --- kube-controller-manager and kube-scheduler -------------------------------------------------
start kube-controller-manager "$KUBE_CONTROLLER_MANAGER" \
    --kubeconfig="$dir/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$dir/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$dir/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --profiling=false
start kube-scheduler "$KUBE_SCHEDULER" \
    --kubeconfig="$dir/scheduler.kubeconfig" \
    --authentication-kubeconfig="$dir/scheduler.kubeconfig" \
    --authorization-kubeconfig="$dir/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --profiling=false
wait_for kube-controller-manager 60 "healthy" node curl -fsS --max-time 3 -k https://127.0.0.1:10257/healthz
wait_for kube-scheduler 60 "healthy" node curl -fsS --max-time 3 -k https://127.0.0.1:10259/healthz

# --- containerd ----------------------------------------------------------------------------
cat > "$dir/cni/net.d/10-proxima-pods.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "proxima-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$POD_CIDR" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "$dir/cni/ipam"
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
cat > "$dir/containerd/config.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
oom_score = 0
[grpc]
  address = "$dir/containerd/containerd.sock"
[ttrpc]
  address = "$dir/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE here: a container may not get an oom_score_adj below ours.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
EOF
start containerd containerd --config "$dir/containerd/config.toml"
ctr_() { ctr --address "$dir/containerd/containerd.sock" "$@"; }
wait_for containerd 60 "serving" ctr_ version
for image in pause agnhost fortio proxima; do
    ctr_ -n k8s.io images import "$dir/images/$image.tar" >>"$dir/logs/images.log" 2>&1 \
        || fail images "ctr images import $image.tar failed"
done
say "images imported: $PAUSE_IMAGE, $AGNHOST_IMAGE, $FORTIO_IMAGE, $PROXIMA_IMAGE"

# --- kubelet -------------------------------------------------------------------------------
echo "nameserver 127.0.0.1" > "$dir/resolv.conf"
cat > "$dir/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
# No CAP_SYS_RESOURCE: the kubelet may not lower its own oom_score_adj.
oomScoreAdj: 0
failSwapOn: false
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: true }
  x509: { clientCAFile: $pki/ca.crt }
authorization:
  mode: Webhook
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
address: $NODE_IP
clusterDomain: cluster.local
resolvConf: $dir/resolv.conf
podLogsDir: $dir/pod-logs
volumePluginDir: $dir/volume-plugins
# The images were imported, not pulled: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# No eviction for disk space, as kind's nodes have none: the machine's disk is the test
# runner's, shared with cargo's target directories, and a few GB free of hundreds is
# under the kubelet's defaults. A node under DiskPressure evicts every pod and admits
# none (all the later scenarios then fail waiting), where the containers need only MBs.
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
  imagefs.inodesFree: "0%"
serializeImagePulls: false
nodeStatusReportFrequency: 10s
EOF
start kubelet "$KUBELET" --config="$dir/kubelet/config.yaml" --kubeconfig="$dir/kubelet.kubeconfig" \
    --root-dir="$dir/kubelet" --cert-dir="$pki" \
    --container-runtime-endpoint="unix://$dir/containerd/containerd.sock" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP"
wait_for kubelet 120 "node $NODE_NAME registered" kubectl_ get node "$NODE_NAME"
wait_for kubelet 120 "node $NODE_NAME Ready" \
    kubectl_ wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s

# --- kube-proxy ----------------------------------------------------------------------------
cat > "$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: $dir/kube-proxy.kubeconfig
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# The conntrack table size and timeouts are the host's (nf_conntrack_max is not per
# namespace): leave them alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
start kube-proxy "$KUBE_PROXY" --config="$dir/kube-proxy.yaml"
wait_for kube-proxy 60 "healthy" node curl -fsS --max-time 3 http://127.0.0.1:10256/healthz
# The `kubernetes` Service, through kube-proxy's rules, as a pod reaches the API server.
wait_for kube-proxy 60 "https://$API_SERVICE_IP:443 (the kubernetes Service) answers" \
    node curl -fsS --max-time 3 --cacert "$pki/ca.crt" -H "Authorization: Bearer $admin_token" \
    "https://$API_SERVICE_IP:443/readyz"
wait_for kube-controller-manager 60 "the default ServiceAccount exists" \
    kubectl_ -n default get serviceaccount default

cat > "$dir/env" <<EOF
PROXIMA_CLUSTER_DIR=$dir
KUBECONFIG=$dir/admin.kubeconfig
KUBECTL=$KUBECTL
NODE_NAME=$NODE_NAME
NODE_IP=$NODE_IP
DEVICE_IP=$DEVICE_IP
NODE_NETNS=/proc/$NODE_NS_PID/ns/net
DEVICE_NETNS=/proc/$DEVICE_NS_PID/ns/net
PAUSE_IMAGE=$PAUSE_IMAGE
AGNHOST_IMAGE=$AGNHOST_IMAGE
FORTIO_IMAGE=$FORTIO_IMAGE
PROXIMA_IMAGE=$PROXIMA_IMAGE
PROXIMA_IMAGE_BYTES=$PROXIMA_IMAGE_BYTES
EOF
say "cluster up in $(( $(date +%s) - CLUSTER_STARTED ))s: node $NODE_NAME ($NODE_IP) Ready"
cat >&2 <<EOF
  tests/cluster/in.sh kubectl get pods -A          # kubectl on the node (KUBECONFIG set)
  tests/cluster/in.sh --device curl http://$NODE_IP:8080/   # a device on the node's network
  tests/cluster/down.sh $dir
EOF
cat "$dir/env"

trap - EXIT
if $install; then
    PROXIMA_CLUSTER_DIR="$dir" bash "$CLUSTER_HERE/install.sh" \
        || die "installing Proxima failed (the cluster is still up: tests/cluster/down.sh $dir)"
fi
if $foreground; then
    # Down when the caller goes away (stdin closes) or asks (SIGTERM/SIGINT).
    down() { trap - TERM INT; bash "$CLUSTER_HERE/down.sh" "$dir" >&2; exit 0; }
    trap down TERM INT
    echo "CLUSTER_READY"
    while read -r _; do :; done
    down
fi
