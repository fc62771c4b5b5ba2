//! `Discovery` (feature `etcd`): engines publish their descriptors and named regions in etcd
//! under a lease, peers look them up or watch them; every etcd call runs with the GIL
//! released.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use pyo3::exceptions::{
    PyConnectionError, PyOSError, PyPermissionError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use morio::discovery::{Discovery, DiscoveryError, DiscoveryOptions, EtcdAuth, EtcdTls};
use morio::MemoryDesc;

use crate::desc::{PyEngineDesc, PyMemoryDesc};
use crate::engine::{Origin, PyIoEngine};

/// The prefix of `morio serve`'s `[discovery]` section, the default here too.
const DEFAULT_PREFIX: &str = "/morio";

/// A discovery error as the Python exception that fits it.
fn disc_err(e: DiscoveryError) -> PyErr {
    match e {
        DiscoveryError::Unreachable { .. }
        | DiscoveryError::Etcd { .. }
        | DiscoveryError::Connect { .. } => PyConnectionError::new_err(e.to_string()),
        DiscoveryError::Auth { .. } => PyPermissionError::new_err(e.to_string()),
        DiscoveryError::File { .. } => PyOSError::new_err(e.to_string()),
        DiscoveryError::RegionName(_)
        | DiscoveryError::EngineKey(_)
        | DiscoveryError::Config { .. } => PyValueError::new_err(e.to_string()),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// A positive, finite number of seconds.
fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    match Duration::try_from_secs_f64(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(PyValueError::new_err(format!(
            "{what} must be a positive number of seconds, got {s}"
        ))),
    }
}

/// `endpoints`: one string or a sequence of them, at least one.
fn endpoint_list(obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let v: Vec<String> = if let Ok(s) = obj.cast::<PyString>() {
        vec![s.to_str()?.to_string()]
    } else {
        obj.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "endpoints must be a list of \"host:port\" strings, got {}",
                type_name(obj)
            ))
        })?
    };
    if v.is_empty() || v.iter().any(|e| e.trim().is_empty()) {
        return Err(PyValueError::new_err(
            "endpoints must name at least one etcd endpoint (\"host:port\" or a URL), and none \
             empty",
        ));
    }
    Ok(v)
}

/// `regions`: a dict of name to `MemoryDesc`, or a sequence of `(name, MemoryDesc)` pairs;
/// names unique.
fn region_list(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, MemoryDesc)>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    let bad = || {
        PyTypeError::new_err(format!(
            "regions must be a dict of name to MemoryDesc or a list of (name, MemoryDesc) \
             pairs, got {}",
            type_name(obj)
        ))
    };
    let pairs: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)> = if let Ok(d) = obj.cast::<PyDict>() {
        d.iter().collect()
    } else if obj.is_instance_of::<PyString>() {
        return Err(bad());
    } else {
        obj.try_iter()
            .map_err(|_| bad())?
            .map(|item| item?.extract().map_err(|_| bad()))
            .collect::<PyResult<_>>()?
    };
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(pairs.len());
    for (name, md) in pairs {
        let name: String = name.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "region names must be str, got {}",
                type_name(&name)
            ))
        })?;
        let md = md.cast::<PyMemoryDesc>().map_err(|_| {
            PyTypeError::new_err(format!(
                "region {name:?} must be a MemoryDesc, got {}",
                type_name(&md)
            ))
        })?;
        if !seen.insert(name.clone()) {
            return Err(PyValueError::new_err(format!(
                "region {name:?} is named twice"
            )));
        }
        out.push((name, md.get().inner.clone()));
    }
    Ok(out)
}

/// The etcd user and TLS settings of the keyword arguments (ValueError for ones that cannot
/// go together; the files are read at connect).
fn access(
    user: Option<String>,
    password: Option<String>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
) -> PyResult<(Option<EtcdAuth>, Option<EtcdTls>)> {
    let auth = match (user, password) {
        (None, None) => None,
        (Some(u), _) if u.is_empty() => {
            return Err(PyValueError::new_err("user must not be empty"))
        }
        (Some(u), Some(p)) => Some(EtcdAuth::new(u, p)),
        (Some(_), None) => return Err(PyValueError::new_err("user needs password")),
        (None, Some(_)) => return Err(PyValueError::new_err("password needs user")),
    };
    let tls = match (ca_file, cert_file, key_file) {
        (None, None, None) => None,
        (None, _, _) => {
            return Err(PyValueError::new_err(
                "cert_file and key_file need ca_file (the CA of etcd's certificate)",
            ))
        }
        (Some(ca), Some(cert), Some(key)) => Some(EtcdTls::new(ca).with_client_cert(cert, key)),
        (Some(ca), None, None) => Some(EtcdTls::new(ca)),
        (Some(_), _, _) => {
            return Err(PyValueError::new_err(
                "cert_file and key_file go together (the client certificate and its key)",
            ))
        }
    };
    Ok((auth, tls))
}

/// The handle and where it was made; closed by `close()`, the last reference, or exit.
struct Cell {
    handle: RwLock<Option<Discovery>>,
    /// Its runtime thread does not exist in a forked child.
    origin: Origin,
}

impl Cell {
    /// Revoke the lease and stop the runtime. All with the GIL released, the lock too: a
    /// call in flight may wait on the runtime thread, which may be waiting for the GIL to log.
    fn close(&self, py: Python<'_>) -> Result<(), DiscoveryError> {
        py.detach(|| {
            let handle = self
                .handle
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            match handle {
                Some(d) if self.origin.is_forked() => {
                    // The parent's lease and runtime: leave them alone.
                    std::mem::forget(d);
                    Ok(())
                }
                Some(d) => d.close(),
                None => Ok(()),
            }
        })
    }

    fn is_closed(&self, py: Python<'_>) -> bool {
        py.detach(|| {
            self.handle
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_none()
        })
    }
}

/// Discovery handles alive in this process, closed at interpreter exit.
static LIVE: Mutex<Vec<Weak<Cell>>> = Mutex::new(Vec::new());

/// Close every discovery handle of this process (at exit, before the engines stop).
pub fn close_all(py: Python<'_>) {
    let cells: Vec<Arc<Cell>> =
        std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()))
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
    for c in cells {
        if let Err(e) = c.close(py) {
            log::warn!("discovery: {e}");
        }
    }
}

/// morio: discovery on etcd. Engines publish their descriptor and named memory regions
/// under `{prefix}/engines/{key}` and `{prefix}/regions/{key}/{name}`, on a lease this handle
/// keeps alive; peers `lookup` and `regions` them, or `watch` to keep an engine's registered
/// peers in step with etcd. Closing the handle (or exiting) revokes the lease: the keys go
/// at once; a process that dies loses them when the lease's TTL runs out.
#[pyclass(module = "morio", name = "Discovery", frozen)]
pub struct PyDiscovery {
    cell: Arc<Cell>,
    endpoints: Vec<String>,
    prefix: String,
}

impl Drop for PyDiscovery {
    fn drop(&mut self) {
        Python::attach(|py| {
            if let Err(e) = self.cell.close(py) {
                log::warn!("discovery: {e}");
            }
        });
    }
}

impl PyDiscovery {
    /// Run `f` on the open handle with the GIL released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Discovery) -> Result<T, DiscoveryError> + Send,
    ) -> PyResult<T> {
        if self.cell.origin.is_forked() {
            return Err(PyRuntimeError::new_err(format!(
                "this Discovery belongs to process {}: its etcd connection does not exist in \
                 a forked child; create a new Discovery in the child",
                self.cell.origin.pid()
            )));
        }
        py.detach(|| {
            let guard = self.cell.handle.read().unwrap_or_else(|e| e.into_inner());
            guard.as_ref().map(f)
        })
        .ok_or_else(|| PyRuntimeError::new_err("discovery handle is closed"))?
        .map_err(disc_err)
    }
}

#[pymethods]
impl PyDiscovery {
    /// Connect to etcd at `endpoints` ("host:port" strings or URLs); keys live under
    /// `prefix`. `lease_ttl_s` (whole seconds, default 10): how long a peer that died stays
    /// visible; `connect_timeout_s` (default 5) bounds reaching etcd here (ConnectionError
    /// after it); `request_timeout_s` (default 5) bounds every later call.
    ///
    /// A production etcd: `user` and `password` for its authentication (PermissionError
    /// when etcd refuses them, or asks for a user and none is given); `ca_file`, the PEM CA
    /// of its TLS certificate, and, where it asks clients for one, `cert_file` and
    /// `key_file` (paths; read here, OSError naming a file that cannot be read or holds no
    /// PEM; ConnectionError when the TLS handshake fails).
    ///
    /// `connect_peers=True`: `watch` also opens every connection to each peer it registers,
    /// in the background (as `IOEngine.connect_remote_engine`; failures are logged).
    #[new]
    #[pyo3(signature = (endpoints, prefix = DEFAULT_PREFIX, *, lease_ttl_s = None,
        connect_timeout_s = None, request_timeout_s = None, user = None, password = None,
        ca_file = None, cert_file = None, key_file = None, connect_peers = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        endpoints: &Bound<'_, PyAny>,
        prefix: &str,
        lease_ttl_s: Option<i64>,
        connect_timeout_s: Option<f64>,
        request_timeout_s: Option<f64>,
        user: Option<String>,
        password: Option<String>,
        ca_file: Option<PathBuf>,
        cert_file: Option<PathBuf>,
        key_file: Option<PathBuf>,
        connect_peers: bool,
    ) -> PyResult<Self> {
        let endpoints = endpoint_list(endpoints)?;
        let (auth, tls) = access(user, password, ca_file, cert_file, key_file)?;
        let mut opts = DiscoveryOptions {
            auth,
            tls,
            connect_peers,
            ..DiscoveryOptions::default()
        };
        if let Some(t) = lease_ttl_s {
            if t < 1 {
                return Err(PyValueError::new_err(format!(
                    "lease_ttl_s must be at least 1 (whole seconds), got {t}"
                )));
            }
            opts.lease_ttl = Duration::from_secs(t as u64);
        }
        if let Some(s) = connect_timeout_s {
            opts.connect_timeout = seconds("connect_timeout_s", s)?;
        }
        if let Some(s) = request_timeout_s {
            opts.request_timeout = seconds("request_timeout_s", s)?;
        }
        let d = py
            .detach(|| Discovery::connect_with(&endpoints, prefix, opts))
            .map_err(disc_err)?;
        let cell = Arc::new(Cell {
            handle: RwLock::new(Some(d)),
            origin: Origin::here(),
        });
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&cell));
        Ok(Self {
            cell,
            endpoints,
            prefix: prefix.trim_end_matches('/').to_string(),
        })
    }

    /// The key prefix (without a trailing '/').
    #[getter]
    fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether `close()` has run.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        self.cell.is_closed(py)
    }

    /// Publish `engine`'s descriptor and its named regions (a dict of name to MemoryDesc,
    /// or a list of (name, MemoryDesc) pairs) on this handle's lease. Publishing again
    /// replaces them and removes regions no longer named. Call it after `create_backend`
    /// (the descriptor then has its port). Names must be non-empty without '/', and so must
    /// the engine's key (ValueError).
    #[pyo3(signature = (engine, regions = None))]
    fn publish(
        &self,
        py: Python<'_>,
        engine: PyRef<'_, PyIoEngine>,
        regions: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let regions = region_list(regions)?;
        let engine = engine.engine()?;
        self.with(py, |d| {
            let named: Vec<(&str, &MemoryDesc)> =
                regions.iter().map(|(n, md)| (n.as_str(), md)).collect();
            d.publish(&engine, &named)
        })
    }

    /// The EngineDesc engine `key` published, or None.
    fn lookup(&self, py: Python<'_>, key: &str) -> PyResult<Option<PyEngineDesc>> {
        Ok(self
            .with(py, |d| d.lookup(key))?
            .map(|inner| PyEngineDesc { inner }))
    }

    /// The regions engine `key` published, as a dict of name to MemoryDesc (sorted by
    /// name; empty if none).
    fn regions<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (name, inner) in self.with(py, |d| d.regions(key))? {
            out.set_item(name, PyMemoryDesc { inner })?;
        }
        Ok(out)
    }

    /// Keep `engine`'s registered peers in step with the engines published under the
    /// prefix: each (but `engine` itself) is registered now or when it appears, registered
    /// again when its descriptor changes, and deregistered when its key goes (its transfers
    /// then fail). Returns once the engines there now are registered; the watch runs in the
    /// background until this handle is closed or the engine goes.
    fn watch(&self, py: Python<'_>, engine: PyRef<'_, PyIoEngine>) -> PyResult<()> {
        let engine = engine.engine()?;
        self.with(py, |d| d.watch(&engine))
    }

    /// Revoke the lease (every key this handle published goes at once) and stop watching.
    /// Later calls raise RuntimeError; closing again does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.cell.close(py).map_err(disc_err)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Close; an error closing is raised unless an exception is already on its way out
    /// (then it is logged).
    fn __exit__(
        &self,
        py: Python<'_>,
        t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        match self.cell.close(py) {
            Err(e) if t.is_none() => Err(disc_err(e)),
            Err(e) => {
                log::warn!("discovery: {e}");
                Ok(false)
            }
            Ok(()) => Ok(false),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Discovery(endpoints={:?}, prefix={:?}{})",
            self.endpoints,
            self.prefix,
            if self.cell.is_closed(py) {
                ", closed"
            } else {
                ""
            }
        )
    }
}
