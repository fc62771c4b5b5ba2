//! The owner-side state machine of one outbound transfer: chunk results in, FINISH and the
//! final status out. Time is a parameter (`now` in any monotonic unit the caller chooses).

use super::codes;

/// Where a transfer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Chunks are on the wire; waiting for their results.
    Chunks,
    /// Every chunk answered; FINISH sent, waiting for COMPLETE.
    Finishing,
    /// Terminal: the status has been decided.
    Done,
}

/// What the owner must do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send FINISH with this verdict.
    SendFinish {
        /// First error over the chunks, or success.
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
/// A transfer sent as a single FINAL chunk ends with [`Outbound::on_complete`]. A multi-chunk
/// transfer collects one result per chunk ([`Outbound::on_chunk`]); when the last arrives the
/// machine asks for FINISH (carrying the first error), and the COMPLETE that answers it ends
/// the transfer. A lost lane ([`Outbound::on_lane_lost`]) or the deadline
/// ([`Outbound::on_tick`]) ends it at once with `ERR_BAD_STATE`.
#[derive(Clone, Debug)]
pub struct Outbound {
    answered: Vec<bool>,
    n_answered: u32,
    first_err: Option<(u32, String)>,
    phase: Phase,
    deadline: u64,
    single: bool,
}

impl Outbound {
    /// A transfer of `n_chunks` chunks (1 = a single FINAL chunk) that must end by `deadline`.
    pub fn new(n_chunks: u32, deadline: u64) -> Self {
        Self {
            answered: vec![false; n_chunks as usize],
            n_answered: 0,
            first_err: None,
            phase: Phase::Chunks,
            deadline,
            single: n_chunks == 1,
        }
    }

    /// Current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The deadline given at creation.
    pub fn deadline(&self) -> u64 {
        self.deadline
    }

    /// A chunk was answered (ACK or READ_DATA of a multi-chunk transfer).
    pub fn on_chunk(
        &mut self,
        chunk: u32,
        code: u32,
        msg: &str,
    ) -> Result<Option<Action>, Violation> {
        if self.phase != Phase::Chunks || self.single {
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
        if self.n_answered as usize == self.answered.len() {
            self.phase = Phase::Finishing;
            let (code, msg) = self
                .first_err
                .clone()
                .unwrap_or((codes::SUCCESS, String::new()));
            return Ok(Some(Action::SendFinish { code, msg }));
        }
        Ok(None)
    }

    /// COMPLETE arrived (or a FINAL READ_DATA): the target has recorded its inbound status.
    pub fn on_complete(&mut self, code: u32, msg: &str) -> Result<Action, Violation> {
        let expected = if self.single {
            Phase::Chunks
        } else {
            Phase::Finishing
        };
        if self.phase != expected {
            return Err(Violation::WrongPhase(self.phase));
        }
        self.phase = Phase::Done;
        // The target echoes our verdict; if it disagrees, the first error still wins.
        let (code, msg) = match (&self.first_err, code) {
            (Some((c, m)), _) => (*c, m.clone()),
            (None, c) => (c, msg.to_string()),
        };
        Ok(Action::Complete { code, msg })
    }

    /// A lane carrying part of this transfer failed: the transfer fails now.
    pub fn on_lane_lost(&mut self, msg: &str) -> Option<Action> {
        self.fail(codes::ERR_BAD_STATE, msg)
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

    #[test]
    fn single_chunk_completes_on_complete() {
        let mut o = Outbound::new(1, 10);
        assert!(o.on_chunk(0, 0, "").is_err());
        assert_eq!(
            o.on_complete(0, "").unwrap(),
            Action::Complete {
                code: 0,
                msg: String::new()
            }
        );
        assert_eq!(o.on_tick(100), None);
    }

    #[test]
    fn multi_chunk_first_error_wins() {
        let mut o = Outbound::new(3, 10);
        assert_eq!(o.on_chunk(1, 0, "").unwrap(), None);
        assert_eq!(o.on_chunk(2, 12, "gone").unwrap(), None);
        assert_eq!(o.on_chunk(2, 0, ""), Err(Violation::DuplicateChunk(2)));
        assert_eq!(o.on_chunk(7, 0, ""), Err(Violation::UnknownChunk(7)));
        assert_eq!(
            o.on_chunk(0, 11, "later").unwrap(),
            Some(Action::SendFinish {
                code: 12,
                msg: "gone".into()
            })
        );
        assert_eq!(
            o.on_complete(0, "").unwrap(),
            Action::Complete {
                code: 12,
                msg: "gone".into()
            }
        );
    }

    #[test]
    fn deadline_and_lane_loss() {
        let mut o = Outbound::new(2, 10);
        assert_eq!(o.on_tick(9), None);
        assert!(matches!(
            o.on_tick(10),
            Some(Action::Complete { code: 14, .. })
        ));
        assert_eq!(o.on_lane_lost("x"), None);
        let mut o = Outbound::new(2, 10);
        assert!(matches!(
            o.on_lane_lost("lost"),
            Some(Action::Complete { code: 14, .. })
        ));
        assert!(o.on_chunk(0, 0, "").is_err());
    }
}
