//! GPU memory on the wire, receiving: a chunk's payload read into pinned slots and copied
//! into device memory (the receive of slot i+1 overlaps the H2D of slot i), or copied device to
//! device from a same-host sender's parts; a chunk whose last copies still run may *land*
//! while its connection reads on ([`Landing`]).

use std::collections::VecDeque;
use std::time::Duration;

use super::{ctx, Ctx, WINDOW};
use crate::gpu::pack::{jobs, Job};
use crate::gpu::staging::Slot;
use crate::gpu::{self, BatchCopy, CopyDir, GpuError};
use crate::region::Region;
use crate::service::{gpu_ipc, Shard};
use crate::transport::framed::{ConnError, FrameReader};
use crate::transport::Rx;

/// Payloads from this size on may land while their connection reads on ([`Landing`]).
const LANDING_MIN_BYTES: u64 = 64 << 10;

fn issue_h2d(c: &Ctx, region: &Region, job: &Job, slot: &mut Slot) -> Result<(), GpuError> {
    let base = slot.bytes().as_ptr();
    let copies: Vec<BatchCopy> = job
        .parts
        .iter()
        .map(|p| BatchCopy {
            dst: region.device_addr(p.dev_off),
            src: base.wrapping_add(p.slot_off) as u64,
            len: p.len,
        })
        .collect();
    // SAFETY: as in `issue_d2h`, directions swapped; the slot's bytes were filled from the
    // socket before this call and stay untouched until the fence completes.
    unsafe { gpu::enqueue_copies(&*c.stream, CopyDir::H2d, &copies)? };
    slot.set_fence(c.stream.fence()?);
    Ok(())
}

/// A chunk's code and message once its bytes are in device memory (or failed to get there).
pub(crate) fn landed(r: Result<(), GpuError>) -> (u32, String) {
    match r {
        Ok(()) => (crate::proto::codes::SUCCESS, String::new()),
        Err(e) => (
            crate::proto::codes::ERR_GPU_OP,
            format!("staging copy into GPU memory failed: {e}"),
        ),
    }
}

/// A chunk's payload received into device memory, whose copies from pinned slots may still be
/// running: the bytes are in device memory once it has settled. Holding one lets a connection
/// read its next frame while the copies run (the receiving loop then answers this chunk after
/// reading the next one, instead of leaving its socket idle while it waits).
pub(crate) struct Landing {
    /// Slots whose copies into device memory are queued, oldest first.
    slots: VecDeque<Slot>,
    /// The first GPU failure (the rest of the payload was read and dropped).
    failed: Option<GpuError>,
    limit: Duration,
    /// Bytes to count as staged once the copies succeed.
    staged: u64,
}

impl Landing {
    /// A landing already complete (device parts, or a failure before any copy).
    fn done(r: Result<(), GpuError>) -> Self {
        Self {
            slots: VecDeque::new(),
            failed: r.err(),
            limit: Duration::ZERO,
            staged: 0,
        }
    }

    /// Whether copies may still be running.
    pub(crate) fn in_flight(&self) -> bool {
        !self.slots.is_empty()
    }

    /// Whether the connection may read on before this landing settles: copies may still run
    /// and the payload is large enough for their wait to matter (a small one's copies take
    /// microseconds, and looking at the socket costs a system call).
    pub(crate) fn may_land(&self) -> bool {
        self.in_flight() && self.staged >= LANDING_MIN_BYTES
    }

    /// Wait until every copy has completed and give the slots back; the result is kept.
    pub(crate) async fn settle(&mut self, shard: &Shard) {
        while let Some(mut p) = self.slots.pop_front() {
            if let Err(e) = p.settle(self.limit).await {
                self.failed.get_or_insert(e);
            }
        }
        if self.failed.is_none() && self.staged > 0 {
            shard.stats.borrow_mut().gpu_staged_bytes += std::mem::take(&mut self.staged);
        }
    }

    /// Settle, then the result: `Ok` once the bytes are in device memory.
    pub(crate) async fn finish(mut self, shard: &Shard) -> Result<(), GpuError> {
        self.settle(shard).await;
        self.failed.take().map_or(Ok(()), Err)
    }
}

/// Receive the current frame's payload into the device bytes of `spans`. The outer error is
/// the connection's; the inner one a GPU failure, after which the rest of the payload is still
/// read (and dropped) so the connection stays usable. Returns only once every H2D copy has
/// completed: the bytes are in device memory.
pub(crate) async fn read_into_device(
    shard: &Shard,
    reader: &mut FrameReader<Rx>,
    region: &Region,
    spans: &[(u64, u64)],
) -> Result<Result<(), GpuError>, ConnError> {
    let landing = receive_into_device(shard, reader, region, spans, None).await?;
    Ok(landing.finish(shard).await)
}

/// [`read_into_device`] that returns once the payload is read, with its last copies into
/// device memory possibly still running. `prev`, the same connection's landing before this
/// one, is settled here if the staging pool runs dry (its slots are then free again), so a
/// connection never waits for slots that only it can give back.
pub(crate) async fn receive_into_device(
    shard: &Shard,
    reader: &mut FrameReader<Rx>,
    region: &Region,
    spans: &[(u64, u64)],
    prev: Option<&mut Landing>,
) -> Result<Landing, ConnError> {
    let total: u64 = spans.iter().map(|s| s.1).sum();
    if let Some((d, pid)) = reader.device_offer().await? {
        let taken = gpu_ipc::take_device(shard, reader, region, spans, total, &d, pid).await?;
        if let Some(done) = taken {
            shard.stats.borrow_mut().gpu_ipc_bytes += total;
            return Ok(Landing::done(done));
        }
        // Declined: the bytes follow as usual.
    }
    stage_into_device(shard, reader, region, spans, total, prev).await
}

/// [`receive_into_device`] through pinned slots.
async fn stage_into_device(
    shard: &Shard,
    reader: &mut FrameReader<Rx>,
    region: &Region,
    spans: &[(u64, u64)],
    total: u64,
    mut prev: Option<&mut Landing>,
) -> Result<Landing, ConnError> {
    let c = match ctx(shard, region, false) {
        Ok(c) => c,
        Err(e) => {
            reader.discard_payload(total).await?;
            return Ok(Landing::done(Err(e)));
        }
    };
    let mut failed: Option<GpuError> = None;
    let mut pending: VecDeque<Slot> = VecDeque::new();
    let mut read = 0u64;
    for job in jobs(spans, c.staging.slot_bytes()) {
        let fresh = if pending.len() < WINDOW {
            match c.staging.try_acquire() {
                Ok(s) => s,
                Err(e) => {
                    failed.get_or_insert(e);
                    None
                }
            }
        } else {
            None
        };
        let mut slot = match (fresh, pending.pop_front()) {
            (Some(s), Some(p)) => {
                pending.push_front(p);
                s
            }
            (Some(s), None) => s,
            (None, Some(mut p)) => {
                if let Err(e) = p.settle(c.limit).await {
                    failed.get_or_insert(e);
                }
                p
            }
            (None, None) => {
                // The pool is dry: what this connection still holds is given back first.
                if let Some(p) = prev.as_mut().filter(|p| p.in_flight()) {
                    p.settle(shard).await;
                }
                let s = match c.staging.try_acquire() {
                    Ok(Some(s)) => Ok(s),
                    Ok(None) => c.staging.acquire().await,
                    Err(e) => Err(e),
                };
                match s {
                    Ok(s) => s,
                    Err(e) => {
                        // The rest of the payload (what came before is in slots that settle
                        // as they drop).
                        reader.discard_payload(total - read).await?;
                        return Ok(Landing::done(Err(e)));
                    }
                }
            }
        };
        if let Err(e) = reader
            .read_payload(&mut slot.bytes_mut()[..job.bytes])
            .await
        {
            // Nothing of the chunk lands after this returns (its transfer may be reported
            // failed next): the copies already queued are waited for.
            for mut p in pending {
                let _ = p.settle(c.limit).await;
            }
            return Err(e);
        }
        read += job.bytes as u64;
        if failed.is_none() {
            if let Err(e) = issue_h2d(&c, region, &job, &mut slot) {
                failed = Some(e);
            }
        }
        pending.push_back(slot);
    }
    Ok(Landing {
        slots: pending,
        failed,
        limit: c.limit,
        staged: total,
    })
}
