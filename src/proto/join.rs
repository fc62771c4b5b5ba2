//! The target-side join of a multi-chunk transfer: the results of its chunks, from whichever
//! connections and shards carried them, meet in one engine-wide table; the chunk whose
//! result completes the join is answered for the whole transfer: the target records the
//! inbound status, then answers COMPLETE on that chunk's connection with its tag. No report
//! travels between shards and no FINISH round trip follows the last chunk.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use super::codes;
use super::frame::Op;
use super::limits::{JOIN_SLOT_CHUNKS, MAX_CHUNKS_PER_TRANSFER};

/// One chunk's result, reported to the engine's join table.
#[derive(Debug)]
pub struct JoinReport<'a> {
    /// The initiator's key.
    pub peer: &'a Arc<str>,
    /// The initiator's instance ([`super::frame::Hello::instance`]).
    pub instance: u64,
    /// The transfer.
    pub uid: u64,
    /// Read or write.
    pub op: Op,
    /// Chunks in the transfer.
    pub n_chunks: u32,
    /// This chunk.
    pub chunk: u32,
    /// Its result.
    pub code: u32,
    /// Its message.
    pub msg: &'a str,
}

/// The engine-wide table of [`Join`]s, shared by every served connection.
pub trait JoinTable {
    /// A chunk's result: the verdict when it completed its transfer's join.
    fn report(&self, r: &JoinReport<'_>) -> Option<(u32, String)>;
    /// FINISH ended a transfer: its join answers nothing more. Whether this FINISH ended it
    /// (false: an earlier FINISH, on another of its lanes, already had; only the first
    /// records the inbound status).
    fn end(&self, peer: &Arc<str>, instance: u64, uid: u64, op: Op, n_chunks: u32) -> bool;
}

/// One multi-chunk transfer as the target's join tracks it. Time is a parameter in any
/// monotonic unit the caller chooses.
#[derive(Debug)]
pub struct Join {
    op: Op,
    n_chunks: u32,
    seen: Vec<u64>,
    n_seen: u32,
    first_err: Option<(u32, String)>,
    ended: bool,
    created: u64,
}

impl Join {
    /// A transfer of `n_chunks` chunks of `op`, first heard of at `now`: one bit per chunk
    /// (8 bytes per 64 chunks), nothing else that grows. A target makes one only for a
    /// checked count (at most [`MAX_CHUNKS_PER_TRANSFER`]: 128 KiB).
    pub fn new(op: Op, n_chunks: u32, now: u64) -> Self {
        debug_assert!(n_chunks <= MAX_CHUNKS_PER_TRANSFER);
        Self {
            op,
            n_chunks,
            seen: vec![0; (n_chunks as usize).div_ceil(64)],
            n_seen: 0,
            first_err: None,
            ended: false,
            created: now,
        }
    }

    /// When it was first heard of.
    pub fn created(&self) -> u64 {
        self.created
    }

    /// Whether it has been answered (or ended by FINISH).
    #[cfg(any(test, feature = "testing"))]
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Whether every chunk has been reported and the transfer has ended: nothing more can
    /// arrive for it, so its entry can go.
    pub fn spent(&self) -> bool {
        self.ended && self.n_seen == self.n_chunks
    }

    /// Chunk `chunk` of a transfer described as `op` in `n_chunks` chunks was handled with
    /// `code`. Reports that disagree with the transfer (another op or chunk count, a chunk
    /// out of range or seen twice: a broken or hostile peer) make its verdict
    /// `ERR_BAD_STATE`; a chunk out of range or seen twice is not counted.
    ///
    /// Returns the verdict when this report completed the join (every chunk in, not ended;
    /// only once): the caller records the inbound status, then answers COMPLETE for the
    /// whole transfer on the connection that carried this chunk, with its tag.
    pub fn report(
        &mut self,
        op: Op,
        n_chunks: u32,
        chunk: u32,
        code: u32,
        msg: &str,
    ) -> Option<(u32, String)> {
        let bad = |why: &str| (codes::ERR_BAD_STATE, format!("inconsistent chunks: {why}"));
        if op != self.op || n_chunks != self.n_chunks {
            self.error(bad("their transfer shape differs"));
        }
        if chunk >= self.n_chunks {
            self.error(bad("chunk out of range"));
            return None;
        }
        let (word, bit) = ((chunk / 64) as usize, 1u64 << (chunk % 64));
        let Some(seen) = self.seen.get_mut(word) else {
            self.error(bad("chunk out of range"));
            return None;
        };
        if *seen & bit != 0 {
            self.error(bad("a chunk arrived twice"));
            return None;
        }
        *seen |= bit;
        self.n_seen += 1;
        if code != codes::SUCCESS {
            self.error((code, msg.to_string()));
        }
        if self.ended || self.n_seen < self.n_chunks {
            return None;
        }
        self.ended = true;
        Some(
            self.first_err
                .take()
                .unwrap_or((codes::SUCCESS, String::new())),
        )
    }

    fn error(&mut self, e: (u32, String)) {
        if self.first_err.is_none() {
            self.first_err = Some(e);
        }
    }

    /// FINISH ended the transfer (the initiator failed it early): no COMPLETE follows for
    /// its chunks, and later reports are only counted. Whether it was still running (false:
    /// an earlier FINISH ended it).
    pub fn end(&mut self) -> bool {
        !std::mem::replace(&mut self.ended, true)
    }
}

/// A joined transfer's key: the initiator's key and instance, and the uid. The instance keeps
/// a restarted initiator (same key, uids from the start again) clear of its predecessor's
/// leftovers.
pub type JoinKey = (Arc<str>, u64, u64);

/// What the join table may hold, in slots of [`JOIN_SLOT_CHUNKS`] chunks (a join takes
/// [`join_slots`] of them): for one peer (by key) and for all peers together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JoinCaps {
    /// Slots one initiator key may hold.
    pub per_peer: usize,
    /// Slots all initiators together may hold.
    pub total: usize,
}

impl JoinCaps {
    /// The defaults of `TcpBackendConfig::max_joins_per_peer` and `max_joins`.
    pub const DEFAULT: JoinCaps = JoinCaps {
        per_peer: 4096,
        total: 65536,
    };
}

impl Default for JoinCaps {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The slots a join of `n_chunks` chunks takes: one per started [`JOIN_SLOT_CHUNKS`].
pub fn join_slots(n_chunks: u32) -> usize {
    n_chunks.div_ceil(JOIN_SLOT_CHUNKS).max(1) as usize
}

/// The engine's joins of multi-chunk transfers, bounded per peer and in total
/// ([`JoinCaps`]) and pruned by age. A chunk that would start a join past a cap is refused
/// (no entry is made; chunk 0's report answers the transfer with `ERR_BAD_STATE`); no peer's
/// join is ever evicted to make room for another's. The engine shares one behind a lock;
/// time is a parameter.
#[derive(Debug, Default)]
pub struct JoinMap {
    map: HashMap<JoinKey, Join>,
    /// Slots each initiator key holds; its entry goes with its last join.
    held: HashMap<Arc<str>, usize>,
    /// Slots held in all.
    slots: usize,
    caps: JoinCaps,
    refused: u64,
}

impl JoinMap {
    /// An empty table with `caps`.
    pub fn new(caps: JoinCaps) -> Self {
        Self {
            caps,
            ..Self::default()
        }
    }

    /// A chunk's result: the verdict when it completed its transfer's join, or when it is
    /// chunk 0 of a transfer refused for want of room (`ERR_BAD_STATE`: the initiator fails
    /// it; the target answers each transfer once, on its join lane, like a completed join).
    /// Another chunk refused for want of room is dropped without an answer.
    pub fn report(&mut self, r: &JoinReport<'_>, now: u64) -> Option<(u32, String)> {
        let key = (r.peer.clone(), r.instance, r.uid);
        let j = match self.entry(&key, r.op, r.n_chunks, now) {
            Ok(j) => j,
            Err(why) => return (r.chunk == 0).then_some((codes::ERR_BAD_STATE, why)),
        };
        let verdict = j.report(r.op, r.n_chunks, r.chunk, r.code, r.msg);
        if j.spent() {
            self.remove(&key);
        }
        verdict
    }

    /// FINISH ended a transfer: its join answers nothing more, and reports still on their
    /// way are only counted. Whether this FINISH ended it (false: an earlier one did; a
    /// join that already completed and went is started again, ended, and true). (With no
    /// room for its join, nothing is kept, and true: a later report starts a join that never
    /// completes, and age prunes it.)
    pub fn end(&mut self, key: JoinKey, op: Op, n_chunks: u32, now: u64) -> bool {
        let Ok(j) = self.entry(&key, op, n_chunks, now) else {
            return true;
        };
        let first = j.end();
        if j.spent() {
            self.remove(&key);
        }
        first
    }

    /// Drop joins first heard of `max_age` or longer before `now` (a chunk of theirs never
    /// arrived: its lane was lost, and the initiator failed the transfer by its deadline);
    /// how many went.
    pub fn prune(&mut self, now: u64, max_age: u64) -> usize {
        let before = self.map.len();
        let (held, slots) = (&mut self.held, &mut self.slots);
        self.map.retain(|k, j| {
            let keep = now.saturating_sub(j.created()) < max_age;
            if !keep {
                release(held, slots, &k.0, join_slots(j.n_chunks));
            }
            keep
        });
        before - self.map.len()
    }

    /// Transfers being joined.
    #[cfg(any(test, feature = "testing"))]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is.
    #[cfg(any(test, feature = "testing"))]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Slots held by `peer`'s joins, and by all (for tests of the accounting).
    #[cfg(any(test, feature = "testing"))]
    pub fn slots(&self, peer: &str) -> (usize, usize) {
        (self.held.get(peer).copied().unwrap_or(0), self.slots)
    }

    /// Initiator keys holding a join.
    #[cfg(any(test, feature = "testing"))]
    pub fn peers(&self) -> usize {
        self.held.len()
    }

    /// Chunks refused so far because a cap was reached (or their count was out of bounds).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// The join of `key`, created if this is its first word and there is room for it.
    fn entry(
        &mut self,
        key: &JoinKey,
        op: Op,
        n_chunks: u32,
        now: u64,
    ) -> Result<&mut Join, String> {
        match self.map.entry(key.clone()) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(v) => {
                let admitted = admit(&mut self.held, &mut self.slots, self.caps, &key.0, n_chunks);
                if admitted.is_err() {
                    self.refused += 1;
                }
                admitted?;
                Ok(v.insert(Join::new(op, n_chunks, now)))
            }
        }
    }

    fn remove(&mut self, key: &JoinKey) {
        if let Some(j) = self.map.remove(key) {
            release(
                &mut self.held,
                &mut self.slots,
                &key.0,
                join_slots(j.n_chunks),
            );
        }
    }
}

/// Take the slots of a new join of `n_chunks` for `peer`, if its count is in bounds and both
/// caps leave room; else why not.
fn admit(
    held: &mut HashMap<Arc<str>, usize>,
    slots: &mut usize,
    caps: JoinCaps,
    peer: &Arc<str>,
    n_chunks: u32,
) -> Result<(), String> {
    if n_chunks == 0 || n_chunks > MAX_CHUNKS_PER_TRANSFER {
        return Err(format!("a transfer of {n_chunks} chunks cannot be joined"));
    }
    let w = join_slots(n_chunks);
    let mine = held.get(peer).copied().unwrap_or(0);
    if mine + w > caps.per_peer {
        return Err(format!(
            "target busy: this initiator's multi-chunk transfers in flight hold {mine} of its \
             {} join slots (max_joins_per_peer)",
            caps.per_peer
        ));
    }
    if *slots + w > caps.total {
        return Err(format!(
            "target busy: multi-chunk transfers in flight hold {} of its {} join slots \
             (max_joins)",
            *slots, caps.total
        ));
    }
    match held.get_mut(peer) {
        Some(n) => *n += w,
        None => {
            held.insert(peer.clone(), w);
        }
    }
    *slots += w;
    Ok(())
}

/// Give back the slots of a join of `peer` that went; the peer's record goes with its last.
fn release(held: &mut HashMap<Arc<str>, usize>, slots: &mut usize, peer: &Arc<str>, w: usize) {
    *slots = slots.saturating_sub(w);
    if let Some(n) = held.get_mut(peer) {
        *n = n.saturating_sub(w);
        if *n == 0 {
            held.remove(peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_report_answers_once() {
        let mut j = Join::new(Op::Write, 3, 5);
        assert_eq!(j.report(Op::Write, 3, 2, 0, ""), None);
        assert_eq!(j.report(Op::Write, 3, 0, 0, ""), None);
        assert!(!j.ended());
        // Chunk 1 comes last, whichever chunk it is: its report carries the verdict.
        assert_eq!(j.report(Op::Write, 3, 1, 0, ""), Some((0, String::new())));
        assert!(j.ended() && j.spent());
        assert_eq!(j.report(Op::Write, 3, 1, 0, ""), None, "answered once");
        assert_eq!(j.created(), 5);
    }

    #[test]
    fn the_first_error_wins_and_inconsistencies_fail_the_transfer() {
        let mut j = Join::new(Op::Read, 2, 0);
        assert_eq!(
            j.report(Op::Read, 2, 1, codes::ERR_INVALID_ARGS, "out of range"),
            None
        );
        assert_eq!(
            j.report(Op::Read, 2, 0, codes::ERR_NOT_FOUND, "later"),
            Some((codes::ERR_INVALID_ARGS, "out of range".into()))
        );
        for bad in [
            (Op::Write, 2, 0),
            (Op::Read, 3, 0),
            (Op::Read, 2, 9),
            (Op::Read, 2, 1),
        ] {
            let mut j = Join::new(Op::Read, 2, 0);
            assert_eq!(j.report(Op::Read, 2, 1, 0, ""), None);
            // Counted only when it named a chunk not yet seen; then chunk 0 is still due.
            let got = match j.report(bad.0, bad.1, bad.2, 0, "") {
                Some(v) => v,
                None => j.report(Op::Read, 2, 0, 0, "").expect("complete"),
            };
            assert_eq!(got.0, codes::ERR_BAD_STATE, "{bad:?}: {got:?}");
        }
    }

    #[test]
    fn finish_ends_it_without_an_answer() {
        let mut j = Join::new(Op::Write, 2, 0);
        assert_eq!(j.report(Op::Write, 2, 0, 0, ""), None);
        assert!(j.end(), "the first FINISH ends it");
        assert!(
            !j.end(),
            "a FINISH from another of its lanes finds it ended"
        );
        assert!(j.ended() && !j.spent());
        assert_eq!(j.report(Op::Write, 2, 1, 0, ""), None);
        assert!(j.spent());
    }

    fn rep<'a>(p: &'a Arc<str>, uid: u64, n_chunks: u32, chunk: u32) -> JoinReport<'a> {
        JoinReport {
            peer: p,
            instance: 1,
            uid,
            op: Op::Write,
            n_chunks,
            chunk,
            code: codes::SUCCESS,
            msg: "",
        }
    }

    #[test]
    fn the_map_answers_once_and_prunes_by_age() {
        let mut m = JoinMap::default();
        let p: Arc<str> = "peer".into();
        assert_eq!(m.report(&rep(&p, 7, 2, 0), 1), None);
        assert_eq!(
            m.report(&rep(&p, 7, 2, 1), 2),
            Some((codes::SUCCESS, String::new()))
        );
        assert!(m.is_empty(), "a spent join goes");
        assert_eq!((m.slots("peer"), m.peers()), ((0, 0), 0), "and its slots");
        assert!(m.end((p.clone(), 1, 8), Op::Write, 2, 3));
        assert!(!m.end((p.clone(), 1, 8), Op::Write, 2, 3), "ended already");
        assert_eq!(m.report(&rep(&p, 8, 2, 0), 4), None);
        assert_eq!(
            m.report(&rep(&p, 8, 2, 1), 4),
            None,
            "ended: counted, never answered"
        );
        assert!(m.is_empty());
        for uid in 0..100 {
            m.report(&rep(&p, 100 + uid, 2, 0), 10 + uid);
        }
        assert_eq!(m.prune(19, 10), 0);
        assert_eq!(m.prune(20, 10), 1, "the oldest");
        assert_eq!(m.prune(1 << 40, 1), 99);
        assert_eq!(
            (m.slots("peer"), m.peers()),
            ((0, 0), 0),
            "slots given back"
        );
    }

    #[test]
    fn a_peer_over_its_cap_is_refused_and_no_one_is_evicted() {
        let caps = JoinCaps {
            per_peer: 4,
            total: 6,
        };
        let mut m = JoinMap::new(caps);
        let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) = ("a".into(), "b".into(), "c".into());
        for uid in 0..4 {
            assert_eq!(m.report(&rep(&a, uid, 2, 1), 0), None);
        }
        assert_eq!(m.slots("a"), (4, 4));
        // A fifth: chunk 1 is dropped silently, chunk 0 answers the refusal.
        assert_eq!(m.report(&rep(&a, 4, 2, 1), 0), None);
        let (code, msg) = m.report(&rep(&a, 4, 2, 0), 0).expect("refused");
        assert_eq!(code, codes::ERR_BAD_STATE);
        assert!(msg.contains("max_joins_per_peer"), "{msg}");
        assert_eq!((m.len(), m.refused()), (4, 2));
        // Another peer still gets room, up to the total; then it is refused too.
        assert_eq!(m.report(&rep(&b, 0, 2, 1), 0), None);
        assert_eq!(m.report(&rep(&b, 1, 2, 1), 0), None);
        let (_, msg) = m.report(&rep(&c, 0, 2, 0), 0).expect("refused");
        assert!(msg.contains("max_joins)"), "{msg}");
        // a's joins were all kept: each still completes.
        for uid in 0..4 {
            assert_eq!(
                m.report(&rep(&a, uid, 2, 0), 0),
                Some((codes::SUCCESS, String::new()))
            );
        }
        assert_eq!((m.slots("a"), m.peers()), ((0, 2), 1), "a's record went");
        // Room again for a.
        assert_eq!(m.report(&rep(&a, 9, 2, 1), 0), None);
    }

    #[test]
    fn large_joins_take_slots_by_their_chunks_and_counts_are_bounded() {
        assert_eq!(join_slots(1), 1);
        assert_eq!(join_slots(JOIN_SLOT_CHUNKS), 1);
        assert_eq!(join_slots(JOIN_SLOT_CHUNKS + 1), 2);
        assert_eq!(join_slots(MAX_CHUNKS_PER_TRANSFER), 2048);
        let mut m = JoinMap::new(JoinCaps {
            per_peer: 2048,
            total: 4096,
        });
        let p: Arc<str> = "p".into();
        assert_eq!(m.report(&rep(&p, 1, MAX_CHUNKS_PER_TRANSFER, 5), 0), None);
        assert_eq!(m.slots("p"), (2048, 2048));
        assert!(m.report(&rep(&p, 2, 2, 0), 0).is_some(), "no room left");
        // Counts a target must never join, whatever got past the frame checks.
        for n in [0, MAX_CHUNKS_PER_TRANSFER + 1, u32::MAX] {
            assert_eq!(
                m.report(&rep(&p, 3, n, 0), 0).map(|v| v.0),
                Some(codes::ERR_BAD_STATE),
                "{n}"
            );
            m.end((p.clone(), 1, 3), Op::Write, n, 0);
        }
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn a_join_is_small() {
        // What the documented estimate (about 160 bytes per join of up to 64 chunks, plus
        // 8 bytes per further 64) rests on.
        assert!(
            std::mem::size_of::<Join>() <= 88,
            "{}",
            std::mem::size_of::<Join>()
        );
        assert!(std::mem::size_of::<JoinKey>() <= 32);
        let j = Join::new(Op::Write, MAX_CHUNKS_PER_TRANSFER, 0);
        assert_eq!(j.seen.capacity() * 8, 128 << 10);
    }
}
