//! The per-shard service: everything one core does for the engine. It owns the transfers
//! whose owner it is, the lanes (connections to peers) assigned to it, the connections peers
//! opened to it, and a replica of the region table. It talks to other shards by message only.
//!
//! Flow of a transfer: the application thread validates and plans nothing heavier than a
//! segment list, then sends [`ShardMsg::Submit`] to the owner shard (derived from the uid).
//! The owner cuts the transfer into chunks ([`owner`]), queues them on lanes — its own lane
//! when the transfer fits one, else lanes on every shard ([`ShardMsg::LaneWork`]). Lane shards
//! send frames and report per-chunk results back to the owner ([`ShardMsg::Owner`]), which
//! drives [`crate::proto::outbound::Outbound`] and completes the user's status. On the target,
//! every connection is served by the shard it was handed to ([`serve`]).

mod admission;
mod bell;
pub(crate) mod express;
mod gather;
mod gpu_io;
mod gpu_ipc;
mod join;
mod lane;
mod msg;
mod owner;
mod placing;
mod same_host;
mod serve;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use morio_shards::{rt, Mesh, ShardCtx, ShardId};

use crate::config::TcpBackendConfig;
use crate::inbound_status::InboundStatuses;
use crate::region::SharedRegion;
use crate::stats::ShardStats;
use crate::transport::{Bound, Closer};

pub(crate) use join::Joins;
pub(crate) use msg::{Peer, ShardMsg, Submission};
pub(crate) use placing::Placing;

/// The names of a lane's transports, as a connected lane reports them.
pub(crate) mod lane_transport {
    pub(crate) use super::lane::{SAME_HOST, SAME_HOST_RING, TCP};
}

/// The connection caps of a backend with `cfg`.
pub(crate) fn admission_for(cfg: &TcpBackendConfig) -> admission::Admission {
    admission::Admission::new(
        cfg.max_handshakes,
        cfg.max_connections,
        cfg.max_connections_per_peer,
    )
}

/// Nanoseconds since the process-wide epoch: the time base of every deadline.
pub(crate) fn now_ns() -> u64 {
    ns_at(Instant::now())
}

/// [`now_ns`] of the instant `at` (for a caller that needs the [`Instant`] too).
pub(crate) fn ns_at(at: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    at.saturating_duration_since(*EPOCH.get_or_init(Instant::now))
        .as_nanos() as u64
}

/// What every shard shares (read-only after start, or internally synchronised).
#[derive(Debug)]
pub(crate) struct Shared {
    pub key: String,
    /// Drawn at start, sent in every HELLO ([`crate::proto::frame::Hello::instance`]).
    pub instance: u64,
    pub cfg: TcpBackendConfig,
    pub inbound: Arc<InboundStatuses>,
    /// The transport the backend dials and accepts with.
    pub transport: crate::transport::Kind,
    /// Where the engine accepts connections, taken by shard 0 when it starts.
    pub listener: Mutex<Option<Bound>>,
    /// Per owner shard, the lowest generation among the transfers it still owns (or its next
    /// generation when it owns none): every transfer of that shard below it has ended. Lanes
    /// read it to forget chunks that get no answer of their own without being told.
    pub low_water: Box<[AtomicU64]>,
    /// Caps on served connections (in their handshake, in total, per peer).
    pub admission: Arc<admission::Admission>,
    /// Target side: the joins of multi-chunk transfers, whichever shards serve their chunks.
    pub joins: join::Joins,
    /// Target side: the chunks of multi-chunk WRITEs each shard is placing (a FINISH waits
    /// for its transfer's).
    pub placing: placing::Placing,
    /// Peers (engine keys) the same-host transport could not be set up with: their
    /// connections are TCP from then on, and the reason was logged once.
    pub same_host_failed: Mutex<std::collections::HashSet<String>>,
}

impl Shared {
    /// Whether this backend uses the same-host transport, and how.
    pub fn same_host(&self) -> crate::config::SameHost {
        match self.transport {
            crate::transport::Kind::Tcp => self.cfg.same_host.unwrap_or_default(),
            #[cfg(any(test, feature = "testing"))]
            crate::transport::Kind::InProcess => crate::config::SameHost::Off,
        }
    }

    /// Note that the same-host transport failed with `peer` (logged once per peer): its
    /// connections use TCP from now on.
    pub fn same_host_failed(&self, peer: &str, why: &str) {
        let first = self
            .same_host_failed
            .lock()
            .map(|mut s| s.insert(peer.to_string()))
            .unwrap_or(false);
        if first {
            log::warn!(
                "engine {}: same-host transport with {peer:?} unavailable, using TCP: {why}",
                self.key
            );
        }
    }

    /// Whether the same-host transport already failed with `peer`.
    pub fn same_host_known_failed(&self, peer: &str) -> bool {
        self.same_host_failed
            .lock()
            .map(|s| s.contains(peer))
            .unwrap_or(false)
    }

    /// Whether the transfer of generation `gen` owned by shard `owner` may still be running.
    pub fn may_run(&self, owner: ShardId, gen: u64) -> bool {
        self.low_water
            .get(owner)
            .is_none_or(|w| gen >= w.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Shards that own transfers: each of them also owns at least one lane per peer.
    pub fn n_owners(&self, n_shards: usize) -> usize {
        n_shards.min(self.cfg.num_data_conns).max(1)
    }
}

/// One shard's state. `Rc`-shared by the shard's tasks; never leaves its thread.
pub(crate) struct Shard {
    pub id: ShardId,
    pub mesh: Mesh<ShardMsg>,
    pub shared: Arc<Shared>,
    pub regions: RefCell<HashMap<u32, SharedRegion>>,
    pub owner: RefCell<owner::OwnerTable>,
    pub lanes: RefCell<lane::LaneMap>,
    /// Lanes that died while their reader was still placing read data (its copies into GPU
    /// memory running): a cancelled read still waits for those, until the reader ends.
    pub dying_lanes: RefCell<Vec<Rc<lane::Lane>>>,
    pub next_gen: Cell<u64>,
    pub closing: Cell<bool>,
    /// Connections peers opened to this shard (and ones still in handshake), so shutdown
    /// can close them.
    pub served: RefCell<HashMap<u64, Closer>>,
    pub next_conn: Cell<u64>,
    /// Tasks still running on this shard; shutdown waits for them so no socket outlives it.
    pub live_tasks: Cell<usize>,
    /// Rung when the last live task ends.
    pub tasks_done: bell::Bell,
    /// Rung when this shard comes to own a transfer while it owned none: its deadline tick
    /// runs only while it owns something ([`tick_loop`]).
    pub owns_work: bell::Bell,
    /// This shard's statistics.
    pub stats: RefCell<ShardStats>,
    /// GPU streams and staging, created on the first GPU transfer.
    pub gpu: RefCell<gpu_io::GpuShard>,
}

/// Counts a task as live for as long as it exists.
pub(crate) struct TaskGuard(Rc<Shard>);

impl TaskGuard {
    pub fn new(shard: &Rc<Shard>) -> Self {
        shard.live_tasks.set(shard.live_tasks.get() + 1);
        Self(shard.clone())
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let left = self.0.live_tasks.get() - 1;
        self.0.live_tasks.set(left);
        if left == 0 {
            self.0.tasks_done.ring();
        }
    }
}

/// Registers a served connection for the lifetime of the guard.
pub(crate) struct ServedConn {
    shard: Rc<Shard>,
    id: u64,
}

impl ServedConn {
    pub fn new(shard: &Rc<Shard>, closer: Closer) -> Self {
        let id = shard.next_conn.get();
        shard.next_conn.set(id + 1);
        shard.served.borrow_mut().insert(id, closer);
        Self {
            shard: shard.clone(),
            id,
        }
    }
}

impl Drop for ServedConn {
    fn drop(&mut self) {
        self.shard.served.borrow_mut().remove(&self.id);
    }
}

impl Shard {
    pub fn n_shards(&self) -> usize {
        self.mesh.n_shards()
    }

    /// The shard that runs lane `lane` of every peer.
    pub fn lane_shard(&self, lane: u16) -> ShardId {
        lane as usize % self.n_shards()
    }

    /// Deliver a message to `to`, handling it inline when `to` is this shard.
    pub fn send(self: &Rc<Self>, to: ShardId, msg: ShardMsg) {
        if to == self.id {
            self.handle(msg);
        } else if let Err(m) = self.mesh.send(to, msg) {
            // The pool is shutting down; whatever the message carried fails with it.
            log::debug!("shard {to} gone, dropping {m:?}");
        }
    }

    fn handle(self: &Rc<Self>, msg: ShardMsg) {
        match msg {
            ShardMsg::Submit(s) => owner::submit(self, *s),
            ShardMsg::LaneWork(w) => lane::enqueue(self, *w),
            ShardMsg::Expect => rt::note_activity(),
            ShardMsg::WakeWriter { peer, lane } => {
                rt::note_activity();
                lane::wake_writer(self, &peer, lane)
            }
            ShardMsg::Owner(ev) => owner::on_event(self, *ev),
            ShardMsg::Cancel {
                peer,
                uid,
                gen,
                why,
                ack_to,
                finish,
            } => {
                lane::cancel(self, &peer, (uid, gen), &why, ack_to, finish);
            }
            ShardMsg::Fenced {
                peer,
                uid,
                gen,
                finishes,
            } => owner::fenced(self, &peer, (uid, gen), finishes),
            ShardMsg::AddRegion(r, ack) => {
                self.regions.borrow_mut().insert(r.id, r.clone());
                let _ = ack.send(());
                // After the ack: registration does not wait for it.
                gpu_io::prewarm(self, &r);
            }
            ShardMsg::RemoveRegion(id, ack) => {
                self.regions.borrow_mut().remove(&id);
                let _ = ack.send(());
            }
            ShardMsg::DropPeer(key) => lane::drop_peer(self, &key),
            ShardMsg::Connect { peer, lane, ready } => lane::open(self, &peer, lane, ready),
            ShardMsg::Adopt(conn, hello, admitted) => serve::adopt(self, conn, hello, admitted),
            ShardMsg::Stats(tx) => {
                let mut st = self.stats.borrow().clone();
                (st.gpu_staging_bytes, st.gpu_staging_peak_bytes) =
                    self.gpu.borrow().staging_bytes();
                st.busy_poll_wakes = rt::busy_poll_wakes();
                st.busy_poll_backoffs = rt::busy_poll_backoffs();
                st.busy_poll_handoffs = rt::busy_poll_handoffs();
                let rings = crate::transport::local::ring_counts();
                st.same_host_doorbells = rings.doorbells;
                st.same_host_ring_full_waits = rings.full_waits;
                let _ = tx.send(st);
            }
        }
    }
}

/// The shard's main future: serve messages until the pool closes, then fail what is left.
pub(crate) async fn run(ctx: ShardCtx<ShardMsg>, shared: Arc<Shared>) {
    let shard = Rc::new(Shard {
        id: ctx.id,
        mesh: ctx.mesh.clone(),
        shared,
        regions: RefCell::new(HashMap::new()),
        owner: RefCell::new(owner::OwnerTable::default()),
        lanes: RefCell::new(HashMap::new()),
        dying_lanes: RefCell::new(Vec::new()),
        next_gen: Cell::new(0),
        closing: Cell::new(false),
        served: RefCell::new(HashMap::new()),
        next_conn: Cell::new(0),
        live_tasks: Cell::new(0),
        tasks_done: bell::Bell::default(),
        owns_work: bell::Bell::default(),
        stats: RefCell::new(ShardStats::new(ctx.id)),
        gpu: RefCell::new(gpu_io::GpuShard::default()),
    });
    let listener = shard
        .shared
        .listener
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(l) = listener {
        rt::spawn_local(serve::accept_loop(shard.clone(), l)).detach();
    }
    let ticker = rt::spawn_local(tick_loop(shard.clone()));
    while let Ok(msg) = ctx.recv().await {
        if ctx.inbox.is_closed() {
            shard.closing.set(true);
        }
        shard.handle(msg);
    }
    shard.closing.set(true);
    drop(ticker);
    owner::fail_all(&shard, "engine shut down");
    lane::close_all(&shard);
    for closer in shard.served.borrow().values() {
        // Registered by a live ServedConn, whose task still owns the connection.
        closer.close();
    }
    // Let every task see its connection close and drop it, so nothing outlives the engine:
    // the last one to end rings `tasks_done`.
    let all_ended = async {
        while shard.live_tasks.get() > 0 {
            if shard.tasks_done.wait().await.is_err() {
                break;
            }
        }
    };
    rt::timeout(Duration::from_secs(2), all_ended).await;
    if shard.live_tasks.get() > 0 {
        log::warn!(
            "shard {}: {} tasks still running at shutdown",
            shard.id,
            shard.live_tasks.get()
        );
    }
}

/// How often a shard that owns no transfer still wakes for the engine's slow upkeep (the
/// sweeps below). Every wake-up of a parked shard costs it tens to hundreds of microseconds
/// of CPU on the VMs we run on (the runtime's memory barrier interrupts every other thread of
/// the process), so idle shards tick rarely: a dozen idle shards ticking every 20 ms used a
/// tenth of a core (`tests/engine/spin.rs`, `idle_engines_burn_no_cpu`).
const IDLE_TICK: Duration = Duration::from_secs(1);

/// Deadlines of the transfers this shard owns (every `op_timeout / 20`, 1 to 20 ms, while it
/// owns any), and the engine's upkeep on shard 0.
async fn tick_loop(shard: Rc<Shard>) {
    let every = (shard.shared.cfg.op_timeout / 20)
        .clamp(Duration::from_millis(1), Duration::from_millis(20));
    let mut swept = now_ns();
    // Express writes ride this shard's lanes (they fail on its tick when unanswered; one
    // submitted while this loop idles waits at most an idle tick longer than its deadline).
    let mut express_waiting = false;
    loop {
        if shard.owner.borrow().is_empty() && !express_waiting {
            // A ring left from earlier work only costs one extra turn of this loop.
            let _ = rt::timeout(IDLE_TICK, shard.owns_work.wait()).await;
        } else {
            rt::sleep(every).await;
        }
        let now = now_ns();
        owner::tick(&shard, now);
        express_waiting = lane::expire_express(&shard, now);
        // Joins outlive their initiator's deadline only when a chunk was lost; one shard
        // prunes the engine's table.
        if shard.id == 0 {
            let max_age = shard.shared.cfg.op_timeout.as_nanos() as u64;
            shard.shared.joins.prune(now, max_age.saturating_mul(2));
            // Once a second: expired inbound statuses of every peer, and the records of
            // peers that hold none and went quiet.
            if now.saturating_sub(swept) >= 1_000_000_000 {
                swept = now;
                shard.shared.inbound.sweep();
                // IPC mappings of same-host peers' GPU memory pin it in the peer: the unused
                // ones close.
                crate::gpu::ipc::sweep_all(crate::gpu::ipc::IDLE_CLOSE);
            }
        }
    }
}
