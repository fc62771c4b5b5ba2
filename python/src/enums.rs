//! MORI's enums as Python `IntEnum`s (equal to MORI's integer values), made once per process.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyTuple};

use morio::{BackendType, MemoryLocationType, StatusCode};

/// The enum classes and their members, indexed by value.
pub struct Enums {
    pub status_code: Py<PyAny>,
    pub backend_type: Py<PyAny>,
    pub memory_location_type: Py<PyAny>,
    pub poll_cq_mode: Py<PyAny>,
    status_members: Vec<Option<Py<PyAny>>>,
    loc_members: Vec<Py<PyAny>>,
}

static ENUMS: PyOnceLock<Enums> = PyOnceLock::new();

const STATUS: &[(&str, u32)] = &[
    ("SUCCESS", 0),
    ("INIT", 1),
    ("IN_PROGRESS", 2),
    ("ERR_INVALID_ARGS", 11),
    ("ERR_NOT_FOUND", 12),
    ("ERR_RDMA_OP", 13),
    ("ERR_BAD_STATE", 14),
    ("ERR_GPU_OP", 15),
];
const BACKEND: &[(&str, u32)] = &[
    ("Unknown", 0),
    ("XGMI", 1),
    ("RDMA", 2),
    ("TCP", 3),
    ("FABRIC", 4),
];
const LOCATION: &[(&str, u32)] = &[("Unknown", 0), ("CPU", 1), ("GPU", 2)];
const POLL_CQ: &[(&str, u32)] = &[("POLLING", 0), ("EVENT", 1)];

fn int_enum(py: Python<'_>, name: &str, doc: &str, members: &[(&str, u32)]) -> PyResult<Py<PyAny>> {
    let int_enum = py.import("enum")?.getattr("IntEnum")?;
    let items = PyList::empty(py);
    for (n, v) in members {
        items.append(PyTuple::new(
            py,
            [
                n.into_pyobject(py)?.into_any(),
                v.into_pyobject(py)?.into_any(),
            ],
        )?)?;
    }
    let kw = PyDict::new(py);
    kw.set_item("module", "morio")?;
    kw.set_item("qualname", name)?;
    let cls = int_enum.call((name, items), Some(&kw))?;
    cls.setattr("__doc__", doc)?;
    Ok(cls.unbind())
}

fn members(
    py: Python<'_>,
    cls: &Py<PyAny>,
    table: &[(&str, u32)],
) -> PyResult<Vec<Option<Py<PyAny>>>> {
    let max = table.iter().map(|t| t.1).max().unwrap_or(0) as usize;
    let mut v: Vec<Option<Py<PyAny>>> = (0..=max).map(|_| None).collect();
    for (n, val) in table {
        v[*val as usize] = Some(cls.getattr(py, *n)?);
    }
    Ok(v)
}

impl Enums {
    fn new(py: Python<'_>) -> PyResult<Self> {
        let status_code = int_enum(
            py,
            "StatusCode",
            "Transfer outcome codes (MORI-IO's values; errors are > 10).",
            STATUS,
        )?;
        let backend_type = int_enum(
            py,
            "BackendType",
            "Backend kinds (morio implements TCP).",
            BACKEND,
        )?;
        let memory_location_type = int_enum(
            py,
            "MemoryLocationType",
            "Where registered memory lives.",
            LOCATION,
        )?;
        let poll_cq_mode = int_enum(
            py,
            "PollCqMode",
            "RDMA completion polling (accepted, unused).",
            POLL_CQ,
        )?;
        let status_members = members(py, &status_code, STATUS)?;
        let loc_members = members(py, &memory_location_type, LOCATION)?
            .into_iter()
            .flatten()
            .collect();
        Ok(Self {
            status_code,
            backend_type,
            memory_location_type,
            poll_cq_mode,
            status_members,
            loc_members,
        })
    }
}

/// The process's enums (made on first use).
pub fn get(py: Python<'_>) -> PyResult<&Enums> {
    ENUMS.get_or_try_init(py, || Enums::new(py))
}

/// The `StatusCode` member of `c`.
pub fn status(py: Python<'_>, c: StatusCode) -> PyResult<Py<PyAny>> {
    let e = get(py)?;
    match e.status_members.get(c.as_u32() as usize) {
        Some(Some(m)) => Ok(m.clone_ref(py)),
        _ => Ok(c.as_u32().into_pyobject(py)?.into_any().unbind()),
    }
}

/// The `MemoryLocationType` member of `l`.
pub fn location(py: Python<'_>, l: MemoryLocationType) -> PyResult<Py<PyAny>> {
    let e = get(py)?;
    Ok(e.loc_members[l.as_u32() as usize].clone_ref(py))
}

/// A status code from a Python int (or `StatusCode` member).
pub fn status_from(v: u32) -> PyResult<StatusCode> {
    StatusCode::from_u32(v).ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err(format!("{v} is not a StatusCode value"))
    })
}

/// A backend type from a Python int (or `BackendType` member).
pub fn backend_from(v: u32) -> PyResult<BackendType> {
    BackendType::from_u32(v).ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err(format!("{v} is not a BackendType value"))
    })
}

/// A memory location from a Python int (or `MemoryLocationType` member).
pub fn location_from(v: u32) -> PyResult<MemoryLocationType> {
    MemoryLocationType::from_u32(v).ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err(format!("{v} is not a MemoryLocationType value"))
    })
}
