//! GPU memory on the wire: a shard's streams and staging pools, and the two pipelines that
//! move a chunk's payload between device memory and a connection through pinned slots (the
//! D2H of slot i+1 overlaps the send of slot i; the receive of slot i+1 overlaps the H2D of
//! slot i). Between two processes of one host a payload of exported GPU memory is offered as
//! device parts instead: the receiver opens the sender's allocation and copies it on its GPU,
//! one device-to-device copy and no staging (`local::Device`).

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use super::{gpu_ipc, Shard};
use crate::gpu::pack::{jobs, Job};
use crate::gpu::staging::{Slot, Staging};
use crate::gpu::{self, BatchCopy, CopyDir, GpuError, GpuStream};
use crate::proto::frame::Frame;
use crate::region::Region;
use crate::transport::framed::{ConnError, FrameReader, FrameWriter};
use crate::transport::Rx;

/// Copies a pipeline keeps in flight at most (more only if slots are free).
const WINDOW: usize = 8;

/// Payloads from this size on may land while their connection reads on ([`Landing`]).
const LANDING_MIN_BYTES: u64 = 64 << 10;

/// A shard's GPU resources, created on its first GPU transfer.
#[derive(Default)]
pub(crate) struct GpuShard {
    /// Slots for outgoing payload (D2H then send).
    send: Option<Rc<Staging>>,
    /// Slots for incoming payload (receive then H2D). Separate from `send` so a receiver never
    /// waits for a sender whose progress depends on the peer's receivers: no circular wait.
    recv: Option<Rc<Staging>>,
    streams: HashMap<i32, Rc<dyn GpuStream>>,
}

impl GpuShard {
    /// The shard's stream on the device of `dm` (created on first use).
    pub(crate) fn stream(
        &mut self,
        dm: &crate::region::DeviceMem,
    ) -> Result<Rc<dyn GpuStream>, GpuError> {
        Ok(match self.streams.get(&dm.dev) {
            Some(s) => s.clone(),
            None => {
                let s: Rc<dyn GpuStream> = Rc::from(dm.gpu.create_stream(dm.dev)?);
                self.streams.insert(dm.dev, s.clone());
                s
            }
        })
    }

    /// (pinned bytes held, peak bytes in use) over both pools.
    pub(crate) fn staging_bytes(&self) -> (usize, usize) {
        [&self.send, &self.recv]
            .iter()
            .filter_map(|p| p.as_ref())
            .fold((0, 0), |(a, b), p| {
                (a + p.pinned_bytes(), b + p.peak_bytes())
            })
    }
}

/// What a pipeline needs for one region on this shard.
struct Ctx {
    staging: Rc<Staging>,
    stream: Rc<dyn GpuStream>,
    limit: Duration,
}

/// This shard's stream on the device of `region` (created on first use).
fn stream(shard: &Shard, region: &Region) -> Result<Rc<dyn GpuStream>, GpuError> {
    let dm = region.device().ok_or_else(|| GpuError::Call {
        call: "stream",
        msg: "not device memory".into(),
    })?;
    shard.gpu.borrow_mut().stream(dm)
}

fn ctx(shard: &Shard, region: &Region, outgoing: bool) -> Result<Ctx, GpuError> {
    let stream = stream(shard, region)?;
    let dm = region.device().ok_or_else(|| GpuError::Call {
        call: "staging",
        msg: "not device memory".into(),
    })?;
    let cfg = &shard.shared.cfg;
    let mut g = shard.gpu.borrow_mut();
    let n_shards = shard.n_shards().max(1);
    let per_pool = cfg.gpu_staging_bytes / n_shards / 2;
    let slot = cfg.staging_slot_bytes(n_shards);
    let pool = if outgoing { &mut g.send } else { &mut g.recv };
    let staging = pool
        .get_or_insert_with(|| Staging::new(dm.gpu.clone(), slot, per_pool))
        .clone();
    Ok(Ctx {
        staging,
        stream,
        limit: cfg.op_timeout,
    })
}

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
        reader
            .read_payload(&mut slot.bytes_mut()[..job.bytes])
            .await?;
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
