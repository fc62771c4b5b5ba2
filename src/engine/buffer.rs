//! `RegisteredBuffer`: memory the engine allocated and registered, with safe copies in and
//! out (host memory directly, GPU memory through the runtime).

use crate::desc::MemoryDesc;
use crate::region::SharedRegion;

/// A registered buffer the engine owns. Copy data in and out with [`Self::write_at`] and
/// [`Self::read_at`]; peers may access it concurrently, exactly like RDMA-registered memory.
#[derive(Debug, Clone)]
pub struct RegisteredBuffer {
    desc: MemoryDesc,
    /// The handle's own view of the memory: not the registered region, so holding it never
    /// delays deregistration.
    region: SharedRegion,
}

impl RegisteredBuffer {
    /// A handle described by `desc` over `region`.
    pub(super) fn new(desc: MemoryDesc, region: SharedRegion) -> Self {
        Self { desc, region }
    }

    /// Its descriptor (to pass to transfers, or pack and send to peers).
    pub fn desc(&self) -> &MemoryDesc {
        &self.desc
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    /// Copy `src` into the buffer at `off`; `false` if out of range (or a GPU copy failed).
    pub fn write_at(&self, off: usize, src: &[u8]) -> bool {
        if let Some(dm) = self.region.device() {
            if off.checked_add(src.len()).is_none_or(|e| e > self.len()) {
                return false;
            }
            let at = self.region.device_addr(off as u64);
            // SAFETY: in range of the live device allocation this handle keeps registered.
            return unsafe { dm.gpu.copy_to_device(dm.dev, at, src) }.is_ok();
        }
        // SAFETY: bounds-checked; concurrent peer access is the registered-memory contract.
        match unsafe { self.region.slice_mut(off as u64, src.len() as u64) } {
            Some(d) => {
                d.copy_from_slice(src);
                true
            }
            None => false,
        }
    }

    /// Copy from the buffer at `off` into `dst`; `false` if out of range (or a GPU copy
    /// failed).
    pub fn read_at(&self, off: usize, dst: &mut [u8]) -> bool {
        if let Some(dm) = self.region.device() {
            if off.checked_add(dst.len()).is_none_or(|e| e > self.len()) {
                return false;
            }
            let at = self.region.device_addr(off as u64);
            // SAFETY: in range of the live device allocation this handle keeps registered.
            return unsafe { dm.gpu.copy_from_device(dm.dev, dst, at) }.is_ok();
        }
        // SAFETY: bounds-checked; concurrent peer access is the registered-memory contract.
        match unsafe { self.region.slice(off as u64, dst.len() as u64) } {
            Some(s) => {
                dst.copy_from_slice(s);
                true
            }
            None => false,
        }
    }

    /// The whole buffer as a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.read_at(0, &mut v);
        v
    }
}
