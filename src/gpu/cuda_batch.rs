//! CUDA's batched copies (`cuMemcpyBatchAsync`, drivers of CUDA 12.8 and later): the copies of
//! a staging slot or a same-host chunk for one driver call instead of one call per segment.
//! Resolved from the driver at run time; where it lacks the call, copies go one by one.

use std::sync::OnceLock;

use cudarc::driver::sys;

use super::BatchCopy;

/// CUDA 13's signature (`cuMemcpyBatchAsync_v2`).
type V2 = unsafe extern "C" fn(
    *mut sys::CUdeviceptr,
    *mut sys::CUdeviceptr,
    *mut usize,
    usize,
    *mut sys::CUmemcpyAttributes,
    *mut usize,
    usize,
    sys::CUstream,
) -> sys::CUresult;

/// CUDA 12.8's (`cuMemcpyBatchAsync`), with the index of a failed copy before the stream.
type V1 = unsafe extern "C" fn(
    *mut sys::CUdeviceptr,
    *mut sys::CUdeviceptr,
    *mut usize,
    usize,
    *mut sys::CUmemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    sys::CUstream,
) -> sys::CUresult;

#[derive(Clone, Copy)]
enum Entry {
    V2(V2),
    V1(V1),
}

/// The driver's batched copy, looked up once.
fn entry() -> Option<Entry> {
    static ENTRY: OnceLock<Option<Entry>> = OnceLock::new();
    *ENTRY.get_or_init(|| {
        // SAFETY: only called once a `CudaRuntime` exists, so the library loads; the symbols
        // are typed as CUDA's headers declare them.
        unsafe {
            let lib = sys::culib();
            if let Ok(f) = lib.get::<V2>(b"cuMemcpyBatchAsync_v2\0") {
                return Some(Entry::V2(*f));
            }
            if let Ok(f) = lib.get::<V1>(b"cuMemcpyBatchAsync\0") {
                return Some(Entry::V1(*f));
            }
        }
        log::debug!("this CUDA driver has no cuMemcpyBatchAsync: GPU copies go one by one");
        None
    })
}

/// Enqueue `copies` on `stream` (its context current) in one call, in stream order; `None`
/// where the driver cannot (the caller then copies one by one).
///
/// # Safety
/// Every copy's ranges must be valid for the copy (device memory, or pinned host memory,
/// reached through unified addressing) and stay untouched until a later fence completes.
pub(super) unsafe fn enqueue(
    stream: sys::CUstream,
    copies: &[BatchCopy],
) -> Option<Result<(), sys::CUresult>> {
    let entry = entry()?;
    let mut dsts: Vec<sys::CUdeviceptr> = copies.iter().map(|c| c.dst).collect();
    let mut srcs: Vec<sys::CUdeviceptr> = copies.iter().map(|c| c.src).collect();
    let mut sizes: Vec<usize> = copies.iter().map(|c| c.len).collect();
    // SAFETY: a plain C struct; all-zero is its "no hint" value for every field.
    let mut attrs: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
    // Sources are read in stream order, after the work queued before (as single copies are).
    attrs.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    // Small copies on the copy engines, leaving the SMs to the application's kernels (a
    // serving engine computes while its KV cache moves); larger ones where the driver picks.
    if copies.iter().all(|c| c.len <= super::BATCH_MAX_COPY) {
        attrs.flags = sys::CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE as u32;
    }
    // One set of attributes, for the copies from index 0 on.
    let mut attr_idx = [0usize];
    let n = copies.len();
    // SAFETY: every array holds `n` entries (one attribute for all); ranges as the caller
    // guarantees; the arrays are read during the call only.
    let r = unsafe {
        match entry {
            Entry::V2(f) => f(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                n,
                &mut attrs,
                attr_idx.as_mut_ptr(),
                1,
                stream,
            ),
            Entry::V1(f) => {
                let mut fail_idx = 0usize;
                f(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    n,
                    &mut attrs,
                    attr_idx.as_mut_ptr(),
                    1,
                    &mut fail_idx,
                    stream,
                )
            }
        }
    };
    Some(match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(e),
    })
}
