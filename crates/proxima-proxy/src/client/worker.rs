//! Which worker the current thread is (`workers.rs`), for the parts that act per worker:
//! the connection pool (a worker reuses the connections its runtime drives) and the
//! stall meter (each worker measures its own). Apart from `workers.rs`, so that those
//! parts need not import the serving code.

use std::cell::RefCell;
use std::sync::Arc;

use crate::client::stall::StallMeter;

/// What the current thread is, for the pool and the stall meter.
#[derive(Debug)]
struct Worker {
    /// 1-based worker number; 0 is any thread that is not a worker.
    index: u32,
    stall: Arc<StallMeter>,
}

thread_local! {
    static CURRENT: RefCell<Option<Worker>> = const { RefCell::new(None) };
}

/// Make the current thread worker `index`, measuring its stalls with `stall`, or (`None`)
/// no worker.
pub(crate) fn enter(worker: Option<(u32, Arc<StallMeter>)>) {
    let worker = worker.map(|(index, stall)| Worker { index, stall });
    CURRENT.with(|current| *current.borrow_mut() = worker);
}

/// Make the current thread count as worker `index` (tests of the per-worker rules).
#[cfg(test)]
pub(crate) fn pretend_worker(index: u32) {
    enter(Some((index, Arc::new(StallMeter::new()))));
}

/// The worker number of the current thread (0 when it is not a worker).
pub(crate) fn current_index() -> u32 {
    CURRENT.with(|w| w.borrow().as_ref().map_or(0, |w| w.index))
}

/// Run `f` with the current worker's stall meter, if this thread is a worker.
pub(crate) fn with_stall<R>(f: impl FnOnce(Option<&StallMeter>) -> R) -> R {
    CURRENT.with(|w| f(w.borrow().as_ref().map(|w| &*w.stall)))
}
