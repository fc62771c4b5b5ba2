//! Target-side inbound statuses: what each remote initiator's transfers ended with here,
//! popped destructively by the application, bounded by age and count.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::status::StatusCode;

/// MORI-compat: at most 4096 inbound statuses kept per peer (oldest evicted).
pub const MAX_INBOUND_PER_PEER: usize = 4096;

#[derive(Debug, Default)]
struct PeerStatuses {
    by_uid: HashMap<u64, (StatusCode, String, Instant)>,
    order: VecDeque<(u64, Instant)>,
}

/// The store. Written once per finished inbound transfer (by the shard that finished it) and
/// read by `pop_inbound_transfer_status`; never touched on the per-byte data path.
#[derive(Debug)]
pub struct InboundStatuses {
    peers: Mutex<HashMap<String, PeerStatuses>>,
    max_age: Duration,
}

impl InboundStatuses {
    /// Entries older than `max_age` are dropped (MORI: max(4 × op timeout, 60 s)).
    pub fn new(max_age: Duration) -> Self {
        Self {
            peers: Mutex::new(HashMap::new()),
            max_age,
        }
    }

    /// Record how transfer `uid` from `peer` ended. A second record for the same transfer
    /// keeps the first error (first error wins), else replaces it.
    pub fn record(&self, peer: &str, uid: u64, code: StatusCode, msg: &str) {
        let now = Instant::now();
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if !peers.contains_key(peer) {
            // The key is copied once per peer, not once per transfer.
            peers.insert(peer.to_string(), PeerStatuses::default());
        }
        let Some(p) = peers.get_mut(peer) else { return };
        if let Some(e) = p.by_uid.get_mut(&uid) {
            if !e.0.is_error() {
                *e = (code, msg.to_string(), e.2);
            }
            return;
        }
        p.by_uid.insert(uid, (code, msg.to_string(), now));
        p.order.push_back((uid, now));
        Self::prune(p, now, self.max_age);
    }

    /// Remove and return the status of `uid` from `peer`, if recorded and not expired.
    pub fn pop(&self, peer: &str, uid: u64) -> Option<(StatusCode, String)> {
        let now = Instant::now();
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let p = peers.get_mut(peer)?;
        Self::prune(p, now, self.max_age);
        let out = p.by_uid.remove(&uid).map(|(c, m, _)| (c, m));
        Self::compact(p);
        out
    }

    /// Drop the order records of popped entries once they outnumber the live ones: an
    /// entry that nobody pops holds the front of `order` until it expires, and the records
    /// of every transfer popped meanwhile would otherwise pile up behind it.
    fn compact(p: &mut PeerStatuses) {
        if p.order.len() > 2 * p.by_uid.len() + 64 {
            let live = &p.by_uid;
            p.order
                .retain(|(uid, at)| live.get(uid).is_some_and(|e| e.2 == *at));
        }
    }

    fn prune(p: &mut PeerStatuses, now: Instant, max_age: Duration) {
        while let Some(&(uid, at)) = p.order.front() {
            let live = p.by_uid.get(&uid).is_some_and(|e| e.2 == at);
            let expired = now.duration_since(at) > max_age;
            if live && !expired && p.by_uid.len() <= MAX_INBOUND_PER_PEER {
                break;
            }
            p.order.pop_front();
            if live {
                p.by_uid.remove(&uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pop_is_destructive_and_keyed_by_peer() {
        let s = InboundStatuses::new(Duration::from_secs(60));
        s.record("a", 1, StatusCode::Success, "");
        s.record("b", 1, StatusCode::ErrNotFound, "nope");
        assert_eq!(s.pop("a", 1), Some((StatusCode::Success, String::new())));
        assert_eq!(s.pop("a", 1), None);
        assert_eq!(
            s.pop("b", 1),
            Some((StatusCode::ErrNotFound, "nope".into()))
        );
    }

    #[test]
    fn first_error_wins_and_count_is_bounded() {
        let s = InboundStatuses::new(Duration::from_secs(60));
        s.record("a", 9, StatusCode::ErrBadState, "x");
        s.record("a", 9, StatusCode::Success, "");
        assert_eq!(s.pop("a", 9).unwrap().0, StatusCode::ErrBadState);
        for uid in 0..(MAX_INBOUND_PER_PEER as u64 + 10) {
            s.record("a", uid, StatusCode::Success, "");
        }
        assert_eq!(s.pop("a", 0), None, "oldest evicted");
        assert!(s.pop("a", MAX_INBOUND_PER_PEER as u64 + 9).is_some());
    }

    #[test]
    fn records_of_popped_transfers_do_not_pile_up_behind_an_unpopped_one() {
        let s = InboundStatuses::new(Duration::from_secs(3600));
        s.record("a", 0, StatusCode::Success, "");
        for uid in 1..100_000u64 {
            s.record("a", uid, StatusCode::Success, "");
            assert!(s.pop("a", uid).is_some());
        }
        let peers = s.peers.lock().unwrap();
        let p = &peers["a"];
        assert_eq!(p.by_uid.len(), 1);
        assert!(
            p.order.len() <= 2 * p.by_uid.len() + 65,
            "{}",
            p.order.len()
        );
        drop(peers);
        assert!(s.pop("a", 0).is_some(), "the unpopped entry is still there");
    }

    #[test]
    fn old_entries_expire() {
        let s = InboundStatuses::new(Duration::from_millis(1));
        s.record("a", 1, StatusCode::Success, "");
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(s.pop("a", 1), None);
    }
}
