//! Initiator lanes, receiving side: the reader task that matches each answer to the frame
//! it answers, places read data and reports results to the transfer's owner.

use std::rc::Rc;

use super::super::express;
use super::super::gpu_io;
use super::super::{Shard, TaskGuard};
use super::{die, express_done, placing, report, Lane};
use crate::proto::codes;
use crate::proto::dispatch::TransferRef;
use crate::proto::frame::Frame;
use crate::proto::lane::{Answer, Matched, ReadWait};
use crate::proto::layout::Layout;
use crate::region::SharedRegion;
use crate::trace;
use crate::transport::framed::{ascending_disjoint, ConnError, FrameReader};
use crate::transport::Rx;

pub(super) async fn read_loop(shard: Rc<Shard>, lane: Rc<Lane>, mut reader: FrameReader<Rx>) {
    let _live = TaskGuard::new(&shard);
    let mut landing = None;
    loop {
        let r = match reader.next_frame().await {
            Ok(Some((frame, payload))) => {
                on_frame(&shard, &lane, &mut reader, frame, payload, &mut landing).await
            }
            Ok(None) => Err(ConnError::Closed),
            Err(e) => Err(e),
        };
        // Data still landing is reported once its copies are done: now, unless the next
        // answer has begun to arrive and the lane lives on. Its transfer has left the lane's
        // book, so it must be reported before the lane dies.
        // So does one whose transfer was cancelled: its owner waits for the copies to end.
        if landing.as_ref().is_some_and(|l| {
            r.is_err() || lane.dead() || !reader.input_waiting() || placing::aborted(&lane, l.to)
        }) {
            land(&shard, &lane, &mut landing).await;
        }
        if let Err(e) = r {
            placing::end_all(&shard, &lane);
            return die(&shard, &lane, &e.to_string());
        }
        if lane.dead() {
            placing::end_all(&shard, &lane);
            return;
        }
    }
}

/// A READ_DATA chunk placed into GPU memory whose copies may still run: reported once they
/// are done, while the lane reads the answer after it.
struct Landing {
    tag: u64,
    to: TransferRef,
    wait: ReadWait<SharedRegion>,
    copies: gpu_io::Landing,
}

/// Report the chunk still landing, if any, once its copies are done.
async fn land(shard: &Rc<Shard>, lane: &Rc<Lane>, landing: &mut Option<Landing>) {
    let Some(l) = landing.take() else { return };
    let (code, msg) = gpu_io::landed(l.copies.finish(shard).await);
    placing::end(shard, lane, l.to);
    read_done(shard, lane, (l.tag, l.to, &l.wait), code, msg);
}

/// Count a READ_DATA's bytes (when placed) and report the chunk to its owner.
fn read_done(
    shard: &Rc<Shard>,
    lane: &Rc<Lane>,
    (tag, to, wait): (u64, TransferRef, &ReadWait<SharedRegion>),
    code: u32,
    msg: String,
) {
    if code == codes::SUCCESS {
        shard
            .stats
            .borrow_mut()
            .count_received(lane.counters, wait.bytes);
    }
    let r = lane
        .book
        .borrow_mut()
        .read_done(tag, to, wait, code, msg, |t| {
            shard.shared.may_run(t.owner, t.gen)
        });
    report(shard, &lane.peer.key, to, r);
}

async fn on_frame(
    shard: &Rc<Shard>,
    lane: &Rc<Lane>,
    reader: &mut FrameReader<Rx>,
    frame: Frame,
    payload: u64,
    landing: &mut Option<Landing>,
) -> Result<(), ConnError> {
    let violation = |what: &str| Err(ConnError::Violation(what.to_string()));
    // Answers are handled in the order they came: the one before first, unless this is
    // another READ_DATA (independent of it), whose payload may be read while it lands.
    if !matches!(frame, Frame::ReadData { .. }) || tag_of(&frame) & express::TAG_BIT != 0 {
        land(shard, lane, landing).await;
    }
    let (tag, uid, answer) = match frame {
        Frame::Complete(r) => (
            r.tag,
            r.uid,
            Answer::Complete {
                code: r.code,
                msg: r.msg,
            },
        ),
        Frame::ReadData { reply: r, final_ } => (
            r.tag,
            r.uid,
            Answer::ReadData {
                chunk: r.chunk,
                final_,
                code: r.code,
                msg: r.msg,
            },
        ),
        Frame::GoAway { msg, .. } => {
            return Err(ConnError::Violation(format!("peer closed the lane: {msg}")))
        }
        _ => return violation("unexpected frame kind from target"),
    };
    if tag & express::TAG_BIT != 0 {
        // An express transfer's answer: it completes the status here.
        let Some(p) = lane.peer.express.answered(lane.lane, tag, uid) else {
            return reader.discard_payload(payload).await;
        };
        let _ = reader.take_first_read_ns();
        trace::mark_at(uid, trace::stage::NOTICED, reader.take_noticed_ns());
        trace::mark(uid, trace::stage::RESP);
        trace::set_current(Some(uid));
        let r = express_answer(shard, lane, reader, p, answer, payload).await;
        trace::set_current(None);
        return r;
    }
    // A frame's own answer, or the join's COMPLETE for a transfer of several chunks.
    let own = lane.book.borrow().awaits(tag);
    let matched = lane.book.borrow_mut().answer(tag, uid, answer);
    let (to, wait, answer) = match matched.map_err(|v| ConnError::Violation(v.to_string()))? {
        Matched::Stale => return reader.discard_payload(payload).await,
        Matched::Report(to, r) => {
            let stage = if own {
                trace::stage::RESP
            } else {
                trace::stage::COMPLETED
            };
            trace::mark(uid, stage);
            report(shard, &lane.peer.key, to, r);
            return Ok(());
        }
        Matched::ReadData(to, wait, answer) => (to, wait, answer),
    };
    trace::mark(uid, trace::stage::RESP);
    let Answer::ReadData {
        mut code, mut msg, ..
    } = answer
    else {
        return violation("answer does not match its request");
    };
    if code == codes::SUCCESS && payload != wait.bytes {
        land(shard, lane, landing).await;
        return violation("read data length differs from the request");
    }
    // From here until its bytes are in place, cancelling the transfer stops this chunk
    // (the lane's book no longer holds it): nothing of it lands after its failure is
    // reported.
    let device = wait.local.device().is_some();
    let abort = (code == codes::SUCCESS).then(|| placing::begin(lane, to, device));
    // Only data of the same transfer is read while the chunk before lands: another
    // transfer's bytes never hold up this one's report.
    if landing.as_ref().is_some_and(|l| l.to != to) {
        land(shard, lane, landing).await;
    }
    if abort.as_ref().is_some_and(|a| a.is_set()) {
        return dropped(shard, lane, reader, to).await;
    }
    if code == codes::SUCCESS && device {
        let spans: Vec<(u64, u64)> = wait.pieces.iter().map(|p| (p.local, p.len)).collect();
        let prev = landing.as_mut().map(|l| &mut l.copies);
        reader.set_abort(abort);
        let placed = gpu_io::receive_into_device(shard, reader, &wait.local, &spans, prev).await;
        reader.set_abort(None);
        land(shard, lane, landing).await;
        let copies = match placed {
            Err(ConnError::Aborted) => return dropped(shard, lane, reader, to).await,
            Err(e) => {
                placing::end(shard, lane, to);
                lane.book.borrow_mut().read_cut(tag, to);
                return Err(e);
            }
            Ok(c) => c,
        };
        if copies.may_land() && reader.input_waiting() {
            *landing = Some(Landing {
                tag,
                to,
                wait,
                copies,
            });
            shard.stats.borrow_mut().gpu_overlapped_landings += 1;
            return Ok(());
        }
        (code, msg) = gpu_io::landed(copies.finish(shard).await);
        placing::end(shard, lane, to);
    } else {
        land(shard, lane, landing).await;
        if abort.as_ref().is_some_and(|a| a.is_set()) {
            return dropped(shard, lane, reader, to).await;
        }
        if code == codes::SUCCESS {
            // Bytes already buffered are placed without a receive (no await): the flag was
            // just checked.
            reader.set_abort(abort);
            let placed = place(shard, reader, &wait).await;
            reader.set_abort(None);
            placing::end(shard, lane, to);
            (code, msg) = match placed {
                Err(ConnError::Aborted) => return drop_rest(reader).await,
                Err(e) => {
                    lane.book.borrow_mut().read_cut(tag, to);
                    return Err(e);
                }
                Ok(r) => gpu_io::landed(r),
            };
        }
    }
    read_done(shard, lane, (tag, to, &wait), code, msg);
    Ok(())
}

/// A chunk whose transfer was cancelled while it was placed: nothing more of it lands (its
/// copies into device memory, if any, are done), so its owner may hear so; the rest of its
/// payload is read and dropped. Its transfer has ended: nobody waits for its report.
async fn dropped(
    shard: &Rc<Shard>,
    lane: &Rc<Lane>,
    reader: &mut FrameReader<Rx>,
    to: TransferRef,
) -> Result<(), ConnError> {
    placing::end(shard, lane, to);
    drop_rest(reader).await
}

async fn drop_rest(reader: &mut FrameReader<Rx>) -> Result<(), ConnError> {
    reader.discard_payload(reader.payload_left()).await
}

/// A READ_DATA or COMPLETE frame's tag (0 for other kinds).
fn tag_of(frame: &Frame) -> u64 {
    match frame {
        Frame::Complete(r) => r.tag,
        Frame::ReadData { reply, .. } => reply.tag,
        _ => 0,
    }
}

/// Complete express transfer `p` with its answer: a write's COMPLETE, or a read's READ_DATA
/// (its payload placed first). An answer that does not match its request, or data that
/// cannot be placed, fails the transfer and then the lane.
async fn express_answer(
    shard: &Rc<Shard>,
    lane: &Rc<Lane>,
    reader: &mut FrameReader<Rx>,
    p: express::Pending,
    answer: Answer,
    payload: u64,
) -> Result<(), ConnError> {
    let fail = |p: express::Pending, what: &str| {
        express_done(shard, lane, p, codes::ERR_BAD_STATE, what, false);
        Err(ConnError::Violation(what.to_string()))
    };
    match (answer, &p.read) {
        (Answer::Complete { code, msg }, None) => {
            express_done(shard, lane, p, code, &msg, true);
            Ok(())
        }
        (
            Answer::ReadData {
                chunk: 0,
                final_: true,
                code,
                msg,
            },
            Some(wait),
        ) => {
            if code != codes::SUCCESS {
                reader.discard_payload(payload).await?;
                express_done(shard, lane, p, code, &msg, true);
                return Ok(());
            }
            if payload != wait.bytes {
                return fail(p, "read data length differs from the request");
            }
            match place(shard, reader, wait).await {
                Ok(Ok(())) => {
                    express_done(shard, lane, p, codes::SUCCESS, "", true);
                    Ok(())
                }
                Ok(Err(e)) => {
                    let msg = format!("placing read data failed: {e}");
                    express_done(shard, lane, p, codes::ERR_GPU_OP, &msg, true);
                    Ok(())
                }
                Err(e) => {
                    express_done(shard, lane, p, codes::ERR_BAD_STATE, &e.to_string(), false);
                    Err(e)
                }
            }
        }
        _ => fail(p, "answer does not match its express request"),
    }
}

/// Place a READ_DATA's payload (of the expected length) into the local pieces it was asked
/// for. The inner error: a GPU refused the staging copy (the stream is intact).
async fn place(
    shard: &Rc<Shard>,
    reader: &mut FrameReader<Rx>,
    wait: &ReadWait<SharedRegion>,
) -> Result<Result<(), crate::gpu::GpuError>, ConnError> {
    let (local, pieces, bytes) = (&wait.local, &wait.pieces, wait.bytes);
    if local.device().is_some() {
        let spans: Vec<(u64, u64)> = pieces.iter().map(|p| (p.local, p.len)).collect();
        return gpu_io::read_into_device(shard, reader, local, &spans).await;
    }
    let oob = || ConnError::Violation("local range out of bounds".into());
    if let Some(src) = usize::try_from(bytes)
        .ok()
        .and_then(|n| reader.take_buffered(n))
    {
        // All of it arrived with the header (small batches): place it without awaiting; a
        // strided layout into its span, resolved once, in one loop of fixed-size copies.
        if let Layout::Strided(s) = pieces {
            let (first, last) = (s.first, s.last());
            let span_len = (last.local + last.len)
                .checked_sub(first.local)
                .ok_or_else(oob)?;
            // SAFETY: as below; the span is one slice, so its pieces cannot alias.
            let span = unsafe { local.slice_mut(first.local, span_len) }.ok_or_else(oob)?;
            let (len, stride) = (first.len as usize, s.local_stride as usize);
            if !crate::small_copy::scatter(span, stride, src, len, s.count as usize) {
                return Err(oob());
            }
            return Ok(Ok(()));
        }
        let mut at = 0usize;
        for p in pieces.iter() {
            // SAFETY: as below; one slice at a time, so overlaps cannot alias.
            let dst = unsafe { local.slice_mut(p.local, p.len) }.ok_or_else(oob)?;
            let part = src.get(at..at + dst.len()).ok_or_else(oob)?;
            crate::small_copy::copy(dst, part);
            at += dst.len();
        }
    } else if ascending_disjoint(pieces.iter().map(|p| (p.local, p.len))) {
        let mut dsts = Vec::with_capacity(pieces.piece_count());
        for p in pieces.iter() {
            // SAFETY: the range was checked at submission; the bytes placed are the ones
            // this side requested, into the range it requested them for; the ranges are
            // disjoint, so the slices do not alias.
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
    Ok(Ok(()))
}
