//! `TransferStatus`: MORI's completion object, with waits that release the GIL and honour Ctrl-C.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use morio::{StatusCode, TransferStatus};

use crate::enums;

/// How long one GIL-free wait lasts before the thread takes the GIL back to look for a
/// pending signal (Ctrl-C); a completion ends the wait at once whatever this is.
pub const SIGNAL_SLICE: Duration = Duration::from_millis(50);

/// Completion object of one transfer (MORI-IO's `TransferStatus`).
///
/// A transfer call returns it already `IN_PROGRESS` (or terminal, for argument errors); it
/// moves to `SUCCESS` or an error code when the transfer ends. `TransferStatus()` makes a
/// fresh one in `INIT`, as MORI allows.
#[pyclass(module = "morio", name = "TransferStatus", frozen)]
pub struct PyTransferStatus {
    pub inner: Arc<TransferStatus>,
}

impl PyTransferStatus {
    pub fn wrap(inner: Arc<TransferStatus>) -> Self {
        Self { inner }
    }
}

/// Wait until `st` is not `IN_PROGRESS` or `deadline` passes, without the GIL, taking it
/// back every [`SIGNAL_SLICE`] to let a signal handler (KeyboardInterrupt) raise.
pub fn wait_status(
    py: Python<'_>,
    st: &Arc<TransferStatus>,
    deadline: Option<Instant>,
) -> PyResult<StatusCode> {
    let c = st.code();
    if c != StatusCode::InProgress {
        return Ok(c);
    }
    loop {
        let now = Instant::now();
        let slice = deadline.map_or(SIGNAL_SLICE, |d| {
            d.saturating_duration_since(now).min(SIGNAL_SLICE)
        });
        let c = py.detach(|| st.wait_for(slice));
        if c != StatusCode::InProgress || deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(c);
        }
        py.check_signals()?;
    }
}

/// Wait for every status in order against one deadline (`None` = no deadline), GIL released
/// and signals honoured as in [`wait_status`]. Returns when all are done or the deadline
/// has passed.
pub fn wait_many(
    py: Python<'_>,
    sts: &[Arc<TransferStatus>],
    deadline: Option<Instant>,
) -> PyResult<()> {
    let mut next = 0;
    while next < sts.len() {
        if !sts[next].in_progress() {
            next += 1;
            continue;
        }
        let slice_end = Instant::now() + SIGNAL_SLICE;
        let end = deadline.map_or(slice_end, |d| d.min(slice_end));
        next = py.detach(|| {
            let mut i = next;
            while i < sts.len() {
                let left = end.saturating_duration_since(Instant::now());
                if sts[i].wait_for(left) == StatusCode::InProgress {
                    break;
                }
                i += 1;
            }
            i
        });
        if next < sts.len() {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(());
            }
            py.check_signals()?;
        }
    }
    Ok(())
}

/// MORI's `timeout_ms`: `< 0` waits forever, otherwise that many milliseconds from now.
pub fn deadline_of(timeout_ms: i64) -> Option<Instant> {
    u64::try_from(timeout_ms)
        .ok()
        .and_then(|ms| Instant::now().checked_add(Duration::from_millis(ms)))
}

#[pymethods]
impl PyTransferStatus {
    /// `await status` (in a running asyncio event loop): the status's code once it is not
    /// `IN_PROGRESS`, without blocking the loop (the completion rings an `eventfd` the loop
    /// watches; see `morio.wait_async`).
    fn __await__<'py>(slf: PyRef<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let fut = py.import("morio._aio")?.call_method1("future_of", (slf,))?;
        fut.call_method0("__await__")
    }

    #[new]
    fn new() -> Self {
        Self::wrap(Arc::new(TransferStatus::new()))
    }

    /// The current code (a `StatusCode`).
    #[pyo3(name = "Code")]
    fn code(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        enums::status(py, self.inner.code())
    }

    /// The message of the outcome (empty on success).
    #[pyo3(name = "Message")]
    fn message(&self) -> String {
        self.inner.message()
    }

    /// Set code and message unless the status already holds an error (first error wins).
    #[pyo3(name = "Update")]
    fn update(&self, code: u32, message: &str) -> PyResult<()> {
        self.inner.update(enums::status_from(code)?, message);
        Ok(())
    }

    /// Code is `INIT`.
    #[pyo3(name = "Init")]
    fn init(&self) -> bool {
        self.inner.is_init()
    }

    /// Code is `IN_PROGRESS`.
    #[pyo3(name = "InProgress")]
    fn in_progress(&self) -> bool {
        self.inner.in_progress()
    }

    /// Code is `SUCCESS`.
    #[pyo3(name = "Succeeded")]
    fn succeeded(&self) -> bool {
        self.inner.succeeded()
    }

    /// Code is an error (greater than 10).
    #[pyo3(name = "Failed")]
    fn failed(&self) -> bool {
        self.inner.failed()
    }

    /// Set the code unconditionally (even over an error).
    #[pyo3(name = "SetCode")]
    fn set_code(&self, code: u32) -> PyResult<()> {
        self.inner.set_code(enums::status_from(code)?);
        Ok(())
    }

    /// Replace the message, leaving the code alone.
    #[pyo3(name = "SetMessage")]
    fn set_message(&self, message: &str) {
        self.inner.set_message(message);
    }

    /// Block until the code is not `IN_PROGRESS` and return it (GIL released; Ctrl-C
    /// raises KeyboardInterrupt).
    #[pyo3(name = "Wait")]
    fn wait(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let c = wait_status(py, &self.inner, None)?;
        enums::status(py, c)
    }

    /// MORI's `WaitFor`: `timeout_ms < 0` blocks, `0` polls once, `> 0` waits at most that
    /// long and may return `IN_PROGRESS`.
    #[pyo3(name = "WaitFor", signature = (timeout_ms = -1))]
    fn wait_for(&self, py: Python<'_>, timeout_ms: i64) -> PyResult<Py<PyAny>> {
        let c = if timeout_ms == 0 {
            self.inner.code()
        } else {
            wait_status(py, &self.inner, deadline_of(timeout_ms))?
        };
        enums::status(py, c)
    }

    fn __repr__(&self) -> String {
        let m = self.inner.message();
        if m.is_empty() {
            format!("TransferStatus({})", self.inner.code().name())
        } else {
            format!("TransferStatus({}, {m:?})", self.inner.code().name())
        }
    }
}
