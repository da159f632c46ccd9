//! The list of a route's QoS-pool members, readable without a reference count.
//!
//! A pick reads the pool on every request and the pool changes only when a verdict
//! flips or node latencies move, so reads must be cheap and writes may be slow. Behind an
//! `ArcSwap<Vec<usize>>` a read cost two atomic read-modify-writes (arc-swap's debt slot
//! taken and paid back) on top of the loads. Here a read is plain atomic loads.
//!
//! # How it stays consistent
//!
//! Members are a subset of the route's endpoints, so the list has a fixed capacity: the
//! number of endpoints. It is kept twice, in two [`Slot`]s; `active` says which one
//! readers use. Each slot is a sequence lock (Boehm, "Can seqlocks get along with
//! programming language memory models?", MSPC 2012, §3 and Fig. 6): its counter is odd
//! while a writer fills it, and a reader that saw the same even counter before and after
//! reading (with an acquire fence in between) has read one complete list.
//!
//! A writer (one at a time, under `writer`) fills the slot readers are *not* using, then
//! points `active` at it. So a writer never stalls a reader that started after its last
//! switch: readers spin only when they loaded `active` just before a switch and a second
//! writer started refilling that slot, and then they retry on the new active slot, which
//! no writer touches until the next switch. A writer descheduled mid-write holds no reader
//! back.
//!
//! Every field is an atomic, so a torn read is a wrong *value*, never a data race: a
//! reader's closure may run on a mixed list (members of two versions), whose result is
//! then thrown away and the closure run again. Even a mixed list holds only indices that
//! some version held (all below the capacity), and a length no greater than the capacity.
//!
//! The writer stores the members and the length with release ordering rather than
//! putting a release fence after the odd counter (Boehm's Fig. 6): a reader whose
//! acquire fence follows a load that saw any of them then also sees the odd counter. On
//! x86-64 and for a path this rare it costs nothing, and it is the form the loom model
//! checker can check (loom has acquire fences only, tokio-rs/loom#117): the `loom_model`
//! tests run every interleaving of a reader with two writes that refill the slot it
//! reads, including the loads that return older values (`.ci/run` runs them with
//! `RUSTFLAGS="--cfg loom"`).

#[cfg(loom)]
use loom::sync::{
    atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Mutex,
};
#[cfg(not(loom))]
use std::sync::{
    atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Mutex,
};

/// What a reader does while a writer fills the slot it read: spin (the model checker
/// needs to be told so that it schedules the writer).
fn wait_for_the_writer() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// One copy of the list, guarded by its own sequence counter.
#[derive(Debug)]
struct Slot {
    /// Odd while a writer fills the slot.
    sequence: AtomicU64,
    len: AtomicUsize,
    members: Box<[AtomicU32]>,
}

impl Slot {
    fn new(capacity: usize) -> Self {
        Self {
            sequence: AtomicU64::new(0),
            len: AtomicUsize::new(0),
            members: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

/// A fixed-capacity list of endpoint indices, read lock-free (see the module docs).
#[derive(Debug)]
pub struct PoolList {
    slots: [Slot; 2],
    /// The slot readers use (0 or 1).
    active: AtomicUsize,
    /// Serialises writers (the router's writer lock already does; this keeps the list
    /// sound on its own).
    writer: Mutex<()>,
}

/// One consistent-or-discarded reading of a [`PoolList`], handed to
/// [`PoolList::read`]'s closure.
#[derive(Clone, Copy, Debug)]
pub struct PoolView<'a> {
    members: &'a [AtomicU32],
}

impl PoolView<'_> {
    /// How many members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The member at `position` (< [`Self::len`]): an index into the route's endpoints.
    #[inline]
    pub fn get(&self, position: usize) -> usize {
        self.members[position].load(Ordering::Relaxed) as usize
    }

    /// The members in list order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.members
            .iter()
            .map(|m| m.load(Ordering::Relaxed) as usize)
    }

    /// Whether `index` is a member.
    pub fn contains(&self, index: usize) -> bool {
        self.iter().any(|m| m == index)
    }
}

impl PoolList {
    /// An empty list that can hold `capacity` members, each below `capacity`.
    pub fn new(capacity: usize) -> Self {
        Self {
            slots: [Slot::new(capacity), Slot::new(capacity)],
            active: AtomicUsize::new(0),
            writer: Mutex::new(()),
        }
    }

    /// How many members the list can hold.
    pub fn capacity(&self) -> usize {
        self.slots[0].members.len()
    }

    /// Run `read` on one complete version of the list and return its result. `read` may
    /// run more than once (when a writer changed the list meanwhile; the earlier results
    /// are dropped), so it must have no effect other than its result and the draws it
    /// takes from an RNG.
    #[inline]
    pub fn read<R>(&self, mut read: impl FnMut(PoolView<'_>) -> R) -> R {
        loop {
            let slot = &self.slots[self.active.load(Ordering::Acquire) & 1];
            let before = slot.sequence.load(Ordering::Acquire);
            if before & 1 == 0 {
                // Never above the capacity, even when read mid-write.
                let len = slot.len.load(Ordering::Relaxed).min(slot.members.len());
                let result = read(PoolView {
                    members: &slot.members[..len],
                });
                // Orders the loads `read` made before the check below: if any saw a store
                // of a writer (each a release), the check sees that writer's odd counter.
                fence(Ordering::Acquire);
                if slot.sequence.load(Ordering::Relaxed) == before {
                    return result;
                }
            }
            wait_for_the_writer();
        }
    }

    /// The members, copied from one complete version.
    pub fn to_vec(&self) -> Vec<usize> {
        self.read(|view| view.iter().collect())
    }

    /// Publish `members` as the new list. Indices at or above the capacity cannot be
    /// members and are left out, as are those past the capacity-th (a route's pool has
    /// distinct members, so neither happens; the list stays sound if it did).
    pub fn set(&self, members: &[usize]) {
        let _one_writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let capacity = self.capacity();
        let next = (self.active.load(Ordering::Relaxed) & 1) ^ 1;
        let slot = &self.slots[next];
        let sequence = slot.sequence.load(Ordering::Relaxed);
        slot.sequence.store(sequence + 1, Ordering::Relaxed);
        // Each store below is a release: a reader that sees any of them (and then passes
        // its acquire fence) also sees the odd counter stored before it.
        let mut len = 0;
        for (&member, cell) in members
            .iter()
            .filter(|&&m| m < capacity)
            .zip(slot.members.iter())
        {
            // Fits: below the capacity, the length of a list in memory.
            cell.store(member as u32, Ordering::Release);
            len += 1;
        }
        slot.len.store(len, Ordering::Release);
        slot.sequence.store(sequence + 2, Ordering::Release);
        self.active.store(next, Ordering::Release);
    }
}

#[cfg(all(test, loom))]
mod loom_model {
    use loom::sync::Arc;

    use super::*;

    /// One reader against two writes from another thread: the second refills the slot
    /// of the version the reader may have started on. Whatever the interleaving and
    /// whichever older values its relaxed loads return, the reader gets one whole
    /// version (never a mix, never a length from one and members from another).
    #[test]
    fn a_reader_gets_one_whole_version_while_writers_refill_its_slot() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(|| {
            let versions: [&[usize]; 3] = [&[0, 1], &[2], &[1, 2, 0]];
            let list = Arc::new(PoolList::new(3));
            list.set(versions[0]);
            let reader = {
                let list = list.clone();
                loom::thread::spawn(move || {
                    let seen = list.to_vec();
                    assert!(versions.contains(&seen.as_slice()), "mixed: {seen:?}");
                    // A pick reads a position after the length: the same rule.
                    let (len, last) = list.read(|v| (v.len(), v.get(v.len() - 1)));
                    assert!(
                        versions
                            .iter()
                            .any(|v| v.len() == len && v[len - 1] == last),
                        "mixed: {len} members ending in {last}"
                    );
                })
            };
            list.set(versions[1]);
            list.set(versions[2]);
            reader.join().unwrap();
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use super::*;

    #[test]
    fn reads_what_was_set_and_skips_what_cannot_be_a_member() {
        let list = PoolList::new(5);
        assert_eq!(list.to_vec(), Vec::<usize>::new());
        list.set(&[3, 1, 4]);
        assert_eq!(list.to_vec(), vec![3, 1, 4]);
        list.set(&[0]);
        assert_eq!(list.to_vec(), vec![0]);
        assert!(list.read(|v| v.contains(0) && !v.contains(3) && v.len() == 1));
        list.set(&[]);
        assert!(list.read(|v| v.is_empty()));
        list.set(&[2, 4, 1, 0, 3]);
        assert_eq!(list.read(|v| (v.get(0), v.get(4))), (2, 3));
    }

    #[test]
    fn out_of_range_members_are_left_out() {
        let list = PoolList::new(3);
        list.set(&[7, 2, 0, 1, 1]);
        assert_eq!(list.to_vec(), vec![2, 0, 1]);
    }

    /// The list version `generation` writes: `1 + generation % capacity` members
    /// counting up from `generation % capacity`, wrapping. Every version differs from
    /// the one before in its length and in every member, so a list mixed from two
    /// versions fails `whole_version`.
    fn version(generation: usize, capacity: usize) -> Vec<usize> {
        let first = generation % capacity;
        (0..=first).map(|j| (first + j) % capacity).collect()
    }

    fn whole_version(members: &[usize], capacity: usize) -> bool {
        let Some(&first) = members.first() else {
            return true; // the initial, empty list
        };
        members.len() == first + 1
            && members
                .iter()
                .enumerate()
                .all(|(j, &m)| m == (first + j) % capacity)
    }

    #[test]
    fn concurrent_readers_never_see_a_mixed_list() {
        const CAPACITY: usize = 61;
        const READERS: usize = 3;
        let list = Arc::new(PoolList::new(CAPACITY));
        let done = Arc::new(AtomicBool::new(false));
        // Per reader: reads made, and distinct lengths seen (capped at 2: "more than one").
        let progress: Arc<Vec<(AtomicUsize, AtomicUsize)>> = Arc::new(
            (0..READERS)
                .map(|_| (AtomicUsize::new(0), AtomicUsize::new(0)))
                .collect(),
        );
        let readers: Vec<_> = (0..READERS)
            .map(|r| {
                let (list, done, progress) = (list.clone(), done.clone(), progress.clone());
                std::thread::spawn(move || {
                    let mut first_len = None;
                    while !done.load(Ordering::Relaxed) {
                        let members = list.to_vec();
                        assert!(whole_version(&members, CAPACITY), "mixed: {members:?}");
                        // Also through `get`, the way a pick reads two positions.
                        let (len, first, last) = list.read(|v| match v.len() {
                            0 => (0, 0, 0),
                            n => (n, v.get(0), v.get(n - 1)),
                        });
                        if len > 0 {
                            assert_eq!(len, first + 1);
                            assert_eq!(last, (first + len - 1) % CAPACITY);
                        }
                        let (reads, distinct) = &progress[r];
                        reads.fetch_add(1, Ordering::Relaxed);
                        match first_len {
                            None => {
                                first_len = Some(members.len());
                                distinct.store(1, Ordering::Relaxed);
                            }
                            Some(l) if l != members.len() => distinct.store(2, Ordering::Relaxed),
                            Some(_) => {}
                        }
                    }
                })
            })
            .collect();
        // Write until every reader has read many times and seen the list change (so the
        // reads overlapped the writes), within a bound.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut generation = 0;
        let settled = |p: &[(AtomicUsize, AtomicUsize)]| {
            p.iter().all(|(reads, distinct)| {
                reads.load(Ordering::Relaxed) >= 2_000 && distinct.load(Ordering::Relaxed) == 2
            })
        };
        while generation < 20_000 || !settled(&progress) {
            if std::time::Instant::now() > deadline {
                break;
            }
            list.set(&version(generation, CAPACITY));
            generation += 1;
            if generation % 64 == 0 {
                std::thread::yield_now();
            }
        }
        done.store(true, Ordering::Relaxed);
        for reader in readers {
            reader.join().unwrap();
        }
        assert!(
            settled(&progress),
            "readers did not overlap the writes in time"
        );
        assert_eq!(list.to_vec(), version(generation - 1, CAPACITY));
    }
}
