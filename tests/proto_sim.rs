//! Deterministic two-endpoint simulation of the morio wire protocol (version 5) with no
//! sockets: an initiator and a target exchange frames built and parsed only with
//! `morio::proto` over in-memory lanes, under seeded schedules that reorder traffic across
//! lanes and cut frames at arbitrary points. Checks final statuses, data placement, inbound
//! bookkeeping, refusals, lane loss on a corrupt stream, deadlines, and chunks that fail on the
//! initiator.
//!
//! Version 5 joins a multi-chunk transfer on the target in one engine-wide table. The
//! initiator plans chunk 0 onto its home lane, and every chunk names that lane as its
//! `join_lane`. The target reports each chunk's result to the transfer's `Join` at once, on
//! the lane that carried it (no report travels between the target's shards); the report that
//! completes the join, whichever chunk and lane it comes from, is answered for the whole
//! transfer: the target records the inbound status, and only then sends COMPLETE on that
//! chunk's lane with that chunk's tag and number (for a read, after that chunk's READ_DATA).
//! No other chunk gets an answer of its own: a write chunk none, a read chunk only its
//! READ_DATA. So the initiator keeps every chunk of a multi-chunk transfer by tag on its lane
//! once nothing else answers it (a write chunk once sent, a read chunk once its data arrived):
//! whichever of them gets the COMPLETE ends the transfer, and losing a lane fails every
//! running transfer with a chunk kept there (the chunk may not have arrived, or the COMPLETE
//! was on that lane). A write ends with that COMPLETE, a read with it and every chunk's data,
//! in either order. FINISH is only an abort: sent on the home lane when a chunk fails on the
//! initiator before it left, it records the inbound status, ends the target's join (later
//! reports are only counted), and its COMPLETE ends the transfer.
//!
//! Set `PROTO_SIM_SEED=<n>` to run only seed `n` in every scenario.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use morio::proto::codes::{ERR_BAD_STATE, ERR_GPU_OP, ERR_INVALID_ARGS, ERR_NOT_FOUND, SUCCESS};
use morio::proto::decode::{decode_frame, DecodeError};
use morio::proto::frame::{Chunk, Finish, Frame, Op, Reply, Seg};
use morio::proto::inbound::check_chunk;
use morio::proto::join::Join;
use morio::proto::limits::{FRAME_MAGIC, HEADER_BYTES, MAX_BODY_BYTES, MAX_LANES};
use morio::proto::outbound::{Action, Outbound, Phase};
use morio::proto::plan::{
    cut, destination_overlaps, normalize, remote_extent, stripe_bytes, total_bytes, Piece,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Initiator's local region.
const LOCAL_BYTES: u64 = 64 << 10;
/// Target's registered region.
const TARGET_BYTES: u64 = 48 << 10;
/// The target region's id.
const MEM_ID: u32 = 7;
/// An id the target has never registered.
const UNKNOWN_MEM_ID: u32 = 99;
/// Deadline of transfers that must not time out.
const NO_DEADLINE: u64 = u64::MAX;
/// Upper bound on schedule steps per run (a livelock guard).
const MAX_STEPS: u64 = 2_000_000;
/// Start of the message of a write chunk whose staging copy failed on the initiator.
const STAGE_OUT_FAILED: &str = "staging copy from GPU memory failed";
/// Start of the message of a read chunk whose data could not be placed on the initiator.
const STAGE_IN_FAILED: &str = "staging copy into GPU memory failed";

/// Seeds to run: `0..n`, or only `PROTO_SIM_SEED`.
fn seeds(n: u64) -> Vec<u64> {
    match std::env::var("PROTO_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("PROTO_SIM_SEED must be a u64")],
        Err(_) => (0..n).collect(),
    }
}

// ---------------------------------------------------------------------------------------------
// Byte pipes
// ---------------------------------------------------------------------------------------------

/// One direction of a lane: bytes in flight, then the receiver's buffer and decoder state.
#[derive(Debug, Default)]
struct Pipe {
    /// Sent, not yet delivered.
    wire: VecDeque<u8>,
    /// Delivered, not yet decoded.
    rx: Vec<u8>,
    /// A decoded frame waiting for its payload bytes.
    pending: Option<(Frame, usize)>,
}

impl Pipe {
    fn send(&mut self, frame: &Frame, payload: &[u8]) {
        let mut bytes = Vec::with_capacity(HEADER_BYTES + 64 + payload.len());
        frame.encode(payload.len() as u64, &mut bytes);
        bytes.extend_from_slice(payload);
        self.wire.extend(bytes);
    }

    fn deliver(&mut self, n: usize) {
        let n = n.min(self.wire.len());
        self.rx.extend(self.wire.drain(..n));
    }

    /// Next complete frame and its payload, if the receiver has all of it.
    fn poll(&mut self) -> Result<Option<(Frame, Vec<u8>)>, DecodeError> {
        loop {
            if let Some((_, need)) = &self.pending {
                if self.rx.len() < *need {
                    return Ok(None);
                }
                let (frame, need) = self.pending.take().expect("pending frame");
                let payload = self.rx.drain(..need).collect();
                return Ok(Some((frame, payload)));
            }
            match decode_frame(&self.rx)? {
                Some((frame, payload_len, consumed)) => {
                    assert!(consumed >= HEADER_BYTES && consumed <= self.rx.len());
                    self.rx.drain(..consumed);
                    self.pending = Some((frame, payload_len as usize));
                }
                None => {
                    assert!(
                        self.rx.len() < HEADER_BYTES + MAX_BODY_BYTES,
                        "decoder asked for more than a frame"
                    );
                    return Ok(None);
                }
            }
        }
    }

    fn idle(&self) -> bool {
        self.wire.is_empty() && self.rx.is_empty() && self.pending.is_none()
    }
}

/// What the initiator waits for on a lane, by tag.
#[derive(Debug)]
enum Pending {
    /// A chunk's own answer: COMPLETE for a one-chunk write, READ_DATA for a read's chunk. A
    /// chunk of a multi-chunk write waits for nothing of its own (see `Lane::unanswered`).
    Chunk {
        x: usize,
        chunk: u32,
        pieces: Vec<Piece>,
    },
    /// FINISH (sent after a chunk failed on the initiator): its COMPLETE.
    Finish { x: usize },
}

impl Pending {
    fn xfer(&self) -> usize {
        match self {
            Self::Chunk { x, .. } | Self::Finish { x } => *x,
        }
    }
}

/// A chunk of a multi-chunk transfer with nothing more of its own to wait for: the COMPLETE
/// for the whole transfer may still come under its tag, if its report completes the target's
/// join.
#[derive(Debug)]
struct Unanswered {
    x: usize,
    chunk: u32,
}

#[derive(Debug, Default)]
struct Lane {
    to_target: Pipe,
    to_init: Pipe,
    /// The lane's connection is closed (a decoder on it failed).
    failed: bool,
    /// The lane delivers nothing, in either direction.
    stalled: bool,
    /// The lane's initiator-bound direction delivers only when nothing else can move.
    lagging: bool,
    next_tag: u64,
    outstanding: BTreeMap<u64, Pending>,
    /// Chunks of multi-chunk transfers sent here, by tag: a write chunk once sent, a read
    /// chunk once its READ_DATA arrived. Kept after their transfer ended (the real lane
    /// prunes them), so that a late COMPLETE still finds its chunk, and losing this lane
    /// fails every transfer with one here that still runs.
    unanswered: BTreeMap<u64, Unanswered>,
}

impl Lane {
    fn tag(&mut self) -> u64 {
        let t = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        t
    }
    fn pipe(&mut self, to_target: bool) -> &mut Pipe {
        if to_target {
            &mut self.to_target
        } else {
            &mut self.to_init
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Transfers
// ---------------------------------------------------------------------------------------------

/// A transfer request as the initiator's user would make it (already normalised).
#[derive(Clone, Debug)]
struct Spec {
    op: Op,
    pieces: Vec<Piece>,
    mem_id: u32,
    /// Override of the extent every chunk carries (to build out-of-range transfers).
    extent: Option<(u64, u64)>,
    chunk_bytes: u64,
    /// Lanes to spread chunks over, round robin from the first: the first is the home lane,
    /// which carries chunk 0 (the join lane) and FINISH.
    lanes: Vec<usize>,
    deadline: u64,
    /// One random chunk fails on the initiator (GPU memory): a write's staging copy fails
    /// before the chunk leaves (at a random later point of the schedule), a read's data
    /// cannot be placed when it arrives.
    local_failure: bool,
    /// Shared stripes (a write's chunks other than chunk 0 ride whichever of `lanes` takes
    /// them, here a random one each) instead of round robin.
    shared: bool,
}

#[derive(Debug)]
struct Xfer {
    spec: Spec,
    uid: u64,
    n_chunks: u32,
    /// Each chunk's pieces, as cut.
    chunks: Vec<Vec<Piece>>,
    /// Lanes that carried a chunk of it.
    chunk_lanes: BTreeSet<usize>,
    /// The chunk that fails on the initiator (see [`Spec::local_failure`]).
    fail_chunk: Option<u32>,
    ob: Outbound,
    /// Final (code, msg, event number).
    result: Option<(u32, String, u64)>,
}

impl Xfer {
    /// The lane of chunk 0, the join lane its chunks name, and FINISH's lane.
    fn home(&self) -> usize {
        self.spec.lanes[0]
    }

    fn multi(&self) -> bool {
        self.n_chunks > 1
    }

    /// Whether chunk `c` left the initiator (a write's locally failed chunk never does).
    fn sent(&self, c: u32) -> bool {
        !(self.spec.op == Op::Write && self.fail_chunk == Some(c))
    }
}

/// Events, steps, both regions, and every transfer's (uid, result) at the end of a run.
type Digest = (
    u64,
    u64,
    Vec<u8>,
    Vec<u8>,
    Vec<(u64, Option<(u32, String, u64)>)>,
);

/// What a transfer must end as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Success,
    /// Refused by the target with this code: no byte moved, inbound status recorded.
    Refused(u32),
    /// A chunk failed on the initiator ([`Spec::local_failure`]): ERR_GPU_OP with that
    /// chunk's message, every other chunk placed. A write's chunk never left: a multi-chunk
    /// write sent FINISH and the target recorded FINISH's code; a one-chunk write never
    /// reached the target at all. A read's target did its part and recorded SUCCESS; the
    /// chunk's error wins over the join's SUCCESS.
    LocalFailure,
    /// A lane it used was lost: ERR_BAD_STATE; its destination bytes are unspecified.
    Lost,
    /// A lane that carried chunks of a multi-chunk write was lost on the initiator's side
    /// only, after the target may have placed them: ERR_BAD_STATE as [`Outcome::Lost`], or,
    /// when the target's COMPLETE came on another lane and reached the initiator first
    /// (nothing answers those chunks but that COMPLETE), SUCCESS with every check of
    /// [`Outcome::Success`].
    LostOrJoined,
    /// Its deadline passed: ERR_BAD_STATE "operation timeout"; destination unspecified.
    TimedOut,
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

// ---------------------------------------------------------------------------------------------
// The target's join
// ---------------------------------------------------------------------------------------------

/// What the target has seen of one transfer's chunks.
#[derive(Clone, Debug, Default)]
struct Seen {
    chunks: BTreeSet<u32>,
    bytes: u64,
    /// The join lane its chunks name.
    join_lane: Option<u16>,
}

/// What the schedule does next.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Deliver bytes on one direction of a lane (to the target when `true`).
    Lane(usize, bool),
    /// A pending staging copy on the initiator fails.
    Staging,
}

// ---------------------------------------------------------------------------------------------
// The simulation
// ---------------------------------------------------------------------------------------------

struct Sim {
    seed: u64,
    rng: StdRng,
    max_burst: usize,
    lanes: Vec<Lane>,
    local: Vec<u8>,
    target: Vec<u8>,
    init_local: Vec<u8>,
    init_target: Vec<u8>,
    xfers: Vec<Xfer>,
    /// uid -> index into `xfers` (the checks' view of both sides).
    by_uid: HashMap<u64, usize>,
    /// Initiator side: (transfer, chunk) whose staging copy is still to fail.
    staging: Vec<(usize, u32)>,
    /// Target side: uid -> (code, event number) of the recorded inbound status.
    inbound: HashMap<u64, (u32, u64)>,
    /// Target side: uid -> what its chunks showed.
    seen: HashMap<u64, Seen>,
    /// Target side: the joins of multi-chunk transfers, by uid (the engine's one table).
    joins: HashMap<u64, Join>,
    /// Target side: uid -> (lane, chunk) of the chunk whose report completed the transfer's
    /// join, whose lane and tag the COMPLETE for the whole transfer took.
    answered: HashMap<u64, (usize, u32)>,
    events: u64,
    now: u64,
    steps: u64,
    /// (lane, error was at the target, error).
    decode_errors: Vec<(usize, bool, DecodeError)>,
    /// Responses the owner would be told of that arrived for transfers already ended.
    stale: usize,
    /// FINISH frames the target handled.
    finishes: usize,
    /// Multi-chunk reads that ended with their last chunk's data (COMPLETE came first), and
    /// with COMPLETE (every chunk's data came first).
    reads_ended_by_data: usize,
    reads_ended_by_complete: usize,
    /// Set by `verify`: joins that never completed, dropped.
    dropped_joins: usize,
}

impl Sim {
    fn new(seed: u64, n_lanes: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut local = vec![0u8; LOCAL_BYTES as usize];
        let mut target = vec![0u8; TARGET_BYTES as usize];
        rng.fill(&mut local[..]);
        rng.fill(&mut target[..]);
        let max_burst = *[1usize, 3, 16, 64, 512, 8192].choose(&mut rng).unwrap();
        let lanes = (0..n_lanes)
            .map(|_| Lane {
                next_tag: rng.gen::<u64>() >> rng.gen_range(0..64),
                ..Lane::default()
            })
            .collect();
        Self {
            seed,
            rng,
            max_burst,
            lanes,
            init_local: local.clone(),
            init_target: target.clone(),
            local,
            target,
            xfers: Vec::new(),
            by_uid: HashMap::new(),
            staging: Vec::new(),
            inbound: HashMap::new(),
            seen: HashMap::new(),
            joins: HashMap::new(),
            answered: HashMap::new(),
            events: 0,
            now: 0,
            steps: 0,
            decode_errors: Vec::new(),
            stale: 0,
            finishes: 0,
            reads_ended_by_data: 0,
            reads_ended_by_complete: 0,
            dropped_joins: 0,
        }
    }

    fn n_lanes(&self) -> usize {
        self.lanes.len()
    }

    // ----- generating requests -----

    /// `n` disjoint windows, one per transfer: (local base, local len, remote base, remote len).
    fn windows(&mut self, n: usize) -> Vec<(u64, u64, u64, u64)> {
        let (sl, sr) = (LOCAL_BYTES / n as u64, TARGET_BYTES / n as u64);
        let mut lp: Vec<u64> = (0..n as u64).collect();
        let mut rp = lp.clone();
        lp.shuffle(&mut self.rng);
        rp.shuffle(&mut self.rng);
        (0..n).map(|i| (lp[i] * sl, sl, rp[i] * sr, sr)).collect()
    }

    /// A random batch inside `window` whose destination ranges do not overlap, normalised.
    fn gen_pieces(&mut self, op: Op, window: (u64, u64, u64, u64)) -> Vec<Piece> {
        let seed = self.seed;
        let rng = &mut self.rng;
        let (lb, ll, rb, rl) = window;
        // Destination and source windows.
        let (db, dl, sb, sl) = match op {
            Op::Write => (rb, rl, lb, ll),
            Op::Read => (lb, ll, rb, rl),
        };
        let cap = dl.min(sl);
        let max_blk = (*[16u64, 128, 512, cap].choose(rng).unwrap()).clamp(1, cap);
        let max_blocks = rng.gen_range(1..=48);
        let mut blocks: Vec<(u64, u64)> = Vec::new(); // (dest offset in window, len)
        let mut pos = rng.gen_range(0..dl / 4);
        while pos < dl && blocks.len() < max_blocks {
            if rng.gen_ratio(1, 4) {
                pos += rng.gen_range(0..=32);
                if pos >= dl {
                    break;
                }
            }
            let len = rng.gen_range(1..=max_blk.min(dl - pos));
            blocks.push((pos, len));
            pos += len;
        }
        if blocks.is_empty() {
            blocks.push((0, 1));
        }
        let sum: u64 = blocks.iter().map(|b| b.1).sum();
        // (src, dst, len) absolute.
        let mut entries: Vec<(u64, u64, u64)> = Vec::new();
        if sum <= sl && rng.gen_ratio(1, 3) {
            // In order, source contiguous: normalize merges where the destination is too.
            let mut s = rng.gen_range(0..=sl - sum);
            for (d, len) in blocks {
                entries.push((sb + s, db + d, len));
                s += len;
            }
        } else {
            blocks.shuffle(rng);
            for (d, len) in blocks {
                entries.push((sb + rng.gen_range(0..=sl - len), db + d, len));
            }
        }
        for _ in 0..rng.gen_range(0..3) {
            let at = rng.gen_range(0..=entries.len());
            entries.insert(
                at,
                (sb + rng.gen_range(0..sl), db + rng.gen_range(0..dl), 0),
            );
        }
        let (mut lo, mut ro, mut sz) = (Vec::new(), Vec::new(), Vec::new());
        for (s, d, len) in entries {
            let (l, r) = match op {
                Op::Write => (s, d),
                Op::Read => (d, s),
            };
            lo.push(l);
            ro.push(r);
            sz.push(len);
        }
        let pieces = normalize(&lo, &ro, &sz, LOCAL_BYTES, TARGET_BYTES)
            .unwrap_or_else(|e| panic!("seed {seed}: normalize refused a valid batch: {e}"));
        assert!(
            !destination_overlaps(&pieces, op == Op::Write),
            "seed {seed}: generated overlapping destinations"
        );
        assert_eq!(total_bytes(&pieces), sz.iter().sum::<u64>(), "seed {seed}");
        pieces
    }

    fn gen_spec(&mut self, window: (u64, u64, u64, u64), lanes: Vec<usize>) -> Spec {
        let op = if self.rng.gen() { Op::Write } else { Op::Read };
        let pieces = self.gen_pieces(op, window);
        let chunk_bytes = if self.rng.gen_ratio(1, 5) {
            1 << 20
        } else {
            // Log-uniform over 64..=4096, so most transfers have many chunks.
            let lo = 64u64 << self.rng.gen_range(0..6);
            self.rng.gen_range(lo..=2 * lo)
        };
        Spec {
            op,
            pieces,
            mem_id: MEM_ID,
            extent: None,
            chunk_bytes,
            lanes,
            deadline: NO_DEADLINE,
            local_failure: false,
            shared: op == Op::Write && self.rng.gen(),
        }
    }

    /// All lanes, rotated by a random start.
    fn all_lanes(&mut self) -> Vec<usize> {
        let n = self.n_lanes();
        let start = self.rng.gen_range(0..n);
        (0..n).map(|i| (start + i) % n).collect()
    }

    /// A random non-empty subset of the lanes in random order.
    fn some_lanes(&mut self) -> Vec<usize> {
        let mut l: Vec<usize> = (0..self.n_lanes()).collect();
        l.shuffle(&mut self.rng);
        let k = self.rng.gen_range(1..=l.len());
        l.truncate(k);
        l
    }

    // ----- initiator -----

    fn start(&mut self, spec: Spec) {
        let seed = self.seed;
        let uid = loop {
            let u = self.rng.gen::<u64>();
            if !self.by_uid.contains_key(&u) {
                break u;
            }
        };
        let total = total_bytes(&spec.pieces);
        assert!(total > 0, "seed {seed}: empty transfer");
        let stripe = stripe_bytes(total, spec.lanes.len() as u64, spec.chunk_bytes);
        assert!((1..=spec.chunk_bytes).contains(&stripe), "seed {seed}");
        let chunks = cut(&spec.pieces, stripe);
        let n = chunks.len() as u32;
        let extent = spec.extent.unwrap_or_else(|| remote_extent(&spec.pieces));
        // Chunk i rides lanes[i % len] (shared: any of them, but chunk 0), so chunk 0 rides
        // the home lane, lanes[0]; every chunk of a multi-chunk transfer names it as the join
        // lane (0, ignored, for one chunk).
        let join_lane = if n > 1 { spec.lanes[0] as u16 } else { 0 };
        let fail_chunk = spec.local_failure.then(|| self.rng.gen_range(0..n));
        let x = self.xfers.len();
        let mut chunk_lanes = BTreeSet::new();
        for (i, pieces) in chunks.iter().enumerate() {
            let i = i as u32;
            let lane_ix = if spec.shared && i != 0 {
                spec.lanes[self.rng.gen_range(0..spec.lanes.len())]
            } else {
                spec.lanes[i as usize % spec.lanes.len()]
            };
            if spec.op == Op::Write && fail_chunk == Some(i) {
                // Its staging copy is under way; it fails later and the chunk never leaves.
                self.staging.push((x, i));
                continue;
            }
            chunk_lanes.insert(lane_ix);
            let lane = &mut self.lanes[lane_ix];
            assert!(!lane.failed, "seed {seed}: starting on a failed lane");
            let tag = lane.tag();
            let chunk = Chunk {
                tag,
                uid,
                chunk: i,
                n_chunks: n,
                mem_id: spec.mem_id,
                extent,
                join_lane,
                segs: pieces
                    .iter()
                    .map(|p| Seg {
                        off: p.remote,
                        len: p.len,
                    })
                    .collect(),
            };
            let final_ = n == 1;
            match spec.op {
                Op::Write => {
                    let payload = gather(&self.local, pieces.iter().map(|p| (p.local, p.len)));
                    lane.to_target
                        .send(&Frame::Write { chunk, final_ }, &payload);
                }
                Op::Read => lane.to_target.send(&Frame::Read { chunk, final_ }, &[]),
            }
            assert!(
                !lane.outstanding.contains_key(&tag) && !lane.unanswered.contains_key(&tag),
                "seed {seed}: tag reused"
            );
            if spec.op == Op::Write && n > 1 {
                // Nothing answers it but the COMPLETE of the whole write, if its report
                // completes the target's join.
                lane.unanswered.insert(tag, Unanswered { x, chunk: i });
            } else {
                let pieces = pieces.clone();
                lane.outstanding.insert(
                    tag,
                    Pending::Chunk {
                        x,
                        chunk: i,
                        pieces,
                    },
                );
            }
        }
        let deadline = spec.deadline;
        // A read also waits for every chunk's data; a write ends with COMPLETE alone.
        let wait_chunks = spec.op == Op::Read;
        self.by_uid.insert(uid, x);
        self.xfers.push(Xfer {
            spec,
            uid,
            n_chunks: n,
            chunks,
            chunk_lanes,
            fail_chunk,
            ob: Outbound::new(n, deadline, wait_chunks),
            result: None,
        });
    }

    fn done(&self, x: usize) -> bool {
        self.xfers[x].ob.phase() == Phase::Done
    }

    /// The transfer a target-side frame names (the checks' view of the initiator).
    fn xfer_of(&self, uid: u64) -> &Xfer {
        let x = *self
            .by_uid
            .get(&uid)
            .unwrap_or_else(|| panic!("seed {}: unknown transfer {uid:#x}", self.seed));
        &self.xfers[x]
    }

    /// Chunk `chunk` of write `x` failed its staging copy before any of it left: the owner
    /// hears of it through `on_local_failure`.
    fn fail_locally(&mut self, x: usize, chunk: u32) {
        let seed = self.seed;
        let msg = format!("{STAGE_OUT_FAILED}: chunk {chunk}");
        let xf = &mut self.xfers[x];
        let a = xf.ob.on_local_failure(ERR_GPU_OP, &msg);
        if xf.multi() {
            // The transfer cannot have ended: the target's join waits for this chunk.
            assert_eq!(
                a,
                Some(Action::SendFinish {
                    code: ERR_GPU_OP,
                    msg: msg.clone()
                }),
                "seed {seed}: transfer {x}: local failure of chunk {chunk}"
            );
            assert_eq!(xf.ob.phase(), Phase::Finishing, "seed {seed}");
        } else {
            // Nothing of a one-chunk write left: it completes at once.
            assert_eq!(
                a,
                Some(Action::Complete {
                    code: ERR_GPU_OP,
                    msg: msg.clone()
                }),
                "seed {seed}: transfer {x}: local failure"
            );
        }
        if let Some(a) = a {
            self.act(x, a);
        }
    }

    fn act(&mut self, x: usize, action: Action) {
        let seed = self.seed;
        match action {
            Action::SendFinish { code, msg } => {
                // FINISH rides the home lane: chunk 0's, the join lane its chunks name.
                let lane_ix = self.xfers[x].home();
                if self.lanes[lane_ix].failed {
                    if let Some(a) = self.xfers[x].ob.on_lane_lost("finish lane lost") {
                        self.act(x, a);
                    }
                    return;
                }
                let xf = &self.xfers[x];
                let lane = &mut self.lanes[lane_ix];
                let tag = lane.tag();
                let finish = Finish {
                    tag,
                    uid: xf.uid,
                    op: xf.spec.op,
                    n_chunks: xf.n_chunks,
                    total_bytes: total_bytes(&xf.spec.pieces),
                    code,
                    msg,
                };
                lane.to_target.send(&Frame::Finish(finish), &[]);
                let prev = lane.outstanding.insert(tag, Pending::Finish { x });
                assert!(prev.is_none(), "seed {seed}: tag reused");
            }
            Action::Complete { code, msg } => {
                self.events += 1;
                let xf = &self.xfers[x];
                assert!(
                    xf.result.is_none(),
                    "seed {seed}: transfer {x} completed twice"
                );
                if code == SUCCESS {
                    // The invariant of the join: a transfer completes with SUCCESS only once
                    // the target has recorded its inbound status, and only once every byte
                    // is at its destination (transfers' windows are disjoint, so these bytes
                    // are this transfer's alone).
                    match self.inbound.get(&xf.uid) {
                        Some(&(SUCCESS, at)) => assert!(at < self.events, "seed {seed}"),
                        other => panic!(
                            "seed {seed}: transfer {x} completed with SUCCESS, inbound {other:?}"
                        ),
                    }
                    for p in &xf.spec.pieces {
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
                self.xfers[x].result = Some((code, msg, self.events));
            }
        }
    }

    /// Take the outstanding chunk a reply answers, checking it matches.
    fn take_chunk(&mut self, lane: usize, r: &Reply) -> (usize, u32, Vec<Piece>) {
        let seed = self.seed;
        match self.lanes[lane].outstanding.remove(&r.tag) {
            Some(Pending::Chunk { x, chunk, pieces }) => {
                assert_eq!(self.xfers[x].uid, r.uid, "seed {seed}: reply uid");
                assert_eq!(chunk, r.chunk, "seed {seed}: reply chunk index");
                (x, chunk, pieces)
            }
            other => panic!("seed {seed}: lane {lane}: reply {r:?} matches {other:?}"),
        }
    }

    fn on_init_frame(&mut self, lane: usize, frame: Frame, payload: Vec<u8>) {
        let seed = self.seed;
        match frame {
            Frame::ReadData { reply: r, final_ } => {
                let (x, chunk, pieces) = self.take_chunk(lane, &r);
                let xf = &self.xfers[x];
                let (multi, fail_chunk) = (xf.multi(), xf.fail_chunk);
                assert_eq!(xf.spec.op, Op::Read, "seed {seed}: READ_DATA for a write");
                assert_eq!(final_, !multi, "seed {seed}: final flag");
                if r.code == SUCCESS {
                    assert_eq!(payload.len() as u64, total_bytes(&pieces), "seed {seed}");
                } else {
                    assert!(
                        payload.is_empty(),
                        "seed {seed}: refused READ_DATA with payload"
                    );
                }
                if multi {
                    // The COMPLETE for the whole read follows on this lane under this tag if
                    // the chunk's report completed the target's join (for a read that has
                    // ended too, late).
                    let prev = self.lanes[lane]
                        .unanswered
                        .insert(r.tag, Unanswered { x, chunk });
                    assert!(prev.is_none(), "seed {seed}: tag reused");
                }
                if self.done(x) {
                    self.stale += 1;
                    return;
                }
                let (mut code, mut msg) = (r.code, r.msg);
                if code == SUCCESS && fail_chunk == Some(chunk) {
                    // The copy into (GPU) memory fails here: the chunk's own error.
                    code = ERR_GPU_OP;
                    msg = format!("{STAGE_IN_FAILED}: chunk {chunk}");
                } else if code == SUCCESS {
                    place(
                        &mut self.local,
                        pieces.iter().map(|p| (p.local, p.len)),
                        &payload,
                    );
                }
                let ob = &mut self.xfers[x].ob;
                if final_ {
                    let a = ob
                        .on_complete(code, &msg)
                        .unwrap_or_else(|v| panic!("seed {seed}: final READ_DATA: {v}"))
                        .unwrap_or_else(|| panic!("seed {seed}: a final READ_DATA did not end"));
                    self.act(x, a);
                } else {
                    let a = ob
                        .on_chunk(chunk, code, &msg)
                        .unwrap_or_else(|v| panic!("seed {seed}: READ_DATA: {v}"));
                    if let Some(a) = a {
                        // The join's COMPLETE came first and waited for this last chunk.
                        self.reads_ended_by_data += 1;
                        self.act(x, a);
                    }
                }
            }
            Frame::Complete(r) => {
                let (x, joined) = match self.lanes[lane].unanswered.remove(&r.tag) {
                    Some(Unanswered { x, chunk }) => {
                        // The COMPLETE of a multi-chunk transfer: on the lane of one of its
                        // chunks, under that chunk's tag and number, the chunk whose report
                        // completed the target's join (so every chunk is at the target).
                        let uid = self.xfers[x].uid;
                        assert_eq!(r.chunk, chunk, "seed {seed}: COMPLETE chunk");
                        assert_eq!(
                            self.answered.get(&uid),
                            Some(&(lane, chunk)),
                            "seed {seed}: COMPLETE of {uid:#x} on lane {lane} for chunk {chunk}"
                        );
                        (x, true)
                    }
                    None => match self.lanes[lane].outstanding.remove(&r.tag) {
                        Some(Pending::Finish { x }) => (x, false),
                        Some(Pending::Chunk { x, chunk, .. }) => {
                            let xf = &self.xfers[x];
                            assert!(
                                xf.spec.op == Op::Write && !xf.multi(),
                                "seed {seed}: COMPLETE answers chunk {chunk} of a {:?} of {} \
                                 chunks",
                                xf.spec.op,
                                xf.n_chunks
                            );
                            (x, false)
                        }
                        None => {
                            panic!("seed {seed}: lane {lane}: COMPLETE for unknown tag {r:?}")
                        }
                    },
                };
                let xf = &self.xfers[x];
                assert_eq!(xf.uid, r.uid, "seed {seed}: COMPLETE uid");
                if !joined {
                    assert_eq!(r.chunk, 0, "seed {seed}: COMPLETE chunk");
                }
                assert!(payload.is_empty(), "seed {seed}");
                let read = xf.spec.op == Op::Read;
                if self.done(x) {
                    self.stale += 1;
                    return;
                }
                let a = self.xfers[x]
                    .ob
                    .on_complete(r.code, &r.msg)
                    .unwrap_or_else(|v| panic!("seed {seed}: on_complete: {v}"));
                match a {
                    Some(a) => {
                        if joined && read {
                            self.reads_ended_by_complete += 1;
                        }
                        self.act(x, a);
                    }
                    // Only a joined read goes on after COMPLETE, for its chunks' data.
                    None => assert!(
                        joined && read,
                        "seed {seed}: COMPLETE did not end transfer {x}"
                    ),
                }
            }
            other => panic!("seed {seed}: initiator got unexpected {other:?}"),
        }
    }

    // ----- target -----

    fn region_size(&self, mem_id: u32) -> Option<u64> {
        (mem_id == MEM_ID).then_some(self.target.len() as u64)
    }

    fn record_inbound(&mut self, uid: u64, code: u32) {
        self.events += 1;
        let prev = self.inbound.insert(uid, (code, self.events));
        assert!(
            prev.is_none(),
            "seed {}: inbound status of {uid:#x} recorded twice",
            self.seed
        );
    }

    /// Book a chunk's arrival, checking what the initiator must put in it: chunk 0 of a
    /// multi-chunk transfer rides the home lane, which every chunk names as its join lane (the
    /// real target closes a connection whose chunk names a lane the peer lacks, or whose chunk
    /// 0 is off its join lane); a one-chunk transfer names 0.
    fn note_seen(&mut self, lane: usize, c: &Chunk, final_: bool) {
        let seed = self.seed;
        assert!(
            !final_ || c.n_chunks == 1,
            "seed {seed}: final chunk of many"
        );
        let xf = self.xfer_of(c.uid);
        assert_eq!(c.n_chunks, xf.n_chunks, "seed {seed}: chunk count");
        if c.n_chunks == 1 {
            assert_eq!(
                c.join_lane, 0,
                "seed {seed}: join lane of a one-chunk transfer"
            );
        } else {
            assert!(
                (c.join_lane as usize) < self.n_lanes(),
                "seed {seed}: join lane {} of {} lanes",
                c.join_lane,
                self.n_lanes()
            );
            assert_eq!(c.join_lane as usize, xf.home(), "seed {seed}: join lane");
            if c.chunk == 0 {
                assert_eq!(lane, xf.home(), "seed {seed}: chunk 0 off its join lane");
            }
        }
        assert!(
            xf.sent(c.chunk),
            "seed {seed}: chunk {} of {:#x} failed before it left, yet arrived",
            c.chunk,
            c.uid
        );
        let e = self.seen.entry(c.uid).or_default();
        let first = *e.join_lane.get_or_insert(c.join_lane);
        assert_eq!(
            first, c.join_lane,
            "seed {seed}: chunks name two join lanes"
        );
        assert!(
            e.chunks.insert(c.chunk),
            "seed {seed}: chunk {} of {:#x} delivered twice",
            c.chunk,
            c.uid
        );
        e.bytes += c.bytes();
    }

    /// A chunk of a multi-chunk transfer was handled on `lane` with `code`: report it to the
    /// transfer's join at once, from this lane. When the report completes the join, record
    /// the inbound status, then answer COMPLETE for the whole transfer on this lane with the
    /// chunk's tag and number (after a read chunk's READ_DATA, already sent).
    fn report(&mut self, lane: usize, op: Op, c: &Chunk, code: u32, msg: &str) {
        let seed = self.seed;
        let now = self.now;
        let j = self
            .joins
            .entry(c.uid)
            .or_insert_with(|| Join::new(op, c.n_chunks, now));
        let verdict = j.report(op, c.n_chunks, c.chunk, code, msg);
        let spent = j.spent();
        if spent {
            self.joins.remove(&c.uid);
        }
        let Some((code, msg)) = verdict else {
            return;
        };
        assert!(spent, "seed {seed}: an answered join is not spent");
        let seen = self.seen[&c.uid].chunks.len();
        assert_eq!(
            seen, c.n_chunks as usize,
            "seed {seed}: join of {:#x} answered with {seen} of {} chunks at the target",
            c.uid, c.n_chunks
        );
        let prev = self.answered.insert(c.uid, (lane, c.chunk));
        assert!(
            prev.is_none(),
            "seed {seed}: join of {:#x} answered twice",
            c.uid
        );
        // The inbound status exists before the initiator can see the completion.
        self.record_inbound(c.uid, code);
        let reply = Reply {
            tag: c.tag,
            uid: c.uid,
            chunk: c.chunk,
            code,
            msg,
        };
        self.lanes[lane].to_init.send(&Frame::Complete(reply), &[]);
    }

    fn on_target_frame(&mut self, lane: usize, frame: Frame, payload: Vec<u8>) {
        let seed = self.seed;
        match frame {
            Frame::Write { chunk, final_ } => {
                assert_eq!(payload.len() as u64, chunk.bytes(), "seed {seed}");
                self.note_seen(lane, &chunk, final_);
                let res = check_chunk(&chunk, self.region_size(chunk.mem_id));
                if res.is_ok() {
                    place(
                        &mut self.target,
                        chunk.segs.iter().map(|s| (s.off, s.len)),
                        &payload,
                    );
                } // else: the payload is drained (already read off the stream) and dropped
                let (code, msg) = code_msg(res);
                if final_ {
                    // The whole transfer: record the inbound status, then COMPLETE.
                    let reply = Reply {
                        tag: chunk.tag,
                        uid: chunk.uid,
                        chunk: 0,
                        code,
                        msg,
                    };
                    self.record_inbound(chunk.uid, code);
                    self.lanes[lane].to_init.send(&Frame::Complete(reply), &[]);
                    return;
                }
                // No chunk of a multi-chunk write is answered on its own: the COMPLETE of the
                // one that completes the join answers for all of them.
                self.report(lane, Op::Write, &chunk, code, &msg);
            }
            Frame::Read { chunk, final_ } => {
                assert!(payload.is_empty(), "seed {seed}: READ with payload");
                self.note_seen(lane, &chunk, final_);
                let res = check_chunk(&chunk, self.region_size(chunk.mem_id));
                let data = if res.is_ok() {
                    gather(&self.target, chunk.segs.iter().map(|s| (s.off, s.len)))
                } else {
                    Vec::new()
                };
                let (code, msg) = code_msg(res);
                if final_ {
                    self.record_inbound(chunk.uid, code);
                }
                let reply = Reply {
                    tag: chunk.tag,
                    uid: chunk.uid,
                    chunk: chunk.chunk,
                    code,
                    msg: msg.clone(),
                };
                self.lanes[lane]
                    .to_init
                    .send(&Frame::ReadData { reply, final_ }, &data);
                if !final_ {
                    self.report(lane, Op::Read, &chunk, code, &msg);
                }
            }
            Frame::Finish(f) => {
                assert!(payload.is_empty(), "seed {seed}: FINISH with payload");
                // FINISH only follows a chunk that failed on the initiator before it left,
                // rides the home lane, and describes its transfer.
                let xf = self.xfer_of(f.uid);
                assert!(
                    xf.multi() && xf.spec.op == Op::Write && xf.fail_chunk.is_some(),
                    "seed {seed}: FINISH for {:#x}, which no local failure stopped",
                    f.uid
                );
                assert_eq!(lane, xf.home(), "seed {seed}: FINISH off the home lane");
                assert_eq!(
                    (f.op, f.n_chunks, f.total_bytes),
                    (xf.spec.op, xf.n_chunks, total_bytes(&xf.spec.pieces)),
                    "seed {seed}: FINISH describes another transfer"
                );
                assert_eq!(f.code, ERR_GPU_OP, "seed {seed}: FINISH code ({})", f.msg);
                self.finishes += 1;
                // FINISH's verdict is the inbound status; the join answers nothing more (a
                // report arriving later is only counted).
                self.record_inbound(f.uid, f.code);
                let now = self.now;
                let j = self
                    .joins
                    .entry(f.uid)
                    .or_insert_with(|| Join::new(f.op, f.n_chunks, now));
                assert!(!j.ended(), "seed {seed}: FINISH for an ended join");
                j.end();
                // Its failed chunk never comes: the entry stays until the target prunes it.
                assert!(!j.spent(), "seed {seed}: FINISH with every chunk in");
                let reply = Reply {
                    tag: f.tag,
                    uid: f.uid,
                    chunk: 0,
                    code: f.code,
                    msg: f.msg,
                };
                self.lanes[lane].to_init.send(&Frame::Complete(reply), &[]);
            }
            other => panic!("seed {seed}: target got unexpected {other:?}"),
        }
    }

    // ----- schedule -----

    /// Decode and handle everything complete on one direction of a lane.
    fn pump(&mut self, lane: usize, to_target: bool) {
        while !self.lanes[lane].failed {
            match self.lanes[lane].pipe(to_target).poll() {
                Ok(Some((frame, payload))) => {
                    if to_target {
                        self.on_target_frame(lane, frame, payload);
                    } else {
                        self.on_init_frame(lane, frame, payload);
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    self.lose_lane(lane, to_target, e);
                    return;
                }
            }
        }
    }

    /// A decoder on `lane` failed: the connection closes, and every transfer waiting on it
    /// fails, as does every transfer with a chunk in `unanswered` there (a chunk may not have
    /// arrived, or the COMPLETE for the whole transfer was on its way on this lane).
    fn lose_lane(&mut self, lane: usize, at_target: bool, e: DecodeError) {
        self.decode_errors.push((lane, at_target, e));
        let l = &mut self.lanes[lane];
        l.failed = true;
        l.to_target = Pipe::default();
        l.to_init = Pipe::default();
        let unanswered = std::mem::take(&mut l.unanswered);
        let mut xs: Vec<usize> = std::mem::take(&mut l.outstanding)
            .values()
            .map(Pending::xfer)
            .chain(unanswered.values().map(|u| u.x))
            .collect();
        xs.sort_unstable();
        xs.dedup();
        for x in xs {
            if let Some(a) = self.xfers[x].ob.on_lane_lost("lane lost") {
                self.act(x, a);
            }
        }
    }

    fn tick(&mut self) {
        for x in 0..self.xfers.len() {
            if let Some(a) = self.xfers[x].ob.on_tick(self.now) {
                self.act(x, a);
            }
        }
    }

    /// Run until no lane has anything to deliver, no staging copy is pending, and every
    /// request has started; requests in `queued` start at random points (or all at once when
    /// `!stagger`).
    fn run(&mut self, specs: Vec<Spec>, stagger: bool) {
        let seed = self.seed;
        let mut queued: VecDeque<Spec> = specs.into();
        if !stagger {
            while let Some(s) = queued.pop_front() {
                self.start(s);
            }
        }
        loop {
            self.steps += 1;
            assert!(self.steps < MAX_STEPS, "seed {seed}: no quiescence");
            if !queued.is_empty() && self.rng.gen_ratio(1, 16) {
                let s = queued.pop_front().unwrap();
                self.start(s);
                continue;
            }
            let mut active = Vec::new();
            for (i, l) in self.lanes.iter().enumerate() {
                if l.failed || l.stalled {
                    continue;
                }
                if !l.to_target.wire.is_empty() {
                    active.push(Step::Lane(i, true));
                }
                if !l.to_init.wire.is_empty() && !l.lagging {
                    active.push(Step::Lane(i, false));
                }
            }
            if !self.staging.is_empty() {
                active.push(Step::Staging);
            }
            if active.is_empty() && queued.is_empty() {
                let lagging = self.lanes.iter().enumerate().filter(|(_, l)| {
                    l.lagging && !l.failed && !l.stalled && !l.to_init.wire.is_empty()
                });
                active.extend(lagging.map(|(i, _)| Step::Lane(i, false)));
            }
            let Some(&step) = active.choose(&mut self.rng) else {
                match queued.pop_front() {
                    Some(s) => {
                        self.start(s);
                        continue;
                    }
                    None => break,
                }
            };
            match step {
                Step::Lane(lane, to_target) => {
                    let n = self.rng.gen_range(1..=self.max_burst);
                    self.lanes[lane].pipe(to_target).deliver(n);
                    self.pump(lane, to_target);
                }
                Step::Staging => {
                    let i = self.rng.gen_range(0..self.staging.len());
                    let (x, chunk) = self.staging.swap_remove(i);
                    self.fail_locally(x, chunk);
                }
            }
            self.now += 1;
            self.tick();
        }
    }

    // ----- checks -----

    /// Check every transfer against its expected outcome, the inbound bookkeeping, what the
    /// target saw of its chunks, the data in both regions, that live lanes are drained and
    /// wait for no chunk's own answer nor FINISH's; then drop the joins that can never
    /// complete (the target prunes them by age).
    fn verify(&mut self, outcomes: &[Outcome]) {
        let seed = self.seed;
        assert_eq!(outcomes.len(), self.xfers.len());
        assert!(
            self.staging.is_empty(),
            "seed {seed}: run ended with work left"
        );
        let mut exp_local = self.init_local.clone();
        let mut exp_target = self.init_target.clone();
        for (x, (xf, want)) in self.xfers.iter().zip(outcomes).enumerate() {
            let ctx = format!(
                "seed {seed}: transfer {x} ({:?}, {} chunks, lanes {:?}, fails {:?}, want {want:?})",
                xf.spec.op, xf.n_chunks, xf.spec.lanes, xf.fail_chunk
            );
            let Some((code, msg, done_at)) = &xf.result else {
                panic!("{ctx}: never completed (phase {:?})", xf.ob.phase());
            };
            assert_eq!(xf.ob.phase(), Phase::Done, "{ctx}");
            let want = match want {
                Outcome::LostOrJoined if *code == SUCCESS => Outcome::Success,
                Outcome::LostOrJoined => Outcome::Lost,
                w => *w,
            };
            let inbound = self.inbound.get(&xf.uid);
            // Chunks whose bytes are at their destination, or None: unspecified.
            let landed: Option<Vec<bool>> = match want {
                Outcome::Success | Outcome::Refused(_) | Outcome::LocalFailure => {
                    let (c, in_c) = match want {
                        Outcome::Success => (SUCCESS, Some(SUCCESS)),
                        Outcome::Refused(c) => (c, Some(c)),
                        _ => {
                            assert!(
                                msg.starts_with(match xf.spec.op {
                                    Op::Write => STAGE_OUT_FAILED,
                                    Op::Read => STAGE_IN_FAILED,
                                }),
                                "{ctx}: message {msg:?}"
                            );
                            let in_c = match (xf.spec.op, xf.multi()) {
                                (Op::Write, true) => Some(ERR_GPU_OP),
                                (Op::Write, false) => None,
                                (Op::Read, _) => Some(SUCCESS),
                            };
                            (ERR_GPU_OP, in_c)
                        }
                    };
                    assert_eq!(*code, c, "{ctx}: final status ({msg})");
                    match (in_c, inbound) {
                        (None, None) => {}
                        (Some(w), Some((in_code, in_at))) => {
                            assert_eq!(*in_code, w, "{ctx}: inbound status");
                            assert!(
                                in_at < done_at,
                                "{ctx}: inbound recorded at event {in_at}, after completion at {done_at}"
                            );
                        }
                        (w, got) => panic!("{ctx}: inbound status {got:?}, want {w:?}"),
                    }
                    // The target saw every chunk that left, once, with its bytes.
                    let sent: BTreeSet<u32> = (0..xf.n_chunks).filter(|&c| xf.sent(c)).collect();
                    let bytes: u64 = sent
                        .iter()
                        .map(|&c| total_bytes(&xf.chunks[c as usize]))
                        .sum();
                    let seen = self.seen.get(&xf.uid).cloned().unwrap_or_default();
                    assert_eq!(seen.chunks, sent, "{ctx}: chunks at the target");
                    assert_eq!(seen.bytes, bytes, "{ctx}: bytes at the target");
                    let refused = matches!(want, Outcome::Refused(_));
                    Some(
                        (0..xf.n_chunks)
                            .map(|c| !refused && xf.fail_chunk != Some(c))
                            .collect(),
                    )
                }
                Outcome::Lost => {
                    assert_eq!(*code, ERR_BAD_STATE, "{ctx}: ({msg})");
                    None
                }
                Outcome::TimedOut => {
                    assert_eq!(*code, ERR_BAD_STATE, "{ctx}: ({msg})");
                    assert_eq!(msg, "operation timeout", "{ctx}");
                    None
                }
                Outcome::LostOrJoined => unreachable!(),
            };
            let (now_local, now_target) = (&self.local, &self.target);
            let mut copy = |p: &Piece, from_init: bool| {
                let (l, r, n) = (p.local as usize, p.remote as usize, p.len as usize);
                match (xf.spec.op, from_init) {
                    (Op::Write, true) => {
                        exp_target[r..r + n].copy_from_slice(&self.init_local[l..l + n])
                    }
                    (Op::Read, true) => {
                        exp_local[l..l + n].copy_from_slice(&self.init_target[r..r + n])
                    }
                    (Op::Write, false) => {
                        exp_target[r..r + n].copy_from_slice(&now_target[r..r + n])
                    }
                    (Op::Read, false) => exp_local[l..l + n].copy_from_slice(&now_local[l..l + n]),
                }
            };
            match landed {
                Some(landed) => {
                    for (pieces, _) in xf.chunks.iter().zip(&landed).filter(|(_, l)| **l) {
                        pieces.iter().for_each(|p| copy(p, true));
                    }
                }
                None => xf.spec.pieces.iter().for_each(|p| copy(p, false)),
            }
        }
        let diff = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y);
        if let Some(i) = diff(&self.target, &exp_target) {
            panic!("seed {seed}: target region differs from the model at byte {i}");
        }
        if let Some(i) = diff(&self.local, &exp_local) {
            panic!("seed {seed}: local region differs from the model at byte {i}");
        }
        // A multi-chunk transfer's join completes once the target has seen all its chunks.
        let all_seen = |xf: &Xfer| {
            self.seen
                .get(&xf.uid)
                .is_some_and(|s| s.chunks.len() as u32 == xf.n_chunks)
        };
        for (i, l) in self.lanes.iter().enumerate() {
            if l.failed {
                continue;
            }
            assert!(
                l.to_target.idle() && l.to_init.idle(),
                "seed {seed}: lane {i} not drained"
            );
            // Every chunk's own answer and every FINISH's COMPLETE has come; what is left in
            // `unanswered` (chunks whose report did not complete their join) belongs to
            // transfers that have ended.
            assert!(
                l.outstanding.is_empty(),
                "seed {seed}: lane {i} still waits for {:?}",
                l.outstanding
            );
        }
        // A join that never completed: its transfer missed a chunk and failed.
        for uid in self.joins.keys() {
            let xf = self.xfer_of(*uid);
            let failed = xf.result.as_ref().is_some_and(|r| r.0 != SUCCESS);
            assert!(
                failed && !all_seen(xf),
                "seed {seed}: join of {uid:#x} left behind"
            );
        }
        self.dropped_joins = self.joins.len();
        self.joins.clear();
    }

    /// Everything observable at the end of a run, for determinism checks.
    fn digest(&self) -> Digest {
        (
            self.events,
            self.steps,
            self.local.clone(),
            self.target.clone(),
            self.xfers
                .iter()
                .map(|x| (x.uid, x.result.clone()))
                .collect(),
        )
    }
}

fn code_msg(res: Result<(), morio::proto::inbound::Refusal>) -> (u32, String) {
    match res {
        Ok(()) => (SUCCESS, String::new()),
        Err(r) => {
            assert_ne!(r.code, SUCCESS);
            (r.code, r.msg.to_string())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

/// Several concurrent reads and writes striped over all lanes, started at random points.
fn scenario_success(seed: u64) -> Sim {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let n_lanes = rng.gen_range(1..=4);
    let n_x = rng.gen_range(2..=6);
    let mut sim = Sim::new(seed, n_lanes);
    let windows = sim.windows(n_x);
    let specs: Vec<Spec> = windows
        .into_iter()
        .map(|w| {
            let lanes = sim.all_lanes();
            sim.gen_spec(w, lanes)
        })
        .collect();
    sim.run(specs, true);
    sim.verify(&vec![Outcome::Success; n_x]);
    assert!(
        sim.decode_errors.is_empty(),
        "seed {seed}: decode errors {:?}",
        sim.decode_errors
    );
    assert_eq!(sim.stale, 0, "seed {seed}: stale responses");
    // No FINISH without a local failure; every multi-chunk transfer answered by its join.
    assert_eq!(sim.finishes, 0, "seed {seed}: FINISH sent");
    let multi = sim.xfers.iter().filter(|x| x.multi()).count();
    assert_eq!(sim.answered.len(), multi, "seed {seed}: joins answered");
    assert_eq!(sim.dropped_joins, 0, "seed {seed}: joins left behind");
    sim
}

#[test]
fn sim_concurrent_transfers_succeed() {
    let (mut chunks, mut multi, mut single) = (0u64, 0, 0);
    let (mut off_home, mut by_data, mut by_complete) = (0, 0, 0);
    for seed in seeds(200) {
        let sim = scenario_success(seed);
        for x in &sim.xfers {
            chunks += u64::from(x.n_chunks);
            if x.n_chunks == 1 {
                single += 1;
            } else {
                multi += 1;
                if sim.answered[&x.uid].0 != x.home() {
                    off_home += 1;
                }
            }
        }
        by_data += sim.reads_ended_by_data;
        by_complete += sim.reads_ended_by_complete;
    }
    if std::env::var("PROTO_SIM_SEED").is_err() {
        // The generator really exercises both paths.
        eprintln!("{single} single-chunk and {multi} multi-chunk transfers, {chunks} chunks");
        assert!(single > 20 && multi > 200, "single {single}, multi {multi}");
        assert!(chunks > 10_000, "{chunks} chunks");
        // And the schedules the join allows: joins completed by a chunk off the home lane,
        // and reads that end with COMPLETE after all their data as well as with their last
        // data after COMPLETE.
        eprintln!(
            "{off_home} joins answered off the home lane, reads ended by data {by_data} / by \
             COMPLETE {by_complete}"
        );
        assert!(
            off_home > 100,
            "{off_home} joins answered off the home lane"
        );
        assert!(
            by_data > 20 && by_complete > 20,
            "reads ended by data {by_data}, by COMPLETE {by_complete}"
        );
    }
}

#[test]
fn sim_is_deterministic() {
    for seed in seeds(5) {
        let a = scenario_success(seed).digest();
        let b = scenario_success(seed).digest();
        assert!(a == b, "seed {seed}: two runs differ");
    }
}

/// Good transfers next to one whose range reaches past the target region and one naming an
/// unknown region: the bad ones fail with the target's code and move no byte. The target's
/// join answers a refused multi-chunk transfer like any other (no FINISH).
fn scenario_refusals(seed: u64) -> (usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xbad);
    let n_lanes = rng.gen_range(1..=4);
    let n_good = rng.gen_range(0..=3);
    let mut sim = Sim::new(seed, n_lanes);
    let windows = sim.windows(n_good + 2);
    let mut specs = Vec::new();
    let mut outcomes = Vec::new();
    for &w in &windows[..n_good] {
        let lanes = sim.all_lanes();
        specs.push(sim.gen_spec(w, lanes));
        outcomes.push(Outcome::Success);
    }
    // Out of range: bypass normalize with a piece crossing the region's end, or with an
    // extent that claims to.
    let lanes = sim.all_lanes();
    let mut bad = sim.gen_spec(windows[n_good], lanes);
    if sim.rng.gen() {
        let (lb, ll, _, _) = windows[n_good];
        let a = sim.rng.gen_range(0..=16u64);
        let len = (a + sim.rng.gen_range(1..=16u64)).min(ll);
        let piece = Piece {
            local: lb,
            remote: TARGET_BYTES - a,
            len,
        };
        let at = sim.rng.gen_range(0..=bad.pieces.len());
        bad.pieces.insert(at, piece);
        assert!(remote_extent(&bad.pieces).1 > TARGET_BYTES);
    } else {
        let (lo, _) = remote_extent(&bad.pieces);
        bad.extent = Some((lo, TARGET_BYTES + sim.rng.gen_range(1..=4096)));
    }
    specs.push(bad);
    outcomes.push(Outcome::Refused(ERR_INVALID_ARGS));
    let lanes = sim.all_lanes();
    let mut unknown = sim.gen_spec(windows[n_good + 1], lanes);
    unknown.mem_id = UNKNOWN_MEM_ID;
    specs.push(unknown);
    outcomes.push(Outcome::Refused(ERR_NOT_FOUND));

    // Start in random order.
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.shuffle(&mut sim.rng);
    let specs: Vec<Spec> = order.iter().map(|&i| specs[i].clone()).collect();
    let outcomes: Vec<Outcome> = order.iter().map(|&i| outcomes[i]).collect();
    sim.run(specs, true);
    sim.verify(&outcomes);
    assert!(sim.decode_errors.is_empty(), "seed {seed}");
    assert_eq!(sim.finishes, 0, "seed {seed}: FINISH sent");
    assert_eq!(sim.dropped_joins, 0, "seed {seed}: joins left behind");
    if n_good == 0 {
        assert!(sim.target == sim.init_target, "seed {seed}: target changed");
        assert!(sim.local == sim.init_local, "seed {seed}: local changed");
    }
    let singles = sim.xfers.iter().filter(|x| x.n_chunks == 1).count();
    (singles, sim.xfers.len() - singles)
}

#[test]
fn sim_out_of_range_and_unknown_region_are_refused() {
    let (mut singles, mut multis) = (0, 0);
    for seed in seeds(150) {
        let (s, m) = scenario_refusals(seed);
        singles += s;
        multis += m;
    }
    if std::env::var("PROTO_SIM_SEED").is_err() {
        assert!(
            singles > 10 && multis > 50,
            "singles {singles}, multis {multis}"
        );
    }
}

/// Garbage at the front of one lane's stream (either direction; towards the target it is
/// sometimes a well-formed chunk naming a join lane past `MAX_LANES`, which the decoder
/// refuses): that lane's decoder fails, its transfers end with ERR_BAD_STATE, transfers on
/// other lanes succeed. Only a multi-chunk write may still succeed when the garbage was
/// towards the initiator: the target may have placed every chunk, and when the chunk whose
/// report completed its join rode another lane, that chunk's COMPLETE may reach the initiator
/// before the lane's loss is noticed. When that chunk rode the bad lane, its COMPLETE is lost
/// with the lane, and the write fails although the target completed it.
fn scenario_garbage(seed: u64) -> [usize; 4] {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9a7b);
    let n_lanes = rng.gen_range(2..=4);
    let n_x = rng.gen_range(2..=6);
    let mut sim = Sim::new(seed, n_lanes);
    let bad = rng.gen_range(0..n_lanes);
    let at_target = rng.gen();
    let bad_join_lane = at_target && rng.gen();
    let garbage: Vec<u8> = if bad_join_lane {
        let mut chunk = Chunk {
            tag: rng.gen(),
            uid: rng.gen(),
            chunk: 1,
            n_chunks: 2,
            mem_id: MEM_ID,
            extent: (0, 64),
            join_lane: MAX_LANES - 1,
            segs: vec![Seg { off: 0, len: 64 }],
        };
        let mut ok = Vec::new();
        Frame::Read {
            chunk: chunk.clone(),
            final_: false,
        }
        .encode(0, &mut ok);
        // The same frame with a join lane below MAX_LANES decodes: the lane alone is wrong.
        assert!(
            matches!(decode_frame(&ok), Ok(Some(_))),
            "seed {seed}: a valid chunk frame refused"
        );
        chunk.join_lane = rng.gen_range(MAX_LANES..=u16::MAX);
        let mut b = Vec::new();
        Frame::Read {
            chunk,
            final_: false,
        }
        .encode(0, &mut b);
        b
    } else {
        let mut g: Vec<u8> = (0..rng.gen_range(HEADER_BYTES..=64))
            .map(|_| rng.gen())
            .collect();
        if g[0] == FRAME_MAGIC.to_le_bytes()[0] {
            g[0] ^= 0xff;
        }
        g
    };
    sim.lanes[bad].pipe(at_target).wire.extend(&garbage);
    // Sometimes the garbage towards the initiator arrives last: by then the target has
    // handled every chunk, and a write answered on another lane has its COMPLETE.
    let lagging = !at_target && rng.gen();
    sim.lanes[bad].lagging = lagging;
    let windows = sim.windows(n_x);
    let specs: Vec<Spec> = windows
        .into_iter()
        .map(|w| {
            let lanes = sim.some_lanes();
            sim.gen_spec(w, lanes)
        })
        .collect();
    sim.run(specs, false);
    assert_eq!(
        sim.decode_errors.len(),
        1,
        "seed {seed}: {:?}",
        sim.decode_errors
    );
    let (lane, side, e) = sim.decode_errors[0];
    assert_eq!((lane, side), (bad, at_target), "seed {seed}");
    if bad_join_lane {
        assert_eq!(e, DecodeError::BadChunk, "seed {seed}: {e}");
    } else {
        assert!(matches!(e, DecodeError::BadMagic(_)), "seed {seed}: {e}");
    }
    let outcomes: Vec<Outcome> = sim
        .xfers
        .iter()
        .map(|x| {
            if !x.chunk_lanes.contains(&bad) {
                Outcome::Success
            } else if !at_target && x.spec.op == Op::Write && x.multi() {
                Outcome::LostOrJoined
            } else {
                Outcome::Lost
            }
        })
        .collect();
    sim.verify(&outcomes);
    assert_eq!(sim.finishes, 0, "seed {seed}: FINISH sent");
    let hit: Vec<&Xfer> = sim
        .xfers
        .iter()
        .filter(|x| x.chunk_lanes.contains(&bad))
        .collect();
    let succeeded = |x: &Xfer| x.result.as_ref().is_some_and(|r| r.0 == SUCCESS);
    let joined = hit.iter().filter(|x| succeeded(x)).count();
    // Joins answered on the bad lane, and multi-chunk writes answered on another one.
    let (mut answered_on_bad, mut answered_off_bad) = (0, 0);
    for x in &hit {
        match sim.answered.get(&x.uid) {
            Some(&(lane, _)) if lane == bad => {
                // The COMPLETE went down with the lane: the transfer fails though joined.
                assert!(!succeeded(x), "seed {seed}: answered on the lost lane");
                answered_on_bad += 1;
            }
            Some(_) => answered_off_bad += usize::from(x.spec.op == Op::Write),
            // Lagging, every chunk reached the target before the lane was lost.
            None => assert!(
                !(lagging && x.multi()),
                "seed {seed}: a join never completed"
            ),
        }
    }
    if lagging {
        // Exactly the writes whose COMPLETE came on another lane succeed.
        assert_eq!(
            joined, answered_off_bad,
            "seed {seed}: writes joined despite the lost lane"
        );
    }
    [
        hit.len(),
        outcomes.len() - hit.len(),
        joined,
        answered_on_bad,
    ]
}

#[test]
fn sim_garbage_on_a_lane_fails_only_its_transfers() {
    let (mut lost, mut ok, mut joined, mut on_bad) = (0, 0, 0, 0);
    for seed in seeds(150) {
        let [l, o, j, b] = scenario_garbage(seed);
        lost += l;
        ok += o;
        joined += j;
        on_bad += b;
    }
    if std::env::var("PROTO_SIM_SEED").is_err() {
        eprintln!(
            "{lost} transfers on the bad lane ({joined} of them joined anyway, {on_bad} \
             answered on it), {ok} not"
        );
        assert!(lost > 50 && ok > 50, "lost {lost}, ok {ok}");
        assert!(joined > 5, "{joined} writes joined despite the lost lane");
        assert!(on_bad > 5, "{on_bad} joins answered on the lost lane");
    }
}

/// One lane delivers nothing: transfers using it time out through `on_tick`; the others
/// succeed (a join waits for the stalled chunks, so nothing using the lane completes early).
/// When the lane wakes up, every chunk reaches the target, every join answers, and the late
/// answers are ignored as stale.
fn scenario_stall(seed: u64) -> (usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x57a11);
    let n_lanes = rng.gen_range(2..=4);
    let n_x = rng.gen_range(2..=6);
    let deadline = 1 << 40;
    let mut sim = Sim::new(seed, n_lanes);
    let stalled = rng.gen_range(0..n_lanes);
    sim.lanes[stalled].stalled = true;
    let windows = sim.windows(n_x);
    let specs: Vec<Spec> = windows
        .into_iter()
        .map(|w| {
            let lanes = sim.some_lanes();
            let mut s = sim.gen_spec(w, lanes);
            s.deadline = deadline;
            s
        })
        .collect();
    sim.run(specs, true);
    for (x, xf) in sim.xfers.iter().enumerate() {
        assert_eq!(
            xf.result.is_none(),
            xf.chunk_lanes.contains(&stalled),
            "seed {seed}: transfer {x} before the deadline"
        );
    }
    sim.now = deadline - 1;
    sim.tick();
    assert!(
        sim.xfers
            .iter()
            .all(|x| x.result.is_some() != x.chunk_lanes.contains(&stalled)),
        "seed {seed}: a transfer timed out early"
    );
    sim.now = deadline;
    sim.tick();
    // Wake the lane: everything it carried is answered late and must be ignored.
    sim.lanes[stalled].stalled = false;
    let in_flight = sim.lanes[stalled].outstanding.len();
    let stale_before = sim.stale;
    sim.run(Vec::new(), false);
    let outcomes: Vec<Outcome> = sim
        .xfers
        .iter()
        .map(|x| {
            if x.chunk_lanes.contains(&stalled) {
                Outcome::TimedOut
            } else {
                Outcome::Success
            }
        })
        .collect();
    let timed_out = outcomes.iter().filter(|o| **o == Outcome::TimedOut).count();
    assert!(
        sim.stale >= in_flight.min(1),
        "seed {seed}: late answers not seen"
    );
    // Each timed-out transfer's final answer (its COMPLETE, or a one-chunk read's final
    // READ_DATA) arrives after the wake-up.
    assert!(
        sim.stale - stale_before >= timed_out,
        "seed {seed}: {} late answers for {timed_out} timed-out transfers",
        sim.stale - stale_before
    );
    sim.verify(&outcomes);
    assert!(sim.decode_errors.is_empty(), "seed {seed}");
    assert_eq!(sim.finishes, 0, "seed {seed}: FINISH sent");
    // Nothing was lost: every transfer's inbound status ends up recorded, and every join
    // completed.
    assert_eq!(
        sim.inbound.len(),
        sim.xfers.len(),
        "seed {seed}: inbound statuses"
    );
    assert_eq!(sim.dropped_joins, 0, "seed {seed}: joins left behind");
    (timed_out, outcomes.len() - timed_out)
}

#[test]
fn sim_stalled_lane_times_out_only_its_transfers() {
    let (mut timed_out, mut ok) = (0, 0);
    for seed in seeds(100) {
        let (t, o) = scenario_stall(seed);
        timed_out += t;
        ok += o;
    }
    if std::env::var("PROTO_SIM_SEED").is_err() {
        assert!(timed_out > 30 && ok > 30, "timed out {timed_out}, ok {ok}");
    }
}

/// Transfers of which one chunk fails on the initiator, next to good ones. A write's chunk
/// whose staging copy fails (at a random point, while its other chunks are on the wire) never
/// leaves: the target's join can never complete, so a multi-chunk write sends FINISH on its
/// home lane, the target records FINISH's code and ends the join, and FINISH's COMPLETE ends
/// the transfer (no chunk of it gets a COMPLETE; the join is left for the target to prune);
/// a one-chunk write completes at once, unseen by the target. A read's chunk whose data
/// cannot be placed is that chunk's error, which wins over the join's SUCCESS.
fn scenario_local_failure(seed: u64) -> [usize; 5] {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x10ca1);
    let n_lanes = rng.gen_range(1..=4);
    let n_x = rng.gen_range(2..=6);
    let forced = rng.gen_range(0..n_x);
    let mut sim = Sim::new(seed, n_lanes);
    let windows = sim.windows(n_x);
    let mut outcomes = Vec::new();
    let specs: Vec<Spec> = windows
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let lanes = sim.all_lanes();
            let mut s = sim.gen_spec(w, lanes);
            s.local_failure = i == forced || rng.gen_ratio(1, 3);
            outcomes.push(if s.local_failure {
                Outcome::LocalFailure
            } else {
                Outcome::Success
            });
            s
        })
        .collect();
    sim.run(specs, true);
    sim.verify(&outcomes);
    assert!(sim.decode_errors.is_empty(), "seed {seed}");
    assert_eq!(sim.stale, 0, "seed {seed}: stale responses");
    let failed = |op: Op, multi: bool| {
        sim.xfers
            .iter()
            .filter(|x| x.fail_chunk.is_some() && x.spec.op == op && x.multi() == multi)
            .count()
    };
    let (multi_writes, single_writes) = (failed(Op::Write, true), failed(Op::Write, false));
    // Those that failed chunk 0, so that their home lane carried FINISH without it.
    let chunk0_writes = sim
        .xfers
        .iter()
        .filter(|x| x.spec.op == Op::Write && x.multi() && x.fail_chunk == Some(0))
        .count();
    // One FINISH per failed multi-chunk write, and nothing else; each leaves its join (which
    // lacks the failed chunk) behind, unanswered, and every other multi-chunk join answers.
    assert_eq!(sim.finishes, multi_writes, "seed {seed}: FINISH frames");
    assert_eq!(
        sim.dropped_joins, multi_writes,
        "seed {seed}: joins dropped"
    );
    let multi = sim.xfers.iter().filter(|x| x.multi()).count();
    assert_eq!(
        sim.answered.len(),
        multi - multi_writes,
        "seed {seed}: joins answered"
    );
    [
        multi_writes,
        single_writes,
        chunk0_writes,
        failed(Op::Read, true),
        failed(Op::Read, false),
    ]
}

#[test]
fn sim_local_failure_finishes_the_transfer() {
    let mut n = [0usize; 5];
    for seed in seeds(150) {
        for (a, b) in n.iter_mut().zip(scenario_local_failure(seed)) {
            *a += b;
        }
    }
    if std::env::var("PROTO_SIM_SEED").is_err() {
        let [mw, sw, c0, mr, sr] = n;
        eprintln!(
            "failed: {mw} multi-chunk writes ({c0} at chunk 0), {sw} one-chunk writes, \
             {mr} multi-chunk reads, {sr} one-chunk reads"
        );
        assert!(mw > 50 && c0 > 5 && mr > 50, "{n:?}");
        assert!(sw > 3 && sr > 3, "{n:?}");
    }
}
