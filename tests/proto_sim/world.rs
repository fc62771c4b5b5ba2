//! The simulated world: an initiator (owner shards that run `Outbound`s over `dispatch` and
//! `home_lane`, one `LaneBook` per lane), a target (one `Served` per connection, one shared
//! `JoinMap`), the memory of both, the connections between them, and the seeded scheduler.
//! Every protocol decision is the state machines'; this file moves bytes where the service
//! does (encode and send a popped frame, place a WRITE's payload after `check`, place READ
//! data after `answer`, record before answering) and notes what the checks need.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use morio::proto::access::AccessKey;
use morio::proto::codes::{ERR_BAD_STATE, ERR_GPU_OP, SUCCESS};
use morio::proto::dispatch::{
    dispatch, home_lane, DispatchParams, FinishSpec, Item, Request, SharedStripes, TransferRef,
    Work,
};
use morio::proto::frame::{encode_chunk_segs, Chunk, Finish, Frame, Hello, Kind, Op};
use morio::proto::handshake::{accept, check_ack, check_hello, refusal};
use morio::proto::inbound::Refusal;
use morio::proto::join::JoinMap;
use morio::proto::lane::{Answer, Fence, LaneBook, Matched, ReadWait, Report, Sendable};
use morio::proto::layout::remote_seg;
use morio::proto::layout::Layout;
use morio::proto::limits::VERSION;
use morio::proto::outbound::{Action, Outbound};
use morio::proto::plan::Piece;
use morio::proto::target::{classify, Inbound, JoinReport, JoinTable, Record, Response, Served};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::net::{Cause, Conn};

/// Initiator's local region.
pub const LOCAL_BYTES: u64 = 64 << 10;
/// Target's registered region.
pub const TARGET_BYTES: u64 = 48 << 10;
/// The target region's id.
pub const MEM_ID: u32 = 7;
/// The target region's access key (what its descriptor carries).
pub const ACCESS_KEY: AccessKey = AccessKey::from_bytes([
    0x3c, 0x91, 0x5e, 0x07, 0xd2, 0x48, 0xaa, 0x16, 0x7b, 0xe0, 0x29, 0xc5, 0x64, 0x0f, 0xb3, 0x88,
]);
/// An id the target has never registered.
pub const UNKNOWN_MEM_ID: u32 = 99;
/// A region the target registered local-only (no access key): as large as the target
/// region and over the same memory, so a chunk the target wrongly accepted would show in it.
pub const LOCAL_ONLY_MEM_ID: u32 = 8;
/// Deadline of transfers that must not time out.
pub const NO_DEADLINE: u64 = u64::MAX;
/// The initiator's engine key (the same after a restart).
pub const INIT_KEY: &str = "initiator";
/// The target's engine key.
pub const TARGET_KEY: &str = "target";
/// Start of the message of a write chunk whose staging copy failed on the initiator.
pub const STAGE_OUT_FAILED: &str = "staging copy from GPU memory failed";
/// Start of the message of a read chunk whose data could not be placed on the initiator.
pub const STAGE_IN_FAILED: &str = "staging copy into GPU memory failed";
/// Start of the message of a transfer failed by a lost lane.
pub const LOST: &str = "connection lost";
/// The message of a transfer failed by its deadline.
pub const TIMEOUT: &str = "operation timeout";
/// Upper bound on schedule steps per run (a livelock guard).
const MAX_STEPS: u64 = 3_000_000;

/// Seeds to run: `0..n`, or only `PROTO_SIM_SEED`.
pub fn seeds(n: u64) -> Vec<u64> {
    match std::env::var("PROTO_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("PROTO_SIM_SEED must be a u64")],
        Err(_) => (0..n).collect(),
    }
}

/// Whether every seed runs (aggregate assertions only make sense then).
pub fn all_seeds() -> bool {
    std::env::var("PROTO_SIM_SEED").is_err()
}

/// The initiator's handle on local memory, `L` of the state machines: which user transfer's
/// buffer it is (all live in the one local region; whether a GPU staging copy of one of its
/// chunks fails is looked up by it).
#[derive(Clone, Copy, Debug)]
pub struct Buf {
    x: usize,
}

/// The target's one join table behind the trait the served connections call (the engine
/// puts a lock around it; one thread needs only a `RefCell`). Time is the schedule's step.
#[derive(Debug, Default)]
pub struct Joins {
    pub map: RefCell<JoinMap>,
    now: Cell<u64>,
}

impl JoinTable for Joins {
    fn report(&self, r: &JoinReport<'_>) -> Option<(u32, String)> {
        self.map.borrow_mut().report(r, self.now.get())
    }
    fn end(&self, peer: &Arc<str>, instance: u64, uid: u64, op: Op, n_chunks: u32) {
        let key = (peer.clone(), instance, uid);
        self.map.borrow_mut().end(key, op, n_chunks, self.now.get());
    }
}

// ---------------------------------------------------------------------------------------------
// The initiator
// ---------------------------------------------------------------------------------------------

/// A transfer in its owner's table (as the service's owner keeps it).
#[derive(Debug)]
struct Entry {
    gen: u64,
    ob: Outbound,
    /// The user's transfer (its status handle).
    x: usize,
    home: u16,
    lanes: Vec<u16>,
    stripes: Option<Arc<SharedStripes>>,
    op: Op,
    total: u64,
    n_chunks: u32,
}

/// One owner shard: its transfers by uid, its home-lane cursor, its generations.
#[derive(Debug, Default)]
struct Owner {
    table: BTreeMap<u64, Entry>,
    cursor: usize,
    next_gen: u64,
    in_flight: BTreeSet<u64>,
}

impl Owner {
    /// The low-water mark the lanes prune by: every generation below it has ended.
    fn may_run(&self, gen: u64) -> bool {
        gen >= self.in_flight.first().copied().unwrap_or(self.next_gen)
    }
}

/// A frame the lane's writer is putting on the wire.
#[derive(Debug)]
struct Out {
    bytes: Vec<u8>,
    at: usize,
    x: usize,
    /// A WRITE: its payload is read from the user's memory while it leaves.
    write: bool,
    chunk: Option<u32>,
}

/// A WRITE chunk whose GPU staging copy is under way (and will fail).
#[derive(Debug)]
struct Staging {
    tag: u64,
    to: TransferRef,
    x: usize,
    chunk: u32,
}

/// One initiator lane: the real book, the connection it runs on, its writer's state.
#[derive(Debug)]
struct Lane {
    book: LaneBook<Buf>,
    conn: usize,
    ready: bool,
    out: Option<Out>,
    staging: Option<Staging>,
}

/// One run of the initiator engine (a restart starts another).
#[derive(Debug)]
pub struct Initiator {
    pub instance: u64,
    lanes: Vec<Lane>,
    owners: Vec<Owner>,
    next_uid: u64,
    reports: VecDeque<(TransferRef, Report)>,
    /// (owner, generation) → user transfer.
    by_ref: HashMap<(usize, u64), usize>,
    pub crashed: bool,
}

// ---------------------------------------------------------------------------------------------
// Transfers, as the user and the checks see them
// ---------------------------------------------------------------------------------------------

/// What a transfer must end as (before lane losses, which the checks overlay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Success,
    /// Refused by the target with this code: no byte moved, inbound status recorded.
    Refused(u32),
    /// Refused by the owner's dispatch: nothing left the initiator.
    RefusedHere(u32),
    /// A chunk fails on the initiator ([`Spec::local_failure`]): ERR_GPU_OP with that chunk's
    /// message. A write's chunk never leaves: a multi-chunk write sends FINISH and the target
    /// records its code; a one-chunk write never reaches the target. A read's target did its
    /// part and recorded SUCCESS; the chunk's error wins over the join's SUCCESS.
    LocalFailure,
    /// Its deadline passes first: ERR_BAD_STATE "operation timeout".
    TimedOut,
    /// Success, unless its deadline passed first.
    SuccessOrTimeout,
}

/// A transfer request as the user makes it, and how the owner is configured for it.
#[derive(Clone, Debug)]
pub struct Spec {
    pub op: Op,
    pub layout: Layout,
    pub mem_id: u32,
    /// The access key its chunks carry.
    pub access_key: AccessKey,
    pub chunk_bytes: u64,
    pub threshold: u64,
    pub share: bool,
    /// The owner shard it is submitted to.
    pub owner: usize,
    /// Steps after submission (or [`NO_DEADLINE`]).
    pub timeout: u64,
    /// One random chunk fails on the initiator (GPU memory): a write's staging copy fails
    /// before the chunk leaves, a read's data cannot be placed when it arrives.
    pub local_failure: bool,
    pub want: Want,
}

/// How a transfer ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Done {
    pub code: u32,
    pub msg: String,
    /// Event number (shared with inbound records).
    pub event: u64,
    /// Schedule step.
    pub at: u64,
}

/// A transfer as the checks follow it.
#[derive(Debug)]
pub struct Xfer {
    pub inst: usize,
    pub uid: u64,
    pub spec: Spec,
    pub deadline: u64,
    /// Dispatched (else refused by dispatch).
    pub dispatched: bool,
    /// The owner's generation for it.
    gen: u64,
    pub n_chunks: u32,
    pub home: u16,
    /// Lanes the plan gave work.
    pub plan_lanes: BTreeSet<u16>,
    pub shared_stripes: bool,
    pub fail_chunk: Option<u32>,
    /// Each chunk's pieces, as a lane's writer took it.
    pub chunks: BTreeMap<u32, Layout>,
    /// Chunks whose frame went whole onto the wire.
    pub sent: BTreeSet<u32>,
    /// Lanes that began a frame of it.
    pub frame_lanes: BTreeSet<u16>,
    /// The checks' count of what each lane's book must still hold of it: chunk and FINISH
    /// items handed to the lane and stripes it took, less chunks that never left and the
    /// COMPLETEs it matched. A lane that dies while this is positive must fail the transfer.
    refs: BTreeMap<u16, i64>,
    /// Lanes holding a shared-stripe item of it (which a lane drops once no stripe is left,
    /// so its loss may or may not fail the transfer).
    shared_on: BTreeSet<u16>,
    /// A lane died while it ran and held work of it: it must fail.
    pub must_lose: bool,
    /// A lane died while it ran and held its shared stripes: it may fail.
    pub may_lose: bool,
    /// Its initiator crashed before it ended.
    pub abandoned: bool,
    pub result: Option<Done>,
}

impl Xfer {
    pub fn multi(&self) -> bool {
        self.n_chunks > 1
    }
}

/// What the target saw of one transfer (instance, uid).
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub n_chunks: u32,
    pub chunks: BTreeSet<u32>,
    pub bytes: u64,
    pub finished: bool,
}

/// One step of the schedule.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// A lane's writer sends (part of) its next frame.
    Write(usize),
    /// A lane's pending staging copy fails.
    Staging(usize),
    /// Deliver bytes to the target on a connection.
    Up(usize),
    /// Deliver bytes to the initiator on a connection.
    Down(usize),
}

// ---------------------------------------------------------------------------------------------
// The simulation
// ---------------------------------------------------------------------------------------------

pub struct Sim {
    pub seed: u64,
    pub rng: StdRng,
    /// Most bytes one delivery step moves.
    burst: usize,
    /// Most bytes one writer step puts on the wire.
    wburst: usize,
    /// A connection's send buffer: its writer waits while this many bytes are in flight
    /// (so a slow lane takes fewer shared stripes, and a transfer may end while a lane is
    /// half-way through one of its WRITEs).
    pub sndbuf: usize,
    pub n_lanes: u16,
    pub n_shards: usize,
    pub local: Vec<u8>,
    pub target: Vec<u8>,
    pub init_local: Vec<u8>,
    pub init_target: Vec<u8>,
    pub inits: Vec<Initiator>,
    pub conns: Vec<Conn>,
    pub joins: Joins,
    pub xfers: Vec<Xfer>,
    by_uid: HashMap<(usize, u64), usize>,
    /// Target side, by (instance, uid): what its chunks showed.
    pub seen: HashMap<(usize, u64), Seen>,
    /// Target side, by (instance, uid): the recorded inbound status and its event number.
    pub inbound: HashMap<(usize, u64), (u32, u64)>,
    /// Target side, by (instance, uid): (connection, chunk) whose report completed the join.
    pub answered: HashMap<(usize, u64), (usize, u32)>,
    /// (connection, at the target, why) for every end that closed.
    pub closes: Vec<(usize, bool, Cause)>,
    pub events: u64,
    pub now: u64,
    pub steps: u64,
    /// Answers the lanes found stale (their transfer had ended).
    pub stale: usize,
    /// Reports the owners got for transfers that had ended.
    pub late_reports: usize,
    /// FINISH frames the target handled.
    pub finishes: usize,
    /// Chunks the target handled.
    pub chunks_seen: usize,
    /// Multi-chunk reads that ended with their last chunk's data (COMPLETE came first), and
    /// with COMPLETE (every chunk's data came first).
    pub reads_ended_by_data: usize,
    pub reads_ended_by_complete: usize,
}

fn gather(region: &[u8], ranges: impl Iterator<Item = (u64, u64)>) -> Vec<u8> {
    let mut v = Vec::new();
    for (off, len) in ranges {
        v.extend_from_slice(&region[off as usize..(off + len) as usize]);
    }
    v
}

fn place(region: &mut [u8], ranges: impl Iterator<Item = (u64, u64)>, mut data: &[u8]) {
    for (off, len) in ranges {
        let (head, rest) = data.split_at(len as usize);
        region[off as usize..(off + len) as usize].copy_from_slice(head);
        data = rest;
    }
    assert!(data.is_empty(), "payload longer than its segments");
}

fn code_msg(res: Result<(), Refusal>) -> (u32, String) {
    match res {
        Ok(()) => (SUCCESS, String::new()),
        Err(r) => {
            assert_ne!(r.code, SUCCESS);
            (r.code, r.msg.to_string())
        }
    }
}

impl Sim {
    pub fn new(seed: u64, n_lanes: u16, n_shards: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut local = vec![0u8; LOCAL_BYTES as usize];
        let mut target = vec![0u8; TARGET_BYTES as usize];
        rng.fill(&mut local[..]);
        rng.fill(&mut target[..]);
        let burst = *[1usize, 3, 16, 64, 512, 8192].choose(&mut rng).unwrap();
        let wburst = *[7usize, 64, 1024, usize::MAX].choose(&mut rng).unwrap();
        let sndbuf = *[256usize, 4096, 1 << 16, usize::MAX]
            .choose(&mut rng)
            .unwrap();
        let mut sim = Self {
            seed,
            rng,
            burst,
            wburst,
            sndbuf,
            n_lanes,
            n_shards,
            init_local: local.clone(),
            init_target: target.clone(),
            local,
            target,
            inits: Vec::new(),
            conns: Vec::new(),
            joins: Joins::default(),
            xfers: Vec::new(),
            by_uid: HashMap::new(),
            seen: HashMap::new(),
            inbound: HashMap::new(),
            answered: HashMap::new(),
            closes: Vec::new(),
            events: 0,
            now: 0,
            steps: 0,
            stale: 0,
            late_reports: 0,
            finishes: 0,
            chunks_seen: 0,
            reads_ended_by_data: 0,
            reads_ended_by_complete: 0,
        };
        sim.start_instance();
        sim
    }

    /// The running initiator.
    pub fn cur(&self) -> usize {
        self.inits.len() - 1
    }

    /// Owner shards that run a lane (and so may own transfers).
    pub fn n_owners(&self) -> usize {
        self.n_shards.min(self.n_lanes as usize).max(1)
    }

    /// The connection lane `l` of the running initiator uses.
    pub fn conn_of(&self, l: u16) -> usize {
        self.inits[self.cur()].lanes[l as usize].conn
    }

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
    fn lane_for(&mut self, l: u16) {
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

    // ----- the owner -----

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
    fn drain_reports(&mut self) {
        let seed = self.seed;
        let i = self.cur();
        while let Some((to, rep)) = self.inits[i].reports.pop_front() {
            let owner = &mut self.inits[i].owners[to.owner];
            let Some(e) = owner.table.get_mut(&to.uid).filter(|e| e.gen == to.gen) else {
                self.late_reports += 1;
                continue;
            };
            let (chunk, complete) = (
                matches!(rep, Report::Chunk { .. }),
                matches!(rep, Report::Complete { .. }),
            );
            let what = format!("{rep:?}");
            let action = e
                .ob
                .on_report(rep)
                .unwrap_or_else(|v| panic!("seed {seed}: transfer {}: {what}: violation {v}", e.x));
            match action {
                None => {}
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
    fn tick(&mut self) {
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

    // ----- the initiator's lanes -----

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
        let hit = lane
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
        self.closes.push((c, false, cause));
        self.close_init_end(c);
    }

    /// Lane `l`'s writer: start its next frame (if none is under way) and put bytes of it on
    /// the wire.
    fn write_step(&mut self, l: usize) {
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
                book.sending_finish(tag, to);
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
    fn staging_fails(&mut self, l: usize) {
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
    fn pump_down(&mut self, c: usize) {
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

    // ----- the target -----

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
    fn pump_up(&mut self, c: usize) {
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
                let (record, reply) = (resp.record.expect("FINISH records"), resp.reply);
                self.record(inst, uid, record);
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
        assert!(
            prev.is_none(),
            "seed {}: inbound status of {inst}/{uid} recorded twice",
            self.seed
        );
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
        assert_eq!(chunk.segs, segs, "{ctx}: segments");
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
    fn note_finish(&mut self, c: usize, inst: usize, f: &Finish) {
        let seed = self.seed;
        let x = self.xfer_of(inst, f.uid);
        let xf = &self.xfers[x];
        assert!(
            xf.multi() && xf.spec.op == Op::Write && xf.fail_chunk.is_some(),
            "seed {seed}: FINISH for transfer {x}, which no local failure stopped"
        );
        assert_eq!(self.conns[c].lane, xf.home, "seed {seed}: FINISH off home");
        let total = xf.spec.layout.total_bytes();
        assert_eq!(
            (f.op, f.n_chunks, f.total_bytes),
            (xf.spec.op, xf.n_chunks, total),
            "seed {seed}: FINISH describes another transfer"
        );
        assert_eq!(f.code, ERR_GPU_OP, "seed {seed}: FINISH code ({})", f.msg);
        self.finishes += 1;
        let n = xf.n_chunks;
        let s = self.seen.entry((inst, f.uid)).or_default();
        s.n_chunks = n;
        assert!(!s.finished, "seed {seed}: FINISH twice");
        s.finished = true;
    }

    // ----- the schedule -----

    /// Run until nothing can move and every request has started; requests start at random
    /// points (or all at once when `!stagger`).
    pub fn run(&mut self, specs: Vec<Spec>, stagger: bool) {
        self.run_until(specs, stagger, |_| false);
    }

    /// [`Sim::run`], stopping early once `stop` holds; the requests not yet started.
    pub fn run_until(
        &mut self,
        specs: Vec<Spec>,
        stagger: bool,
        stop: impl Fn(&Sim) -> bool,
    ) -> Vec<Spec> {
        let seed = self.seed;
        let mut queued: VecDeque<Spec> = specs.into();
        if !stagger {
            while let Some(s) = queued.pop_front() {
                self.submit(s);
            }
        }
        loop {
            if stop(self) {
                return queued.into();
            }
            self.steps += 1;
            assert!(self.steps < MAX_STEPS, "seed {seed}: no quiescence");
            if !queued.is_empty() && self.rng.gen_ratio(1, 16) {
                let s = queued.pop_front().expect("queued");
                self.submit(s);
                continue;
            }
            let active = self.active(queued.is_empty());
            let Some(&step) = active.choose(&mut self.rng) else {
                match queued.pop_front() {
                    Some(s) => {
                        self.submit(s);
                        continue;
                    }
                    None => return Vec::new(),
                }
            };
            self.step(step);
            self.now += 1;
            self.joins.now.set(self.now);
            self.tick();
        }
    }

    /// Everything that can move now.
    fn active(&self, nothing_queued: bool) -> Vec<Step> {
        let mut v = Vec::new();
        let i = self.cur();
        if !self.inits[i].crashed {
            for (l, lane) in self.inits[i].lanes.iter().enumerate() {
                if lane.book.dead() || !lane.ready {
                    continue;
                }
                let conn = &self.conns[lane.conn];
                let room = !conn.target_open || conn.up.in_flight() < self.sndbuf;
                if lane.staging.is_some() {
                    v.push(Step::Staging(l));
                } else if room && (lane.out.is_some() || lane.book.queued() > 0) {
                    v.push(Step::Write(l));
                }
            }
        }
        for (c, conn) in self.conns.iter().enumerate() {
            if conn.stalled {
                continue;
            }
            // A connection's weight makes some lanes faster than others.
            if conn.target_open && (conn.up.in_flight() > 0 || !conn.init_open) {
                v.extend(std::iter::repeat_n(Step::Up(c), conn.weight));
            }
            let down = conn.init_open && (conn.down.in_flight() > 0 || !conn.target_open);
            if down && !conn.lagging {
                v.extend(std::iter::repeat_n(Step::Down(c), conn.weight));
            }
        }
        if v.is_empty() && nothing_queued {
            for (c, conn) in self.conns.iter().enumerate() {
                let down = conn.init_open && (conn.down.in_flight() > 0 || !conn.target_open);
                if conn.lagging && !conn.stalled && down {
                    v.push(Step::Down(c));
                }
            }
        }
        v
    }

    fn step(&mut self, step: Step) {
        match step {
            Step::Write(l) => self.write_step(l),
            Step::Staging(l) => self.staging_fails(l),
            Step::Up(c) => {
                let n = self.rng.gen_range(1..=self.burst);
                self.conns[c].up.deliver(n);
                self.pump_up(c);
            }
            Step::Down(c) => {
                let n = self.rng.gen_range(1..=self.burst);
                self.conns[c].down.deliver(n);
                self.pump_down(c);
            }
        }
        self.drain_reports();
    }

    /// Let time pass to `now` and fail what is due.
    pub fn advance(&mut self, now: u64) {
        self.now = now;
        self.joins.now.set(now);
        self.tick();
    }

    /// Connection `c` is reset under both ends.
    pub fn reset(&mut self, c: usize) {
        let conn = &self.conns[c];
        assert_eq!(conn.inst, self.cur());
        let l = conn.lane;
        if conn.init_open {
            self.die(l, Cause::Reset);
            self.drain_reports();
        }
    }

    /// Whether lane `l` of the running initiator is ready (its handshake done, alive).
    pub fn lane_ready(&self, l: u16) -> bool {
        let lane = &self.inits[self.cur()].lanes[l as usize];
        lane.ready && !lane.book.dead()
    }

    /// Check that nothing is left to do: live lanes are drained and wait for no frame's own
    /// answer, live connections carry nothing.
    pub fn check_quiet(&self) {
        let seed = self.seed;
        let i = self.cur();
        if !self.inits[i].crashed {
            for (l, lane) in self.inits[i].lanes.iter().enumerate() {
                if lane.book.dead() {
                    continue;
                }
                assert!(
                    lane.out.is_none() && lane.staging.is_none() && lane.book.queued() == 0,
                    "seed {seed}: lane {l} has work left"
                );
                // Every chunk's own answer and every FINISH's COMPLETE came; what chunks of
                // several are kept for belongs to transfers that have ended.
                assert_eq!(
                    lane.book.waiting(),
                    0,
                    "seed {seed}: lane {l} still waits for answers"
                );
            }
        }
        for (c, conn) in self.conns.iter().enumerate() {
            if conn.init_open && conn.target_open && !conn.stalled {
                assert!(
                    conn.up.idle() && conn.down.idle(),
                    "seed {seed}: connection {c} not drained"
                );
            }
        }
    }

    /// Bytes a piece of transfer `x` lands on, clamped to the region: (region is local, off,
    /// len).
    pub fn destination(&self, x: usize, p: &Piece) -> (bool, usize, usize) {
        let (local, off) = match self.xfers[x].spec.op {
            Op::Write => (false, p.remote),
            Op::Read => (true, p.local),
        };
        let size = if local { LOCAL_BYTES } else { TARGET_BYTES };
        let lo = off.min(size);
        let hi = (off + p.len).min(size);
        (local, lo as usize, (hi - lo) as usize)
    }
}
