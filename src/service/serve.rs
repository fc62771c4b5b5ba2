//! Target side: accept connections, check their HELLO, hand each to the shard that serves its
//! lane, and answer WRITE / READ / FINISH frames by placing into or sending from registered
//! memory.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;

use futures_lite::AsyncWriteExt;
use morio_shards::rt;

use super::gpu_io::{self, SendError};
use super::io::{
    ascending_disjoint, configure_conn, read_frame_exact, ConnError, FrameReader, FrameWriter,
};
use super::join::JoinReport;
use super::{ServedConn, Shard, ShardMsg, TaskGuard};
use crate::proto::codes;
use crate::proto::frame::{Chunk, Frame, Hello, HelloAck, Op, Reply};
use crate::proto::inbound::check_chunk;
use crate::proto::limits::{MAX_LANES, VERSION};
use crate::status::StatusCode;
use crate::trace;

/// Accept connections forever (shard 0). Each gets its own task, so a slow or hostile client
/// holds up nobody.
pub(crate) async fn accept_loop(shard: Rc<Shard>, sock: socket2::Socket) {
    let _live = TaskGuard::new(&shard);
    // Registered like a served socket: shutdown wakes the pending accept and ends the loop,
    // and the listener is closed before the engine is gone.
    let _served = ServedConn::new(&shard, sock.as_raw_fd());
    let listener = rt::listener_from_socket(sock);
    while !shard.closing.get() {
        match listener.accept().await {
            Ok(stream) if !shard.closing.get() => {
                rt::spawn_local(handshake(shard.clone(), stream)).detach();
            }
            Ok(_) => break,
            Err(e) if !shard.closing.get() => {
                log::warn!("accept failed: {e}");
                rt::sleep(std::time::Duration::from_millis(10)).await;
            }
            Err(_) => break,
        }
    }
}

async fn refuse(stream: &mut rt::TcpStream, code: u32, msg: String) {
    let ack = Frame::HelloAck(HelloAck {
        version: VERSION,
        code,
        key: String::new(),
        msg,
    });
    let mut buf = Vec::new();
    ack.encode(0, &mut buf);
    let _ = stream.write_all(&buf).await;
}

async fn handshake(shard: Rc<Shard>, mut stream: rt::TcpStream) {
    let _live = TaskGuard::new(&shard);
    let served = ServedConn::new(&shard, stream.as_raw_fd());
    let cfg = &shard.shared.cfg;
    let hello = match rt::timeout(cfg.handshake_timeout, read_frame_exact(&mut stream)).await {
        Some(Ok(Frame::Hello(h))) => h,
        Some(Ok(f)) => {
            return refuse(
                &mut stream,
                codes::ERR_INVALID_ARGS,
                format!("expected HELLO, got {:?}", f.kind()),
            )
            .await;
        }
        Some(Err(e)) => {
            log::debug!("dropping connection before HELLO: {e}");
            return;
        }
        None => {
            log::debug!(
                "dropping connection: no HELLO within {:?}",
                cfg.handshake_timeout
            );
            return;
        }
    };
    let problem = if hello.version != VERSION {
        Some(format!(
            "protocol version {} not supported (want {VERSION})",
            hello.version
        ))
    } else if hello.dst_key != shard.shared.key {
        Some(format!(
            "this is engine {:?}, not {:?}",
            shard.shared.key, hello.dst_key
        ))
    } else if hello.src_key.is_empty() {
        Some("empty engine key".to_string())
    } else if hello.n_lanes == 0 || hello.n_lanes > MAX_LANES || hello.lane >= hello.n_lanes {
        Some(format!("bad lane {} of {}", hello.lane, hello.n_lanes))
    } else {
        None
    };
    if let Some(msg) = problem {
        let code = if hello.dst_key != shard.shared.key {
            codes::ERR_NOT_FOUND
        } else {
            codes::ERR_INVALID_ARGS
        };
        return refuse(&mut stream, code, msg).await;
    }
    let to = shard.lane_shard(hello.lane);
    drop(served);
    if to == shard.id {
        rt::spawn_local(serve(shard.clone(), stream, hello)).detach();
        return;
    }
    // Hand the socket to the lane's shard: duplicate the fd, drop our stream.
    // SAFETY: the fd is open for as long as `stream` lives.
    let dup = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) }.try_clone_to_owned();
    drop(stream);
    match dup {
        Ok(fd) => shard.send(to, ShardMsg::Adopt(fd, hello)),
        Err(e) => log::warn!("cannot hand a connection to shard {to}: {e}"),
    }
}

/// Serve a connection handed over by the accepting shard.
pub(crate) fn adopt(shard: &Rc<Shard>, fd: OwnedFd, hello: Hello) {
    // SAFETY: we own `fd`; the stream takes it over.
    let sock = unsafe { socket2::Socket::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(fd)) };
    match rt::stream_from_socket(sock) {
        Ok(stream) => {
            rt::spawn_local(serve(shard.clone(), stream, hello)).detach();
        }
        Err(e) => log::warn!("cannot adopt a connection: {e}"),
    }
}

async fn serve(shard: Rc<Shard>, stream: rt::TcpStream, hello: Hello) {
    let _live = TaskGuard::new(&shard);
    let _served = ServedConn::new(&shard, stream.as_raw_fd());
    if shard.closing.get() {
        return;
    }
    let cfg = &shard.shared.cfg;
    // SAFETY: the fd is open while `stream` lives, which outlasts this borrow.
    let fd = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
    if let Err(e) = configure_conn(&socket2::SockRef::from(&fd), cfg) {
        log::debug!("socket options on an accepted connection: {e}");
    }
    let (r, w) = rt::split(stream);
    let mut reader = FrameReader::new(r, cfg.op_timeout);
    let mut writer = FrameWriter::new(w, cfg.inline_write_bytes);
    let ack = Frame::HelloAck(HelloAck {
        version: VERSION,
        code: codes::SUCCESS,
        key: shard.shared.key.clone(),
        msg: String::new(),
    });
    if writer.send(&ack, &[]).await.is_err() {
        return;
    }
    let conn = Conn {
        peer: hello.src_key.as_str().into(),
        instance: hello.instance,
        lane: hello.lane,
        n_lanes: hello.n_lanes,
    };
    let mut last_uid = None;
    loop {
        let r = match step(&shard, &conn, &mut reader, &mut writer, &mut last_uid).await {
            Ok(true) => Ok(()),
            Ok(false) => return,
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            log::debug!("closing connection from {}: {e}", conn.peer);
            let bye = Frame::GoAway {
                code: codes::ERR_BAD_STATE,
                msg: e.to_string(),
            };
            let _ = writer.send(&bye, &[]).await;
            writer.inner().shutdown_both();
            return;
        }
        rt::yield_if_needed().await;
    }
}

/// A served connection: whose it is and which lane.
struct Conn {
    peer: Arc<str>,
    instance: u64,
    lane: u16,
    n_lanes: u16,
}

/// One turn of a connection: serve the next frame. `Ok(false)`: the peer closed the
/// connection between frames.
async fn step(
    shard: &Rc<Shard>,
    conn: &Conn,
    reader: &mut FrameReader<rt::ReadHalf>,
    writer: &mut FrameWriter,
    last_uid: &mut Option<(u64, bool)>,
) -> Result<bool, ConnError> {
    let Some((frame, payload)) = reader.next_frame().await? else {
        return Ok(false);
    };
    let uid = traced_uid(&frame);
    let first_read = reader.take_first_read_ns();
    if let Some(uid) = uid {
        trace::mark_at(uid, trace::stage::T_READABLE, first_read);
        trace::mark(uid, trace::stage::T_RECV);
    }
    let joined = on_frame(shard, conn, reader, writer, frame, payload).await?;
    if let Some(uid) = uid {
        trace::mark(uid, trace::stage::T_PLACED);
        *last_uid = Some((uid, joined));
    }
    // Answers to a burst of requests leave together, once no further request is already
    // buffered.
    if !reader.frame_ready() {
        writer.flush().await?;
        if let Some((uid, joined)) = last_uid.take() {
            trace::mark(uid, trace::stage::T_SENT);
            if joined {
                trace::mark(uid, trace::stage::T_ANSWERED);
            }
        }
    }
    Ok(true)
}

/// A chunk of a multi-chunk transfer must name a lane of this peer as its join lane (the
/// initiator's home lane, which also carries FINISH), and chunk 0 must ride it.
fn check_join(conn: &Conn, chunk: &Chunk) -> Result<(), ConnError> {
    if chunk.join_lane >= conn.n_lanes || (chunk.chunk == 0 && chunk.join_lane != conn.lane) {
        return Err(ConnError::Violation(format!(
            "chunk {} of transfer {} names join lane {} on lane {} of {}",
            chunk.chunk, chunk.uid, chunk.join_lane, conn.lane, conn.n_lanes
        )));
    }
    Ok(())
}

/// A chunk of a multi-chunk transfer was handled here with `code`: report it to the
/// engine's join. When its report completes the join, the inbound status is recorded and
/// the COMPLETE for the whole transfer (this chunk's tag) is returned, to leave on this
/// connection; another chunk gets no answer of its own (a read's was its READ_DATA).
fn joined(
    shard: &Rc<Shard>,
    conn: &Conn,
    op: Op,
    chunk: &Chunk,
    code: u32,
    msg: &str,
) -> Option<Frame> {
    let r = JoinReport {
        peer: &conn.peer,
        instance: conn.instance,
        uid: chunk.uid,
        op,
        n_chunks: chunk.n_chunks,
        chunk: chunk.chunk,
        code,
        msg,
    };
    let (code, msg) = shard.shared.joins.report(&r)?;
    trace::mark(chunk.uid, trace::stage::T_FINISH);
    // The inbound status exists before the initiator can see the completion.
    shard
        .shared
        .inbound
        .record(&conn.peer, chunk.uid, status_of(code), &msg);
    {
        let mut st = shard.stats.borrow_mut();
        st.inbound_transfers += 1;
        st.joined_transfers += 1;
    }
    Some(Frame::Complete(Reply {
        tag: chunk.tag,
        uid: chunk.uid,
        chunk: chunk.chunk,
        code,
        msg,
    }))
}

/// The transfer a frame belongs to, when latency tracing is on.
fn traced_uid(frame: &Frame) -> Option<u64> {
    if !trace::enabled() {
        return None;
    }
    match frame {
        Frame::Write { chunk, .. } | Frame::Read { chunk, .. } => Some(chunk.uid),
        Frame::Finish(f) => Some(f.uid),
        _ => None,
    }
}

fn status_of(code: u32) -> StatusCode {
    StatusCode::from_u32(code).unwrap_or(StatusCode::ErrBadState)
}

async fn on_frame(
    shard: &Rc<Shard>,
    conn: &Conn,
    reader: &mut FrameReader<rt::ReadHalf>,
    writer: &mut FrameWriter,
    frame: Frame,
    payload: u64,
) -> Result<bool, ConnError> {
    let inbound = &shard.shared.inbound;
    let peer = &*conn.peer;
    match frame {
        Frame::Write { chunk, final_ } => {
            if !final_ {
                check_join(conn, &chunk)?;
            }
            let (code, msg) = place(shard, reader, &chunk, payload).await?;
            if !final_ {
                return answer_join(writer, joined(shard, conn, Op::Write, &chunk, code, &msg))
                    .await;
            }
            let reply = Reply {
                tag: chunk.tag,
                uid: chunk.uid,
                chunk: chunk.chunk,
                code,
                msg,
            };
            // The inbound status exists before the initiator can see the completion.
            inbound.record(peer, chunk.uid, status_of(code), &reply.msg);
            shard.stats.borrow_mut().inbound_transfers += 1;
            writer.push(&Frame::Complete(reply), &[]).await?;
        }
        Frame::Read { chunk, final_ } => {
            if !final_ {
                check_join(conn, &chunk)?;
            }
            let (code, msg) = read(shard, peer, writer, &chunk, final_).await?;
            if !final_ {
                // After this chunk's READ_DATA, on the same connection.
                return answer_join(writer, joined(shard, conn, Op::Read, &chunk, code, &msg))
                    .await;
            }
        }
        Frame::Finish(f) => {
            trace::mark(f.uid, trace::stage::T_FINISH);
            // A chunk never left the initiator: its verdict ends the transfer here.
            inbound.record(peer, f.uid, status_of(f.code), &f.msg);
            shard.stats.borrow_mut().inbound_transfers += 1;
            shard
                .shared
                .joins
                .end((&conn.peer, conn.instance, f.uid), f.op, f.n_chunks);
            let reply = Reply {
                tag: f.tag,
                uid: f.uid,
                chunk: 0,
                code: f.code,
                msg: f.msg,
            };
            writer.push(&Frame::Complete(reply), &[]).await?;
        }
        other => {
            return Err(ConnError::Violation(format!(
                "unexpected {:?} from initiator",
                other.kind()
            )));
        }
    }
    Ok(false)
}

/// Send a join's COMPLETE (if this chunk completed it); whether one was sent.
async fn answer_join(writer: &mut FrameWriter, complete: Option<Frame>) -> Result<bool, ConnError> {
    match complete {
        Some(f) => {
            writer.push(&f, &[]).await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Answer a READ chunk with READ_DATA (its bytes, or its refusal); a FINAL one records the
/// inbound status first. Returns the chunk's code and message.
async fn read(
    shard: &Rc<Shard>,
    peer: &str,
    writer: &mut FrameWriter,
    chunk: &Chunk,
    final_: bool,
) -> Result<(u32, String), ConnError> {
    let inbound = &shard.shared.inbound;
    let region = shard.regions.borrow().get(&chunk.mem_id).cloned();
    let checked = check_chunk(chunk, region.as_ref().map(|r| r.len() as u64));
    let mut reply = Reply {
        tag: chunk.tag,
        uid: chunk.uid,
        chunk: chunk.chunk,
        code: codes::SUCCESS,
        msg: String::new(),
    };
    if let (Ok(()), Some(region)) = (&checked, &region) {
        if region.device().is_some() {
            return read_from_device(shard, peer, writer, region, chunk, reply, final_).await;
        }
    }
    let mut slices = Vec::new();
    match (checked, &region) {
        (Ok(()), Some(region)) => {
            for s in &chunk.segs {
                // SAFETY: bounds checked above against the live region; reading it is
                // what the peer's read request asks for.
                match unsafe { region.slice(s.off, s.len) } {
                    Some(b) => slices.push(b),
                    None => return Err(ConnError::Violation("segment out of range".into())),
                }
            }
        }
        (Err(refusal), _) => {
            reply.code = refusal.code;
            reply.msg = refusal.msg.to_string();
        }
        (Ok(()), None) => unreachable_refusal(&mut reply),
    }
    if final_ {
        // Recorded before the bytes leave: once the initiator has them all, the target's
        // status already exists. A failed send aborts the connection and the initiator
        // fails too.
        inbound.record(peer, chunk.uid, status_of(reply.code), &reply.msg);
        shard.stats.borrow_mut().inbound_transfers += 1;
    }
    let payload: Vec<&[u8]> = if reply.code == codes::SUCCESS {
        slices
    } else {
        Vec::new()
    };
    let sent: u64 = payload.iter().map(|p| p.len() as u64).sum();
    let (code, msg) = (reply.code, reply.msg.clone());
    writer
        .push(&Frame::ReadData { reply, final_ }, &payload)
        .await?;
    shard.stats.borrow_mut().inbound_bytes_read += sent;
    Ok((code, msg))
}

/// Answer a READ of device memory: staged through pinned slots, pipelined with the send.
async fn read_from_device(
    shard: &Rc<Shard>,
    peer: &str,
    writer: &mut FrameWriter,
    region: &crate::region::Region,
    chunk: &Chunk,
    mut reply: Reply,
    final_: bool,
) -> Result<(u32, String), ConnError> {
    let inbound = &shard.shared.inbound;
    if final_ {
        // As for host memory: recorded before the bytes leave.
        inbound.record(peer, chunk.uid, StatusCode::Success, "");
        shard.stats.borrow_mut().inbound_transfers += 1;
    }
    let spans: Vec<(u64, u64)> = chunk.segs.iter().map(|s| (s.off, s.len)).collect();
    let bytes = chunk.bytes();
    let frame = Frame::ReadData {
        reply: reply.clone(),
        final_,
    };
    match gpu_io::push_from_device(shard, writer, &frame, region, &spans).await {
        Ok(()) => {
            shard.stats.borrow_mut().inbound_bytes_read += bytes;
            Ok((codes::SUCCESS, String::new()))
        }
        Err(SendError::Gpu(e)) => {
            // Nothing left yet: answer with the error instead (it replaces the SUCCESS
            // recorded above, which no one can have seen).
            reply.code = codes::ERR_GPU_OP;
            reply.msg = format!("staging copy from GPU memory failed: {e}");
            if final_ {
                inbound.record(peer, chunk.uid, StatusCode::ErrGpuOp, &reply.msg);
            }
            let (code, msg) = (reply.code, reply.msg.clone());
            writer.push(&Frame::ReadData { reply, final_ }, &[]).await?;
            Ok((code, msg))
        }
        Err(SendError::Conn(e)) => Err(e),
    }
}

fn unreachable_refusal(reply: &mut Reply) {
    // check_chunk refuses a missing region, so this arm cannot run; answer sanely anyway.
    reply.code = codes::ERR_NOT_FOUND;
    reply.msg = "remote memory region not registered".into();
}

/// Validate a WRITE chunk and place its payload, or drain it if refused.
/// Copy `src` into `segs` (offsets relative to `lo`, in payload order) of `ext`; false if a
/// segment or the payload does not fit (the checks before make that a protocol bug).
fn place_small(ext: &mut [u8], lo: u64, segs: &[crate::proto::frame::Seg], src: &[u8]) -> bool {
    let mut at = 0usize;
    for s in segs {
        let (off, len) = ((s.off - lo) as usize, s.len as usize);
        let (Some(dst), Some(part)) = (ext.get_mut(off..off + len), src.get(at..at + len)) else {
            return false;
        };
        dst.copy_from_slice(part);
        at += len;
    }
    true
}

async fn place(
    shard: &Rc<Shard>,
    reader: &mut FrameReader<rt::ReadHalf>,
    chunk: &Chunk,
    payload: u64,
) -> Result<(u32, String), ConnError> {
    let region = shard.regions.borrow().get(&chunk.mem_id).cloned();
    let checked = check_chunk(chunk, region.as_ref().map(|r| r.len() as u64));
    trace::mark(chunk.uid, trace::stage::T_CHECKED);
    match (checked, region) {
        (Ok(()), Some(region)) if region.device().is_some() => {
            let spans: Vec<(u64, u64)> = chunk.segs.iter().map(|s| (s.off, s.len)).collect();
            match gpu_io::read_into_device(shard, reader, &region, &spans).await? {
                Ok(()) => {
                    shard.stats.borrow_mut().inbound_bytes_written += payload;
                    Ok((codes::SUCCESS, String::new()))
                }
                Err(e) => Ok((
                    codes::ERR_GPU_OP,
                    format!("staging copy into GPU memory failed: {e}"),
                )),
            }
        }
        (Ok(()), Some(region)) => {
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
                shard.stats.borrow_mut().inbound_bytes_written += payload;
                return Ok((codes::SUCCESS, String::new()));
            }
            if ascending_disjoint(chunk.segs.iter().map(|s| (s.off, s.len))) {
                // Disjoint destinations: hand them all to one scattered read.
                let mut dsts = Vec::with_capacity(chunk.segs.len());
                for s in &chunk.segs {
                    // SAFETY: bounds checked above against the live region (kept alive by
                    // `region` across the awaits); the peer may write it because it is
                    // registered; the ranges are disjoint, so the slices do not alias.
                    let dst = unsafe { region.slice_mut(s.off, s.len) };
                    dsts.push(
                        dst.ok_or_else(|| ConnError::Violation("segment out of range".into()))?,
                    );
                }
                reader.read_payload_scatter(&mut dsts).await?;
            } else {
                for s in &chunk.segs {
                    // SAFETY: as above; one slice at a time, so overlaps cannot alias.
                    let dst = unsafe { region.slice_mut(s.off, s.len) };
                    let dst =
                        dst.ok_or_else(|| ConnError::Violation("segment out of range".into()))?;
                    reader.read_payload(dst).await?;
                }
            }
            shard.stats.borrow_mut().inbound_bytes_written += payload;
            Ok((codes::SUCCESS, String::new()))
        }
        (Err(refusal), _) => {
            reader.discard_payload(payload).await?;
            Ok((refusal.code, refusal.msg.to_string()))
        }
        (Ok(()), None) => {
            reader.discard_payload(payload).await?;
            Ok((
                codes::ERR_NOT_FOUND,
                "remote memory region not registered".into(),
            ))
        }
    }
}
