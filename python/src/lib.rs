//! morio's Python extension (`morio._morio`): MORI-IO's Python API over the Rust engine.
//!
//! The pure-Python package `morio` re-exports these names; see `python/README.md`.

// pyclasses are Python-facing: their repr is what users see, not Debug.
#![allow(missing_debug_implementations)]

mod aio;
mod config;
mod desc;
#[cfg(feature = "etcd")]
mod discovery;
mod engine;
mod enums;
mod log;
mod memory;
mod seq;
mod session;
mod stats;
mod status;

use std::time::Duration;

use pyo3::prelude::*;

/// How long `Wait`, `WaitFor` and `wait_all` spin on a status before sleeping on it, in
/// µs (process-wide). Longer spins catch small transfers without a thread wake-up at the
/// cost of the waiting core. By default the window adapts to how soon recent waits were
/// answered; `set_wait_spin_adaptive()` goes back to that.
#[pyfunction]
fn set_wait_spin_us(us: u64) {
    morio::status::set_wait_spin(Duration::from_micros(us));
}

/// Let waits spin as long as recent completion times justify (the default; undoes
/// `set_wait_spin_us`).
#[pyfunction]
fn set_wait_spin_adaptive() {
    morio::status::set_wait_spin_adaptive();
}

/// morio: check that this host or container can run engines (io_uring allowed, enough
/// locked memory); raises `RuntimeError` saying what to change if not.
#[pyfunction]
fn check_host() -> PyResult<()> {
    morio::check_host().map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}

/// morio: whether engines of this process can use the same-host transport with engines of
/// the same user on this host: None when they can, else the reason (they use TCP then).
#[pyfunction]
fn same_host_unavailable() -> Option<String> {
    morio::check_same_host().err()
}

/// morio: whether same-host connections of this process carry small frames through
/// shared-memory rings: None when they do, else the reason (the socket carries them then).
#[pyfunction]
fn same_host_rings_unavailable() -> Option<String> {
    morio::check_same_host_rings().err()
}

/// morio: whether GPU memory moves device to device between engines of this host (the GPU
/// runtime exports memory for IPC): None when it does, else the reason (it is staged then).
#[pyfunction]
fn gpu_ipc_unavailable() -> Option<String> {
    morio::gpu::check_ipc().err()
}

/// MORI's FABRIC allocator: morio implements TCP only, so this raises NotImplementedError.
#[pyfunction]
#[pyo3(signature = (size, device))]
fn fabric_alloc(size: usize, device: i32) -> PyResult<u64> {
    let _ = (size, device);
    Err(pyo3::exceptions::PyNotImplementedError::new_err(
        "fabric_alloc: morio implements the TCP backend only (no FABRIC memory); allocate with \
         torch or numpy and register the array",
    ))
}

/// MORI's FABRIC allocator: morio implements TCP only, so this raises NotImplementedError.
#[pyfunction]
fn fabric_free(ptr: u64) -> PyResult<()> {
    let _ = ptr;
    Err(pyo3::exceptions::PyNotImplementedError::new_err(
        "fabric_free: morio implements the TCP backend only (no FABRIC memory)",
    ))
}

#[pymodule]
fn _morio(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    engine::install_fork_hook();
    log::init(py)?;
    let e = enums::get(py)?;
    m.add("StatusCode", e.status_code.clone_ref(py))?;
    m.add("BackendType", e.backend_type.clone_ref(py))?;
    m.add("MemoryLocationType", e.memory_location_type.clone_ref(py))?;
    m.add("PollCqMode", e.poll_cq_mode.clone_ref(py))?;
    m.add_class::<config::PyIoEngineConfig>()?;
    m.add_class::<config::PyTcpBackendConfig>()?;
    m.add_class::<config::PyRdmaBackendConfig>()?;
    m.add_class::<config::PyXgmiBackendConfig>()?;
    m.add_class::<config::PyFabricBackendConfig>()?;
    m.add_class::<desc::PyEngineDesc>()?;
    m.add_class::<desc::PyMemoryDesc>()?;
    m.add_class::<status::PyTransferStatus>()?;
    m.add_class::<aio::PyNotifier>()?;
    m.add_class::<engine::PyIoEngine>()?;
    m.add_class::<session::PyIoEngineSession>()?;
    #[cfg(feature = "etcd")]
    m.add_class::<discovery::PyDiscovery>()?;
    m.add_function(wrap_pyfunction!(log::set_log_level, m)?)?;
    m.add_function(wrap_pyfunction!(set_wait_spin_us, m)?)?;
    m.add_function(wrap_pyfunction!(set_wait_spin_adaptive, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_ipc_unavailable, m)?)?;
    m.add_function(wrap_pyfunction!(check_host, m)?)?;
    m.add_function(wrap_pyfunction!(same_host_unavailable, m)?)?;
    m.add_function(wrap_pyfunction!(same_host_rings_unavailable, m)?)?;
    m.add_function(wrap_pyfunction!(fabric_alloc, m)?)?;
    m.add_function(wrap_pyfunction!(fabric_free, m)?)?;
    m.add_function(wrap_pyfunction!(engine::_shutdown_all, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("GPU_RUNTIMES", gpu_runtimes())?;
    Ok(())
}

/// The GPU runtimes this build can load ("cuda", "hip").
fn gpu_runtimes() -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg!(feature = "cuda") {
        v.push("cuda");
    }
    if cfg!(feature = "hip") {
        v.push("hip");
    }
    v
}
