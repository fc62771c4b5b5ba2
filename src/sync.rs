//! The synchronisation primitives of the cross-thread types that are model-checked:
//! [`TransferStatus`](crate::TransferStatus) (`status/transfer.rs`), the target's join
//! table (`service/join.rs`) and the same-host rings' handshakes
//! (`transport/local/ring_sync.rs`). Here they are std's, re-exported as they are (no cost);
//! `tests/loom.rs` compiles those same two files against a `sync` module of its own that
//! names loom's, and runs them under its model checker.
//!
//! `model` runs a test's body: directly here, under `loom::model` there, so a unit test in
//! one of those files runs in both.

pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

/// Atomics.
pub(crate) mod atomic {
    pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
}

/// Runs `f` (once: std's threads are not model-checked).
#[cfg(test)]
pub(crate) fn model<F: Fn() + Send + Sync + 'static>(f: F) {
    f()
}
