//! Giving freed heap memory back to the system.
//!
//! glibc's allocator keeps pages that were freed inside its heaps (one per thread that
//! allocated, "arenas") for later allocations; only memory at the very top of a heap
//! goes back by itself. Building the routing table from a large topology, a burst of
//! connections or a discovery resync leaves such pages behind, and they count in the
//! proxy's RSS on every node for as long as it runs. `malloc_trim(0)` walks every arena
//! and returns the free whole pages (`MADV_DONTNEED`), keeping live memory where it is.
//! It holds each arena's lock for the walk, well under a millisecond at this proxy's
//! heap sizes, so it runs once the proxy is ready and then every [`TRIM_EVERY`].
//! Elsewhere than glibc it does nothing.

use std::future::Future;
use std::time::Duration;

/// How often free heap pages are given back.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Give free heap pages back now, and every [`TRIM_EVERY`] until `stop` resolves.
pub async fn give_back_free_pages(stop: impl Future<Output = ()>) {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = every.tick() => trim(),
            () = &mut stop => return,
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    let start = std::time::Instant::now();
    // SAFETY: malloc_trim only walks the allocator's own state under its locks; it has
    // no preconditions and is safe to call from any thread at any time.
    let released = unsafe { libc::malloc_trim(0) };
    tracing::debug!(
        released = released != 0,
        took_us = start.elapsed().as_micros() as u64,
        "gave free heap pages back"
    );
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_pages_leave_the_resident_set() {
        fn resident_kib() -> u64 {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap()
        }
        // 64 KiB blocks (below the mmap threshold, so they live in a heap), each followed
        // by a small block that stays: the freed ones cannot shrink the heap from its top.
        let mut freed = Vec::new();
        let mut kept = Vec::new();
        for i in 0..512u32 {
            freed.push(vec![1u8; 64 * 1024]);
            kept.push(vec![i as u8; 64]);
        }
        // Measured with the blocks in use: another test in this process may run the
        // proxy, whose own trim could release them first.
        let with_blocks = resident_kib();
        drop(freed);
        trim();
        let after = resident_kib();
        assert!(
            with_blocks.saturating_sub(after) >= 16 * 1024,
            "RSS {with_blocks} KiB with 32 MiB in 64 KiB blocks, {after} KiB once freed and trimmed"
        );
        // What is still in use stays.
        assert!(kept.iter().enumerate().all(|(i, b)| b[0] == i as u8));
    }
}
