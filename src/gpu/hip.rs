//! HIP backend (AMD GPUs) over hip-sys, the twin of `cuda.rs`: the thread's current device set
//! on demand, one non-blocking stream per shard and device, portable pinned staging, event fences.
//!
//! The hip-sys 0.1.2 bindings were generated from HIP 5.4 headers, and the process may run on a
//! ROCm 6 runtime. Two things differ there and are handled here: `hipMemoryType`'s values (read as
//! a plain integer and decoded by the runtime's version), and `hipDeviceProp_t`'s layout (never
//! used: the name comes from `hipDeviceGetName`).

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::{Arc, OnceLock};

use hip_sys::hiprt as hip;
use hip_sys::hiprt::hipError_t;

use super::ipc::IpcCache;
use super::{
    BatchCopy, Copy2d, CopyDir, DeviceBuf, DeviceInfo, GpuError, GpuFence, GpuRuntime, GpuStream,
    IpcExport, IpcLease, PinnedBuf, IPC_HANDLE_BYTES,
};

/// The IPC mappings this process opened: one table for the process, since every engine's
/// runtime works in the same per-device contexts (a handle is opened once per context).
fn opened() -> &'static IpcCache {
    static OPENED: OnceLock<Arc<IpcCache>> = OnceLock::new();
    OPENED.get_or_init(|| {
        IpcCache::new(Box::new(|dev, base, _, _| {
            if set_device(dev).is_ok() {
                // SAFETY: opened by `ipc_open` below, closed once (the cache forgot it).
                let _ = unsafe { hip::hipIpcCloseMemHandle(base as *mut c_void) };
            }
        }))
    })
}

/// The HIP runtime of this process.
#[derive(Debug)]
pub struct HipRuntime {
    count: usize,
    /// `hipMemoryTypeDevice` as this runtime numbers it (1 before ROCm 6, 2 from ROCm 6 on).
    device_mem_type: u32,
}

/// The allocation holding `ptr`: its start and size.
fn address_range(ptr: u64) -> Result<(u64, u64), GpuError> {
    let mut base: hip::hipDeviceptr_t = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: writes one pointer and one size; `ptr` is only looked up.
    check("hipMemGetAddressRange", unsafe {
        hip::hipMemGetAddressRange(&mut base, &mut size, ptr as hip::hipDeviceptr_t)
    })?;
    Ok((base as u64, size as u64))
}

/// `hipError_t` as text: its name where the runtime has one, and always its number.
fn describe(e: hipError_t) -> String {
    let code = e as u32;
    // SAFETY: hipGetErrorName takes any code and returns a static NUL-terminated string or null.
    let name = unsafe { hip::hipGetErrorName(e) };
    if name.is_null() {
        return format!("HIP error {code}");
    }
    // SAFETY: non-null, static and NUL-terminated (above).
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    format!("{name} ({code})")
}

/// `Ok` on `hipSuccess`, else the failed call and its error.
fn check(call: &'static str, r: hipError_t) -> Result<(), GpuError> {
    if r == hipError_t::hipSuccess {
        Ok(())
    } else {
        Err(GpuError::Call {
            call,
            msg: describe(r),
        })
    }
}

thread_local! {
    /// The device current on this thread, to skip redundant `hipSetDevice` calls (-1: unknown).
    static CURRENT: Cell<c_int> = const { Cell::new(-1) };
}

/// Make `dev` (an ordinal already checked against the device count) current on this thread.
fn set_device(dev: c_int) -> Result<(), GpuError> {
    if CURRENT.with(|c| c.get()) == dev {
        return Ok(());
    }
    // SAFETY: plain call on a valid ordinal.
    check("hipSetDevice", unsafe { hip::hipSetDevice(dev) })?;
    CURRENT.with(|c| c.set(dev));
    Ok(())
}

/// `hipPointerAttribute_t` with the memory type as a plain integer: ROCm 6 renumbered
/// `hipMemoryType` (and added values the bindings' Rust enum lacks, which must never be read
/// into it), while the layout stayed the same (the field was only renamed `type`).
#[repr(C)]
#[derive(Debug)]
struct PointerAttributes {
    memory_type: c_uint,
    device: c_int,
    device_pointer: *mut c_void,
    host_pointer: *mut c_void,
    is_managed: c_int,
    allocation_flags: c_uint,
}

const _: () = {
    assert!(size_of::<PointerAttributes>() == size_of::<hip::hipPointerAttribute_t>());
    assert!(align_of::<PointerAttributes>() == align_of::<hip::hipPointerAttribute_t>());
};

/// `hipMemoryTypeDevice` for a runtime of version `version` (`hipRuntimeGetVersion`:
/// major * 10_000_000 + minor * 100_000 + patch): 1 up to ROCm 5, 2 from ROCm 6 on.
fn device_mem_type(version: c_int) -> u32 {
    if version >= 60_000_000 {
        2
    } else {
        hip::hipMemoryType::hipMemoryTypeDevice as u32
    }
}

/// The NUL-terminated text HIP wrote into `buf` (empty if none).
fn c_text(buf: &[u8]) -> String {
    CStr::from_bytes_until_nul(buf)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl HipRuntime {
    /// Count devices. Never panics: no device, no driver (`/dev/kfd`) or a failing runtime is
    /// [`GpuError::Unavailable`]. (`libamdhip64.so` itself is linked, not loaded at run time.)
    pub fn new() -> Result<Self, GpuError> {
        let mut n: c_int = 0;
        // SAFETY: writes one int.
        match unsafe { hip::hipGetDeviceCount(&mut n) } {
            hipError_t::hipSuccess if n > 0 => {}
            hipError_t::hipSuccess | hipError_t::hipErrorNoDevice => {
                return Err(GpuError::Unavailable("no HIP device".into()))
            }
            e => {
                return Err(GpuError::Unavailable(format!(
                    "hipGetDeviceCount: {}",
                    describe(e)
                )))
            }
        }
        let mut version: c_int = 0;
        // SAFETY: writes one int.
        check("hipRuntimeGetVersion", unsafe {
            hip::hipRuntimeGetVersion(&mut version)
        })?;
        Ok(Self {
            count: n as usize,
            device_mem_type: device_mem_type(version),
        })
    }

    /// `Ok` if `dev` is one of this runtime's devices.
    fn ordinal(&self, dev: i32) -> Result<(), GpuError> {
        if dev < 0 || dev as usize >= self.count {
            return Err(GpuError::NoDevice {
                dev,
                count: self.count,
            });
        }
        Ok(())
    }

    /// The allocation (or virtual-memory chunk) holding device address `at` of `dev`: its
    /// start and size; why not, if `at` is not device memory of `dev`.
    fn device_piece(&self, dev: i32, at: u64) -> Result<(u64, usize), String> {
        let mut a = PointerAttributes {
            memory_type: u32::MAX,
            device: -1,
            device_pointer: std::ptr::null_mut(),
            host_pointer: std::ptr::null_mut(),
            is_managed: 0,
            allocation_flags: 0,
        };
        // SAFETY: `a` has hipPointerAttribute_t's layout (asserted above) and only integer or
        // raw-pointer fields, so any bytes HIP writes are valid; `at` is only looked up.
        let r = unsafe {
            hip::hipPointerGetAttributes(
                (&mut a as *mut PointerAttributes).cast::<hip::hipPointerAttribute_t>(),
                at as *const c_void,
            )
        };
        if r != hipError_t::hipSuccess {
            return Err(format!("the runtime does not know it ({})", describe(r)));
        }
        if a.memory_type != self.device_mem_type {
            return Err(format!(
                "memory type {} is not device memory",
                a.memory_type
            ));
        }
        if a.device != dev {
            return Err(format!("it belongs to GPU {}", a.device));
        }
        let mut base: hip::hipDeviceptr_t = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: writes one pointer and one size; `at` is only looked up.
        let r =
            unsafe { hip::hipMemGetAddressRange(&mut base, &mut size, at as hip::hipDeviceptr_t) };
        if r != hipError_t::hipSuccess {
            return Err(format!("hipMemGetAddressRange: {}", describe(r)));
        }
        Ok((base as u64, size))
    }
}

/// Whether `at` is virtual-memory memory: mapped (`hipMemMap`) and without a legacy IPC
/// handle (which every `hipMalloc` allocation has).
fn vmm(at: u64) -> bool {
    let attr = |a: hip::hipPointer_attribute| {
        let mut v: u64 = 0;
        // SAFETY: writes at most 8 bytes (an int or a bool) into `v`; `at` is only looked up.
        let r = unsafe {
            hip::hipPointerGetAttribute(
                (&mut v as *mut u64).cast::<c_void>(),
                a,
                at as hip::hipDeviceptr_t,
            )
        };
        (r == hipError_t::hipSuccess).then_some(v)
    };
    attr(hip::hipPointer_attribute::HIP_POINTER_ATTRIBUTE_MAPPED).is_some_and(|m| m != 0)
        && attr(hip::hipPointer_attribute::HIP_POINTER_ATTRIBUTE_IS_LEGACY_HIP_IPC_CAPABLE)
            .is_some_and(|l| l == 0)
}

impl GpuRuntime for HipRuntime {
    fn name(&self) -> &'static str {
        "hip"
    }

    fn device_count(&self) -> Result<usize, GpuError> {
        Ok(self.count)
    }

    fn device_info(&self, dev: i32) -> Result<DeviceInfo, GpuError> {
        self.ordinal(dev)?;
        // Zeroed, and HIP is told one byte less than there is: always NUL-terminated.
        let mut bus = [0u8; 64];
        // SAFETY: HIP writes at most `len` bytes ("dddd:bb:dd.f" needs 13) into the buffer.
        check("hipDeviceGetPCIBusId", unsafe {
            hip::hipDeviceGetPCIBusId(
                bus.as_mut_ptr().cast::<c_char>(),
                bus.len() as c_int - 1,
                dev,
            )
        })?;
        let mut d: hip::hipDevice_t = 0;
        let mut name = [0u8; 256];
        // SAFETY: writes one device handle for a valid ordinal.
        if unsafe { hip::hipDeviceGet(&mut d, dev) } == hipError_t::hipSuccess {
            // SAFETY: HIP writes at most `len` bytes into the buffer; a failure leaves it zeroed.
            let _ = unsafe {
                hip::hipDeviceGetName(
                    name.as_mut_ptr().cast::<c_char>(),
                    name.len() as c_int - 1,
                    d,
                )
            };
        }
        Ok(DeviceInfo {
            ordinal: dev,
            bus_id: c_text(&bus).to_lowercase(),
            name: c_text(&name),
        })
    }

    fn check_device_range(&self, dev: i32, ptr: u64, len: usize) -> Result<(), GpuError> {
        self.ordinal(dev)?;
        set_device(dev)?;
        let bad = |why: String| GpuError::NotDeviceMemory { dev, ptr, len, why };
        let end = ptr
            .checked_add(len as u64)
            .ok_or_else(|| bad("it runs past the end of the address space".into()))?;
        // As for CUDA: virtual-memory chunks (hipMemMap: torch's expandable segments on ROCm)
        // are reported one per address; a range may run on into the next such chunk.
        let mut at = ptr;
        loop {
            let (start, size) = self.device_piece(dev, at).map_err(|why| {
                bad(if at == ptr {
                    why
                } else {
                    format!("it runs on into {at:#x}, where {why}")
                })
            })?;
            let alloc_end = start.saturating_add(size as u64);
            if at < start {
                return Err(bad(format!("its allocation is {size} bytes at {start:#x}")));
            }
            if end <= alloc_end {
                return Ok(());
            }
            if alloc_end <= at || !vmm(at) || !vmm(alloc_end) {
                return Err(bad(format!("its allocation is {size} bytes at {start:#x}")));
            }
            at = alloc_end;
        }
    }

    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuf, GpuError> {
        self.ordinal(0)?;
        set_device(0)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: plain allocation, portable (usable by every device); freed exactly once below.
        check("hipHostMalloc", unsafe {
            hip::hipHostMalloc(&mut p, len.max(1), hip::hipHostMallocPortable)
        })?;
        let addr = p as usize;
        // hipHostFree finds the allocation by address: no current device needed.
        let free = Box::new(move || {
            // SAFETY: allocated by hipHostMalloc above, freed once.
            let _ = unsafe { hip::hipHostFree(addr as *mut c_void) };
        });
        // SAFETY: `len` bytes of host memory owned until `free`.
        Ok(unsafe { PinnedBuf::from_raw(p.cast::<u8>(), len, free) })
    }

    fn create_stream(&self, dev: i32) -> Result<Box<dyn GpuStream>, GpuError> {
        self.ordinal(dev)?;
        set_device(dev)?;
        let mut s: hip::hipStream_t = std::ptr::null_mut();
        // SAFETY: writes one stream handle, created on the current device (`dev`).
        check("hipStreamCreateWithFlags", unsafe {
            hip::hipStreamCreateWithFlags(&mut s, hip::hipStreamNonBlocking)
        })?;
        Ok(Box::new(HipStream {
            dev,
            stream: s as usize,
        }))
    }

    fn alloc_device(self: Arc<Self>, dev: i32, len: usize) -> Result<DeviceBuf, GpuError> {
        self.ordinal(dev)?;
        set_device(dev)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: plain allocation on the current device (`dev`); freed exactly once below.
        check("hipMalloc", unsafe { hip::hipMalloc(&mut p, len.max(1)) })?;
        let addr = p as usize;
        // hipFree finds the allocation (and its device) by address: no current device needed.
        let free = Box::new(move || {
            // SAFETY: allocated by hipMalloc above, freed once.
            let _ = unsafe { hip::hipFree(addr as *mut c_void) };
        });
        // SAFETY: a live allocation of `len` bytes on `dev` until `free`.
        Ok(unsafe { DeviceBuf::from_raw(self, dev, addr as u64, len, free) })
    }

    fn ipc_export(&self, dev: i32, ptr: u64) -> Result<IpcExport, GpuError> {
        self.ordinal(dev)?;
        set_device(dev)?;
        let (base, size) = address_range(ptr)?;
        // SAFETY: the struct is plain bytes; HIP fills it.
        let mut h: hip::hipIpcMemHandle_t = unsafe { std::mem::zeroed() };
        // SAFETY: writes one handle; `base` starts a live allocation (above).
        check("hipIpcGetMemHandle", unsafe {
            hip::hipIpcGetMemHandle(&mut h, base as *mut c_void)
        })?;
        Ok(IpcExport::legacy(h.reserved.map(|c| c as u8), base, size))
    }

    fn ipc_open(&self, dev: i32, pid: u32, export: &IpcExport) -> Result<IpcLease, GpuError> {
        self.ordinal(dev)?;
        set_device(dev)?;
        if export.kind != super::IpcKind::Legacy {
            // HIP's VMM import (hipMemImportFromShareableHandle) is not built: staged.
            return Err(GpuError::Call {
                call: "hipIpcOpenMemHandle",
                msg: format!(
                    "{:?} exports are not opened by the HIP runtime",
                    export.kind
                ),
            });
        }
        if pid == std::process::id() {
            // Not opened in the exporting process itself: reachable as it is.
            let (base, size) = address_range(export.base)?;
            return Ok(IpcLease::own(base, size));
        }
        let open = |handle: &[u8; IPC_HANDLE_BYTES]| {
            set_device(dev)?;
            // SAFETY: the struct is plain bytes.
            let mut h: hip::hipIpcMemHandle_t = unsafe { std::mem::zeroed() };
            h.reserved = handle.map(|b| b as c_char);
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: writes one device pointer; the runtime validates the handle.
            check("hipIpcOpenMemHandle", unsafe {
                hip::hipIpcOpenMemHandle(&mut p, h, hip::hipIpcMemLazyEnablePeerAccess)
            })?;
            match address_range(p as u64) {
                Ok(range) => Ok(range),
                Err(e) => {
                    // SAFETY: opened just above, closed once.
                    let _ = unsafe { hip::hipIpcCloseMemHandle(p) };
                    Err(e)
                }
            }
        };
        let r = opened().get_or_open(dev, pid, export, open);
        set_device(dev)?;
        r
    }

    unsafe fn copy_to_device(&self, dev: i32, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        self.ordinal(dev)?;
        set_device(dev)?;
        // SAFETY: `dst` is forwarded from the caller; HIP only reads `src` (the binding's `*mut`
        // is a C API wart).
        check("hipMemcpyHtoD", unsafe {
            hip::hipMemcpyHtoD(
                dst as hip::hipDeviceptr_t,
                src.as_ptr() as *mut c_void,
                src.len(),
            )
        })
    }

    unsafe fn copy_from_device(&self, dev: i32, dst: &mut [u8], src: u64) -> Result<(), GpuError> {
        self.ordinal(dev)?;
        set_device(dev)?;
        // SAFETY: `src` is forwarded from the caller; `dst` is a live, exclusive buffer.
        check("hipMemcpyDtoH", unsafe {
            hip::hipMemcpyDtoH(
                dst.as_mut_ptr().cast::<c_void>(),
                src as hip::hipDeviceptr_t,
                dst.len(),
            )
        })
    }
}

/// A non-blocking stream on one device.
#[derive(Debug)]
struct HipStream {
    dev: i32,
    /// `hipStream_t` (as `usize`: a raw pointer).
    stream: usize,
}

impl GpuStream for HipStream {
    unsafe fn d2h(&self, dst: *mut u8, src: u64, len: usize) -> Result<(), GpuError> {
        set_device(self.dev)?;
        // SAFETY: forwarded from the caller; the stream is live until drop.
        check("hipMemcpyDtoHAsync", unsafe {
            hip::hipMemcpyDtoHAsync(
                dst.cast::<c_void>(),
                src as hip::hipDeviceptr_t,
                len,
                self.stream as hip::hipStream_t,
            )
        })
    }

    unsafe fn h2d(&self, dst: u64, src: *const u8, len: usize) -> Result<(), GpuError> {
        set_device(self.dev)?;
        // SAFETY: forwarded from the caller; HIP only reads `src` (the binding's `*mut` is a C
        // API wart); the stream is live until drop.
        check("hipMemcpyHtoDAsync", unsafe {
            hip::hipMemcpyHtoDAsync(
                dst as hip::hipDeviceptr_t,
                src as *mut c_void,
                len,
                self.stream as hip::hipStream_t,
            )
        })
    }

    unsafe fn d2d(&self, dst: u64, src: u64, len: usize) -> Result<(), GpuError> {
        set_device(self.dev)?;
        // SAFETY: forwarded from the caller; the stream is live until drop.
        check("hipMemcpyDtoDAsync", unsafe {
            hip::hipMemcpyDtoDAsync(
                dst as hip::hipDeviceptr_t,
                src as hip::hipDeviceptr_t,
                len,
                self.stream as hip::hipStream_t,
            )
        })
    }

    unsafe fn copy_2d(&self, dir: CopyDir, run: &Copy2d) -> Result<(), GpuError> {
        let kind = match dir {
            CopyDir::D2h => hip::hipMemcpyKind::hipMemcpyDeviceToHost,
            CopyDir::H2d => hip::hipMemcpyKind::hipMemcpyHostToDevice,
            // Unified addressing: the runtime finds each side's device itself (the source may
            // be an opened IPC mapping of memory on another GPU).
            CopyDir::D2d => hip::hipMemcpyKind::hipMemcpyDefault,
        };
        set_device(self.dev)?;
        // SAFETY: forwarded from the caller (every row is live memory of the kind named, left
        // alone until a later fence); HIP only reads `src`; the stream is live until drop.
        let r = unsafe {
            hip::hipMemcpy2DAsync(
                run.dst as *mut c_void,
                run.dst_pitch as usize,
                run.src as *const c_void,
                run.src_pitch as usize,
                run.width,
                run.rows,
                kind,
                self.stream as hip::hipStream_t,
            )
        };
        match check("hipMemcpy2DAsync", r) {
            Ok(()) => Ok(()),
            // A runtime that refuses a 2D copy (checked when it is enqueued, before anything
            // moves) still gets the rows, one copy each (HIP has no batched copy here).
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    log::warn!(
                        "hipMemcpy2DAsync refused a {dir:?} run ({e}): its rows go one by one"
                    )
                });
                let rows: Vec<BatchCopy> = run.row_copies().collect();
                // SAFETY: forwarded from the caller.
                unsafe { super::one_by_one(self, dir, &rows) }
            }
        }
    }

    fn fence(&self) -> Result<Box<dyn GpuFence>, GpuError> {
        set_device(self.dev)?;
        let mut ev: hip::hipEvent_t = std::ptr::null_mut();
        // SAFETY: writes one event handle, created on the current device (the stream's).
        check("hipEventCreateWithFlags", unsafe {
            hip::hipEventCreateWithFlags(&mut ev, hip::hipEventDisableTiming)
        })?;
        // Owned from here: destroyed on drop even if recording fails.
        let f = HipFence { ev: ev as usize };
        // SAFETY: a fresh event and this live stream, both on `self.dev`.
        check("hipEventRecord", unsafe {
            hip::hipEventRecord(ev, self.stream as hip::hipStream_t)
        })?;
        Ok(Box::new(f))
    }
}

impl Drop for HipStream {
    fn drop(&mut self) {
        // The stream carries its device: no current device needed.
        // SAFETY: created in create_stream; HIP lets pending work finish before releasing it.
        let _ = unsafe { hip::hipStreamDestroy(self.stream as hip::hipStream_t) };
    }
}

/// An event recorded on a stream. Events carry their device, so polling, waiting and
/// destroying need no current device (and no `hipSetDevice` on the shard's hot path).
#[derive(Debug)]
struct HipFence {
    /// `hipEvent_t` (as `usize`: a raw pointer).
    ev: usize,
}

impl GpuFence for HipFence {
    fn poll(&self) -> Result<bool, GpuError> {
        // SAFETY: a live event recorded on a stream.
        match unsafe { hip::hipEventQuery(self.ev as hip::hipEvent_t) } {
            hipError_t::hipSuccess => Ok(true),
            hipError_t::hipErrorNotReady => Ok(false),
            e => Err(GpuError::Call {
                call: "hipEventQuery",
                msg: describe(e),
            }),
        }
    }

    fn wait_blocking(&self) -> Result<(), GpuError> {
        // SAFETY: a live event recorded on a stream.
        check("hipEventSynchronize", unsafe {
            hip::hipEventSynchronize(self.ev as hip::hipEvent_t)
        })
    }
}

impl Drop for HipFence {
    fn drop(&mut self) {
        // SAFETY: created in fence(); destroying a pending event is allowed (HIP releases it
        // once its work completes).
        let _ = unsafe { hip::hipEventDestroy(self.ev as hip::hipEvent_t) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_is_unavailable_without_an_amd_gpu() {
        match HipRuntime::new() {
            Err(GpuError::Unavailable(_)) => {}
            Ok(rt) => assert!(rt.device_count().unwrap() > 0),
            Err(e) => panic!("expected GpuError::Unavailable, got {e:?}"),
        }
    }

    #[test]
    fn device_memory_type_follows_the_runtime_version() {
        assert_eq!(device_mem_type(50_221_153), 1); // ROCm 5.2
        assert_eq!(device_mem_type(50_422_804), 1); // ROCm 5.4 (the bindings' headers)
        assert_eq!(device_mem_type(60_032_830), 2); // ROCm 6.0
        assert_eq!(device_mem_type(70_000_000), 2);
    }
}
