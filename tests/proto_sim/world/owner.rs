//! The initiator's owner shards: a user's transfer is dispatched onto lanes, reports are fed
//! to its `Outbound` (FINISH sent when it asks), a transfer that ends early is cancelled on
//! its lanes, deadlines fail transfers, and a status is set only once its bytes have landed.

use std::collections::{BTreeMap, BTreeSet};

use morio::proto::codes::{ERR_BAD_STATE, SUCCESS};
use morio::proto::dispatch::{
    dispatch, home_lane, DispatchParams, FinishSpec, Item, Request, TransferRef, Work,
};
use morio::proto::frame::Op;
use morio::proto::lane::{Fence, Report};
use morio::proto::outbound::{Action, Outbound};
use rand::Rng;

use super::{Buf, Done, Entry, Fencing, Sim, Spec, Xfer};

/// How long a fenced write waits for its FINISHes before its lanes are reset (schedule
/// steps; `service::owner::FINISH_WAIT_NS` in the engine).
const FINISH_WAIT: u64 = 400;
use crate::net::Cause;

impl Sim {
    /// A user submits a transfer to its owner shard.
    pub fn submit(&mut self, spec: Spec) -> usize {
        let i = self.cur();
        let x = self.xfers.len();
        let (n_lanes, n_shards) = (self.n_lanes, self.n_shards);
        let init = &mut self.inits[i];
        let uid = init.next_uid;
        init.next_uid += 1;
        let deadline = self.now.saturating_add(spec.timeout);
        let owner = &mut init.owners[spec.owner];
        let home = home_lane(spec.owner, n_shards, n_lanes, owner.cursor)
            .unwrap_or_else(|| panic!("seed {}: owner {} runs no lane", self.seed, spec.owner));
        owner.cursor += 1;
        let gen = owner.next_gen;
        let to = TransferRef {
            owner: spec.owner,
            uid,
            gen,
        };
        let params = DispatchParams {
            n_lanes,
            striping_threshold: spec.threshold,
            chunk_bytes: spec.chunk_bytes,
            share_stripes: spec.share,
        };
        let req = Request {
            op: spec.op,
            mem_id: spec.mem_id,
            access_key: spec.access_key,
            remote_device: false,
            layout: spec.layout.clone(),
            total: spec.layout.total_bytes(),
        };
        let plan = dispatch(req, params, home, to, &Buf { x });
        self.by_uid.insert((i, uid), x);
        self.xfers.push(Xfer {
            inst: i,
            uid,
            deadline,
            dispatched: false,
            gen,
            n_chunks: 0,
            home,
            plan_lanes: BTreeSet::new(),
            shared_stripes: false,
            fail_chunk: None,
            chunks: BTreeMap::new(),
            sent: BTreeSet::new(),
            frame_lanes: BTreeSet::new(),
            refs: BTreeMap::new(),
            shared_on: BTreeSet::new(),
            must_lose: false,
            may_lose: false,
            abandoned: false,
            result: None,
            spec,
        });
        let plan = match plan {
            Err(r) => {
                self.complete(x, r.code, r.msg.to_string());
                return x;
            }
            Ok(None) => panic!("seed {}: nothing to move", self.seed),
            Ok(Some(p)) => p,
        };
        let n = plan.n_chunks;
        let fail_chunk = self.xfers[x]
            .spec
            .local_failure
            .then(|| self.rng.gen_range(0..n));
        let xf = &mut self.xfers[x];
        xf.dispatched = true;
        xf.n_chunks = n;
        xf.fail_chunk = fail_chunk;
        xf.shared_stripes = plan.stripes.is_some();
        for (l, items) in &plan.lanes {
            xf.plan_lanes.insert(*l);
            for it in items {
                assert_eq!(it.to, to);
                match it.work {
                    Work::Chunk(..) => *xf.refs.entry(*l).or_default() += 1,
                    Work::Shared(..) => {
                        xf.shared_on.insert(*l);
                    }
                    Work::Finish(_) => panic!("dispatch planned FINISH"),
                }
            }
        }
        let init = &mut self.inits[i];
        init.by_ref.insert((to.owner, gen), x);
        let owner = &mut init.owners[to.owner];
        owner.next_gen += 1;
        owner.in_flight.insert(gen);
        let op = xf.spec.op;
        owner.table.insert(
            uid,
            Entry {
                gen,
                ob: Outbound::new(n, deadline, op == Op::Read),
                x,
                home,
                lanes: plan.lanes.iter().map(|(l, _)| *l).collect(),
                stripes: plan.stripes,
                op,
                total: xf.spec.layout.total_bytes(),
                n_chunks: n,
            },
        );
        for (l, items) in plan.lanes {
            self.lane_for(l);
            self.inits[i].lanes[l as usize].book.push(items);
        }
        x
    }

    /// Hand every queued report to its owner, as the owner shard's inbox does.
    pub(super) fn drain_reports(&mut self) {
        let seed = self.seed;
        let i = self.cur();
        while let Some((to, rep)) = self.inits[i].reports.pop_front() {
            let owner = &mut self.inits[i].owners[to.owner];
            if rep == Report::Fenced {
                // (None: its lanes were reset at its deadline meanwhile, and it ended.)
                let Some(f) = owner.fencing.get_mut(&to.uid).filter(|f| f.e.gen == to.gen) else {
                    self.late_reports += 1;
                    continue;
                };
                f.pending -= 1;
                if f.pending == 0 {
                    let f = owner.fencing.remove(&to.uid).expect("fencing");
                    owner.in_flight.remove(&f.e.gen);
                    self.complete(f.e.x, f.code, f.msg);
                }
                continue;
            }
            let Some(e) = owner.table.get_mut(&to.uid).filter(|e| e.gen == to.gen) else {
                self.late_reports += 1;
                continue;
            };
            let (chunk, complete, lost) = (
                matches!(rep, Report::Chunk { .. }),
                matches!(rep, Report::Complete { .. }),
                matches!(rep, Report::Lost { .. }),
            );
            let fences = self.fences && e.op == Op::Write && e.n_chunks > 1;
            let what = format!("{rep:?}");
            let action = e
                .ob
                .on_report(rep)
                .unwrap_or_else(|v| panic!("seed {seed}: transfer {}: {what}: violation {v}", e.x));
            match action {
                None => {}
                Some(Action::SendFinish { code, msg }) if fences => {
                    let e = owner.table.remove(&to.uid).expect("entry");
                    self.fence(to, e, code, msg);
                }
                Some(Action::Complete { code, msg }) if fences && lost => {
                    let e = owner.table.remove(&to.uid).expect("entry");
                    self.fence(to, e, code, msg);
                }
                Some(Action::SendFinish { code, msg }) => {
                    let (x, home) = (e.x, e.home);
                    let item = Item {
                        to,
                        work: Work::Finish(FinishSpec {
                            op: e.op,
                            n_chunks: e.n_chunks,
                            total: e.total,
                            code,
                            msg,
                            fence: false,
                        }),
                    };
                    self.lane_for(home);
                    self.inits[i].lanes[home as usize].book.push([item]);
                    *self.xfers[x].refs.entry(home).or_default() += 1;
                }
                Some(Action::Complete { code, msg }) => {
                    if e.op == Op::Read && e.n_chunks > 1 {
                        self.reads_ended_by_data += usize::from(chunk);
                        self.reads_ended_by_complete += usize::from(complete);
                    }
                    let e = owner.table.remove(&to.uid).expect("entry");
                    owner.in_flight.remove(&e.gen);
                    self.end(to, e, code, msg, false);
                }
            }
        }
    }

    /// A write that failed early is fenced (protocol v11, as `service::owner` does): its
    /// stripes stop, each live lane that carried chunks of it (and its home lane) drops its
    /// work and sends FINISH next (`LaneBook::fence`); its status is set once every FINISH
    /// is answered or its lane died, or its lanes are reset by `tick` first.
    fn fence(&mut self, to: TransferRef, e: Entry, code: u32, msg: String) {
        if let Some(s) = &e.stripes {
            s.cancel();
        }
        self.fenced += 1;
        let i = self.cur();
        let spec = FinishSpec {
            op: e.op,
            n_chunks: e.n_chunks,
            total: e.total,
            code,
            msg: msg.clone(),
            fence: true,
        };
        let mut lanes = e.lanes.clone();
        lanes.push(e.home);
        lanes.sort_unstable();
        lanes.dedup();
        let mut pending = 0;
        for l in lanes {
            let book = &mut self.inits[i].lanes[l as usize].book;
            if book.fence(to, spec.clone(), l == e.home) != Fence::None {
                pending += 1;
            }
        }
        let owner = &mut self.inits[i].owners[to.owner];
        if pending == 0 {
            owner.in_flight.remove(&e.gen);
            return self.complete(e.x, code, msg);
        }
        let by = e.ob.deadline().min(self.now.saturating_add(FINISH_WAIT));
        let f = Fencing {
            e,
            code,
            msg,
            pending,
            by,
        };
        owner.fencing.insert(to.uid, f);
    }

    /// The owner ends a transfer: one that ended early stops its stripes and drops its work
    /// from its lanes (a lane whose frame of it is half sent dies; with `deadline`, a write's
    /// lane that may still carry its bytes, sent unanswered and not all delivered, is reset
    /// too), then its status is set.
    fn end(&mut self, to: TransferRef, e: Entry, code: u32, msg: String, deadline: bool) {
        let early = deadline || code == ERR_BAD_STATE || (e.n_chunks > 1 && code != SUCCESS);
        if early {
            if let Some(s) = &e.stripes {
                s.cancel();
            }
            let i = self.cur();
            let fence = deadline && e.op == Op::Write;
            for &l in &e.lanes {
                let lane = &mut self.inits[i].lanes[l as usize];
                // What the connection has not delivered yet (the socket's send queue).
                let undelivered = self.conns[lane.conn].up.in_flight() > 0;
                match lane.book.cancel(to.uid, to.gen) {
                    Fence::HalfSent => self.die(l, Cause::MidFrame),
                    Fence::Unplaced if fence && undelivered => self.die(l, Cause::Fenced),
                    _ => {}
                }
            }
        }
        self.complete(e.x, code, msg);
    }

    /// Fail every transfer whose deadline has passed.
    pub(super) fn tick(&mut self) {
        let i = self.cur();
        if self.inits[i].crashed {
            return;
        }
        // Every owner takes its expired transfers out of its table first, then ends them, as
        // a shard's tick does: a lane one of them resets fails only transfers still running.
        let now = self.now;
        let mut ended = Vec::new();
        for o in 0..self.inits[i].owners.len() {
            let owner = &mut self.inits[i].owners[o];
            let expired: Vec<u64> = owner
                .table
                .iter()
                .filter(|(_, e)| e.ob.deadline() <= now)
                .map(|(u, _)| *u)
                .collect();
            for uid in expired {
                let mut e = owner.table.remove(&uid).expect("entry");
                owner.in_flight.remove(&e.gen);
                let to = TransferRef {
                    owner: o,
                    uid,
                    gen: e.gen,
                };
                if let Some(Action::Complete { code, msg }) = e.ob.on_tick(now) {
                    ended.push((to, e, code, msg));
                }
            }
        }
        for (to, e, code, msg) in ended {
            self.end(to, e, code, msg, true);
        }
        // Fenced writes whose FINISHes were not all answered in time: their lanes still
        // waiting are reset, then the failure is set.
        let mut late = Vec::new();
        for o in 0..self.inits[i].owners.len() {
            let owner = &mut self.inits[i].owners[o];
            let uids: Vec<u64> = owner
                .fencing
                .iter()
                .filter(|(_, f)| f.by <= now)
                .map(|(u, _)| *u)
                .collect();
            for uid in uids {
                let f = owner.fencing.remove(&uid).expect("fencing");
                owner.in_flight.remove(&f.e.gen);
                late.push((o, uid, f));
            }
        }
        for (o, uid, f) in late {
            let mut lanes = f.e.lanes.clone();
            lanes.push(f.e.home);
            lanes.sort_unstable();
            lanes.dedup();
            for l in lanes {
                let book = &mut self.inits[i].lanes[l as usize].book;
                if book.cancel(uid, f.e.gen) != Fence::None {
                    self.die(l, Cause::Fenced);
                }
            }
            let _ = o;
            self.complete(f.e.x, f.code, f.msg);
        }
        self.drain_reports();
    }

    /// The user's status of transfer `x` is set. A SUCCESS must come after the target
    /// recorded its inbound status and once every byte is at its destination (transfers'
    /// windows are disjoint, so these bytes are its alone); and once a transfer ended, no
    /// live lane may still read its memory.
    fn complete(&mut self, x: usize, code: u32, msg: String) {
        let seed = self.seed;
        self.events += 1;
        let xf = &self.xfers[x];
        assert!(
            xf.result.is_none(),
            "seed {seed}: transfer {x} completed twice"
        );
        for lane in &self.inits[xf.inst].lanes {
            if lane.book.dead() {
                continue;
            }
            let writing = lane.out.as_ref().is_some_and(|o| o.write && o.x == x);
            let staging = lane.staging.as_ref().is_some_and(|s| s.x == x);
            assert!(
                !writing && !staging,
                "seed {seed}: transfer {x} ended ({code}, {msg}) while a lane still reads its memory"
            );
        }
        if code == SUCCESS {
            match self.inbound.get(&(xf.inst, xf.uid)) {
                Some(&(SUCCESS, at)) => assert!(at < self.events, "seed {seed}"),
                other => {
                    panic!("seed {seed}: transfer {x} completed with SUCCESS, inbound {other:?}")
                }
            }
            for p in xf.spec.layout.iter() {
                let (l, r, n) = (p.local as usize, p.remote as usize, p.len as usize);
                let (src, dst) = match xf.spec.op {
                    Op::Write => (&self.init_local[l..l + n], &self.target[r..r + n]),
                    Op::Read => (&self.init_target[r..r + n], &self.local[l..l + n]),
                };
                assert!(
                    src == dst,
                    "seed {seed}: transfer {x} completed before its bytes landed"
                );
            }
        }
        self.xfers[x].result = Some(Done {
            code,
            msg,
            event: self.events,
            at: self.now,
        });
    }
}
