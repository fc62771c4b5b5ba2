//! Transfers on an engine: uids, single and batched reads and writes, sessions, inbound
//! statuses and `wait_all`. Each call builds an [`Xfer`] or [`Batch`] and hands it to the
//! submission path in [`crate::submit`].

use std::sync::Arc;

use crate::desc::MemoryDesc;
use crate::proto::frame::Op;
use crate::session::IoEngineSession;
use crate::status::{wait_all, StatusCode, TransferStatus};
use crate::submit::{lock, Batch, Segments, Xfer};

use super::IoEngine;

impl IoEngine {
    /// A fresh transfer uid (engine-wide counter from 0; 64-bit, so it does not wrap where
    /// MORI-IO's 32-bit counter does).
    pub fn allocate_transfer_uid(&self) -> u64 {
        self.core.allocate_uid()
    }

    /// Read `size` bytes at `remote_off` of `remote` into `local` at `local_off`.
    pub fn read(
        &self,
        local: &MemoryDesc,
        local_off: usize,
        remote: &MemoryDesc,
        remote_off: usize,
        size: usize,
        uid: u64,
    ) -> Arc<TransferStatus> {
        self.core.submit(Xfer {
            op: Op::Read,
            local,
            remote,
            segs: Segments::one(local_off, remote_off, size),
            uid,
        })
    }

    /// Write `size` bytes at `local_off` of `local` to `remote` at `remote_off`.
    pub fn write(
        &self,
        local: &MemoryDesc,
        local_off: usize,
        remote: &MemoryDesc,
        remote_off: usize,
        size: usize,
        uid: u64,
    ) -> Arc<TransferStatus> {
        self.core.submit(Xfer {
            op: Op::Write,
            local,
            remote,
            segs: Segments::one(local_off, remote_off, size),
            uid,
        })
    }

    /// MORI's `batch_read`: entry *i* of every outer list forms one transfer (its own uid and
    /// status) of the segments `local_offs[i][j]`, `remote_offs[i][j]`, `sizes[i][j]`.
    pub fn batch_read(
        &self,
        local: &[MemoryDesc],
        local_offs: &[Vec<usize>],
        remote: &[MemoryDesc],
        remote_offs: &[Vec<usize>],
        sizes: &[Vec<usize>],
        uids: &[u64],
    ) -> Vec<Arc<TransferStatus>> {
        self.core.submit_batch(Batch {
            op: Op::Read,
            local,
            local_offs,
            remote,
            remote_offs,
            sizes,
            uids,
        })
    }

    /// MORI's `batch_write`, shaped as [`Self::batch_read`].
    pub fn batch_write(
        &self,
        local: &[MemoryDesc],
        local_offs: &[Vec<usize>],
        remote: &[MemoryDesc],
        remote_offs: &[Vec<usize>],
        sizes: &[Vec<usize>],
        uids: &[u64],
    ) -> Vec<Arc<TransferStatus>> {
        self.core.submit_batch(Batch {
            op: Op::Write,
            local,
            local_offs,
            remote,
            remote_offs,
            sizes,
            uids,
        })
    }

    /// A session over a (local, remote) pair; `None` without a backend (MORI-IO).
    pub fn create_session(
        &self,
        local: &MemoryDesc,
        remote: &MemoryDesc,
    ) -> Option<IoEngineSession> {
        self.core.backend()?;
        Some(IoEngineSession::new(
            self.core.clone(),
            local.clone(),
            remote.clone(),
        ))
    }

    /// Remove and return how transfer `uid` from engine `remote_key` ended here (as target).
    /// `None` if it has not ended, was popped already, or aged out.
    pub fn pop_inbound_transfer_status(
        &self,
        remote_key: &str,
        uid: u64,
    ) -> Option<TransferStatus> {
        let store = lock(&self.core.inbound).clone()?;
        let (code, msg) = store.pop(remote_key, uid)?;
        let s = TransferStatus::new();
        s.set_message(msg);
        s.set_code(code);
        Some(s)
    }

    /// [`Self::pop_inbound_transfer_status`], waiting at most `timeout` for the transfer to
    /// end here if it has not yet (the target's side of a push: the decode side of a KV-cache
    /// hand-off waits for the blocks of a request without polling). `None` once `timeout`
    /// passes; a status popped already (or aged out) is not waited for again, it is `None` at
    /// `timeout` too. Without a backend, `None` at once.
    pub fn wait_inbound_transfer_status(
        &self,
        remote_key: &str,
        uid: u64,
        timeout: std::time::Duration,
    ) -> Option<TransferStatus> {
        let store = lock(&self.core.inbound).clone()?;
        let deadline = std::time::Instant::now().checked_add(timeout);
        let (code, msg) = store.pop_wait(remote_key, uid, deadline)?;
        let s = TransferStatus::new();
        s.set_message(msg);
        s.set_code(code);
        Some(s)
    }

    /// MORI's `WaitAll`: see [`crate::status::wait_all`].
    pub fn wait_all(&self, statuses: &[Arc<TransferStatus>], timeout_ms: i64) -> StatusCode {
        wait_all(statuses, timeout_ms)
    }
}
