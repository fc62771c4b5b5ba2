//! What a Python object registers as: torch tensors, DLPack producers (numpy, cupy, JAX…)
//! and buffer-protocol objects, each kept alive while registered.

use std::ffi::{c_void, CStr};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use morio::MemoryLocationType;

/// A region to register and what must stay alive while it is registered.
pub struct Memory {
    pub ptr: u64,
    pub size: usize,
    pub device_id: i32,
    pub loc: MemoryLocationType,
    pub keep: Keep,
}

/// What keeps registered memory valid: the owning object (and, for DLPack, the capsule whose
/// destructor releases the producer's hold), or a held buffer view.
pub enum Keep {
    Object(#[allow(dead_code)] Py<PyAny>),
    Dlpack(#[allow(dead_code)] Py<PyAny>, #[allow(dead_code)] Py<PyAny>),
    Buffer(#[allow(dead_code)] HeldBuffer),
}

/// A `Py_buffer` held from `PyObject_GetBuffer` until dropped (released under the GIL).
pub struct HeldBuffer(Box<ffi::Py_buffer>);

// SAFETY: the view is only released (in Drop, under the GIL); its fields are plain data.
unsafe impl Send for HeldBuffer {}
// SAFETY: as above; nothing reads it through a shared reference.
unsafe impl Sync for HeldBuffer {}

impl Drop for HeldBuffer {
    fn drop(&mut self) {
        // SAFETY: the view came from a successful PyObject_GetBuffer and is released once.
        Python::attach(|_| unsafe { ffi::PyBuffer_Release(&mut *self.0) });
    }
}

fn torch_tensor_type<'py>(py: Python<'py>) -> Option<Bound<'py, PyAny>> {
    let modules = py.import("sys").ok()?.getattr("modules").ok()?;
    let torch = modules.get_item("torch").ok()?;
    torch.getattr("Tensor").ok()
}

/// Whether `obj` is a `torch.Tensor` (without importing torch if nobody has).
pub fn is_torch_tensor(obj: &Bound<'_, PyAny>) -> bool {
    torch_tensor_type(obj.py()).is_some_and(|t| obj.is_instance(&t).unwrap_or(false))
}

/// A contiguous torch tensor (CPU or CUDA), as MORI's `register_torch_tensor` takes it.
pub fn from_torch(t: &Bound<'_, PyAny>) -> PyResult<Memory> {
    if !t.call_method0("is_contiguous")?.extract::<bool>()? {
        return Err(PyRuntimeError::new_err("input tensor must be contiguous"));
    }
    let numel: usize = t.call_method0("nelement")?.extract()?;
    let elem: usize = t.call_method0("element_size")?.extract()?;
    let ptr: u64 = t.call_method0("data_ptr")?.extract()?;
    let device = t.getattr("device")?;
    let kind: String = device.getattr("type")?.extract()?;
    let index: Option<i32> = device.getattr("index")?.extract()?;
    let (device_id, loc) = match kind.as_str() {
        "cpu" => (-1, MemoryLocationType::Cpu),
        "cuda" => (index.unwrap_or(0), MemoryLocationType::Gpu),
        other => {
            return Err(PyValueError::new_err(format!(
                "cannot register a tensor on device type {other:?}: morio takes CPU and CUDA \
                 (or ROCm, which torch calls cuda) tensors"
            )))
        }
    };
    let size = numel
        .checked_mul(elem)
        .ok_or_else(|| PyValueError::new_err("tensor size overflows"))?;
    Ok(Memory {
        ptr,
        size,
        device_id,
        loc,
        keep: Keep::Object(t.clone().unbind()),
    })
}

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

const DL_CPU: i32 = 1;
const DL_CUDA: i32 = 2;
const DL_CUDA_HOST: i32 = 3;
const DL_ROCM: i32 = 10;
const DL_ROCM_HOST: i32 = 11;

const DLTENSOR: &CStr = c"dltensor";

/// Bytes spanned by a DLPack tensor, if it is C-contiguous (strides of size-1 dimensions
/// do not matter; no strides means compact row-major).
fn dlpack_bytes(t: &DlTensor) -> PyResult<usize> {
    let bits = t.dtype.bits as usize * t.dtype.lanes.max(1) as usize;
    if bits % 8 != 0 {
        return Err(PyValueError::new_err(format!(
            "cannot register a DLPack tensor of {bits}-bit elements (not whole bytes)"
        )));
    }
    let elem = bits / 8;
    let ndim = usize::try_from(t.ndim).map_err(|_| PyValueError::new_err("negative ndim"))?;
    if ndim > 0 && t.shape.is_null() {
        return Err(PyValueError::new_err("DLPack tensor without a shape"));
    }
    let shape = if ndim == 0 {
        &[][..]
    } else {
        // SAFETY: `shape` is not null (checked above), and DLPack guarantees it holds `ndim`
        // entries, valid while the capsule lives (the caller holds it).
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let strides = (!t.strides.is_null() && ndim > 0).then(|| {
        // SAFETY: not null (checked), and DLPack guarantees a non-null `strides` holds
        // `ndim` entries, valid while the capsule lives.
        unsafe { std::slice::from_raw_parts(t.strides, ndim) }
    });
    let mut count: usize = 1;
    for &d in shape {
        let d = usize::try_from(d).map_err(|_| PyValueError::new_err("negative dimension"))?;
        count = count
            .checked_mul(d)
            .ok_or_else(|| PyValueError::new_err("tensor size overflows"))?;
    }
    if count > 0 {
        if let Some(strides) = strides {
            let mut expect: i64 = 1;
            for i in (0..ndim).rev() {
                if shape[i] != 1 && strides[i] != expect {
                    return Err(PyValueError::new_err(
                        "cannot register a non-contiguous array: registered memory is one \
                         contiguous range (make a contiguous copy first)",
                    ));
                }
                expect = expect.saturating_mul(shape[i]);
            }
        }
    }
    count
        .checked_mul(elem)
        .ok_or_else(|| PyValueError::new_err("tensor size overflows"))
}

/// Any object with `__dlpack__` (numpy, cupy, JAX, torch…), C-contiguous, on the CPU or a
/// CUDA/ROCm device.
pub fn from_dlpack(obj: &Bound<'_, PyAny>) -> PyResult<Memory> {
    let (dev_type, dev_id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
    let (device_id, loc) = match dev_type {
        DL_CPU | DL_CUDA_HOST | DL_ROCM_HOST => (-1, MemoryLocationType::Cpu),
        DL_CUDA | DL_ROCM => (dev_id, MemoryLocationType::Gpu),
        other => {
            return Err(PyValueError::new_err(format!(
                "cannot register DLPack memory of device type {other}: morio takes CPU, \
                 CUDA and ROCm memory"
            )))
        }
    };
    let capsule = obj.call_method0("__dlpack__")?;
    // SAFETY: a capsule from __dlpack__ named "dltensor" points to a DLManagedTensor whose
    // first member is the DLTensor; it stays valid while we hold the capsule (its
    // destructor calls the producer's deleter since we do not rename it).
    let t = unsafe {
        let p = ffi::PyCapsule_GetPointer(capsule.as_ptr(), DLTENSOR.as_ptr());
        if p.is_null() {
            return Err(PyErr::take(obj.py()).unwrap_or_else(|| {
                PyTypeError::new_err("__dlpack__ did not return a \"dltensor\" capsule")
            }));
        }
        &*(p as *const DlTensor)
    };
    let size = dlpack_bytes(t)?;
    let ptr = (t.data as u64)
        .checked_add(t.byte_offset)
        .ok_or_else(|| PyValueError::new_err("bad DLPack data pointer"))?;
    Ok(Memory {
        ptr,
        size,
        device_id,
        loc,
        keep: Keep::Dlpack(obj.clone().unbind(), capsule.unbind()),
    })
}

/// A writable, C-contiguous buffer-protocol object (bytearray, mmap, array.array…).
pub fn from_buffer(obj: &Bound<'_, PyAny>) -> PyResult<Memory> {
    // SAFETY: Py_buffer is plain data that PyObject_GetBuffer fills.
    let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
    let flags = ffi::PyBUF_WRITABLE | ffi::PyBUF_C_CONTIGUOUS;
    // SAFETY: obj is a live object; view is a valid out-parameter.
    if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } != 0 {
        let cause = PyErr::take(obj.py());
        let e = PyTypeError::new_err(format!(
            "cannot register a {}: it is not a torch tensor, has no __dlpack__, and gives no \
             writable contiguous buffer (peers may write registered memory)",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ));
        e.set_cause(obj.py(), cause);
        return Err(e);
    }
    let held = HeldBuffer(view);
    let size = usize::try_from(held.0.len).map_err(|_| PyValueError::new_err("negative length"))?;
    Ok(Memory {
        ptr: held.0.buf as u64,
        size,
        device_id: -1,
        loc: MemoryLocationType::Cpu,
        keep: Keep::Buffer(held),
    })
}

/// Any registrable object: a torch tensor, then `__dlpack__`, then the buffer protocol
/// (also when DLPack cannot describe the object, e.g. numpy's structured dtypes).
pub fn from_object(obj: &Bound<'_, PyAny>) -> PyResult<Memory> {
    if is_torch_tensor(obj) {
        return from_torch(obj);
    }
    if obj.hasattr("__dlpack__")? && obj.hasattr("__dlpack_device__")? {
        return match from_dlpack(obj) {
            Ok(m) => Ok(m),
            // morio's own refusal (not contiguous, odd element size, device): final.
            Err(e) if e.is_instance_of::<PyValueError>(obj.py()) => Err(e),
            Err(dl) => from_buffer(obj).inspect_err(|e| e.set_cause(obj.py(), Some(dl))),
        };
    }
    from_buffer(obj)
}
