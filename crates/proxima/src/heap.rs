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
//!
//! glibc also gives each thread that allocates an arena of its own, up to eight per CPU,
//! and free pages in one arena serve no other: with a data-plane worker, the control
//! plane's runtime and the main thread, the same load leaves several partly used heaps.
//! [`limit_arenas`] caps them at one per data-plane worker before any thread starts
//! (as `MALLOC_ARENA_MAX` would), which keeps the workers apart and has the rarely
//! allocating control-plane threads share with them. An operator's `MALLOC_ARENA_MAX`
//! wins.

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

/// At most `workers` malloc arenas (at least one), unless `MALLOC_ARENA_MAX` is set.
/// Call before any thread is started: threads that already have an arena keep it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn limit_arenas(workers: usize) {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    let arenas = libc::c_int::try_from(workers.max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt only sets a tunable of the allocator under its own lock; M_ARENA_MAX
    // takes any positive count.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn limit_arenas(_workers: usize) {}

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

    /// The arenas glibc reports (`malloc_info`'s `<heap nr=…>` elements).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn arenas() -> usize {
        let mut buf: *mut libc::c_char = std::ptr::null_mut();
        let mut len: libc::size_t = 0;
        // SAFETY: open_memstream gives a stream writing into a buffer it allocates;
        // after fclose `buf` holds `len` bytes, which are freed below.
        let xml = unsafe {
            let stream = libc::open_memstream(&mut buf, &mut len);
            assert!(!stream.is_null());
            assert_eq!(libc::malloc_info(0, stream), 0);
            libc::fclose(stream);
            let xml = String::from_utf8_lossy(std::slice::from_raw_parts(buf.cast::<u8>(), len))
                .into_owned();
            libc::free(buf.cast());
            xml
        };
        xml.matches("<heap nr=").count()
    }

    const CHILD: &str = "PROXIMA_HEAP_TEST_CHILD";

    /// Run in a child process (arenas cannot be limited once threads have their own):
    /// four threads allocate at once under a limit of two arenas.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn arenas_stay_within_the_limit() {
        if std::env::var_os(CHILD).is_some() {
            limit_arenas(2);
            let start = std::sync::Arc::new(std::sync::Barrier::new(4));
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let start = start.clone();
                    std::thread::spawn(move || {
                        start.wait();
                        let blocks: Vec<Vec<u8>> = (0..1000).map(|i| vec![i as u8; 256]).collect();
                        start.wait();
                        blocks.len()
                    })
                })
                .collect();
            for t in threads {
                assert_eq!(t.join().unwrap(), 1000);
            }
            let arenas = arenas();
            assert!(
                (1..=2).contains(&arenas),
                "{arenas} arenas under a limit of 2"
            );
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "heap::tests::arenas_stay_within_the_limit",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .env_remove("MALLOC_ARENA_MAX")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "child failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
    }
}
