//! Transfer uids and their owner shards: `allocate_transfer_uid` hands each thread uids whose
//! owner is the thread's home shard while it issues transfers one at a time, and spreads a
//! burst over every shard.
//!
//! A transfer's owner is derived from its uid alone ([`owner_of`]: blocks of [`OWNER_BLOCK`]
//! consecutive uids share an owner), so every submission of one uid meets the same owner
//! table and a duplicate is caught there. Which owner a caller meets is therefore decided
//! when its uid is drawn. Meeting the same shard every time matters: a shard that has been
//! idle for a few milliseconds is parked, and waking it (and the peer's shard behind its
//! lane) costs more than a small transfer itself; when consecutive uids simply rotated over
//! the shards, every 16th transfer of a caller issuing them one after another met a shard
//! idle since its last turn and took a millisecond on the H100 host (issue 23's tails).
//!
//! So uids are drawn in blocks from one engine-wide, increasing block counter: a thread takes
//! the next free block whose owner is its home shard (homes are dealt round robin as threads
//! first allocate), skipping the blocks between (they are never handed out). A thread that
//! used up a block in under [`BURST`] is issuing a burst (many transfers in flight at once,
//! where spreading owners spreads the work): its next block goes to the next shard, and it
//! comes back home once it slows down. Uids stay unique across the engine and increasing per
//! thread; unlike MORI-IO's counter they are not consecutive across blocks.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Uids per owner block.
pub(crate) const OWNER_BLOCK: u64 = 16;

/// A block used up faster than this is a burst.
const BURST: Duration = Duration::from_micros(50);

/// Engines a thread keeps a cursor for (older cursors are dropped: their thread just draws
/// a fresh block next time).
const CURSORS: usize = 8;

/// The owner shard of transfer `uid` (derived from the uid alone).
pub(crate) fn owner_of(uid: u64, n_owners: usize) -> usize {
    ((uid / OWNER_BLOCK) % n_owners.max(1) as u64) as usize
}

/// One engine's uid source.
#[derive(Debug)]
pub(crate) struct UidSource {
    /// Tells this engine's cursors apart from other engines' in a thread.
    id: u64,
    /// The first block not yet handed out.
    next_block: AtomicU64,
    /// Homes dealt so far.
    homes: AtomicUsize,
}

/// A thread's position in one engine's uids.
struct Cursor {
    source: u64,
    /// Owners the current block was drawn for.
    n: usize,
    home: usize,
    /// The owner of the current block.
    owner: usize,
    next: u64,
    end: u64,
    /// When the current block was drawn.
    drawn: Instant,
}

thread_local! {
    static THREAD: RefCell<Vec<Cursor>> = const { RefCell::new(Vec::new()) };
}

impl Default for UidSource {
    fn default() -> Self {
        static SOURCES: AtomicU64 = AtomicU64::new(0);
        Self {
            id: SOURCES.fetch_add(1, Ordering::Relaxed),
            next_block: AtomicU64::new(0),
            homes: AtomicUsize::new(0),
        }
    }
}

impl UidSource {
    /// A fresh uid for the calling thread; `n_owners` is the running backend's owner count
    /// (asked for only when a new block is drawn).
    pub fn allocate(&self, n_owners: impl FnOnce() -> usize) -> u64 {
        THREAD.with(|t| {
            let mut t = t.borrow_mut();
            let i = match t.iter().position(|c| c.source == self.id) {
                Some(i) => i,
                None => {
                    if t.len() == CURSORS {
                        t.remove(0);
                    }
                    t.push(Cursor {
                        source: self.id,
                        n: 0,
                        home: self.homes.fetch_add(1, Ordering::Relaxed),
                        owner: 0,
                        next: 0,
                        end: 0,
                        drawn: Instant::now(),
                    });
                    t.len() - 1
                }
            };
            let c = &mut t[i];
            if c.next < c.end {
                c.next += 1;
                return c.next - 1;
            }
            self.draw(c, n_owners().max(1));
            c.next += 1;
            c.next - 1
        })
    }

    /// Point `c` at a new block of `n` owners' uids.
    fn draw(&self, c: &mut Cursor, n: usize) {
        let now = Instant::now();
        c.owner = if c.n == n && c.end != 0 && now.duration_since(c.drawn) < BURST {
            (c.owner + 1) % n
        } else {
            c.home % n
        };
        c.n = n;
        let want = c.owner as u64;
        let n64 = n as u64;
        // The first free block whose owner is `want`; the free blocks before it are skipped.
        // (Wrapping: 2^60 blocks would take decades at a block per nanosecond.)
        let first_for = |b: u64| b.wrapping_add((want + n64 - b % n64) % n64);
        let prev = match self
            .next_block
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(first_for(b).wrapping_add(1))
            }) {
            Ok(b) | Err(b) => b,
        };
        c.next = first_for(prev).wrapping_mul(OWNER_BLOCK);
        c.end = c.next.wrapping_add(OWNER_BLOCK);
        c.drawn = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn owners_come_in_blocks_of_consecutive_uids_and_cover_every_shard() {
        assert!((0..OWNER_BLOCK).all(|u| owner_of(u, 4) == 0));
        assert_eq!(owner_of(OWNER_BLOCK, 4), 1);
        assert_eq!(owner_of(4 * OWNER_BLOCK, 4), 0);
        assert_eq!(owner_of(u64::MAX, 1), 0);
        assert_eq!(owner_of(7, 0), 0, "no owners is treated as one");
        let mut seen = [0usize; 8];
        for u in 0..8 * OWNER_BLOCK * 10 {
            seen[owner_of(u, 8)] += 1;
        }
        assert!(seen.iter().all(|&n| n == (OWNER_BLOCK * 10) as usize));
    }

    #[test]
    fn a_thread_issuing_one_at_a_time_keeps_its_home_owner_and_starts_at_zero() {
        let s = UidSource::default();
        let first = s.allocate(|| 8);
        assert_eq!(first, 0, "the first uid of an engine is 0, as MORI-IO's");
        let mut last = first;
        for _ in 0..100 {
            // Slower than a burst: each block takes longer than BURST.
            std::thread::sleep(BURST / 8);
            let u = s.allocate(|| 8);
            assert!(u > last, "uids increase per thread");
            assert_eq!(owner_of(u, 8), owner_of(first, 8));
            last = u;
        }
    }

    #[test]
    fn a_burst_spreads_over_every_owner_and_comes_home_after() {
        let s = UidSource::default();
        let home = owner_of(s.allocate(|| 4), 4);
        // Sixteen blocks back to back (a preempted block only sends the next one home).
        let burst: Vec<u64> = (0..16 * OWNER_BLOCK).map(|_| s.allocate(|| 4)).collect();
        let owners: HashSet<usize> = burst.iter().map(|&u| owner_of(u, 4)).collect();
        assert_eq!(owners.len(), 4, "a burst meets every owner: {owners:?}");
        // One at a time again: once the current block is used up, every block is home's.
        let slow: Vec<u64> = (0..2 * OWNER_BLOCK)
            .map(|_| {
                std::thread::sleep(BURST);
                s.allocate(|| 4)
            })
            .collect();
        assert!(slow[OWNER_BLOCK as usize..]
            .iter()
            .all(|&u| owner_of(u, 4) == home));
    }

    #[test]
    fn threads_never_share_a_uid_even_when_the_owner_count_changes() {
        let s = std::sync::Arc::new(UidSource::default());
        let hs: Vec<_> = (0..6)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let n = if t % 2 == 0 { 4 } else { 3 };
                    (0..2000).map(|_| s.allocate(|| n)).collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for h in hs {
            let v = h.join().unwrap();
            assert!(v.windows(2).all(|w| w[0] < w[1]), "increasing per thread");
            for u in v {
                assert!(seen.insert(u), "uid {u} handed out twice");
            }
        }
    }

    #[test]
    fn threads_get_homes_round_robin() {
        let s = std::sync::Arc::new(UidSource::default());
        let owners: HashSet<usize> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || owner_of(s.allocate(|| 4), 4))
                    .join()
                    .unwrap()
            })
            .collect();
        assert_eq!(owners.len(), 4, "{owners:?}");
    }

    #[test]
    fn a_thread_keeps_cursors_for_several_engines() {
        let sources: Vec<UidSource> = (0..CURSORS + 2).map(|_| UidSource::default()).collect();
        for s in &sources {
            assert_eq!(s.allocate(|| 2), 0);
        }
        // The oldest cursors were dropped: those engines draw a fresh block, still unique.
        let again = sources[0].allocate(|| 2);
        assert!(again >= OWNER_BLOCK);
        assert_eq!(sources[CURSORS + 1].allocate(|| 2), 1);
    }
}
