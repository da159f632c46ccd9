//! Polling a `select!` branch only when it was woken.
//!
//! A connection's task is woken by its sockets a few times per request, and each wake
//! polls every branch of the connection's `select!`s: the watchdog (a timer and the
//! shutdown signal) and, while a request waits for its pod, the read that notices the
//! client going away. Those almost never have anything to say, yet each poll of them
//! costs a timer check, a coop budget check and a socket readiness check.
//!
//! A [`Gate`] gives such a branch a waker of its own. That waker notes that the branch
//! was woken and then wakes the task; the branch's future is polled only when its waker
//! fired since its last poll, or when a new future starts behind the gate
//! ([`Gate::wrap`] arms it, so that the new future is polled once and registers its
//! interest). A wake can come from another thread (the shutdown signal), so both the
//! note and the task's waker are thread-safe.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Gate {
    flag: Arc<Flag>,
    /// `flag` as a waker, made once.
    waker: Waker,
}

#[derive(Debug, Default)]
struct Flag {
    woken: AtomicBool,
    /// The task to wake when the branch is woken.
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(task) = &*task {
            task.wake_by_ref();
        }
    }
}

impl Gate {
    pub(crate) fn new() -> Self {
        let flag = Arc::new(Flag::default());
        let waker = Waker::from(flag.clone());
        Self { flag, waker }
    }

    /// `future`, to be polled behind this gate; it is polled at its first poll.
    pub(crate) fn wrap<F: Future>(&self, future: F) -> Gated<'_, F> {
        self.flag.woken.store(true, Ordering::Release);
        Gated { gate: self, future }
    }

    /// Poll with `poll` if the branch was woken (or armed) since its last poll.
    fn poll<T>(
        &self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        {
            // The task's waker goes in before the note is read: a wake in between
            // finds it, and the task is polled again.
            let mut task = self.flag.task.lock().unwrap_or_else(|e| e.into_inner());
            match &mut *task {
                Some(known) if known.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
        }
        if !self.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        poll(&mut Context::from_waker(&self.waker))
    }
}

pin_project_lite::pin_project! {
    /// A future behind a [`Gate`].
    #[derive(Debug)]
    pub(crate) struct Gated<'g, F> {
        gate: &'g Gate,
        #[pin]
        future: F,
    }
}

impl<F: Future> Future for Gated<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let future = this.future;
        this.gate.poll(cx, |cx| future.poll(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A future that counts its polls and is ready once `ready` is set; it wakes the
    /// waker it was last polled with when `fire` is called.
    #[derive(Default)]
    struct Probe {
        polls: AtomicUsize,
        ready: AtomicBool,
        waker: Mutex<Option<Waker>>,
    }

    impl Probe {
        fn fire(&self) {
            self.ready.store(true, Ordering::SeqCst);
            if let Some(waker) = self.waker.lock().unwrap().take() {
                waker.wake();
            }
        }
    }

    struct Polled<'p>(&'p Probe);

    impl Future for Polled<'_> {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.0.polls.fetch_add(1, Ordering::SeqCst);
            if self.0.ready.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *self.0.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    #[derive(Default)]
    struct TaskWakes(AtomicUsize);

    impl Wake for TaskWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_branch_is_polled_first_and_then_only_after_its_own_wake() {
        let gate = Gate::new();
        let probe = Probe::default();
        let wakes = Arc::new(TaskWakes::default());
        let task = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&task);
        let mut gated = Box::pin(gate.wrap(Polled(&probe)));

        assert!(gated.as_mut().poll(&mut cx).is_pending());
        assert_eq!(
            probe.polls.load(Ordering::SeqCst),
            1,
            "polled when it starts"
        );
        // The task is woken for other reasons: the branch is not polled.
        for _ in 0..3 {
            assert!(gated.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(probe.polls.load(Ordering::SeqCst), 1);
        // Its own waker fires: the task is woken, and the branch is polled.
        probe.fire();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert!(gated.as_mut().poll(&mut cx).is_ready());
        assert_eq!(probe.polls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_new_future_behind_the_gate_is_polled_at_once() {
        let gate = Gate::new();
        let task = Waker::from(Arc::new(TaskWakes::default()));
        let mut cx = Context::from_waker(&task);
        let first = Probe::default();
        let mut gated = Box::pin(gate.wrap(Polled(&first)));
        assert!(gated.as_mut().poll(&mut cx).is_pending());
        drop(gated);
        let second = Probe::default();
        let mut gated = Box::pin(gate.wrap(Polled(&second)));
        assert!(gated.as_mut().poll(&mut cx).is_pending());
        assert_eq!(second.polls.load(Ordering::SeqCst), 1);
    }
}
