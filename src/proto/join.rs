//! The target-side join of a multi-chunk transfer: the results of its chunks, from whichever
//! connections carried them, meet at the shard serving the lane that carried chunk 0; once
//! every chunk is in and chunk 0 has said where to answer, the target records the inbound
//! status and answers COMPLETE on that lane. No FINISH round trip follows the last chunk.

use super::codes;
use super::frame::Op;

/// One multi-chunk transfer as its join shard tracks it. `A` is how to answer it (chunk 0's
/// connection and tag); time is a parameter in any monotonic unit the caller chooses.
#[derive(Debug)]
pub struct Join<A> {
    op: Op,
    n_chunks: u32,
    seen: Vec<u64>,
    n_seen: u32,
    first_err: Option<(u32, String)>,
    answer: Option<A>,
    ended: bool,
    created: u64,
}

impl<A> Join<A> {
    /// A transfer of `n_chunks` chunks of `op`, first heard of at `now`.
    pub fn new(op: Op, n_chunks: u32, now: u64) -> Self {
        Self {
            op,
            n_chunks,
            seen: vec![0; (n_chunks as usize).div_ceil(64)],
            n_seen: 0,
            first_err: None,
            answer: None,
            ended: false,
            created: now,
        }
    }

    /// When it was first heard of.
    pub fn created(&self) -> u64 {
        self.created
    }

    /// Whether it has been answered (or ended by FINISH).
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
    pub fn report(&mut self, op: Op, n_chunks: u32, chunk: u32, code: u32, msg: &str) {
        let bad = |why: &str| (codes::ERR_BAD_STATE, format!("inconsistent chunks: {why}"));
        if op != self.op || n_chunks != self.n_chunks {
            self.error(bad("their transfer shape differs"));
        }
        if chunk >= self.n_chunks {
            return self.error(bad("chunk out of range"));
        }
        let (word, bit) = ((chunk / 64) as usize, 1u64 << (chunk % 64));
        if self.seen[word] & bit != 0 {
            return self.error(bad("a chunk arrived twice"));
        }
        self.seen[word] |= bit;
        self.n_seen += 1;
        if code != codes::SUCCESS {
            self.error((code, msg.to_string()));
        }
    }

    fn error(&mut self, e: (u32, String)) {
        if self.first_err.is_none() {
            self.first_err = Some(e);
        }
    }

    /// Chunk 0 arrived and says how to answer. A second answer is a broken peer: the
    /// verdict becomes `ERR_BAD_STATE` and the first answer stays.
    pub fn set_answer(&mut self, a: A) {
        if self.answer.is_some() {
            return self.error((
                codes::ERR_BAD_STATE,
                "inconsistent chunks: chunk 0 arrived twice".into(),
            ));
        }
        self.answer = Some(a);
    }

    /// The answer and verdict, once every chunk is in and chunk 0 said where to answer (and
    /// only once): the caller records the inbound status, then sends COMPLETE.
    pub fn ready(&mut self) -> Option<(A, u32, String)> {
        if self.ended || self.n_seen < self.n_chunks {
            return None;
        }
        let a = self.answer.take()?;
        self.ended = true;
        let (code, msg) = self
            .first_err
            .take()
            .unwrap_or((codes::SUCCESS, String::new()));
        Some((a, code, msg))
    }

    /// FINISH ended the transfer (the initiator failed a chunk before it left): no COMPLETE
    /// for chunk 0 will follow, and later reports are only counted.
    pub fn end(&mut self) {
        self.ended = true;
        self.answer = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_once_every_chunk_and_the_answer_are_in() {
        let mut j = Join::new(Op::Write, 3, 5);
        j.report(Op::Write, 3, 2, 0, "");
        j.report(Op::Write, 3, 0, 0, "");
        assert!(j.ready().is_none());
        j.set_answer("lane0");
        assert!(j.ready().is_none(), "chunk 1 is missing");
        j.report(Op::Write, 3, 1, 0, "");
        assert_eq!(j.ready(), Some(("lane0", 0, String::new())));
        assert!(j.ready().is_none(), "answered once");
        assert!(j.spent());
        assert_eq!(j.created(), 5);
    }

    #[test]
    fn the_first_error_wins_and_inconsistencies_fail_the_transfer() {
        let mut j = Join::new(Op::Read, 2, 0);
        j.set_answer(1);
        j.report(Op::Read, 2, 1, codes::ERR_INVALID_ARGS, "out of range");
        j.report(Op::Read, 2, 0, codes::ERR_NOT_FOUND, "later");
        assert_eq!(
            j.ready(),
            Some((1, codes::ERR_INVALID_ARGS, "out of range".into()))
        );
        for bad in [
            (Op::Write, 2, 0),
            (Op::Read, 3, 0),
            (Op::Read, 2, 9),
            (Op::Read, 2, 1),
        ] {
            let mut j = Join::new(Op::Read, 2, 0);
            j.set_answer(1);
            j.report(Op::Read, 2, 1, 0, "");
            j.report(bad.0, bad.1, bad.2, 0, "");
            // Counted only when it named a chunk not yet seen; then chunk 0 is still due.
            let got = match j.ready() {
                Some(v) => v,
                None => {
                    j.report(Op::Read, 2, 0, 0, "");
                    j.ready().expect("complete")
                }
            };
            assert_eq!(got.1, codes::ERR_BAD_STATE, "{bad:?}: {got:?}");
        }
        let mut j = Join::new(Op::Write, 1, 0);
        j.set_answer(1);
        j.set_answer(2);
        j.report(Op::Write, 1, 0, 0, "");
        assert_eq!(j.ready().unwrap().0, 1);
    }

    #[test]
    fn finish_ends_it_without_an_answer() {
        let mut j = Join::new(Op::Write, 2, 0);
        j.set_answer(7);
        j.report(Op::Write, 2, 0, 0, "");
        j.end();
        assert!(j.ended() && !j.spent());
        j.report(Op::Write, 2, 1, 0, "");
        assert!(j.ready().is_none());
        assert!(j.spent());
    }
}
