//! Engine statistics: per-shard counters and latency histograms, merged on request.
//!
//! Each shard owns its own [`ShardStats`] (no sharing, no atomics on the data path); a stats
//! request collects a snapshot from every shard and [`EngineStats`] merges them.
//!
//! Byte counters count payload bytes (the memory moved, not frame headers), each on the shard
//! whose connection carried them. An engine is an initiator on the connections it dialed and
//! a target on those peers dialed; `bytes_sent` and `bytes_received` count both roles, and
//! the `inbound_*` counters are the target's share of them:
//!
//! | the engine ... | `bytes_sent` | `bytes_received` | also counted in |
//! |---|---|---|---|
//! | writes to a peer (initiator) | ✓ | | |
//! | reads from a peer (initiator) | | ✓ | |
//! | is written by a peer (target) | | ✓ | `inbound_bytes_written` |
//! | is read by a peer (target) | ✓ | | `inbound_bytes_read` |
//!
//! Each shard also counts these per peer (engine key) and its lanes per lane index
//! ([`peers`]): [`ShardStats::peers`], summed over shards by [`EngineStats::per_peer`].

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

mod peers;

pub(crate) use peers::PeerSlot;
pub use peers::{LaneStats, PeerMap, PeerStats};

/// Highest latency a histogram records exactly (1 hour in µs); larger values saturate.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// One shard's counters and its owned transfers' latency (see the module's table for what
/// each byte counter counts). Its `Debug` form summarises the histogram as count, p50, p99
/// and max.
#[derive(Clone)]
pub struct ShardStats {
    /// The shard, or [`ShardStats::TOTAL`] in [`EngineStats::total`]'s sum (check with
    /// [`ShardStats::is_total`]).
    pub shard: usize,
    /// Transfers this shard owned that ended in SUCCESS.
    pub transfers_ok: u64,
    /// Transfers this shard owned that ended in an error.
    pub transfers_failed: u64,
    /// Payload bytes this shard sent to peers: the data of this engine's writes (as
    /// initiator) and the data peers read from it (as target, also in `inbound_bytes_read`).
    pub bytes_sent: u64,
    /// Payload bytes this shard received from peers and placed in registered memory: the
    /// data of this engine's reads (as initiator) and the data peers wrote into it (as
    /// target, also in `inbound_bytes_written`).
    pub bytes_received: u64,
    /// Payload bytes peers wrote into this engine's regions on this shard's connections (the
    /// target's share of `bytes_received`).
    pub inbound_bytes_written: u64,
    /// Payload bytes peers read from this engine's regions on this shard's connections (the
    /// target's share of `bytes_sent`).
    pub inbound_bytes_read: u64,
    /// Inbound transfers this shard finished (inbound statuses it recorded).
    pub inbound_transfers: u64,
    /// Of those, multi-chunk ones: this shard served the chunk that completed the join and
    /// answered COMPLETE for the whole transfer.
    pub joined_transfers: u64,
    /// Submission-to-completion latency of owned transfers, in µs.
    pub latency_us: Histogram<u64>,
    /// Target side: how long the shard took to serve each chunk of peers' transfers (from
    /// its frame read to its answer queued: the payload received and placed, or read data
    /// sent), in µs.
    pub inbound_latency_us: Histogram<u64>,
    /// Pinned GPU staging memory this shard holds.
    pub gpu_staging_bytes: usize,
    /// Most GPU staging memory this shard had in use at once.
    pub gpu_staging_peak_bytes: usize,
    /// GPU payload bytes this shard moved through pinned staging (sent or received).
    pub gpu_staged_bytes: u64,
    /// GPU payload bytes this shard moved device to device with a same-host peer (its own
    /// memory copied by the peer, or the peer's copied by this shard): no staging.
    pub gpu_ipc_bytes: u64,
    /// GPU payloads this shard offered a same-host peer as device parts that the peer
    /// declined (then staged): a host destination, or a handle it cannot open.
    pub gpu_ipc_declined: u64,
    /// Chunks received into GPU memory through staging whose last copies into device memory
    /// ran while the connection read the next frame (answered after it, not waited for).
    pub gpu_overlapped_landings: u64,
    /// Chunks sent from GPU memory through staging whose first copy out of device memory
    /// was issued while the frame before them was sent (copied ahead).
    pub gpu_copies_ahead: u64,
    /// Socket reads woken by the shard's busy poller (spinning shards only).
    pub busy_poll_wakes: u64,
    /// Times this shard stopped busy polling because it was preempted (its CPU was wanted
    /// by another thread); it then parks like a shard that does not spin, for 50 ms.
    pub busy_poll_backoffs: u64,
    /// Times this shard's busy poller, offering its CPU while it had nothing to do
    /// (`sched_yield`), found that another thread had taken it: a thread (the application's,
    /// another shard's) shares the shard's CPU.
    pub busy_poll_handoffs: u64,
    /// Doorbells rung for same-host peers whose readers were parked (a shared-memory ring
    /// read by a spinning shard needs none): by this shard, or by express writes into the
    /// rings of its lanes.
    pub same_host_doorbells: u64,
    /// Times a send of this shard found a same-host peer's ring full and waited for room (a
    /// slow path: a peer that reads slowly, or rings too small for the traffic).
    pub same_host_ring_full_waits: u64,
    /// Express writes answered on this shard's lanes: small writes the submitting
    /// application thread sent itself on one of them, into a same-host peer's ring or on a
    /// TCP socket (no hop through an owner shard; counted in `transfers_ok` /
    /// `transfers_failed` here too).
    pub express_writes: u64,
    /// Express reads answered on this shard's lanes: small reads the submitting thread
    /// sent itself, as express writes are (counted in the transfer counters too).
    pub express_reads: u64,
    /// Lanes this shard connected (handshake done); more than its lanes means reconnects.
    pub lane_connects: u64,
    /// Of those, lanes on the same-host transport (a peer of this host; the rest are TCP).
    pub lane_connects_same_host: u64,
    /// Of those, lanes whose records travel through shared-memory rings (protocol v9 and
    /// later; the rest of the same-host lanes use the socket).
    pub lane_connects_ring: u64,
    /// Lanes of this shard that failed (a dial, a send or a receive failed, the peer closed
    /// or broke the protocol); closes on purpose (shutdown, a deregistered peer) are not
    /// counted.
    pub lane_failures: u64,
    /// WRITE chunks this shard, as a target, dropped unplaced: they had waited unread on a
    /// lane the initiator then reset, because that write failed by its deadline there
    /// (placing them would overwrite what the application wrote since). Each also closes
    /// its connection, with a warning.
    pub inbound_writes_dropped: u64,
    /// Striped writes this shard owned that failed early (a lost lane, a refused staging
    /// copy) and were fenced by FINISH on the lanes that carried their chunks before their
    /// failure was reported (protocol v11).
    pub writes_fenced: u64,
    /// Of those, the ones whose FINISHes were not all answered in time (2 s, or the
    /// deadline): their lanes were reset instead (a target stuck or far behind).
    pub fences_timed_out: u64,
    /// FINISHes this shard, as a target, answered only once a chunk of their transfer that
    /// another connection was placing had landed (a lane lost mid-chunk: its last chunk's
    /// copies still ran).
    pub finishes_held: u64,
    /// Transfers, bytes, inbound transfers, lane connects and failures per peer (engine
    /// key), and lane connects and failures per lane index ([`PeerStats`]): at most
    /// [`PeerMap::MAX_PEERS_PER_SHARD`] peers per shard, later ones under
    /// [`PeerMap::OTHER_PEER`]. In [`EngineStats::total`]'s sum, every shard's summed per
    /// peer.
    pub peers: PeerMap,
}

impl ShardStats {
    /// The `shard` of [`EngineStats::total`]'s sum, which is no shard.
    pub const TOTAL: usize = usize::MAX;

    /// Whether these are [`EngineStats::total`]'s sum rather than one shard's.
    pub fn is_total(&self) -> bool {
        self.shard == Self::TOTAL
    }

    /// Empty statistics for `shard`.
    pub fn new(shard: usize) -> Self {
        Self {
            shard,
            transfers_ok: 0,
            transfers_failed: 0,
            bytes_sent: 0,
            bytes_received: 0,
            inbound_bytes_written: 0,
            inbound_bytes_read: 0,
            inbound_transfers: 0,
            joined_transfers: 0,
            latency_us: new_histogram(),
            inbound_latency_us: new_histogram(),
            gpu_staging_bytes: 0,
            gpu_staging_peak_bytes: 0,
            gpu_staged_bytes: 0,
            gpu_ipc_bytes: 0,
            gpu_ipc_declined: 0,
            gpu_overlapped_landings: 0,
            gpu_copies_ahead: 0,
            busy_poll_wakes: 0,
            busy_poll_backoffs: 0,
            busy_poll_handoffs: 0,
            same_host_doorbells: 0,
            same_host_ring_full_waits: 0,
            express_writes: 0,
            express_reads: 0,
            lane_connects: 0,
            lane_connects_same_host: 0,
            lane_connects_ring: 0,
            lane_failures: 0,
            inbound_writes_dropped: 0,
            writes_fenced: 0,
            fences_timed_out: 0,
            finishes_held: 0,
            peers: PeerMap::default(),
        }
    }

    /// The slot of `key`'s per-peer counters, which the counting methods take.
    pub(crate) fn peer(&mut self, key: &std::sync::Arc<str>) -> PeerSlot {
        self.peers.slot(key)
    }

    /// Count `n` payload bytes of this engine's writes sent to `peer`.
    pub(crate) fn count_sent(&mut self, peer: PeerSlot, n: u64) {
        self.bytes_sent += n;
        self.peers.at(peer).bytes_sent += n;
    }

    /// Count `n` payload bytes of this engine's reads received from `peer` (placed).
    pub(crate) fn count_received(&mut self, peer: PeerSlot, n: u64) {
        self.bytes_received += n;
        self.peers.at(peer).bytes_received += n;
    }

    /// Count `n` payload bytes `peer` wrote into this engine (placed).
    pub(crate) fn count_inbound_write(&mut self, peer: PeerSlot, n: u64) {
        self.inbound_bytes_written += n;
        self.bytes_received += n;
        let p = self.peers.at(peer);
        p.inbound_bytes_written += n;
        p.bytes_received += n;
    }

    /// Count `n` payload bytes sent to `peer`, which reads this engine's memory.
    pub(crate) fn count_inbound_read(&mut self, peer: PeerSlot, n: u64) {
        self.inbound_bytes_read += n;
        self.bytes_sent += n;
        let p = self.peers.at(peer);
        p.inbound_bytes_read += n;
        p.bytes_sent += n;
    }

    /// Count an inbound transfer of `peer` finished here (`joined`: a multi-chunk one this
    /// shard answered for).
    pub(crate) fn count_inbound_transfer(&mut self, peer: PeerSlot, joined: bool) {
        self.inbound_transfers += 1;
        self.joined_transfers += joined as u64;
        self.peers.at(peer).inbound_transfers += 1;
    }

    /// Count a connect of lane `lane` to `peer` (`same_host`: on the same-host transport;
    /// `ring`: its records in a shared-memory ring).
    pub(crate) fn count_lane_connect(
        &mut self,
        peer: PeerSlot,
        lane: u16,
        same_host: bool,
        ring: bool,
    ) {
        self.lane_connects += 1;
        self.lane_connects_same_host += same_host as u64;
        self.lane_connects_ring += ring as u64;
        self.peers.at(peer).lane_connected(lane);
    }

    /// Count a failure of lane `lane` to `peer`.
    pub(crate) fn count_lane_failure(&mut self, peer: PeerSlot, lane: u16) {
        self.lane_failures += 1;
        self.peers.at(peer).lane_failed(lane);
    }

    /// Record how long serving one inbound chunk took.
    pub(crate) fn record_inbound_chunk(&mut self, us: u64) {
        self.inbound_latency_us
            .saturating_record(us.min(MAX_LATENCY_US));
    }

    /// Record the end of an owned transfer with `peer`.
    pub(crate) fn record_transfer(&mut self, peer: PeerSlot, ok: bool, latency_us: u64) {
        let p = self.peers.at(peer);
        if ok {
            self.transfers_ok += 1;
            p.transfers_ok += 1;
        } else {
            self.transfers_failed += 1;
            p.transfers_failed += 1;
        }
        self.latency_us
            .saturating_record(latency_us.min(MAX_LATENCY_US));
    }
}

impl std::fmt::Debug for ShardStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ShardStats");
        if self.is_total() {
            d.field("shard", &format_args!("total"));
        } else {
            d.field("shard", &self.shard);
        }
        d.field("transfers_ok", &self.transfers_ok)
            .field("transfers_failed", &self.transfers_failed)
            .field("bytes_sent", &self.bytes_sent)
            .field("bytes_received", &self.bytes_received)
            .field("inbound_bytes_written", &self.inbound_bytes_written)
            .field("inbound_bytes_read", &self.inbound_bytes_read)
            .field("inbound_transfers", &self.inbound_transfers)
            .field("joined_transfers", &self.joined_transfers)
            .field("latency_us", &Latency(&self.latency_us))
            .field("inbound_latency_us", &Latency(&self.inbound_latency_us))
            .field("gpu_staging_bytes", &self.gpu_staging_bytes)
            .field("gpu_staging_peak_bytes", &self.gpu_staging_peak_bytes)
            .field("gpu_staged_bytes", &self.gpu_staged_bytes)
            .field("gpu_ipc_bytes", &self.gpu_ipc_bytes)
            .field("gpu_ipc_declined", &self.gpu_ipc_declined)
            .field("gpu_overlapped_landings", &self.gpu_overlapped_landings)
            .field("gpu_copies_ahead", &self.gpu_copies_ahead)
            .field("busy_poll_wakes", &self.busy_poll_wakes)
            .field("busy_poll_backoffs", &self.busy_poll_backoffs)
            .field("busy_poll_handoffs", &self.busy_poll_handoffs)
            .field("same_host_doorbells", &self.same_host_doorbells)
            .field("same_host_ring_full_waits", &self.same_host_ring_full_waits)
            .field("express_writes", &self.express_writes)
            .field("express_reads", &self.express_reads)
            .field("lane_connects", &self.lane_connects)
            .field("lane_connects_same_host", &self.lane_connects_same_host)
            .field("lane_connects_ring", &self.lane_connects_ring)
            .field("lane_failures", &self.lane_failures)
            .field("inbound_writes_dropped", &self.inbound_writes_dropped)
            .field("writes_fenced", &self.writes_fenced)
            .field("fences_timed_out", &self.fences_timed_out)
            .field("finishes_held", &self.finishes_held)
            .field("peers", &self.peers.len())
            .finish()
    }
}

/// A latency histogram in a few numbers: `{ count: 3, p50: 10, p99: 1000, max: 1000 }`.
struct Latency<'a>(&'a Histogram<u64>);

impl std::fmt::Debug for Latency<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = self.0;
        write!(
            f,
            "{{ count: {}, p50: {}, p99: {}, max: {} }}",
            h.len(),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.max()
        )
    }
}

fn new_histogram() -> Histogram<u64> {
    // 3 significant digits over 1 µs .. 1 h: fixed bounds, so recording never resizes.
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).unwrap_or_else(|_| {
        Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant digits is valid"))
    })
}

/// Every shard's statistics, and their sum.
#[derive(Debug, Clone)]
pub struct EngineStats {
    /// Per shard, in shard order.
    pub shards: Vec<ShardStats>,
}

impl EngineStats {
    /// The sum over shards (the histogram merged); its `shard` is [`ShardStats::TOTAL`].
    pub fn total(&self) -> ShardStats {
        let mut t = ShardStats::new(ShardStats::TOTAL);
        for s in &self.shards {
            t.transfers_ok += s.transfers_ok;
            t.transfers_failed += s.transfers_failed;
            t.bytes_sent += s.bytes_sent;
            t.bytes_received += s.bytes_received;
            t.inbound_bytes_written += s.inbound_bytes_written;
            t.inbound_bytes_read += s.inbound_bytes_read;
            t.inbound_transfers += s.inbound_transfers;
            t.joined_transfers += s.joined_transfers;
            t.gpu_staging_bytes += s.gpu_staging_bytes;
            t.gpu_staging_peak_bytes += s.gpu_staging_peak_bytes;
            t.gpu_staged_bytes += s.gpu_staged_bytes;
            t.gpu_ipc_bytes += s.gpu_ipc_bytes;
            t.gpu_ipc_declined += s.gpu_ipc_declined;
            t.gpu_overlapped_landings += s.gpu_overlapped_landings;
            t.gpu_copies_ahead += s.gpu_copies_ahead;
            t.busy_poll_wakes += s.busy_poll_wakes;
            t.busy_poll_backoffs += s.busy_poll_backoffs;
            t.busy_poll_handoffs += s.busy_poll_handoffs;
            t.same_host_doorbells += s.same_host_doorbells;
            t.same_host_ring_full_waits += s.same_host_ring_full_waits;
            t.express_writes += s.express_writes;
            t.express_reads += s.express_reads;
            t.lane_connects += s.lane_connects;
            t.lane_connects_same_host += s.lane_connects_same_host;
            t.lane_connects_ring += s.lane_connects_ring;
            t.lane_failures += s.lane_failures;
            t.inbound_writes_dropped += s.inbound_writes_dropped;
            t.writes_fenced += s.writes_fenced;
            t.fences_timed_out += s.fences_timed_out;
            t.finishes_held += s.finishes_held;
            t.peers.add(&s.peers);
            // Same bounds on every shard, so adding cannot fail.
            let _ = t.latency_us.add(&s.latency_us);
            let _ = t.inbound_latency_us.add(&s.inbound_latency_us);
        }
        t
    }

    /// Every peer's counters summed over shards, by engine key (see [`ShardStats::peers`]).
    pub fn per_peer(&self) -> BTreeMap<String, PeerStats> {
        let mut all = PeerMap::default();
        for s in &self.shards {
            all.add(&s.peers);
        }
        all.to_sorted()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn totals_add_up() {
        let mut a = ShardStats::new(0);
        let mut b = ShardStats::new(1);
        let (x, y): (Arc<str>, Arc<str>) = ("x".into(), "y".into());
        let (ax, bx, by) = (a.peer(&x), b.peer(&x), b.peer(&y));
        a.record_transfer(ax, true, 10);
        b.record_transfer(bx, false, 1000);
        b.record_transfer(by, true, u64::MAX);
        a.count_sent(ax, 5);
        b.count_inbound_read(by, 7);
        b.count_inbound_transfer(by, true);
        b.count_lane_connect(bx, 1, false, false);
        let stats = EngineStats { shards: vec![a, b] };
        let t = stats.total();
        assert_eq!(
            (t.transfers_ok, t.transfers_failed, t.bytes_sent),
            (2, 1, 12)
        );
        assert_eq!((t.inbound_bytes_read, t.joined_transfers), (7, 1));
        assert_eq!(t.latency_us.len(), 3);
        assert!(t.latency_us.max() >= MAX_LATENCY_US / 2);
        assert!(t.is_total());
        // Per peer, summed over shards: the same figures, split.
        let p = stats.per_peer();
        assert_eq!(p.keys().collect::<Vec<_>>(), ["x", "y"]);
        let (px, py) = (&p["x"], &p["y"]);
        assert_eq!(
            (px.transfers_ok, px.transfers_failed, px.bytes_sent),
            (1, 1, 5)
        );
        assert_eq!((px.lane_connects, px.lanes[&1].connects), (1, 1));
        assert_eq!(
            (py.transfers_ok, py.bytes_sent, py.inbound_bytes_read),
            (1, 7, 7)
        );
        assert_eq!(py.inbound_transfers, 1);
        assert_eq!(t.peers.get("x"), Some(px));
        assert_eq!(t.peers.len(), 2);
    }

    #[test]
    fn debug_is_concise_and_names_the_total() {
        let mut a = ShardStats::new(3);
        let p = a.peer(&"p".into());
        for us in [10, 20, 1000] {
            a.record_transfer(p, true, us);
        }
        let one = format!("{a:?}");
        assert!(
            one.starts_with("ShardStats { shard: 3, transfers_ok: 3,"),
            "{one}"
        );
        assert!(
            one.contains("latency_us: { count: 3, p50: 20, p99: 1000, max: 1000 }"),
            "{one}"
        );
        assert!(one.len() < 880, "{} bytes: {one}", one.len());
        let t = format!("{:?}", EngineStats { shards: vec![a] }.total());
        assert!(t.starts_with("ShardStats { shard: total,"), "{t}");
        assert!(!t.contains(&usize::MAX.to_string()), "{t}");
    }
}
