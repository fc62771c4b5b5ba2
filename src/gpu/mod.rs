//! GPU memory seam: what the engine needs from a GPU runtime (identify device memory, pinned
//! host staging, async host<->device copies on a stream, completions it can poll), and the
//! backends that provide it: CUDA (`cuda` feature), HIP (`hip` feature) and an in-memory fake.

use std::fmt;
use std::sync::Arc;

mod enqueue;
mod export;
pub mod fake;
pub mod ipc;
mod strided;

pub(crate) use enqueue::{enqueue_copies, loose_copies};
pub use enqueue::{one_by_one, BATCH_MAX_COPY};
pub(crate) use export::export_fd_allowed;
pub use export::{IpcExport, IpcExports, IpcKind};
pub use strided::Copy2d;

pub use ipc::IpcLease;
pub(crate) mod pack;
pub(crate) mod staging;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
mod cuda_batch;
#[cfg(feature = "cuda")]
mod cuda_vmm;
#[cfg(feature = "hip")]
pub mod hip;

/// What went wrong in a GPU runtime call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// No usable GPU runtime in this build or on this machine.
    #[error("no GPU runtime: {0}")]
    Unavailable(String),
    /// A device ordinal the runtime does not have.
    #[error("GPU {dev} does not exist ({count} device(s) found)")]
    NoDevice {
        /// The ordinal asked for.
        dev: i32,
        /// How many devices there are.
        count: usize,
    },
    /// A range that is not device memory of the named GPU, or not one allocation.
    #[error("{len} bytes at {ptr:#x} are not device memory of GPU {dev}: {why}")]
    NotDeviceMemory {
        /// The device named by the caller.
        dev: i32,
        /// Start of the range.
        ptr: u64,
        /// Length of the range.
        len: usize,
        /// What the runtime said.
        why: String,
    },
    /// A runtime call failed.
    #[error("{call} failed: {msg}")]
    Call {
        /// The runtime function.
        call: &'static str,
        /// The runtime's error.
        msg: String,
    },
    /// A copy did not complete within the deadline.
    #[error("GPU copy did not complete within {0:?}")]
    Timeout(std::time::Duration),
}

/// Bytes of an IPC handle (CUDA's `CUipcMemHandle`, HIP's `hipIpcMemHandle_t`; MORI's
/// `MemoryDesc::ipc_handle`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// One GPU as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: i32,
    /// Lower-case PCI bus id (`0000:1b:00.0`), as MORI's `MemoryDesc` carries it.
    pub bus_id: String,
    /// Marketing name.
    pub name: String,
}

/// A GPU runtime. One per engine; shared by every shard (`Send + Sync`), while the streams it
/// creates stay on the shard that created them.
pub trait GpuRuntime: Send + Sync + fmt::Debug {
    /// Short name (`"cuda"`, `"hip"`, `"fake"`).
    fn name(&self) -> &'static str;
    /// Number of devices.
    fn device_count(&self) -> Result<usize, GpuError>;
    /// Bus id and name of device `dev`.
    fn device_info(&self, dev: i32) -> Result<DeviceInfo, GpuError>;
    /// Check that `ptr..ptr+len` is device memory of `dev`, inside one allocation.
    fn check_device_range(&self, dev: i32, ptr: u64, len: usize) -> Result<(), GpuError>;
    /// Page-locked host memory for staging (DMA-able by every device).
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuf, GpuError>;
    /// A new non-blocking stream on `dev`, used only by the calling thread.
    fn create_stream(&self, dev: i32) -> Result<Box<dyn GpuStream>, GpuError>;
    /// Device memory on `dev` (tests, benchmarks, `alloc_gpu_buffer`).
    fn alloc_device(self: Arc<Self>, dev: i32, len: usize) -> Result<DeviceBuf, GpuError>;
    /// Export the allocation holding device address `ptr` of `dev` for other processes of
    /// this host (`cuIpcGetMemHandle`); an error where the runtime or the allocation cannot
    /// (memory from a virtual-memory pool, say): peers then stage through host memory.
    fn ipc_export(&self, dev: i32, ptr: u64) -> Result<IpcExport, GpuError> {
        let _ = (dev, ptr);
        Err(GpuError::Unavailable(format!(
            "the {} runtime exports no IPC handles",
            self.name()
        )))
    }
    /// Export every allocation holding `ptr..ptr+len` of `dev` (a registered range: one
    /// allocation, or VMM chunks mapped side by side) for other processes of this host.
    /// An error where none of it can be exported; chunks that cannot be are left out (peers
    /// stage what they hold).
    fn ipc_export_range(&self, dev: i32, ptr: u64, len: usize) -> Result<IpcExports, GpuError> {
        let _ = len;
        Ok(IpcExports::new(
            vec![self.ipc_export(dev, ptr)?],
            Vec::new(),
        ))
    }
    /// Reach an allocation process `pid` exported (`export`, as it sent it) from device
    /// `dev` of this process: opened once and cached (closed once unused for
    /// [`ipc::IDLE_CLOSE`], never while a lease lives); in the exporting process itself, the
    /// allocation as it is. Refused where the runtime cannot open it (another container's
    /// GPU, a device it cannot map): peers then stage through host memory.
    fn ipc_open(&self, dev: i32, pid: u32, export: &IpcExport) -> Result<IpcLease, GpuError> {
        let _ = (dev, pid, export);
        Err(GpuError::Unavailable(format!(
            "the {} runtime opens no IPC handles",
            self.name()
        )))
    }
    /// Synchronous host-to-device copy (set-up and checks, never the data path).
    ///
    /// # Safety
    /// `dst..dst+src.len()` must be live device memory of `dev`.
    unsafe fn copy_to_device(&self, dev: i32, dst: u64, src: &[u8]) -> Result<(), GpuError>;
    /// Synchronous device-to-host copy (set-up and checks, never the data path).
    ///
    /// # Safety
    /// `src..src+dst.len()` must be live device memory of `dev`.
    unsafe fn copy_from_device(&self, dev: i32, dst: &mut [u8], src: u64) -> Result<(), GpuError>;
}

/// An ordered queue of copies on one device, owned by one shard thread.
pub trait GpuStream: fmt::Debug {
    /// Enqueue a device-to-host copy.
    ///
    /// # Safety
    /// `src..src+len` must be device memory of the stream's device and `dst..dst+len` pinned
    /// host memory, both live and untouched by others until a later fence completes.
    unsafe fn d2h(&self, dst: *mut u8, src: u64, len: usize) -> Result<(), GpuError>;
    /// Enqueue a host-to-device copy.
    ///
    /// # Safety
    /// As [`Self::d2h`], directions swapped.
    unsafe fn h2d(&self, dst: u64, src: *const u8, len: usize) -> Result<(), GpuError>;
    /// Enqueue a device-to-device copy (the destination on the stream's device, the source on
    /// any device this process reaches, an opened IPC mapping included).
    ///
    /// # Safety
    /// Both ranges must be live device memory, untouched by others until a later fence
    /// completes.
    unsafe fn d2d(&self, dst: u64, src: u64, len: usize) -> Result<(), GpuError>;
    /// Enqueue `copies`, all in direction `dir`, where the runtime can in one call
    /// (CUDA's `cuMemcpyBatchAsync`): a chunk of many small segments then costs one driver
    /// call instead of one per segment. The default enqueues them one by one. An error may
    /// leave some of them enqueued, as a failure half way through single copies would.
    ///
    /// # Safety
    /// Every copy as [`Self::d2h`], [`Self::h2d`] or [`Self::d2d`] (by `dir`) requires.
    unsafe fn copy_batch(&self, dir: CopyDir, copies: &[BatchCopy]) -> Result<(), GpuError> {
        // SAFETY: forwarded from the caller.
        unsafe { one_by_one(self, dir, copies) }
    }
    /// Enqueue the rows of `run`, all in direction `dir`, where the runtime can as one 2D copy
    /// (CUDA's `cuMemcpy2DAsync`: the copy engine walks the rows itself). The default
    /// enqueues them as a batch.
    ///
    /// # Safety
    /// Every row as [`Self::copy_batch`] requires of a copy.
    unsafe fn copy_2d(&self, dir: CopyDir, run: &Copy2d) -> Result<(), GpuError> {
        let rows: Vec<BatchCopy> = run.row_copies().collect();
        // SAFETY: forwarded from the caller.
        unsafe { self.copy_batch(dir, &rows) }
    }
    /// A fence that completes once every copy enqueued so far has.
    fn fence(&self) -> Result<Box<dyn GpuFence>, GpuError>;
}

/// The direction of the copies of a [`GpuStream::copy_batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyDir {
    /// Device to pinned host memory.
    D2h,
    /// Pinned host to device memory.
    H2d,
    /// Device to device (the source on any device this process reaches).
    D2d,
}

/// One copy of a batch: `len` bytes from `src` to `dst`, host addresses as integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchCopy {
    /// Destination address.
    pub dst: u64,
    /// Source address.
    pub src: u64,
    /// Bytes.
    pub len: usize,
}

/// A point in a stream; polled, never blocked on, by the shard's executor.
pub trait GpuFence: fmt::Debug {
    /// `Ok(true)` once the copies before it have completed; an error if one of them failed.
    fn poll(&self) -> Result<bool, GpuError>;
    /// Block the thread until complete (only where a buffer must not be released early:
    /// error paths and drops).
    fn wait_blocking(&self) -> Result<(), GpuError>;
}

/// Page-locked host memory, freed on drop.
pub struct PinnedBuf {
    ptr: *mut u8,
    len: usize,
    free: Option<Box<dyn FnOnce() + Send>>,
}

// SAFETY: the buffer is plain host memory owned by this value.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    /// Wrap `len` bytes at `ptr` that `free` releases.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid, exclusively owned memory until `free` runs.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize, free: Box<dyn FnOnce() + Send>) -> Self {
        Self {
            ptr,
            len,
            free: Some(free),
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: owned, valid memory (constructor contract).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: owned, valid memory (constructor contract).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl fmt::Debug for PinnedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PinnedBuf({} bytes)", self.len)
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        if let Some(free) = self.free.take() {
            free();
        }
    }
}

/// Device memory, freed on drop.
pub struct DeviceBuf {
    gpu: Arc<dyn GpuRuntime>,
    dev: i32,
    ptr: u64,
    len: usize,
    free: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl DeviceBuf {
    /// Wrap `len` bytes of device memory at `ptr` on `dev` that `free` releases.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be a live allocation on `dev` until `free` runs.
    pub unsafe fn from_raw(
        gpu: Arc<dyn GpuRuntime>,
        dev: i32,
        ptr: u64,
        len: usize,
        free: Box<dyn FnOnce() + Send + Sync>,
    ) -> Self {
        Self {
            gpu,
            dev,
            ptr,
            len,
            free: Some(free),
        }
    }

    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device ordinal.
    pub fn device(&self) -> i32 {
        self.dev
    }

    /// The runtime it came from.
    pub fn runtime(&self) -> &Arc<dyn GpuRuntime> {
        &self.gpu
    }

    /// Copy `src` to offset `off`; an error if out of range or the copy fails.
    pub fn write_at(&self, off: usize, src: &[u8]) -> Result<(), GpuError> {
        self.check(off, src.len())?;
        // SAFETY: in range of this live allocation.
        unsafe {
            self.gpu
                .copy_to_device(self.dev, self.ptr + off as u64, src)
        }
    }

    /// Copy from offset `off` into `dst`.
    pub fn read_at(&self, off: usize, dst: &mut [u8]) -> Result<(), GpuError> {
        self.check(off, dst.len())?;
        // SAFETY: in range of this live allocation.
        unsafe {
            self.gpu
                .copy_from_device(self.dev, dst, self.ptr + off as u64)
        }
    }

    fn check(&self, off: usize, len: usize) -> Result<(), GpuError> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(GpuError::NotDeviceMemory {
                dev: self.dev,
                ptr: self.ptr.wrapping_add(off as u64),
                len,
                why: format!("out of the {}-byte buffer", self.len),
            }),
        }
    }
}

impl fmt::Debug for DeviceBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeviceBuf({} bytes at {:#x} on {} GPU {})",
            self.len,
            self.ptr,
            self.gpu.name(),
            self.dev
        )
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        if let Some(free) = self.free.take() {
            free();
        }
    }
}

/// Whether GPU memory of engines of this host can move device to device between them: the
/// machine's runtime ([`detect`]) exports a small allocation of device 0 as a same-host peer
/// would open it. `Ok` names the runtime and its devices; `Err` says why not (engines then
/// stage GPU memory through host memory, as over TCP).
pub fn check_ipc() -> Result<String, String> {
    check_ipc_with(detect().map_err(|e| e.to_string())?)
}

/// [`check_ipc`] with the runtime `rt`.
pub fn check_ipc_with(rt: Arc<dyn GpuRuntime>) -> Result<String, String> {
    let n = rt.device_count().map_err(|e| e.to_string())?;
    let buf = rt
        .clone()
        .alloc_device(0, 4096)
        .map_err(|e| e.to_string())?;
    let ex = rt.ipc_export(0, buf.ptr()).map_err(|e| e.to_string())?;
    if ex.base > buf.ptr() || ex.base + ex.size < buf.ptr() + 4096 {
        return Err(format!(
            "the {} runtime exported {} bytes at {:#x} for an allocation at {:#x}",
            rt.name(),
            ex.size,
            ex.base,
            buf.ptr()
        ));
    }
    Ok(format!("{} with {n} device(s)", rt.name()))
}

/// The GPU runtime of this machine: CUDA if built with `cuda` and a driver with a device is
/// present, else HIP if built with `hip` and a device is present. Never panics: a missing
/// driver is an [`GpuError::Unavailable`].
pub fn detect() -> Result<Arc<dyn GpuRuntime>, GpuError> {
    let mut why: Vec<String> = Vec::new();
    // The runtimes' own reasons, without repeating "no GPU runtime" for each.
    let reason = |e: GpuError| match e {
        GpuError::Unavailable(m) => m,
        other => other.to_string(),
    };
    #[cfg(feature = "cuda")]
    match cuda::CudaRuntime::new() {
        Ok(rt) => return Ok(Arc::new(rt)),
        Err(e) => why.push(format!("cuda: {}", reason(e))),
    }
    #[cfg(feature = "hip")]
    match hip::HipRuntime::new() {
        Ok(rt) => return Ok(Arc::new(rt)),
        Err(e) => why.push(format!("hip: {}", reason(e))),
    }
    let _ = reason;
    if why.is_empty() {
        why.push("this build has neither the `cuda` nor the `hip` feature".into());
    }
    Err(GpuError::Unavailable(why.join("; ")))
}
