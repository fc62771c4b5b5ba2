//! The target: one `Served` per connection (HELLO checked and answered), frames classified
//! and checked, WRITE payloads placed, READs answered, FINISH handled, each inbound status
//! recorded before its answer leaves; and the checks of what arrives against what was sent.

use morio::proto::access::AccessKey;
use morio::proto::codes::{ERR_BAD_STATE, ERR_GPU_OP, SUCCESS};
use morio::proto::frame::{Chunk, Finish, Frame, Op};
use morio::proto::handshake::{accept, check_hello, refusal};
use morio::proto::layout::remote_seg;
use morio::proto::target::{classify, Inbound, Record, Response, Served};

use super::{
    code_msg, gather, place, Sim, ACCESS_KEY, INIT_KEY, LOCAL_ONLY_MEM_ID, MEM_ID, TARGET_KEY,
};
use crate::net::Cause;

impl Sim {
    /// The target's region `mem_id` as `Served::check` takes it: its size and access key.
    fn region(&self, mem_id: u32) -> Option<(u64, AccessKey)> {
        let size = self.target.len() as u64;
        match mem_id {
            MEM_ID => Some((size, ACCESS_KEY)),
            LOCAL_ONLY_MEM_ID => Some((size, AccessKey::NONE)),
            _ => None,
        }
    }

    /// The initiator run with this instance number.
    fn inst_of(&self, instance: u64) -> usize {
        self.inits
            .iter()
            .position(|i| i.instance == instance)
            .unwrap_or_else(|| panic!("seed {}: unknown instance {instance:#x}", self.seed))
    }

    /// The target's end of `c` closes (with GOAWAY once it served the connection).
    fn close_target_end(&mut self, c: usize, cause: Cause) {
        let conn = &mut self.conns[c];
        if conn.served.take().is_some() {
            let bye = Frame::GoAway {
                code: ERR_BAD_STATE,
                msg: cause.to_string(),
            };
            if conn.init_open {
                conn.down.send(&bye, &[]);
            }
        }
        conn.target_open = false;
        conn.up.clear();
        self.closes.push((c, true, cause));
    }

    /// Send on `c` towards the initiator (nowhere once its end closed).
    fn answer(&mut self, c: usize, frame: &Frame, payload: &[u8]) {
        let conn = &mut self.conns[c];
        if conn.init_open {
            conn.down.send(frame, payload);
        }
    }

    /// Handle what the target end of connection `c` can decode.
    pub(super) fn pump_up(&mut self, c: usize) {
        while self.conns[c].target_open {
            match self.conns[c].up.poll() {
                Ok(Some((frame, payload))) => self.target_frame(c, frame, payload),
                Ok(None) => {
                    let conn = &self.conns[c];
                    if !conn.init_open && conn.up.in_flight() == 0 {
                        self.close_target_end(c, Cause::Eof);
                    }
                    return;
                }
                Err(e) => return self.close_target_end(c, Cause::Decode(e)),
            }
        }
    }

    /// A frame from the initiator on connection `c`, as the served connection handles it.
    fn target_frame(&mut self, c: usize, frame: Frame, payload: Vec<u8>) {
        let seed = self.seed;
        let Some(served) = self.conns[c].served.clone() else {
            let Frame::Hello(h) = frame else {
                let why = format!("expected HELLO, got {:?}", frame.kind());
                return self.close_target_end(c, Cause::Handshake(why));
            };
            let verdict = check_hello(&h, TARGET_KEY);
            let ok = verdict.clone();
            let ack = match verdict {
                Ok(()) => accept(
                    TARGET_KEY,
                    &h,
                    None,
                    [0; 16],
                    false,
                    morio::proto::limits::VERSION,
                ),
                Err(r) => refusal(r, None),
            };
            self.answer(c, &Frame::HelloAck(ack), &[]);
            match ok {
                Ok(()) => {
                    self.conns[c].served = Some(Served {
                        peer: h.src_key.as_str().into(),
                        instance: h.instance,
                        lane: h.lane,
                        n_lanes: h.n_lanes,
                    });
                }
                Err(r) => self.close_target_end(c, Cause::Handshake(r.msg)),
            }
            return;
        };
        assert_eq!(&*served.peer, INIT_KEY, "seed {seed}");
        let inst = self.inst_of(served.instance);
        let inbound = match classify(frame) {
            Ok(f) => f,
            Err(v) => return self.close_target_end(c, Cause::Violation(v.0)),
        };
        match inbound {
            Inbound::Write(chunk, final_) => {
                let res = match served.check(&chunk, final_, self.region(chunk.mem_id)) {
                    Ok(r) => r,
                    Err(v) => return self.close_target_end(c, Cause::Violation(v.0)),
                };
                assert_eq!(payload.len() as u64, chunk.bytes(), "seed {seed}");
                self.note_chunk(c, inst, &chunk, final_);
                if res.is_ok() {
                    let ranges = chunk.segs.iter().map(|s| (s.off, s.len));
                    place(&mut self.target, ranges, &payload);
                } // else: its payload is drained untouched
                let (code, msg) = code_msg(res);
                let resp = served.write_done(&chunk, final_, code, msg, &self.joins);
                self.respond(c, inst, &chunk, resp);
            }
            Inbound::Read(chunk, final_, _) => {
                let res = match served.check(&chunk, final_, self.region(chunk.mem_id)) {
                    Ok(r) => r,
                    Err(v) => return self.close_target_end(c, Cause::Violation(v.0)),
                };
                assert!(payload.is_empty(), "seed {seed}: READ with payload");
                self.note_chunk(c, inst, &chunk, final_);
                let data = if res.is_ok() {
                    gather(&self.target, chunk.segs.iter().map(|s| (s.off, s.len)))
                } else {
                    Vec::new()
                };
                let (code, msg) = code_msg(res);
                let (record, reply) = served.read_reply(&chunk, final_, code, msg.clone());
                if let Some(r) = record {
                    self.record(inst, chunk.uid, r);
                }
                self.answer(c, &reply, &data);
                let resp = served.read_done(&chunk, final_, code, msg, &self.joins);
                self.respond(c, inst, &chunk, resp);
            }
            Inbound::Finish(f) => {
                assert!(payload.is_empty(), "seed {seed}: FINISH with payload");
                self.note_finish(c, inst, &f);
                let uid = f.uid;
                let resp = served.finish(f, &self.joins);
                assert!(!resp.joined, "seed {seed}: FINISH joined");
                let (record, reply) = (resp.record, resp.reply);
                // The first FINISH records (then only a fenced write's get more).
                if let Some(record) = record {
                    self.record(inst, uid, record);
                }
                self.answer(c, &reply.expect("FINISH answers"), &[]);
            }
        }
    }

    /// Record, then answer: the inbound status exists before the initiator can see it.
    fn respond(&mut self, c: usize, inst: usize, chunk: &Chunk, resp: Response) {
        let seed = self.seed;
        let key = (inst, chunk.uid);
        if resp.joined {
            let seen = self.seen[&key].chunks.len();
            assert_eq!(
                seen, chunk.n_chunks as usize,
                "seed {seed}: join of {key:?} answered with {seen} of {} chunks at the target",
                chunk.n_chunks
            );
            let prev = self.answered.insert(key, (c, chunk.chunk));
            assert!(
                prev.is_none(),
                "seed {seed}: join of {key:?} answered twice"
            );
            assert!(resp.record.is_some() && resp.reply.is_some(), "seed {seed}");
        }
        if let Some(r) = resp.record {
            self.record(inst, chunk.uid, r);
        }
        if let Some(f) = resp.reply {
            if let Frame::Complete(r) = &f {
                assert_eq!((r.tag, r.uid), (chunk.tag, chunk.uid), "seed {seed}");
            }
            self.answer(c, &f, &[]);
        }
    }

    fn record(&mut self, inst: usize, uid: u64, r: Record) {
        assert_eq!(r.uid, uid, "seed {}", self.seed);
        self.events += 1;
        let prev = self.inbound.insert((inst, uid), (r.code, self.events));
        // With fences, a FINISH that comes after its join completed records again; the
        // engine's store keeps the first error.
        assert!(
            prev.is_none() || self.fences,
            "seed {}: inbound status of {inst}/{uid} recorded twice",
            self.seed
        );
        if let Some(p) = prev.filter(|p| p.0 != SUCCESS) {
            self.inbound.insert((inst, uid), p);
        }
    }

    /// The transfer a target-side frame names (the checks' view of the initiator).
    fn xfer_of(&self, inst: usize, uid: u64) -> usize {
        *self
            .by_uid
            .get(&(inst, uid))
            .unwrap_or_else(|| panic!("seed {}: unknown transfer {inst}/{uid}", self.seed))
    }

    /// A chunk the target accepted to handle on `c`, against what the initiator sent: chunk 0
    /// of a multi-chunk transfer rides the home lane, which every chunk names as its join
    /// lane; a one-chunk transfer names 0; its segments are the pieces the writer took; no
    /// chunk arrives twice nor one that never left.
    fn note_chunk(&mut self, c: usize, inst: usize, chunk: &Chunk, final_: bool) {
        let seed = self.seed;
        let lane = self.conns[c].lane;
        let x = self.xfer_of(inst, chunk.uid);
        let xf = &self.xfers[x];
        let ctx = format!("seed {seed}: chunk {} of transfer {x}", chunk.chunk);
        assert_eq!(final_, xf.n_chunks == 1, "{ctx}: final flag");
        assert_eq!(chunk.n_chunks, xf.n_chunks, "{ctx}: chunk count");
        if xf.multi() {
            assert_eq!(chunk.join_lane, xf.home, "{ctx}: join lane");
            if chunk.chunk == 0 {
                assert_eq!(lane, xf.home, "{ctx}: off its join lane");
            }
        } else {
            assert_eq!(chunk.join_lane, 0, "{ctx}: join lane of one chunk");
        }
        let pieces = xf.chunks.get(&chunk.chunk).unwrap_or_else(|| {
            panic!("{ctx}: arrived, but no lane took it");
        });
        let segs: Vec<_> = pieces.iter().map(|p| remote_seg(&p)).collect();
        assert_eq!(chunk.segs.to_vec(), segs, "{ctx}: segments");
        assert!(xf.sent.contains(&chunk.chunk), "{ctx}: arrived unsent");
        let n = xf.n_chunks;
        let s = self.seen.entry((inst, chunk.uid)).or_default();
        s.n_chunks = n;
        assert!(s.chunks.insert(chunk.chunk), "{ctx}: delivered twice");
        s.bytes += chunk.bytes();
        self.chunks_seen += 1;
    }

    /// FINISH only follows a chunk that failed on the initiator before it left, rides the
    /// home lane, and describes its transfer.
    /// With fences (protocol v11) FINISH ends a write that failed early (a chunk that never
    /// left, a lost lane), on any lane that carried its chunks and on its home lane, once or
    /// more. A FINISH that comes after every chunk was seen (its join completed, or was
    /// ended by an earlier FINISH and spent, and went) starts an ended join that only age
    /// prunes.
    fn note_finish(&mut self, c: usize, inst: usize, f: &Finish) {
        let seed = self.seed;
        let x = self.xfer_of(inst, f.uid);
        let xf = &self.xfers[x];
        let fences = self.fences;
        assert!(
            xf.multi() && xf.spec.op == Op::Write && (fences || xf.fail_chunk.is_some()),
            "seed {seed}: FINISH for transfer {x}, which no local failure stopped"
        );
        if !fences {
            assert_eq!(self.conns[c].lane, xf.home, "seed {seed}: FINISH off home");
        }
        let total = xf.spec.layout.total_bytes();
        assert_eq!(
            (f.op, f.n_chunks, f.total_bytes),
            (xf.spec.op, xf.n_chunks, total),
            "seed {seed}: FINISH describes another transfer"
        );
        if !fences {
            assert_eq!(f.code, ERR_GPU_OP, "seed {seed}: FINISH code ({})", f.msg);
        }
        self.finishes += 1;
        let n = xf.n_chunks;
        let s = self.seen.entry((inst, f.uid)).or_default();
        s.n_chunks = n;
        assert!(fences || !s.finished, "seed {seed}: FINISH twice");
        if s.chunks.len() == n as usize {
            // Its join completed or was spent and went: this FINISH starts it again, ended.
            s.finish_after_join = true;
        }
        s.finished = true;
    }
}
