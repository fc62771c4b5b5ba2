//! CUDA backend over the driver API (cudarc, loaded at run time): primary contexts, one
//! non-blocking stream per shard and device, portable pinned staging, event fences.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;

use super::ipc::IpcCache;
use super::{
    BatchCopy, Copy2d, CopyDir, DeviceBuf, DeviceInfo, GpuError, GpuFence, GpuRuntime, GpuStream,
    IpcExport, IpcExports, IpcKind, IpcLease, PinnedBuf,
};

/// The IPC mappings this process opened: one table for the process, since every engine's
/// runtime works in the same per-device contexts (a handle is opened once per context).
fn opened() -> &'static IpcCache {
    static OPENED: OnceLock<Arc<IpcCache>> = OnceLock::new();
    OPENED.get_or_init(|| {
        IpcCache::new(Box::new(|dev, base, size, kind| {
            let ctx = (|| -> Result<usize, DriverError> {
                let d = cu::device::get(dev)?;
                // SAFETY: retains the primary context (already retained by the runtime that
                // opened the mapping; one more reference for the process is harmless).
                Ok(unsafe { cu::primary_ctx::retain(d) }? as usize)
            })();
            if let Ok(ctx) = ctx {
                if bind(ctx).is_ok() {
                    match kind {
                        // SAFETY: opened by `ipc_open` below, closed once (the cache forgot
                        // it).
                        IpcKind::Legacy => drop(unsafe { sys::cuIpcCloseMemHandle(base) }),
                        IpcKind::PosixFd | IpcKind::Fabric => super::cuda_vmm::unmap(base, size),
                    }
                }
            }
        }))
    })
}

/// The CUDA runtime of this process.
#[derive(Debug)]
pub struct CudaRuntime {
    count: usize,
    /// Primary context per device (as `usize`: `CUcontext` is a raw pointer), retained once.
    ctxs: Vec<OnceLock<Result<usize, GpuError>>>,
}

fn err(call: &'static str) -> impl Fn(DriverError) -> GpuError {
    move |e| GpuError::Call {
        call,
        msg: match e.error_name() {
            Ok(n) => n.to_string_lossy().into_owned(),
            Err(_) => format!("{e:?}"),
        },
    }
}

thread_local! {
    /// The context current on this thread, to skip redundant `cuCtxSetCurrent` calls.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// Make `ctx` current on this thread.
fn bind(ctx: usize) -> Result<(), GpuError> {
    if CURRENT.with(|c| c.get()) == ctx {
        return Ok(());
    }
    // SAFETY: `ctx` is a retained primary context, never released while the process runs.
    unsafe { cu::ctx::set_current(ctx as sys::CUcontext) }.map_err(err("cuCtxSetCurrent"))?;
    CURRENT.with(|c| c.set(ctx));
    Ok(())
}

impl CudaRuntime {
    /// Load the driver and count devices. Never panics: without `libcuda` this is
    /// [`GpuError::Unavailable`] (cudarc itself would panic on the first call).
    pub fn new() -> Result<Self, GpuError> {
        // SAFETY: only probes whether the library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::Unavailable(
                "the CUDA driver library (libcuda.so) was not found".into(),
            ));
        }
        cu::init().map_err(|e| GpuError::Unavailable(format!("cuInit: {e:?}")))?;
        let count = cu::device::get_count().map_err(err("cuDeviceGetCount"))?;
        if count <= 0 {
            return Err(GpuError::Unavailable("no CUDA device".into()));
        }
        Ok(Self {
            count: count as usize,
            ctxs: (0..count).map(|_| OnceLock::new()).collect(),
        })
    }

    fn ctx(&self, dev: i32) -> Result<usize, GpuError> {
        if dev < 0 || dev as usize >= self.count {
            return Err(GpuError::NoDevice {
                dev,
                count: self.count,
            });
        }
        self.ctxs[dev as usize]
            .get_or_init(|| {
                let d = cu::device::get(dev).map_err(err("cuDeviceGet"))?;
                // SAFETY: `d` comes from cuDeviceGet; the context is kept for the process.
                let c = unsafe { cu::primary_ctx::retain(d) }
                    .map_err(err("cuDevicePrimaryCtxRetain"))?;
                Ok(c as usize)
            })
            .clone()
    }

    fn attr<T: Default>(ptr: u64, a: sys::CUpointer_attribute) -> Result<T, DriverError> {
        let mut v = T::default();
        // SAFETY: `v` is the attribute's documented type at every call site.
        unsafe { sys::cuPointerGetAttribute(&mut v as *mut T as *mut c_void, a, ptr) }.result()?;
        Ok(v)
    }
}

impl GpuRuntime for CudaRuntime {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_count(&self) -> Result<usize, GpuError> {
        Ok(self.count)
    }

    fn device_info(&self, dev: i32) -> Result<DeviceInfo, GpuError> {
        self.ctx(dev)?;
        let d = cu::device::get(dev).map_err(err("cuDeviceGet"))?;
        let mut buf = [0 as std::ffi::c_char; 32];
        // SAFETY: the buffer is large enough for "dddd:bb:dd.f" and NUL-terminated by CUDA.
        unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, d) }
            .result()
            .map_err(err("cuDeviceGetPCIBusId"))?;
        // SAFETY: NUL-terminated above.
        let bus = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        Ok(DeviceInfo {
            ordinal: dev,
            bus_id: bus.to_string_lossy().to_lowercase(),
            name: cu::device::get_name(d).unwrap_or_default(),
        })
    }

    fn check_device_range(&self, dev: i32, ptr: u64, len: usize) -> Result<(), GpuError> {
        bind(self.ctx(dev)?)?;
        let bad = |why: String| GpuError::NotDeviceMemory { dev, ptr, len, why };
        use sys::CUpointer_attribute as A;
        let end = ptr
            .checked_add(len as u64)
            .ok_or_else(|| bad("it runs past the end of the address space".into()))?;
        // VMM memory (`cuMemMap`: torch's expandable segments, vLLM's cuMem pool) maps
        // separately created physical chunks side by side, and the driver reports the range of
        // the chunk holding an address only (20 MiB for torch). A range may go on into the
        // next chunk where both are such memory: mapped, and without a legacy IPC handle (which
        // every `cuMemAlloc` allocation has; one of those ends where the driver says).
        let vmm = |at: u64| {
            Self::attr::<u64>(at, A::CU_POINTER_ATTRIBUTE_MAPPED).is_ok_and(|m| m != 0)
                && Self::attr::<u64>(at, A::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE)
                    .is_ok_and(|l| l == 0)
        };
        let mut at = ptr;
        loop {
            let here = |what: String| {
                if at == ptr {
                    what
                } else {
                    format!("it runs on into {at:#x}, where {what}")
                }
            };
            let kind: u32 = Self::attr(at, A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
                .map_err(|e| bad(here(format!("the driver does not know it ({e:?})"))))?;
            if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
                return Err(bad(here(format!(
                    "memory type {kind} is not device memory"
                ))));
            }
            let ord: i32 = Self::attr(at, A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
                .map_err(|e| bad(format!("{e:?}")))?;
            if ord != dev {
                return Err(bad(here(format!("it belongs to GPU {ord}"))));
            }
            let start: u64 = Self::attr(at, A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
                .map_err(|e| bad(format!("{e:?}")))?;
            let size: usize = Self::attr(at, A::CU_POINTER_ATTRIBUTE_RANGE_SIZE)
                .map_err(|e| bad(format!("{e:?}")))?;
            let alloc_end = start.saturating_add(size as u64);
            if end <= alloc_end {
                return Ok(());
            }
            if alloc_end <= at || !vmm(at) || !vmm(alloc_end) {
                return Err(bad(here(format!(
                    "its allocation is {size} bytes at {start:#x}"
                ))));
            }
            at = alloc_end;
        }
    }

    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuf, GpuError> {
        let ctx = self.ctx(0)?;
        bind(ctx)?;
        // Portable: usable with every device's context.
        const PORTABLE: u32 = 1;
        // SAFETY: plain allocation; freed exactly once below.
        let p = unsafe { cu::malloc_host(len.max(1), PORTABLE) }.map_err(err("cuMemHostAlloc"))?;
        let addr = p as usize;
        let free = Box::new(move || {
            if bind(ctx).is_ok() {
                // SAFETY: allocated by cuMemHostAlloc above, freed once.
                let _ = unsafe { cu::free_host(addr as *mut c_void) };
            }
        });
        // SAFETY: `len` bytes of host memory owned until `free`.
        Ok(unsafe { PinnedBuf::from_raw(p as *mut u8, len, free) })
    }

    fn create_stream(&self, dev: i32) -> Result<Box<dyn GpuStream>, GpuError> {
        let ctx = self.ctx(dev)?;
        bind(ctx)?;
        let s = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(err("cuStreamCreate"))?;
        Ok(Box::new(CudaStream {
            ctx,
            stream: s as usize,
            events: Rc::new(RefCell::new(Vec::new())),
        }))
    }

    fn alloc_device(self: Arc<Self>, dev: i32, len: usize) -> Result<DeviceBuf, GpuError> {
        let ctx = self.ctx(dev)?;
        bind(ctx)?;
        // SAFETY: plain allocation; freed exactly once below.
        let p = unsafe { cu::malloc_sync(len.max(1)) }.map_err(err("cuMemAlloc"))?;
        let free = Box::new(move || {
            if bind(ctx).is_ok() {
                // SAFETY: allocated by cuMemAlloc above, freed once.
                let _ = unsafe { cu::free_sync(p) };
            }
        });
        // SAFETY: a live allocation of `len` bytes on `dev` until `free`.
        Ok(unsafe { DeviceBuf::from_raw(self, dev, p, len, free) })
    }

    fn ipc_export(&self, dev: i32, ptr: u64) -> Result<IpcExport, GpuError> {
        bind(self.ctx(dev)?)?;
        let legacy: u64 = Self::attr(
            ptr,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        )
        .unwrap_or(1);
        if legacy == 0 {
            return Err(GpuError::Call {
                call: "cuIpcGetMemHandle",
                msg: "memory from a virtual-memory allocator (cuMemCreate) has no legacy IPC \
                      handle"
                    .into(),
            });
        }
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: writes two values; the driver checks `ptr`.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }
            .result()
            .map_err(err("cuMemGetAddressRange"))?;
        let mut h = sys::CUipcMemHandle_st { reserved: [0; 64] };
        // SAFETY: writes one handle; `base` is the start of a live allocation (above).
        unsafe { sys::cuIpcGetMemHandle(&mut h, base) }
            .result()
            .map_err(err("cuIpcGetMemHandle"))?;
        Ok(IpcExport::legacy(
            h.reserved.map(|c| c as u8),
            base,
            size as u64,
        ))
    }

    fn ipc_export_range(&self, dev: i32, ptr: u64, len: usize) -> Result<IpcExports, GpuError> {
        bind(self.ctx(dev)?)?;
        let end = ptr.saturating_add(len.max(1) as u64);
        let (mut list, mut keep) = (Vec::new(), Vec::new());
        let mut refused: Option<GpuError> = None;
        let mut at = ptr;
        while at < end {
            let (mut base, mut size) = (0u64, 0usize);
            // SAFETY: writes two values; the driver checks `at`.
            unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, at) }
                .result()
                .map_err(err("cuMemGetAddressRange"))?;
            let legacy: u64 = Self::attr(
                at,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
            )
            .unwrap_or(1);
            let r = if legacy != 0 {
                self.ipc_export(dev, at).map(|e| (e, None))
            } else {
                let fds_left = super::export_fd_allowed(keep.len());
                super::cuda_vmm::export(base, size as u64, fds_left)
            };
            match r {
                Ok((e, fd)) => {
                    list.push(e);
                    keep.extend(fd);
                }
                Err(e) => {
                    refused.get_or_insert(e);
                }
            }
            if base + size as u64 <= at {
                break;
            }
            at = base + size as u64;
        }
        match refused {
            Some(e) if list.is_empty() => Err(e),
            _ => Ok(IpcExports::new(list, keep)),
        }
    }

    fn ipc_open(&self, dev: i32, pid: u32, export: &IpcExport) -> Result<IpcLease, GpuError> {
        let ctx = self.ctx(dev)?;
        bind(ctx)?;
        if pid == std::process::id() {
            // CUDA refuses to open a handle in the process that exported it; there the
            // allocation is reachable as it is (and still checked to be one).
            let (mut base, mut size) = (0u64, 0usize);
            // SAFETY: writes two values; the driver checks the address.
            unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, export.base) }
                .result()
                .map_err(err("cuMemGetAddressRange"))?;
            return Ok(IpcLease::own(base, size as u64));
        }
        let open = |handle: &[u8; super::IPC_HANDLE_BYTES]| {
            bind(ctx)?;
            if export.kind != IpcKind::Legacy {
                return super::cuda_vmm::import(dev, pid, export);
            }
            let h = sys::CUipcMemHandle_st {
                reserved: handle.map(|b| b as std::ffi::c_char),
            };
            let mut base = 0u64;
            // SAFETY: writes one device pointer; the driver validates the handle.
            unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut base,
                    h,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            }
            .result()
            .map_err(err("cuIpcOpenMemHandle"))?;
            let (mut start, mut size) = (0u64, 0usize);
            // SAFETY: writes two values about the mapping just opened.
            let r = unsafe { sys::cuMemGetAddressRange_v2(&mut start, &mut size, base) }.result();
            if let Err(e) = r {
                // SAFETY: opened just above, closed once.
                let _ = unsafe { sys::cuIpcCloseMemHandle(base) };
                return Err(err("cuMemGetAddressRange")(e));
            }
            Ok((base, size as u64))
        };
        let r = opened().get_or_open(dev, pid, export, open);
        bind(ctx)?;
        r
    }

    unsafe fn copy_to_device(&self, dev: i32, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        bind(self.ctx(dev)?)?;
        // SAFETY: forwarded from the caller.
        unsafe { cu::memcpy_htod_sync(dst, src) }.map_err(err("cuMemcpyHtoD"))
    }

    unsafe fn copy_from_device(&self, dev: i32, dst: &mut [u8], src: u64) -> Result<(), GpuError> {
        bind(self.ctx(dev)?)?;
        // SAFETY: forwarded from the caller.
        unsafe { cu::memcpy_dtoh_sync(dst, src) }.map_err(err("cuMemcpyDtoH"))
    }
}

/// A non-blocking stream in a device's primary context, with its spare events (a fence per
/// staging slot would otherwise create and destroy an event each time).
#[derive(Debug)]
struct CudaStream {
    ctx: usize,
    stream: usize,
    events: Rc<RefCell<Vec<usize>>>,
}

impl GpuStream for CudaStream {
    unsafe fn d2h(&self, dst: *mut u8, src: u64, len: usize) -> Result<(), GpuError> {
        bind(self.ctx)?;
        // SAFETY: forwarded from the caller.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, self.stream as sys::CUstream)
        }
        .result()
        .map_err(err("cuMemcpyDtoHAsync"))
    }

    unsafe fn h2d(&self, dst: u64, src: *const u8, len: usize) -> Result<(), GpuError> {
        bind(self.ctx)?;
        // SAFETY: forwarded from the caller.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, self.stream as sys::CUstream)
        }
        .result()
        .map_err(err("cuMemcpyHtoDAsync"))
    }

    unsafe fn d2d(&self, dst: u64, src: u64, len: usize) -> Result<(), GpuError> {
        bind(self.ctx)?;
        // SAFETY: forwarded from the caller (unified addressing: the source may be on another
        // device or an opened IPC mapping).
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, self.stream as sys::CUstream) }
            .result()
            .map_err(err("cuMemcpyDtoDAsync"))
    }

    unsafe fn copy_batch(&self, dir: CopyDir, copies: &[BatchCopy]) -> Result<(), GpuError> {
        bind(self.ctx)?;
        // SAFETY: forwarded from the caller; the stream is live until drop.
        match unsafe { super::cuda_batch::enqueue(self.stream as sys::CUstream, copies) } {
            Some(r) => r.map_err(|e| err("cuMemcpyBatchAsync")(DriverError(e))),
            // SAFETY: forwarded from the caller.
            None => unsafe { super::one_by_one(self, dir, copies) },
        }
    }

    unsafe fn copy_2d(&self, dir: CopyDir, run: &Copy2d) -> Result<(), GpuError> {
        use sys::CUmemorytype::{
            CU_MEMORYTYPE_DEVICE as DEV, CU_MEMORYTYPE_HOST as HOST, CU_MEMORYTYPE_UNIFIED as ANY,
        };
        let (src_type, dst_type) = match dir {
            CopyDir::D2h => (DEV, HOST),
            CopyDir::H2d => (HOST, DEV),
            // Unified addressing: the driver finds each side's device itself (the source may
            // be an opened IPC mapping of memory on another GPU).
            CopyDir::D2d => (ANY, ANY),
        };
        let p = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: src_type,
            srcHost: run.src as *const c_void,
            srcDevice: run.src,
            srcArray: std::ptr::null_mut(),
            srcPitch: run.src_pitch as usize,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: dst_type,
            dstHost: run.dst as *mut c_void,
            dstDevice: run.dst,
            dstArray: std::ptr::null_mut(),
            dstPitch: run.dst_pitch as usize,
            WidthInBytes: run.width,
            Height: run.rows,
        };
        bind(self.ctx)?;
        // SAFETY: forwarded from the caller (every row is live memory of the kind named, left
        // alone until a later fence); the stream is live until drop.
        match unsafe { sys::cuMemcpy2DAsync_v2(&p, self.stream as sys::CUstream) }.result() {
            Ok(()) => Ok(()),
            // A driver that refuses a 2D copy between these two mappings (checked when the
            // copy is enqueued, before anything moves) still gets the rows, as a batch.
            Err(e) if dir == CopyDir::D2d => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    log::warn!(
                        "cuMemcpy2DAsync refused a device-to-device run ({e}): its rows go as \
                         a batch"
                    )
                });
                let rows: Vec<BatchCopy> = run.row_copies().collect();
                // SAFETY: forwarded from the caller.
                unsafe { self.copy_batch(dir, &rows) }
            }
            Err(e) => Err(err("cuMemcpy2DAsync")(e)),
        }
    }

    fn fence(&self) -> Result<Box<dyn GpuFence>, GpuError> {
        bind(self.ctx)?;
        let spare = self.events.borrow_mut().pop();
        let ev = match spare {
            Some(e) => e as sys::CUevent,
            None => cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(err("cuEventCreate"))?,
        };
        let f = CudaFence {
            ctx: self.ctx,
            ev: ev as usize,
            spares: self.events.clone(),
        };
        // SAFETY: a fresh event and this live stream.
        unsafe { cu::event::record(ev, self.stream as sys::CUstream) }
            .map_err(err("cuEventRecord"))?;
        Ok(Box::new(f))
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if bind(self.ctx).is_ok() {
            for e in self.events.borrow_mut().drain(..) {
                // SAFETY: spare events have no pending work.
                let _ = unsafe { cu::event::destroy(e as sys::CUevent) };
            }
            // SAFETY: created in create_stream; pending work finishes before it is destroyed.
            let _ = unsafe { cu::stream::destroy(self.stream as sys::CUstream) };
        }
    }
}

#[derive(Debug)]
struct CudaFence {
    ctx: usize,
    ev: usize,
    spares: Rc<RefCell<Vec<usize>>>,
}

impl GpuFence for CudaFence {
    fn poll(&self) -> Result<bool, GpuError> {
        bind(self.ctx)?;
        // SAFETY: a live event recorded on a stream.
        match unsafe { cu::event::query(self.ev as sys::CUevent) } {
            Ok(()) => Ok(true),
            Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(e) => Err(err("cuEventQuery")(e)),
        }
    }

    fn wait_blocking(&self) -> Result<(), GpuError> {
        bind(self.ctx)?;
        // SAFETY: a live event recorded on a stream.
        unsafe { cu::event::synchronize(self.ev as sys::CUevent) }
            .map_err(err("cuEventSynchronize"))
    }
}

impl Drop for CudaFence {
    fn drop(&mut self) {
        // A completed event goes back to its stream for the next fence.
        if matches!(self.poll(), Ok(true)) && Rc::strong_count(&self.spares) > 1 {
            self.spares.borrow_mut().push(self.ev);
            return;
        }
        if bind(self.ctx).is_ok() {
            // SAFETY: created in fence(); destroying a pending event is allowed (CUDA frees
            // it once its work completes).
            let _ = unsafe { cu::event::destroy(self.ev as sys::CUevent) };
        }
    }
}
