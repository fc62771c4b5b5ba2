//! GPU memory seam: what the engine needs from a GPU runtime (identify device memory, pinned
//! host staging, async host<->device copies on a stream, completions it can poll), and the
//! backends that provide it: CUDA (`cuda` feature), HIP (`hip` feature) and an in-memory fake.

use std::fmt;
use std::sync::Arc;

mod export;
pub mod fake;
pub mod ipc;
mod strided;

pub(crate) use export::export_fd_allowed;
pub use export::{IpcExport, IpcExports, IpcKind};
pub(crate) use strided::runs_2d;
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

/// Whether the engine hands a chunk's segments to the GPU runtime as one batch
/// ([`GpuStream::copy_batch`]); `MORIO_GPU_BATCH_COPIES=off` enqueues them one by one (an A/B
/// knob, read once).
pub(crate) fn batch_copies() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("MORIO_GPU_BATCH_COPIES").as_deref(),
            Ok("off" | "0" | "false")
        )
    })
}

/// Copies larger than this go to the runtime one call each, never in a batch: their call
/// costs little against their bytes, and CUDA may move a batch on its copy engines where a
/// single device-to-device copy runs on the SMs at several times the speed (NVIDIA/nccl
/// #2177: 87 GiB/s against 1.6 TiB/s for 32 MiB). 128 KiB is where cudf found batching (with
/// the copy engines preferred) stops paying (rapidsai/cudf#23675).
pub const BATCH_MAX_COPY: usize = 128 << 10;

/// The largest device-to-device copy batched: [`BATCH_MAX_COPY`] unless
/// `MORIO_GPU_D2D_BATCH_MAX` (bytes, read once) says otherwise, an A/B knob (a single D2D copy
/// may run on the SMs where a batch runs on the copy engines). On the H100 host 16 KiB ×
/// 1024 between processes moved at 8.7–10.5 GB/s batched against 5.6 with only copies up to
/// 4 KiB batched and 8.8–9.2 unbatched, in rounds that varied by ±20 %
/// (docs/perf/h100-s31.md).
fn d2d_batch_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("MORIO_GPU_D2D_BATCH_MAX")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(BATCH_MAX_COPY)
    })
}

/// The largest copy batched in direction `dir`.
fn batch_max(dir: CopyDir) -> usize {
    match dir {
        CopyDir::D2d => d2d_batch_max(),
        CopyDir::D2h | CopyDir::H2d => BATCH_MAX_COPY,
    }
}

/// Enqueue `copies` on `stream`: runs of small copies at constant pitches as one 2D copy
/// each ([`runs_2d`]; `MORIO_GPU_COPY_2D=off`: not), the other copies
/// of at most [`BATCH_MAX_COPY`] bytes (device to device: `MORIO_GPU_D2D_BATCH_MAX`) as one
/// batch, larger ones one call each. A batch's copies may run in any order, so copies whose
/// destinations overlap (a batch that writes one place twice: the later segment wins) go one
/// by one in their order, as do all of them when batching is off.
///
/// # Safety
/// As [`GpuStream::copy_batch`].
pub(crate) unsafe fn enqueue_copies(
    stream: &dyn GpuStream,
    dir: CopyDir,
    copies: &[BatchCopy],
) -> Result<(), GpuError> {
    let max = batch_max(dir);
    if copies.len() < 2 || !batch_copies() || destinations_overlap(copies) {
        // SAFETY: forwarded from the caller.
        return unsafe { one_by_one(stream, dir, copies) };
    }
    let rest = if copies.len() >= strided::MIN_ROWS && strided::copies_2d() {
        let (runs, rest) = runs_2d(copies, max);
        for r in &runs {
            // SAFETY: forwarded from the caller; the rows are copies given.
            unsafe { stream.copy_2d(dir, r)? };
        }
        rest
    } else {
        copies.to_vec()
    };
    let small = rest.iter().filter(|c| c.len <= max).count();
    if small < 2 {
        // SAFETY: forwarded from the caller.
        return unsafe { one_by_one(stream, dir, &rest) };
    }
    let (batch, large): (Vec<BatchCopy>, Vec<BatchCopy>) = rest.iter().partition(|c| c.len <= max);
    // SAFETY: forwarded from the caller.
    unsafe {
        one_by_one(stream, dir, &large)?;
        stream.copy_batch(dir, &batch)
    }
}

/// The copies of `copies` that [`enqueue_copies`] would not take into 2D copies (all of
/// them where it would not look for runs), in their order.
pub(crate) fn loose_copies(dir: CopyDir, copies: &[BatchCopy]) -> Vec<BatchCopy> {
    if copies.len() >= strided::MIN_ROWS && strided::copies_2d() {
        runs_2d(copies, batch_max(dir)).1
    } else {
        copies.to_vec()
    }
}

/// Whether two of `copies` write the same byte.
fn destinations_overlap(copies: &[BatchCopy]) -> bool {
    let mut d: Vec<(u64, u64)> = copies
        .iter()
        .map(|c| (c.dst, c.dst.saturating_add(c.len as u64)))
        .collect();
    d.sort_unstable();
    d.windows(2).any(|w| w[1].0 < w[0].1)
}

/// Enqueue `copies` one call each.
///
/// # Safety
/// As [`GpuStream::copy_batch`].
pub unsafe fn one_by_one<S: GpuStream + ?Sized>(
    stream: &S,
    dir: CopyDir,
    copies: &[BatchCopy],
) -> Result<(), GpuError> {
    for c in copies {
        // SAFETY: forwarded from the caller.
        unsafe {
            match dir {
                CopyDir::D2h => stream.d2h(c.dst as *mut u8, c.src, c.len)?,
                CopyDir::H2d => stream.h2d(c.dst, c.src as *const u8, c.len)?,
                CopyDir::D2d => stream.d2d(c.dst, c.src, c.len)?,
            }
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    use fake::FakeGpu;

    fn copy(dst: u64, src: u64, len: usize) -> BatchCopy {
        BatchCopy { dst, src, len }
    }

    #[test]
    fn overlapping_destinations_are_found() {
        assert!(!destinations_overlap(&[]));
        assert!(!destinations_overlap(&[copy(0, 0, 8), copy(8, 0, 8)]));
        assert!(destinations_overlap(&[copy(8, 0, 8), copy(0, 0, 9)]));
        assert!(destinations_overlap(&[
            copy(0, 0, 64),
            copy(100, 0, 1),
            copy(10, 0, 1)
        ]));
        assert!(!destinations_overlap(&[
            copy(u64::MAX - 8, 0, 16),
            copy(0, 0, 1)
        ]));
    }

    /// A fake GPU, 1 MiB of its memory, a stream, and 1 MiB of pinned memory holding
    /// `i % modulus` at byte `i`.
    fn fake_setup(modulus: usize) -> (Arc<FakeGpu>, DeviceBuf, Box<dyn GpuStream>, PinnedBuf) {
        let gpu = Arc::new(FakeGpu::new(1));
        let dev = gpu.clone().alloc_device(0, 1 << 20).unwrap();
        let stream = gpu.create_stream(0).unwrap();
        let mut host = gpu.alloc_pinned(1 << 20).unwrap();
        for (i, b) in host.as_mut_slice().iter_mut().enumerate() {
            *b = (i % modulus) as u8;
        }
        (gpu, dev, stream, host)
    }

    /// Small copies go as one batch and large ones alone; copies into one place twice keep
    /// their order (the later wins), never batched.
    #[test]
    fn small_copies_are_batched_and_overlapping_ones_keep_their_order() {
        let (gpu, dev, stream, host) = fake_setup(251);
        let (h, d) = (host.as_slice().as_ptr() as u64, dev.ptr());
        // 16 small disjoint copies at irregular places and one of 256 KiB.
        let mut copies: Vec<BatchCopy> = (0..16)
            .map(|i| copy(d + i * 64, h + i * 32 + (i % 3) * 7, 32))
            .collect();
        copies.push(copy(d + (512 << 10), h + (512 << 10), 256 << 10));
        let (b0, c0) = (gpu.batches(), gpu.copies());
        // SAFETY: both ranges are live allocations of this test, left alone until the fence.
        unsafe { enqueue_copies(&*stream, CopyDir::H2d, &copies) }.unwrap();
        stream.fence().unwrap().wait_blocking().unwrap();
        assert_eq!((gpu.batches() - b0, gpu.copies() - c0), (1, 17));
        let mut back = vec![0u8; 1 << 20];
        // SAFETY: the device buffer is live.
        unsafe { gpu.copy_from_device(0, &mut back, d) }.unwrap();
        for i in 0..16usize {
            let at = i * 32 + (i % 3) * 7;
            assert_eq!(&back[i * 64..i * 64 + 32], &host.as_slice()[at..at + 32]);
        }
        assert_eq!(
            &back[512 << 10..768 << 10],
            &host.as_slice()[512 << 10..768 << 10]
        );

        // The same 8 bytes written three times: the last source wins, one call each.
        let twice = [copy(d, h, 8), copy(d, h + 100, 8), copy(d + 4, h + 200, 8)];
        let (b0, c0) = (gpu.batches(), gpu.copies());
        // SAFETY: as above.
        unsafe { enqueue_copies(&*stream, CopyDir::H2d, &twice) }.unwrap();
        stream.fence().unwrap().wait_blocking().unwrap();
        assert_eq!((gpu.batches() - b0, gpu.copies() - c0), (0, 3));
        // SAFETY: as above.
        unsafe { gpu.copy_from_device(0, &mut back[..12], d) }.unwrap();
        let s = host.as_slice();
        assert_eq!(&back[..4], &s[100..104]);
        assert_eq!(&back[4..12], &s[200..208]);
    }

    /// Small copies at constant pitches go as one 2D copy, both ways, a shorter run and the
    /// copies around it as a batch; every byte lands where its copy says.
    #[test]
    fn copies_at_constant_pitches_go_as_one_2d_copy() {
        let (gpu, dev, stream, host) = fake_setup(253);
        let (h, d) = (host.as_slice().as_ptr() as u64, dev.ptr());
        // MORI's layout (stride 4097) packed at 4096, then three copies too few for a run.
        let mut copies: Vec<BatchCopy> = (0..32)
            .map(|i| copy(d + i * 4097, h + i * 4096, 4096))
            .collect();
        copies
            .extend((0..3).map(|i| copy(d + (512 << 10) + i * 100, h + (512 << 10) + i * 50, 50)));
        let (b0, t0, c0) = (gpu.batches(), gpu.copies_2d(), gpu.copies());
        // SAFETY: both ranges are live allocations of this test, left alone until the fence.
        unsafe { enqueue_copies(&*stream, CopyDir::H2d, &copies) }.unwrap();
        stream.fence().unwrap().wait_blocking().unwrap();
        assert_eq!(
            (gpu.batches() - b0, gpu.copies_2d() - t0, gpu.copies() - c0),
            (1, 1, 35)
        );
        let mut back = vec![0u8; 1 << 20];
        // SAFETY: the device buffer is live.
        unsafe { gpu.copy_from_device(0, &mut back, d) }.unwrap();
        for c in &copies {
            let (at, from) = ((c.dst - d) as usize, (c.src - h) as usize);
            assert_eq!(&back[at..at + c.len], &host.as_slice()[from..from + c.len]);
        }
        // And back out: device rows at 4097 into a packed slot, as one 2D copy.
        let mut slot = gpu.alloc_pinned(32 * 4096).unwrap();
        let s = slot.as_mut_slice().as_mut_ptr() as u64;
        let out: Vec<BatchCopy> = (0..32)
            .map(|i| copy(s + i * 4096, d + i * 4097, 4096))
            .collect();
        let t0 = gpu.copies_2d();
        // SAFETY: as above.
        unsafe { enqueue_copies(&*stream, CopyDir::D2h, &out) }.unwrap();
        stream.fence().unwrap().wait_blocking().unwrap();
        assert_eq!(gpu.copies_2d() - t0, 1);
        for i in 0..32usize {
            assert_eq!(
                &slot.as_slice()[i * 4096..(i + 1) * 4096],
                &host.as_slice()[i * 4096..(i + 1) * 4096]
            );
        }
        // Device to device (a same-host peer's opened memory into this GPU's): 64 rows of
        // 8 B at stride 9 into rows at stride 24, as one 2D copy; `loose_copies` leaves none.
        let other = gpu.clone().alloc_device(0, 1 << 16).unwrap();
        let o = other.ptr();
        let d2d: Vec<BatchCopy> = (0..64).map(|i| copy(o + i * 24, d + i * 9, 8)).collect();
        assert!(loose_copies(CopyDir::D2d, &d2d).is_empty());
        let (t0, c0) = (gpu.copies_2d(), gpu.d2d_copies());
        // SAFETY: both device ranges are live allocations of this test.
        unsafe { enqueue_copies(&*stream, CopyDir::D2d, &d2d) }.unwrap();
        stream.fence().unwrap().wait_blocking().unwrap();
        assert_eq!((gpu.copies_2d() - t0, gpu.d2d_copies() - c0), (1, 64));
        let (mut from, mut to) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
        // SAFETY: both device buffers are live.
        unsafe {
            gpu.copy_from_device(0, &mut from, d).unwrap();
            gpu.copy_from_device(0, &mut to, o).unwrap();
        }
        for i in 0..64usize {
            assert_eq!(&to[i * 24..i * 24 + 8], &from[i * 9..i * 9 + 8], "row {i}");
            assert!(
                to[i * 24 + 8..i * 24 + 24].iter().all(|&b| b == 0),
                "row {i}"
            );
        }
        // Irregular destinations: every copy stays loose.
        let mut shuffled = d2d.clone();
        shuffled.swap(3, 40);
        shuffled.swap(10, 20);
        assert!(loose_copies(CopyDir::D2d, &shuffled).len() > 4);
    }
}
