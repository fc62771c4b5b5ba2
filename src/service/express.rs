//! Express writes (and reads): a small write or read is sent by the submitting application
//! thread itself on one of its peer's lanes (into the peer's shared-memory ring on the same
//! host, or on the lane's TCP socket), and the lane's reader completes its status when the
//! target's answer comes (placing a read's data first); no hop through an owner shard and
//! the lane's writer task (issue 23, "fewer hand-offs").
//!
//! The one-owner rule holds: an express transfer is owned by the lane it rides (its reader
//! completes it, its death and its shard's deadline tick fail it), never by an owner shard.
//! A transfer goes express only when everything is simple: host memory on both sides, one
//! chunk of at most [`MAX_BYTES`], a lane that is up with an idle writer and room for the
//! whole frame, and no transfer to that peer in an owner's table (so MORI's duplicate-uid
//! rule is kept across both paths). Over TCP, where each express frame is a `send` on the
//! caller's thread, only a transfer with no other express transfer in flight to its peer
//! goes express: a burst leaves through the lane's writer, many frames to a `send`.
//! Anything else takes the usual path, unchanged. `MORIO_EXPRESS=0` turns express transfers
//! off (for A/B runs), `MORIO_EXPRESS=ring` keeps them to same-host rings,
//! `MORIO_EXPRESS_READS=0` keeps reads on the usual path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use super::Shared;
use crate::proto::access::AccessKey;
use crate::proto::frame::{encode_chunk_segs, ChunkHead, Kind, Op};
use crate::proto::lane::ReadWait;
use crate::proto::layout::Layout;
use crate::proto::limits::MAX_SEGS_PER_CHUNK;
use crate::region::SharedRegion;
use crate::status::TransferStatus;
use crate::trace;
use crate::transport::express_port::{ExpressPort, Put};

/// The tag bit of an express frame: lane books count their tags from zero and never reach
/// it, so an answer says by its tag which path it belongs to.
pub(crate) const TAG_BIT: u64 = 1 << 63;

/// Largest express write (bytes of payload): the submitting thread copies it into its frame.
pub(crate) const MAX_BYTES: u64 = 16 << 10;

/// Most express transfers in flight to one peer; beyond, writes take the usual path.
const MAX_PENDING: usize = 4096;

/// Whether small reads go express too (`MORIO_EXPRESS_READS=0` keeps them on the usual
/// path, for A/B runs).
fn reads_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("MORIO_EXPRESS_READS").map_or(true, |v| v.trim() != "0"))
}

/// Whether the submitting thread tells the lane's shard an express answer is coming
/// ([`crate::service::msg::ShardMsg::Expect`]; `MORIO_EXPRESS_POKE=0` does not, for A/B runs).
pub(crate) fn poke_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("MORIO_EXPRESS_POKE").map_or(true, |v| v.trim() != "0"))
}

/// Whether express writes may use `port` (`MORIO_EXPRESS=0`: none; `ring`: rings only).
pub(crate) fn enabled_for(port: &ExpressPort) -> bool {
    static MODE: OnceLock<u8> = OnceLock::new();
    let mode = *MODE.get_or_init(|| match std::env::var("MORIO_EXPRESS") {
        Ok(v) if v.trim() == "0" => 0,
        Ok(v) if v.trim() == "ring" => 1,
        _ => 2,
    });
    match port {
        ExpressPort::Ring(_) => mode >= 1,
        ExpressPort::Socket(_) => mode >= 2,
    }
}

/// One express transfer in flight.
#[derive(Debug)]
pub(crate) struct Pending {
    /// Its frame's tag.
    pub tag: u64,
    /// The lane it rides.
    pub lane: u16,
    /// The user-visible status.
    pub status: Arc<TransferStatus>,
    /// Payload bytes.
    pub bytes: u64,
    /// For an express read: where its data goes (chunk 0, the whole transfer).
    pub read: Option<ReadWait<SharedRegion>>,
    /// When it was submitted and when it fails unanswered (`now_ns` time).
    pub submitted_ns: u64,
    /// See above.
    pub deadline_ns: u64,
}

/// A peer's express state (in its [`super::Peer`], shared by application threads and the
/// shards running its lanes).
#[derive(Debug, Default)]
pub(crate) struct Express {
    /// Lanes that take express writes, by lane index, and their ports.
    lanes: RwLock<Vec<(u16, ExpressPort)>>,
    /// Express transfers in flight, by uid.
    pending: Mutex<HashMap<u64, Pending>>,
    /// `pending.len()`, readable without the lock.
    n_pending: AtomicUsize,
    /// Transfers to the peer in owner tables (the usual path).
    owned: AtomicUsize,
    /// The next express tag (below [`TAG_BIT`]).
    next_tag: AtomicU64,
}

/// A transfer offered as an express write (the fields of its `Submission` that matter).
#[derive(Debug)]
pub(crate) struct Candidate<'a> {
    pub op: Op,
    pub uid: u64,
    pub local: &'a SharedRegion,
    pub remote_mem: u32,
    pub remote_key: AccessKey,
    pub remote_device: bool,
    pub layout: &'a Layout,
    pub total: u64,
    pub deadline_ns: u64,
    pub status: &'a Arc<TransferStatus>,
}

/// What became of an express attempt.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Sent on lane `.0`: the lane completes the status.
    Sent(u16),
    /// Sent in part: the lane completes the status once its writer, which the caller must
    /// wake ([`crate::service::msg::ShardMsg::WakeWriter`]), has sent the rest.
    Spilled(u16),
    /// A transfer with the same uid is in flight to the peer: fail this one.
    Duplicate,
    /// Not express: submit it the usual way.
    Declined,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Express {
    /// Lane `lane` is up and takes express writes through `port`.
    pub(crate) fn add_lane(&self, lane: u16, port: ExpressPort) {
        let mut l = self.lanes.write().unwrap_or_else(|e| e.into_inner());
        l.retain(|(i, _)| *i != lane);
        l.push((lane, port));
    }

    /// Lane `lane` is gone: its express transfers, to fail. Its port is closed to express
    /// writes first, so a write racing with this either is among those returned or never
    /// went in (and takes the usual path).
    pub(crate) fn remove_lane(&self, lane: u16) -> Vec<Pending> {
        let gone: Vec<_> = {
            let mut l = self.lanes.write().unwrap_or_else(|e| e.into_inner());
            let gone = l
                .iter()
                .filter(|(i, _)| *i == lane)
                .map(|(_, r)| r.clone())
                .collect();
            l.retain(|(i, _)| *i != lane);
            gone
        };
        for p in gone {
            p.close();
        }
        self.take_where(|p| p.lane == lane)
    }

    /// Express transfers on `lane` whose deadline is `now` or earlier, taken out.
    pub(crate) fn expired(&self, lane: u16, now: u64) -> Vec<Pending> {
        if self.n_pending.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        self.take_where(|p| p.lane == lane && p.deadline_ns <= now)
    }

    /// Whether express transfers are in flight.
    pub(crate) fn any_pending(&self) -> bool {
        self.n_pending.load(Ordering::Relaxed) > 0
    }

    fn take_where(&self, pick: impl Fn(&Pending) -> bool) -> Vec<Pending> {
        let mut map = lock(&self.pending);
        let uids: Vec<u64> = map
            .iter()
            .filter(|(_, p)| pick(p))
            .map(|(&u, _)| u)
            .collect();
        let out: Vec<Pending> = uids.iter().filter_map(|u| map.remove(u)).collect();
        self.n_pending.store(map.len(), Ordering::SeqCst);
        out
    }

    /// The answer to express frame `tag` for `uid` came on `lane`: the transfer, taken out
    /// (`None`: no such transfer on that lane, a late answer to one that timed out).
    pub(crate) fn answered(&self, lane: u16, tag: u64, uid: u64) -> Option<Pending> {
        let mut map = lock(&self.pending);
        if !map
            .get(&uid)
            .is_some_and(|p| p.tag == tag && p.lane == lane)
        {
            return None;
        }
        let p = map.remove(&uid);
        self.n_pending.store(map.len(), Ordering::SeqCst);
        p
    }

    /// An owner takes a transfer to this peer into its table: `false` if an express
    /// transfer with its uid is in flight (it must fail as a duplicate, and is not counted).
    pub(crate) fn owner_takes(&self, uid: u64) -> bool {
        // Counted first, then looked: an express attempt inserts first, then looks at the
        // count, so of two racing transfers with one uid at least one sees the other.
        self.owned.fetch_add(1, Ordering::SeqCst);
        if self.n_pending.load(Ordering::SeqCst) > 0 && lock(&self.pending).contains_key(&uid) {
            self.owned.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// An owner's transfer to this peer left its table.
    pub(crate) fn owner_done(&self) {
        self.owned.fetch_sub(1, Ordering::SeqCst);
    }

    /// Try `sub` as an express write or read (on the submitting thread). `pick` spreads
    /// callers over the lanes (the transfer's owner index).
    pub(crate) fn try_send(&self, shared: &Shared, sub: &Candidate<'_>, pick: usize) -> Attempt {
        let limit = match sub.op {
            Op::Write => MAX_BYTES.min(shared.cfg.inline_write_bytes as u64),
            Op::Read if reads_enabled() => MAX_BYTES,
            Op::Read => 0,
        };
        if sub.remote_device
            || sub.local.device().is_some()
            || sub.total > limit
            || self.owned.load(Ordering::Relaxed) > 0
            || self.n_pending.load(Ordering::Relaxed) >= MAX_PENDING
        {
            return Attempt::Declined;
        }
        let (lane, port) = {
            let lanes = self.lanes.read().unwrap_or_else(|e| e.into_inner());
            if lanes.is_empty() {
                return Attempt::Declined;
            }
            let (l, p) = &lanes[pick % lanes.len()];
            (*l, p.clone())
        };
        if port.one_at_a_time() && self.n_pending.load(Ordering::Relaxed) > 0 {
            return Attempt::Declined;
        }
        // One chunk, as an owner would cut it: not striped, within the pieces of a frame
        // (its pieces are then the layout itself).
        let striped = shared.cfg.num_data_conns > 1
            && sub.total >= shared.cfg.striping_threshold_bytes as u64;
        if striped || sub.layout.piece_count() > MAX_SEGS_PER_CHUNK {
            return Attempt::Declined;
        }
        let tag = TAG_BIT | (self.next_tag.fetch_add(1, Ordering::Relaxed) & !TAG_BIT);
        {
            let mut map = lock(&self.pending);
            if map.contains_key(&sub.uid) {
                return Attempt::Duplicate;
            }
            map.insert(
                sub.uid,
                Pending {
                    tag,
                    lane,
                    status: sub.status.clone(),
                    bytes: sub.total,
                    read: (sub.op == Op::Read).then(|| ReadWait {
                        chunk: 0,
                        final_: true,
                        local: sub.local.clone(),
                        pieces: sub.layout.clone(),
                        bytes: sub.total,
                    }),
                    // The submission's own clock reading (its deadline is that plus the
                    // op timeout): one clock read fewer on the submitting thread.
                    submitted_ns: sub
                        .deadline_ns
                        .saturating_sub(shared.cfg.op_timeout.as_nanos() as u64),
                    deadline_ns: sub.deadline_ns,
                },
            );
            self.n_pending.store(map.len(), Ordering::SeqCst);
        }
        // Take it back for the usual path: `Declined`, unless the lane took it meanwhile
        // (its death failed it): then its status has ended, and it must not be sent again.
        let withdraw = || {
            let mut map = lock(&self.pending);
            let was = map.remove(&sub.uid).is_some();
            self.n_pending.store(map.len(), Ordering::SeqCst);
            if was {
                Attempt::Declined
            } else {
                Attempt::Sent(lane)
            }
        };
        if self.owned.load(Ordering::SeqCst) > 0 {
            return withdraw();
        }
        trace::mark(sub.uid, trace::stage::ENCODE);
        let put = FRAME.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.clear();
            let head = ChunkHead {
                tag,
                uid: sub.uid,
                chunk: 0,
                n_chunks: 1,
                mem_id: sub.remote_mem,
                access_key: sub.remote_key,
                extent: sub.layout.remote_extent(),
                join_lane: 0,
            };
            let segs = sub.layout.remote_segs();
            if sub.op == Op::Read {
                encode_chunk_segs(Kind::Read, true, &head, segs, 0, &mut buf);
            } else {
                encode_chunk_segs(Kind::Write, true, &head, segs, sub.total, &mut buf);
                // SAFETY: the ranges were checked against the region at submission, the
                // region lives while `sub.local` does, and reading the pieces is the transfer.
                if !unsafe { super::gather::gather(sub.local, sub.layout, &mut buf) } {
                    return None;
                }
            }
            trace::mark(sub.uid, trace::stage::PUSHED);
            port.put_frame(&buf).ok()
        });
        match put {
            None => withdraw(),
            Some(Put::Whole) => {
                trace::mark(sub.uid, trace::stage::SENT);
                Attempt::Sent(lane)
            }
            Some(Put::Spilled) => Attempt::Spilled(lane),
        }
    }
}

thread_local! {
    /// The submitting thread's frame buffer.
    static FRAME: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(1024));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(ex: &Express, uid: u64, tag: u64, lane: u16, deadline_ns: u64) {
        let mut map = lock(&ex.pending);
        map.insert(
            uid,
            Pending {
                tag,
                lane,
                status: Arc::new(TransferStatus::started()),
                bytes: 8,
                read: None,
                submitted_ns: 0,
                deadline_ns,
            },
        );
        ex.n_pending.store(map.len(), Ordering::SeqCst);
    }

    #[test]
    fn answers_match_uid_tag_and_lane_or_nothing() {
        let ex = Express::default();
        pending(&ex, 7, TAG_BIT | 1, 2, u64::MAX);
        assert!(ex.answered(3, TAG_BIT | 1, 7).is_none(), "another lane");
        assert!(ex.answered(2, TAG_BIT | 2, 7).is_none(), "another tag");
        assert!(ex.answered(2, TAG_BIT | 1, 8).is_none(), "another uid");
        assert!(ex.any_pending());
        assert_eq!(ex.answered(2, TAG_BIT | 1, 7).map(|p| p.bytes), Some(8));
        assert!(!ex.any_pending());
        assert!(ex.answered(2, TAG_BIT | 1, 7).is_none(), "answered twice");
    }

    #[test]
    fn owners_refuse_a_uid_in_flight_express_and_count_the_rest() {
        let ex = Express::default();
        pending(&ex, 5, TAG_BIT, 0, u64::MAX);
        assert!(!ex.owner_takes(5), "the express transfer holds the uid");
        assert_eq!(ex.owned.load(Ordering::SeqCst), 0);
        assert!(ex.owner_takes(6));
        assert_eq!(ex.owned.load(Ordering::SeqCst), 1);
        ex.owner_done();
        assert_eq!(ex.owned.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn deadlines_and_lane_deaths_take_only_their_transfers() {
        let ex = Express::default();
        pending(&ex, 1, TAG_BIT | 1, 0, 100);
        pending(&ex, 2, TAG_BIT | 2, 0, 300);
        pending(&ex, 3, TAG_BIT | 3, 1, 100);
        let gone: Vec<u64> = ex.expired(0, 200).iter().map(|p| p.tag).collect();
        assert_eq!(gone, vec![TAG_BIT | 1]);
        let lost: Vec<u64> = ex.remove_lane(1).iter().map(|p| p.tag).collect();
        assert_eq!(lost, vec![TAG_BIT | 3]);
        assert!(
            ex.any_pending(),
            "lane 0's second transfer is still in flight"
        );
        assert_eq!(ex.expired(0, 300).len(), 1);
        assert!(!ex.any_pending());
    }
}
