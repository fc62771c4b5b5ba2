//! Pinned staging memory on transparent huge pages: an anonymous mapping aligned to 2 MiB,
//! advised `MADV_HUGEPAGE`, touched, then registered with the driver (`cuMemHostRegister`),
//! so the kernel's socket copies into and out of a staging slot walk 2 MiB pages as they do
//! for a heap buffer, instead of `cuMemHostAlloc`'s 4 KiB ones.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::cuda::bind;
use super::{GpuError, PinnedBuf};

/// Huge page size this allocator aligns to.
const HUGE: usize = 2 << 20;

/// Whether staging slots use this allocator: on unless `MORIO_PINNED_THP=0` (read once).
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MORIO_PINNED_THP").map_or(true, |v| v != "0"))
}

/// `len` bytes of page-locked host memory in a 2 MiB-aligned mapping advised for huge pages,
/// registered (portable) in the context `ctx`. `None` when the mapping or its registration
/// fails (a locked-memory limit, say): the caller falls back to `cuMemHostAlloc`.
pub(crate) fn alloc(ctx: usize, len: usize) -> Result<Option<PinnedBuf>, GpuError> {
    let size = len.max(1).div_ceil(HUGE) * HUGE;
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size + HUGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Ok(None);
    }
    let start = raw as usize;
    let aligned = start.div_ceil(HUGE) * HUGE;
    // SAFETY: unmapping the parts of our own mapping outside [aligned, aligned + size).
    unsafe {
        if aligned > start {
            libc::munmap(raw, aligned - start);
        }
        let tail = start + size + HUGE - (aligned + size);
        if tail > 0 {
            libc::munmap((aligned + size) as *mut c_void, tail);
        }
    }
    let p = aligned as *mut c_void;
    // SAFETY: advice and first touches on our own mapping of `size` bytes.
    unsafe {
        libc::madvise(p, size, libc::MADV_HUGEPAGE);
        for off in (0..size).step_by(4096) {
            std::ptr::write_volatile((aligned + off) as *mut u8, 0);
        }
    }
    bind(ctx)?;
    const PORTABLE: u32 = sys::CU_MEMHOSTREGISTER_PORTABLE;
    // SAFETY: the range is our own mapping, alive until the free below unregisters it.
    let r = unsafe { sys::cuMemHostRegister_v2(p, size, PORTABLE) };
    if r != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: our mapping, never registered.
        unsafe { libc::munmap(p, size) };
        return Ok(None);
    }
    let free = Box::new(move || {
        if bind(ctx).is_ok() {
            // SAFETY: registered above, unregistered once, then unmapped.
            unsafe {
                sys::cuMemHostUnregister(aligned as *mut c_void);
            }
        }
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(aligned as *mut c_void, size) };
    });
    // SAFETY: `len <= size` bytes of our mapping, owned until `free`.
    Ok(Some(unsafe {
        PinnedBuf::from_raw(p as *mut u8, len, free)
    }))
}
