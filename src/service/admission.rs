//! Admission of served connections: caps on connections still in their handshake, on
//! connections in total and on connections per peer, so no client can exhaust the target's
//! descriptors or memory with connections; refusals and accept failures are logged at most
//! once a second, with a count.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The caps and the counts they bound, shared by every shard of an engine.
#[derive(Debug)]
pub(crate) struct Admission {
    handshakes: AtomicUsize,
    total: AtomicUsize,
    per_peer: Mutex<HashMap<Arc<str>, usize>>,
    max_handshakes: usize,
    max_total: usize,
    max_per_peer: usize,
    /// Refusals and accept failures, logged at most once a second.
    pub log: RateLimited,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection still shaking hands; counted until dropped.
#[derive(Debug)]
pub(crate) struct Handshaking(Arc<Admission>);

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.handshakes.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A served connection of `peer`; counted (in total and for its peer) until dropped, on
/// whichever shard serves it.
#[derive(Debug)]
pub(crate) struct Admitted {
    adm: Arc<Admission>,
    peer: Arc<str>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.adm.total.fetch_sub(1, Ordering::AcqRel);
        let mut m = lock(&self.adm.per_peer);
        if let Some(n) = m.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                // A peer with no connection left holds no record here.
                m.remove(&self.peer);
            }
        }
    }
}

impl Admission {
    /// Caps: connections in their handshake, served connections in total, per peer.
    pub fn new(max_handshakes: usize, max_total: usize, max_per_peer: usize) -> Self {
        Self {
            handshakes: AtomicUsize::new(0),
            total: AtomicUsize::new(0),
            per_peer: Mutex::new(HashMap::new()),
            max_handshakes,
            max_total,
            max_per_peer,
            log: RateLimited::new(Duration::from_secs(1)),
        }
    }

    /// A new connection may start its handshake (`None`: too many are in one already).
    pub fn handshake(self: &Arc<Self>) -> Option<Handshaking> {
        let n = self.handshakes.fetch_add(1, Ordering::AcqRel);
        let ticket = Handshaking(self.clone());
        (n < self.max_handshakes).then_some(ticket)
    }

    /// A connection of `peer` that passed its handshake may be served (`Err`: why not).
    pub fn admit(self: &Arc<Self>, peer: &Arc<str>) -> Result<Admitted, &'static str> {
        let mut m = lock(&self.per_peer);
        let mine = m.get(peer).copied().unwrap_or(0);
        if mine >= self.max_per_peer {
            return Err("too many connections from this peer");
        }
        if self.total.fetch_add(1, Ordering::AcqRel) >= self.max_total {
            self.total.fetch_sub(1, Ordering::AcqRel);
            return Err("too many connections");
        }
        *m.entry(peer.clone()).or_insert(0) += 1;
        Ok(Admitted {
            adm: self.clone(),
            peer: peer.clone(),
        })
    }

    /// Peers with at least one served connection.
    #[cfg(test)]
    pub fn peers(&self) -> usize {
        lock(&self.per_peer).len()
    }
}

/// A warning that is logged at most once per interval; the lines it kept back are counted
/// in the next one.
#[derive(Debug)]
pub(crate) struct RateLimited {
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl RateLimited {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// Log `msg` now, or count it for the next line. Whether it was logged.
    pub fn warn(&self, msg: impl FnOnce() -> String) -> bool {
        let now = Instant::now();
        let mut s = lock(&self.state);
        if s.0.is_some_and(|t| now.duration_since(t) < self.every) {
            s.1 += 1;
            return false;
        }
        let held = std::mem::take(&mut s.1);
        s.0 = Some(now);
        drop(s);
        if held > 0 {
            log::warn!("{} ({held} more like it in the last second)", msg());
        } else {
            log::warn!("{}", msg());
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_hold_and_tickets_give_back_what_they_took() {
        let a = Arc::new(Admission::new(2, 3, 2));
        let h1 = a.handshake().unwrap();
        let h2 = a.handshake().unwrap();
        assert!(a.handshake().is_none(), "third handshake at once");
        drop(h1);
        let _h3 = a.handshake().expect("room again");
        drop(h2);
        let (p, q): (Arc<str>, Arc<str>) = ("p".into(), "q".into());
        let p1 = a.admit(&p).unwrap();
        let _p2 = a.admit(&p).unwrap();
        assert_eq!(
            a.admit(&p).unwrap_err(),
            "too many connections from this peer"
        );
        let q1 = a.admit(&q).unwrap();
        assert_eq!(
            a.admit(&q).unwrap_err(),
            "too many connections",
            "total cap"
        );
        assert_eq!(a.peers(), 2);
        drop(q1);
        assert_eq!(a.peers(), 1, "a peer with no connection left is forgotten");
        drop(p1);
        let _q = a.admit(&q).unwrap();
    }

    #[test]
    fn warnings_are_rate_limited() {
        let r = RateLimited::new(Duration::from_secs(3600));
        assert!(r.warn(|| "first".into()));
        for _ in 0..100 {
            assert!(!r.warn(|| unreachable!("kept back, not formatted")));
        }
        assert_eq!(r.state.lock().unwrap().1, 100);
    }
}
