//! From a transfer's arguments to a `Submission` on its owner shard: synchronous validation,
//! the segment layout, the owner choice, and the hand-off (never blocking on a shard).

use std::borrow::Cow;
use std::sync::Arc;

use crate::desc::{MemoryDesc, MemoryLocationType};
use crate::proto::frame::Op;
use crate::proto::layout;
use crate::service::express::Attempt;
use crate::service::{now_ns, ShardMsg, Submission};
use crate::status::{StatusCode, TransferStatus};
use crate::trace;

use super::{read_lock, Core};

/// Where a transfer's bytes lie: per segment, an offset into the local memory, an offset
/// into the remote memory and a size.
#[derive(Debug)]
pub(crate) enum Segments<'a> {
    /// One contiguous segment (`read`, `write`): no list to allocate.
    One {
        /// Offset into the local memory.
        local_off: u64,
        /// Offset into the remote memory.
        remote_off: u64,
        /// Bytes to move.
        size: u64,
    },
    /// Parallel lists, entry *j* of each forming segment *j* (a batch transfer).
    Many {
        /// Offsets into the local memory.
        local_offs: Cow<'a, [u64]>,
        /// Offsets into the remote memory.
        remote_offs: Cow<'a, [u64]>,
        /// Bytes per segment.
        sizes: Cow<'a, [u64]>,
    },
}

impl<'a> Segments<'a> {
    /// One segment of `size` bytes.
    pub fn one(local_off: usize, remote_off: usize, size: usize) -> Self {
        Self::One {
            local_off: local_off as u64,
            remote_off: remote_off as u64,
            size: size as u64,
        }
    }

    /// Segments from the API's parallel `usize` lists (borrowed as `u64` on 64-bit targets).
    pub fn many(local_offs: &'a [usize], remote_offs: &'a [usize], sizes: &'a [usize]) -> Self {
        Self::Many {
            local_offs: as_u64s(local_offs),
            remote_offs: as_u64s(remote_offs),
            sizes: as_u64s(sizes),
        }
    }

    /// The three lists: local offsets, remote offsets, sizes.
    fn lists(&self) -> (&[u64], &[u64], &[u64]) {
        match self {
            Self::One {
                local_off,
                remote_off,
                size,
            } => (
                std::slice::from_ref(local_off),
                std::slice::from_ref(remote_off),
                std::slice::from_ref(size),
            ),
            Self::Many {
                local_offs,
                remote_offs,
                sizes,
            } => (local_offs, remote_offs, sizes),
        }
    }
}

/// One transfer as the API describes it: an operation between a local and a remote memory,
/// its segments, and its uid.
#[derive(Debug)]
pub(crate) struct Xfer<'a> {
    /// Read (remote → local) or write (local → remote).
    pub op: Op,
    /// Memory of this engine.
    pub local: &'a MemoryDesc,
    /// Memory of a registered remote engine.
    pub remote: &'a MemoryDesc,
    /// Where the bytes lie in each.
    pub segs: Segments<'a>,
    /// The caller's transfer uid.
    pub uid: u64,
}

/// MORI's batch calls: entry *i* of every list forms one transfer (its own uid and status)
/// of the segments `local_offs[i][j]`, `remote_offs[i][j]`, `sizes[i][j]`.
#[derive(Debug)]
pub(crate) struct Batch<'a> {
    /// The operation of every transfer.
    pub op: Op,
    /// Local memory per transfer.
    pub local: &'a [MemoryDesc],
    /// Local offsets per transfer.
    pub local_offs: &'a [Vec<usize>],
    /// Remote memory per transfer.
    pub remote: &'a [MemoryDesc],
    /// Remote offsets per transfer.
    pub remote_offs: &'a [Vec<usize>],
    /// Segment sizes per transfer.
    pub sizes: &'a [Vec<usize>],
    /// The uid of each transfer.
    pub uids: &'a [u64],
}

impl Core {
    /// Validate synchronously, then hand the transfer to its owner shard without blocking.
    /// The status is terminal at once for argument errors and empty transfers, else
    /// `IN_PROGRESS`.
    pub fn submit(&self, x: Xfer<'_>) -> Arc<TransferStatus> {
        let Xfer {
            op,
            local,
            remote,
            segs,
            uid,
        } = x;
        let Some(backend) = self.backend() else {
            return failed(
                StatusCode::ErrBadState,
                "No available backend found, create backend first",
            );
        };
        if local.engine_key != self.key {
            return failed(
                StatusCode::ErrInvalidArgs,
                "local memory belongs to another engine",
            );
        }
        let known =
            |m: &MemoryDesc| matches!(m.loc, MemoryLocationType::Cpu | MemoryLocationType::Gpu);
        if !known(local) || !known(remote) {
            return failed(
                StatusCode::ErrInvalidArgs,
                "memory location must be CPU or GPU",
            );
        }
        // A descriptor of an earlier registration whose id was drawn again carries another
        // key: it names no memory of this engine.
        let region = read_lock(&self.regions)
            .get(&local.id)
            .filter(|r| r.access_key() == local.access_key)
            .cloned();
        let Some(region) = region else {
            return failed(StatusCode::ErrNotFound, "local memory not registered");
        };
        let Some(peer) = read_lock(&self.remotes).get(&remote.engine_key).cloned() else {
            return failed(StatusCode::ErrNotFound, "remote engine not registered");
        };
        trace::mark(uid, trace::stage::RESOLVED);
        let (local_offs, remote_offs, sizes) = segs.lists();
        let layout = match layout::normalize_layout(
            local_offs,
            remote_offs,
            sizes,
            region.len() as u64,
            remote.size,
        ) {
            Ok(p) => p,
            Err(e) => return failed(StatusCode::ErrInvalidArgs, &e.to_string()),
        };
        trace::mark(uid, trace::stage::NORMALIZED);
        let total = layout.total_bytes();
        if total == 0 {
            return failed(StatusCode::Success, "");
        }
        let status = Arc::new(TransferStatus::started());
        let shared = &backend.shared;
        let owner = super::uid::owner_of(uid, shared.n_owners(backend.n_shards()));
        let sub = Submission {
            peer,
            op,
            uid,
            local: region,
            remote_mem: remote.id,
            remote_key: remote.access_key,
            remote_device: remote.loc == crate::desc::MemoryLocationType::Gpu,
            layout,
            total,
            deadline_ns: now_ns() + shared.cfg.op_timeout.as_nanos() as u64,
            status: status.clone(),
        };
        trace::mark(uid, trace::stage::SUBMIT);
        match sub.peer.express.try_send(shared, &sub.candidate(), owner) {
            Attempt::Sent(lane) => {
                // Its answer comes to the lane's shard (as `Shard::lane_shard` picks it):
                // have it awake by then. A busy shard takes the message without a wake-up
                // (its inbox has no listener); a parked one wakes while the frame travels.
                if crate::service::express::poke_enabled() {
                    let _ = backend
                        .mesh
                        .send(lane as usize % backend.n_shards(), ShardMsg::Expect);
                }
                return status;
            }
            Attempt::Spilled(lane) => {
                // The lane's shard sends the rest.
                let to = lane as usize % backend.n_shards();
                let msg = ShardMsg::WakeWriter {
                    peer: sub.peer.key.clone(),
                    lane,
                };
                // A mesh that is gone is an engine shutting down: its lanes' deaths fail
                // the transfer.
                let _ = backend.mesh.send(to, msg);
                return status;
            }
            Attempt::Duplicate => {
                status.update(StatusCode::ErrBadState, "duplicate peer/op id");
                return status;
            }
            Attempt::Declined => {}
        }
        if backend
            .mesh
            .send(owner, ShardMsg::Submit(Box::new(sub)))
            .is_err()
        {
            status.update(StatusCode::ErrBadState, "engine shut down");
        }
        status
    }

    /// Submit every transfer of a batch; one status per uid. Lists of different lengths
    /// fail every status (at least one) with `ERR_INVALID_ARGS`.
    pub fn submit_batch(&self, b: Batch<'_>) -> Vec<Arc<TransferStatus>> {
        let n = b.uids.len();
        if [
            b.local.len(),
            b.local_offs.len(),
            b.remote.len(),
            b.remote_offs.len(),
            b.sizes.len(),
        ]
        .iter()
        .any(|&l| l != n)
        {
            return (0..n.max(1))
                .map(|_| failed(StatusCode::ErrInvalidArgs, "batch vector size mismatch"))
                .collect();
        }
        (0..n)
            .map(|i| {
                self.submit(Xfer {
                    op: b.op,
                    local: &b.local[i],
                    remote: &b.remote[i],
                    segs: Segments::many(&b.local_offs[i], &b.remote_offs[i], &b.sizes[i]),
                    uid: b.uids[i],
                })
            })
            .collect()
    }
}

/// A status already terminal with `code`.
fn failed(code: StatusCode, msg: &str) -> Arc<TransferStatus> {
    let s = Arc::new(TransferStatus::new());
    s.update(code, msg);
    s
}

/// `usize` offsets and sizes as `u64`: the same memory on 64-bit targets (no copy per
/// call, which matters for batches of hundreds of segments), converted elsewhere.
fn as_u64s(v: &[usize]) -> Cow<'_, [u64]> {
    #[cfg(target_pointer_width = "64")]
    {
        // SAFETY: on 64-bit targets usize and u64 have the same size, alignment and valid
        // bit patterns, so the slice's memory is a valid [u64] of the same length.
        Cow::Borrowed(unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u64>(), v.len()) })
    }
    #[cfg(not(target_pointer_width = "64"))]
    {
        Cow::Owned(v.iter().map(|&x| x as u64).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_of_mismatched_lists_fail_every_status_and_no_backend_fails_each_transfer() {
        use crate::config::IoEngineConfig;
        let core = Core::new("xfer_test", IoEngineConfig::new("127.0.0.1", 0));
        let mem = MemoryDesc::cpu("xfer_test", 0, 0x1000, 64);
        let (offs, sizes) = (vec![vec![0usize]], vec![vec![8usize]]);
        let batch = |uids: &[u64]| {
            core.submit_batch(Batch {
                op: Op::Write,
                local: std::slice::from_ref(&mem),
                local_offs: &offs,
                remote: std::slice::from_ref(&mem),
                remote_offs: &offs,
                sizes: &sizes,
                uids,
            })
        };
        for uids in [&[][..], &[1, 2, 3][..]] {
            let st = batch(uids);
            assert_eq!(st.len(), uids.len().max(1));
            assert!(st.iter().all(|s| s.code() == StatusCode::ErrInvalidArgs));
        }
        let st = batch(&[7]);
        assert_eq!(st.len(), 1);
        assert_eq!(st[0].code(), StatusCode::ErrBadState, "{}", st[0].message());
    }

    #[test]
    fn segments_give_parallel_lists() {
        let one = Segments::one(1, 2, 3);
        assert_eq!(one.lists(), (&[1u64][..], &[2u64][..], &[3u64][..]));
        let (lo, ro, sz) = (vec![0usize, 8], vec![16usize, 24], vec![4usize, 4]);
        let many = Segments::many(&lo, &ro, &sz);
        assert_eq!(
            many.lists(),
            (&[0u64, 8][..], &[16u64, 24][..], &[4u64, 4][..])
        );
    }
}
