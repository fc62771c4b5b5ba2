//! Registered memory regions: the engine-side record of a buffer peers may read or write
//! (with the access key a peer must present), and the signal that tells deregistration when
//! the last user of one is gone.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rand::rngs::OsRng;
use rand::RngCore;

use crate::gpu::{DeviceBuf, GpuRuntime};
use crate::proto::access::AccessKey;
use crate::proto::limits::ACCESS_KEY_BYTES;

/// A registered buffer. Shared (`Arc`) by the engine's table, every shard's replica, and every
/// chunk that is placing into or sending from it, so the memory outlives all of them: an
/// owned buffer is freed only when the last user drops it, and `deregister_memory` of a raw
/// registration returns only once no chunk uses it any more (it waits on [`Self::released`],
/// which fires when the last `Arc` drops).
#[derive(Debug)]
pub struct Region {
    /// Engine-local memory id (the `MemoryDesc.id`).
    pub id: u32,
    /// The key a peer's chunk must carry to touch it (the `MemoryDesc.access_key`);
    /// [`AccessKey::NONE`], which grants nothing, for a local-only region.
    access_key: AccessKey,
    base: *mut u8,
    len: usize,
    device: Option<DeviceMem>,
    _owned: Option<Arc<Backing>>,
    /// Last field: fields drop in declaration order, so the signal fires once everything
    /// else the region owns has been dropped.
    release: ReleaseOnDrop,
}

/// Fires once the [`Region`] it was taken from is gone (its last `Arc` dropped), so whoever
/// waits for a region's users to finish blocks on it instead of polling a reference count.
#[derive(Debug, Default)]
pub struct Released {
    gone: Mutex<bool>,
    cv: Condvar,
}

impl Released {
    /// Block until the region is gone, for at most `limit`; whether it is gone.
    /// `Duration::ZERO` only looks.
    pub fn wait(&self, limit: Duration) -> bool {
        let gone = self.gone.lock().unwrap_or_else(|e| e.into_inner());
        let (gone, _) = self
            .cv
            .wait_timeout_while(gone, limit, |gone| !*gone)
            .unwrap_or_else(|e| e.into_inner());
        *gone
    }

    fn fire(&self) {
        *self.gone.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }
}

/// A region's side of [`Released`]: fires it when dropped with the region.
#[derive(Debug, Default)]
struct ReleaseOnDrop(Arc<Released>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.fire();
    }
}

/// Where device memory lives: the GPU and the runtime that copies to and from it.
#[derive(Debug, Clone)]
pub struct DeviceMem {
    /// Device ordinal.
    pub dev: i32,
    /// Lower-case PCI bus id.
    pub bus_id: String,
    /// The runtime that owns the device.
    pub gpu: Arc<dyn GpuRuntime>,
    /// The allocations exported for same-host peers (one, or one per VMM chunk), where the
    /// runtime could export them; kept exported as long as the region lives.
    pub ipc: Option<Arc<crate::gpu::IpcExports>>,
}

/// A buffer the engine allocated for `register_buffer`. Shared by the registered region and
/// the user's handle, so the registry's reference count of the region counts only the engine
/// and in-flight chunks, never the handle.
#[derive(Debug)]
pub struct Backing {
    base: *mut u8,
    len: usize,
    _buf: Option<Box<[u8]>>,
    _dev: Option<DeviceBuf>,
}

// SAFETY: `Backing` owns its allocation; all access goes through `Region`'s raw slices under
// the registered-memory contract below.
unsafe impl Send for Backing {}
// SAFETY: see above.
unsafe impl Sync for Backing {}

impl Backing {
    /// Take ownership of `buf`.
    pub fn new(mut buf: Box<[u8]>) -> Arc<Self> {
        Arc::new(Self {
            base: buf.as_mut_ptr(),
            len: buf.len(),
            _buf: Some(buf),
            _dev: None,
        })
    }

    /// Take ownership of device memory.
    pub fn device(buf: DeviceBuf) -> Arc<Self> {
        Arc::new(Self {
            base: buf.ptr() as *mut u8,
            len: buf.len(),
            _buf: None,
            _dev: Some(buf),
        })
    }
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
            access_key: AccessKey::NONE,
            base,
            len,
            device: None,
            _owned: None,
            release: ReleaseOnDrop::default(),
        }
    }

    /// A region over device memory, described by `device`.
    ///
    /// # Safety
    /// `base..base+len` must be device memory of `device.dev` that stays allocated until
    /// `deregister_memory` returns (or that `owned` keeps alive).
    pub unsafe fn from_device(
        id: u32,
        base: u64,
        len: usize,
        device: DeviceMem,
        owned: Option<Arc<Backing>>,
    ) -> Self {
        Self {
            id,
            access_key: AccessKey::NONE,
            base: base as *mut u8,
            len,
            device: Some(device),
            _owned: owned,
            release: ReleaseOnDrop::default(),
        }
    }

    /// A region over an engine-allocated buffer (several regions may share one backing).
    pub fn owned(id: u32, backing: Arc<Backing>) -> Self {
        Self {
            id,
            access_key: AccessKey::NONE,
            base: backing.base,
            len: backing.len,
            device: None,
            _owned: Some(backing),
            release: ReleaseOnDrop::default(),
        }
    }

    /// The region with access key `key`, which peers' chunks must present (a region is made
    /// with [`AccessKey::NONE`]: local-only, no peer may touch it).
    pub fn with_access_key(mut self, key: AccessKey) -> Self {
        self.access_key = key;
        self
    }

    /// The key peers' chunks must present ([`AccessKey::NONE`]: local-only).
    pub fn access_key(&self) -> AccessKey {
        self.access_key
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

    /// The GPU this region lives on; `None` for host memory.
    pub fn device(&self) -> Option<&DeviceMem> {
        self.device.as_ref()
    }

    /// The signal that fires when this region is gone: the last `Arc` of it dropped, so no
    /// chunk places into or sends from it any more. A region obtained separately over the
    /// same memory (a `RegisteredBuffer`'s handle) has a signal of its own.
    pub fn released(&self) -> Arc<Released> {
        self.release.0.clone()
    }

    /// Device address of `off` (device regions; the caller has checked the range).
    pub fn device_addr(&self, off: u64) -> u64 {
        self.base as u64 + off
    }

    /// `len` bytes at `off`, or `None` if out of range or not host memory.
    ///
    /// # Safety
    /// No one may write the range while the slice lives (the caller's transfer contract).
    pub unsafe fn slice(&self, off: u64, len: u64) -> Option<&[u8]> {
        let (off, len) = self.check(off, len)?;
        // SAFETY: in bounds of a live registration; aliasing is the caller's contract.
        Some(unsafe { std::slice::from_raw_parts(self.base.add(off), len) })
    }

    /// Mutable `len` bytes at `off`, or `None` if out of range or not host memory.
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
        if self.device.is_some() {
            // Device memory has no host view; it moves through staging copies only.
            return None;
        }
        let end = off.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        Some((off as usize, len as usize))
    }
}

/// A registered region shared between the engine and its shards.
pub type SharedRegion = Arc<Region>;

/// A fresh access key from the operating system's random source (`getrandom`), never
/// [`AccessKey::NONE`]; an error only if the OS has no randomness to give.
pub fn random_access_key() -> Result<AccessKey, rand::Error> {
    loop {
        let mut b = [0u8; ACCESS_KEY_BYTES];
        OsRng.try_fill_bytes(&mut b)?;
        let key = AccessKey::from_bytes(b);
        // All zeros (probability 2^-128) would mean "no key".
        if !key.is_none() {
            return Ok(key);
        }
    }
}

/// A memory id from the operating system's random source, one `taken` says is free (ids are
/// not a counter, so a peer cannot guess the ids of regions it was not given).
pub fn random_mem_id(taken: impl Fn(u32) -> bool) -> Result<u32, rand::Error> {
    loop {
        let mut b = [0u8; 4];
        OsRng.try_fill_bytes(&mut b)?;
        let id = u32::from_le_bytes(b);
        if !taken(id) {
            return Ok(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_ids_are_random_and_regions_start_local_only() {
        let keys: Vec<AccessKey> = (0..64).map(|_| random_access_key().unwrap()).collect();
        for (i, k) in keys.iter().enumerate() {
            assert!(!k.is_none());
            assert!(keys[i + 1..].iter().all(|o| o != k), "a key repeated");
        }
        // An id the table holds is drawn again: with every even id taken, only odd ones
        // come back (a draw that was not retried would be even half the time).
        for _ in 0..64 {
            assert_eq!(random_mem_id(|id| id % 2 == 0).unwrap() % 2, 1);
        }
        let r = Region::owned(3, Backing::new(vec![0u8; 4].into_boxed_slice()));
        assert!(
            r.access_key().is_none(),
            "a region is local-only until given a key"
        );
        let k = keys[0];
        assert_eq!(r.with_access_key(k).access_key(), k);
    }

    #[test]
    fn bounds_are_checked() {
        let r = Region::owned(3, Backing::new(vec![7u8; 16].into_boxed_slice()));
        assert_eq!(r.len(), 16);
        // SAFETY: nothing else uses the region, and each slice lives only for its own
        // statement, so no two of them (one of them mutable) overlap.
        unsafe {
            assert_eq!(r.slice(8, 8).unwrap(), &[7u8; 8]);
            assert!(r.slice(9, 8).is_none());
            assert!(r.slice(u64::MAX, 2).is_none());
            r.slice_mut(0, 1).unwrap()[0] = 1;
            assert_eq!(r.slice(0, 1).unwrap(), &[1]);
        }
    }

    #[test]
    fn released_fires_when_the_last_holder_drops_and_not_before() {
        let r = Arc::new(Region::owned(
            1,
            Backing::new(vec![0u8; 8].into_boxed_slice()),
        ));
        let released = r.released();
        let in_flight = r.clone();
        drop(r);
        assert!(!released.wait(Duration::ZERO), "one holder is left");
        // The waiter blocks until the holder drops (a missing signal would make it time out
        // and return false).
        let waiter = {
            let released = released.clone();
            std::thread::spawn(move || released.wait(Duration::from_secs(60)))
        };
        drop(in_flight);
        assert!(waiter.join().unwrap(), "woken by the last drop");
        assert!(released.wait(Duration::ZERO), "stays fired");
    }

    #[test]
    fn a_handle_over_the_same_backing_has_its_own_signal() {
        let backing = Backing::new(vec![0u8; 8].into_boxed_slice());
        let registered = Arc::new(Region::owned(2, backing.clone()));
        let handle = Arc::new(Region::owned(2, backing));
        let released = registered.released();
        drop(registered);
        assert!(
            released.wait(Duration::ZERO),
            "the handle does not hold the registration"
        );
        assert!(!handle.released().wait(Duration::ZERO));
    }
}
