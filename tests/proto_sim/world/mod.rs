//! The simulated world: an initiator (owner shards that run `Outbound`s over `dispatch` and
//! `home_lane`, one `LaneBook` per lane), a target (one `Served` per connection, one shared
//! `JoinMap`), the memory of both, the connections between them, and the seeded scheduler.
//! Every protocol decision is the state machines'; this module moves bytes where the service
//! does (encode and send a popped frame, place a WRITE's payload after `check`, place READ
//! data after `answer`, record before answering) and notes what the checks need.
//!
//! Here: the constants, the target's join table, the initiator's per-lane and per-owner
//! state, and the `Sim` itself. `xfer` holds transfers as the user and the checks see them;
//! then one `impl Sim` per concern: `lanes` (the initiator's lanes: dialing, dying, the
//! writer and the reader), `owner` (the owner shards: submit, reports, ends, deadlines),
//! `target` (the served connections) and `schedule` (the seeded steps and the final checks).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use morio::proto::access::AccessKey;
use morio::proto::codes::SUCCESS;
use morio::proto::dispatch::{SharedStripes, TransferRef};
use morio::proto::frame::Op;
use morio::proto::inbound::Refusal;
use morio::proto::join::JoinMap;
use morio::proto::lane::{LaneBook, Report};
use morio::proto::outbound::Outbound;
use morio::proto::target::{JoinReport, JoinTable};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::net::{Cause, Conn};

mod lanes;
mod owner;
mod schedule;
mod target;
mod xfer;

pub use xfer::{Done, Seen, Spec, Want, Xfer};

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
        Err(_) => (0..n * soak()).collect(),
    }
}

/// `MORIO_SOAK=k`: k times the seeds (and the property tests' cases), for a long run by hand.
pub fn soak() -> u64 {
    std::env::var("MORIO_SOAK")
        .ok()
        .map(|s| s.parse().expect("MORIO_SOAK must be a positive integer"))
        .filter(|&k| k > 0)
        .unwrap_or(1)
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
    fn end(&self, peer: &Arc<str>, instance: u64, uid: u64, op: Op, n_chunks: u32) -> bool {
        let key = (peer.clone(), instance, uid);
        self.map.borrow_mut().end(key, op, n_chunks, self.now.get())
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

/// One owner shard: its transfers by uid, its home-lane cursor, its generations, and the
/// writes that failed early waiting for the FINISHes on their lanes (protocol v11).
#[derive(Debug, Default)]
struct Owner {
    table: BTreeMap<u64, Entry>,
    cursor: usize,
    next_gen: u64,
    in_flight: BTreeSet<u64>,
    fencing: BTreeMap<u64, Fencing>,
}

/// A write that failed early, fenced by FINISH on its lanes: its failure, the FINISHes not
/// yet answered, and when its lanes are reset instead (as the service's owner does).
#[derive(Debug)]
struct Fencing {
    e: Entry,
    code: u32,
    msg: String,
    pending: usize,
    by: u64,
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
    /// Whether the initiator fences a write that failed early with FINISH on every lane
    /// that carried its chunks (protocol v11; even seeds), or sends one FINISH on its home
    /// lane only when a chunk never left and fails it at once otherwise (version 10).
    pub fences: bool,
    /// Writes the initiator fenced so.
    pub fenced: usize,
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
            fences: seed % 2 == 0,
            fenced: 0,
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
}
