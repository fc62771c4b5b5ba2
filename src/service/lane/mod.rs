//! Initiator lanes: one connection per (peer, lane), dialed by the shard that runs it, with a
//! writer task sending queued chunks and a reader task placing read data and routing results
//! to each transfer's owner.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use morio_shards::rt;

use super::bell::Bell;
use super::express::Pending;
use super::msg::{LaneEvent, LaneWork, Peer, ShardMsg};
use super::same_host;
use super::{Shard, TaskGuard};
use crate::proto::codes;
use crate::proto::dispatch::{FinishSpec, TransferRef};
use crate::proto::frame::{Frame, Hello};
use crate::proto::handshake;
use crate::proto::lane::{Fence, LaneBook, Report};
use crate::proto::limits::{FENCE_VERSION, NONCE_BYTES, VERSION};
use crate::region::SharedRegion;
use crate::stats::PeerSlot;
use crate::status::{StatusCode, TransferStatus};
use crate::trace;
use crate::transport::framed::{read_frame_exact, FrameReader, FrameWriter};
use crate::transport::{self, Closer};

mod placing;
mod read;
mod write;
use read::read_loop;
use write::write_item;

/// A shard's lanes, by (peer key, lane index).
pub(crate) type LaneMap = HashMap<(Arc<str>, u16), Rc<Lane>>;

/// One connection to a peer, owned by one shard: its book ([`LaneBook`]: queue, sent frames
/// and the answers they wait for), the writer's doorbell and the socket.
pub(crate) struct Lane {
    peer: Arc<Peer>,
    lane: u16,
    /// The peer's counters in the shard's stats.
    counters: PeerSlot,
    book: RefCell<LaneBook<SharedRegion>>,
    bell: Bell,
    /// Closes the connection, once there is one.
    closer: Cell<Option<Closer>>,
    /// Where the connection's writer and express writers put frames, once it is up (a
    /// same-host peer's ring, or the socket): closed when the lane dies, so that nothing
    /// more goes in (a ring is not reset with the socket).
    port: RefCell<Option<crate::transport::express_port::ExpressPort>>,
    /// The lane's transport once it is connected (as [`open`] reports it).
    connected: Cell<Option<&'static str>>,
    /// Callers of [`open`] waiting for the lane to come up (or die).
    ready: RefCell<Vec<Arc<TransferStatus>>>,
    /// Read transfers whose data the lane is putting into local memory ([`placing`]).
    placing: RefCell<Vec<placing::Placing>>,
}

impl Lane {
    fn dead(&self) -> bool {
        self.book.borrow().dead()
    }
}

/// Queue work on a lane of this shard, dialing it first if needed.
pub(crate) fn enqueue(shard: &Rc<Shard>, work: LaneWork) {
    if let Some(first) = work.items.first() {
        trace::mark(first.to.uid, trace::stage::HANDED);
    }
    let (lane, fresh) = lane_for(shard, &work.peer, work.lane);
    lane.book.borrow_mut().push(work.items);
    if fresh {
        // Started only once its first work is queued: a dial that fails at once finds it.
        rt::spawn_local(run(shard.clone(), lane.clone())).detach();
    }
    lane.bell.ring();
}

/// Wake the writer of lane `idx` to `peer`, if this shard runs it (an express frame waits
/// in its port for the writer to send the rest).
pub(crate) fn wake_writer(shard: &Rc<Shard>, peer: &Arc<str>, idx: u16) {
    if let Some(l) = shard.lanes.borrow().get(&(peer.clone(), idx)) {
        l.bell.ring();
    }
}

/// Open lane `idx` to `peer` unless it is open or opening, and have `ready` say when it is up
/// (`SUCCESS`, its transport as the message: [`TCP`], [`SAME_HOST`] or [`SAME_HOST_RING`]) or
/// why it could not be opened (`ERR_RDMA_OP`).
pub(crate) fn open(shard: &Rc<Shard>, peer: &Arc<Peer>, idx: u16, ready: Arc<TransferStatus>) {
    let (lane, fresh) = lane_for(shard, peer, idx);
    match lane.connected.get() {
        Some(t) => ready.update(StatusCode::Success, t),
        None => lane.ready.borrow_mut().push(ready),
    }
    if fresh {
        rt::spawn_local(run(shard.clone(), lane)).detach();
    }
}

/// A lane's transport as [`open`] reports it: TCP, ...
pub(crate) const TCP: &str = "tcp";
/// ... the same-host transport with its records in the socket, ...
pub(crate) const SAME_HOST: &str = "same-host";
/// ... or in shared-memory rings.
pub(crate) const SAME_HOST_RING: &str = "same-host-ring";

/// The live lane `idx` to `peer`, and whether it was just created (and needs its task).
fn lane_for(shard: &Rc<Shard>, peer: &Arc<Peer>, idx: u16) -> (Rc<Lane>, bool) {
    let key = (peer.key.clone(), idx);
    let existing = shard.lanes.borrow().get(&key).cloned();
    if let Some(l) = existing {
        if l.peer.addr == peer.addr && !l.dead() {
            return (l, false);
        }
        retire(shard, &l, "remote engine address changed");
    }
    let lane = Rc::new(Lane {
        peer: peer.clone(),
        lane: idx,
        counters: shard.stats.borrow_mut().peer(&peer.key),
        book: RefCell::new(LaneBook::default()),
        bell: Bell::default(),
        closer: Cell::new(None),
        port: RefCell::new(None),
        connected: Cell::new(None),
        ready: RefCell::new(Vec::new()),
        placing: RefCell::new(Vec::new()),
    });
    shard.lanes.borrow_mut().insert(key, lane.clone());
    (lane, true)
}

/// Drop queued and pending work of a transfer that ended early (`why`: its failure). A lane
/// with a frame of it half sent is reset (the stream cannot be resynchronised). With `fence`
/// (a write that failed by its deadline), so is a lane that may still carry its bytes to the
/// target (write chunks sent and not answered): its send queue is dropped unsent, and a
/// target that reads chunks that waited in its own receive queue first checks for the reset
/// and drops them (`serve::ResetWatch`), so that no byte of a transfer reported failed lands
/// later, over what the application writes there next (only what the target reads within
/// about a millisecond of its arrival is still placed). The transfers a reset takes with it
/// fail for the reason that one did. A read's chunks being placed stop before their next
/// receive ([`placing`]). With `ack_to`, that owner is answered ([`ShardMsg::Fenced`]) once
/// nothing of the transfer can land here any more.
pub(crate) fn cancel(
    shard: &Rc<Shard>,
    peer: &Arc<str>,
    (uid, gen): (u64, u64),
    why: &str,
    ack_to: Option<usize>,
    finish: Option<(FinishSpec, u16)>,
) {
    let lanes = lanes_to(shard, peer);
    if let Some((spec, home)) = finish {
        return fence(shard, &lanes, peer, (uid, gen), ack_to, (spec, home));
    }
    let fence = ack_to.is_some();
    // Lanes that died still placing read data count too: their copies may still land.
    let placing_on: Vec<Rc<Lane>> = lanes
        .iter()
        .cloned()
        .chain(
            shard
                .dying_lanes
                .borrow()
                .iter()
                .filter(|l| *l.peer.key == **peer)
                .cloned(),
        )
        .collect();
    let deferred = placing::cancel(&placing_on, peer, (uid, gen), ack_to);
    for l in &lanes {
        let what = match l.book.borrow_mut().cancel(uid, gen) {
            Fence::None => continue,
            Fence::Unplaced if !fence => continue,
            Fence::HalfSent => "a frame half sent",
            Fence::Unplaced => "write chunks sent and not yet placed",
        };
        let msg = format!(
            "connection to {} reset: transfer {uid} failed ({why}) with {what} on it, which \
             must not land later",
            l.peer.key
        );
        die_as(shard, l, msg, End::Reset);
    }
    // After the resets: once the owner hears this, nothing of the transfer leaves this shard.
    if let (Some(owner), false) = (ack_to, deferred) {
        ack_fenced(shard, owner, peer, (uid, gen), 0);
    }
}

/// Tell `owner` this shard has done its part of fencing (`uid`, `gen`), with `finishes`
/// FINISHes queued whose answers it still waits for.
fn ack_fenced(
    shard: &Rc<Shard>,
    owner: usize,
    peer: &Arc<str>,
    (uid, gen): (u64, u64),
    finishes: u32,
) {
    let peer = peer.clone();
    let m = ShardMsg::Fenced {
        peer,
        uid,
        gen,
        finishes,
    };
    shard.send(owner, m);
}

/// A write that failed early (a lost lane, a chunk that could not leave) is fenced on this
/// shard's `lanes` to its peer: each drops its queued work of it, and one that sent chunks
/// of it (or is its home lane) sends FINISH after them ([`LaneBook::fence`]); the owner is
/// told how many ([`ShardMsg::Fenced`]) and waits for their answers ([`Report::Fenced`]),
/// so the failure is reported only once nothing of the write is left to land. The lanes
/// stay up: the other transfers on them go on (unless the owner's wait for the FINISHes runs
/// out, `owner::FINISH_WAIT_NS`: then it resets those lanes through [`cancel`]).
fn fence(
    shard: &Rc<Shard>,
    lanes: &[Rc<Lane>],
    peer: &Arc<str>,
    (uid, gen): (u64, u64),
    ack_to: Option<usize>,
    (spec, home): (FinishSpec, u16),
) {
    let Some(owner) = ack_to else { return };
    let to = TransferRef { owner, uid, gen };
    let mut finishes = 0;
    for l in lanes {
        let f = l.book.borrow_mut().fence(to, spec.clone(), l.lane == home);
        if f != Fence::None {
            finishes += 1;
            l.bell.ring();
        }
    }
    ack_fenced(shard, owner, peer, (uid, gen), finishes);
}

/// Close every lane to `peer`.
pub(crate) fn drop_peer(shard: &Rc<Shard>, peer: &str) {
    for l in lanes_to(shard, peer) {
        retire(shard, &l, "remote engine deregistered");
    }
}

/// This shard's lanes to `peer` (a snapshot: the callers may kill them).
fn lanes_to(shard: &Shard, peer: &str) -> Vec<Rc<Lane>> {
    shard
        .lanes
        .borrow()
        .iter()
        .filter(|((p, _), _)| &**p == peer)
        .map(|(_, l)| l.clone())
        .collect()
}

/// Close every lane (shutdown).
pub(crate) fn close_all(shard: &Rc<Shard>) {
    let lanes: Vec<_> = shard.lanes.borrow().values().cloned().collect();
    for l in lanes {
        retire(shard, &l, "engine shut down");
    }
}

/// Mark the lane dead, close its socket, and fail every transfer that had work on it with
/// "connection to PEER lost: `msg`".
fn die(shard: &Rc<Shard>, lane: &Rc<Lane>, msg: &str) {
    die_as(
        shard,
        lane,
        format!("connection to {} lost: {msg}", lane.peer.key),
        End::Failure,
    );
}

/// Close a lane on purpose (shutdown, the peer deregistered or moved): as [`die`], but not
/// counted as a lane failure.
fn retire(shard: &Rc<Shard>, lane: &Rc<Lane>, msg: &str) {
    die_as(
        shard,
        lane,
        format!("connection to {} lost: {msg}", lane.peer.key),
        End::Retire,
    );
}

/// How a lane ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    /// It failed (counted as a lane failure); its connection is reset, as for `Reset`.
    Failure,
    /// Closed on purpose (not counted).
    Retire,
    /// Reset so that nothing queued on it leaves ([`cancel`]; counted as a failure).
    Reset,
}

/// [`die`], failing the transfers with `msg` as it is.
fn die_as(shard: &Rc<Shard>, lane: &Rc<Lane>, msg: String, end: End) {
    let failure = end != End::Retire;
    // Once only: a lane killed from outside (reset, retired) dies again when its reader sees
    // the socket fail, by when a new lane of the same index may carry express transfers.
    let Some((hit, fenced)) = lane
        .book
        .borrow_mut()
        .die(|t| shard.shared.may_run(t.owner, t.gen))
    else {
        return;
    };
    for r in lane.ready.take() {
        r.update(StatusCode::ErrRdmaOp, msg.clone());
    }
    let express = lane.peer.express.remove_lane(lane.lane);
    let express_failed = !express.is_empty();
    for p in express {
        express_done(shard, lane, p, codes::ERR_BAD_STATE, &msg, false);
    }
    if failure && !shard.closing.get() {
        let mut st = shard.stats.borrow_mut();
        st.count_lane_failure(lane.counters, lane.lane);
    }
    if lane.connected.get().is_some() {
        // A connection that was up went down (the peer restarted, say): the next transfer
        // opens all lanes again, as the first did. A dial that failed leaves it be, so an
        // unreachable peer is not dialed once per lane by every transfer.
        lane.peer
            .opened
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }
    {
        let mut lanes = shard.lanes.borrow_mut();
        let key = (lane.peer.key.clone(), lane.lane);
        if lanes.get(&key).is_some_and(|l| Rc::ptr_eq(l, lane)) {
            lanes.remove(&key);
        }
        if !lane.placing.borrow().is_empty() {
            // Its reader still places read data: until it ends, a cancel finds it there.
            shard.dying_lanes.borrow_mut().push(lane.clone());
        }
    }
    lane.bell.close();
    if let Some(p) = lane.port.take() {
        p.close();
    }
    if let Some(c) = lane.closer.take() {
        // The connection lives until both lane tasks end, and they end only after this
        // point; closing it wakes the reader.
        // A lane that failed, or was reset, drops what its socket still holds: the
        // transfers it carried fail now, and their bytes must not land later. One closed on
        // purpose ends gracefully when nothing it carried fails (else it is reset too).
        let carried = !(hit.is_empty() && fenced.is_empty()) || express_failed;
        if end == End::Retire && !carried {
            c.close();
        } else {
            c.abort();
        }
    }
    let failed = hit.len();
    if failed > 0 {
        let uids: Vec<u64> = hit.iter().take(8).map(|t| t.uid).collect();
        let more = if failed > uids.len() { ", ..." } else { "" };
        let what = format!(
            "engine {}: lane {} to {} ({}): {msg}; {failed} transfers failed (uids \
             {uids:?}{more})",
            shard.shared.key, lane.lane, lane.peer.key, lane.peer.addr
        );
        if shard.closing.get() {
            log::debug!("{what}");
        } else {
            log::warn!("{what}");
        }
    }
    for to in hit {
        let report = Report::Lost { msg: msg.clone() };
        self::report(shard, &lane.peer.key, to, report);
    }
    // The lane was reset (or closed on purpose, when nothing is left to send): what it
    // still carried of a fenced write is dropped at the target.
    for to in fenced {
        self::report(shard, &lane.peer.key, to, Report::Fenced);
    }
}

/// An express transfer on `lane` ended with `code` (`sent`: its frame left and was
/// answered; a read's data, when `code` is success, was placed).
fn express_done(shard: &Rc<Shard>, lane: &Lane, p: Pending, code: u32, msg: &str, sent: bool) {
    let ok = code == codes::SUCCESS;
    {
        let latency_us = super::now_ns().saturating_sub(p.submitted_ns) / 1000;
        let mut st = shard.stats.borrow_mut();
        if sent && p.read.is_some() {
            if ok {
                st.count_received(lane.counters, p.bytes);
            }
            st.express_reads += 1;
        } else if sent {
            st.count_sent(lane.counters, p.bytes);
            st.express_writes += 1;
        }
        st.record_transfer(lane.counters, ok, latency_us);
    }
    if ok {
        trace::mark_current(trace::stage::DONE);
        p.status.update(StatusCode::Success, "");
    } else {
        p.status.update(
            StatusCode::from_u32(code).unwrap_or(StatusCode::ErrBadState),
            msg,
        );
    }
}

/// Fail the express transfers of this shard's lanes whose deadline passed; whether any
/// express transfer is still in flight on them (the deadline tick keeps running then).
pub(crate) fn expire_express(shard: &Rc<Shard>, now: u64) -> bool {
    let lanes: Vec<Rc<Lane>> = shard.lanes.borrow().values().cloned().collect();
    let mut waiting = false;
    for l in lanes {
        let expired = l.peer.express.expired(l.lane, now);
        // An express write sent and not answered may still sit in the lane's send queue or
        // the target's receive queue: reset the lane before its failure is reported, as for
        // a write owned by a shard ([`cancel`]), so that it cannot land later.
        if expired.iter().any(|p| p.read.is_none()) {
            let msg = format!(
                "connection to {} reset: an express write failed (operation timeout) with its \
                 frame sent and not yet placed, which must not land later",
                l.peer.key
            );
            die_as(shard, &l, msg, End::Reset);
        }
        for p in expired {
            express_done(
                shard,
                &l,
                p,
                codes::ERR_BAD_STATE,
                "operation timeout",
                false,
            );
        }
        waiting |= l.peer.express.any_pending();
    }
    waiting
}

/// Tell a transfer's owner what happened to it on this lane.
fn report(shard: &Rc<Shard>, peer: &Arc<str>, to: TransferRef, report: Report) {
    let ev = LaneEvent {
        peer: peer.clone(),
        to,
        report,
    };
    shard.send(to.owner, ShardMsg::Owner(Box::new(ev)));
}

/// Dial, handshake, then write queued items until the lane dies.
async fn run(shard: Rc<Shard>, lane: Rc<Lane>) {
    let _live = TaskGuard::new(&shard);
    // A lane that dies while dialing (shutdown, peer deregistered) stops dialing at once.
    let closed = async {
        while lane.bell.wait().await.is_ok() {}
        Err("lane closed while connecting".to_string())
    };
    let (conn, version) = match futures_lite::future::or(connect(&shard, &lane), closed).await {
        Ok(s) => s,
        Err(e) => {
            for r in lane.ready.take() {
                r.update(StatusCode::ErrRdmaOp, e.clone());
            }
            return die(&shard, &lane, &e);
        }
    };
    if lane.dead() {
        return;
    }
    let cfg = &shard.shared.cfg;
    let local = conn.is_local();
    // The last lane connected decides (a peer that fell back to TCP gets TCP's chunks).
    lane.peer
        .same_host
        .store(local, std::sync::atomic::Ordering::Relaxed);
    lane.peer
        .reached
        .store(true, std::sync::atomic::Ordering::Relaxed);
    lane.peer.fences.store(
        version >= FENCE_VERSION,
        std::sync::atomic::Ordering::Relaxed,
    );
    let (r, w, closer) = conn.split();
    shard
        .stats
        .borrow_mut()
        .count_lane_connect(lane.counters, lane.lane, local, w.rides_ring());
    lane.closer.set(Some(closer));
    let transport = match (local, w.rides_ring()) {
        (false, _) => TCP,
        (true, false) => SAME_HOST,
        (true, true) => SAME_HOST_RING,
    };
    lane.connected.set(Some(transport));
    let reader = FrameReader::new(r, cfg.op_timeout);
    rt::spawn_local(read_loop(shard.clone(), lane.clone(), reader)).detach();
    let mut writer = FrameWriter::new(w, cfg.inline_write_bytes);
    // Application threads may send small writes on this lane themselves while this writer
    // is idle (`express`): into the peer's ring, or on the TCP socket.
    let port = writer.express_port();
    lane.port.replace(port.clone());
    let express = port.filter(super::express::enabled_for);
    if let Some(port) = &express {
        lane.peer.express.add_lane(lane.lane, port.clone());
    }
    // Up, express port included: a small write submitted once `connect_remote_engine`
    // returns can go express.
    for r in lane.ready.take() {
        r.update(StatusCode::Success, transport);
    }
    let mut busy = false;
    let mut last_uid = None;
    // The next chunk's first slot, copied out of GPU memory while this frame is sent.
    let mut ahead: Option<super::gpu_io::Ahead> = None;
    loop {
        if let Some(a) = ahead.take() {
            // Made for the chunk then first in the queue: kept when it still is. Decided
            // before the next item leaves the queue: discarding waits for the copy, and an
            // item taken off the queue meanwhile would be nobody's to cancel, fence or
            // report if its transfer failed or the lane died in that wait.
            let key = lane
                .book
                .borrow_mut()
                .next_chunk()
                .map(|(to, spec, _)| (to.uid, to.gen, spec.chunk));
            match key.filter(|k| a.is_for(*k)) {
                Some(_) => ahead = Some(a),
                // Its transfer was cancelled: the copy is waited for, the slot returned.
                None => a.discard().await,
            }
        }
        // No await from here until the item is in the book again as sending (`write_item`).
        let next = lane.book.borrow_mut().pop();
        if !busy && (next.is_some() || express.as_ref().is_some_and(|p| p.has_spill())) {
            // A run starts: no express write goes in until it ends. The rest of an express
            // frame a full socket took only in part leaves first.
            if let Some(port) = &express {
                let spill = port.begin();
                if !spill.is_empty() {
                    writer.queue_first(&spill);
                }
            }
            busy = true;
        }
        let Some((to, item)) = next else {
            if lane.dead() {
                // What was pushed failed with the lane: it must not leave now.
                return;
            }
            // Queue drained: what was pushed leaves now, in one syscall.
            if let Err(e) = writer.flush().await {
                return die(&shard, &lane, &format!("send failed: {e}"));
            }
            if let Some(uid) = last_uid.take() {
                trace::mark(uid, trace::stage::SENT);
            }
            if busy {
                // The stream stands between frames: express writes may go in.
                if let Some(port) = &express {
                    port.end();
                }
                busy = false;
            }
            if lane.bell.wait().await.is_err() {
                return;
            }
            continue;
        };
        if lane.dead() {
            return;
        }
        trace::mark(to.uid, trace::stage::ENCODE);
        trace::set_current(Some(to.uid));
        last_uid = Some(to.uid);
        let sent = write_item(&shard, &lane, &mut writer, (to, item), &mut ahead).await;
        trace::set_current(None);
        if let Err(e) = sent {
            return die(&shard, &lane, &format!("send failed: {e}"));
        }
        trace::mark(to.uid, trace::stage::PUSHED);
        lane.book.borrow_mut().sent();
        rt::yield_if_needed().await;
    }
}

/// Dial the peer and shake hands: HELLO out, its HELLO_ACK checked, AUTH and the same-host
/// step when they apply. A same-host step the peer passed but we could not check ends that
/// connection: the next dial offers TCP only (and the peer is remembered as such).
async fn connect(shard: &Rc<Shard>, lane: &Rc<Lane>) -> Result<(transport::Conn, u32), String> {
    let cfg = &shard.shared.cfg;
    let addr = lane.peer.addr;
    if addr.port() == 0 {
        return Err(format!(
            "engine {:?} advertised port 0 (its descriptor was taken before its backend \
             existed): register its descriptor again after its create_backend",
            lane.peer.key
        ));
    }
    let deadline = std::time::Instant::now() + cfg.op_timeout;
    let mut local = true;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rt::timeout(left, shake(shard, lane, local)).await {
            None => return Err(format!("connect to {addr} timed out")),
            Some(Ok(conn)) => return Ok(conn),
            Some(Err(same_host::DialFailure::Fallback(why))) if local => {
                shard.shared.same_host_failed(&lane.peer.key, &why);
                local = false;
            }
            Some(Err(same_host::DialFailure::Failed(e) | same_host::DialFailure::Fallback(e))) => {
                return Err(e)
            }
        }
    }
}

/// One dial and handshake (`local`: offer the same-host transport if it applies): the
/// connection and the protocol version it speaks.
async fn shake(
    shard: &Rc<Shard>,
    lane: &Rc<Lane>,
    local: bool,
) -> Result<(transport::Conn, u32), same_host::DialFailure> {
    use same_host::DialFailure::Failed;
    let shared = &shard.shared;
    let cfg = &shared.cfg;
    let addr = lane.peer.addr;
    let t0 = std::time::Instant::now();
    let mut conn = transport::dial(addr, cfg, shared.transport)
        .await
        .map_err(Failed)?;
    let dialed = t0.elapsed();
    let version = cfg.max_protocol_version.min(VERSION);
    let nonce: [u8; NONCE_BYTES] = rand::random();
    let hello = Hello {
        version,
        lane: lane.lane,
        n_lanes: cfg.gpu_lanes() as u16,
        src_key: shared.key.clone(),
        dst_key: lane.peer.key.to_string(),
        instance: shared.instance,
        nonce,
        host_tag: local
            .then(|| same_host::offer(shared, &lane.peer.key, version, &nonce))
            .flatten(),
    };
    let mut buf = Vec::new();
    Frame::Hello(hello.clone()).encode(0, &mut buf);
    conn.send(&buf)
        .await
        .map_err(|e| Failed(format!("send HELLO: {e}")))?;
    let secret = cfg.auth_secret.as_ref().map(|s| s.as_bytes());
    let ack = match read_frame_exact(&mut conn).await {
        Ok(Frame::HelloAck(a)) => a,
        Ok(f) => return Err(Failed(format!("expected HELLO_ACK, got {:?}", f.kind()))),
        Err(e) => return Err(Failed(format!("handshake: {e}"))),
    };
    let auth =
        handshake::check_ack(&ack, &hello, secret).map_err(|e| Failed(format!("{addr}: {e}")))?;
    if let Some(proof) = auth {
        buf.clear();
        Frame::Auth(proof).encode(0, &mut buf);
        conn.send(&buf)
            .await
            .map_err(|e| Failed(format!("send AUTH: {e}")))?;
    }
    let acked = t0.elapsed();
    let conn = if ack.same_host && hello.host_tag.is_some() {
        same_host::dial(shared, conn, &hello, &ack).await?
    } else {
        conn
    };
    log::debug!(
        "engine {}: lane {} to {:?} connected ({}): dial {dialed:?}, HELLO_ACK at {acked:?}, \
         done at {:?}",
        shared.key,
        lane.lane,
        lane.peer.key,
        if conn.is_local() { "same-host" } else { "TCP" },
        t0.elapsed()
    );
    Ok((conn, ack.version))
}
