//! The handshakes between a ring's writer and reader over its two header words: publishing an
//! index, asking for a doorbell or for room, and deciding whether to ring or to wake. Kept
//! apart from the mapping so that `tests/loom.rs` runs this very file under its model checker
//! (through `crate::sync`, which names loom's atomics there): a lost doorbell or a lost wake
//! for room is a side asleep for ever, which loom reports.
//!
//! Each request shares a word with the index it is about: the reader's "ring me" bit
//! ([`PARKED`]) lives in the writer's `head`, the writer's "wake me" bit ([`FULL`]) in the
//! reader's `tail`. The reader parks with a `fetch_or` on `head` and the writer publishes with a
//! `swap` of it, so the two are ordered by the word itself: either the park comes first (the
//! writer's swap returns the bit and it rings) or the publish does (the park returns the new
//! index and the reader reads instead of waiting). No fence is needed, and nothing rests on
//! the subtler rules of sequentially consistent fences.

use crate::sync::atomic::{AtomicU64, Ordering};

/// In `head`: the reader waits for a doorbell.
pub(crate) const PARKED: u64 = 1 << 63;
/// In `tail`: the writer waits for room.
pub(crate) const FULL: u64 = 1 << 63;
/// The index bits of either word.
pub(crate) const INDEX: u64 = !(1 << 63);

/// A ring's header words, wherever they live (a shared mapping; a model's atomics).
pub(crate) struct Header<'a> {
    /// Bytes the writer has put in the ring, ever, and [`PARKED`].
    pub(crate) head: &'a AtomicU64,
    /// Bytes the reader has taken, ever, and [`FULL`].
    pub(crate) tail: &'a AtomicU64,
}

impl Header<'_> {
    /// The writer's index as published (a hostile writer's may be anything: the caller checks).
    pub(crate) fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire) & INDEX
    }

    /// The reader's index as published.
    pub(crate) fn tail(&self) -> u64 {
        self.tail.load(Ordering::Acquire) & INDEX
    }

    /// Reader: whether bytes wait past `tail` (its own index). (The reader asks through
    /// [`Self::park`]; this is for the models and tests.)
    #[allow(dead_code)]
    pub(crate) fn has_bytes(&self, tail: u64) -> bool {
        self.head() != tail
    }

    /// Reader: ask for a doorbell. `true` if bytes came meanwhile (the request is withdrawn:
    /// read them instead of waiting).
    pub(crate) fn park(&self, tail: u64) -> bool {
        let head = self.head.fetch_or(PARKED, Ordering::AcqRel) & INDEX;
        if head != tail {
            self.unpark();
            return true;
        }
        false
    }

    /// Reader: no doorbell wanted any more (it is reading).
    pub(crate) fn unpark(&self) {
        if self.head.load(Ordering::Relaxed) & PARKED != 0 {
            self.head.fetch_and(INDEX, Ordering::Relaxed);
        }
    }

    /// Reader: publish `tail` after taking bytes; `true` if the writer waits for room (wake
    /// it then; the request is cleared, one wake answers it).
    pub(crate) fn publish_tail(&self, tail: u64) -> bool {
        self.tail.swap(tail & INDEX, Ordering::AcqRel) & FULL != 0
    }

    /// Writer: publish `head` after putting bytes in; `true` if the reader asked for a
    /// doorbell (ring it then; the request is cleared, one doorbell answers one park).
    pub(crate) fn publish_head(&self, head: u64) -> bool {
        self.head.swap(head & INDEX, Ordering::AcqRel) & PARKED != 0
    }

    /// Writer, finding no room past `head` in a ring of `cap` bytes: ask to be woken when the
    /// reader takes bytes. `true` if there is room already (the request is withdrawn).
    pub(crate) fn wait_room(&self, head: u64, cap: u64) -> bool {
        let tail = self.tail.fetch_or(FULL, Ordering::AcqRel) & INDEX;
        if head.wrapping_sub(tail) < cap {
            self.tail.fetch_and(INDEX, Ordering::Relaxed);
            return true;
        }
        false
    }
}
