//! Target side: accept connections, check their HELLO, hand each to the shard that serves its
//! lane, and answer WRITE / READ / FINISH frames by placing into or sending from registered
//! memory.

use std::rc::Rc;
use std::sync::Arc;

use morio_shards::rt;

use super::admission::{Admitted, Handshaking};
use super::gpu_io;
use super::msg::ShardMsg;
use super::same_host;
use super::{ServedConn, Shard, TaskGuard};
use crate::proto::codes;
use crate::proto::frame::{Chunk, Frame, Hello, HelloAck};
use crate::proto::handshake;
use crate::proto::inbound::Refusal;
use crate::proto::limits::NONCE_BYTES;
use crate::proto::target::{self, Inbound, Record, Response, Served};
use crate::region::SharedRegion;
use crate::stats::PeerSlot;
use crate::status::StatusCode;
use crate::trace;
use crate::transport::framed::{read_frame_exact, ConnError, FrameReader, FrameWriter};
use crate::transport::{Bound, Conn, Handoff, Rx};

mod place;
mod read;
mod write;
use read::read;
use write::{answer_landed, on_write, Turn};

/// Accept connections forever (shard 0). Each gets its own task, so a slow or hostile client
/// holds up nobody; past `max_handshakes` connections in their handshake, new ones are closed
/// at once.
pub(crate) async fn accept_loop(shard: Rc<Shard>, bound: Bound) {
    let _live = TaskGuard::new(&shard);
    // Registered like a served connection: shutdown wakes the pending accept and ends the
    // loop, and the listener is closed before the engine is gone.
    let _served = ServedConn::new(&shard, bound.closer());
    let listener = bound.into_listener();
    let adm = shard.shared.admission.clone();
    while !shard.closing.get() {
        match listener.accept().await {
            Ok(conn) if !shard.closing.get() => match adm.handshake() {
                Some(ticket) => {
                    rt::spawn_local(handshake(shard.clone(), conn, ticket)).detach();
                }
                None => {
                    adm.log.warn(|| {
                        format!(
                            "engine {}: closing a new connection: {} connections are in \
                             their handshake (max_handshakes)",
                            shard.shared.key, shard.shared.cfg.max_handshakes
                        )
                    });
                    conn.closer().close();
                }
            },
            Ok(_) => break,
            Err(e) if !shard.closing.get() => {
                adm.log
                    .warn(|| format!("engine {}: accept failed: {e}", shard.shared.key));
                rt::sleep(std::time::Duration::from_millis(10)).await;
            }
            Err(_) => break,
        }
    }
}

async fn refuse(conn: &mut Conn, ack: HelloAck) {
    let mut buf = Vec::new();
    Frame::HelloAck(ack).encode(0, &mut buf);
    let _ = conn.send(&buf).await;
}

/// Shake hands with a new connection: its HELLO checked, HELLO_ACK sent and, with a
/// secret, the dialer's AUTH checked, all within `handshake_timeout`. The HELLO of a
/// connection that may be served, or `None` (refused or closed).
async fn shake(shard: &Shard, mut conn: Conn) -> Option<(Conn, Hello)> {
    let cfg = &shard.shared.cfg;
    let secret = cfg.auth_secret.as_ref().map(|s| s.as_bytes());
    let hello = match read_frame_exact(&mut conn).await {
        Ok(Frame::Hello(h)) => h,
        Ok(f) => {
            let refused = handshake::Refused {
                code: codes::ERR_INVALID_ARGS,
                msg: format!("expected HELLO, got {:?}", f.kind()),
            };
            refuse(&mut conn, handshake::refusal(refused, secret)).await;
            return None;
        }
        Err(e) => {
            log::debug!("dropping connection before HELLO: {e}");
            return None;
        }
    };
    if let Err(refused) = handshake::check_hello(&hello, &shard.shared.key) {
        refuse(&mut conn, handshake::refusal(refused, secret)).await;
        return None;
    }
    let nonce: [u8; NONCE_BYTES] = rand::random();
    let same_host = same_host::recognised(&shard.shared, &hello);
    let max = shard.shared.cfg.max_protocol_version;
    let ack = handshake::accept(&shard.shared.key, &hello, secret, nonce, same_host, max);
    let same_host = ack.same_host;
    let version = ack.version;
    let mut buf = Vec::new();
    Frame::HelloAck(ack).encode(0, &mut buf);
    conn.send(&buf).await.ok()?;
    if let Some(secret) = secret {
        match read_frame_exact(&mut conn).await {
            Ok(Frame::Auth(proof)) if handshake::check_auth(secret, &hello, &nonce, &proof) => {}
            other => {
                // Nothing more to say to a peer that cannot prove the secret: close.
                log::debug!(
                    "closing a connection claiming to be {:?}: authentication failed ({})",
                    hello.src_key,
                    match other {
                        Ok(f) => format!("{:?}", f.kind()),
                        Err(e) => e.to_string(),
                    }
                );
                return None;
            }
        }
    }
    if same_host {
        conn = same_host::accept(&shard.shared, conn, &hello, &nonce, version).await?;
    }
    Some((conn, hello))
}

async fn handshake(shard: Rc<Shard>, conn: Conn, ticket: Handshaking) {
    let _live = TaskGuard::new(&shard);
    let served = ServedConn::new(&shard, conn.closer());
    let limit = shard.shared.cfg.handshake_timeout;
    let (mut conn, hello) = match rt::timeout(limit, shake(&shard, conn)).await {
        Some(Some(h)) => h,
        Some(None) => return,
        None => {
            log::debug!("dropping connection: no handshake within {limit:?}");
            return;
        }
    };
    drop(ticket);
    let peer: Arc<str> = hello.src_key.as_str().into();
    let admitted = match shard.shared.admission.admit(&peer) {
        Ok(a) => a,
        Err(why) => {
            shard.shared.admission.log.warn(|| {
                format!(
                    "engine {}: refusing a connection of {peer:?}: {why}",
                    shard.shared.key
                )
            });
            // The peer is past its handshake: it may know why.
            let bye = Frame::GoAway {
                code: codes::ERR_BAD_STATE,
                msg: why.to_string(),
            };
            let mut buf = Vec::new();
            bye.encode(0, &mut buf);
            let _ = conn.send(&buf).await;
            return;
        }
    };
    // A restarted peer (new instance) makes its predecessor's inbound statuses void.
    shard.shared.inbound.hello(&peer, hello.instance);
    let to = shard.lane_shard(hello.lane);
    drop(served);
    if to == shard.id {
        rt::spawn_local(serve(shard.clone(), conn, hello, admitted)).detach();
        return;
    }
    // Hand the connection to the lane's shard.
    match conn.hand_off() {
        Ok(h) => shard.send(to, ShardMsg::Adopt(h, hello, admitted)),
        Err(e) => log::warn!("cannot hand a connection to shard {to}: {e}"),
    }
}

/// Serve a connection handed over by the accepting shard.
pub(crate) fn adopt(shard: &Rc<Shard>, h: Handoff, hello: Hello, admitted: Admitted) {
    match h.adopt() {
        Ok(conn) => {
            rt::spawn_local(serve(shard.clone(), conn, hello, admitted)).detach();
        }
        Err(e) => log::warn!("cannot adopt a connection: {e}"),
    }
}

async fn serve(shard: Rc<Shard>, conn: Conn, hello: Hello, _admitted: Admitted) {
    let _live = TaskGuard::new(&shard);
    let _served = ServedConn::new(&shard, conn.closer());
    if shard.closing.get() {
        return;
    }
    let cfg = &shard.shared.cfg;
    if let Err(e) = conn.configure(cfg) {
        log::debug!("options on an accepted connection: {e}");
    }
    // TCP and same-host connections (whose socket the initiator resets too); not in-process
    // pipes.
    let socket = matches!(conn, Conn::Tcp(_) | Conn::Local(_));
    let tcp = matches!(conn, Conn::Tcp(_));
    let (r, w, closer) = conn.split();
    let watch = ResetWatch::new(socket.then(|| closer.clone()));
    let mut reader = FrameReader::new(r, cfg.op_timeout);
    if socket {
        reader.keep_ages(tcp);
    }
    let mut writer = FrameWriter::new(w, cfg.inline_write_bytes);
    let peer: Arc<str> = hello.src_key.as_str().into();
    let conn = Link {
        counters: shard.stats.borrow_mut().peer(&peer),
        served: Served {
            peer,
            instance: hello.instance,
            lane: hello.lane,
            n_lanes: hello.n_lanes,
        },
    };
    let mut turn = Turn::default();
    loop {
        let r = match step(&shard, &conn, &watch, &mut reader, &mut writer, &mut turn).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                // The peer closed between frames: a chunk still landing is recorded.
                let _ = answer_landed(&shard, &conn, &mut writer, &mut turn).await;
                return;
            }
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            // A chunk already read is recorded as placed (or not) before the lane closes.
            let _ = answer_landed(&shard, &conn, &mut writer, &mut turn).await;
            if matches!(e, ConnError::ResetWhileQueued(_)) {
                shard.stats.borrow_mut().inbound_writes_dropped += 1;
                // Rare and worth an operator's eye: this node fell behind past a deadline.
                log::warn!("connection from {}: {e}", conn.served.peer);
            } else {
                log::debug!("closing connection from {}: {e}", conn.served.peer);
            }
            let bye = Frame::GoAway {
                code: codes::ERR_BAD_STATE,
                msg: e.to_string(),
            };
            let _ = writer.send(&bye, &[]).await;
            closer.close();
            return;
        }
        rt::yield_if_needed().await;
    }
}

/// Whether the initiator reset a connection while a WRITE on it waited here unread: a WRITE
/// whose bytes may have arrived [`RESET_CHECK_AGE`] or more before it is read (this side was
/// stalled, or busy: the connection's input was not seen empty since) is checked first, and
/// dropped, not placed, if the initiator reset the lane. The initiator resets a lane when a
/// write on it failed by its deadline (`lane::cancel`), and has reported that failure: its
/// bytes must not land now, over what the application wrote there since. Costs one
/// `getsockopt` per WRITE read that old (none while reads keep up with the peer; one for the
/// first after an idle spell), and at most one per [`RESET_CHECK_EVERY`] (a target far
/// behind on a stream of small writes would otherwise pay one for each).
struct ResetWatch {
    closer: Option<crate::transport::Closer>,
    /// When the last check found the lane not reset.
    checked: std::cell::Cell<Option<std::time::Instant>>,
}

/// How long a WRITE may have waited unread before it is checked for a reset lane: a write
/// reported failed can still be placed from bytes read at most this long after its reset
/// arrived (and from a chunk whose placing had begun).
const RESET_CHECK_AGE: std::time::Duration = std::time::Duration::from_millis(1);

/// A check that found the lane not reset holds for this long: a reset that arrives right
/// after it is seen by the next WRITE read this much later at most.
const RESET_CHECK_EVERY: std::time::Duration = std::time::Duration::from_micros(100);

impl ResetWatch {
    fn new(closer: Option<crate::transport::Closer>) -> Self {
        Self {
            closer,
            checked: std::cell::Cell::new(None),
        }
    }

    /// Whether `frame`, read by `reader` now, must be dropped: a WRITE that waited on a lane
    /// the initiator reset. `Some(how long it may have waited)` if so.
    fn dropped(
        &self,
        frame: &Frame,
        reader: &FrameReader<Rx>,
        now: std::time::Instant,
    ) -> Option<std::time::Duration> {
        let c = self.closer.as_ref()?;
        if !matches!(frame, Frame::Write { .. }) {
            return None;
        }
        let age = reader.frame_age(now);
        if age < RESET_CHECK_AGE
            || self
                .checked
                .get()
                .is_some_and(|t| now.saturating_duration_since(t) < RESET_CHECK_EVERY)
        {
            return None;
        }
        if c.reset_by_peer() {
            return Some(age);
        }
        self.checked.set(Some(now));
        None
    }
}

/// One turn of a connection: serve the next frame. `Ok(false)`: the peer closed the
/// connection between frames.
async fn step(
    shard: &Rc<Shard>,
    conn: &Link,
    watch: &ResetWatch,
    reader: &mut FrameReader<Rx>,
    writer: &mut FrameWriter,
    turn: &mut Turn,
) -> Result<bool, ConnError> {
    let Some((frame, payload)) = reader.next_frame().await? else {
        return Ok(false);
    };
    let at = std::time::Instant::now();
    if let Some(age) = watch.dropped(&frame, reader, at) {
        return Err(ConnError::ResetWhileQueued(age));
    }
    let now = super::ns_at(at);
    let uid = traced_uid(&frame);
    let first_read = reader.take_first_read_ns();
    let noticed = reader.take_noticed_ns();
    if let Some(uid) = uid {
        trace::mark_at(uid, trace::stage::T_NOTICED, noticed);
        trace::mark_at(uid, trace::stage::T_READABLE, first_read);
        trace::mark(uid, trace::stage::T_RECV);
    }
    let started = now;
    let chunk = matches!(frame, Frame::Write { .. } | Frame::Read { .. });
    let joined = on_frame(shard, conn, reader, writer, frame, payload, turn).await?;
    if chunk {
        let us = super::now_ns().saturating_sub(started) / 1000;
        shard.stats.borrow_mut().record_inbound_chunk(us);
    }
    if let (Some(uid), Some(joined)) = (uid, joined) {
        trace::mark(uid, trace::stage::T_PLACED);
        turn.last_uid = Some((uid, joined));
    }
    // A chunk still landing waits for its answer only while the next frame is already coming.
    if turn.landing() && !reader.input_waiting() {
        answer_landed(shard, conn, writer, turn).await?;
    }
    // Answers to a burst of requests leave together, once no further request is already
    // buffered.
    if !reader.frame_ready() {
        writer.flush().await?;
        if let Some((uid, joined)) = turn.last_uid.take() {
            trace::mark(uid, trace::stage::T_SENT);
            if joined {
                trace::mark(uid, trace::stage::T_ANSWERED);
            }
        }
    }
    Ok(true)
}

/// A served connection: the protocol's view of it, and where its peer's counters are in the
/// shard's stats.
struct Link {
    served: Served,
    counters: PeerSlot,
}

/// How often a FINISH looks again for chunks of its transfer still being placed on other
/// connections (a failure path: a lost lane's last chunk, whose copies still run).
const PLACED_POLL: std::time::Duration = std::time::Duration::from_micros(100);

/// Wait until no chunk of transfer `uid` from this connection's peer is being placed on
/// another connection (whichever shard serves it), so that nothing of it lands after the
/// FINISH's answer: the initiator reports a write that failed early once its FINISHes are
/// answered. A chunk whose copies hang past the op timeout is waited for no longer (its
/// initiator reset the lanes long before).
async fn placed_elsewhere(shard: &Shard, conn: &Link, uid: u64) {
    let placing = &shard.shared.placing;
    let key = (conn.served.peer.clone(), conn.served.instance, uid);
    if !placing.any(&key) {
        return;
    }
    let since = std::time::Instant::now();
    while placing.any(&key) {
        if since.elapsed() >= shard.shared.cfg.op_timeout {
            log::warn!(
                "FINISH of transfer {uid} from {}: a chunk of it still being placed after {:?}",
                conn.served.peer,
                since.elapsed()
            );
            return;
        }
        rt::sleep(PLACED_POLL).await;
    }
    shard.stats.borrow_mut().finishes_held += 1;
}

/// Record an inbound status (before the answer that follows can leave) and count it.
fn record(shard: &Shard, conn: &Link, r: &Record, joined: bool) {
    if joined {
        trace::mark(r.uid, trace::stage::T_FINISH);
    }
    shard.shared.inbound.record(
        &conn.served.peer,
        conn.served.instance,
        r.uid,
        status_of(r.code),
        &r.msg,
    );
    shard
        .stats
        .borrow_mut()
        .count_inbound_transfer(conn.counters, joined);
}

/// Carry out a [`Response`]: record, then queue the answer; whether a join's COMPLETE was
/// queued.
async fn respond(
    shard: &Shard,
    conn: &Link,
    writer: &mut FrameWriter,
    r: Response,
) -> Result<bool, ConnError> {
    if let Some(rec) = &r.record {
        record(shard, conn, rec, r.joined);
    }
    match r.reply {
        Some(f) => {
            writer.push(&f, &[]).await?;
            Ok(r.joined)
        }
        None => Ok(false),
    }
}

/// The region a WRITE or READ chunk names (if registered here) and whether the peer may
/// have it served; a chunk that breaks the protocol is a connection error.
fn check(
    shard: &Shard,
    conn: &Link,
    chunk: &Chunk,
    final_: bool,
) -> Result<(Option<SharedRegion>, Result<(), Refusal>), ConnError> {
    let region = shard.regions.borrow().get(&chunk.mem_id).cloned();
    let facts = region.as_ref().map(|r| (r.len() as u64, r.access_key()));
    let checked = conn
        .served
        .check(chunk, final_, facts)
        .map_err(|v| ConnError::Violation(v.0))?;
    Ok((region, checked))
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

/// Serve one frame; whether a join's COMPLETE was queued, or `None` for a WRITE chunk left
/// landing in `turn` (answered later).
async fn on_frame(
    shard: &Rc<Shard>,
    conn: &Link,
    reader: &mut FrameReader<Rx>,
    writer: &mut FrameWriter,
    frame: Frame,
    payload: u64,
    turn: &mut Turn,
) -> Result<Option<bool>, ConnError> {
    let violation = |v: target::Violation| ConnError::Violation(v.0);
    let joins = &shard.shared.joins;
    let inbound = target::classify(frame).map_err(violation)?;
    if let Some(a) = turn.ahead.take() {
        // Made for the READ then buffered next: kept when that is this one.
        match &inbound {
            Inbound::Read(c, ..) if a.is_for(read::ahead_key(c)) => turn.ahead = Some(a),
            _ => a.discard().await,
        }
    }
    match inbound {
        Inbound::Write(chunk, final_) => {
            on_write(
                shard,
                conn,
                (reader, writer),
                (chunk, final_),
                payload,
                turn,
            )
            .await
        }
        Inbound::Read(chunk, final_, to_device) => {
            answer_landed(shard, conn, writer, turn).await?;
            let checked = check(shard, conn, &chunk, final_)?;
            let key = read::ahead_key(&chunk);
            let slot = gpu_io::Ahead::take_for(&mut turn.ahead, key);
            let (reader, staged) = (&*reader, read::stages_device(writer));
            let mut next = || {
                if staged {
                    turn.ahead = read::copy_next(shard, reader);
                }
            };
            let (code, msg) = read(
                shard,
                conn,
                writer,
                (&chunk, final_, to_device),
                (checked.1, checked.0),
                read::CopyAhead {
                    slot,
                    next: &mut next,
                },
            )
            .await?;
            if code == codes::SUCCESS {
                let mut st = shard.stats.borrow_mut();
                st.count_inbound_read(conn.counters, chunk.bytes());
            }
            // After this chunk's READ_DATA, on the same connection.
            let r = conn.served.read_done(&chunk, final_, code, msg, joins);
            respond(shard, conn, writer, r).await.map(Some)
        }
        Inbound::Finish(f) => {
            answer_landed(shard, conn, writer, turn).await?;
            placed_elsewhere(shard, conn, f.uid).await;
            trace::mark(f.uid, trace::stage::T_FINISH);
            let r = conn.served.finish(f, joins);
            respond(shard, conn, writer, r).await?;
            Ok(Some(false))
        }
    }
}
