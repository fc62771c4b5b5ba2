//! The owner-side state machine of one outbound transfer: chunk results and the target's
//! COMPLETE in, the final status (or, when a chunk failed before it left, FINISH) out. Time
//! is a parameter (`now` in any monotonic unit the caller chooses).

use super::codes;

/// Where a transfer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Chunks are on the wire; waiting for the target's COMPLETE (and, for a read, every
    /// chunk's data).
    Chunks,
    /// A chunk failed on this side before it left, so the target's join cannot complete:
    /// FINISH was sent to end it there, waiting for its COMPLETE.
    Finishing,
    /// Terminal: the status has been decided.
    Done,
}

/// What the owner must do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send FINISH with this verdict (it ends the transfer at the target).
    SendFinish {
        /// The failure that stopped a chunk from leaving.
        code: u32,
        /// Its message.
        msg: String,
    },
    /// Complete the user-visible status.
    Complete {
        /// Final code.
        code: u32,
        /// Final message.
        msg: String,
    },
}

/// A result a lane reported that does not fit the transfer (a peer bug or a stale message).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A chunk index outside the transfer.
    #[error("chunk {0} out of range")]
    UnknownChunk(u32),
    /// A second result for the same chunk.
    #[error("chunk {0} answered twice")]
    DuplicateChunk(u32),
    /// An event that the current phase does not expect.
    #[error("unexpected event in phase {0:?}")]
    WrongPhase(Phase),
}

/// One outbound transfer, as its owner shard tracks it.
///
/// A transfer sent as a single FINAL chunk ends with [`Outbound::on_complete`]. A
/// multi-chunk transfer is joined on the target, which answers COMPLETE once every chunk
/// is handled there and its inbound status is recorded (on the lane of the chunk that
/// completed the join, which can be any of the transfer's lanes); a write
/// ends with that COMPLETE, a read with that COMPLETE and every chunk's data
/// ([`Outbound::on_chunk`]), in either order. A chunk that fails on this side before it
/// leaves ([`Outbound::on_local_failure`]) asks for FINISH, whose COMPLETE ends the
/// transfer. A lost lane ([`Outbound::on_lane_lost`]) or the deadline
/// ([`Outbound::on_tick`]) ends it at once with `ERR_BAD_STATE`. The first error over
/// the chunks wins.
#[derive(Clone, Debug)]
pub struct Outbound {
    answered: Vec<bool>,
    n_answered: u32,
    first_err: Option<(u32, String)>,
    completed: Option<(u32, String)>,
    phase: Phase,
    deadline: u64,
    single: bool,
    wait_chunks: bool,
}

impl Outbound {
    /// A transfer of `n_chunks` chunks (1 = a single FINAL chunk) that must end by
    /// `deadline`; `wait_chunks`: it also ends only once every chunk has been answered (a
    /// read, whose data lands here).
    pub fn new(n_chunks: u32, deadline: u64, wait_chunks: bool) -> Self {
        Self {
            answered: vec![false; n_chunks as usize],
            n_answered: 0,
            first_err: None,
            completed: None,
            phase: Phase::Chunks,
            deadline,
            single: n_chunks == 1,
            wait_chunks,
        }
    }

    /// Current phase.
    #[cfg(any(test, feature = "testing"))]
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The deadline given at creation.
    pub fn deadline(&self) -> u64 {
        self.deadline
    }

    fn all_answered(&self) -> bool {
        self.n_answered as usize == self.answered.len()
    }

    fn verdict(&self, code: u32, msg: &str) -> Action {
        let (code, msg) = match &self.first_err {
            Some((c, m)) => (*c, m.clone()),
            None => (code, msg.to_string()),
        };
        Action::Complete { code, msg }
    }

    /// A chunk of a multi-chunk transfer was answered (a read's data placed, or a chunk
    /// refused). Late results after FINISH are taken too.
    pub fn on_chunk(
        &mut self,
        chunk: u32,
        code: u32,
        msg: &str,
    ) -> Result<Option<Action>, Violation> {
        if self.phase == Phase::Done || self.single {
            return Err(Violation::WrongPhase(self.phase));
        }
        let slot = self
            .answered
            .get_mut(chunk as usize)
            .ok_or(Violation::UnknownChunk(chunk))?;
        if *slot {
            return Err(Violation::DuplicateChunk(chunk));
        }
        *slot = true;
        self.n_answered += 1;
        if code != codes::SUCCESS && self.first_err.is_none() {
            self.first_err = Some((code, msg.to_string()));
        }
        if self.phase == Phase::Chunks && self.all_answered() {
            if let Some((c, m)) = self.completed.take() {
                self.phase = Phase::Done;
                return Ok(Some(self.verdict(c, &m)));
            }
        }
        Ok(None)
    }

    /// COMPLETE arrived (or a FINAL READ_DATA): the target has recorded its inbound status.
    pub fn on_complete(&mut self, code: u32, msg: &str) -> Result<Option<Action>, Violation> {
        match self.phase {
            Phase::Done => Err(Violation::WrongPhase(self.phase)),
            Phase::Chunks if self.completed.is_some() => Err(Violation::WrongPhase(self.phase)),
            Phase::Chunks if !self.single && self.wait_chunks && !self.all_answered() => {
                self.completed = Some((code, msg.to_string()));
                Ok(None)
            }
            Phase::Chunks | Phase::Finishing => {
                self.phase = Phase::Done;
                Ok(Some(self.verdict(code, msg)))
            }
        }
    }

    /// A chunk failed on this side before any of it left (a GPU refused the staging copy):
    /// a one-chunk transfer ends now; a multi-chunk one asks for FINISH, since the target
    /// waits for that chunk.
    pub fn on_local_failure(&mut self, code: u32, msg: &str) -> Option<Action> {
        if self.phase != Phase::Chunks {
            // Done, or FINISH already on its way: the first error is kept.
            if self.phase == Phase::Finishing && self.first_err.is_none() {
                self.first_err = Some((code, msg.to_string()));
            }
            return None;
        }
        if self.single {
            return self.fail(code, msg);
        }
        if self.first_err.is_none() {
            self.first_err = Some((code, msg.to_string()));
        }
        self.phase = Phase::Finishing;
        self.completed = None;
        Some(Action::SendFinish {
            code,
            msg: msg.to_string(),
        })
    }

    /// A lane carrying part of this transfer failed: the transfer fails now.
    pub fn on_lane_lost(&mut self, msg: &str) -> Option<Action> {
        self.fail(codes::ERR_BAD_STATE, msg)
    }

    /// A lane's report about this transfer.
    pub fn on_report(&mut self, r: super::lane::Report) -> Result<Option<Action>, Violation> {
        use super::lane::Report;
        match r {
            Report::Chunk { chunk, code, msg } => self.on_chunk(chunk, code, &msg),
            Report::Complete { code, msg } => self.on_complete(code, &msg),
            Report::Lost { msg } => Ok(self.on_lane_lost(&msg)),
            Report::Failed { code, msg } => Ok(self.on_local_failure(code, &msg)),
            // A fence's answer belongs to a transfer that has left the owner's table.
            Report::Fenced => Err(Violation::WrongPhase(self.phase)),
        }
    }

    /// Time passed; fails the transfer once `now >= deadline`.
    pub fn on_tick(&mut self, now: u64) -> Option<Action> {
        if now >= self.deadline {
            self.fail(codes::ERR_BAD_STATE, "operation timeout")
        } else {
            None
        }
    }

    /// Fail the transfer with `code` unless it is already done.
    pub fn fail(&mut self, code: u32, msg: &str) -> Option<Action> {
        if self.phase == Phase::Done {
            return None;
        }
        self.phase = Phase::Done;
        Some(Action::Complete {
            code,
            msg: msg.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(code: u32, msg: &str) -> Option<Action> {
        Some(Action::Complete {
            code,
            msg: msg.into(),
        })
    }

    #[test]
    fn single_chunk_completes_on_complete() {
        let mut o = Outbound::new(1, 10, true);
        assert!(o.on_chunk(0, 0, "").is_err());
        assert_eq!(o.on_complete(0, "").unwrap(), done(0, ""));
        assert_eq!(o.on_tick(100), None);
    }

    #[test]
    fn a_joined_write_ends_with_complete_alone() {
        let mut o = Outbound::new(3, 10, false);
        assert_eq!(o.on_chunk(2, 12, "gone").unwrap(), None);
        assert_eq!(o.on_complete(0, "").unwrap(), done(12, "gone"));
        assert!(o.on_complete(0, "").is_err());
    }

    #[test]
    fn a_joined_read_needs_complete_and_every_chunk_in_either_order() {
        let mut o = Outbound::new(3, 10, true);
        assert_eq!(o.on_chunk(1, 0, "").unwrap(), None);
        assert_eq!(o.on_complete(0, "").unwrap(), None);
        assert!(o.on_complete(0, "").is_err(), "a second COMPLETE");
        assert_eq!(o.on_chunk(2, 0, "").unwrap(), None);
        assert_eq!(o.on_chunk(2, 0, ""), Err(Violation::DuplicateChunk(2)));
        assert_eq!(o.on_chunk(7, 0, ""), Err(Violation::UnknownChunk(7)));
        assert_eq!(o.on_chunk(0, 11, "late").unwrap(), done(11, "late"));
        let mut o = Outbound::new(2, 10, true);
        assert_eq!(o.on_chunk(0, 0, "").unwrap(), None);
        assert_eq!(o.on_chunk(1, 0, "").unwrap(), None);
        assert_eq!(o.on_complete(0, "").unwrap(), done(0, ""));
    }

    #[test]
    fn a_chunk_that_never_left_asks_for_finish() {
        let mut o = Outbound::new(3, 10, false);
        assert_eq!(
            o.on_local_failure(15, "gpu"),
            Some(Action::SendFinish {
                code: 15,
                msg: "gpu".into()
            })
        );
        assert_eq!(o.phase(), Phase::Finishing);
        assert_eq!(o.on_local_failure(15, "again"), None);
        assert_eq!(
            o.on_chunk(1, 0, "").unwrap(),
            None,
            "late results are taken"
        );
        assert_eq!(o.on_complete(15, "gpu").unwrap(), done(15, "gpu"));
        let mut one = Outbound::new(1, 10, false);
        assert_eq!(one.on_local_failure(15, "gpu"), done(15, "gpu"));
    }

    #[test]
    fn deadline_and_lane_loss() {
        let mut o = Outbound::new(2, 10, false);
        assert_eq!(o.on_tick(9), None);
        assert!(matches!(
            o.on_tick(10),
            Some(Action::Complete { code: 14, .. })
        ));
        assert_eq!(o.on_lane_lost("x"), None);
        let mut o = Outbound::new(2, 10, true);
        assert!(matches!(
            o.on_lane_lost("lost"),
            Some(Action::Complete { code: 14, .. })
        ));
        assert!(o.on_chunk(0, 0, "").is_err());
    }
}
