//! Buffers kept per thread for reuse: a request borrows what it needs for as long as it
//! runs (header maps, the response head it writes, the parser's field list) and gives
//! it back, so that a request does not pay an allocation for each and a connection
//! that is idle holds none of them (issue 29: an idle client connection costs what its
//! socket and task need, not what its last request needed).
//!
//! Each kind of buffer has its own small stack per thread ([`Spare::kept`]); a worker
//! thread runs a few requests at once, so a few buffers per kind are enough. A buffer
//! that grew past its kind's limit is freed rather than kept, so one large request
//! does not pin memory for the life of the thread.

use std::cell::RefCell;
use std::thread::LocalKey;

use http::HeaderMap;

/// Buffers of one kind kept per thread.
const KEPT: usize = 16;

/// A buffer kind kept per thread.
pub(crate) trait Spare: Sized + 'static {
    /// This thread's kept buffers of the kind.
    fn kept() -> &'static LocalKey<RefCell<Vec<Self>>>;
    /// Empty `self` for its next user; `false` when it is too large to keep.
    fn reset(&mut self) -> bool;
}

/// A kept buffer of kind `T`, if this thread has one (empty, with its room).
pub(crate) fn take<T: Spare>() -> Option<T> {
    T::kept()
        .try_with(|kept| kept.try_borrow_mut().ok()?.pop())
        .ok()
        .flatten()
}

/// Keep `item`, emptied, for a later [`take`] on this thread.
pub(crate) fn give_back<T: Spare>(mut item: T) {
    if !item.reset() {
        return;
    }
    let _ = T::kept().try_with(|kept| {
        if let Ok(mut kept) = kept.try_borrow_mut() {
            if kept.len() < KEPT {
                kept.push(item);
            }
        }
    });
}

/// Header maps: a request's and a response's map cost two allocations each, on every
/// request. A map comes back once its head has been written (`http1::serve::respond`,
/// `forward::attempt`).
impl Spare for HeaderMap {
    fn kept() -> &'static LocalKey<RefCell<Vec<Self>>> {
        thread_local! {
            static KEPT_MAPS: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
        }
        &KEPT_MAPS
    }

    fn reset(&mut self) -> bool {
        /// Maps that held more fields than this are freed.
        const MAX_FIELDS: usize = 64;
        self.clear();
        self.capacity() > 0 && self.capacity() <= MAX_FIELDS
    }
}

/// Byte buffers: the response heads the proxy's HTTP/1.1 server writes.
impl Spare for Vec<u8> {
    fn kept() -> &'static LocalKey<RefCell<Vec<Self>>> {
        thread_local! {
            static KEPT_BYTES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
        }
        &KEPT_BYTES
    }

    fn reset(&mut self) -> bool {
        /// A head with a large body frame copied behind it (`http1::serve::respond`) is
        /// under 16 KiB; larger buffers are freed.
        const MAX_BYTES: usize = 16 * 1024;
        self.clear();
        self.capacity() > 0 && self.capacity() <= MAX_BYTES
    }
}

/// An empty header map with room for `capacity` fields: a kept one if there is one.
pub(crate) fn header_map(capacity: usize) -> Result<HeaderMap, http::header::MaxSizeReached> {
    match take::<HeaderMap>() {
        Some(mut map) => {
            map.try_reserve(capacity)?;
            Ok(map)
        }
        None => HeaderMap::try_with_capacity(capacity),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn a_map_comes_back_empty_with_its_room_and_large_ones_are_not_kept() {
        std::thread::spawn(|| {
            let mut map = header_map(4).unwrap();
            map.insert("x-a", HeaderValue::from_static("1"));
            let room = map.capacity();
            give_back(map);
            let again = header_map(2).unwrap();
            assert!(again.is_empty());
            assert_eq!(again.capacity(), room, "the kept map, not a new one");

            let mut large = header_map(200).unwrap();
            large.insert("x-b", HeaderValue::from_static("2"));
            give_back(large);
            assert!(take::<HeaderMap>().is_none(), "a large map is not kept");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn byte_buffers_are_kept_per_thread_up_to_a_bound() {
        std::thread::spawn(|| {
            let mut buf = Vec::with_capacity(100);
            buf.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
            give_back(buf);
            let kept: Vec<u8> = take().unwrap();
            assert!(kept.is_empty());
            assert_eq!(kept.capacity(), 100);
            assert!(take::<Vec<u8>>().is_none(), "one given back, one taken");

            give_back(Vec::<u8>::with_capacity(1 << 20));
            assert!(take::<Vec<u8>>().is_none(), "a large buffer is not kept");

            for _ in 0..2 * KEPT {
                give_back(Vec::<u8>::with_capacity(8));
            }
            let mut count = 0;
            while take::<Vec<u8>>().is_some() {
                count += 1;
            }
            assert_eq!(count, KEPT);
        })
        .join()
        .unwrap();
    }
}
