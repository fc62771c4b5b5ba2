//! `IoEngineSession`: transfers over one (local, remote) memory pair given once (MORI-IO's
//! session); each transfer still resolves the pair, so a session sees deregistrations.

use std::sync::Arc;

use crate::desc::MemoryDesc;
use crate::proto::frame::Op;
use crate::status::TransferStatus;
use crate::submit::{Core, Segments, Xfer};

/// Transfers between one local and one remote region, given by offsets only.
pub struct IoEngineSession {
    core: Arc<Core>,
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
    /// A session of the engine whose state is `core`, over `local` and `remote`.
    pub(crate) fn new(core: Arc<Core>, local: MemoryDesc, remote: MemoryDesc) -> Self {
        Self {
            core,
            local,
            remote,
        }
    }

    /// A fresh uid from the engine's counter.
    pub fn allocate_transfer_uid(&self) -> u64 {
        self.core.allocate_uid()
    }

    /// Read `size` bytes at `remote_off` into `local_off`.
    pub fn read(
        &self,
        local_off: usize,
        remote_off: usize,
        size: usize,
        uid: u64,
    ) -> Arc<TransferStatus> {
        self.submit(Op::Read, Segments::one(local_off, remote_off, size), uid)
    }

    /// Write `size` bytes at `local_off` to `remote_off`.
    pub fn write(
        &self,
        local_off: usize,
        remote_off: usize,
        size: usize,
        uid: u64,
    ) -> Arc<TransferStatus> {
        self.submit(Op::Write, Segments::one(local_off, remote_off, size), uid)
    }

    /// One transfer (one status) of many segments, read from the remote side.
    pub fn batch_read(
        &self,
        local_offs: &[usize],
        remote_offs: &[usize],
        sizes: &[usize],
        uid: u64,
    ) -> Arc<TransferStatus> {
        let segs = Segments::many(local_offs, remote_offs, sizes);
        self.submit(Op::Read, segs, uid)
    }

    /// One transfer (one status) of many segments, written to the remote side.
    pub fn batch_write(
        &self,
        local_offs: &[usize],
        remote_offs: &[usize],
        sizes: &[usize],
        uid: u64,
    ) -> Arc<TransferStatus> {
        let segs = Segments::many(local_offs, remote_offs, sizes);
        self.submit(Op::Write, segs, uid)
    }

    fn submit(&self, op: Op, segs: Segments<'_>, uid: u64) -> Arc<TransferStatus> {
        self.core.submit(Xfer {
            op,
            local: &self.local,
            remote: &self.remote,
            segs,
            uid,
        })
    }

    /// Whether the engine's backend still runs (MORI-IO's TCP sessions answer true always;
    /// morio's answer false once the backend is removed or the engine dropped).
    pub fn alive(&self) -> bool {
        self.core.has_backend()
    }
}
