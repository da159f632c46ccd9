#!/usr/bin/env bash
# Take down the cluster tests/cluster/up.sh started in DIR (default as up.sh's):
#   1. SIGTERM to every component, by the process id up.sh recorded, one at a time in
#      reverse order of start (kube-proxy and the kubelet first, etcd last); SIGKILL to
#      one still running 10 s later; once containerd is stopped, SIGKILL to the
#      containers, by the process ids their cgroups list;
#   2. kill the namespace holders: the node's PID 1 dies, and with it every process left
#      in its PID namespace (containerd's shims, the containers); with the last process
#      the node's network namespace goes (edge0, cni0, the pods' veths, every iptables
#      rule) and so does its mount namespace (container root filesystems, /run, /var/log);
#   3. remove the cgroup tree the kubelet made under /sys/fs/cgroup/*/proxima-*;
#   4. check that no process, bridge, mount or cgroup of the cluster is left, and delete
#      DIR (kept with PROXIMA_KEEP_CLUSTER_DIR=1, for its logs).
# Exits non-zero if something could not be removed, saying what.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
CLUSTER_STARTED=$(date +%s)

dir="$(cluster_dir "${1:-}")"
[ -f "$dir/state" ] || { say "no cluster in $dir"; exit 0; }
problems=0
problem() { printf '[cluster] LEFT BEHIND: %s\n' "$*" >&2; problems=$((problems + 1)); }

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
# stop_pids seconds name:pid...: SIGTERM, then SIGKILL for those still running after
# `seconds`; says which needed it.
stop_pids() {
    local wait="$1"; shift
    local entry
    for entry in "$@"; do alive "${entry#*:}" && kill -TERM "${entry#*:}" 2>/dev/null; done
    local deadline=$(( $(date +%s) + wait ))
    for entry in "$@"; do
        while alive "${entry#*:}" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
        if alive "${entry#*:}"; then
            say "${entry%%:*} (pid ${entry#*:}) still running ${wait}s after SIGTERM: SIGKILL"
            kill -KILL "${entry#*:}" 2>/dev/null
        fi
    done
    for entry in "$@"; do
        for _ in $(seq 1 50); do alive "${entry#*:}" || break; sleep 0.1; done
        alive "${entry#*:}" && problem "${entry%%:*} (pid ${entry#*:}) still running after SIGKILL"
    done
}

# 1. Components, newest first (the namespace holders are listed first: they go last).
components=$(awk '$1 !~ /-namespace$/ { print $1 ":" $2 }' "$dir/pids" 2>/dev/null | tac)
cgroup_root="$(state_get "$dir" CGROUP_ROOT)"
# The containers outlive containerd (their shims keep them); once the runtime is stopped
# they go too, by the process ids their cgroups list, before the API server, whose
# shutdown would otherwise wait on the proxies' watches.
kill_containers() {
    [ -n "$cgroup_root" ] && [ -d "/sys/fs/cgroup/pids/$cgroup_root" ] || return 0
    local pids
    pids="$(find "/sys/fs/cgroup/pids/$cgroup_root" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)"
    # shellcheck disable=SC2086
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    say "containers killed ($(echo $pids | wc -w) processes)"
}
# One at a time: the API server waits for etcd, the kubelet for containerd.
for entry in $components; do
    stop_pids 10 "$entry"
    [ "${entry%%:*}" = containerd ] && kill_containers
done
say "components stopped"

# 2. The namespaces.
holders=$(awk '$1 ~ /-namespace$/ { print $2 }' "$dir/pids" 2>/dev/null)
node_pid="$(state_get "$dir" NODE_NS_PID)"
device_pid="$(state_get "$dir" DEVICE_NS_PID)"
# unshare passes SIGTERM on to nothing and waits for its child; its child (PID 1 of the
# node) dies with it, by the parent-death signal --kill-child set: SIGKILL at once.
# shellcheck disable=SC2086
[ -n "$holders" ] && kill -KILL $holders 2>/dev/null
for pid in $node_pid $device_pid; do
    for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && problem "namespace init $pid still running"
done
# Shims and containers were in the node's PID namespace: nothing of this cluster may
# still run (a shim names its containerd socket on its command line).
leftover="$(pgrep -f -- "$dir/" || true)"
if [ -n "$leftover" ]; then
    # shellcheck disable=SC2086
    kill -KILL $leftover 2>/dev/null
    sleep 0.5
    leftover="$(pgrep -f -- "$dir/" || true)"
    [ -n "$leftover" ] && problem "processes still running: $(ps -o pid=,args= -p "$(echo $leftover | tr ' ' ,)")"
fi
say "namespaces gone"

# 3. The cgroup tree (the kubelet's cgroupRoot), leaves first; a cgroup empties a moment
# after its last process dies.
if [ -n "$cgroup_root" ]; then
    for h in /sys/fs/cgroup/*/; do
        tree="${h%/}/$cgroup_root"
        [ -d "$tree" ] || continue
        for _ in $(seq 1 50); do
            find "$tree" -depth -type d -exec rmdir {} + 2>/dev/null
            [ -d "$tree" ] || break
            sleep 0.1
        done
        [ -d "$tree" ] && problem "cgroup $tree (pids: $(find "$tree" -name cgroup.procs -exec cat {} + | tr '\n' ' '))"
    done
    say "cgroups removed"
fi

# 4. Nothing of it left on the host.
grep -q -- "$dir" /proc/self/mountinfo && problem "mounts: $(grep -- "$dir" /proc/self/mountinfo | awk '{print $5}' | tr '\n' ' ')"
ip link show cni0 >/dev/null 2>&1 && problem "a cni0 bridge in the host's network namespace"
ip link show edge0 >/dev/null 2>&1 && problem "edge0 in the host's network namespace"
# The CNI bridge plugin names its masquerade rules after the network ("proxima-pods").
if iptables-save 2>/dev/null | grep -q 'proxima-pods'; then
    problem "iptables rules of the pods' network in the host's network namespace"
fi

if [ "$problems" -gt 0 ]; then
    say "down with $problems problem(s); $dir kept"
    exit 1
fi
if [ "${PROXIMA_KEEP_CLUSTER_DIR:-0}" = 1 ]; then
    rm -f "$dir/state"
    say "down; $dir kept (logs in $dir/logs)"
else
    rm -rf "$dir"
    say "down; $dir removed"
fi
