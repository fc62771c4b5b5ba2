//! Target side: placing a WRITE chunk's payload into registered memory (or draining a
//! refused one).

use std::rc::Rc;

use crate::proto::codes;
use crate::proto::frame::{Chunk, Segs};
use crate::proto::inbound::Refusal;
use crate::proto::target;
use crate::region::SharedRegion;
use crate::service::{gpu_io, Shard};
use crate::transport::framed::{ascending_disjoint, ConnError, FrameReader};
use crate::transport::Rx;

/// Copy `src` into `segs` (offsets relative to `lo`, in payload order) of `ext`; false if a
/// segment or the payload does not fit (the checks before make that a protocol bug). A run
/// is placed in one loop of fixed-size copies.
fn place_small(ext: &mut [u8], lo: u64, segs: &Segs, src: &[u8]) -> bool {
    let list = match segs {
        Segs::List(list) => list,
        Segs::Run(r) => {
            let at = r
                .first
                .off
                .checked_sub(lo)
                .and_then(|a| usize::try_from(a).ok());
            let (len, stride) = (usize::try_from(r.first.len), usize::try_from(r.stride));
            return match (at.and_then(|a| ext.get_mut(a..)), len, stride) {
                (Some(dst), Ok(len), Ok(stride)) => {
                    src.len() == len.saturating_mul(r.count as usize)
                        && crate::small_copy::scatter(dst, stride, src, len, r.count as usize)
                }
                _ => false,
            };
        }
    };
    let mut at = 0usize;
    for s in list {
        let (off, len) = ((s.off - lo) as usize, s.len as usize);
        let (Some(dst), Some(part)) = (ext.get_mut(off..off + len), src.get(at..at + len)) else {
            return false;
        };
        crate::small_copy::copy(dst, part);
        at += len;
    }
    true
}

/// Where a WRITE chunk's payload went.
pub(super) enum Placed {
    /// Placed (or refused and drained): the chunk's code and message.
    Now(u32, String),
    /// Read into device memory, whose last copies may still run: answer once it settles.
    Device(gpu_io::Landing),
}

/// Place a checked WRITE chunk's payload into its region, or drain it if refused. `prev`,
/// this connection's landing still unanswered, is settled early if GPU staging runs dry.
pub(super) async fn place(
    shard: &Rc<Shard>,
    reader: &mut FrameReader<Rx>,
    chunk: &Chunk,
    payload: u64,
    checked: Result<(), Refusal>,
    region: Option<&SharedRegion>,
    prev: Option<&mut gpu_io::Landing>,
) -> Result<Placed, ConnError> {
    match (checked, region) {
        (Ok(()), Some(region)) if region.device().is_some() => {
            let spans: Vec<(u64, u64)> = chunk.segs.iter().map(|s| (s.off, s.len)).collect();
            let landing = gpu_io::receive_into_device(shard, reader, region, &spans, prev).await?;
            Ok(Placed::Device(landing))
        }
        (Ok(()), Some(region)) => place_host(reader, chunk, payload, region)
            .await
            .map(|(code, msg)| Placed::Now(code, msg)),
        (Err(refusal), _) => {
            reader.discard_payload(payload).await?;
            Ok(Placed::Now(refusal.code, refusal.msg.to_string()))
        }
        (Ok(()), None) => {
            reader.discard_payload(payload).await?;
            Ok(Placed::Now(target::GONE.code, target::GONE.msg.into()))
        }
    }
}

/// Place a checked WRITE chunk's payload into host memory.
async fn place_host(
    reader: &mut FrameReader<Rx>,
    chunk: &Chunk,
    payload: u64,
    region: &SharedRegion,
) -> Result<(u32, String), ConnError> {
    if let Some(src) = usize::try_from(payload)
        .ok()
        .and_then(|n| reader.take_buffered(n))
    {
        // All of it arrived with the header (small batches): place without awaiting.
        // check_chunk put every segment inside the extent, and the extent inside the
        // region, so the region is resolved once and each segment only indexed.
        let (lo, hi) = chunk.extent;
        // SAFETY: as below; the peer may write the extent, which the check bounded.
        let ext = unsafe { region.slice_mut(lo, hi - lo) }
            .ok_or_else(|| ConnError::Violation("extent out of range".into()))?;
        if !place_small(ext, lo, &chunk.segs, src) {
            return Err(ConnError::Violation("segment outside its extent".into()));
        }
        return Ok((codes::SUCCESS, String::new()));
    }
    if ascending_disjoint(chunk.segs.iter().map(|s| (s.off, s.len))) {
        // Disjoint destinations: hand them all to one scattered read.
        let mut dsts = Vec::with_capacity(chunk.segs.len());
        for s in chunk.segs.iter() {
            // SAFETY: bounds checked above against the live region (kept alive by
            // `region` across the awaits); the peer may write it because it is
            // registered; the ranges are disjoint, so the slices do not alias.
            let dst = unsafe { region.slice_mut(s.off, s.len) };
            dsts.push(dst.ok_or_else(|| ConnError::Violation("segment out of range".into()))?);
        }
        reader.read_payload_scatter(&mut dsts).await?;
    } else {
        for s in chunk.segs.iter() {
            // SAFETY: as above; one slice at a time, so overlaps cannot alias.
            let dst = unsafe { region.slice_mut(s.off, s.len) };
            let dst = dst.ok_or_else(|| ConnError::Violation("segment out of range".into()))?;
            reader.read_payload(dst).await?;
        }
    }
    Ok((codes::SUCCESS, String::new()))
}
