//! `IOEngine`: MORI-IO's engine object over morio's Rust engine. Every call that submits,
//! waits or talks to the shards runs with the GIL released.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Once, RwLock, Weak};
use std::time::Duration;

use pyo3::exceptions::{
    PyConnectionError, PyNotImplementedError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyList;

use morio::{
    BackendType, EngineError, IoEngine, MemoryDesc, MemoryLocationType, RegisterOptions,
    TransferStatus,
};

use crate::config::{
    PyFabricBackendConfig, PyIoEngineConfig, PyRdmaBackendConfig, PyTcpBackendConfig,
    PyXgmiBackendConfig,
};
use crate::desc::{PyEngineDesc, PyMemoryDesc};
use crate::enums;
use crate::memory::{self, Keep, Memory};
use crate::seq::usizes;
use crate::session::PyIoEngineSession;
use crate::status::{deadline_of, wait_many, PyTransferStatus, SIGNAL_SLICE};

/// An engine error as the Python exception that fits it.
pub fn engine_err(e: EngineError) -> PyErr {
    match e {
        EngineError::Config(c) => PyValueError::new_err(c.to_string()),
        EngineError::BadRemoteAddress { .. }
        | EngineError::UnknownMemory(_)
        | EngineError::UnknownRemote(_)
        | EngineError::RegionTooLarge { .. } => PyValueError::new_err(e.to_string()),
        EngineError::Connect { .. } => PyConnectionError::new_err(e.to_string()),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// The engine and what its registrations keep alive; shut down by `close()`, by the last
/// reference going away, or at interpreter exit.
pub struct EngineCell {
    engine: RwLock<Option<Arc<IoEngine>>>,
    keep: Mutex<HashMap<u32, Keep>>,
    /// Where the engine was made: its shard threads do not survive a fork.
    origin: Origin,
}

/// Forks this process has been through (bumped in the child by a `pthread_atfork` hook):
/// an engine made at another count belongs to an ancestor. A load, not a `getpid` syscall,
/// on every call (syscalls are slow under gVisor, where the GPU host runs).
static FORKS: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_fork_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Count forks from now on (called once at import).
pub fn install_fork_hook() {
    static ONCE: Once = Once::new();
    // SAFETY: registers a handler that only touches an atomic; valid for the process's life.
    ONCE.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(on_fork_child));
    });
}

/// Where an engine was made: its process id (for messages) and the fork count then.
#[derive(Clone, Copy)]
pub struct Origin {
    pid: u32,
    forks: u32,
}

impl Origin {
    pub fn here() -> Self {
        Self {
            pid: std::process::id(),
            forks: FORKS.load(Ordering::Relaxed),
        }
    }

    /// Whether this is a process forked after the origin (whose threads it lacks).
    pub fn is_forked(self) -> bool {
        FORKS.load(Ordering::Relaxed) != self.forks
    }

    /// The process id where it was made.
    pub fn pid(self) -> u32 {
        self.pid
    }

    /// `Err` in a process forked after the engine was made.
    pub fn check(self) -> PyResult<()> {
        if self.is_forked() {
            Err(forked(self.pid))
        } else {
            Ok(())
        }
    }
}

/// The error of an engine (or session) used in a process forked from the one that made it.
pub fn forked(pid: u32) -> PyErr {
    PyRuntimeError::new_err(format!(
        "this engine belongs to process {pid}: its shard threads do not exist in a forked \
         child; create a new IOEngine in the child (or start children with the 'spawn' method)"
    ))
}

impl EngineCell {
    fn get(&self) -> PyResult<Arc<IoEngine>> {
        self.origin.check()?;
        self.engine
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("engine is closed"))
    }

    /// Stop the engine (its shards, connections and transfers) with the GIL released, then
    /// drop what its registrations kept alive.
    fn shutdown(&self, py: Python<'_>) {
        let engine = self
            .engine
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(engine) = engine {
            if self.origin.check().is_ok() {
                py.detach(move || drop(engine));
            } else {
                // A forked child: the shard threads this would stop and join are the
                // parent's. Leave the parent's engine untouched.
                std::mem::forget(engine);
            }
        }
        let keep = std::mem::take(&mut *self.keep.lock().unwrap_or_else(|e| e.into_inner()));
        drop(keep);
    }
}

/// Engines alive in this process, so that interpreter exit can stop their shards before
/// Python goes away (a shard thread that logs needs the interpreter).
static LIVE: Mutex<Vec<Weak<EngineCell>>> = Mutex::new(Vec::new());

/// Stop every engine of this process (registered with `atexit` by the package).
#[pyfunction]
pub fn _shutdown_all(py: Python<'_>) {
    // Discovery handles first: their leases go, so peers forget these engines at once.
    #[cfg(feature = "etcd")]
    crate::discovery::close_all(py);
    let cells: Vec<Arc<EngineCell>> = {
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        let v = live.iter().filter_map(Weak::upgrade).collect();
        live.clear();
        v
    };
    for c in cells {
        c.shutdown(py);
    }
}

/// One engine per process endpoint, named by a unique key (MORI-IO's `IOEngine`).
///
/// Create it, `create_backend(BackendType.TCP)`, register memory, exchange `EngineDesc`
/// and `MemoryDesc` bytes with peers out of band, then read and write their memory. Every
/// transfer call returns at once with a `TransferStatus`.
#[pyclass(module = "morio", name = "IOEngine", frozen)]
pub struct PyIoEngine {
    cell: Arc<EngineCell>,
}

impl Drop for PyIoEngine {
    fn drop(&mut self) {
        // Shards may be waiting for the GIL (to log): stop them without it.
        Python::attach(|py| self.cell.shutdown(py));
    }
}

fn desc_ref<'a>(obj: &'a Bound<'_, PyAny>, what: &str) -> PyResult<&'a MemoryDesc> {
    obj.cast::<PyMemoryDesc>()
        .map(|d| &d.get().inner)
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "{what} must be a MemoryDesc, got {}",
                obj.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })
}

fn statuses(py: Python<'_>, v: Vec<Arc<TransferStatus>>) -> PyResult<Vec<Py<PyTransferStatus>>> {
    v.into_iter()
        .map(|s| Py::new(py, PyTransferStatus::wrap(s)))
        .collect()
}

fn list_of<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if obj.is_instance_of::<pyo3::types::PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be a sequence, got str"
        )));
    }
    obj.try_iter()
        .map_err(|_| PyTypeError::new_err(format!("{what} must be a sequence")))?
        .collect()
}

impl PyIoEngine {
    pub(crate) fn engine(&self) -> PyResult<Arc<IoEngine>> {
        self.cell.get()
    }

    /// Register `m`; `local_only`: no peer may read or write it.
    fn register(&self, py: Python<'_>, m: Memory, local_only: bool) -> PyResult<PyMemoryDesc> {
        let engine = self.engine()?;
        if m.ptr == 0 && m.size > 0 {
            return Err(PyValueError::new_err("cannot register a null pointer"));
        }
        let (ptr, size, dev, loc) = (m.ptr, m.size, m.device_id, m.loc);
        let opts = RegisterOptions { local_only };
        // SAFETY: the memory is the caller's (register_memory) or kept alive by `m.keep`
        // until deregistration or engine shutdown, both of which wait for the engine to stop
        // using it before dropping the keep.
        let desc = py
            .detach(move || unsafe {
                engine.register_memory_with(ptr as *mut u8, size, dev, loc, opts)
            })
            .map_err(engine_err)?;
        self.cell
            .keep
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(desc.id, m.keep);
        Ok(PyMemoryDesc { inner: desc })
    }

    /// `args`: MORI's six batch arguments in order (local descs, local offsets, remote
    /// descs, remote offsets, sizes, uids).
    fn batch(
        &self,
        py: Python<'_>,
        write: bool,
        args: [&Bound<'_, PyAny>; 6],
    ) -> PyResult<Vec<Py<PyTransferStatus>>> {
        let [local, local_offsets, remote, remote_offsets, sizes, transfer_uids] = args;
        let engine = self.engine()?;
        let uids: Vec<u64> = usizes(transfer_uids, "transfer_uids")?
            .into_iter()
            .map(|u| u as u64)
            .collect();
        let n = uids.len();
        let lists = [
            ("local_mem_descs", list_of(local, "local_mem_descs")?),
            ("local_offsets", list_of(local_offsets, "local_offsets")?),
            ("remote_mem_descs", list_of(remote, "remote_mem_descs")?),
            ("remote_offsets", list_of(remote_offsets, "remote_offsets")?),
            ("sizes", list_of(sizes, "sizes")?),
        ];
        for (name, l) in &lists {
            if l.len() != n {
                return Err(PyValueError::new_err(format!(
                    "{name} has {} entries but transfer_uids has {n}: every outer list \
                     holds one entry per transfer",
                    l.len()
                )));
            }
        }
        let [(_, lm), (_, lo), (_, rm), (_, ro), (_, sz)] = &lists;
        let mut ld = Vec::with_capacity(n);
        let mut rd = Vec::with_capacity(n);
        let (mut los, mut ros, mut szs) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for i in 0..n {
            ld.push(desc_ref(&lm[i], "local_mem_descs[i]")?.clone());
            rd.push(desc_ref(&rm[i], "remote_mem_descs[i]")?.clone());
            los.push(usizes(&lo[i], "local_offsets[i]")?);
            ros.push(usizes(&ro[i], "remote_offsets[i]")?);
            szs.push(usizes(&sz[i], "sizes[i]")?);
        }
        let out = py.detach(|| {
            if write {
                engine.batch_write(&ld, &los, &rd, &ros, &szs, &uids)
            } else {
                engine.batch_read(&ld, &los, &rd, &ros, &szs, &uids)
            }
        });
        statuses(py, out)
    }
}

// The transfer methods take MORI's Python signatures (six arguments), plus `self` and the
// GIL token.
#[allow(clippy::too_many_arguments)]
#[pymethods]
impl PyIoEngine {
    /// A new engine named `key` that will listen on `config.host:config.port`.
    #[new]
    fn new(key: &str, config: PyRef<'_, PyIoEngineConfig>) -> PyResult<Self> {
        let engine = IoEngine::new(key, config.to_rust()).map_err(engine_err)?;
        let cell = Arc::new(EngineCell {
            engine: RwLock::new(Some(Arc::new(engine))),
            keep: Mutex::new(HashMap::new()),
            origin: Origin::here(),
        });
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&cell));
        Ok(Self { cell })
    }

    /// This engine's descriptor (fetch it after `create_backend`: the port may change).
    fn get_engine_desc(&self) -> PyResult<PyEngineDesc> {
        Ok(PyEngineDesc {
            inner: self.engine()?.engine_desc(),
        })
    }

    /// Create a backend. morio implements `BackendType.TCP` (config: `TcpBackendConfig`, or
    /// None for the defaults); other types raise `NotImplementedError`.
    #[pyo3(signature = (r#type, config = None))]
    fn create_backend(
        &self,
        py: Python<'_>,
        r#type: u32,
        config: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ty = enums::backend_from(r#type)?;
        if ty != BackendType::Tcp {
            return Err(PyNotImplementedError::new_err(format!(
                "morio implements the TCP backend only; BackendType.{} is not available \
                 (create_backend(BackendType.TCP, TcpBackendConfig(...)))",
                ty.name()
            )));
        }
        let cfg = match config {
            None => PyTcpBackendConfig::default_config(),
            Some(c) => match c.cast::<PyTcpBackendConfig>() {
                Ok(c) => c.borrow().validated()?,
                Err(_) => {
                    let other = c.is_instance_of::<PyRdmaBackendConfig>()
                        || c.is_instance_of::<PyXgmiBackendConfig>()
                        || c.is_instance_of::<PyFabricBackendConfig>();
                    return Err(PyTypeError::new_err(if other {
                        "BackendType.TCP takes a TcpBackendConfig (morio implements TCP only)"
                            .to_string()
                    } else {
                        format!(
                            "config must be a TcpBackendConfig or None, got {}",
                            c.get_type()
                                .name()
                                .map(|n| n.to_string())
                                .unwrap_or_default()
                        )
                    }));
                }
            },
        };
        let engine = self.engine()?;
        py.detach(|| engine.create_backend(cfg)).map_err(engine_err)
    }

    /// Remove a backend (its shards stop; transfers in flight end with ERR_BAD_STATE).
    fn remove_backend(&self, py: Python<'_>, r#type: u32) -> PyResult<()> {
        let ty = enums::backend_from(r#type)?;
        let engine = self.engine()?;
        py.detach(|| engine.remove_backend(ty)).map_err(engine_err)
    }

    /// Make a peer reachable by its descriptor (a later call with the same key replaces it).
    fn register_remote_engine(&self, engine_desc: PyRef<'_, PyEngineDesc>) -> PyResult<()> {
        self.engine()?
            .register_remote_engine(&engine_desc.inner)
            .map_err(engine_err)
    }

    /// Open every connection (lane) to the registered peer `remote_key` now instead of on
    /// its first transfers, and wait at most `timeout_ms` until each is up (dialed,
    /// authenticated, same-host where that applies). Returns each lane's transport:
    /// `"tcp"`, `"same-host"` or `"same-host-ring"`. Raises `ConnectionError` when a lane
    /// cannot be opened in time (unreachable, refused, another `auth_secret`), `ValueError`
    /// for a key never registered.
    #[pyo3(signature = (remote_key, timeout_ms = 10000))]
    fn connect_remote_engine(
        &self,
        py: Python<'_>,
        remote_key: &str,
        timeout_ms: u64,
    ) -> PyResult<Vec<&'static str>> {
        let engine = self.engine()?;
        let key = remote_key.to_string();
        let lanes = py
            .detach(|| engine.connect_remote_engine(&key, Duration::from_millis(timeout_ms)))
            .map_err(engine_err)?;
        Ok(lanes.into_iter().map(|t| t.name()).collect())
    }

    /// Forget a peer and close its connections; its transfers in flight fail.
    fn deregister_remote_engine(
        &self,
        py: Python<'_>,
        engine_desc: PyRef<'_, PyEngineDesc>,
    ) -> PyResult<()> {
        let engine = self.engine()?;
        let d = engine_desc.inner.clone();
        py.detach(|| engine.deregister_remote_engine(&d));
        Ok(())
    }

    /// Register `size` bytes at address `ptr` (MORI's form: the caller keeps the memory
    /// valid until `deregister_memory`). `device_id` is -1 for CPU memory. `local_only`:
    /// no peer may read or write it (its descriptor carries no access key); it is still the
    /// local side of this engine's transfers.
    #[pyo3(signature = (ptr, size, device_id, mem_loc, *, local_only = false))]
    fn register_memory(
        &self,
        py: Python<'_>,
        ptr: u64,
        size: usize,
        device_id: i32,
        mem_loc: u32,
        local_only: bool,
    ) -> PyResult<PyMemoryDesc> {
        let loc = enums::location_from(mem_loc)?;
        if loc == MemoryLocationType::Unknown {
            return Err(PyValueError::new_err(
                "mem_loc must be MemoryLocationType.CPU or MemoryLocationType.GPU",
            ));
        }
        self.register(
            py,
            Memory {
                ptr,
                size,
                device_id,
                loc,
                keep: Keep::Object(py.None()),
            },
            local_only,
        )
    }

    /// Register a contiguous torch tensor (CPU or CUDA); the registration keeps it alive.
    /// `local_only`: as for `register_memory`.
    #[pyo3(signature = (tensor, *, local_only = false))]
    fn register_torch_tensor(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        local_only: bool,
    ) -> PyResult<PyMemoryDesc> {
        if !memory::is_torch_tensor(tensor) {
            return Err(PyTypeError::new_err(format!(
                "register_torch_tensor takes a torch.Tensor, got {} (use register_array for \
                 numpy, DLPack or buffer objects)",
                tensor
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            )));
        }
        let m = memory::from_torch(tensor)?;
        self.register(py, m, local_only)
    }

    /// Register any contiguous array: a torch tensor, an object with `__dlpack__` (numpy,
    /// cupy, JAX…) or a writable buffer (bytearray, mmap, array.array). The registration
    /// keeps it alive until `deregister_memory`. `local_only`: as for `register_memory`.
    #[pyo3(signature = (array, *, local_only = false))]
    fn register_array(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        local_only: bool,
    ) -> PyResult<PyMemoryDesc> {
        let m = memory::from_object(array)?;
        self.register(py, m, local_only)
    }

    /// Deregister memory; returns once no transfer is placing into or sending from it, then
    /// releases what the registration kept alive.
    fn deregister_memory(&self, py: Python<'_>, mem_desc: PyRef<'_, PyMemoryDesc>) -> PyResult<()> {
        let engine = self.engine()?;
        let d = mem_desc.inner.clone();
        py.detach(|| engine.deregister_memory(&d))
            .map_err(engine_err)?;
        let keep = self
            .cell
            .keep
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&d.id);
        drop(keep);
        Ok(())
    }

    /// A fresh transfer uid (engine-wide counter from 0).
    fn allocate_transfer_uid(&self) -> PyResult<u64> {
        Ok(self.engine()?.allocate_transfer_uid())
    }

    /// Read `size` bytes at `remote_offset` of `remote_src_mem_desc` into
    /// `local_dest_mem_desc` at `local_offset`.
    fn read(
        &self,
        py: Python<'_>,
        local_dest_mem_desc: &Bound<'_, PyAny>,
        local_offset: usize,
        remote_src_mem_desc: &Bound<'_, PyAny>,
        remote_offset: usize,
        size: usize,
        transfer_uid: u64,
    ) -> PyResult<PyTransferStatus> {
        let engine = self.engine()?;
        let l = desc_ref(local_dest_mem_desc, "local_dest_mem_desc")?;
        let r = desc_ref(remote_src_mem_desc, "remote_src_mem_desc")?;
        let st = py.detach(|| engine.read(l, local_offset, r, remote_offset, size, transfer_uid));
        Ok(PyTransferStatus::wrap(st))
    }

    /// Write `size` bytes at `local_offset` of `local_src_mem_desc` to
    /// `remote_dest_mem_desc` at `remote_offset`.
    fn write(
        &self,
        py: Python<'_>,
        local_src_mem_desc: &Bound<'_, PyAny>,
        local_offset: usize,
        remote_dest_mem_desc: &Bound<'_, PyAny>,
        remote_offset: usize,
        size: usize,
        transfer_uid: u64,
    ) -> PyResult<PyTransferStatus> {
        let engine = self.engine()?;
        let l = desc_ref(local_src_mem_desc, "local_src_mem_desc")?;
        let r = desc_ref(remote_dest_mem_desc, "remote_dest_mem_desc")?;
        let st = py.detach(|| engine.write(l, local_offset, r, remote_offset, size, transfer_uid));
        Ok(PyTransferStatus::wrap(st))
    }

    /// MORI's `batch_read`: entry i of every outer list is one transfer (its own uid and
    /// status) of the segments `local_offsets[i][j]`, `remote_offsets[i][j]`, `sizes[i][j]`.
    /// Inner sequences may be lists or 1-D integer numpy arrays.
    fn batch_read(
        &self,
        py: Python<'_>,
        local_mem_descs: &Bound<'_, PyAny>,
        local_offsets: &Bound<'_, PyAny>,
        remote_mem_descs: &Bound<'_, PyAny>,
        remote_offsets: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        transfer_uids: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Py<PyTransferStatus>>> {
        self.batch(
            py,
            false,
            [
                local_mem_descs,
                local_offsets,
                remote_mem_descs,
                remote_offsets,
                sizes,
                transfer_uids,
            ],
        )
    }

    /// MORI's `batch_write`, shaped as `batch_read`.
    fn batch_write(
        &self,
        py: Python<'_>,
        local_mem_descs: &Bound<'_, PyAny>,
        local_offsets: &Bound<'_, PyAny>,
        remote_mem_descs: &Bound<'_, PyAny>,
        remote_offsets: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        transfer_uids: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Py<PyTransferStatus>>> {
        self.batch(
            py,
            true,
            [
                local_mem_descs,
                local_offsets,
                remote_mem_descs,
                remote_offsets,
                sizes,
                transfer_uids,
            ],
        )
    }

    /// A session over a (local, remote) pair, or None when no backend exists (MORI-IO).
    fn create_session(
        &self,
        local_mem_desc: &Bound<'_, PyAny>,
        remote_mem_desc: &Bound<'_, PyAny>,
    ) -> PyResult<Option<PyIoEngineSession>> {
        let l = desc_ref(local_mem_desc, "local_mem_desc")?;
        let r = desc_ref(remote_mem_desc, "remote_mem_desc")?;
        if r.engine_key.is_empty() {
            // MORI's TCP backend cannot handle a remote without an engine: no session.
            return Ok(None);
        }
        Ok(self
            .engine()?
            .create_session(l, r)
            .map(|s| PyIoEngineSession::new(Arc::new(s), self.cell.origin)))
    }

    /// Remove and return how transfer `transfer_uid` from engine `remote_key` ended here
    /// (as its target), or None if it has not ended, was popped, or aged out.
    fn pop_inbound_transfer_status(
        &self,
        py: Python<'_>,
        remote_key: &str,
        transfer_uid: u64,
    ) -> PyResult<Option<PyTransferStatus>> {
        let engine = self.engine()?;
        let st = py.detach(|| engine.pop_inbound_transfer_status(remote_key, transfer_uid));
        Ok(st.map(|s| PyTransferStatus::wrap(Arc::new(s))))
    }

    /// `pop_inbound_transfer_status`, waiting at most `timeout_ms` (-1: without end) for the
    /// transfer to end here if it has not yet; None once the time is up. The GIL is released
    /// and Ctrl-C honoured, as in `Wait()`.
    #[pyo3(signature = (remote_key, transfer_uid, timeout_ms = -1))]
    fn wait_inbound_transfer_status(
        &self,
        py: Python<'_>,
        remote_key: &str,
        transfer_uid: u64,
        timeout_ms: i64,
    ) -> PyResult<Option<PyTransferStatus>> {
        let engine = self.engine()?;
        let deadline = deadline_of(timeout_ms);
        loop {
            let slice = match deadline {
                None => SIGNAL_SLICE,
                Some(d) => d
                    .saturating_duration_since(std::time::Instant::now())
                    .min(SIGNAL_SLICE),
            };
            let st =
                py.detach(|| engine.wait_inbound_transfer_status(remote_key, transfer_uid, slice));
            if let Some(s) = st {
                return Ok(Some(PyTransferStatus::wrap(Arc::new(s))));
            }
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(None);
            }
            py.check_signals()?;
        }
    }

    /// MORI's `WaitAll`: waits (GIL released, Ctrl-C honoured) and returns the first error in
    /// list order, else SUCCESS; with `timeout_ms >= 0`, IN_PROGRESS if the time ran out
    /// with a transfer pending and no error seen. None entries are skipped.
    #[pyo3(signature = (statuses, timeout_ms = -1))]
    fn wait_all(
        &self,
        py: Python<'_>,
        statuses: &Bound<'_, PyAny>,
        timeout_ms: i64,
    ) -> PyResult<Py<PyAny>> {
        let mut v = Vec::new();
        for (i, s) in list_of(statuses, "statuses")?.iter().enumerate() {
            if s.is_none() {
                continue;
            }
            let st = s.cast::<PyTransferStatus>().map_err(|_| {
                PyTypeError::new_err(format!("statuses[{i}] is not a TransferStatus"))
            })?;
            v.push(st.get().inner.clone());
        }
        if timeout_ms != 0 {
            wait_many(py, &v, deadline_of(timeout_ms))?;
        }
        enums::status(py, morio::wait_all(&v, 0))
    }

    /// morio: stop the engine now (shards, connections; transfers in flight end with
    /// ERR_BAD_STATE) and release every registration. Later calls raise RuntimeError.
    fn close(&self, py: Python<'_>) {
        self.cell.shutdown(py);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.cell.shutdown(py);
        false
    }

    /// morio: the number of shards the backend runs (0 before `create_backend`).
    fn num_shards(&self) -> PyResult<usize> {
        Ok(self.engine()?.n_shards())
    }

    /// morio: the CPU each shard is pinned to (None entries when unpinned).
    fn shard_cpus(&self) -> PyResult<Vec<Option<usize>>> {
        Ok(self.engine()?.shard_cpus())
    }

    /// morio: counters of the engine's shards as a list of dicts (empty before
    /// `create_backend`); each has `peers`, that shard's counters per peer (see `peer_stats`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let engine = self.engine()?;
        let stats = py.detach(|| engine.stats());
        crate::stats::shards(py, stats.as_ref())
    }

    /// morio: counters per peer (remote engine key), summed over shards: transfers this
    /// engine started with it (`transfers_ok`, `transfers_failed`), payload bytes
    /// (`bytes_sent`, `bytes_received`: both roles; `inbound_bytes_written`,
    /// `inbound_bytes_read`: the peer's own transfers), `inbound_transfers`, lane connects and
    /// failures in all and per lane index (`lanes`). Empty before `create_backend`. At most
    /// 1024 peers per shard; later ones are counted under `"_other"`.
    fn peer_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let engine = self.engine()?;
        let stats = py.detach(|| engine.stats());
        crate::stats::peers(py, stats.as_ref())
    }

    /// morio: the engine's statistics in the Prometheus text exposition format (version
    /// 0.0.4), for a `/metrics` endpoint of the embedding application (only
    /// `morio_backend_up 0` before `create_backend`). `peers=False` leaves out the per-peer
    /// families (`morio_peer_*`, labelled with the peers' engine keys).
    #[pyo3(signature = (*, peers = true))]
    fn metrics(&self, py: Python<'_>, peers: bool) -> PyResult<String> {
        let engine = self.engine()?;
        Ok(py.detach(|| match peers {
            true => engine.metrics_text(),
            false => engine.metrics_text_without_peers(),
        }))
    }

    fn __repr__(&self) -> String {
        match self.engine() {
            Ok(e) => format!("IOEngine(key={:?}, shards={})", e.key(), e.n_shards()),
            Err(_) => "IOEngine(<closed>)".to_string(),
        }
    }
}
