//! The initiator's lanes: an instance dials every lane and crashes; a lane is dialed again
//! when work comes for it after it died; its writer pops frames from the `LaneBook`,
//! registers and sends them (or begins a staging copy that fails); its reader checks the
//! handshake and feeds answers to the book, the reports to the owners.

use std::collections::{HashMap, VecDeque};

use morio::proto::codes::{ERR_GPU_OP, SUCCESS};
use morio::proto::dispatch::TransferRef;
use morio::proto::frame::{encode_chunk_segs, Finish, Frame, Hello, Kind, Op};
use morio::proto::handshake::check_ack;
use morio::proto::lane::{Answer, LaneBook, Matched, ReadWait, Report, Sendable};
use morio::proto::limits::VERSION;
use rand::seq::SliceRandom;
use rand::Rng;

use super::{
    gather, place, Initiator, Lane, Out, Owner, Sim, Staging, Xfer, INIT_KEY, LOST,
    STAGE_IN_FAILED, STAGE_OUT_FAILED, TARGET_KEY,
};
use crate::net::{Cause, Conn};

impl Sim {
    /// Start an initiator: a new instance number, uids from 0, every lane dialed.
    pub fn start_instance(&mut self) {
        let i = self.inits.len();
        let instance = self.rng.gen();
        let mut lanes = Vec::new();
        self.inits.push(Initiator {
            instance,
            lanes: Vec::new(),
            owners: (0..self.n_shards).map(|_| Owner::default()).collect(),
            next_uid: 0,
            reports: VecDeque::new(),
            by_ref: HashMap::new(),
            crashed: false,
        });
        for l in 0..self.n_lanes {
            lanes.push(self.dial(i, l));
        }
        self.inits[i].lanes = lanes;
    }

    /// A fresh connection for lane `l` of instance `i`, HELLO on its way.
    fn dial(&mut self, i: usize, l: u16) -> Lane {
        let hello = Hello {
            version: VERSION,
            lane: l,
            n_lanes: self.n_lanes,
            src_key: INIT_KEY.into(),
            dst_key: TARGET_KEY.into(),
            instance: self.inits[i].instance,
            nonce: self.rng.gen(),
            host_tag: None,
        };
        let mut conn = Conn::new(i, l, hello);
        conn.weight = *[1, 3, 9].choose(&mut self.rng).expect("weights");
        self.conns.push(conn);
        Lane {
            book: LaneBook::default(),
            conn: self.conns.len() - 1,
            ready: false,
            out: None,
            staging: None,
        }
    }

    /// The running initiator's lane `l`, dialed again if it died (as the service does when
    /// work comes for a dead lane).
    pub(super) fn lane_for(&mut self, l: u16) {
        let i = self.cur();
        if self.inits[i].lanes[l as usize].book.dead() {
            let lane = self.dial(i, l);
            self.inits[i].lanes[l as usize] = lane;
        }
    }

    /// The running initiator crashes: its lanes vanish (what they had sent may still reach
    /// the target, up to a random cut), its transfers are abandoned.
    pub fn crash(&mut self) {
        let i = self.cur();
        self.inits[i].crashed = true;
        for l in 0..self.n_lanes as usize {
            let c = self.inits[i].lanes[l].conn;
            self.close_init_end(c);
        }
        for xf in self.xfers.iter_mut().filter(|x| x.inst == i) {
            xf.abandoned = xf.result.is_none();
        }
    }

    /// The initiator's end of connection `c` closes: what it sent reaches the target up to a
    /// random cut; nothing more is read.
    fn close_init_end(&mut self, c: usize) {
        let keep = {
            let n = self.conns[c].up.in_flight();
            self.rng.gen_range(0..=n)
        };
        let conn = &mut self.conns[c];
        conn.init_open = false;
        conn.down.clear();
        conn.up.cut(keep);
    }

    /// Lane `l` of the running initiator dies: every transfer its book names is lost.
    pub fn die(&mut self, l: u16, cause: Cause) {
        let i = self.cur();
        if self.inits[i].lanes[l as usize].book.dead() {
            return;
        }
        // The checks' expectation first, from what the lane was given and matched, for the
        // transfers still in their owners' tables.
        let owners = &self.inits[i].owners;
        let running = |x: &Xfer| {
            x.inst == i
                && x.dispatched
                && owners[x.spec.owner]
                    .table
                    .get(&x.uid)
                    .is_some_and(|e| e.gen == x.gen)
        };
        for xf in self.xfers.iter_mut().filter(|x| running(x)) {
            if xf.refs.get(&l).copied().unwrap_or(0) > 0 {
                xf.must_lose = true;
            } else if xf.shared_on.contains(&l) {
                xf.may_lose = true;
            }
            xf.refs.remove(&l);
            xf.shared_on.remove(&l);
        }
        let Initiator {
            lanes,
            owners,
            reports,
            ..
        } = &mut self.inits[i];
        let lane = &mut lanes[l as usize];
        let (hit, fenced) = lane
            .book
            .die(|t| owners[t.owner].may_run(t.gen))
            .expect("a live lane");
        lane.ready = false;
        lane.out = None;
        lane.staging = None;
        let c = lane.conn;
        let msg = format!("{LOST}: {cause}");
        for t in hit {
            reports.push_back((t, Report::Lost { msg: msg.clone() }));
        }
        for t in fenced {
            reports.push_back((t, Report::Fenced));
        }
        self.closes.push((c, false, cause));
        self.close_init_end(c);
    }

    /// Lane `l`'s writer: start its next frame (if none is under way) and put bytes of it on
    /// the wire.
    pub(super) fn write_step(&mut self, l: usize) {
        let i = self.cur();
        if self.inits[i].lanes[l].out.is_none() && !self.next_frame(l) {
            return;
        }
        let n = self.rng.gen_range(1..=self.wburst.min(1 << 20));
        let lane = &mut self.inits[i].lanes[l];
        let out = lane.out.as_mut().expect("a frame under way");
        let k = n.min(out.bytes.len() - out.at);
        let conn = &mut self.conns[lane.conn];
        if conn.target_open {
            conn.up.put(&out.bytes[out.at..out.at + k]);
        }
        out.at += k;
        if out.at == out.bytes.len() {
            if let Some(c) = out.chunk {
                self.xfers[out.x].sent.insert(c);
            }
            lane.out = None;
            lane.book.sent();
        }
    }

    /// Pop lane `l`'s next frame and register it with the book, as the service's writer
    /// does; `false` when nothing is to be sent (or a staging copy began).
    fn next_frame(&mut self, l: usize) -> bool {
        let seed = self.seed;
        let i = self.cur();
        let Some((to, s)) = self.inits[i].lanes[l].book.pop() else {
            return false;
        };
        let lane_ix = l as u16;
        let mut bytes = Vec::new();
        let (x, write, chunk) = match s {
            Sendable::Chunk(spec, buf) => {
                let x = buf.x;
                let xf = &mut self.xfers[x];
                assert_eq!(xf.uid, to.uid, "seed {seed}: chunk of another transfer");
                let prev = xf.chunks.insert(spec.chunk, spec.pieces.clone());
                assert!(
                    prev.is_none(),
                    "seed {seed}: chunk {} of transfer {x} taken twice",
                    spec.chunk
                );
                xf.frame_lanes.insert(lane_ix);
                if xf.shared_stripes && spec.chunk != 0 {
                    // A stripe this lane took from the shared list.
                    *xf.refs.entry(lane_ix).or_default() += 1;
                }
                let fails = xf.fail_chunk == Some(spec.chunk) && spec.op == Op::Write;
                let Initiator { lanes, owners, .. } = &mut self.inits[i];
                let lane = &mut lanes[l];
                let may_run = |t: &TransferRef| owners[t.owner].may_run(t.gen);
                let tag = lane.book.next_tag();
                let head = spec.head(tag, to.uid);
                match spec.op {
                    Op::Write => {
                        lane.book.sending_write(tag, to, spec.final_, may_run);
                        if fails {
                            lane.staging = Some(Staging {
                                tag,
                                to,
                                x,
                                chunk: spec.chunk,
                            });
                            return false;
                        }
                        let payload =
                            gather(&self.local, spec.pieces.iter().map(|p| (p.local, p.len)));
                        encode_chunk_segs(
                            Kind::Write,
                            spec.final_,
                            &head,
                            spec.pieces.remote_segs(),
                            payload.len() as u64,
                            &mut bytes,
                        );
                        bytes.extend_from_slice(&payload);
                    }
                    Op::Read => {
                        encode_chunk_segs(
                            Kind::Read,
                            spec.final_,
                            &head,
                            spec.pieces.remote_segs(),
                            0,
                            &mut bytes,
                        );
                        let wait = ReadWait {
                            chunk: spec.chunk,
                            final_: spec.final_,
                            local: buf,
                            bytes: spec.pieces.total_bytes(),
                            pieces: spec.pieces,
                        };
                        lane.book.sending_read(tag, to, wait);
                    }
                }
                (x, spec.op == Op::Write, Some(spec.chunk))
            }
            Sendable::Finish(f) => {
                let x = self.inits[i].by_ref[&(to.owner, to.gen)];
                self.xfers[x].frame_lanes.insert(lane_ix);
                let book = &mut self.inits[i].lanes[l].book;
                let tag = book.next_tag();
                book.sending_finish(tag, to, f.fence);
                let finish = Finish {
                    tag,
                    uid: to.uid,
                    op: f.op,
                    n_chunks: f.n_chunks,
                    total_bytes: f.total,
                    code: f.code,
                    msg: f.msg,
                };
                Frame::Finish(finish).encode(0, &mut bytes);
                (x, false, None)
            }
        };
        self.inits[i].lanes[l].out = Some(Out {
            bytes,
            at: 0,
            x,
            write,
            chunk,
        });
        true
    }

    /// Lane `l`'s staging copy fails before any byte of its chunk left.
    pub(super) fn staging_fails(&mut self, l: usize) {
        let i = self.cur();
        let lane = &mut self.inits[i].lanes[l];
        let s = lane.staging.take().expect("a staging copy");
        lane.book.unsend(s.tag);
        *self.xfers[s.x].refs.entry(l as u16).or_default() -= 1;
        let msg = format!("{STAGE_OUT_FAILED}: chunk {}", s.chunk);
        let code = ERR_GPU_OP;
        self.inits[i]
            .reports
            .push_back((s.to, Report::Failed { code, msg }));
        self.drain_reports();
    }

    /// Handle what the initiator end of connection `c` can decode.
    pub(super) fn pump_down(&mut self, c: usize) {
        let l = self.conns[c].lane;
        while self.conns[c].init_open {
            match self.conns[c].down.poll() {
                Ok(Some((frame, payload))) => self.init_frame(c, frame, payload),
                Ok(None) => {
                    let conn = &self.conns[c];
                    if !conn.target_open && conn.down.in_flight() == 0 {
                        self.die(l, Cause::Eof);
                    }
                    return;
                }
                Err(e) => return self.die(l, Cause::Decode(e)),
            }
        }
    }

    /// A frame from the target on lane `conns[c].lane`, as the lane's reader handles it.
    fn init_frame(&mut self, c: usize, frame: Frame, payload: Vec<u8>) {
        let seed = self.seed;
        let i = self.cur();
        let l = self.conns[c].lane;
        assert_eq!(self.conns[c].inst, i);
        if !self.inits[i].lanes[l as usize].ready {
            let Frame::HelloAck(a) = frame else {
                let why = format!("expected HELLO_ACK, got {:?}", frame.kind());
                return self.die(l, Cause::Handshake(why));
            };
            match check_ack(&a, &self.conns[c].hello, None) {
                Ok(_) => {
                    self.inits[i].lanes[l as usize].ready = true;
                    let conn = &mut self.conns[c];
                    conn.stalled |= conn.stall_when_ready;
                    conn.lagging |= conn.lag_when_ready;
                    if let Some(g) = conn.garbage_after_ack.take() {
                        conn.down.put(&g);
                    }
                }
                Err(e) => self.die(l, Cause::Handshake(e)),
            }
            return;
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
            Frame::ReadData { reply, final_ } => (
                reply.tag,
                reply.uid,
                Answer::ReadData {
                    chunk: reply.chunk,
                    final_,
                    code: reply.code,
                    msg: reply.msg,
                },
            ),
            Frame::GoAway { msg, .. } => return self.die(l, Cause::GoAway(msg)),
            other => {
                let why = format!("unexpected {:?} from the target", other.kind());
                return self.die(l, Cause::Violation(why));
            }
        };
        let Initiator {
            lanes,
            owners,
            reports,
            by_ref,
            ..
        } = &mut self.inits[i];
        let book = &mut lanes[l as usize].book;
        match book.answer(tag, uid, answer) {
            Err(v) => return self.die(l, Cause::Violation(v.0.to_string())),
            Ok(Matched::Stale) => self.stale += 1,
            Ok(Matched::Report(to, rep)) => {
                assert!(payload.is_empty(), "seed {seed}: COMPLETE with payload");
                if rep == Report::Fenced {
                    // A fence's FINISH answered: the transfer left its owner's table.
                    reports.push_back((to, rep));
                    return self.drain_reports();
                }
                assert!(
                    matches!(rep, Report::Complete { .. }),
                    "seed {seed}: {rep:?}"
                );
                // The COMPLETE took one of the tags this lane kept of the transfer.
                let x = by_ref[&(to.owner, to.gen)];
                *self.xfers[x].refs.entry(l).or_default() -= 1;
                reports.push_back((to, rep));
            }
            Ok(Matched::ReadData(to, wait, a)) => {
                let Answer::ReadData {
                    mut code, mut msg, ..
                } = a
                else {
                    panic!("seed {seed}: READ_DATA matched as {a:?}");
                };
                if code == SUCCESS {
                    if payload.len() as u64 != wait.bytes {
                        let why = "read data length differs from the request".to_string();
                        return self.die(l, Cause::Violation(why));
                    }
                    let x = wait.local.x;
                    if self.xfers[x].fail_chunk == Some(wait.chunk) {
                        // The copy into (GPU) memory fails here: the chunk's own error.
                        code = ERR_GPU_OP;
                        msg = format!("{STAGE_IN_FAILED}: chunk {}", wait.chunk);
                    } else {
                        let ranges = wait.pieces.iter().map(|p| (p.local, p.len));
                        place(&mut self.local, ranges, &payload);
                    }
                } else {
                    assert!(
                        payload.is_empty(),
                        "seed {seed}: refused READ_DATA with data"
                    );
                }
                let may_run = |t: &TransferRef| owners[t.owner].may_run(t.gen);
                let rep = book.read_done(tag, to, &wait, code, msg, may_run);
                reports.push_back((to, rep));
            }
        }
        self.drain_reports();
    }
}
