//! Initiator lanes, receiving side: the reader task that matches each answer to the frame
//! it answers, places read data and reports results to the transfer's owner.

use std::rc::Rc;

use morio_shards::rt;

use super::super::gpu_io;
use super::super::io::{ascending_disjoint, ConnError, FrameReader};
use super::super::owner::LaneEventKind;
use super::super::{Shard, TaskGuard};
use super::{die, report, Lane, Wait};
use crate::proto::codes;
use crate::proto::frame::Frame;
use crate::trace;

pub(super) async fn read_loop(
    shard: Rc<Shard>,
    lane: Rc<Lane>,
    mut reader: FrameReader<rt::ReadHalf>,
) {
    let _live = TaskGuard::new(&shard);
    loop {
        let r = match reader.next_frame().await {
            Ok(Some((frame, payload))) => {
                on_frame(&shard, &lane, &mut reader, frame, payload).await
            }
            Ok(None) => Err(ConnError::Closed),
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            return die(&shard, &lane, &e.to_string());
        }
        if lane.dead.get() {
            return;
        }
    }
}

async fn on_frame(
    shard: &Rc<Shard>,
    lane: &Rc<Lane>,
    reader: &mut FrameReader<rt::ReadHalf>,
    frame: Frame,
    payload: u64,
) -> Result<(), ConnError> {
    let violation = |what: &str| Err(ConnError::Violation(what.to_string()));
    let (tag, uid) = match &frame {
        Frame::Complete(r) | Frame::ReadData { reply: r, .. } => (r.tag, r.uid),
        Frame::GoAway { msg, .. } => {
            return Err(ConnError::Violation(format!("peer closed the lane: {msg}")))
        }
        _ => return violation("unexpected frame kind from target"),
    };
    let Some(o) = lane.outstanding.borrow_mut().remove(&tag) else {
        if let Frame::Complete(r) = frame {
            let u = lane.unanswered.borrow_mut().remove(&tag);
            if let Some(u) = u {
                if u.uid != uid {
                    return violation("answer names another transfer");
                }
                // A chunk of several completed the target's join: COMPLETE ends the transfer.
                trace::mark(uid, trace::stage::COMPLETED);
                let kind = LaneEventKind::Complete {
                    code: r.code,
                    msg: r.msg,
                };
                report(shard, u.owner, &lane.peer.key, u.uid, u.gen, kind);
                return Ok(());
            }
        }
        // The transfer was cancelled (timeout): drop its answer.
        return reader.discard_payload(payload).await;
    };
    if o.uid != uid {
        return violation("answer names another transfer");
    }
    let answer = if matches!((&frame, &o.wait), (Frame::Complete(_), Wait::Finish)) {
        trace::stage::COMPLETED
    } else {
        trace::stage::RESP
    };
    trace::mark(uid, answer);
    let kind = match (frame, o.wait) {
        (Frame::Complete(r), Wait::Write { final_: true, .. } | Wait::Finish) => {
            LaneEventKind::Complete {
                code: r.code,
                msg: r.msg,
            }
        }
        (
            Frame::ReadData { reply, final_ },
            Wait::Read {
                chunk,
                final_: f,
                local,
                pieces,
                bytes,
            },
        ) if final_ == f && reply.chunk == chunk => {
            let (mut code, mut msg) = (reply.code, reply.msg);
            if code == codes::SUCCESS && local.device().is_some() {
                if payload != bytes {
                    return violation("read data length differs from the request");
                }
                let spans: Vec<(u64, u64)> = pieces.iter().map(|p| (p.local, p.len)).collect();
                if let Err(e) = gpu_io::read_into_device(shard, reader, &local, &spans).await? {
                    code = codes::ERR_GPU_OP;
                    msg = format!("staging copy into GPU memory failed: {e}");
                }
                shard.stats.borrow_mut().bytes_received += bytes;
            } else if code == codes::SUCCESS {
                if payload != bytes {
                    return violation("read data length differs from the request");
                }
                let oob = || ConnError::Violation("local range out of bounds".into());
                if let Some(src) = usize::try_from(bytes)
                    .ok()
                    .and_then(|n| reader.take_buffered(n))
                {
                    // All of it arrived with the header (small batches): place it without
                    // awaiting, one piece at a time.
                    let mut at = 0usize;
                    for p in pieces.iter() {
                        // SAFETY: as below; one slice at a time, so overlaps cannot alias.
                        let dst = unsafe { local.slice_mut(p.local, p.len) }.ok_or_else(oob)?;
                        let part = src.get(at..at + dst.len()).ok_or_else(oob)?;
                        dst.copy_from_slice(part);
                        at += dst.len();
                    }
                } else if ascending_disjoint(pieces.iter().map(|p| (p.local, p.len))) {
                    let mut dsts = Vec::with_capacity(pieces.piece_count());
                    for p in pieces.iter() {
                        // SAFETY: the range was checked at submission; the bytes placed are
                        // the ones this side requested, into the range it requested them for;
                        // the ranges are disjoint, so the slices do not alias.
                        dsts.push(unsafe { local.slice_mut(p.local, p.len) }.ok_or_else(oob)?);
                    }
                    reader.read_payload_scatter(&mut dsts).await?;
                } else {
                    for p in pieces.iter() {
                        // SAFETY: as above; one slice at a time, so overlaps cannot alias.
                        let dst = unsafe { local.slice_mut(p.local, p.len) }.ok_or_else(oob)?;
                        reader.read_payload(dst).await?;
                    }
                }
                shard.stats.borrow_mut().bytes_received += bytes;
            }
            if final_ {
                LaneEventKind::Complete { code, msg }
            } else {
                // The target's COMPLETE for the whole read may follow on this lane.
                lane.unanswered_until_done(&shard.shared, tag, o.owner, o.uid, o.gen);
                LaneEventKind::Chunk { chunk, code, msg }
            }
        }
        _ => return violation("answer does not match its request"),
    };
    report(shard, o.owner, &lane.peer.key, o.uid, o.gen, kind);
    Ok(())
}
