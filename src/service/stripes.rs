//! Shared stripes: the stripes of one large write that any of its lanes may take, so a lane
//! that runs slow sends fewer of them and the transfer ends with its fastest lanes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::lane::ItemKind;
use crate::proto::frame::Op;
use crate::proto::plan::Layout;
use crate::region::SharedRegion;

/// Chunks `first..first + stripes.len()` of a striped write, taken one at a time by the
/// lanes that hold a [`ItemKind::Shared`] item for it. Which lane carries which chunk does
/// not matter to the target: every chunk names the join lane, and only chunk 0 must ride it
/// (it is dealt to the home lane directly, never shared).
#[derive(Debug)]
pub(crate) struct SharedStripes {
    next: AtomicUsize,
    cancelled: AtomicBool,
    first: u32,
    n_chunks: u32,
    mem_id: u32,
    extent: (u64, u64),
    join_lane: u16,
    stripes: Box<[Layout]>,
    local: SharedRegion,
}

impl SharedStripes {
    /// The stripes `first..` of a write of `n_chunks` chunks.
    pub(crate) fn new(
        first: u32,
        n_chunks: u32,
        mem_id: u32,
        extent: (u64, u64),
        join_lane: u16,
        stripes: Vec<Layout>,
        local: SharedRegion,
    ) -> Self {
        debug_assert!(first >= 1 && first as usize + stripes.len() == n_chunks as usize);
        Self {
            next: AtomicUsize::new(0),
            cancelled: AtomicBool::new(false),
            first,
            n_chunks,
            mem_id,
            extent,
            join_lane,
            stripes: stripes.into_boxed_slice(),
            local,
        }
    }

    /// The next stripe nobody has taken yet, as a chunk to send; `None` once all are taken
    /// or the transfer ended.
    pub(crate) fn take(&self) -> Option<ItemKind> {
        if self.cancelled.load(Ordering::Relaxed) {
            return None;
        }
        // Relaxed: each index is handed out once; the stripes themselves never change.
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let pieces = self.stripes.get(i)?.clone();
        Some(ItemKind::Chunk {
            op: Op::Write,
            chunk: self.first + i as u32,
            n_chunks: self.n_chunks,
            mem_id: self.mem_id,
            extent: self.extent,
            join_lane: self.join_lane,
            pieces,
            final_: false,
            local: self.local.clone(),
        })
    }

    /// The transfer ended (failed or timed out): no lane takes another stripe.
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::plan::Piece;
    use crate::region::{Backing, Region};
    use std::sync::Arc;

    fn stripes(n: u32) -> SharedStripes {
        let backing = Backing::new(vec![0u8; 1 << 16].into_boxed_slice());
        let region: SharedRegion = Arc::new(Region::owned(7, backing));
        let list = (1..n)
            .map(|i| {
                Layout::List(vec![Piece {
                    local: i as u64 * 16,
                    remote: i as u64 * 16,
                    len: 16,
                }])
            })
            .collect();
        SharedStripes::new(1, n, 7, (0, n as u64 * 16), 2, list, region)
    }

    #[test]
    fn every_stripe_is_taken_once_across_threads() {
        let s = Arc::new(stripes(200));
        let taken: Vec<Vec<u32>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let s = s.clone();
                    sc.spawn(move || {
                        let mut mine = Vec::new();
                        while let Some(ItemKind::Chunk {
                            chunk,
                            join_lane,
                            final_,
                            ..
                        }) = s.take()
                        {
                            assert_eq!((join_lane, final_), (2, false));
                            mine.push(chunk);
                        }
                        mine
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<u32> = taken.into_iter().flatten().collect();
        all.sort_unstable();
        assert_eq!(all, (1..200).collect::<Vec<_>>());
        assert!(s.take().is_none());
    }

    #[test]
    fn nothing_is_taken_after_cancel() {
        let s = stripes(10);
        assert!(matches!(s.take(), Some(ItemKind::Chunk { chunk: 1, .. })));
        s.cancel();
        assert!(s.take().is_none());
    }
}
