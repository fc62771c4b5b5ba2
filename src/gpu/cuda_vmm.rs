//! CUDA virtual-memory (VMM) chunks between processes: torch's expandable segments and
//! vLLM's cuMem pool map separately created chunks side by side, which have no legacy IPC
//! handle. Each chunk made with a POSIX file-descriptor handle type is exported as a
//! descriptor this process keeps open while the region is registered; a peer takes a
//! duplicate (`pidfd_getfd`), imports it and maps it at an address of its own. A chunk made
//! with only a fabric handle type (IMEX systems) is exported as its fabric handle, which the
//! peer imports directly (built, but never run: no IMEX host is available).

use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use cudarc::driver::sys;

use super::{GpuError, IpcExport, IpcKind};

fn err(call: &'static str) -> impl Fn(sys::CUresult) -> GpuError {
    move |r| GpuError::Call {
        call,
        msg: format!("{r:?}"),
    }
}

fn ok(call: &'static str, r: sys::CUresult) -> Result<(), GpuError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(err(call)(r))
    }
}

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
const FABRIC: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;

/// Export the chunk mapped at `base..base+size` (the current context's device): its
/// descriptor, kept open by the caller for as long as peers may import it (`None` for a
/// fabric handle, which needs nothing kept). `fds_left`: whether another descriptor may be
/// held ([`super::export_fd_allowed`]).
pub(super) fn export(
    base: u64,
    size: u64,
    fds_left: bool,
) -> Result<(IpcExport, Option<OwnedFd>), GpuError> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: writes one handle; the driver checks the address is mapped.
    ok("cuMemRetainAllocationHandle", unsafe {
        sys::cuMemRetainAllocationHandle(&mut h, base as *mut c_void)
    })?;
    let r = (|| {
        // SAFETY: a plain struct the driver fills.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        // SAFETY: `h` is a live handle (retained above).
        ok("cuMemGetAllocationPropertiesFromHandle", unsafe {
            sys::cuMemGetAllocationPropertiesFromHandle(&mut prop, h)
        })?;
        let types = prop.requestedHandleTypes.0;
        if types & POSIX_FD.0 == 0 || !fds_left {
            if types & FABRIC.0 != 0 {
                // SAFETY: a plain 64-byte struct the driver fills.
                let mut fh: sys::CUmemFabricHandle = unsafe { std::mem::zeroed() };
                // SAFETY: writes one fabric handle for a live handle.
                ok("cuMemExportToShareableHandle", unsafe {
                    sys::cuMemExportToShareableHandle(
                        &mut fh as *mut sys::CUmemFabricHandle as *mut c_void,
                        h,
                        FABRIC,
                        0,
                    )
                })?;
                return Ok((IpcExport::fabric(fh.data, base, size), None));
            }
            return Err(GpuError::Call {
                call: "cuMemExportToShareableHandle",
                msg: if fds_left {
                    format!(
                        "the chunk was made without a file-descriptor or fabric handle type \
                         (handle types {types:#x})"
                    )
                } else {
                    "VMM exports already hold a quarter of RLIMIT_NOFILE".into()
                },
            });
        }
        let mut fd: libc::c_int = -1;
        // SAFETY: writes one descriptor for a live handle.
        ok("cuMemExportToShareableHandle", unsafe {
            sys::cuMemExportToShareableHandle(
                &mut fd as *mut libc::c_int as *mut c_void,
                h,
                POSIX_FD,
                0,
            )
        })?;
        // SAFETY: the driver made this descriptor for us; owned from here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ex = IpcExport::posix_fd(fd.as_raw_fd(), rand::random(), base, size);
        Ok((ex, Some(fd)))
    })();
    // SAFETY: drops the reference retained above (the mapping keeps its own).
    let _ = unsafe { sys::cuMemRelease(h) };
    r
}

/// Map the chunk process `pid` exported as `ex` into this process for device `dev` (the
/// current context's): its base and size here. Undone by [`unmap`].
pub(super) fn import(dev: i32, pid: u32, ex: &IpcExport) -> Result<(u64, u64), GpuError> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    if ex.kind == IpcKind::Fabric {
        let mut fh = sys::CUmemFabricHandle { data: ex.handle };
        // SAFETY: the driver reads the 64-byte fabric handle.
        ok("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut h,
                &mut fh as *mut sys::CUmemFabricHandle as *mut c_void,
                FABRIC,
            )
        })?;
    } else {
        let fd = ex.fd().ok_or(GpuError::Call {
            call: "cuMemImportFromShareableHandle",
            msg: "not a descriptor export".into(),
        })?;
        let taken = crate::fdpass::take_fd(pid as libc::pid_t, fd).map_err(|e| GpuError::Call {
            call: "pidfd_getfd",
            msg: e.to_string(),
        })?;
        // SAFETY: the driver reads the descriptor (passed by value, as CUDA documents).
        ok("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut h,
                taken.as_raw_fd() as usize as *mut c_void,
                POSIX_FD,
            )
        })?;
    }
    let size = ex.size as usize;
    let mut va: sys::CUdeviceptr = 0;
    let r = (|| {
        // SAFETY: reserves address space only.
        ok("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut va, size, 0, 0, 0)
        })?;
        // SAFETY: maps the imported chunk (from its start, as CUDA requires) at the range
        // just reserved.
        if let Err(e) = ok("cuMemMap", unsafe { sys::cuMemMap(va, size, 0, h, 0) }) {
            // SAFETY: reserved above, freed once.
            let _ = unsafe { sys::cuMemAddressFree(va, size) };
            return Err(e);
        }
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: dev,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; one descriptor.
        if let Err(e) = ok("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(va, size, &access, 1)
        }) {
            unmap(va, size as u64);
            return Err(e);
        }
        Ok((va, size as u64))
    })();
    // SAFETY: the import's reference; a mapping holds its own.
    let _ = unsafe { sys::cuMemRelease(h) };
    r
}

/// Unmap a chunk [`import`] mapped and free its addresses.
pub(super) fn unmap(base: u64, size: u64) {
    // SAFETY: mapped by `import`, unmapped once (its cache forgot it).
    unsafe {
        let _ = sys::cuMemUnmap(base, size as usize);
        let _ = sys::cuMemAddressFree(base, size as usize);
    }
}
