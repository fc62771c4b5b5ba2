//! Owner side of transfers: dispatch chunks onto lanes ([`crate::proto::dispatch`]), collect
//! lane reports, complete statuses.

use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::msg::{LaneEvent, LaneWork, Peer, ShardMsg, Submission};
use super::Shard;
use crate::proto::codes;
use crate::proto::dispatch::{
    self, DispatchParams, FinishSpec, Item, Request, SharedStripes, TransferRef, Work,
};
use crate::proto::frame::Op;
use crate::proto::lane::Report;
use crate::proto::outbound::{Action, Outbound};
use crate::status::{StatusCode, TransferStatus};

/// A transfer in the table; counted in its peer's express state while it is
/// ([`super::express::Express::owner_takes`]).
#[derive(Debug)]
struct Entry {
    gen: u64,
    sm: Outbound,
    status: Arc<TransferStatus>,
    peer: Arc<Peer>,
    op: Op,
    total: u64,
    n_chunks: u32,
    home_lane: u16,
    lanes: Vec<u16>,
    /// The shared stripes of a write that shares them, to stop its lanes taking more.
    stripes: Option<Arc<SharedStripes>>,
    submitted_ns: u64,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.peer.express.owner_done();
    }
}

/// Transfers owned by one shard, keyed by (peer key, uid): uids are unique per initiator, so
/// this is also where duplicates are refused.
#[derive(Debug, Default)]
pub(crate) struct OwnerTable {
    map: HashMap<(Arc<str>, u64), Entry>,
    cursor: HashMap<Arc<str>, usize>,
    /// Generations of the transfers in `map` and `fencing`, for [`super::Shared::low_water`].
    in_flight: BTreeSet<u64>,
    /// Failed writes waiting for their lanes' shards to reset what may still carry their
    /// bytes, and failed reads for their lanes to stop placing theirs
    /// ([`ShardMsg::Fenced`]), before their failure is reported, by (peer, uid, gen).
    fencing: HashMap<(Arc<str>, u64, u64), Fencing>,
}

/// A failed write or read whose failure waits for its lanes ([`OwnerTable::fencing`]).
#[derive(Debug)]
struct Fencing {
    entry: Entry,
    code: u32,
    msg: String,
    /// What it still waits for.
    count: FenceCount,
    /// When the resets were asked for (`now_ns` time).
    since_ns: u64,
    /// When a fence by FINISH gives way to resets (`now_ns` time): [`FINISH_WAIT_NS`] after
    /// it began, or the write's deadline if sooner.
    finish_by: u64,
}

/// What a fenced transfer waits for before its failure is reported: its lane shards'
/// answers to the Cancels sent them, and, while it is fenced by FINISH, the answers to the
/// FINISHes they queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FenceCount {
    /// Answers still to come from lane shards, to every Cancel sent them (a shard answers
    /// each once: those of the FINISH round still count after the resets are asked for).
    waiting: usize,
    /// A write that failed early, fenced by FINISH on its lanes ([`Ending::Finish`]): the
    /// fences queued (as their shards said) and not yet answered. Signed: an answer may come
    /// before its shard's count.
    finishes: i64,
    /// Whether it is fenced by FINISH on its lanes (until `finish_by`; then its lanes are
    /// reset as for a write failed by its deadline).
    finishing: bool,
}

impl FenceCount {
    /// `shards` lane shards answered, and `answers` of the FINISHes (negative: FINISHes a
    /// shard queued, still to be answered). Whether nothing is left to wait for.
    fn answered(&mut self, shards: usize, answers: i64) -> bool {
        self.waiting = self.waiting.saturating_sub(shards);
        if self.finishing {
            self.finishes -= answers;
        }
        self.waiting == 0 && !(self.finishing && self.finishes > 0)
    }

    /// The FINISHes were not all answered in time: `shards` lane shards are asked to reset
    /// its lanes instead, and each will answer that too. FINISHes answered later count for
    /// nothing.
    fn reset(&mut self, shards: usize) {
        self.finishing = false;
        self.waiting += shards;
    }
}

/// How long a write that failed early waits for the FINISHes on its lanes to be answered
/// before the lanes still waiting are reset (as for a write failed by its deadline) and its
/// failure is reported: a target that has not answered within this is stuck or far behind
/// (a lane whose writer is stuck mid-frame is most often one whose peer stopped reading),
/// and the transfers queued behind the FINISH on those lanes then fail now, not at their
/// deadlines.
const FINISH_WAIT_NS: u64 = 2_000_000_000;

/// How long a failed write or read waits for its lanes' shards to confirm before its failure
/// is reported anyway (a shard that does not answer is stuck: its lanes too).
const FENCE_GRACE_NS: u64 = 1_000_000_000;

impl OwnerTable {
    /// Whether this shard owns no transfer (its deadline tick has nothing to do).
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty() && self.fencing.is_empty()
    }

    /// The transfer of generation `gen` ended: publish the new low-water mark if it was the
    /// oldest.
    fn ended(&mut self, shard: &Shard, gen: u64) {
        if self.forget(gen) {
            self.publish(shard);
        }
    }

    /// Drop `gen` from the running generations; whether the low-water mark moved.
    fn forget(&mut self, gen: u64) -> bool {
        self.in_flight.remove(&gen) && self.in_flight.first().is_none_or(|&f| f > gen)
    }

    /// Every transfer below this generation has ended (`next_gen`: none runs).
    fn low_water(&self, next_gen: u64) -> u64 {
        self.in_flight.first().copied().unwrap_or(next_gen)
    }

    fn publish(&self, shard: &Shard) {
        if let Some(slot) = shard.shared.low_water.get(shard.id) {
            slot.store(self.low_water(shard.next_gen.get()), Ordering::Release);
        }
    }
}

fn fail_status(status: &TransferStatus, code: u32, msg: &str) {
    status.update(
        StatusCode::from_u32(code).unwrap_or(StatusCode::ErrBadState),
        msg,
    );
}

/// A new transfer arrives at its owner.
pub(crate) fn submit(shard: &Rc<Shard>, s: Submission) {
    crate::trace::mark(s.uid, crate::trace::stage::OWNER);
    if shard.closing.get() {
        return fail_status(&s.status, codes::ERR_BAD_STATE, "engine shut down");
    }
    let cfg = &shard.shared.cfg;
    let key = (s.peer.key.clone(), s.uid);
    if shard.owner.borrow().map.contains_key(&key) {
        // MORI-compat: a second in-flight op with the same (peer, uid) fails; the first proceeds.
        return fail_status(&s.status, codes::ERR_BAD_STATE, "duplicate peer/op id");
    }
    let (chunk_bytes, n_lanes) = chunk_and_lanes(&shard.shared, &s);
    let home = {
        let mut t = shard.owner.borrow_mut();
        let c = match t.cursor.get_mut(&s.peer.key) {
            Some(c) => c,
            None => t.cursor.entry(s.peer.key.clone()).or_insert(0),
        };
        // The home lane is one of the first `num_data_conns` whatever the transfer: a staged
        // GPU transfer stripes over more, and the lanes past them open on the first one.
        let base = cfg.num_data_conns as u16;
        let home = dispatch::home_lane(shard.id, shard.n_shards(), base, *c);
        *c = c.wrapping_add(1);
        home
    };
    let Some(home) = home else {
        return fail_status(
            &s.status,
            codes::ERR_BAD_STATE,
            "no lane available on owner shard",
        );
    };
    let gen = shard.next_gen.get();
    let to = TransferRef {
        owner: shard.id,
        uid: s.uid,
        gen,
    };
    let params = DispatchParams {
        n_lanes,
        striping_threshold: cfg.striping_threshold_bytes as u64,
        chunk_bytes,
        share_stripes: cfg.share_stripes,
    };
    let req = Request {
        op: s.op,
        mem_id: s.remote_mem,
        access_key: s.remote_key,
        remote_device: s.remote_device,
        layout: s.layout,
        total: s.total,
    };
    let plan = match dispatch::dispatch(req, params, home, to, &s.local) {
        Ok(Some(p)) => p,
        // Nothing to move (the engine answers empty transfers itself; this keeps it total).
        Ok(None) => return s.status.update(StatusCode::Success, ""),
        Err(r) => return fail_status(&s.status, r.code, r.msg),
    };
    if !s.peer.express.owner_takes(s.uid) {
        // An express write with this uid is in flight (MORI-compat, as above).
        return fail_status(&s.status, codes::ERR_BAD_STATE, "duplicate peer/op id");
    }
    shard.next_gen.set(gen + 1);
    let lanes: Vec<u16> = plan.lanes.iter().map(|(l, _)| *l).collect();
    {
        // Before any lane has the work: the low-water mark must not pass this generation.
        let mut t = shard.owner.borrow_mut();
        t.in_flight.insert(gen);
        if t.in_flight.len() == 1 {
            t.publish(shard);
        }
    }
    crate::trace::mark(s.uid, crate::trace::stage::PLANNED);
    // Other shards' lanes first, so they start while this shard sends its own share; then
    // the bookkeeping (nothing can answer before this handler returns: every report comes
    // through this shard's inbox), then this shard's own lanes.
    let hand_out = |lane: u16, items: Vec<Item<_>>| {
        let work = LaneWork {
            peer: s.peer.clone(),
            lane,
            items,
        };
        shard.send(shard.lane_shard(lane), ShardMsg::LaneWork(Box::new(work)));
    };
    let (own, others): (Vec<_>, Vec<_>) = plan
        .lanes
        .into_iter()
        .partition(|(l, _)| shard.lane_shard(*l) == shard.id);
    for (lane, items) in others {
        hand_out(lane, items);
    }
    if !s.peer.opened.swap(true, Ordering::Relaxed) {
        open_other_lanes(shard, &s.peer, &lanes);
    }
    let mut t = shard.owner.borrow_mut();
    if t.map.is_empty() {
        shard.owns_work.ring();
    }
    t.map.insert(
        key,
        Entry {
            gen,
            sm: Outbound::new(plan.n_chunks, s.deadline_ns, s.op == Op::Read),
            status: s.status,
            peer: s.peer.clone(),
            op: s.op,
            total: s.total,
            n_chunks: plan.n_chunks,
            home_lane: home,
            lanes,
            stripes: plan.stripes,
            submitted_ns: s
                .deadline_ns
                .saturating_sub(cfg.op_timeout.as_nanos() as u64),
        },
    );
    drop(t);
    for (lane, items) in own {
        hand_out(lane, items);
    }
}

/// A lane reports on a transfer this shard owns.
pub(crate) fn on_event(shard: &Rc<Shard>, ev: LaneEvent) {
    if ev.report == Report::Fenced {
        return fence_answered(shard, &ev.peer, (ev.to.uid, ev.to.gen), 0, 1);
    }
    let key = (ev.peer, ev.to.uid);
    let mut t = shard.owner.borrow_mut();
    let Some(e) = t.map.get_mut(&key).filter(|e| e.gen == ev.to.gen) else {
        return; // A late report for a transfer that already ended.
    };
    // A lane lost (or a violation) fails a striped write at once, with chunks of it maybe
    // still on their way on other lanes.
    let lost = matches!(ev.report, Report::Lost { .. });
    let step = e.sm.on_report(ev.report);
    let (action, early) = match step {
        Ok(a) => (a, false),
        Err(v) => (
            e.sm.fail(codes::ERR_BAD_STATE, &format!("protocol violation: {v}")),
            true,
        ),
    };
    let fences = e.op == Op::Write && e.n_chunks > 1 && e.peer.fences.load(Ordering::Relaxed);
    match action {
        None => {}
        Some(Action::SendFinish { code, msg }) if fences => {
            // A chunk could not leave: the write is fenced on every lane that carried its
            // chunks, one of whose FINISHes ends the join.
            let Some(e) = t.map.remove(&key) else { return };
            drop(t);
            finish(shard, &key.0, key.1, e, code, &msg, Ending::Finish);
        }
        Some(Action::SendFinish { code, msg }) => {
            crate::trace::mark(key.1, crate::trace::stage::FINISH);
            let work = LaneWork {
                peer: e.peer.clone(),
                lane: e.home_lane,
                items: vec![Item {
                    to: TransferRef {
                        owner: shard.id,
                        uid: key.1,
                        gen: e.gen,
                    },
                    work: Work::Finish(FinishSpec {
                        op: e.op,
                        n_chunks: e.n_chunks,
                        total: e.total,
                        code,
                        msg,
                        fence: false,
                    }),
                }],
            };
            let to = shard.lane_shard(e.home_lane);
            drop(t);
            shard.send(to, ShardMsg::LaneWork(Box::new(work)));
        }
        Some(Action::Complete { code, msg }) => {
            let Some(e) = t.map.remove(&key) else { return };
            drop(t);
            // A failed multi-chunk transfer may leave answers its lanes still wait for (chunk
            // 0's COMPLETE after a FINISH): they are dropped there.
            let ended_early =
                early || code == codes::ERR_BAD_STATE || (e.n_chunks > 1 && code != codes::SUCCESS);
            let ending = if fences && (early || lost) {
                Ending::Finish
            } else if ended_early {
                Ending::Cancel
            } else {
                Ending::Answered
            };
            finish(shard, &key.0, key.1, e, code, &msg, ending);
        }
    }
}

/// How a transfer that leaves the table ends ([`finish`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// As it was answered: its lanes hold nothing of it.
    Answered,
    /// Early (a lost lane, a failed chunk): its lanes drop its queued and pending work.
    Cancel,
    /// By its deadline: as `Cancel`, and a write's lanes that may still carry its bytes
    /// are reset before its failure is reported (their bytes could be stuck for long). (A
    /// failed read waits for its lanes either way.)
    Deadline,
    /// A striped write failed early (a lost lane, a violation, a chunk that could not
    /// leave) to a peer that answers FINISH on every lane: as `Cancel`, and its failure is
    /// reported once each lane that carried chunks of it has had FINISH answered after them
    /// (so they are placed or dropped), or died; by its deadline, those still waiting are
    /// reset as for `Deadline`.
    Finish,
}

/// A transfer left the table with `code`. A write that failed by its deadline is reported
/// once its lanes' shards have reset the lanes that might still carry its bytes
/// ([`fenced`]): when the application learns of the failure, nothing of it is left to leave
/// this host, so it cannot land later over what the application writes there next. A failed
/// read is reported once its lanes' shards have stopped placing its data: nothing of it
/// lands later in the application's buffer.
fn finish(
    shard: &Rc<Shard>,
    peer: &Arc<str>,
    uid: u64,
    e: Entry,
    code: u32,
    msg: &str,
    ending: Ending,
) {
    let cancel = ending != Ending::Answered;
    if cancel {
        if let Some(s) = &e.stripes {
            s.cancel();
        }
        let mut shards: Vec<usize> = e.lanes.iter().map(|&l| shard.lane_shard(l)).collect();
        shards.sort_unstable();
        shards.dedup();
        // A write failed by its deadline waits for its lanes to reset what may still carry
        // its bytes; any failed read, for its lanes to stop placing its data (and for copies
        // of it into GPU memory to end).
        let finishing = ending == Ending::Finish;
        if finishing && !shards.contains(&shard.lane_shard(e.home_lane)) {
            shards.push(shard.lane_shard(e.home_lane));
        }
        let fence = code != codes::SUCCESS
            && !shards.is_empty()
            && (e.op == Op::Read || ending == Ending::Deadline || finishing);
        let (why, gen): (Arc<str>, u64) = (msg.into(), e.gen);
        let spec = finishing.then(|| {
            let spec = FinishSpec {
                op: e.op,
                n_chunks: e.n_chunks,
                total: e.total,
                code,
                msg: msg.to_string(),
                fence: true,
            };
            (spec, e.home_lane)
        });
        let msgs: Vec<(usize, ShardMsg)> = shards
            .iter()
            .map(|&s| {
                let m = ShardMsg::Cancel {
                    peer: peer.clone(),
                    uid,
                    gen,
                    why: why.clone(),
                    ack_to: fence.then_some(shard.id),
                    finish: spec.clone(),
                };
                (s, m)
            })
            .collect();
        if fence {
            if finishing {
                shard.stats.borrow_mut().writes_fenced += 1;
            }
            let finish_by = (e.sm.deadline()).min(super::now_ns().saturating_add(FINISH_WAIT_NS));
            // In the table before any lane shard (this one included) can answer.
            let f = Fencing {
                count: FenceCount {
                    waiting: shards.len(),
                    finishes: 0,
                    finishing,
                },
                entry: e,
                code,
                msg: msg.to_string(),
                since_ns: super::now_ns(),
                finish_by,
            };
            let key = (peer.clone(), uid, gen);
            shard.owner.borrow_mut().fencing.insert(key, f);
            for (s, m) in msgs {
                shard.send(s, m);
            }
            return;
        }
        for (s, m) in msgs {
            shard.send(s, m);
        }
    }
    complete(shard, peer, uid, e, code, msg);
}

/// A lane shard has reset what might carry a failed write's bytes (or stopped placing a
/// failed read's), or queued `finishes` fences of a write that failed early: the last answer
/// reports the failure.
pub(crate) fn fenced(shard: &Rc<Shard>, peer: &Arc<str>, (uid, gen): (u64, u64), finishes: u32) {
    fence_answered(shard, peer, (uid, gen), 1, -i64::from(finishes));
}

/// A fenced transfer heard from its lanes: `shards` of their shards answered, and `answers`
/// of its fences (a negative count: fences a shard queued, still to be answered). Once every
/// shard answered and every fence was, its failure is reported.
fn fence_answered(
    shard: &Rc<Shard>,
    peer: &Arc<str>,
    (uid, gen): (u64, u64),
    shards: usize,
    answers: i64,
) {
    let key = (peer.clone(), uid, gen);
    let done = {
        let mut t = shard.owner.borrow_mut();
        let Some(f) = t.fencing.get_mut(&key) else {
            return;
        };
        if !f.count.answered(shards, answers) {
            return;
        }
        t.fencing.remove(&key)
    };
    if let Some(f) = done {
        complete(shard, peer, uid, f.entry, f.code, &f.msg);
    }
}

/// Report a transfer's end: its generation leaves the low-water mark, its latency is
/// counted and its status set.
fn complete(shard: &Rc<Shard>, peer: &Arc<str>, uid: u64, e: Entry, code: u32, msg: &str) {
    shard.owner.borrow_mut().ended(shard, e.gen);
    let latency_us = super::now_ns().saturating_sub(e.submitted_ns) / 1000;
    {
        let mut st = shard.stats.borrow_mut();
        let p = st.peer(peer);
        st.record_transfer(p, code == codes::SUCCESS, latency_us);
    }
    if code == codes::SUCCESS {
        // Marked before the update: a spinning waiter may see SUCCESS (and mark WOKE) before
        // this thread runs its next instruction.
        crate::trace::mark(uid, crate::trace::stage::DONE);
        e.status.update(StatusCode::Success, "");
    } else {
        log::debug!("transfer {uid} to {peer} failed: code {code} {msg}");
        fail_status(&e.status, code, msg);
    }
}

/// Fail every transfer whose deadline has passed.
pub(crate) fn tick(shard: &Rc<Shard>, now: u64) {
    let expired: Vec<_> = {
        let mut t = shard.owner.borrow_mut();
        let keys: Vec<_> = t
            .map
            .iter()
            .filter(|(_, e)| e.sm.deadline() <= now)
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter()
            .filter_map(|k| {
                let mut e = t.map.remove(&k)?;
                match e.sm.on_tick(now) {
                    Some(Action::Complete { code, msg }) => Some((k, e, code, msg)),
                    _ => {
                        t.ended(shard, e.gen);
                        None
                    }
                }
            })
            .collect()
    };
    for ((peer, uid), e, code, msg) in expired {
        finish(shard, &peer, uid, e, code, &msg, Ending::Deadline);
    }
    // Writes fenced by FINISH whose fences are not all answered in time (FINISH_WAIT_NS, or
    // their deadline): the lanes still waiting are reset, as for a write failed by its
    // deadline.
    let late: Vec<_> = {
        let mut t = shard.owner.borrow_mut();
        t.fencing
            .iter_mut()
            .filter(|(_, f)| f.count.finishing && f.finish_by <= now)
            .map(|(k, f)| {
                shard.stats.borrow_mut().fences_timed_out += 1;
                f.since_ns = now;
                let mut shards: Vec<usize> =
                    f.entry.lanes.iter().map(|&l| shard.lane_shard(l)).collect();
                shards.push(shard.lane_shard(f.entry.home_lane));
                shards.sort_unstable();
                shards.dedup();
                f.count.reset(shards.len());
                (k.clone(), shards, f.msg.as_str().into())
            })
            .collect()
    };
    for ((peer, uid, gen), shards, why) in late {
        let why: Arc<str> = why;
        for s in shards {
            let m = ShardMsg::Cancel {
                peer: peer.clone(),
                uid,
                gen,
                why: why.clone(),
                ack_to: Some(shard.id),
                finish: None,
            };
            shard.send(s, m);
        }
    }
    // Failed transfers whose lanes' shards have not confirmed within the grace:
    // reported anyway, so that every transfer still ends.
    let overdue: Vec<_> = {
        let mut t = shard.owner.borrow_mut();
        let keys: Vec<_> = t
            .fencing
            .iter()
            .filter(|(_, f)| !f.count.finishing && now.saturating_sub(f.since_ns) >= FENCE_GRACE_NS)
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter()
            .filter_map(|k| t.fencing.remove(&k).map(|f| (k, f)))
            .collect()
    };
    for ((peer, uid, _), f) in overdue {
        log::warn!(
            "transfer {uid} to {peer}: its lanes' shards did not confirm their reset within \
             {} ms; reporting its failure anyway",
            FENCE_GRACE_NS / 1_000_000
        );
        complete(shard, &peer, uid, f.entry, f.code, &f.msg);
    }
}

/// The first transfer to `peer`: open its lanes but `used` (which the transfer opens) in
/// the background, as MORI-IO opens all its data connections on the first operation. A
/// small transfer uses one lane, and each of the owner's next ones another (round robin), so
/// lanes opened one at a time would make each of the first few small transfers pay a dial
/// and handshake (about 1 ms on the dev VM, against 0.14 ms once up).
fn open_other_lanes(shard: &Rc<Shard>, peer: &Arc<Peer>, used: &[u16]) {
    for lane in 0..shard.shared.cfg.num_data_conns as u16 {
        if !used.contains(&lane) {
            let msg = ShardMsg::Connect {
                peer: peer.clone(),
                lane,
                // Nobody waits: the lane opens, or fails and is dialed again when used.
                ready: Arc::new(TransferStatus::started()),
            };
            shard.send(shard.lane_shard(lane), msg);
        }
    }
}

/// Fail everything this shard owns (shutdown).
pub(crate) fn fail_all(shard: &Rc<Shard>, msg: &str) {
    let all: Vec<_> = {
        let mut t = shard.owner.borrow_mut();
        t.in_flight.clear();
        t.publish(shard);
        let fencing: Vec<Entry> = t.fencing.drain().map(|(_, f)| f.entry).collect();
        t.map
            .drain()
            .map(|(_, e)| e)
            .chain(fencing)
            .collect::<Vec<_>>()
    };
    for e in all {
        fail_status(&e.status, codes::ERR_BAD_STATE, msg);
    }
}

/// Chunks of transfers between GPU memory of two processes of one host are this many times
/// `same_host_chunk_bytes` (at most `MAX_CHUNK_BYTES`: 64 MiB by default). Device parts are
/// copied by the GPU at about a terabyte per second, so the lane's round trip per chunk is
/// nearly the whole cost and one chunk per lane is best (striping deals `total / lanes`, at
/// most the chunk). H200 host, 1 MiB × 256 GPU write through CUDA IPC: 959 GB/s with 32 MiB
/// stripes, 537 with 8 MiB chunks, 70 with 1 MiB (docs/perf/same-host-chunks-h200.md).
pub(crate) const SAME_HOST_DEVICE_CHUNK_FACTOR: u64 = 8;

/// The chunk size of `s` and the lanes it may stripe over: over TCP `chunk_bytes` and
/// `num_data_conns`, or `gpu_chunk_bytes` with GPU memory on either side (staged), then over
/// [`TcpBackendConfig::gpu_lanes`] where that gives every lane a whole chunk at least (a
/// second lane on a shard pays off by sending while the first waits for a chunk's copy; a
/// small batch cut over more lanes only pays more frames); to a peer on the same-host
/// transport `num_data_conns` lanes and `same_host_chunk_bytes` (host memory on either side)
/// or [`SAME_HOST_DEVICE_CHUNK_FACTOR`] times that (GPU memory on both, unless GPU IPC is
/// configured off).
///
/// [`TcpBackendConfig::gpu_lanes`]: crate::TcpBackendConfig::gpu_lanes
fn chunk_and_lanes(shared: &super::Shared, s: &Submission) -> (u64, u16) {
    let lanes = shared.cfg.num_data_conns;
    let gpu_lanes = shared.cfg.gpu_lanes();
    let (chunk, staged) = chunk_bytes(shared, s);
    if staged && gpu_lanes > lanes && s.total >= chunk.saturating_mul(gpu_lanes as u64) {
        (chunk, gpu_lanes as u16)
    } else {
        (chunk, lanes as u16)
    }
}

/// [`chunk_and_lanes`]'s chunk size, and whether the transfer is staged (GPU memory over
/// TCP).
fn chunk_bytes(shared: &super::Shared, s: &Submission) -> (u64, bool) {
    let cfg = &shared.cfg;
    let same_host = if s.peer.reached.load(Ordering::Relaxed) {
        s.peer.same_host.load(Ordering::Relaxed)
    } else {
        // No lane has said yet (the first transfer): the descriptors' guess.
        s.peer.likely_same_host
            && shared.same_host() != crate::config::SameHost::Off
            && !shared.same_host_known_failed(&s.peer.key)
    };
    if !same_host {
        return if s.remote_device || s.local.device().is_some() {
            (cfg.gpu_chunk_bytes as u64, true)
        } else {
            (cfg.chunk_bytes as u64, false)
        };
    }
    let host = cfg.same_host_chunk_bytes as u64;
    if s.remote_device && s.local.device().is_some() && cfg.gpu_ipc != Some(false) {
        let chunk =
            (host * SAME_HOST_DEVICE_CHUNK_FACTOR).min(crate::proto::limits::MAX_CHUNK_BYTES);
        (chunk, false)
    } else {
        (host, false)
    }
}

#[cfg(test)]
mod tests {
    use super::{FenceCount, OwnerTable};

    /// A fence by FINISH on two lane shards: reported once both shards said how many they
    /// queued and each was answered, in any order.
    #[test]
    fn a_fence_ends_once_every_shard_and_every_finish_answered() {
        let start = FenceCount {
            waiting: 2,
            finishes: 0,
            finishing: true,
        };
        let mut c = start;
        assert!(
            !c.answered(0, 1),
            "a FINISH answered before its shard's count"
        );
        assert!(!c.answered(1, -2), "shard 1 queued two");
        assert!(
            !c.answered(1, 0),
            "shard 2 queued none; one FINISH still out"
        );
        assert!(c.answered(0, 1));
        // Nothing queued anywhere (lanes that carried none, or dead): the acks end it.
        let mut c = start;
        assert!(!c.answered(1, 0));
        assert!(c.answered(1, 0));
    }

    /// The FINISHes time out before the shards' counts came: the resets' answers are
    /// awaited on top of those counts, so the late counts cannot stand for the resets.
    #[test]
    fn acks_of_the_finish_round_do_not_count_for_the_resets() {
        let mut c = FenceCount {
            waiting: 2,
            finishes: 0,
            finishing: true,
        };
        c.reset(2);
        assert!(!c.answered(1, -1), "shard 1's count, late");
        assert!(!c.answered(1, -1), "shard 2's count, late");
        assert!(
            !c.answered(0, 1),
            "a FINISH answered after the wait counts for nothing"
        );
        assert!(!c.answered(1, 0), "shard 1 reset its lanes");
        assert!(c.answered(1, 0), "shard 2 reset its lanes");
        // Counts that came in time: only the resets are left.
        let mut c = FenceCount {
            waiting: 2,
            finishes: 0,
            finishing: true,
        };
        assert!(!c.answered(2, -3));
        c.reset(2);
        assert!(!c.answered(1, 0));
        assert!(c.answered(1, 0));
    }

    #[test]
    fn the_low_water_mark_moves_only_past_ended_transfers() {
        let mut t = OwnerTable::default();
        assert_eq!(t.low_water(0), 0);
        t.in_flight.extend([3, 5, 7]);
        assert_eq!(t.low_water(8), 3);
        // An ended transfer that was not the oldest leaves the mark where it was.
        assert!(!t.forget(5));
        assert_eq!(t.low_water(8), 3);
        assert!(t.forget(3));
        assert_eq!(t.low_water(8), 7);
        // One never seen (or already forgotten) changes nothing.
        assert!(!t.forget(3));
        assert!(!t.forget(100));
        // None left: every generation below the next one has ended.
        assert!(t.forget(7));
        assert_eq!(t.low_water(8), 8);
    }
}
