//! The messages shards exchange: what the application thread hands an owner, what an owner
//! hands a lane, and what a lane reports back. Every module of the service imports them from
//! here, and this module imports none of those modules.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};

use crate::proto::access::AccessKey;
use crate::proto::dispatch::{FinishSpec, Item, TransferRef};
use crate::proto::frame::{Hello, Op};
use crate::proto::lane::Report;
use crate::proto::layout::Layout;
use crate::region::SharedRegion;
use crate::stats::ShardStats;
use crate::status::TransferStatus;
use crate::transport::Handoff;

/// A remote engine as the data plane needs it.
#[derive(Debug)]
pub(crate) struct Peer {
    /// Its engine key.
    pub key: Arc<str>,
    /// Where to dial it.
    pub addr: SocketAddr,
    /// Whether the lane to it connected last runs over the same-host transport (set by each
    /// lane once it is connected): owners then cut its transfers at `same_host_chunk_bytes`,
    /// since every same-host chunk that is pulled or copied on the GPU costs its lane a round
    /// trip.
    pub same_host: AtomicBool,
    /// Whether any lane to it has connected yet (until then `same_host` says nothing).
    pub reached: AtomicBool,
    /// Whether the lane to it connected last speaks a protocol version whose targets answer
    /// FINISH on each lane of a transfer ([`crate::proto::limits::FENCE_VERSION`]): then a
    /// write that fails early is fenced on every lane that carried its chunks before its
    /// failure is reported (`owner::finish`).
    pub fences: AtomicBool,
    /// Whether its descriptor names this engine's node (`EngineDesc::node_id`): its first
    /// transfer, planned before any lane says, is cut as one to a same-host peer if this
    /// engine may use the same-host transport (a wrong guess costs that transfer's speed,
    /// never its bytes: chunk sizes are the sender's choice).
    pub likely_same_host: bool,
    /// Whether a transfer to it has had all its lanes opened ([`crate::service`]'s owners do
    /// on the first transfer, as MORI-IO does, so the next small transfers find their lanes
    /// up instead of each paying a dial).
    pub opened: AtomicBool,
    /// Express writes to it ([`super::express`]).
    pub express: super::express::Express,
}

impl Peer {
    /// A peer no lane has reached yet.
    pub fn new(key: Arc<str>, addr: SocketAddr, likely_same_host: bool) -> Self {
        Self {
            key,
            addr,
            same_host: AtomicBool::new(false),
            reached: AtomicBool::new(false),
            fences: AtomicBool::new(false),
            likely_same_host,
            opened: AtomicBool::new(false),
            express: Default::default(),
        }
    }
}

impl PartialEq for Peer {
    fn eq(&self, o: &Self) -> bool {
        self.key == o.key && self.addr == o.addr
    }
}

impl Eq for Peer {}

/// A transfer as the application thread hands it to its owner shard.
#[derive(Debug)]
pub(crate) struct Submission {
    pub peer: Arc<Peer>,
    pub op: Op,
    pub uid: u64,
    pub local: SharedRegion,
    pub remote_mem: u32,
    /// The remote region's access key, from its `MemoryDesc`; every chunk carries it.
    pub remote_key: AccessKey,
    /// Whether the remote region is GPU memory (its `MemoryDesc::loc`).
    pub remote_device: bool,
    /// Checked segments, expanded into pieces by the owner.
    pub layout: Layout,
    pub total: u64,
    pub deadline_ns: u64,
    pub status: Arc<TransferStatus>,
}

impl Submission {
    /// The transfer as an express write would send it.
    pub fn candidate(&self) -> super::express::Candidate<'_> {
        super::express::Candidate {
            op: self.op,
            uid: self.uid,
            local: &self.local,
            remote_mem: self.remote_mem,
            remote_key: self.remote_key,
            remote_device: self.remote_device,
            layout: &self.layout,
            total: self.total,
            deadline_ns: self.deadline_ns,
            status: &self.status,
        }
    }
}

/// Work for one lane, sent by a transfer's owner to the lane's shard.
#[derive(Debug)]
pub(crate) struct LaneWork {
    pub peer: Arc<Peer>,
    pub lane: u16,
    pub items: Vec<Item<SharedRegion>>,
}

/// What a lane reports to a transfer's owner.
#[derive(Debug)]
pub(crate) struct LaneEvent {
    pub peer: Arc<str>,
    pub to: TransferRef,
    pub report: Report,
}

/// Everything a shard can be asked to do.
#[derive(Debug)]
pub(crate) enum ShardMsg {
    /// A new transfer this shard owns.
    Submit(Box<Submission>),
    /// Chunks (or a FINISH) to send on one of this shard's lanes.
    LaneWork(Box<LaneWork>),
    /// An express transfer's answer is coming to one of this shard's lanes: be awake and
    /// polling when it does (sent by the submitting thread; a no-op on a busy shard).
    Expect,
    /// Wake the writer of one of this shard's lanes: an express frame waits in its port
    /// ([`crate::transport::express_port::Put::Spilled`]).
    WakeWriter { peer: Arc<str>, lane: u16 },
    /// A lane's report about a transfer this shard owns.
    Owner(Box<LaneEvent>),
    /// A transfer ended early (timeout, lost lane): drop its queued and pending chunks, and
    /// reset a lane that may still carry its bytes. `why` is its failure, named when a lane
    /// has to close for it. `ack_to`: the owner waits for [`ShardMsg::Fenced`] before it
    /// reports the failure (a write failed by its deadline, any failed read: sent once
    /// nothing of it can land here any more). `finish`: a write that failed early, fenced
    /// on each lane that carried its chunks (and on its home lane, the second field) by a
    /// FINISH instead of a reset ([`crate::proto::lane::LaneBook::fence`]).
    Cancel {
        peer: Arc<str>,
        uid: u64,
        gen: u64,
        why: Arc<str>,
        ack_to: Option<usize>,
        finish: Option<(FinishSpec, u16)>,
    },
    /// A lane shard has done [`ShardMsg::Cancel`] for a transfer this shard owns, queuing
    /// `finishes` fences whose answers ([`Report::Fenced`]) the owner still waits for.
    Fenced {
        peer: Arc<str>,
        uid: u64,
        gen: u64,
        finishes: u32,
    },
    /// Replicate a registered region; answer on the channel once resolvable here.
    AddRegion(SharedRegion, mpsc::Sender<()>),
    /// Forget a region; answer once no new chunk can resolve it here.
    RemoveRegion(u32, mpsc::Sender<()>),
    /// Close every lane to this peer (it was deregistered).
    DropPeer(Arc<str>),
    /// Open lane `lane` to `peer` now if it is not open (its first transfer then pays no
    /// dial); `ready` turns `SUCCESS` with the lane's transport as its message once it is up,
    /// or an error with the reason it could not be opened.
    Connect {
        peer: Arc<Peer>,
        lane: u16,
        ready: Arc<TransferStatus>,
    },
    /// Serve a connection a peer opened (accepted, its handshake done and admitted by shard
    /// 0; the admission is given back when the connection ends).
    Adopt(Handoff, Hello, super::admission::Admitted),
    /// Answer with a snapshot of this shard's statistics.
    Stats(mpsc::Sender<ShardStats>),
}
