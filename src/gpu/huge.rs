//! Host memory for pinned staging on transparent huge pages: an anonymous mapping aligned to
//! 2 MiB, advised `MADV_HUGEPAGE` and touched, for a GPU runtime to register (page-lock) as
//! staging, so the kernel's socket copies into and out of a staging slot walk 2 MiB pages as
//! they do for a heap buffer instead of the 4 KiB ones of the runtime's own pinned allocator.

use std::ffi::c_void;

/// Huge page size the mappings are aligned to.
const HUGE: usize = 2 << 20;

/// Whether staging of `len` bytes uses these mappings: whole huge pages only (a smaller slot,
/// as a pool over many shards takes, would pin memory it never uses), and not where
/// `MORIO_PINNED_THP=0` (read once).
pub(crate) fn suits(len: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    len > 0
        && len % HUGE == 0
        && *ON.get_or_init(|| std::env::var("MORIO_PINNED_THP").map_or(true, |v| v != "0"))
}

/// A private anonymous mapping of whole huge pages, owned until [`Mapping::unmap`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mapping {
    /// Start, 2 MiB aligned.
    pub(crate) ptr: *mut c_void,
    /// Length: the size asked for, rounded up to 2 MiB.
    pub(crate) size: usize,
}

// SAFETY: plain host memory, not tied to a thread.
unsafe impl Send for Mapping {}

impl Mapping {
    /// At least `len` bytes (one at least), 2 MiB aligned, advised for huge pages and touched
    /// (so the pages exist before a runtime registers them); `None` if the mapping fails.
    pub(crate) fn new(len: usize) -> Option<Self> {
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
            return None;
        }
        let start = raw as usize;
        let aligned = start.div_ceil(HUGE) * HUGE;
        let tail = start + size + HUGE - (aligned + size);
        // SAFETY: unmapping the parts of our own mapping outside [aligned, aligned + size),
        // then advice and first touches inside it.
        unsafe {
            if aligned > start {
                libc::munmap(raw, aligned - start);
            }
            if tail > 0 {
                libc::munmap((aligned + size) as *mut c_void, tail);
            }
            libc::madvise(aligned as *mut c_void, size, libc::MADV_HUGEPAGE);
            for off in (0..size).step_by(4096) {
                std::ptr::write_volatile((aligned + off) as *mut u8, 0);
            }
        }
        Some(Self {
            ptr: aligned as *mut c_void,
            size,
        })
    }

    /// Give the mapping back.
    ///
    /// # Safety
    /// Nothing may use the memory any more (a runtime's registration of it is undone).
    pub(crate) unsafe fn unmap(self) {
        // SAFETY: our mapping (the caller's promise: no longer used).
        unsafe { libc::munmap(self.ptr, self.size) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only whole huge pages are staged on them.
    #[test]
    fn only_whole_huge_pages_suit() {
        assert!(suits(HUGE) && suits(4 * HUGE));
        assert!(!suits(0) && !suits(HUGE / 2) && !suits(HUGE + 4096));
    }

    /// Mappings are whole, aligned huge pages that hold what is written to them.
    #[test]
    fn mappings_are_aligned_whole_huge_pages() {
        for len in [0usize, 1, HUGE - 1, HUGE, HUGE + 1, 3 * HUGE + 5] {
            let m = Mapping::new(len).unwrap();
            assert_eq!(m.ptr as usize % HUGE, 0, "{len}");
            assert_eq!(m.size, len.max(1).div_ceil(HUGE) * HUGE, "{len}");
            // SAFETY: the mapping is ours, `size` bytes long.
            let s = unsafe { std::slice::from_raw_parts_mut(m.ptr as *mut u8, m.size) };
            assert!(s.iter().all(|&b| b == 0));
            s[m.size - 1] = 7;
            s[0] = 9;
            assert_eq!((s[0], s[m.size - 1]), (9, 7));
            // SAFETY: no longer used.
            unsafe { m.unmap() };
        }
    }
}
