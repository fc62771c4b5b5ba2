//! Target side: answering a READ chunk from host memory (staged for device memory), with a
//! small strided run gathered next to its header in one loop.

use std::rc::Rc;

use super::gpu_io::{self, SendError};
use super::{record, status_of, Link, Shard};
use crate::gpu::staging::Slot;
use crate::proto::codes;
use crate::proto::frame::{Chunk, Frame, Run, Segs};
use crate::proto::inbound::Refusal;
use crate::proto::target;
use crate::region::SharedRegion;
use crate::transport::framed::{ConnError, FrameReader, FrameWriter};
use crate::transport::local::DeviceRecords;
use crate::transport::Rx;

/// A READ_DATA's copy-ahead: the slot copied out of GPU memory for this chunk while the
/// READ_DATA before it was sent, if any, and what copies the next chunk's ([`copy_next`]).
pub(super) struct CopyAhead<'a> {
    pub(super) slot: Option<Slot>,
    pub(super) next: &'a mut dyn FnMut(),
}

/// Whether READ_DATA on this connection is staged whenever it comes from GPU memory (it
/// offers no device parts): only then does [`copy_next`] copy ahead.
pub(super) fn stages_device(writer: &FrameWriter) -> bool {
    writer.offers_device() == DeviceRecords::None
}

/// Copy the first staging slot of the connection's next frame out of GPU memory: when it is a
/// READ already buffered whole, of a region of device memory this shard serves, with its
/// access key and in range. The frame is still checked as usual when its turn comes; this
/// only reads into a slot of ours.
pub(super) fn copy_next(shard: &Shard, reader: &FrameReader<Rx>) -> Option<gpu_io::Ahead> {
    let Some(Frame::Read { chunk, .. }) = reader.peek_frame() else {
        return None;
    };
    let region = shard.regions.borrow().get(&chunk.mem_id).cloned()?;
    region.device()?;
    if region.access_key() != chunk.access_key {
        return None;
    }
    let len = region.len() as u64;
    let spans: Vec<(u64, u64)> = chunk.segs.iter().map(|s| (s.off, s.len)).collect();
    if spans
        .iter()
        .any(|&(o, l)| o.checked_add(l).is_none_or(|e| e > len))
    {
        return None;
    }
    gpu_io::copy_ahead(shard, &region, &spans, ahead_key(&chunk))
}

/// What a READ chunk's copy-ahead is kept for: its uid, tag and index.
pub(super) fn ahead_key(chunk: &Chunk) -> (u64, u64, u32) {
    (chunk.uid, chunk.tag, chunk.chunk)
}

/// Answer a READ chunk (`req`: the chunk, whether it is final, whether the initiator places
/// it into GPU memory) with READ_DATA (its bytes, or its refusal); a FINAL one records the
/// inbound status first. Returns the chunk's code and message.
pub(super) async fn read(
    shard: &Rc<Shard>,
    conn: &Link,
    writer: &mut FrameWriter,
    req: (&Chunk, bool, bool),
    (checked, region): (Result<(), Refusal>, Option<SharedRegion>),
    ahead: CopyAhead<'_>,
) -> Result<(u32, String), ConnError> {
    let (chunk, final_, _) = req;
    let region = match (checked, region) {
        (Ok(()), Some(r)) => r,
        (checked, _) => {
            let refusal = checked.err().unwrap_or(target::GONE);
            let (code, msg) = (refusal.code, refusal.msg.to_string());
            let (rec, frame) = conn.served.read_reply(chunk, final_, code, msg.clone());
            if let Some(rec) = rec {
                record(shard, conn, &rec, false);
            }
            writer.push(&frame, &[]).await?;
            return Ok((code, msg));
        }
    };
    if region.device().is_some() {
        return read_from_device(shard, conn, writer, (&region, req), ahead).await;
    }
    if let Some(r) = inline_run(&chunk.segs, writer.inline_bytes()) {
        return read_run(shard, conn, writer, req, &region, r).await;
    }
    let mut slices = Vec::with_capacity(chunk.segs.len());
    for s in chunk.segs.iter() {
        // SAFETY: bounds checked against the live region; reading it is what the peer's
        // read request asks for.
        match unsafe { region.slice(s.off, s.len) } {
            Some(b) => slices.push(b),
            None => return Err(ConnError::Violation("segment out of range".into())),
        }
    }
    // Recorded before the bytes leave: once the initiator has them all, the target's status
    // already exists. A failed send aborts the connection and the initiator fails too.
    let (rec, frame) = conn
        .served
        .read_reply(chunk, final_, codes::SUCCESS, String::new());
    if let Some(rec) = rec {
        record(shard, conn, &rec, false);
    }
    writer.push(&frame, &slices).await?;
    Ok((codes::SUCCESS, String::new()))
}

/// A chunk's one run, if its bytes go next to their header.
fn inline_run(segs: &Segs, inline_bytes: usize) -> Option<Run> {
    match segs {
        Segs::Run(r) if segs.bytes() <= inline_bytes as u64 => Some(*r),
        _ => None,
    }
}

/// Answer a READ of host memory whose segments are one small run `r`: its span resolved
/// once, its pieces gathered next to the header in one loop.
async fn read_run(
    shard: &Rc<Shard>,
    conn: &Link,
    writer: &mut FrameWriter,
    (chunk, final_, _): (&Chunk, bool, bool),
    region: &crate::region::Region,
    r: Run,
) -> Result<(u32, String), ConnError> {
    let out_of_range = || ConnError::Violation("segment out of range".into());
    let span_len = r.end().and_then(|e| e.checked_sub(r.first.off));
    // SAFETY: bounds checked against the live region; reading it is what the peer's read
    // request asks for.
    let span = span_len
        .and_then(|n| unsafe { region.slice(r.first.off, n) })
        .ok_or_else(out_of_range)?;
    let (len, stride, count) = (r.first.len as usize, r.stride as usize, r.count as usize);
    // Recorded before the bytes leave, as in `read`.
    let (rec, frame) = conn
        .served
        .read_reply(chunk, final_, codes::SUCCESS, String::new());
    if let Some(rec) = rec {
        record(shard, conn, &rec, false);
    }
    writer
        .push_inline(&frame, len * count, |buf| {
            // The span holds every piece: it runs from the first to the end of the last.
            let whole = crate::small_copy::gather(buf, span, stride, len, count);
            debug_assert!(whole);
        })
        .await?;
    Ok((codes::SUCCESS, String::new()))
}

/// Answer a READ of device memory: staged through pinned slots, pipelined with the send, or
/// offered as device parts to a same-host initiator that places it into GPU memory.
async fn read_from_device(
    shard: &Rc<Shard>,
    conn: &Link,
    writer: &mut FrameWriter,
    (region, req): (&crate::region::Region, (&Chunk, bool, bool)),
    ahead: CopyAhead<'_>,
) -> Result<(u32, String), ConnError> {
    let (chunk, final_, to_device) = req;
    // As for host memory: recorded before the bytes leave.
    let (rec, frame) = conn
        .served
        .read_reply(chunk, final_, codes::SUCCESS, String::new());
    if let Some(rec) = rec {
        record(shard, conn, &rec, false);
    }
    let spans: Vec<(u64, u64)> = chunk.segs.iter().map(|s| (s.off, s.len)).collect();
    let payload = gpu_io::DevicePayload {
        region,
        spans: &spans,
        to_device,
    };
    let pushed = gpu_io::push_from_device(shard, writer, &frame, payload, ahead.slot, ahead.next);
    let pushed = pushed.await;
    match pushed {
        Ok(()) => Ok((codes::SUCCESS, String::new())),
        Err(SendError::Gpu(e)) => {
            // Nothing left yet: answer with the error instead (it replaces the SUCCESS
            // recorded above, which no one can have seen).
            let code = codes::ERR_GPU_OP;
            let msg = format!("staging copy from GPU memory failed: {e}");
            let (rec, frame) = conn.served.read_reply(chunk, final_, code, msg.clone());
            if let Some(rec) = rec {
                shard.shared.inbound.record(
                    &conn.served.peer,
                    conn.served.instance,
                    rec.uid,
                    status_of(rec.code),
                    &rec.msg,
                );
            }
            writer.push(&frame, &[]).await?;
            Ok((code, msg))
        }
        Err(SendError::Conn(e)) => Err(e),
    }
}
