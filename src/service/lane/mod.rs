//! Initiator lanes: one connection per (peer, lane), dialed by the shard that runs it, with a
//! writer task sending queued chunks and a reader task placing read data and routing results
//! to each transfer's owner.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;

use futures_lite::AsyncWriteExt;
use morio_shards::{rt, ShardId};

use super::bell::Bell;
use super::gpu_io::{self, SendError};
use super::io::{configure_buffers, configure_conn, read_frame_exact, FrameReader, FrameWriter};
use super::owner::{LaneEvent, LaneEventKind};
use super::stripes::SharedStripes;
use super::{Peer, Shard, ShardMsg, Shared, TaskGuard};
use crate::proto::codes;
use crate::proto::frame::{Chunk, ChunkHead, Finish, Frame, Hello, Op};
use crate::proto::layout::remote_seg;
use crate::proto::limits::VERSION;
use crate::proto::plan::{total_bytes, Layout, Piece};
use crate::region::SharedRegion;
use crate::trace;

mod read;
use read::read_loop;

/// Work for one lane, sent by a transfer's owner to the lane's shard.
#[derive(Debug)]
pub(crate) struct LaneWork {
    pub peer: Arc<Peer>,
    pub lane: u16,
    pub items: Vec<LaneItem>,
}

/// One frame to send on a lane, and whom to tell about its answer.
#[derive(Debug)]
pub(crate) struct LaneItem {
    pub owner: ShardId,
    pub uid: u64,
    pub gen: u64,
    pub kind: ItemKind,
}

#[derive(Debug)]
pub(crate) enum ItemKind {
    Chunk {
        op: Op,
        chunk: u32,
        n_chunks: u32,
        mem_id: u32,
        extent: (u64, u64),
        join_lane: u16,
        pieces: Layout,
        final_: bool,
        local: SharedRegion,
    },
    Finish {
        op: Op,
        n_chunks: u32,
        total: u64,
        code: u32,
        msg: String,
    },
    /// Take stripes of a write from its shared list, one after another, until none is left.
    Shared(Arc<SharedStripes>),
}

/// A sent frame waiting for its answer, keyed by its lane-local tag.
#[derive(Debug)]
struct Outstanding {
    owner: ShardId,
    uid: u64,
    gen: u64,
    wait: Wait,
}

/// A chunk of a multi-chunk transfer that has nothing more of its own to wait for (a WRITE
/// chunk once sent, a READ chunk once its data arrived), kept by tag: the target answers the
/// whole transfer with COMPLETE on the lane of whichever chunk completed its join, with that
/// chunk's tag, so any of them may get it. It is kept while its transfer may still run
/// ([`super::Shared::may_run`]: the owner's low-water mark, so nothing here keeps or frees
/// what another thread allocated), so that losing this lane fails the transfer at once (a
/// chunk may not have arrived, or its COMPLETE may have been on the way) instead of at its
/// deadline.
#[derive(Debug)]
struct Unanswered {
    owner: ShardId,
    uid: u64,
    gen: u64,
}

/// The answer a sent frame waits for. A write's chunk is answered by COMPLETE when it is the
/// whole transfer (`final_`); a chunk of several waits as [`Unanswered`] (the target's join
/// answers the whole transfer on one of their lanes); a read's chunk by READ_DATA (then, of
/// several, as [`Unanswered`]); FINISH by COMPLETE.
#[derive(Debug)]
enum Wait {
    Write {
        final_: bool,
    },
    Read {
        chunk: u32,
        final_: bool,
        local: SharedRegion,
        pieces: Layout,
        bytes: u64,
    },
    Finish,
}

/// A shard's lanes, by (peer key, lane index).
pub(crate) type LaneMap = HashMap<(Arc<str>, u16), Rc<Lane>>;

/// One connection to a peer, owned by one shard.
pub(crate) struct Lane {
    peer: Arc<Peer>,
    lane: u16,
    queue: RefCell<VecDeque<LaneItem>>,
    bell: Bell,
    outstanding: RefCell<HashMap<u64, Outstanding>>,
    unanswered: RefCell<HashMap<u64, Unanswered>>,
    /// `unanswered` drops entries of ended transfers when it grows to this length.
    prune_at: Cell<usize>,
    next_tag: Cell<u64>,
    writing: Cell<Option<(u64, u64)>>,
    fd: Cell<Option<RawFd>>,
    dead: Cell<bool>,
}

/// `Lane::unanswered` is pruned when it reaches at least this many entries.
const MIN_PRUNE: usize = 64;

impl Lane {
    /// Remember a frame about to be sent until its answer, or, for a chunk of several, while
    /// its transfer runs.
    fn expect(&self, shared: &Shared, tag: u64, o: Outstanding) {
        if let Wait::Write { final_: false, .. } = o.wait {
            return self.unanswered_until_done(shared, tag, o.owner, o.uid, o.gen);
        }
        self.outstanding.borrow_mut().insert(tag, o);
    }

    /// Keep a chunk of several by its tag while its transfer runs (pruned of ended transfers
    /// as the table grows, so it stays within about twice the chunks in flight).
    fn unanswered_until_done(&self, shared: &Shared, tag: u64, owner: ShardId, uid: u64, gen: u64) {
        let mut v = self.unanswered.borrow_mut();
        if v.len() >= self.prune_at.get() {
            v.retain(|_, u| shared.may_run(u.owner, u.gen));
            self.prune_at.set((2 * v.len()).max(MIN_PRUNE));
        }
        v.insert(tag, Unanswered { owner, uid, gen });
    }
}

/// Queue work on a lane of this shard, dialing it first if needed.
pub(crate) fn enqueue(shard: &Rc<Shard>, work: LaneWork) {
    if let Some(first) = work.items.first() {
        trace::mark(first.uid, trace::stage::HANDED);
    }
    let (lane, fresh) = lane_for(shard, &work.peer, work.lane);
    lane.queue.borrow_mut().extend(work.items);
    if fresh {
        // Started only once its first work is queued: a dial that fails at once finds it.
        rt::spawn_local(run(shard.clone(), lane.clone())).detach();
    }
    lane.bell.ring();
}

/// The live lane `idx` to `peer`, and whether it was just created (and needs its task).
fn lane_for(shard: &Rc<Shard>, peer: &Arc<Peer>, idx: u16) -> (Rc<Lane>, bool) {
    let key = (peer.key.clone(), idx);
    let existing = shard.lanes.borrow().get(&key).cloned();
    if let Some(l) = existing {
        if l.peer.addr == peer.addr && !l.dead.get() {
            return (l, false);
        }
        die(shard, &l, "remote engine address changed");
    }
    let lane = Rc::new(Lane {
        peer: peer.clone(),
        lane: idx,
        queue: RefCell::new(VecDeque::new()),
        bell: Bell::default(),
        outstanding: RefCell::new(HashMap::new()),
        unanswered: RefCell::new(HashMap::new()),
        prune_at: Cell::new(MIN_PRUNE),
        next_tag: Cell::new(0),
        writing: Cell::new(None),
        fd: Cell::new(None),
        dead: Cell::new(false),
    });
    shard.lanes.borrow_mut().insert(key, lane.clone());
    (lane, true)
}

/// Drop queued and pending work of a transfer that ended early.
pub(crate) fn cancel(shard: &Rc<Shard>, peer: &str, uid: u64, gen: u64) {
    for l in lanes_to(shard, peer) {
        l.queue
            .borrow_mut()
            .retain(|i| (i.uid, i.gen) != (uid, gen));
        l.outstanding
            .borrow_mut()
            .retain(|_, o| (o.uid, o.gen) != (uid, gen));
        l.unanswered
            .borrow_mut()
            .retain(|_, u| (u.uid, u.gen) != (uid, gen));
        if l.writing.get() == Some((uid, gen)) {
            // Its bytes are half on the wire: the stream cannot be resynchronised.
            die(
                shard,
                &l,
                "a transfer on this connection timed out mid-frame",
            );
        }
    }
}

/// Close every lane to `peer`.
pub(crate) fn drop_peer(shard: &Rc<Shard>, peer: &str) {
    for l in lanes_to(shard, peer) {
        die(shard, &l, "remote engine deregistered");
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
        die(shard, &l, "engine shut down");
    }
}

/// Mark the lane dead, close its socket, and fail every transfer that had work on it.
fn die(shard: &Rc<Shard>, lane: &Rc<Lane>, msg: &str) {
    if lane.dead.replace(true) {
        return;
    }
    {
        let mut lanes = shard.lanes.borrow_mut();
        let key = (lane.peer.key.clone(), lane.lane);
        if lanes.get(&key).is_some_and(|l| Rc::ptr_eq(l, lane)) {
            lanes.remove(&key);
        }
    }
    lane.bell.close();
    if let Some(fd) = lane.fd.take() {
        // SAFETY: the fd is open: the stream that owns it lives until both lane tasks end,
        // and they end only after this point. shutdown(2) wakes the reader with EOF.
        unsafe {
            libc::shutdown(fd, libc::SHUT_RDWR);
        }
    }
    let mut hit: HashSet<(ShardId, u64, u64)> = HashSet::new();
    hit.extend(
        lane.queue
            .borrow_mut()
            .drain(..)
            .map(|i| (i.owner, i.uid, i.gen)),
    );
    hit.extend(
        lane.outstanding
            .borrow_mut()
            .drain()
            .map(|(_, o)| (o.owner, o.uid, o.gen)),
    );
    hit.extend(
        lane.unanswered
            .borrow_mut()
            .drain()
            .map(|(_, u)| u)
            .filter(|u| shard.shared.may_run(u.owner, u.gen))
            .map(|u| (u.owner, u.uid, u.gen)),
    );
    let msg = format!("connection to {} lost: {msg}", lane.peer.key);
    for (owner, uid, gen) in hit {
        report(
            shard,
            owner,
            &lane.peer.key,
            uid,
            gen,
            LaneEventKind::Lost { msg: msg.clone() },
        );
    }
}

fn report(
    shard: &Rc<Shard>,
    owner: ShardId,
    peer: &Arc<str>,
    uid: u64,
    gen: u64,
    kind: LaneEventKind,
) {
    let ev = LaneEvent {
        peer: peer.clone(),
        uid,
        gen,
        kind,
    };
    shard.send(owner, ShardMsg::Owner(Box::new(ev)));
}

/// Dial, handshake, then write queued items until the lane dies.
async fn run(shard: Rc<Shard>, lane: Rc<Lane>) {
    let _live = TaskGuard::new(&shard);
    // A lane that dies while dialing (shutdown, peer deregistered) stops dialing at once.
    let closed = async {
        while lane.bell.wait().await.is_ok() {}
        Err("lane closed while connecting".to_string())
    };
    let stream = match futures_lite::future::or(connect(&shard, &lane), closed).await {
        Ok(s) => s,
        Err(e) => return die(&shard, &lane, &e),
    };
    if lane.dead.get() {
        return;
    }
    lane.fd.set(Some(stream.as_raw_fd()));
    let cfg = &shard.shared.cfg;
    let (r, w) = rt::split(stream);
    let reader = FrameReader::new(r, cfg.op_timeout);
    rt::spawn_local(read_loop(shard.clone(), lane.clone(), reader)).detach();
    let mut writer = FrameWriter::new(w, cfg.inline_write_bytes);
    let mut last_uid = None;
    loop {
        let next = lane.queue.borrow_mut().pop_front();
        let Some(mut item) = next else {
            // Queue drained: what was pushed leaves now, in one syscall.
            if let Err(e) = writer.flush().await {
                return die(&shard, &lane, &format!("send failed: {e}"));
            }
            if let Some(uid) = last_uid.take() {
                trace::mark(uid, trace::stage::SENT);
            }
            if lane.bell.wait().await.is_err() {
                return;
            }
            continue;
        };
        if lane.dead.get() {
            return;
        }
        if let ItemKind::Shared(stripes) = &item.kind {
            let stripes = stripes.clone();
            let Some(kind) = stripes.take() else {
                continue;
            };
            // Back at the front: this lane keeps taking the write's stripes while any is left.
            lane.queue.borrow_mut().push_front(LaneItem {
                owner: item.owner,
                uid: item.uid,
                gen: item.gen,
                kind: ItemKind::Shared(stripes),
            });
            item.kind = kind;
        }
        trace::mark(item.uid, trace::stage::ENCODE);
        trace::set_current(Some(item.uid));
        last_uid = Some(item.uid);
        let sent = write_item(&shard, &lane, &mut writer, item).await;
        trace::set_current(None);
        if let Err(e) = sent {
            return die(&shard, &lane, &format!("send failed: {e}"));
        }
        if let Some(uid) = last_uid {
            trace::mark(uid, trace::stage::PUSHED);
        }
        lane.writing.set(None);
        rt::yield_if_needed().await;
    }
}

async fn connect(shard: &Rc<Shard>, lane: &Rc<Lane>) -> Result<rt::TcpStream, String> {
    let cfg = &shard.shared.cfg;
    let addr = lane.peer.addr;
    if addr.port() == 0 {
        return Err(format!(
            "engine {:?} advertised port 0 (its descriptor was taken before its backend \
             existed): register its descriptor again after its create_backend",
            lane.peer.key
        ));
    }
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(|e| format!("socket: {e}"))?;
    configure_buffers(&sock, cfg)
        .and_then(|_| configure_conn(&socket2::SockRef::from(&sock), cfg))
        .map_err(|e| format!("socket options: {e}"))?;
    let handshake = async {
        let mut s = rt::connect(sock, addr, cfg.op_timeout)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let hello = Frame::Hello(Hello {
            version: VERSION,
            lane: lane.lane,
            n_lanes: cfg.num_data_conns as u16,
            src_key: shard.shared.key.clone(),
            dst_key: lane.peer.key.to_string(),
            instance: shard.shared.instance,
        });
        let mut buf = Vec::new();
        hello.encode(0, &mut buf);
        s.write_all(&buf)
            .await
            .map_err(|e| format!("send HELLO: {e}"))?;
        match read_frame_exact(&mut s).await {
            Ok(Frame::HelloAck(a)) if a.code != codes::SUCCESS => {
                Err(format!("peer refused the connection: {}", a.msg))
            }
            Ok(Frame::HelloAck(a)) if a.version != VERSION => Err(format!(
                "peer speaks protocol version {}, we speak {VERSION}",
                a.version
            )),
            Ok(Frame::HelloAck(a)) if *a.key != *lane.peer.key => Err(format!(
                "peer at {addr} is engine {:?}, expected {:?}",
                a.key, lane.peer.key
            )),
            Ok(Frame::HelloAck(_)) => Ok(s),
            Ok(f) => Err(format!("expected HELLO_ACK, got {:?}", f.kind())),
            Err(e) => Err(format!("handshake: {e}")),
        }
    };
    rt::timeout(cfg.op_timeout, handshake)
        .await
        .unwrap_or_else(|| Err(format!("connect to {addr} timed out")))
}

/// Send a WRITE chunk from host memory: a small payload is copied from the region next to
/// the frame (and leaves with the next flush), a large one is gathered straight from it. A
/// strided layout is framed as one run and gathered without building a piece list.
#[allow(clippy::too_many_arguments)]
async fn write_host_chunk(
    shard: &Rc<Shard>,
    lane: &Lane,
    writer: &mut FrameWriter,
    head: &ChunkHead,
    pieces: &Layout,
    local: &SharedRegion,
    final_: bool,
    wait: Outstanding,
) -> std::io::Result<()> {
    // SAFETY (every `slice` below): the ranges were checked against the region at
    // submission and the region lives while `local` does; reading it is the transfer.
    let (bytes, in_range) = match pieces {
        // Strides do not go backwards, so the first and last pieces bound all of them.
        Layout::Strided(s) => {
            let (first, last) = (s.first, s.last());
            let ok = unsafe { local.slice(first.local, first.len) }.is_some()
                && unsafe { local.slice(last.local, last.len) }.is_some();
            (s.total_bytes(), ok)
        }
        Layout::List(list) => {
            let ok = list
                .iter()
                .all(|p| unsafe { local.slice(p.local, p.len) }.is_some());
            (total_bytes(list), ok)
        }
    };
    let segs = pieces.remote_segs();
    if !in_range {
        return Err(std::io::Error::other("local range out of bounds"));
    }
    let gen = wait.gen;
    lane.expect(&shard.shared, head.tag, wait);
    lane.writing.set(Some((head.uid, gen)));
    shard.stats.borrow_mut().bytes_sent += bytes;
    if bytes as usize <= writer.inline_bytes() {
        let fill = |buf: &mut Vec<u8>| {
            for p in pieces.iter() {
                buf.extend(unsafe { local.slice(p.local, p.len) }.unwrap_or(&[]));
            }
        };
        writer
            .push_inline_chunk(final_, head, segs, bytes as usize, fill)
            .await
    } else {
        let slices: Vec<&[u8]> = pieces
            .iter()
            .filter_map(|p| unsafe { local.slice(p.local, p.len) })
            .collect();
        writer.send_chunk(final_, head, segs, &slices).await
    }
}

async fn write_item(
    shard: &Rc<Shard>,
    lane: &Lane,
    writer: &mut FrameWriter,
    item: LaneItem,
) -> std::io::Result<()> {
    let tag = lane.next_tag.get();
    lane.next_tag.set(tag + 1);
    let (uid, gen, owner) = (item.uid, item.gen, item.owner);
    let pending = |wait| Outstanding {
        owner,
        uid,
        gen,
        wait,
    };
    match item.kind {
        ItemKind::Chunk {
            op,
            chunk,
            n_chunks,
            mem_id,
            extent,
            join_lane,
            pieces,
            final_,
            local,
        } => {
            let head = ChunkHead {
                tag,
                uid,
                chunk,
                n_chunks,
                mem_id,
                extent,
                join_lane,
            };
            // The chunk as a frame value, for the paths that need one (GPU staging, reads).
            let framed =
                |pieces: &[Piece]| Chunk::new(head, pieces.iter().map(remote_seg).collect());
            match op {
                Op::Write if local.device().is_some() => {
                    let pieces = pieces.into_pieces();
                    let c = framed(&pieces);
                    let spans: Vec<(u64, u64)> = pieces.iter().map(|p| (p.local, p.len)).collect();
                    let bytes = c.bytes();
                    let wait = pending(Wait::Write { final_ });
                    lane.expect(&shard.shared, tag, wait);
                    lane.writing.set(Some((uid, gen)));
                    let frame = Frame::Write { chunk: c, final_ };
                    match gpu_io::push_from_device(shard, writer, &frame, &local, &spans).await {
                        Ok(()) => {
                            shard.stats.borrow_mut().bytes_sent += bytes;
                            Ok(())
                        }
                        Err(SendError::Gpu(e)) => {
                            // Nothing of the frame left: fail this chunk, keep the lane.
                            lane.outstanding.borrow_mut().remove(&tag);
                            lane.unanswered.borrow_mut().remove(&tag);
                            let msg = format!("staging copy from GPU memory failed: {e}");
                            let code = codes::ERR_GPU_OP;
                            let kind = LaneEventKind::Failed { code, msg };
                            report(shard, owner, &lane.peer.key, uid, gen, kind);
                            Ok(())
                        }
                        Err(SendError::Conn(e)) => Err(std::io::Error::other(e.to_string())),
                    }
                }
                Op::Write => {
                    let wait = pending(Wait::Write { final_ });
                    write_host_chunk(shard, lane, writer, &head, &pieces, &local, final_, wait)
                        .await
                }
                Op::Read => {
                    let bytes = pieces.total_bytes();
                    let segs = pieces.remote_segs();
                    writer.queue_read_chunk(final_, &head, segs);
                    // Registered before the request can leave (the next flush): the answer
                    // can never come early.
                    lane.outstanding.borrow_mut().insert(
                        tag,
                        pending(Wait::Read {
                            chunk,
                            final_,
                            local,
                            pieces,
                            bytes,
                        }),
                    );
                    writer.flush_if_full().await
                }
            }
        }
        ItemKind::Finish {
            op,
            n_chunks,
            total,
            code,
            msg,
        } => {
            lane.outstanding
                .borrow_mut()
                .insert(tag, pending(Wait::Finish));
            let f = Finish {
                tag,
                uid,
                op,
                n_chunks,
                total_bytes: total,
                code,
                msg,
            };
            writer.push(&Frame::Finish(f), &[]).await
        }
        // The writer turns these into chunks before they get here.
        ItemKind::Shared(_) => Ok(()),
    }
}
