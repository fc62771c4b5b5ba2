//! asyncio support: a notifier an event loop watches (an `eventfd` it reads when readable)
//! and that statuses ring when they complete, from the engine's shard threads, without the
//! GIL. `morio/_aio.py` keeps one per event loop and turns its tokens into futures.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

use crate::status::PyTransferStatus;

/// Tokens of completed statuses, and the `eventfd` that says there are some.
struct Notifier {
    fd: OwnedFd,
    done: Mutex<Vec<u64>>,
    next: AtomicU64,
}

impl Notifier {
    /// A status completed: queue its token; the first in an empty queue rings the fd (the
    /// reader drains the fd before the queue, so no token is left unannounced).
    fn push(&self, token: u64) {
        let first = {
            let mut q = self.done.lock().unwrap_or_else(|e| e.into_inner());
            q.push(token);
            q.len() == 1
        };
        if first {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer to our eventfd; a full counter
            // (EAGAIN) still leaves it readable, which is all the reader needs.
            let _ = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
    }
}

/// A per-event-loop notifier (`morio._aio` makes one per loop; not for direct use).
#[pyclass(module = "morio", name = "_Notifier", frozen)]
pub struct PyNotifier {
    inner: Arc<Notifier>,
}

#[pymethods]
impl PyNotifier {
    #[new]
    fn new() -> PyResult<Self> {
        // SAFETY: plain system call; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(PyOSError::new_err(format!(
                "eventfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Self {
            inner: Arc::new(Notifier {
                // SAFETY: a fresh descriptor nobody else owns.
                fd: unsafe { OwnedFd::from_raw_fd(fd) },
                done: Mutex::new(Vec::new()),
                next: AtomicU64::new(0),
            }),
        })
    }

    /// The descriptor the event loop watches for reading.
    fn fileno(&self) -> i32 {
        self.inner.fd.as_raw_fd()
    }

    /// A token that [`Self::drain`] returns once `status` is terminal (at once if it is).
    fn watch(&self, status: PyRef<'_, PyTransferStatus>) -> u64 {
        let token = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let n = self.inner.clone();
        status.inner.on_complete(move || n.push(token));
        token
    }

    /// The tokens of the statuses completed since the last call (the fd is read first).
    fn drain(&self) -> Vec<u64> {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer from our non-blocking eventfd.
        let _ = unsafe { libc::read(self.inner.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        std::mem::take(&mut *self.inner.done.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
