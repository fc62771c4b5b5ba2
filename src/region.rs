//! Registered memory regions: the engine-side record of a buffer peers may read or write.

use std::sync::Arc;

/// A registered buffer. Shared (`Arc`) by the engine's table, every shard's replica, and every
/// chunk that is placing into or sending from it, so the memory outlives all of them: an
/// owned buffer is freed only when the last user drops it, and `deregister_memory` of a raw
/// registration returns only once no chunk uses it any more.
#[derive(Debug)]
pub struct Region {
    /// Engine-local memory id (the `MemoryDesc.id`).
    pub id: u32,
    base: *mut u8,
    len: usize,
    _owned: Option<Box<[u8]>>,
}

// SAFETY: a Region is a (pointer, length) pair to memory the user registered for concurrent
// access by the engine, like an RDMA memory region. Concurrent placements by different shards
// target disjoint ranges of one transfer; ranges of different transfers are the user's to
// keep apart (the same contract as MORI-IO and RDMA).
unsafe impl Send for Region {}
// SAFETY: see above; all access goes through raw-pointer slices created per operation.
unsafe impl Sync for Region {}

impl Region {
    /// A region over memory the caller keeps alive until it is deregistered.
    ///
    /// # Safety
    /// `base..base+len` must be valid for reads and writes until `deregister_memory` returns.
    pub unsafe fn from_raw(id: u32, base: *mut u8, len: usize) -> Self {
        Self {
            id,
            base,
            len,
            _owned: None,
        }
    }

    /// A region that owns its buffer.
    pub fn owned(id: u32, mut buf: Box<[u8]>) -> Self {
        let base = buf.as_mut_ptr();
        let len = buf.len();
        Self {
            id,
            base,
            len,
            _owned: Some(buf),
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Base address (what `MemoryDesc.data` carries).
    pub fn addr(&self) -> u64 {
        self.base as u64
    }

    /// `len` bytes at `off`, or `None` if out of range.
    ///
    /// # Safety
    /// No one may write the range while the slice lives (the caller's transfer contract).
    pub unsafe fn slice(&self, off: u64, len: u64) -> Option<&[u8]> {
        let (off, len) = self.check(off, len)?;
        // SAFETY: in bounds of a live registration; aliasing is the caller's contract.
        Some(unsafe { std::slice::from_raw_parts(self.base.add(off), len) })
    }

    /// Mutable `len` bytes at `off`, or `None` if out of range.
    ///
    /// # Safety
    /// No one else may access the range while the slice lives (the caller's transfer contract).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, off: u64, len: u64) -> Option<&mut [u8]> {
        let (off, len) = self.check(off, len)?;
        // SAFETY: in bounds of a live registration; aliasing is the caller's contract.
        Some(unsafe { std::slice::from_raw_parts_mut(self.base.add(off), len) })
    }

    fn check(&self, off: u64, len: u64) -> Option<(usize, usize)> {
        let end = off.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        Some((off as usize, len as usize))
    }
}

/// A registered region shared between the engine and its shards.
pub type SharedRegion = Arc<Region>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked() {
        let r = Region::owned(3, vec![7u8; 16].into_boxed_slice());
        assert_eq!(r.len(), 16);
        unsafe {
            assert_eq!(r.slice(8, 8).unwrap(), &[7u8; 8]);
            assert!(r.slice(9, 8).is_none());
            assert!(r.slice(u64::MAX, 2).is_none());
            r.slice_mut(0, 1).unwrap()[0] = 1;
            assert_eq!(r.slice(0, 1).unwrap(), &[1]);
        }
    }
}
