//! The testbed's own network namespace.
//!
//! Runs happen in a private network namespace, for two reasons: `--kube` needs node
//! addresses that are not loopback (kube-apiserver refuses 127.0.0.0/8 in
//! EndpointSlices), and `blackhole` / `node-down` drop packets with nftables rules
//! ([`crate::firewall`]), which must never touch the host's own firewall. The binary
//! re-executes itself under `unshare --net --pid` ([`reexec_isolated`]; with
//! `--map-root-user` when it is not root, so that an unprivileged user with user
//! namespaces gets CAP_NET_ADMIN over the new namespace only), after bringing `lo` up
//! and putting any extra addresses on it as /32s. The namespace has no interface but
//! `lo` and no route out, so nothing can leave it; the node addresses `127.K.1.N` are
//! loopback addresses of that namespace.

use std::net::IpAddr;
use std::process::{Command, ExitStatus};

use crate::TestbedError;

/// Set in the re-executed process: the comma-separated extra addresses on its `lo`
/// (possibly none: the variable is then empty).
pub const NETNS_ENV: &str = "PROXIMA_NETNS";

/// Whether this process was started by [`reexec_isolated`] (or the test harness's
/// equivalent, which sets the same variable).
pub fn inside() -> bool {
    std::env::var_os(NETNS_ENV).is_some()
}

/// Whether this process runs as root (effective uid 0), from `/proc/self/status`.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Run this same command again in a fresh network (and PID) namespace whose `lo` is up
/// and holds `addresses` as /32s, with [`NETNS_ENV`] set; wait for it and return its
/// status.
pub fn reexec_isolated(addresses: &[IpAddr]) -> Result<ExitStatus, TestbedError> {
    let exe = std::env::current_exe().map_err(|e| TestbedError::Net(e.to_string()))?;
    let mut prelude = String::from("set -e; ip link set lo up");
    for a in addresses {
        prelude.push_str(&format!("; ip addr add {a}/32 dev lo"));
    }
    prelude.push_str("; exec \"$0\" \"$@\"");
    let list: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
    let mut unshare = Command::new("unshare");
    if !is_root() {
        unshare.arg("--map-root-user");
    }
    // A PID namespace too: whatever ends the run ends what it started (etcd and
    // kube-apiserver with `--kube`).
    unshare
        .args(["--net", "--pid", "--fork", "--kill-child", "--", "sh", "-c"])
        .arg(&prelude)
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(NETNS_ENV, list.join(","))
        .status()
        .map_err(|e| {
            TestbedError::Net(format!(
                "cannot run `unshare --net` for the testbed's own network namespace \
                 (needs util-linux, and root or user namespaces): {e}"
            ))
        })
}

/// The network interfaces of this process's namespace. `/proc/self/net/dev` shows it
/// (`/sys/class/net` would show the namespace `/sys` was mounted in).
fn interfaces() -> Result<Vec<String>, TestbedError> {
    let dev = std::fs::read_to_string("/proc/self/net/dev")
        .map_err(|e| TestbedError::Net(format!("/proc/self/net/dev: {e}")))?;
    Ok(dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(|name| name.trim().to_string())
        .collect())
}

/// Fail unless this process is in a private network namespace: [`NETNS_ENV`] set and
/// no interface but `lo`.
pub fn check_isolated() -> Result<(), TestbedError> {
    let interfaces = interfaces()?;
    if !inside() {
        return Err(TestbedError::Net(format!(
            "not in the testbed's own network namespace ({NETNS_ENV} is not set); \
             the `proxima-testbed run` binary makes one itself"
        )));
    }
    if interfaces == ["lo"] {
        Ok(())
    } else {
        Err(TestbedError::Net(format!(
            "{NETNS_ENV} is set but this is not a private network namespace (interfaces: \
             {interfaces:?})"
        )))
    }
}
