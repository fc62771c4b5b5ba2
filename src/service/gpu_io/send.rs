//! GPU memory on the wire, sending: a chunk's payload copied out of device memory into pinned
//! slots and sent (the D2H of slot i+1 overlaps the send of slot i), or offered to a
//! same-host receiver as device parts.

use std::collections::VecDeque;

use super::{ctx, Ctx, WINDOW};
use crate::gpu::pack::{jobs, Job};
use crate::gpu::staging::Slot;
use crate::gpu::{self, BatchCopy, CopyDir, GpuError};
use crate::proto::frame::Frame;
use crate::region::Region;
use crate::service::{gpu_ipc, Shard};
use crate::transport::framed::{ConnError, FrameWriter};

/// Why sending from device memory failed.
#[derive(Debug)]
pub(crate) enum SendError {
    /// A GPU failure before anything of the frame was queued: answer with `ERR_GPU_OP`.
    Gpu(GpuError),
    /// The connection failed, or the GPU failed mid-frame: the stream cannot continue.
    Conn(ConnError),
}

fn issue_d2h(c: &Ctx, region: &Region, job: &Job, slot: &mut Slot) -> Result<(), GpuError> {
    let base = slot.ptr();
    let copies: Vec<BatchCopy> = job
        .parts
        .iter()
        .map(|p| BatchCopy {
            dst: base.wrapping_add(p.slot_off) as u64,
            src: region.device_addr(p.dev_off),
            len: p.len,
        })
        .collect();
    // SAFETY: the parts lie in the region (checked before the transfer started) and in the
    // slot (`jobs` never overfills it); the slot is not touched again until its fence
    // completes.
    unsafe { gpu::enqueue_copies(&*c.stream, CopyDir::D2h, &copies)? };
    slot.set_fence(c.stream.fence()?);
    Ok(())
}

/// The next frame's first staging slot, its copy out of device memory issued while the frame
/// before it is sent ([`copy_ahead`]): the copy overlaps that send instead of following it.
/// Kept by the lane for the chunk `key` (uid, generation, chunk); a chunk that does not come
/// next after all (its transfer was cancelled) has its copy [`Ahead::discard`]ed.
pub(crate) struct Ahead {
    key: (u64, u64, u32),
    slot: Slot,
    limit: std::time::Duration,
    /// The region the copy reads, kept registered until the copy is done.
    _region: crate::region::SharedRegion,
}

impl Ahead {
    /// Whether the copy was made for chunk `key`.
    pub(crate) fn is_for(&self, key: (u64, u64, u32)) -> bool {
        self.key == key
    }

    /// The copy's slot, when it was made for chunk `key`.
    pub(crate) fn take_for(this: &mut Option<Ahead>, key: (u64, u64, u32)) -> Option<Slot> {
        match this.take() {
            Some(a) if a.key == key => Some(a.slot),
            other => {
                *this = other;
                None
            }
        }
    }

    /// Let the copy finish without blocking the shard, then give the slot back.
    pub(crate) async fn discard(mut self) {
        // A failed copy is the next frame's to report, if it is ever sent.
        let _ = self.slot.settle(self.limit).await;
    }
}

/// Start copying the first staging slot of a chunk from device memory (`region`, `spans`)
/// ahead of its frame, if a slot is free at once: never waits, and any failure leaves the
/// copy to the frame's own turn (which reports it).
pub(crate) fn copy_ahead(
    shard: &Shard,
    region: &crate::region::SharedRegion,
    spans: &[(u64, u64)],
    key: (u64, u64, u32),
) -> Option<Ahead> {
    let c = ctx(shard, region, true).ok()?;
    let first = jobs(spans, c.staging.slot_bytes()).into_iter().next()?;
    let mut slot = c.staging.try_acquire().ok()??;
    issue_d2h(&c, region, &first, &mut slot).ok()?;
    shard.stats.borrow_mut().gpu_copies_ahead += 1;
    Some(Ahead {
        key,
        slot,
        limit: c.limit,
        _region: region.clone(),
    })
}

/// A frame's payload in device memory: `spans` (offset, length) of `region`; `to_device`
/// when the receiver places it into GPU memory (a same-host connection then offers it as
/// device parts).
pub(crate) struct DevicePayload<'a> {
    pub region: &'a Region,
    pub spans: &'a [(u64, u64)],
    pub to_device: bool,
}

/// Queue `frame` with `payload` from device memory.
/// The first slot is copied before the header is queued, so a GPU that refuses the copy
/// leaves the connection untouched. `ahead`: that copy, already issued by [`copy_ahead`];
/// `next` runs once this frame's first slot is copied, before its bytes are sent: the sender
/// copies its next frame's first slot ahead there.
pub(crate) async fn push_from_device(
    shard: &Shard,
    writer: &mut FrameWriter,
    frame: &Frame,
    payload: DevicePayload<'_>,
    ahead: Option<Slot>,
    next: &mut dyn FnMut(),
) -> Result<(), SendError> {
    let DevicePayload {
        region,
        spans,
        to_device,
    } = payload;
    let total: u64 = spans.iter().map(|s| s.1).sum();
    let mut header_sent = false;
    let offer = if to_device {
        gpu_ipc::device_parts(shard, writer, region, spans)
    } else {
        None
    };
    if let Some((allocs, parts)) = offer {
        writer.push_header(frame, total);
        let taken = writer
            .send_device(&allocs, &parts)
            .await
            .map_err(|e| SendError::Conn(e.into()))?;
        if taken {
            shard.stats.borrow_mut().gpu_ipc_bytes += total;
            return Ok(());
        }
        // Declined: the same bytes follow, staged, after the header already sent.
        shard.stats.borrow_mut().gpu_ipc_declined += 1;
        header_sent = true;
    }
    let out = Outgoing {
        frame,
        region,
        spans,
        total,
        header_sent,
    };
    stage_from_device(shard, writer, out, ahead, next).await?;
    shard.stats.borrow_mut().gpu_staged_bytes += total;
    Ok(())
}

/// A frame whose payload is staged out of device memory.
struct Outgoing<'a> {
    frame: &'a Frame,
    region: &'a Region,
    spans: &'a [(u64, u64)],
    total: u64,
    /// The frame's header has left already (device parts were declined), so a GPU failure
    /// is mid-frame from the start.
    header_sent: bool,
}

/// [`push_from_device`] through pinned slots.
async fn stage_from_device(
    shard: &Shard,
    writer: &mut FrameWriter,
    out: Outgoing<'_>,
    ahead: Option<Slot>,
    next_frame: &mut dyn FnMut(),
) -> Result<(), SendError> {
    let Outgoing {
        frame,
        region,
        spans,
        total,
        header_sent,
    } = out;
    let mid = |e: GpuError| {
        SendError::Conn(ConnError::Violation(format!(
            "GPU copy failed mid-frame: {e}"
        )))
    };
    let early = |e: GpuError| {
        if header_sent {
            mid(e)
        } else {
            SendError::Gpu(e)
        }
    };
    let c = ctx(shard, region, true).map_err(early)?;
    let jobs = jobs(spans, c.staging.slot_bytes());
    let mut next = 0;
    let mut inflight: VecDeque<(Slot, usize)> = VecDeque::new();
    if let Some(slot) = ahead {
        // Its copy of job 0 was issued ahead (the same spans, cut to the same slot size).
        inflight.push_back((slot, 0));
        next = 1;
    }
    while next < jobs.len() && inflight.len() < WINDOW {
        let slot = if inflight.is_empty() {
            Some(c.staging.acquire().await.map_err(early)?)
        } else {
            c.staging.try_acquire().map_err(early)?
        };
        let Some(mut slot) = slot else { break };
        issue_d2h(&c, region, &jobs[next], &mut slot).map_err(early)?;
        inflight.push_back((slot, next));
        next += 1;
    }
    if let Some((first, _)) = inflight.front_mut() {
        first.settle(c.limit).await.map_err(early)?;
    }
    // The next frame's copy is issued once this frame's first is done, not beside it: at the
    // start of a transfer every lane's first copy then has the GPU's copy engines to itself
    // (queued together, the first and the next copies of all lanes shared them and every
    // lane's first send waited for both, s43-runs.md). It still overlaps this frame's send.
    next_frame();
    if let Frame::Write { chunk, .. } = frame {
        crate::trace::mark(chunk.uid, crate::trace::stage::G_STAGED);
    } else if let Frame::ReadData { reply, .. } = frame {
        crate::trace::mark(reply.uid, crate::trace::stage::G_STAGED);
    }
    if !header_sent {
        writer.push_header(frame, total);
    }
    while let Some((mut slot, j)) = inflight.pop_front() {
        slot.settle(c.limit).await.map_err(mid)?;
        writer
            .send_part(&slot.bytes()[..jobs[j].bytes])
            .await
            .map_err(|e| SendError::Conn(e.into()))?;
        if next < jobs.len() {
            issue_d2h(&c, region, &jobs[next], &mut slot).map_err(mid)?;
            inflight.push_back((slot, next));
            next += 1;
            // Widen the window while slots are free.
            while next < jobs.len() && inflight.len() < WINDOW {
                let Some(mut s) = c.staging.try_acquire().map_err(mid)? else {
                    break;
                };
                issue_d2h(&c, region, &jobs[next], &mut s).map_err(mid)?;
                inflight.push_back((s, next));
                next += 1;
            }
        }
    }
    Ok(())
}
