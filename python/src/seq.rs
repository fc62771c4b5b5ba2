//! Offsets and sizes from Python: lists and tuples of ints, or int64/uint64 (also 32-bit)
//! arrays through the buffer protocol (numpy) without a Python object per entry.

use pyo3::buffer::{Element, PyBuffer};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyTuple};

/// Byte-order reversal of the integer types read from buffers.
trait Swap {
    fn swap(self) -> Self;
}

macro_rules! swap_impl {
    ($($t:ty),*) => {$(impl Swap for $t {
        fn swap(self) -> Self {
            self.swap_bytes()
        }
    })*};
}
swap_impl!(i64, u64, i32, u32);

fn negative(what: &str, i: usize, v: i64) -> PyErr {
    PyValueError::new_err(format!("{what}[{i}] is negative ({v})"))
}

fn from_buffer<T: Element + Copy + Swap>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    conv: impl Fn(T) -> Result<usize, i64>,
) -> Option<PyResult<Vec<usize>>> {
    let buf = PyBuffer::<T>::get(obj).ok()?;
    if buf.dimensions() != 1 {
        return Some(Err(PyValueError::new_err(format!(
            "{what} must be one-dimensional, got {} dimensions",
            buf.dimensions()
        ))));
    }
    let py = obj.py();
    // The buffer's byte order: `>` and `!` are big-endian (`<`, `=`, `@` and none native on
    // the little-endian machines morio runs on).
    let swap = cfg!(target_endian = "little")
        && matches!(buf.format().to_bytes().first(), Some(b'>') | Some(b'!'));
    let out = buf.to_vec(py).and_then(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, x)| {
                let x = if swap { x.swap() } else { x };
                conv(x).map_err(|v| negative(what, i, v))
            })
            .collect()
    });
    Some(out)
}

/// A sequence of non-negative ints as `usize`s. `what` names the argument in errors.
pub fn usizes(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<usize>> {
    if let Ok(l) = obj.cast::<PyList>() {
        return l
            .iter()
            .enumerate()
            .map(|(i, x)| item(&x, what, i))
            .collect();
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t
            .iter()
            .enumerate()
            .map(|(i, x)| item(&x, what, i))
            .collect();
    }
    if let Some(r) = from_buffer::<i64>(obj, what, |v| usize::try_from(v).map_err(|_| v)) {
        return r;
    }
    if let Some(r) = from_buffer::<u64>(obj, what, |v| Ok(v as usize)) {
        return r;
    }
    if let Some(r) = from_buffer::<i32>(obj, what, |v| usize::try_from(v).map_err(|_| v as i64)) {
        return r;
    }
    if let Some(r) = from_buffer::<u32>(obj, what, |v| Ok(v as usize)) {
        return r;
    }
    match obj.try_iter() {
        Ok(it) => it.enumerate().map(|(i, x)| item(&x?, what, i)).collect(),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{what} must be a list or tuple of ints or a 1-D integer array, got {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))),
    }
}

fn item(x: &Bound<'_, PyAny>, what: &str, i: usize) -> PyResult<usize> {
    match x.extract::<i64>() {
        Ok(v) => usize::try_from(v).map_err(|_| negative(what, i, v)),
        Err(_) => x.extract::<usize>().map_err(|_| {
            if x.is_instance_of::<PyInt>() {
                PyOverflowError::new_err(format!("{what}[{i}] is out of range: {x}"))
            } else {
                PyTypeError::new_err(format!(
                    "{what}[{i}] must be an int, got {}",
                    x.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            }
        }),
    }
}
