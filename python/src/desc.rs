//! `EngineDesc` and `MemoryDesc`: MORI's descriptors with attributes, `==`, `pack()`,
//! `unpack()` (MORI's msgpack arrays) and pickling.

use std::hash::{Hash, Hasher};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyType};

use morio::{EngineDesc, MemoryDesc};

use crate::enums;

fn unpack_err(what: &str, e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("cannot unpack {what}: {e}"))
}

fn hash_of(v: impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// The identity of an engine, to send to peers (`pack()`) and register there
/// (`register_remote_engine(EngineDesc.unpack(b))`). Get yours from `get_engine_desc()`.
#[pyclass(module = "morio", name = "EngineDesc", frozen, eq, hash)]
#[derive(Clone, PartialEq, Hash)]
pub struct PyEngineDesc {
    pub inner: EngineDesc,
}

#[pymethods]
impl PyEngineDesc {
    /// Engine key.
    #[getter]
    fn key(&self) -> &str {
        &self.inner.key
    }
    /// Physical node identity (`MORI_NODE_ID`, else the boot id, else the host name).
    #[getter]
    fn node_id(&self) -> &str {
        &self.inner.node_id
    }
    /// Host name of the owning process.
    #[getter]
    fn hostname(&self) -> &str {
        &self.inner.hostname
    }
    /// Address the engine listens on.
    #[getter]
    fn host(&self) -> &str {
        &self.inner.host
    }
    /// Port (the bound one once the backend exists).
    #[getter]
    fn port(&self) -> u16 {
        self.inner.port
    }
    /// Process id of the owner.
    #[getter]
    fn pid(&self) -> i32 {
        self.inner.pid
    }

    /// MORI's packed form (a msgpack array of the six fields).
    fn pack<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.pack())
    }

    /// The descriptor packed in `data` (`ValueError` if it is not one).
    #[classmethod]
    fn unpack(_cls: &Bound<'_, PyType>, data: &[u8]) -> PyResult<Self> {
        EngineDesc::unpack(data)
            .map(|inner| Self { inner })
            .map_err(|e| unpack_err("EngineDesc", e))
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let py = slf.py();
        let unpack = py.get_type::<Self>().getattr("unpack")?;
        Ok((unpack, (slf.get().pack(py),)))
    }

    fn __repr__(&self) -> String {
        let d = &self.inner;
        format!(
            "EngineDesc(key={:?}, host={:?}, port={}, hostname={:?}, node_id={:?}, pid={})",
            d.key, d.host, d.port, d.hostname, d.node_id, d.pid
        )
    }
}

/// A registered memory region: what a peer needs to read or write it. Get one from a
/// `register_*` call; send it with `pack()`; rebuild it with `MemoryDesc.unpack()`.
#[pyclass(module = "morio", name = "MemoryDesc", frozen)]
#[derive(Clone)]
pub struct PyMemoryDesc {
    pub inner: MemoryDesc,
}

#[pymethods]
impl PyMemoryDesc {
    /// An empty descriptor (MORI allows `MemoryDesc()`); it names no memory.
    #[new]
    fn new() -> Self {
        Self {
            inner: MemoryDesc::cpu("", 0, 0, 0),
        }
    }
    /// Owning engine's key.
    #[getter]
    fn engine_key(&self) -> &str {
        &self.inner.engine_key
    }
    /// Engine-local memory id.
    #[getter]
    fn id(&self) -> u32 {
        self.inner.id
    }
    /// GPU ordinal, -1 for CPU memory.
    #[getter]
    fn device_id(&self) -> i32 {
        self.inner.device_id
    }
    /// PCI bus id of the GPU ("" for CPU memory).
    #[getter]
    fn device_bus_id(&self) -> &str {
        &self.inner.device_bus_id
    }
    /// Address in the owner's process.
    #[getter]
    fn data(&self) -> u64 {
        self.inner.data
    }
    /// Size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.inner.size
    }
    /// `MemoryLocationType`.
    #[getter]
    fn loc(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        enums::location(py, self.inner.loc)
    }
    /// IPC handle (64 bytes; zeros: morio's TCP backend fills none).
    #[getter]
    fn ipc_handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.ipc_handle)
    }
    /// NUMA node of CPU memory, -1 if unknown.
    #[getter]
    fn numa_node(&self) -> i32 {
        self.inner.numa_node
    }

    /// Whether it carries an access key, so peers may read and write the region. False for
    /// memory registered `local_only`, and for a descriptor of MORI's form (which morio
    /// targets refuse).
    #[getter]
    fn remote_access(&self) -> bool {
        !self.inner.access_key.is_none()
    }

    /// MORI's packed form (a msgpack array of the fifteen fields), with morio's access key
    /// appended as a sixteenth (16 bytes) when the region has one.
    fn pack<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.pack())
    }

    /// The descriptor packed in `data`, of 15 fields (MORI's: no access key) or 16
    /// (`ValueError` if it is not one).
    #[classmethod]
    fn unpack(_cls: &Bound<'_, PyType>, data: &[u8]) -> PyResult<Self> {
        MemoryDesc::unpack(data)
            .map(|inner| Self { inner })
            .map_err(|e| unpack_err("MemoryDesc", e))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __hash__(&self) -> u64 {
        let d = &self.inner;
        // The fields MORI's equality compares.
        hash_of((
            &d.engine_key,
            d.id,
            d.device_id,
            &d.device_bus_id,
            d.data,
            d.size,
            d.loc.as_u32(),
            d.numa_node,
            d.ipc_offset,
        ))
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let py = slf.py();
        let unpack = py.get_type::<Self>().getattr("unpack")?;
        Ok((unpack, (slf.get().pack(py),)))
    }

    fn __repr__(&self) -> String {
        let d = &self.inner;
        format!(
            "MemoryDesc(engine_key={:?}, id={}, loc={}, device_id={}, data={:#x}, size={})",
            d.engine_key,
            d.id,
            d.loc.name(),
            d.device_id,
            d.data,
            d.size
        )
    }
}
