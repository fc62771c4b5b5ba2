//! Per-peer counters: what one shard did with each remote engine, by its engine key, and
//! per lane index where the engine dialed it.
//!
//! A shard keeps a [`PeerMap`] inside its [`super::ShardStats`]: an entry per peer it moved
//! data with, found once per lane or served connection (a [`PeerSlot`], an index that stays
//! valid because entries are never removed) so that counting a chunk is an index, not a
//! lookup. A peer that went away keeps its counters (a counter that vanished would read as a
//! reset). To bound memory and the number of series, a shard tracks at most
//! [`PeerMap::MAX_PEERS_PER_SHARD`] (1024) peers; those it meets after that are counted
//! together under [`PeerMap::OTHER_PEER`] (`_other`). A peer whose own key is `_other`
//! shares that entry. Summed over shards, an engine may report more peers than one shard
//! tracks.
//!
//! The counters mean what the shard's do (see the table in [`super`]), restricted to one
//! peer: `bytes_sent` counts this engine's writes to the peer and the bytes the peer read
//! from it, `inbound_bytes_read` the latter alone. Summed over peers they are the shard's.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One peer's counters on a shard, or summed over shards ([`super::EngineStats::per_peer`]).
/// Each means what the [`super::ShardStats`] field of the same name does, for this peer only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Transfers this engine started with the peer that ended in SUCCESS.
    pub transfers_ok: u64,
    /// Transfers this engine started with the peer that ended in an error.
    pub transfers_failed: u64,
    /// Payload bytes sent to the peer: this engine's writes, and what the peer read from it
    /// (also in `inbound_bytes_read`).
    pub bytes_sent: u64,
    /// Payload bytes received from the peer and placed: this engine's reads, and what the
    /// peer wrote into it (also in `inbound_bytes_written`).
    pub bytes_received: u64,
    /// Payload bytes the peer wrote into this engine's regions.
    pub inbound_bytes_written: u64,
    /// Payload bytes the peer read from this engine's regions.
    pub inbound_bytes_read: u64,
    /// Transfers of the peer this engine finished as their target (inbound statuses).
    pub inbound_transfers: u64,
    /// Lanes to the peer that connected (the sum over `lanes`).
    pub lane_connects: u64,
    /// Lanes to the peer that failed (the sum over `lanes`; closes on purpose not counted).
    pub lane_failures: u64,
    /// The lanes to the peer, by lane index (`0..num_data_conns`): those this engine dialed.
    pub lanes: BTreeMap<u16, LaneStats>,
}

/// One lane's counters (a lane: one connection this engine dials to a peer, by index).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneStats {
    /// Times the lane connected (handshake done); more than once means it reconnected.
    pub connects: u64,
    /// Times the lane failed.
    pub failures: u64,
}

impl PeerStats {
    /// Add `o`'s counters to these.
    pub(crate) fn add(&mut self, o: &PeerStats) {
        self.transfers_ok += o.transfers_ok;
        self.transfers_failed += o.transfers_failed;
        self.bytes_sent += o.bytes_sent;
        self.bytes_received += o.bytes_received;
        self.inbound_bytes_written += o.inbound_bytes_written;
        self.inbound_bytes_read += o.inbound_bytes_read;
        self.inbound_transfers += o.inbound_transfers;
        self.lane_connects += o.lane_connects;
        self.lane_failures += o.lane_failures;
        for (&i, l) in &o.lanes {
            let mine = self.lanes.entry(i).or_default();
            mine.connects += l.connects;
            mine.failures += l.failures;
        }
    }

    /// Count a connect of lane `lane`.
    pub(crate) fn lane_connected(&mut self, lane: u16) {
        self.lane_connects += 1;
        self.lanes.entry(lane).or_default().connects += 1;
    }

    /// Count a failure of lane `lane`.
    pub(crate) fn lane_failed(&mut self, lane: u16) {
        self.lane_failures += 1;
        self.lanes.entry(lane).or_default().failures += 1;
    }
}

/// Where a peer's counters are in a shard's [`PeerMap`] (valid for that map only, for good:
/// entries are never removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerSlot(usize);

/// Per-peer counters by engine key: one shard's (at most [`Self::MAX_PEERS_PER_SHARD`]
/// peers, plus [`Self::OTHER_PEER`]), or, in [`super::EngineStats::total`], every shard's
/// summed.
#[derive(Clone, Default)]
pub struct PeerMap {
    index: HashMap<Arc<str>, usize>,
    peers: Vec<(Arc<str>, PeerStats)>,
}

impl PeerMap {
    /// Most peers one shard keeps counters of; the ones it meets after that are counted
    /// under [`Self::OTHER_PEER`].
    pub const MAX_PEERS_PER_SHARD: usize = 1024;

    /// The key the peers past [`Self::MAX_PEERS_PER_SHARD`] are counted under.
    pub const OTHER_PEER: &'static str = "_other";

    /// The counters of the peer `key` (`None`: none counted).
    pub fn get(&self, key: &str) -> Option<&PeerStats> {
        self.index.get(key).map(|&i| &self.peers[i].1)
    }

    /// Every peer's counters, in the order the peers were first counted.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &PeerStats)> {
        self.peers.iter().map(|(k, s)| (&**k, s))
    }

    /// Peers counted.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether no peer was counted.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// The slot of `key`'s counters, added if new: under [`Self::OTHER_PEER`] once the map
    /// holds [`Self::MAX_PEERS_PER_SHARD`] peers.
    pub(crate) fn slot(&mut self, key: &Arc<str>) -> PeerSlot {
        if let Some(&i) = self.index.get(key) {
            return PeerSlot(i);
        }
        if self.peers.len() < Self::MAX_PEERS_PER_SHARD {
            return PeerSlot(self.insert(key.clone()));
        }
        match self.index.get(Self::OTHER_PEER) {
            Some(&i) => PeerSlot(i),
            None => PeerSlot(self.insert(Self::OTHER_PEER.into())),
        }
    }

    /// The counters at `slot` (a slot of this map).
    pub(crate) fn at(&mut self, slot: PeerSlot) -> &mut PeerStats {
        &mut self.peers[slot.0].1
    }

    /// Add every peer of `other` (no cap: the sum over shards may hold more peers).
    pub(crate) fn add(&mut self, other: &PeerMap) {
        for (k, s) in &other.peers {
            let i = match self.index.get(k) {
                Some(&i) => i,
                None => self.insert(k.clone()),
            };
            self.peers[i].1.add(s);
        }
    }

    /// Copied out, in key order.
    pub(crate) fn to_sorted(&self) -> BTreeMap<String, PeerStats> {
        self.iter()
            .map(|(k, s)| (k.to_string(), s.clone()))
            .collect()
    }

    fn insert(&mut self, key: Arc<str>) -> usize {
        let i = self.peers.len();
        self.index.insert(key.clone(), i);
        self.peers.push((key, PeerStats::default()));
        i
    }
}

impl std::fmt::Debug for PeerMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_stay_put_and_peers_past_the_cap_are_other() {
        let mut m = PeerMap::default();
        let a: Arc<str> = "a".into();
        let s = m.slot(&a);
        m.at(s).bytes_sent += 5;
        assert_eq!(m.slot(&a), s);
        for i in 1..PeerMap::MAX_PEERS_PER_SHARD {
            let k: Arc<str> = format!("p{i}").into();
            m.slot(&k);
        }
        assert_eq!(m.len(), PeerMap::MAX_PEERS_PER_SHARD);
        // Past the cap: new peers share one entry; known ones keep theirs.
        let late1 = m.slot(&"late1".into());
        let late2 = m.slot(&"late2".into());
        assert_eq!(late1, late2);
        m.at(late1).transfers_ok += 1;
        m.at(late2).transfers_ok += 1;
        assert_eq!(m.get(PeerMap::OTHER_PEER).map(|p| p.transfers_ok), Some(2));
        assert!(m.get("late1").is_none());
        assert_eq!(m.slot(&a), s);
        assert_eq!(m.get("a").map(|p| p.bytes_sent), Some(5));
        assert_eq!(m.len(), PeerMap::MAX_PEERS_PER_SHARD + 1);
    }

    #[test]
    fn maps_and_lanes_add_up() {
        let (mut x, mut y) = (PeerMap::default(), PeerMap::default());
        let k: Arc<str> = "k".into();
        let s = x.slot(&k);
        x.at(s).lane_connected(0);
        x.at(s).lane_failed(0);
        let s = y.slot(&k);
        y.at(s).lane_connected(0);
        y.at(s).lane_connected(3);
        let s = y.slot(&"only_y".into());
        y.at(s).inbound_transfers = 2;
        let mut t = PeerMap::default();
        t.add(&x);
        t.add(&y);
        let k = t.get("k").unwrap();
        assert_eq!((k.lane_connects, k.lane_failures), (3, 1));
        assert_eq!(
            k.lanes.get(&0),
            Some(&LaneStats {
                connects: 2,
                failures: 1
            })
        );
        assert_eq!(k.lanes.get(&3).map(|l| l.connects), Some(1));
        assert_eq!(t.get("only_y").map(|p| p.inbound_transfers), Some(2));
        let sorted: Vec<String> = t.to_sorted().into_keys().collect();
        assert_eq!(sorted, ["k", "only_y"]);
        assert_eq!(format!("{x:?}").matches("lane_connects: 1").count(), 1);
    }
}
