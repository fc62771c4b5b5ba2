//! Initiator lanes, the writer's side: one queued item (a WRITE chunk with its payload from
//! host or GPU memory, a READ request, a FINISH) onto the lane's connection.

use std::rc::Rc;

use super::{report, Lane};
use crate::gpu::staging::Slot;
use crate::proto::codes;
use crate::proto::dispatch::{ChunkSpec, FinishSpec, TransferRef};
use crate::proto::frame::{Chunk, Finish, Frame, Op};
use crate::proto::lane::{ReadWait, Report, Sendable};
use crate::proto::layout::{remote_seg, Layout};
use crate::proto::plan::total_bytes;
use crate::region::SharedRegion;
use crate::service::gpu_io::{self, Ahead, SendError};
use crate::service::Shard;
use crate::transport::framed::FrameWriter;

/// Send a WRITE chunk from host memory: a small payload is copied from the region next to
/// the frame (and leaves with the next flush), a large one is gathered straight from it. A
/// strided layout is framed as one run and gathered without building a piece list.
async fn write_host_chunk(
    shard: &Rc<Shard>,
    lane: &Lane,
    writer: &mut FrameWriter,
    out: Outgoing<'_>,
) -> std::io::Result<()> {
    let Outgoing {
        to,
        head,
        pieces,
        local,
        final_,
    } = out;
    // Every `slice` below reads ranges checked against the region at submission; the region
    // lives while `local` does, and reading it is the transfer.
    let (bytes, in_range) = match pieces {
        // Strides do not go backwards, so the first and last pieces bound all of them.
        Layout::Strided(s) => {
            let (first, last) = (s.first, s.last());
            // SAFETY: as above (the slices are only checked for presence, not read).
            let ok = unsafe { local.slice(first.local, first.len) }.is_some()
                // SAFETY: as above.
                && unsafe { local.slice(last.local, last.len) }.is_some();
            (s.total_bytes(), ok)
        }
        Layout::List(list) => {
            let ok = list
                .iter()
                // SAFETY: as above (only checked for presence).
                .all(|p| unsafe { local.slice(p.local, p.len) }.is_some());
            (total_bytes(list), ok)
        }
    };
    let segs = pieces.remote_segs();
    if !in_range {
        return Err(std::io::Error::other("local range out of bounds"));
    }
    lane.book
        .borrow_mut()
        .sending_write(head.tag, to, final_, |t| {
            shard.shared.may_run(t.owner, t.gen)
        });
    shard.stats.borrow_mut().count_sent(lane.counters, bytes);
    if bytes as usize <= writer.inline_bytes() {
        let fill = |buf: &mut Vec<u8>| {
            // SAFETY: as above (the pieces were checked to be in range just now).
            let whole = unsafe { crate::service::gather::gather(local, pieces, buf) };
            debug_assert!(whole);
        };
        writer
            .push_inline_chunk(final_, &head, segs, bytes as usize, fill)
            .await
    } else {
        let slices: Vec<&[u8]> = pieces
            .iter()
            // SAFETY: as above.
            .filter_map(|p| unsafe { local.slice(p.local, p.len) })
            .collect();
        writer.send_chunk(final_, &head, segs, &slices).await
    }
}

/// A WRITE chunk about to leave.
struct Outgoing<'a> {
    to: TransferRef,
    head: crate::proto::frame::ChunkHead,
    pieces: &'a Layout,
    local: &'a SharedRegion,
    final_: bool,
}

/// Send one queued item: a chunk (WRITE with its payload, or a READ request) or a FINISH.
/// `ahead`: the lane's copy of a GPU chunk's first slot issued while the frame before was
/// sent ([`gpu_io::copy_ahead`]); the item takes it when it is that chunk, and a WRITE
/// from GPU memory over TCP leaves the next chunk's there in turn.
pub(super) async fn write_item(
    shard: &Rc<Shard>,
    lane: &Lane,
    writer: &mut FrameWriter,
    (to, item): (TransferRef, Sendable<SharedRegion>),
    ahead: &mut Option<Ahead>,
) -> std::io::Result<()> {
    let tag = lane.book.borrow_mut().next_tag();
    match item {
        Sendable::Chunk(spec, local) => {
            let mine = Ahead::take_for(ahead, (to.uid, to.gen, spec.chunk));
            let mut next = || {
                if lane.connected.get() == Some(super::TCP) {
                    *ahead = copy_next(shard, lane);
                }
            };
            let chunk = (to, tag, spec, local);
            write_chunk(shard, lane, writer, chunk, mine, &mut next).await
        }
        Sendable::Finish(f) => {
            lane.book.borrow_mut().sending_finish(tag, to, f.fence);
            let FinishSpec {
                op,
                n_chunks,
                total,
                code,
                msg,
                fence: _,
            } = f;
            let f = Finish {
                tag,
                uid: to.uid,
                op,
                n_chunks,
                total_bytes: total,
                code,
                msg,
            };
            writer.push(&Frame::Finish(f), &[]).await
        }
    }
}

/// Copy the first staging slot of the lane's next chunk out of GPU memory, if that chunk is
/// a WRITE from GPU memory (a stripe of a shared write is taken for this lane now).
fn copy_next(shard: &Shard, lane: &Lane) -> Option<Ahead> {
    let mut book = lane.book.borrow_mut();
    let (to, spec, local) = book.next_chunk()?;
    if spec.op != Op::Write || local.device().is_none() {
        return None;
    }
    let spans: Vec<(u64, u64)> = spec.pieces.iter().map(|p| (p.local, p.len)).collect();
    let key = (to.uid, to.gen, spec.chunk);
    let local = local.clone();
    drop(book);
    gpu_io::copy_ahead(shard, &local, &spans, key)
}

async fn write_chunk(
    shard: &Rc<Shard>,
    lane: &Lane,
    writer: &mut FrameWriter,
    (to, tag, spec, local): (TransferRef, u64, ChunkSpec, SharedRegion),
    ahead: Option<Slot>,
    next: &mut dyn FnMut(),
) -> std::io::Result<()> {
    let head = spec.head(tag, to.uid);
    let final_ = spec.final_;
    let to_device = spec.remote_device;
    match spec.op {
        Op::Write if local.device().is_some() => {
            // The chunk as a frame value, for GPU staging.
            let pieces = spec.pieces.into_pieces();
            let c = Chunk::new(head, pieces.iter().map(remote_seg).collect::<Vec<_>>());
            let spans: Vec<(u64, u64)> = pieces.iter().map(|p| (p.local, p.len)).collect();
            let bytes = c.bytes();
            lane.book
                .borrow_mut()
                .sending_write(tag, to, final_, |t| shard.shared.may_run(t.owner, t.gen));
            let frame = Frame::Write { chunk: c, final_ };
            let payload = gpu_io::DevicePayload {
                region: &local,
                spans: &spans,
                to_device,
            };
            let pushed = gpu_io::push_from_device(shard, writer, &frame, payload, ahead, next);
            match pushed.await {
                Ok(()) => {
                    shard.stats.borrow_mut().count_sent(lane.counters, bytes);
                    Ok(())
                }
                Err(SendError::Gpu(e)) => {
                    // Nothing of the frame left: fail this chunk, keep the lane.
                    lane.book.borrow_mut().unsend(tag);
                    let msg = format!("staging copy from GPU memory failed: {e}");
                    let code = codes::ERR_GPU_OP;
                    report(shard, &lane.peer.key, to, Report::Failed { code, msg });
                    Ok(())
                }
                Err(SendError::Conn(e)) => Err(std::io::Error::other(e.to_string())),
            }
        }
        Op::Write => {
            let out = Outgoing {
                to,
                head,
                pieces: &spec.pieces,
                local: &local,
                final_,
            };
            write_host_chunk(shard, lane, writer, out).await
        }
        Op::Read => {
            let bytes = spec.pieces.total_bytes();
            let to_device = local.device().is_some();
            writer.queue_read_chunk(final_, &head, spec.pieces.remote_segs(), to_device);
            // Registered before the request can leave (the next flush): the answer can
            // never come early.
            let wait = ReadWait {
                chunk: spec.chunk,
                final_,
                local,
                pieces: spec.pieces,
                bytes,
            };
            lane.book.borrow_mut().sending_read(tag, to, wait);
            writer.flush_if_full().await
        }
    }
}
