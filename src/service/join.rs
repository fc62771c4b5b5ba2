//! Target side of multi-chunk transfers: every served chunk reports to the engine's one join
//! table ([`Joins`]), from whichever shard serves it, and the chunk whose report completes
//! its transfer's join is answered for the whole transfer (inbound status, then COMPLETE on
//! its own connection). The table is `proto::join::JoinMap` (bounded per peer and in total,
//! and pruned by age) behind one lock, with the clock and the log added here.
//!
//! Its lock comes from `crate::sync` (std's), so `tests/loom.rs` can compile this file
//! against loom's and model-check the table; the file names nothing else of the crate but
//! `crate::proto` and its parent's `now_ns`.

use std::sync::Arc;

use super::now_ns;
use crate::proto::frame::Op;
pub(crate) use crate::proto::join::JoinReport;
use crate::proto::join::{JoinCaps, JoinMap, JoinTable};
use crate::sync::{Mutex, MutexGuard};

/// The transfers the engine joins, shared by its shards: a report is one short critical
/// section on the shard that served the chunk, so the last chunk's shard answers at once
/// instead of handing its report to another shard.
#[derive(Debug, Default)]
pub(crate) struct Joins {
    map: Mutex<JoinMap>,
}

impl Joins {
    /// An empty table bounded by `caps`.
    pub fn new(caps: JoinCaps) -> Self {
        Self {
            map: Mutex::new(JoinMap::new(caps)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, JoinMap> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A chunk's result: the verdict when it completed its transfer's join, or when chunk 0
    /// found no room for it (the caller then records the inbound status and answers
    /// COMPLETE on the chunk's connection).
    pub fn report(&self, r: &JoinReport<'_>) -> Option<(u32, String)> {
        let mut t = self.lock();
        let refused = t.refused();
        let verdict = t.report(r, now_ns());
        let now_refused = t.refused();
        drop(t);
        // Logged at the first refusal and then at every power of two, so a flood cannot
        // flood the log.
        if now_refused > refused && now_refused.is_power_of_two() {
            log::warn!(
                "refused {now_refused} chunks of multi-chunk transfers so far (join caps \
                 reached; the latest from {:?})",
                r.peer
            );
        }
        verdict
    }

    /// FINISH ended a transfer (a chunk never left the initiator): its join answers nothing
    /// more, and reports still on their way are only counted.
    pub fn end(&self, (peer, instance, uid): (&Arc<str>, u64, u64), op: Op, n_chunks: u32) -> bool {
        self.lock()
            .end((peer.clone(), instance, uid), op, n_chunks, now_ns())
    }

    /// Drop joins older than `max_age_ns`: a chunk of theirs never arrived (its lane was
    /// lost), and the initiator has failed the transfer by its own deadline.
    pub fn prune(&self, now: u64, max_age_ns: u64) {
        let dropped = self.lock().prune(now, max_age_ns);
        if dropped > 0 {
            log::debug!("dropped {dropped} incomplete striped transfers");
        }
    }

    /// Transfers being joined.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }
}

/// The engine's join table as the target's decisions see it.
impl JoinTable for Joins {
    fn report(&self, r: &JoinReport<'_>) -> Option<(u32, String)> {
        Joins::report(self, r)
    }

    fn end(&self, peer: &Arc<str>, instance: u64, uid: u64, op: Op, n_chunks: u32) -> bool {
        Joins::end(self, (peer, instance, uid), op, n_chunks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::codes;

    fn rep(peer: &Arc<str>, uid: u64, chunk: u32, code: u32) -> JoinReport<'_> {
        JoinReport {
            peer,
            instance: 1,
            uid,
            op: Op::Write,
            n_chunks: 3,
            chunk,
            code,
            msg: "",
        }
    }

    /// Runs directly here, and as a (one-thread) loom model in `tests/loom.rs`.
    #[test]
    fn the_last_report_answers_and_the_entry_goes() {
        crate::sync::model(|| {
            let j = Joins::default();
            let p: Arc<str> = "peer".into();
            assert_eq!(j.report(&rep(&p, 7, 1, codes::SUCCESS)), None);
            assert_eq!(j.report(&rep(&p, 8, 0, codes::SUCCESS)), None);
            assert_eq!(j.report(&rep(&p, 7, 2, codes::ERR_NOT_FOUND)), None);
            assert_eq!(j.len(), 2);
            let v = j.report(&rep(&p, 7, 0, codes::SUCCESS));
            assert_eq!(v.map(|v| v.0), Some(codes::ERR_NOT_FOUND));
            assert_eq!(j.len(), 1, "transfer 7 is spent");
            // FINISH ends 8; its late chunks are counted, never answered, and it goes.
            j.end((&p, 1, 8), Op::Write, 3);
            assert_eq!(j.report(&rep(&p, 8, 1, codes::SUCCESS)), None);
            assert_eq!(j.report(&rep(&p, 8, 2, codes::SUCCESS)), None);
            assert_eq!(j.len(), 0);
            // Stale joins are pruned by age.
            assert_eq!(j.report(&rep(&p, 9, 0, codes::SUCCESS)), None);
            j.prune(now_ns() + 10, 5);
            assert_eq!(j.len(), 0);
        });
    }
}
