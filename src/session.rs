//! `IoEngineSession`: transfers over one (local, remote) memory pair given once (MORI-IO's
//! session); each transfer still resolves the pair, so a session sees deregistrations.

use std::sync::Arc;

use crate::desc::MemoryDesc;
use crate::engine::Inner;
use crate::proto::frame::Op;
use crate::status::TransferStatus;

/// Transfers between one local and one remote region, given by offsets only.
pub struct IoEngineSession {
    inner: Arc<Inner>,
    local: MemoryDesc,
    remote: MemoryDesc,
}

impl std::fmt::Debug for IoEngineSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoEngineSession")
            .field("local", &self.local.id)
            .field("remote", &(&self.remote.engine_key, self.remote.id))
            .finish()
    }
}

impl IoEngineSession {
    pub(crate) fn new(inner: Arc<Inner>, local: MemoryDesc, remote: MemoryDesc) -> Self {
        Self {
            inner,
            local,
            remote,
        }
    }

    /// A fresh uid from the engine's counter.
    pub fn allocate_transfer_uid(&self) -> u64 {
        self.inner.allocate_uid()
    }

    /// Read `size` bytes at `remote_off` into `local_off`.
    pub fn read(
        &self,
        local_off: usize,
        remote_off: usize,
        size: usize,
        uid: u64,
    ) -> Arc<TransferStatus> {
        self.inner.submit_one(
            Op::Read,
            &self.local,
            local_off,
            &self.remote,
            remote_off,
            size,
            uid,
        )
    }

    /// Write `size` bytes at `local_off` to `remote_off`.
    pub fn write(
        &self,
        local_off: usize,
        remote_off: usize,
        size: usize,
        uid: u64,
    ) -> Arc<TransferStatus> {
        self.inner.submit_one(
            Op::Write,
            &self.local,
            local_off,
            &self.remote,
            remote_off,
            size,
            uid,
        )
    }

    /// One transfer (one status) of many segments, read from the remote side.
    pub fn batch_read(
        &self,
        local_offs: &[usize],
        remote_offs: &[usize],
        sizes: &[usize],
        uid: u64,
    ) -> Arc<TransferStatus> {
        self.batch(Op::Read, local_offs, remote_offs, sizes, uid)
    }

    /// One transfer (one status) of many segments, written to the remote side.
    pub fn batch_write(
        &self,
        local_offs: &[usize],
        remote_offs: &[usize],
        sizes: &[usize],
        uid: u64,
    ) -> Arc<TransferStatus> {
        self.batch(Op::Write, local_offs, remote_offs, sizes, uid)
    }

    fn batch(
        &self,
        op: Op,
        lo: &[usize],
        ro: &[usize],
        sz: &[usize],
        uid: u64,
    ) -> Arc<TransferStatus> {
        use crate::engine::as_u64s;
        self.inner.submit(
            op,
            &self.local,
            &as_u64s(lo),
            &self.remote,
            &as_u64s(ro),
            &as_u64s(sz),
            uid,
        )
    }

    /// Whether the engine's backend still runs (MORI-IO's TCP sessions answer true always;
    /// morio's answer false once the backend is removed or the engine dropped).
    pub fn alive(&self) -> bool {
        self.inner.has_backend()
    }
}
