//! `IOEngineSession`: transfers over one pre-resolved (local, remote) memory pair.

use std::sync::Arc;

use pyo3::prelude::*;

use morio::IoEngineSession;

use crate::engine::Origin;
use crate::seq::usizes;
use crate::status::PyTransferStatus;

/// Transfers between one local and one remote region, given by offsets only (MORI-IO's
/// `IOEngineSession`; from `IOEngine.create_session`).
#[pyclass(module = "morio", name = "IOEngineSession", frozen)]
pub struct PyIoEngineSession {
    inner: Arc<IoEngineSession>,
    /// Where the engine was made (see `engine::Origin`).
    origin: Origin,
}

impl PyIoEngineSession {
    pub fn new(inner: Arc<IoEngineSession>, origin: Origin) -> Self {
        Self { inner, origin }
    }

    fn session(&self) -> PyResult<&IoEngineSession> {
        self.origin.check()?;
        Ok(&self.inner)
    }
}

#[pymethods]
impl PyIoEngineSession {
    /// A fresh uid from the engine's counter.
    fn allocate_transfer_uid(&self) -> u64 {
        self.inner.allocate_transfer_uid()
    }

    /// Read `size` bytes at `remote_offset` into `local_offset`.
    fn read(
        &self,
        py: Python<'_>,
        local_offset: usize,
        remote_offset: usize,
        size: usize,
        transfer_uid: u64,
    ) -> PyResult<PyTransferStatus> {
        let s = self.session()?;
        Ok(PyTransferStatus::wrap(py.detach(|| {
            s.read(local_offset, remote_offset, size, transfer_uid)
        })))
    }

    /// Write `size` bytes at `local_offset` to `remote_offset`.
    fn write(
        &self,
        py: Python<'_>,
        local_offset: usize,
        remote_offset: usize,
        size: usize,
        transfer_uid: u64,
    ) -> PyResult<PyTransferStatus> {
        let s = self.session()?;
        Ok(PyTransferStatus::wrap(py.detach(|| {
            s.write(local_offset, remote_offset, size, transfer_uid)
        })))
    }

    /// One transfer (one status) of many segments read from the remote side. Offsets and
    /// sizes may be lists or 1-D integer numpy arrays.
    fn batch_read(
        &self,
        py: Python<'_>,
        local_offsets: &Bound<'_, PyAny>,
        remote_offsets: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        transfer_uid: u64,
    ) -> PyResult<PyTransferStatus> {
        let (lo, ro, sz) = (
            usizes(local_offsets, "local_offsets")?,
            usizes(remote_offsets, "remote_offsets")?,
            usizes(sizes, "sizes")?,
        );
        let s = self.session()?;
        Ok(PyTransferStatus::wrap(
            py.detach(|| s.batch_read(&lo, &ro, &sz, transfer_uid)),
        ))
    }

    /// One transfer (one status) of many segments written to the remote side.
    fn batch_write(
        &self,
        py: Python<'_>,
        local_offsets: &Bound<'_, PyAny>,
        remote_offsets: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        transfer_uid: u64,
    ) -> PyResult<PyTransferStatus> {
        let (lo, ro, sz) = (
            usizes(local_offsets, "local_offsets")?,
            usizes(remote_offsets, "remote_offsets")?,
            usizes(sizes, "sizes")?,
        );
        let s = self.session()?;
        Ok(PyTransferStatus::wrap(
            py.detach(|| s.batch_write(&lo, &ro, &sz, transfer_uid)),
        ))
    }

    /// Always True for TCP sessions (MORI-IO).
    fn alive(&self) -> bool {
        self.inner.alive()
    }
}
