//! Target-side inbound statuses: what each remote initiator's transfers ended with here,
//! popped destructively by the application, bounded by age, per peer and in total.
//!
//! Memory: a status costs about 100 bytes (its map entry and its place in the age order, up
//! to about twice that with the tables' slack) plus its message, kept up to
//! [`MAX_STATUS_MSG_BYTES`]; a peer holding any costs its key (up to 1 KiB) and about 200
//! bytes more. A peer's record goes once it holds nothing and has recorded nothing for
//! [`IDLE_PEER`] ([`InboundStatuses::sweep`]), so neither statuses nor peers pile up.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::status::StatusCode;

/// MORI-compat: at most 4096 inbound statuses kept per peer (oldest evicted); the default of
/// `TcpBackendConfig::max_inbound_statuses_per_peer`.
pub const MAX_INBOUND_PER_PEER: usize = 4096;

/// A status message is kept up to this many bytes (cut at a character boundary): a peer's
/// FINISH may carry 4 KiB, which the store would otherwise hold for every transfer.
pub const MAX_STATUS_MSG_BYTES: usize = 256;

/// A peer's record that holds no status goes once it has recorded nothing for this long.
pub const IDLE_PEER: Duration = Duration::from_secs(1);

/// How many statuses the store keeps for one peer and for all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusCaps {
    /// For one initiator key: its oldest goes first.
    pub per_peer: usize,
    /// For all initiators together: past it, the initiator holding the most loses its oldest.
    pub total: usize,
}

impl StatusCaps {
    /// The defaults of `TcpBackendConfig::max_inbound_statuses_per_peer` and
    /// `max_inbound_statuses`.
    pub const DEFAULT: StatusCaps = StatusCaps {
        per_peer: MAX_INBOUND_PER_PEER,
        total: 65536,
    };
}

#[derive(Debug)]
struct PeerStatuses {
    /// The peer's key (the map's key too: one allocation).
    key: Arc<str>,
    /// B-trees, not a hash table and a ring buffer: they grow a node at a time, where those
    /// double and move every entry at once (up to hundreds of µs at a few thousand entries,
    /// on the serve path of the transfer that crossed the size).
    by_uid: BTreeMap<u64, (StatusCode, String, Instant)>,
    order: AgeOrder,
    /// When it last recorded.
    last: Instant,
}

/// A peer's records in the order they were made (oldest first; entries of popped statuses
/// stay until pruned or compacted), under increasing sequence numbers.
#[derive(Debug, Default)]
struct AgeOrder {
    q: BTreeMap<u64, (u64, Instant)>,
    next: u64,
}

impl AgeOrder {
    fn push_back(&mut self, e: (u64, Instant)) {
        self.q.insert(self.next, e);
        self.next += 1;
    }

    fn front(&self) -> Option<&(u64, Instant)> {
        self.q.first_key_value().map(|(_, e)| e)
    }

    fn pop_front(&mut self) -> Option<(u64, Instant)> {
        self.q.pop_first().map(|(_, e)| e)
    }

    fn len(&self) -> usize {
        self.q.len()
    }

    fn retain(&mut self, mut keep: impl FnMut(&(u64, Instant)) -> bool) {
        self.q.retain(|_, e| keep(e));
    }
}

#[derive(Debug, Default)]
struct Store {
    peers: HashMap<Arc<str>, PeerStatuses>,
    /// Each peer's current instance (its latest handshake's), and when it was last seen: a
    /// record from another instance is a predecessor's, whose uids the current one reuses.
    instances: HashMap<Arc<str>, (u64, Instant)>,
    /// `(statuses held, key)` of every peer holding any: the largest is the last.
    by_len: BTreeSet<(usize, Arc<str>)>,
    /// Statuses held in all.
    total: usize,
}

/// The store. Written once per finished inbound transfer (by the shard that finished it) and
/// read by `pop_inbound_transfer_status`; never touched on the per-byte data path.
#[derive(Debug)]
pub struct InboundStatuses {
    store: Mutex<Store>,
    max_age: Duration,
    caps: StatusCaps,
    /// Rung when a status is recorded while someone waits for one ([`Self::pop_wait`]).
    arrived: Condvar,
    /// Threads in [`Self::pop_wait`]'s sleep (changed under `store`'s lock): a record with
    /// none skips the wake-up.
    waiters: AtomicUsize,
}

/// `msg`, cut to at most [`MAX_STATUS_MSG_BYTES`] at a character boundary.
fn kept(msg: &str) -> String {
    let mut end = msg.len().min(MAX_STATUS_MSG_BYTES);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    msg[..end].to_string()
}

/// A peer's count went from `before` to `after`: keep the order by size and the total.
fn resize(
    store_by_len: &mut BTreeSet<(usize, Arc<str>)>,
    total: &mut usize,
    p: &PeerStatuses,
    before: usize,
) {
    let after = p.by_uid.len();
    if before == after {
        return;
    }
    if before > 0 {
        store_by_len.remove(&(before, p.key.clone()));
    }
    if after > 0 {
        store_by_len.insert((after, p.key.clone()));
    }
    *total = (*total + after).saturating_sub(before);
}

impl InboundStatuses {
    /// Entries older than `max_age` are dropped (MORI: max(4 × op timeout, 60 s)); at most
    /// `caps` are kept.
    pub fn new(max_age: Duration, caps: StatusCaps) -> Self {
        Self {
            store: Mutex::new(Store::default()),
            max_age,
            caps,
            arrived: Condvar::new(),
            waiters: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `peer` completed a handshake as `instance`. A new instance (the engine restarted under
    /// the same key, its uids starting over) makes its predecessor's unpopped statuses
    /// meaningless: they go, and records its predecessor's connections still make are
    /// dropped from now on.
    pub fn hello(&self, peer: &str, instance: u64) {
        let now = Instant::now();
        let mut guard = self.lock();
        let Store {
            peers,
            instances,
            by_len,
            total,
        } = &mut *guard;
        match instances.get_mut(peer) {
            Some((cur, seen)) if *cur == instance => *seen = now,
            Some(entry) => {
                *entry = (instance, now);
                if let Some(p) = peers.remove(peer) {
                    let n = p.by_uid.len();
                    if n > 0 {
                        by_len.remove(&(n, p.key.clone()));
                    }
                    *total = total.saturating_sub(n);
                }
            }
            None => {
                instances.insert(peer.into(), (instance, now));
            }
        }
    }

    /// Record how transfer `uid` from `peer`'s `instance` ended. A second record for the same
    /// transfer keeps the first error (first error wins), else replaces it. A record from an
    /// instance other than the peer's current one is a predecessor's and is dropped.
    pub fn record(&self, peer: &str, instance: u64, uid: u64, code: StatusCode, msg: &str) {
        let now = Instant::now();
        let mut guard = self.lock();
        let Store {
            peers,
            instances,
            by_len,
            total,
        } = &mut *guard;
        match instances.get_mut(peer) {
            Some((cur, _)) if *cur != instance => return,
            Some((_, seen)) => *seen = now,
            None => {
                instances.insert(peer.into(), (instance, now));
            }
        }
        // One lookup for a peer already on record; the key is copied once per peer record,
        // not once per transfer.
        let p = match peers.get_mut(peer) {
            Some(p) => p,
            None => {
                let key: Arc<str> = peer.into();
                peers.entry(key.clone()).or_insert(PeerStatuses {
                    key,
                    by_uid: BTreeMap::new(),
                    order: AgeOrder::default(),
                    last: now,
                })
            }
        };
        p.last = now;
        if let Some(e) = p.by_uid.get_mut(&uid) {
            if !e.0.is_error() {
                *e = (code, kept(msg), e.2);
            }
            return;
        }
        let before = p.by_uid.len();
        p.by_uid.insert(uid, (code, kept(msg), now));
        p.order.push_back((uid, now));
        Self::prune(p, now, self.max_age, self.caps.per_peer);
        resize(by_len, total, p, before);
        let recorder = p.key.clone();
        while *total > self.caps.total {
            if !Self::evict_from_largest(peers, by_len, total, &recorder) {
                break;
            }
        }
        // Under the lock a waiter checks and counts itself under: none is missed.
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.arrived.notify_all();
        }
    }

    /// Past the total cap: the oldest status of the peer holding the most goes (never the
    /// status just recorded). A peer left with none goes too. Whether one went.
    fn evict_from_largest(
        peers: &mut HashMap<Arc<str>, PeerStatuses>,
        by_len: &mut BTreeSet<(usize, Arc<str>)>,
        total: &mut usize,
        recorder: &Arc<str>,
    ) -> bool {
        let victim = by_len
            .iter()
            .rev()
            .find(|(n, k)| *n > 1 || k != recorder)
            .map(|(_, k)| k.clone());
        let Some(p) = victim.and_then(|k| peers.get_mut(&k)) else {
            return false;
        };
        let before = p.by_uid.len();
        while let Some((uid, at)) = p.order.pop_front() {
            if p.by_uid.get(&uid).is_some_and(|e| e.2 == at) {
                p.by_uid.remove(&uid);
                break;
            }
        }
        resize(by_len, total, p, before);
        if p.by_uid.is_empty() {
            let key = p.key.clone();
            peers.remove(&key);
        }
        true
    }

    /// Remove and return the status of `uid` from `peer`, if recorded and not expired.
    pub fn pop(&self, peer: &str, uid: u64) -> Option<(StatusCode, String)> {
        self.pop_locked(&mut self.lock(), peer, uid)
    }

    /// [`Self::pop`], waiting for the status to be recorded until `deadline` (`None`:
    /// without end) if it is not yet.
    pub fn pop_wait(
        &self,
        peer: &str,
        uid: u64,
        deadline: Option<Instant>,
    ) -> Option<(StatusCode, String)> {
        let mut guard = self.lock();
        loop {
            if let Some(s) = self.pop_locked(&mut guard, peer, uid) {
                return Some(s);
            }
            let left = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return None,
                },
            };
            self.waiters.fetch_add(1, Ordering::SeqCst);
            guard = match left {
                None => self.arrived.wait(guard).unwrap_or_else(|e| e.into_inner()),
                Some(l) => {
                    self.arrived
                        .wait_timeout(guard, l)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn pop_locked(&self, store: &mut Store, peer: &str, uid: u64) -> Option<(StatusCode, String)> {
        let now = Instant::now();
        let Store {
            peers,
            by_len,
            total,
            ..
        } = store;
        let p = peers.get_mut(peer)?;
        let before = p.by_uid.len();
        Self::prune(p, now, self.max_age, self.caps.per_peer);
        let out = p.by_uid.remove(&uid).map(|(c, m, _)| (c, m));
        Self::compact(p);
        resize(by_len, total, p, before);
        out
    }

    /// Drop expired statuses of every peer, and the records of peers that hold none and have
    /// recorded nothing for [`IDLE_PEER`] (their connections are gone, or idle). The engine
    /// runs it about once a second, so a peer that went away leaves nothing behind.
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut guard = self.lock();
        let Store {
            peers,
            instances,
            by_len,
            total,
        } = &mut *guard;
        peers.retain(|_, p| {
            let before = p.by_uid.len();
            Self::prune(p, now, self.max_age, self.caps.per_peer);
            Self::compact(p);
            resize(by_len, total, p, before);
            !p.by_uid.is_empty() || now.duration_since(p.last) < IDLE_PEER
        });
        // An instance unheard of for longer than a status lives has no connection left: by
        // then its predecessor's records cannot arrive either.
        instances.retain(|k, (_, seen)| {
            peers.contains_key(k) || now.duration_since(*seen) <= self.max_age
        });
    }

    /// Statuses kept, and peers with a record (for tests of the bounds).
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let s = self.lock();
        debug_assert_eq!(
            s.total,
            s.peers.values().map(|p| p.by_uid.len()).sum::<usize>()
        );
        (s.total, s.peers.len())
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

    fn prune(p: &mut PeerStatuses, now: Instant, max_age: Duration, cap: usize) {
        while let Some(&(uid, at)) = p.order.front() {
            let live = p.by_uid.get(&uid).is_some_and(|e| e.2 == at);
            let expired = now.duration_since(at) > max_age;
            if live && !expired && p.by_uid.len() <= cap {
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

    fn store(max_age: Duration) -> InboundStatuses {
        InboundStatuses::new(max_age, StatusCaps::DEFAULT)
    }

    /// Recording never grows a table by more than a small block at a time: a hash table or
    /// a ring buffer doubling at a few thousand statuses cost the transfer that crossed the
    /// size up to hundreds of µs on the serve path (device runs: one slow iteration at the
    /// 256th, 512th, 896th, 1792nd and 2048th transfer from a peer).
    #[test]
    fn recording_allocates_only_small_blocks_however_many_statuses_pile_up() {
        let s = store(Duration::from_secs(3600));
        s.record("a", 0, 0, StatusCode::Success, "");
        let ((), largest) = crate::test_alloc::largest_allocation(|| {
            for uid in 1..20_000u64 {
                s.record("a", 0, uid, StatusCode::Success, "");
                if uid % 3 == 0 {
                    s.record("b", 0, uid, StatusCode::ErrBadState, "a message");
                }
            }
        });
        assert!(largest <= 2048, "a {largest}-byte block on the record path");
        // The caps held meanwhile (oldest evicted), as before.
        assert_eq!(s.counts(), (MAX_INBOUND_PER_PEER * 2, 2));
        assert!(s.pop("a", 19_999).is_some());
        assert!(s.pop("a", 1).is_none(), "evicted long ago");
    }

    /// A waiter gets its status when it is recorded (others' records wake it but are left
    /// alone), and nothing at its deadline when none comes.
    #[test]
    fn pop_wait_returns_its_status_when_recorded_or_nothing_at_the_deadline() {
        let s = Arc::new(store(Duration::from_secs(60)));
        let t0 = Instant::now();
        let late = Instant::now() + Duration::from_millis(100);
        assert_eq!(s.pop_wait("a", 7, Some(late)), None);
        assert!(t0.elapsed() >= Duration::from_millis(100));
        let recorder = {
            let s = s.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                s.record("a", 0, 8, StatusCode::Success, "someone else's");
                std::thread::sleep(Duration::from_millis(30));
                s.record("a", 0, 7, StatusCode::ErrNotFound, "mine");
            })
        };
        let got = s.pop_wait("a", 7, Some(Instant::now() + Duration::from_secs(30)));
        assert_eq!(got, Some((StatusCode::ErrNotFound, "mine".to_string())));
        recorder.join().unwrap();
        assert_eq!(
            s.pop("a", 8),
            Some((StatusCode::Success, "someone else's".into()))
        );
        assert_eq!(
            s.pop_wait("a", 7, Some(Instant::now())),
            None,
            "popped once"
        );
    }

    #[test]
    fn pop_is_destructive_and_keyed_by_peer() {
        let s = store(Duration::from_secs(60));
        s.record("a", 0, 1, StatusCode::Success, "");
        s.record("b", 0, 1, StatusCode::ErrNotFound, "nope");
        assert_eq!(s.pop("a", 1), Some((StatusCode::Success, String::new())));
        assert_eq!(s.pop("a", 1), None);
        assert_eq!(
            s.pop("b", 1),
            Some((StatusCode::ErrNotFound, "nope".into()))
        );
        assert_eq!(
            s.counts(),
            (0, 2),
            "records stay while their peers are active"
        );
    }

    #[test]
    fn first_error_wins_and_count_is_bounded() {
        let s = store(Duration::from_secs(60));
        s.record("a", 0, 9, StatusCode::ErrBadState, "x");
        s.record("a", 0, 9, StatusCode::Success, "");
        assert_eq!(s.pop("a", 9).unwrap().0, StatusCode::ErrBadState);
        for uid in 0..(MAX_INBOUND_PER_PEER as u64 + 10) {
            s.record("a", 0, uid, StatusCode::Success, "");
        }
        assert_eq!(s.pop("a", 0), None, "oldest evicted");
        assert!(s.pop("a", MAX_INBOUND_PER_PEER as u64 + 9).is_some());
        assert_eq!(s.counts(), (MAX_INBOUND_PER_PEER - 1, 1));
    }

    #[test]
    fn records_of_popped_transfers_do_not_pile_up_behind_an_unpopped_one() {
        let s = store(Duration::from_secs(3600));
        s.record("a", 0, 0, StatusCode::Success, "");
        for uid in 1..100_000u64 {
            s.record("a", 0, uid, StatusCode::Success, "");
            assert!(s.pop("a", uid).is_some());
        }
        let guard = s.lock();
        let p = &guard.peers["a"];
        assert_eq!(p.by_uid.len(), 1);
        assert!(
            p.order.len() <= 2 * p.by_uid.len() + 65,
            "{}",
            p.order.len()
        );
        drop(guard);
        assert!(s.pop("a", 0).is_some(), "the unpopped entry is still there");
    }

    #[test]
    fn old_entries_expire() {
        let s = store(Duration::from_millis(1));
        s.record("a", 0, 1, StatusCode::Success, "");
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(s.pop("a", 1), None);
    }

    #[test]
    fn messages_are_kept_short() {
        let s = store(Duration::from_secs(60));
        let long = "é".repeat(4096);
        s.record("a", 0, 1, StatusCode::ErrBadState, &long);
        let (_, m) = s.pop("a", 1).unwrap();
        assert!(
            m.len() <= MAX_STATUS_MSG_BYTES && long.starts_with(&m),
            "{}",
            m.len()
        );
        assert_eq!(kept("short"), "short");
    }

    #[test]
    fn past_the_total_the_largest_holder_pays() {
        let caps = StatusCaps {
            per_peer: 8,
            total: 10,
        };
        let s = InboundStatuses::new(Duration::from_secs(60), caps);
        for uid in 0..3 {
            s.record("quiet", 0, uid, StatusCode::Success, "");
        }
        for uid in 0..8 {
            s.record("loud", 0, uid, StatusCode::Success, "");
        }
        // 11 > 10: loud (8) lost its oldest; quiet kept all of its.
        assert_eq!(s.counts(), (10, 2));
        assert!(s.pop("loud", 0).is_none());
        for uid in 0..3 {
            assert!(s.pop("quiet", uid).is_some(), "quiet {uid}");
        }
        // Many peers with one status each: a new one never loses the status it just
        // recorded, and a peer left with none goes.
        let s = InboundStatuses::new(Duration::from_secs(60), caps);
        for i in 0..25u64 {
            s.record(&format!("p{i}"), 0, i, StatusCode::Success, "");
            let (total, peers) = s.counts();
            assert!(total <= 10 && peers <= 10, "{total} {peers}");
            assert!(s.lock().peers[format!("p{i}").as_str()]
                .by_uid
                .contains_key(&i));
        }
    }

    #[test]
    fn records_of_peers_that_hold_nothing_go_once_idle() {
        // Long enough that none expires while a loaded machine records them (20 ms did not
        // cover that under a busy CPU).
        let ttl = Duration::from_millis(500);
        let s = store(ttl);
        for i in 0..1000u64 {
            // Distinct, long keys, as from many connections with distinct source keys.
            let key = format!("{i:01000}");
            s.record(&key, 0, 1, StatusCode::Success, "");
            if i % 2 == 0 {
                assert!(s.pop(&key, 1).is_some());
            }
        }
        assert_eq!(s.counts(), (500, 1000));
        std::thread::sleep(ttl + Duration::from_millis(10));
        // Expired statuses went (the records go once idle for IDLE_PEER).
        s.sweep();
        assert_eq!(s.counts().0, 0);
        std::thread::sleep(IDLE_PEER);
        s.sweep();
        assert_eq!(s.counts(), (0, 0));
        let guard = s.lock();
        assert!(guard.by_len.is_empty());
    }
}

#[cfg(test)]
mod instance_tests {
    use super::*;

    /// A restarted peer (new instance, uids from the start) finds none of its predecessor's
    /// statuses, and its predecessor's late records do not land among its own.
    #[test]
    fn a_new_instance_voids_its_predecessors_statuses() {
        let s = InboundStatuses::new(Duration::from_secs(60), StatusCaps::DEFAULT);
        s.hello("p", 1);
        s.record("p", 1, 7, StatusCode::ErrGpuOp, "old");
        s.record("p", 1, 8, StatusCode::Success, "");
        s.hello("p", 2);
        assert_eq!(s.pop("p", 7), None, "the predecessor's status is void");
        // A late record of the old instance for a uid the new one reuses: dropped.
        s.record("p", 1, 8, StatusCode::ErrBadState, "late");
        s.record("p", 2, 8, StatusCode::Success, "");
        assert_eq!(s.pop("p", 8), Some((StatusCode::Success, String::new())));
        // The same instance again changes nothing.
        s.record("p", 2, 9, StatusCode::Success, "");
        s.hello("p", 2);
        assert!(s.pop("p", 9).is_some());
        // Other peers are untouched by p's restarts.
        s.record("q", 5, 1, StatusCode::Success, "");
        s.hello("p", 3);
        assert!(s.pop("q", 1).is_some());
    }
}
