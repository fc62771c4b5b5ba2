//! Transfers as the user and the checks see them: what a transfer must end as, the request
//! that starts it, how it ended, what the checks follow of it, and what the target saw.

use std::collections::{BTreeMap, BTreeSet};

use morio::proto::access::AccessKey;
use morio::proto::frame::Op;
use morio::proto::layout::Layout;

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
    pub(super) gen: u64,
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
    pub(super) refs: BTreeMap<u16, i64>,
    /// Lanes holding a shared-stripe item of it (which a lane drops once no stripe is left,
    /// so its loss may or may not fail the transfer).
    pub(super) shared_on: BTreeSet<u16>,
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
    /// A FINISH came after every chunk (its join had gone, and that FINISH started it again).
    pub finish_after_join: bool,
}
