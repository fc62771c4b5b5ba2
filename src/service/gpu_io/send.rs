//! GPU memory on the wire, sending: a chunk's payload copied out of device memory into pinned
//! slots and sent (the D2H of slot i+1 overlaps the send of slot i), or offered to a
//! same-host receiver as device parts.

use std::collections::VecDeque;
use std::sync::OnceLock;

use super::{ctx, Ctx, WINDOW};
use crate::gpu::pack::{jobs, Job, Part};
use crate::gpu::staging::{wait_fence, Slot};
use crate::gpu::{self, BatchCopy, CopyDir, GpuError, GpuFence};
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

/// Pieces a frame's first slot is copied out of device memory and sent in, each sent as soon
/// as its copy is done, while the next piece copies (`MORIO_GPU_SEND_PARTS`, 1 to 8; 1, the
/// default, copies the whole slot before its first byte leaves). An experiment for A/B runs.
fn send_parts() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("MORIO_GPU_SEND_PARTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1usize)
            .clamp(1, 8)
    })
}

/// A leading piece of a slot: the fence after its copy, and where it ends in the slot.
type Head = (Box<dyn GpuFence>, usize);

/// The smallest piece worth a copy and a fence of its own.
const MIN_PART_BYTES: usize = 64 << 10;

fn enqueue_d2h(c: &Ctx, region: &Region, base: *mut u8, parts: &[Part]) -> Result<(), GpuError> {
    let copies: Vec<BatchCopy> = parts
        .iter()
        .map(|p| BatchCopy {
            dst: base.wrapping_add(p.slot_off) as u64,
            src: region.device_addr(p.dev_off),
            len: p.len,
        })
        .collect();
    // SAFETY: the parts lie in the region (checked before the transfer started) and in the
    // slot (`jobs` never overfills it); the slot's bytes are not touched until a fence
    // recorded after these copies completes.
    unsafe { gpu::enqueue_copies(&*c.stream, CopyDir::D2h, &copies) }
}

fn issue_d2h(c: &Ctx, region: &Region, job: &Job, slot: &mut Slot) -> Result<(), GpuError> {
    enqueue_d2h(c, region, slot.ptr(), &job.parts)?;
    slot.set_fence(c.stream.fence()?);
    Ok(())
}

/// [`issue_d2h`] in `k` pieces, a fence after each: the fences of all but the last, with
/// where each piece ends in the slot (the slot keeps the last, which covers them all).
fn issue_d2h_parts(
    c: &Ctx,
    region: &Region,
    job: &Job,
    slot: &mut Slot,
    k: usize,
) -> Result<Vec<Head>, GpuError> {
    let base = slot.ptr();
    let pieces = job.split(k);
    let n = pieces.len();
    let mut heads: Vec<Head> = Vec::with_capacity(n);
    for (i, (parts, end)) in pieces.into_iter().enumerate() {
        let issued = enqueue_d2h(c, region, base, &parts).and_then(|()| c.stream.fence());
        match issued {
            Ok(f) if i + 1 == n => slot.set_fence(f),
            Ok(f) => heads.push((f, end)),
            Err(e) => {
                // The last fence recorded covers every copy queued before it: the slot
                // is not given back before they are done.
                if let Some((f, _)) = heads.pop() {
                    slot.set_fence(f);
                }
                return Err(e);
            }
        }
    }
    Ok(heads)
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
    // The first slot's pieces before its last, when it is copied in pieces.
    let mut heads: Vec<Head> = Vec::new();
    let k = send_parts().min(jobs.first().map_or(0, |j| j.bytes) / MIN_PART_BYTES);
    while next < jobs.len() && inflight.len() < WINDOW {
        let slot = if inflight.is_empty() {
            Some(c.staging.acquire().await.map_err(early)?)
        } else {
            c.staging.try_acquire().map_err(early)?
        };
        let Some(mut slot) = slot else { break };
        if next == 0 && k > 1 {
            heads = issue_d2h_parts(&c, region, &jobs[0], &mut slot, k).map_err(early)?;
        } else {
            issue_d2h(&c, region, &jobs[next], &mut slot).map_err(early)?;
        }
        inflight.push_back((slot, next));
        next += 1;
    }
    match heads.first() {
        Some((f, _)) => wait_fence(&**f, c.limit).await.map_err(early)?,
        None => {
            if let Some((first, _)) = inflight.front_mut() {
                first.settle(c.limit).await.map_err(early)?;
            }
        }
    }
    if !header_sent {
        writer.push_header(frame, total);
    }
    // The first slot's leading pieces, each once its copy is done.
    let mut sent = 0;
    if let Some((first, _)) = inflight.front() {
        for (f, end) in heads.drain(..) {
            wait_fence(&*f, c.limit).await.map_err(mid)?;
            writer
                .send_part(first.bytes_in(sent..end))
                .await
                .map_err(|e| SendError::Conn(e.into()))?;
            sent = end;
        }
    }
    while let Some((mut slot, j)) = inflight.pop_front() {
        slot.settle(c.limit).await.map_err(mid)?;
        let from = if j == 0 { sent } else { 0 };
        writer
            .send_part(&slot.bytes()[from..jobs[j].bytes])
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
