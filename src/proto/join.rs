//! The target-side join of a multi-chunk transfer: the results of its chunks, from whichever
//! connections and shards carried them, meet in one engine-wide table; the chunk whose
//! result completes the join is answered for the whole transfer: the target records the
//! inbound status, then answers COMPLETE on that chunk's connection with its tag. No report
//! travels between shards and no FINISH round trip follows the last chunk.

use std::collections::HashMap;
use std::sync::Arc;

use super::codes;
use super::frame::Op;
use super::limits::MAX_JOINS;

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
    /// FINISH ended a transfer: its join answers nothing more.
    fn end(&self, peer: &Arc<str>, instance: u64, uid: u64, op: Op, n_chunks: u32);
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
    /// A transfer of `n_chunks` chunks of `op`, first heard of at `now`.
    pub fn new(op: Op, n_chunks: u32, now: u64) -> Self {
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
        if self.seen[word] & bit != 0 {
            self.error(bad("a chunk arrived twice"));
            return None;
        }
        self.seen[word] |= bit;
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

    /// FINISH ended the transfer (the initiator failed a chunk before it left): no COMPLETE
    /// follows for its chunks, and later reports are only counted.
    pub fn end(&mut self) {
        self.ended = true;
    }
}

/// A joined transfer's key: the initiator's key and instance, and the uid. The instance keeps
/// a restarted initiator (same key, uids from the start again) clear of its predecessor's
/// leftovers.
pub type JoinKey = (Arc<str>, u64, u64);

/// The engine's joins of multi-chunk transfers, bounded in number ([`MAX_JOINS`]: the oldest
/// goes first) and pruned by age. The engine shares one behind a lock; time is a parameter.
#[derive(Debug, Default)]
pub struct JoinMap {
    map: HashMap<JoinKey, Join>,
    evicted: u64,
}

impl JoinMap {
    /// A chunk's result: the verdict when it completed its transfer's join.
    pub fn report(&mut self, r: &JoinReport<'_>, now: u64) -> Option<(u32, String)> {
        let key = (r.peer.clone(), r.instance, r.uid);
        let j = self.entry(key.clone(), r.op, r.n_chunks, now);
        let verdict = j.report(r.op, r.n_chunks, r.chunk, r.code, r.msg);
        if j.spent() {
            self.map.remove(&key);
        }
        verdict
    }

    /// FINISH ended a transfer: its join answers nothing more, and reports still on their
    /// way are only counted.
    pub fn end(&mut self, key: JoinKey, op: Op, n_chunks: u32, now: u64) {
        let j = self.entry(key.clone(), op, n_chunks, now);
        j.end();
        if j.spent() {
            self.map.remove(&key);
        }
    }

    /// Drop joins first heard of `max_age` or longer before `now` (a chunk of theirs never
    /// arrived: its lane was lost, and the initiator failed the transfer by its deadline);
    /// how many went.
    pub fn prune(&mut self, now: u64, max_age: u64) -> usize {
        let before = self.map.len();
        self.map
            .retain(|_, j| now.saturating_sub(j.created()) < max_age);
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

    /// Joins dropped so far because the table was full.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The join of `key`, created (evicting the oldest when full) if this is its first word.
    fn entry(&mut self, key: JoinKey, op: Op, n_chunks: u32, now: u64) -> &mut Join {
        if !self.map.contains_key(&key) && self.map.len() >= MAX_JOINS {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, j)| j.created())
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.map.remove(&k);
                self.evicted += 1;
            }
        }
        self.map
            .entry(key)
            .or_insert_with(|| Join::new(op, n_chunks, now))
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
        j.end();
        assert!(j.ended() && !j.spent());
        assert_eq!(j.report(Op::Write, 2, 1, 0, ""), None);
        assert!(j.spent());
    }

    #[test]
    fn the_map_answers_once_evicts_the_oldest_and_prunes_by_age() {
        let mut m = JoinMap::default();
        let p: Arc<str> = "peer".into();
        let rep = |uid, chunk| JoinReport {
            peer: &p,
            instance: 1,
            uid,
            op: Op::Write,
            n_chunks: 2,
            chunk,
            code: codes::SUCCESS,
            msg: "",
        };
        assert_eq!(m.report(&rep(7, 0), 1), None);
        assert_eq!(
            m.report(&rep(7, 1), 2),
            Some((codes::SUCCESS, String::new()))
        );
        assert!(m.is_empty(), "a spent join goes");
        m.end((p.clone(), 1, 8), Op::Write, 2, 3);
        assert_eq!(m.report(&rep(8, 0), 4), None);
        assert_eq!(
            m.report(&rep(8, 1), 4),
            None,
            "ended: counted, never answered"
        );
        assert!(m.is_empty());
        for uid in 0..MAX_JOINS as u64 + 1 {
            m.report(&rep(100 + uid, 0), 10 + uid);
        }
        assert_eq!((m.len(), m.evicted()), (MAX_JOINS, 1));
        // The oldest (uid 100) went: its second chunk starts a new join instead of ending one.
        assert_eq!(m.report(&rep(100, 1), 1 << 40), None);
        assert_eq!(m.prune(1 << 40, 1), MAX_JOINS - 1, "all but the newest");
    }
}
