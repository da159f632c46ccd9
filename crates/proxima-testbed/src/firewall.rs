//! Packet drops for `blackhole` and `node-down`, with nftables, inside the testbed's own
//! network namespace.
//!
//! A real partition or a lost node makes packets vanish: a SYN gets no answer, so a
//! connect hangs until the caller's connect timeout, and an open connection stalls
//! while TCP retransmits into the void. User-space gates cannot do that (the kernel
//! completes the handshake before a gate sees the connection), so these events put the
//! affected addresses into nftables sets whose rules drop matching packets:
//!
//! ```text
//! table inet proxima_testbed_<block> {
//!   set links { type ipv4_addr . ipv4_addr }   # (from, to) of every blackholed link
//!   set down  { type ipv4_addr }               # every node that is down
//!   chain input {
//!     type filter hook input priority filter; policy accept;
//!     ip saddr . ip daddr @links drop
//!     ip saddr @down drop
//!     ip daddr @down drop
//!   }
//! }
//! ```
//!
//! The drop happens on the receiving side (the `input` hook: loopback packets pass it
//! on their way in), so the sender's `send` succeeds as on a real network and the
//! packet is lost on the way. Every change rewrites both sets in one `nft -f`
//! transaction ([`Firewall::sync`]), so the rules always match the cluster's state
//! exactly, and the table is deleted when the [`Firewall`] is dropped. A [`Firewall`] is
//! only ever made inside a private network namespace ([`crate::netns::check_isolated`]):
//! the host's firewall is never touched.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::TestbedError;

/// The nftables table of one run block (see the module docs). Dropping it deletes the
/// table.
#[derive(Debug)]
pub struct Firewall {
    nft: PathBuf,
    table: String,
}

/// Where `nft` is: on `PATH`, else the Debian locations (`/usr/sbin` is not on every
/// user's `PATH`).
fn find_nft() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("nft"))
        .find(|path| path.is_file())
}

fn v4(address: IpAddr) -> Result<Ipv4Addr, TestbedError> {
    match address {
        IpAddr::V4(a) => Ok(a),
        IpAddr::V6(a) => Err(TestbedError::Net(format!(
            "packet drops are for IPv4 node addresses, not {a}"
        ))),
    }
}

impl Firewall {
    /// Make the table of run block `block`, with empty sets (nothing dropped). Fails
    /// unless this process is in the testbed's own network namespace and `nft` works.
    pub fn new(block: u8) -> Result<Firewall, TestbedError> {
        crate::netns::check_isolated().map_err(|e| {
            TestbedError::Net(format!(
                "blackhole and node-down drop packets with nftables in the testbed's own \
                 network namespace: {e}"
            ))
        })?;
        let nft = find_nft().ok_or_else(|| {
            TestbedError::Net(
                "blackhole and node-down drop packets with nftables, but `nft` is not \
                 installed (Debian: apt-get install nftables)"
                    .into(),
            )
        })?;
        let firewall = Firewall {
            nft,
            table: format!("proxima_testbed_{block}"),
        };
        let table = &firewall.table;
        // `add` then `delete` clears a table left behind without failing when there is
        // none; the whole script is one transaction.
        firewall.run(&format!(
            "add table inet {table}\n\
             delete table inet {table}\n\
             table inet {table} {{\n\
             \x20 set links {{ type ipv4_addr . ipv4_addr; }}\n\
             \x20 set down {{ type ipv4_addr; }}\n\
             \x20 chain input {{\n\
             \x20   type filter hook input priority filter; policy accept;\n\
             \x20   ip saddr . ip daddr @links drop\n\
             \x20   ip saddr @down drop\n\
             \x20   ip daddr @down drop\n\
             \x20 }}\n\
             }}\n"
        ))?;
        Ok(firewall)
    }

    /// Drop exactly the packets of these links (`from → to`, one direction each) and
    /// everything to and from these nodes; nothing else.
    pub fn sync(&self, links: &[(IpAddr, IpAddr)], down: &[IpAddr]) -> Result<(), TestbedError> {
        let table = &self.table;
        let mut script = format!("flush set inet {table} links\nflush set inet {table} down\n");
        if !links.is_empty() {
            let elements = links
                .iter()
                .map(|&(from, to)| Ok(format!("{} . {}", v4(from)?, v4(to)?)))
                .collect::<Result<Vec<_>, TestbedError>>()?;
            script.push_str(&format!(
                "add element inet {table} links {{ {} }}\n",
                elements.join(", ")
            ));
        }
        if !down.is_empty() {
            let elements = down
                .iter()
                .map(|&a| v4(a).map(|a| a.to_string()))
                .collect::<Result<Vec<_>, TestbedError>>()?;
            script.push_str(&format!(
                "add element inet {table} down {{ {} }}\n",
                elements.join(", ")
            ));
        }
        self.run(&script)
    }

    /// The table's name (`proxima_testbed_<block>`).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Feed `script` to `nft -f -` (one transaction).
    fn run(&self, script: &str) -> Result<(), TestbedError> {
        let fail = |what: String| TestbedError::Net(format!("nft: {what}"));
        let mut child = Command::new(&self.nft)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| fail(format!("cannot run {}: {e}", self.nft.display())))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(script.as_bytes())
                .map_err(|e| fail(e.to_string()))?;
        }
        let output = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(fail(format!(
                "{} ({}) for:\n{script}",
                String::from_utf8_lossy(&output.stderr).trim(),
                output.status
            )))
        }
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        let table = self.table.clone();
        if let Err(error) = self.run(&format!(
            "add table inet {table}\ndelete table inet {table}\n"
        )) {
            tracing::warn!(%error, "cannot delete the testbed's nftables table");
        }
    }
}
