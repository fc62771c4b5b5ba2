//! What a registered GPU range is exported as for the other processes of this host: one
//! legacy IPC handle per allocation, or one per VMM chunk (a file descriptor this process
//! keeps open, or a fabric handle), and the budget of descriptors such exports may hold.

use super::IPC_HANDLE_BYTES;

/// How another process of this host reaches an exported allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IpcKind {
    /// A legacy IPC handle (`cuIpcGetMemHandle`), opened with `cuIpcOpenMemHandle`.
    Legacy = 1,
    /// A virtual-memory chunk (`cuMemCreate`, mapped at `base`) exported as a file
    /// descriptor the exporter keeps open: the handle holds the descriptor's number in the
    /// exporter and a random serial; the peer takes a duplicate (`pidfd_getfd`), imports it
    /// (`cuMemImportFromShareableHandle`) and maps it.
    PosixFd = 2,
    /// A virtual-memory chunk made with only a fabric handle type (torch's first choice
    /// where an IMEX channel exists, as on GB200 systems): the handle is the chunk's
    /// `CUmemFabricHandle`, imported with no descriptor to take.
    Fabric = 3,
}

impl IpcKind {
    /// The kind with wire number `v`.
    pub fn from_wire(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Legacy),
            2 => Some(Self::PosixFd),
            3 => Some(Self::Fabric),
            _ => None,
        }
    }
}

/// A device allocation exported for the other processes of this host: the handle they open,
/// and the allocation it names here (a registered range is `base + offset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcExport {
    /// How the handle is opened.
    pub kind: IpcKind,
    /// The runtime's handle of the allocation ([`IpcKind::PosixFd`]: see [`Self::posix_fd`]).
    pub handle: [u8; IPC_HANDLE_BYTES],
    /// Start of the allocation (its mapping, for VMM memory) in the exporting process.
    pub base: u64,
    /// Its size in bytes.
    pub size: u64,
}

impl IpcExport {
    /// A legacy IPC handle of the allocation `base..base+size`.
    pub fn legacy(handle: [u8; IPC_HANDLE_BYTES], base: u64, size: u64) -> Self {
        Self {
            kind: IpcKind::Legacy,
            handle,
            base,
            size,
        }
    }

    /// Descriptor `fd` of the exporting process, naming the chunk mapped at `base..base+size`;
    /// `serial` tells this export from any later one of the same address or descriptor
    /// number.
    pub fn posix_fd(fd: i32, serial: u64, base: u64, size: u64) -> Self {
        let mut handle = [0u8; IPC_HANDLE_BYTES];
        handle[..4].copy_from_slice(&fd.to_le_bytes());
        handle[4..12].copy_from_slice(&serial.to_le_bytes());
        Self {
            kind: IpcKind::PosixFd,
            handle,
            base,
            size,
        }
    }

    /// The fabric handle `handle` of the chunk mapped at `base..base+size`.
    pub fn fabric(handle: [u8; IPC_HANDLE_BYTES], base: u64, size: u64) -> Self {
        Self {
            kind: IpcKind::Fabric,
            handle,
            base,
            size,
        }
    }

    /// The exporter's descriptor number, for [`IpcKind::PosixFd`].
    pub fn fd(&self) -> Option<i32> {
        (self.kind == IpcKind::PosixFd).then(|| {
            i32::from_le_bytes([
                self.handle[0],
                self.handle[1],
                self.handle[2],
                self.handle[3],
            ])
        })
    }

    /// Whether `off..off+len` of the region starting at `addr` (exporter's address) lies in
    /// this allocation; the offset in it if so.
    pub fn offset_of(&self, addr: u64, len: u64) -> Option<u64> {
        let at = addr.checked_sub(self.base)?;
        (at.checked_add(len)? <= self.size).then_some(at)
    }
}

/// The allocations holding a registered GPU range, exported for same-host peers (one for
/// ordinary memory, one per mapped chunk for VMM memory), sorted by address, and what keeps
/// them exported (descriptors of [`IpcKind::PosixFd`] exports, closed with the region).
#[derive(Debug, Default)]
pub struct IpcExports {
    list: Vec<IpcExport>,
    _keep: Vec<std::os::fd::OwnedFd>,
}

/// Descriptors this process holds for VMM exports, over every region.
static EXPORT_FDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether one more VMM chunk may be exported as a descriptor, `pending` already exported
/// for the region being registered: exports hold at most a quarter of the process's
/// descriptor limit (`RLIMIT_NOFILE`), so a VMM region of thousands of chunks cannot take
/// the descriptors the application's sockets need. Chunks beyond are staged (registration
/// says how many bytes).
pub(crate) fn export_fd_allowed(pending: usize) -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return false;
    }
    let held = EXPORT_FDS.load(std::sync::atomic::Ordering::Relaxed) + pending;
    fd_budget_allows(held, lim.rlim_cur)
}

/// Whether `held` export descriptors leave room for one more under a descriptor limit of
/// `limit`.
fn fd_budget_allows(held: usize, limit: u64) -> bool {
    (held as u64) < limit / 4
}

impl IpcExports {
    /// `list` (sorted by base here), kept exported while `keep` is open.
    pub fn new(mut list: Vec<IpcExport>, keep: Vec<std::os::fd::OwnedFd>) -> Self {
        list.sort_by_key(|e| e.base);
        EXPORT_FDS.fetch_add(keep.len(), std::sync::atomic::Ordering::Relaxed);
        Self { list, _keep: keep }
    }

    /// The exports, by address.
    pub fn list(&self) -> &[IpcExport] {
        &self.list
    }

    /// Descriptors this process holds for VMM exports, over every region.
    pub fn held_descriptors() -> usize {
        EXPORT_FDS.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The export holding exporter address `addr`, and its index.
    pub fn find(&self, addr: u64) -> Option<(usize, &IpcExport)> {
        let i = self
            .list
            .partition_point(|e| e.base <= addr)
            .checked_sub(1)?;
        let e = &self.list[i];
        (addr - e.base < e.size).then_some((i, e))
    }
}

impl Drop for IpcExports {
    fn drop(&mut self) {
        EXPORT_FDS.fetch_sub(self._keep.len(), std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmm_exports_keep_to_a_quarter_of_the_descriptor_limit() {
        assert!(fd_budget_allows(0, 1024));
        assert!(fd_budget_allows(255, 1024));
        assert!(!fd_budget_allows(256, 1024));
        assert!(!fd_budget_allows(0, 3), "a tiny limit exports nothing");
        assert!(fd_budget_allows(250_000, 1 << 20));
    }
}
