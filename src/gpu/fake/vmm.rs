//! The fake runtime's VMM memory: chunks mapped side by side as one range (torch's
//! expandable segments, vLLM's cuMem pool), exported one chunk at a time as a file
//! descriptor (a memfd standing for `cuMemExportToShareableHandle`'s), which an importer
//! takes out of the exporting process with `pidfd_getfd`, as CUDA's must; or, as on IMEX
//! systems, as a fabric handle the importer looks up directly.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use super::{lock, Alloc, FakeGpu, SPAN};
use crate::gpu::{DeviceBuf, GpuError, IpcExport, IPC_HANDLE_BYTES};

/// Chunks exported by every fake runtime of the process, by the (device, inode) of the
/// memfd that stands for each.
static FD_EXPORTS: Mutex<BTreeMap<(u64, u64), Weak<Alloc>>> = Mutex::new(BTreeMap::new());

/// Chunks exported as fabric handles, by handle.
static FABRIC_EXPORTS: Mutex<BTreeMap<[u8; IPC_HANDLE_BYTES], Weak<Alloc>>> =
    Mutex::new(BTreeMap::new());

fn call(call: &'static str, msg: impl Into<String>) -> GpuError {
    GpuError::Call {
        call,
        msg: msg.into(),
    }
}

/// The (device, inode) naming the file behind `fd`.
fn file_id(fd: &OwnedFd) -> Result<(u64, u64), GpuError> {
    // SAFETY: fstat fills a plain struct for a descriptor we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(call("fstat", std::io::Error::last_os_error().to_string()));
    }
    Ok((st.st_dev, st.st_ino))
}

impl FakeGpu {
    /// `n` chunks of `chunk` bytes on `dev`, mapped side by side: one range of `n * chunk`
    /// bytes made of separate allocations, as VMM allocators make (each chunk exported on
    /// its own, as a file descriptor).
    pub fn alloc_device_chunked(
        self: Arc<Self>,
        dev: i32,
        chunk: usize,
        n: usize,
    ) -> Result<DeviceBuf, GpuError> {
        use crate::gpu::GpuRuntime;
        self.device_info(dev)?;
        let len = chunk
            .checked_mul(n)
            .filter(|&l| l > 0 && l as u64 <= SPAN)
            .ok_or_else(|| call("fake vmm alloc", format!("{n} chunks of {chunk} bytes")))?;
        let base = self.next_base();
        let mut table = lock(&self.st.allocs);
        for i in 0..n {
            let a = Arc::new(Alloc {
                dev,
                bytes: Mutex::new(vec![0u8; chunk]),
                vmm: true,
            });
            table.insert(base + (i * chunk) as u64, a);
        }
        drop(table);
        let st = self.st.clone();
        let free = Box::new(move || {
            let mut t = lock(&st.allocs);
            for i in 0..n {
                t.remove(&(base + (i * chunk) as u64));
            }
        });
        // SAFETY: the chunks stay in the table until `free` removes them.
        Ok(unsafe { DeviceBuf::from_raw(self, dev, base, len, free) })
    }

    /// Refuse to export VMM chunks (as CUDA does for chunks made without a file-descriptor
    /// handle type); ordinary allocations still export.
    pub fn refuse_vmm_export(&self, on: bool) {
        self.st.refuse_vmm_export.store(on, Ordering::Relaxed);
    }

    /// Whether VMM chunks export.
    pub(super) fn vmm_exports(&self) -> bool {
        !self.st.refuse_vmm_export.load(Ordering::Relaxed)
    }

    /// Export VMM chunks as fabric handles rather than descriptors (as CUDA does for chunks
    /// made with only a fabric handle type, on IMEX systems).
    pub fn export_vmm_as_fabric(&self, on: bool) {
        self.st.vmm_fabric.store(on, Ordering::Relaxed);
    }

    /// Whether VMM chunks export as fabric handles.
    pub(super) fn vmm_exports_fabric(&self) -> bool {
        self.vmm_exports() && self.st.vmm_fabric.load(Ordering::Relaxed)
    }
}

/// Export chunk `a` (mapped at `base` here): a descriptor the exporter keeps open.
pub(super) fn export(a: &Arc<Alloc>, base: u64) -> Result<(IpcExport, OwnedFd), GpuError> {
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned below.
    let fd = unsafe { libc::memfd_create(c"morio-fake-vmm".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(call(
            "memfd_create",
            std::io::Error::last_os_error().to_string(),
        ));
    }
    // SAFETY: just created, owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let id = file_id(&fd)?;
    let mut t = lock(&FD_EXPORTS);
    t.retain(|_, w| w.strong_count() > 0);
    t.insert(id, Arc::downgrade(a));
    let size = lock(&a.bytes).len() as u64;
    let ex = IpcExport::posix_fd(fd.as_raw_fd(), rand::random(), base, size);
    Ok((ex, fd))
}

/// The chunk process `pid` exported as `ex`: its descriptor taken from there, then looked
/// up; `None` if it names no exported chunk (or one of another size).
pub(super) fn import(pid: u32, ex: &IpcExport) -> Result<Option<Arc<Alloc>>, GpuError> {
    let fd = ex
        .fd()
        .ok_or_else(|| call("fake vmm import", "not a descriptor"))?;
    let taken = crate::fdpass::take_fd(pid as libc::pid_t, fd)
        .map_err(|e| call("pidfd_getfd", e.to_string()))?;
    let a = lock(&FD_EXPORTS)
        .get(&file_id(&taken)?)
        .and_then(Weak::upgrade);
    Ok(a.filter(|a| lock(&a.bytes).len() as u64 == ex.size))
}

/// Export chunk `a` (mapped at `base` here) as a fabric handle.
pub(super) fn export_fabric(a: &Arc<Alloc>, base: u64) -> IpcExport {
    let mut handle = [0u8; IPC_HANDLE_BYTES];
    handle[..8].copy_from_slice(b"fakefab\0");
    handle[8..16].copy_from_slice(&rand::random::<u64>().to_le_bytes());
    let mut t = lock(&FABRIC_EXPORTS);
    t.retain(|_, w| w.strong_count() > 0);
    t.insert(handle, Arc::downgrade(a));
    let size = lock(&a.bytes).len() as u64;
    IpcExport::fabric(handle, base, size)
}

/// The chunk exported as the fabric handle of `ex`, if any (of its size).
pub(super) fn import_fabric(ex: &IpcExport) -> Option<Arc<Alloc>> {
    let a = lock(&FABRIC_EXPORTS)
        .get(&ex.handle)
        .and_then(Weak::upgrade);
    a.filter(|a| lock(&a.bytes).len() as u64 == ex.size)
}
