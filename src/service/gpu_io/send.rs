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

/// Queue `frame` with the device bytes of `spans` (region offset, length) as its payload;
/// `to_device` when the receiver places it into GPU memory (a same-host connection then
/// offers it as device parts).
/// The first slot is copied before the header is queued, so a GPU that refuses the copy
/// leaves the connection untouched.
pub(crate) async fn push_from_device(
    shard: &Shard,
    writer: &mut FrameWriter,
    frame: &Frame,
    region: &Region,
    spans: &[(u64, u64)],
    to_device: bool,
) -> Result<(), SendError> {
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
    stage_from_device(shard, writer, frame, region, spans, total, header_sent).await?;
    shard.stats.borrow_mut().gpu_staged_bytes += total;
    Ok(())
}

/// [`push_from_device`] through pinned slots; `header_sent` when the frame's header has
/// left already (device parts were declined), so a GPU failure is mid-frame from the start.
async fn stage_from_device(
    shard: &Shard,
    writer: &mut FrameWriter,
    frame: &Frame,
    region: &Region,
    spans: &[(u64, u64)],
    total: u64,
    header_sent: bool,
) -> Result<(), SendError> {
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
