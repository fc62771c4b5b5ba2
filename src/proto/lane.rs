//! The initiator lane's book: its queue of work, the tags of the frames it sent, the answer
//! each one waits for, and what a lane's death or a transfer's cancellation takes with it.
//! Pure: the caller sends the frames, reads the answers and places their payloads.

use std::collections::{HashMap, VecDeque};

use super::dispatch::{ChunkSpec, Item, TransferRef, Work};
use super::layout::Layout;

/// What a lane reports to a transfer's owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// A non-final chunk was answered (a read's data placed, or the chunk refused).
    Chunk {
        /// The chunk.
        chunk: u32,
        /// Its code.
        code: u32,
        /// Its message.
        msg: String,
    },
    /// The target recorded the inbound status (COMPLETE, or a final READ_DATA).
    Complete {
        /// The transfer's code.
        code: u32,
        /// Its message.
        msg: String,
    },
    /// The lane carrying part of the transfer failed.
    Lost {
        /// Why.
        msg: String,
    },
    /// This side failed the transfer before its frame left (a GPU refused the staging
    /// copy): nothing of it reached the target.
    Failed {
        /// The failure.
        code: u32,
        /// Its message.
        msg: String,
    },
    /// A failed write's fence on this lane ended ([`LaneBook::fence`]): the target answered
    /// its FINISH (every chunk of it sent here before is placed or dropped), or the lane
    /// died (and was reset: what it still carried is dropped).
    Fenced,
}

/// What a cancelled transfer leaves on a lane ([`LaneBook::cancel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fence {
    /// Nothing of it can still reach the target through this lane (nothing sent, or only
    /// READ requests, whose late data the lane drops).
    None,
    /// Write chunks of it left whole but were not answered: they may still sit in the
    /// socket's send queue or on the way, and would land later.
    Unplaced,
    /// A write chunk of it is half on the wire: the stream cannot be resynchronised.
    HalfSent,
}

/// A READ request waiting for its data: where to place it.
#[derive(Debug)]
pub struct ReadWait<L> {
    /// The chunk it asked for.
    pub chunk: u32,
    /// Whether it is the whole transfer.
    pub final_: bool,
    /// The caller's handle on the local memory.
    pub local: L,
    /// Where its bytes go, in payload order.
    pub pieces: Layout,
    /// How many bytes it asked for.
    pub bytes: u64,
}

/// The answer a sent frame waits for. A write's chunk is answered by COMPLETE when it is
/// the whole transfer; a chunk of several waits unanswered (the target's join answers the
/// whole transfer on one of their lanes); a read's chunk by READ_DATA (then, of several,
/// unanswered); FINISH by COMPLETE, and so is a fence's FINISH ([`LaneBook::fence`]).
#[derive(Debug)]
enum Wait<L> {
    Write,
    Read(ReadWait<L>),
    Finish,
    Fence,
}

/// An answer as it arrives: COMPLETE or READ_DATA, before any payload is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// COMPLETE.
    Complete {
        /// Its code.
        code: u32,
        /// Its message.
        msg: String,
    },
    /// READ_DATA.
    ReadData {
        /// The chunk it answers.
        chunk: u32,
        /// Whether it answers the whole transfer.
        final_: bool,
        /// Its code.
        code: u32,
        /// Its message.
        msg: String,
    },
}

/// What to do with an answer.
#[derive(Debug)]
pub enum Matched<L> {
    /// Tell the owner; drop the payload (there is none).
    Report(TransferRef, Report),
    /// Read data to place into `wait`'s pieces (when its code is SUCCESS), then hand the
    /// result to [`LaneBook::read_done`].
    ReadData(TransferRef, ReadWait<L>, Answer),
    /// An answer for a transfer that was cancelled: discard its payload.
    Stale,
}

/// An answer that does not fit what this lane sent: the stream cannot be trusted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Violation(pub &'static str);

/// `unanswered` is pruned when it reaches at least this many entries.
const MIN_PRUNE: usize = 64;

/// A chunk kept unanswered ([`LaneBook`]'s `unanswered`): its transfer, and whether it is a
/// WRITE chunk (whose bytes may still be unplaced at the target: a cancelled write resets
/// its lane) or a READ chunk (whose data is already here).
#[derive(Clone, Copy, Debug)]
struct Kept {
    to: TransferRef,
    write: bool,
}

/// One lane's book. `L` is the caller's handle on local memory.
#[derive(Debug)]
pub struct LaneBook<L> {
    queue: VecDeque<Item<L>>,
    outstanding: HashMap<u64, (TransferRef, Wait<L>)>,
    /// Chunks of multi-chunk transfers that have nothing more of their own to wait for (a
    /// WRITE chunk once sent, a READ chunk once its data arrived), kept by tag: the target
    /// answers the whole transfer with COMPLETE on the lane of whichever chunk completed its
    /// join, with that chunk's tag, so any of them may get it. Kept while the transfer may
    /// still run, so that losing this lane fails it at once instead of at its deadline.
    unanswered: HashMap<u64, Kept>,
    prune_at: usize,
    next_tag: u64,
    writing: Option<TransferRef>,
    dead: bool,
}

impl<L> Default for LaneBook<L> {
    fn default() -> Self {
        Self {
            queue: VecDeque::new(),
            outstanding: HashMap::new(),
            unanswered: HashMap::new(),
            prune_at: MIN_PRUNE,
            next_tag: 0,
            writing: None,
            dead: false,
        }
    }
}

impl<L: Clone> LaneBook<L> {
    /// Queue work (on a live lane: a dead one's work is reported lost by [`LaneBook::die`]).
    pub fn push(&mut self, items: impl IntoIterator<Item = Item<L>>) {
        self.queue.extend(items);
    }

    /// The next frame to send: a queued chunk or FINISH, or a stripe taken from a shared
    /// write (whose item stays at the front while stripes are left).
    pub fn pop(&mut self) -> Option<(TransferRef, Sendable<L>)> {
        loop {
            let item = self.queue.pop_front()?;
            match item.work {
                Work::Chunk(spec, local) => return Some((item.to, Sendable::Chunk(spec, local))),
                Work::Finish(f) => return Some((item.to, Sendable::Finish(f))),
                Work::Shared(stripes, local) => {
                    let Some(spec) = stripes.take() else { continue };
                    let chunk = Sendable::Chunk(spec, local.clone());
                    self.queue.push_front(Item {
                        to: item.to,
                        work: Work::Shared(stripes, local),
                    });
                    return Some((item.to, chunk));
                }
            }
        }
    }
}

impl<L: Clone> LaneBook<L> {
    /// The chunk [`LaneBook::pop`] will hand out next, if the next frame is a chunk: a stripe
    /// of a shared write is taken now and queued first as this lane's own, so the lane may
    /// prepare its payload (copy it out of GPU memory) while it sends the frame before. It
    /// stays queued: a cancelled transfer drops it and a dying lane reports it, as any other.
    pub fn next_chunk(&mut self) -> Option<(TransferRef, &ChunkSpec, &L)> {
        loop {
            let item = self.queue.front_mut()?;
            let (to, taken) = match &item.work {
                Work::Chunk(..) => break,
                Work::Finish(_) => return None,
                Work::Shared(stripes, local) => {
                    (item.to, stripes.take().map(|s| (s, local.clone())))
                }
            };
            match taken {
                Some((spec, local)) => {
                    self.queue.push_front(Item {
                        to,
                        work: Work::Chunk(spec, local),
                    });
                    break;
                }
                // Every stripe is taken: the item is done, as `pop` would find.
                None => {
                    self.queue.pop_front();
                }
            }
        }
        match self.queue.front() {
            Some(Item {
                to,
                work: Work::Chunk(spec, local),
            }) => Some((*to, spec, local)),
            _ => None,
        }
    }
}

/// A frame [`LaneBook::pop`] hands out to send.
#[derive(Debug)]
pub enum Sendable<L> {
    /// A chunk, from or into `L`.
    Chunk(ChunkSpec, L),
    /// FINISH.
    Finish(super::dispatch::FinishSpec),
}

impl<L> LaneBook<L> {
    /// Whether the lane died.
    pub fn dead(&self) -> bool {
        self.dead
    }

    /// Frames queued.
    #[cfg(any(test, feature = "testing"))]
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Frames sent that still wait for their own answer (a final chunk's COMPLETE, a READ's
    /// data, FINISH's COMPLETE); chunks of several kept for their transfer's COMPLETE are
    /// not counted.
    #[cfg(any(test, feature = "testing"))]
    pub fn waiting(&self) -> usize {
        self.outstanding.len()
    }

    /// The tag of the next frame.
    pub fn next_tag(&mut self) -> u64 {
        let t = self.next_tag;
        self.next_tag += 1;
        t
    }

    /// A WRITE chunk with `tag` is about to leave (its bytes may be half sent when the
    /// transfer is cancelled: see [`LaneBook::cancel`]). `may_run` says whether a transfer
    /// may still be running (its owner's low-water mark), to prune the unanswered table.
    pub fn sending_write(
        &mut self,
        tag: u64,
        to: TransferRef,
        final_: bool,
        may_run: impl Fn(&TransferRef) -> bool,
    ) {
        if final_ {
            self.outstanding.insert(tag, (to, Wait::Write));
        } else {
            self.keep_unanswered(tag, Kept { to, write: true }, may_run);
        }
        self.writing = Some(to);
    }

    /// The frame being written left whole.
    pub fn sent(&mut self) {
        self.writing = None;
    }

    /// A frame with `tag` failed before any of it left (a GPU refused the staging copy):
    /// forget it; the caller reports [`Report::Failed`].
    pub fn unsend(&mut self, tag: u64) {
        self.outstanding.remove(&tag);
        self.unanswered.remove(&tag);
        self.writing = None;
    }

    /// The data of a READ chunk matched as `tag` (so out of the book) could not be read
    /// whole: its connection failed mid-payload. Kept so that the lane's death, next, reports
    /// its transfer lost at once (not at its deadline).
    pub fn read_cut(&mut self, tag: u64, to: TransferRef) {
        self.unanswered.insert(tag, Kept { to, write: false });
    }

    /// A READ request with `tag` is queued to leave with the next flush (so its answer can
    /// never come before this).
    pub fn sending_read(&mut self, tag: u64, to: TransferRef, wait: ReadWait<L>) {
        self.outstanding.insert(tag, (to, Wait::Read(wait)));
    }

    /// FINISH with `tag` is about to leave (`fence`: a failed write's fence on this lane,
    /// [`LaneBook::fence`]).
    pub fn sending_finish(&mut self, tag: u64, to: TransferRef, fence: bool) {
        let wait = if fence { Wait::Fence } else { Wait::Finish };
        self.outstanding.insert(tag, (to, wait));
    }

    /// Keep a chunk of several by its tag while its transfer runs (pruned of ended
    /// transfers as the table grows, so it stays within about twice the chunks in flight).
    fn keep_unanswered(&mut self, tag: u64, kept: Kept, may_run: impl Fn(&TransferRef) -> bool) {
        if self.unanswered.len() >= self.prune_at {
            self.unanswered.retain(|_, k| may_run(&k.to));
            self.prune_at = (2 * self.unanswered.len()).max(MIN_PRUNE);
        }
        self.unanswered.insert(tag, kept);
    }

    /// Whether a frame with `tag` waits for an answer of its own (not the join's COMPLETE).
    pub fn awaits(&self, tag: u64) -> bool {
        self.outstanding.contains_key(&tag)
    }

    /// An answer with `tag` for transfer `uid` arrived. One that breaks the protocol
    /// (another transfer's uid, or not what its request asked for) is a [`Violation`] and
    /// leaves the request waiting: the lane then dies, and [`LaneBook::die`] reports it.
    pub fn answer(&mut self, tag: u64, uid: u64, a: Answer) -> Result<Matched<L>, Violation> {
        let Some((to, wait)) = self.outstanding.remove(&tag) else {
            if let Answer::Complete { code, msg } = a {
                if let Some(kept) = self.unanswered.remove(&tag) {
                    let to = kept.to;
                    if to.uid != uid {
                        self.unanswered.insert(tag, kept);
                        return Err(Violation("answer names another transfer"));
                    }
                    // A chunk of several completed the target's join: COMPLETE ends the
                    // transfer.
                    return Ok(Matched::Report(to, Report::Complete { code, msg }));
                }
            }
            // The transfer was cancelled (timeout): drop its answer.
            return Ok(Matched::Stale);
        };
        if to.uid != uid {
            self.outstanding.insert(tag, (to, wait));
            return Err(Violation("answer names another transfer"));
        }
        match (a, wait) {
            (Answer::Complete { code, msg }, Wait::Write | Wait::Finish) => {
                Ok(Matched::Report(to, Report::Complete { code, msg }))
            }
            (Answer::Complete { .. }, Wait::Fence) => Ok(Matched::Report(to, Report::Fenced)),
            (a @ Answer::ReadData { chunk, final_, .. }, Wait::Read(w))
                if final_ == w.final_ && chunk == w.chunk =>
            {
                Ok(Matched::ReadData(to, w, a))
            }
            (_, wait) => {
                self.outstanding.insert(tag, (to, wait));
                Err(Violation("answer does not match its request"))
            }
        }
    }

    /// The data of a READ_DATA was placed (or refused: `code`): the report for the owner. A
    /// chunk of several then waits, unanswered, for the COMPLETE the target may send on this
    /// lane.
    pub fn read_done(
        &mut self,
        tag: u64,
        to: TransferRef,
        wait: &ReadWait<L>,
        code: u32,
        msg: String,
        may_run: impl Fn(&TransferRef) -> bool,
    ) -> Report {
        if wait.final_ {
            Report::Complete { code, msg }
        } else {
            self.keep_unanswered(tag, Kept { to, write: false }, may_run);
            Report::Chunk {
                chunk: wait.chunk,
                code,
                msg,
            }
        }
    }

    /// A transfer ended early: drop its queued and pending work, and say whether bytes of it
    /// may still reach the target's memory through this lane ([`Fence`]): then the lane must
    /// be reset, so that they cannot land after the transfer was reported failed.
    pub fn cancel(&mut self, uid: u64, gen: u64) -> Fence {
        let hit = |t: &TransferRef| (t.uid, t.gen) == (uid, gen);
        let half_sent = self.writing.is_some_and(|t| hit(&t));
        // Write chunks sent and not answered: a final chunk waiting for its COMPLETE, or a
        // chunk of several (kept until its transfer ends, so not pruned before this).
        // A fence's FINISH not yet answered stands for the chunks it fences.
        let unplaced = self
            .outstanding
            .values()
            .any(|(t, w)| hit(t) && matches!(w, Wait::Write | Wait::Fence))
            || self.unanswered.values().any(|k| k.write && hit(&k.to))
            || self
                .queue
                .iter()
                .any(|i| hit(&i.to) && matches!(&i.work, Work::Finish(f) if f.fence));
        self.queue.retain(|i| !hit(&i.to));
        self.outstanding.retain(|_, (t, _)| !hit(t));
        self.unanswered.retain(|_, k| !hit(&k.to));
        if half_sent {
            Fence::HalfSent
        } else if unplaced {
            Fence::Unplaced
        } else {
            Fence::None
        }
    }

    /// A write that failed early (a lost lane, a chunk that could not leave) is fenced on
    /// this lane: its queued work is dropped, and if chunks of it left here unanswered, or
    /// one is half sent (it is sent whole first, keeping the stream in sync), or `always`
    /// (the lane its target joins it on), FINISH (`spec`) is queued first, whose COMPLETE
    /// (reported as [`Report::Fenced`]) says they are placed or dropped: then
    /// [`Fence::Unplaced`]; [`Fence::None`] when there is nothing to fence here.
    pub fn fence(
        &mut self,
        to: TransferRef,
        spec: super::dispatch::FinishSpec,
        always: bool,
    ) -> Fence {
        let hit = |t: &TransferRef| *t == to;
        let sent = self.writing.is_some_and(|t| hit(&t))
            || self
                .outstanding
                .values()
                .any(|(t, w)| hit(t) && matches!(w, Wait::Write))
            || self.unanswered.values().any(|k| k.write && hit(&k.to));
        self.queue.retain(|i| !hit(&i.to));
        self.outstanding.retain(|_, (t, _)| !hit(t));
        self.unanswered.retain(|_, k| !hit(&k.to));
        if !(sent || always) || self.dead {
            return Fence::None;
        }
        debug_assert!(spec.fence);
        self.queue.push_front(Item {
            to,
            work: Work::Finish(spec),
        });
        Fence::Unplaced
    }

    /// The lane dies: every transfer with work queued, sent or unanswered on it (and still
    /// running, by `may_run`), each once, and apart from them the failed writes whose fence
    /// ([`LaneBook::fence`]) was queued or waited for its answer here. `None` if it was
    /// already dead.
    #[allow(clippy::type_complexity)]
    pub fn die(
        &mut self,
        may_run: impl Fn(&TransferRef) -> bool,
    ) -> Option<(Vec<TransferRef>, Vec<TransferRef>)> {
        if std::mem::replace(&mut self.dead, true) {
            return None;
        }
        let is_fence = |w: &Work<L>| matches!(w, Work::Finish(f) if f.fence);
        let mut fenced: Vec<TransferRef> = Vec::new();
        let mut hit: Vec<TransferRef> = Vec::new();
        for i in self.queue.drain(..) {
            if is_fence(&i.work) {
                fenced.push(i.to);
            } else {
                hit.push(i.to);
            }
        }
        for (_, (t, w)) in self.outstanding.drain() {
            if matches!(w, Wait::Fence) {
                fenced.push(t);
            } else {
                hit.push(t);
            }
        }
        hit.extend(
            self.unanswered
                .drain()
                .map(|(_, k)| k.to)
                .filter(|t| may_run(t)),
        );
        hit.sort_unstable();
        hit.dedup();
        self.writing = None;
        Some((hit, fenced))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::codes;
    use crate::proto::dispatch::{dispatch, DispatchParams, FinishSpec, Request, TransferRef};
    use crate::proto::frame::Op;
    use crate::proto::plan::Piece;

    fn to(uid: u64, gen: u64) -> TransferRef {
        TransferRef { owner: 0, uid, gen }
    }

    fn always(_: &TransferRef) -> bool {
        true
    }

    fn ok() -> Answer {
        Answer::Complete {
            code: codes::SUCCESS,
            msg: String::new(),
        }
    }

    fn read_wait(chunk: u32, final_: bool) -> ReadWait<()> {
        ReadWait {
            chunk,
            final_,
            local: (),
            pieces: Layout::List(vec![Piece {
                local: 0,
                remote: 0,
                len: 8,
            }]),
            bytes: 8,
        }
    }

    #[test]
    fn a_final_write_is_answered_by_its_complete_once() {
        let mut b = LaneBook::<()>::default();
        let tag = b.next_tag();
        b.sending_write(tag, to(1, 0), true, always);
        b.sent();
        assert!(matches!(
            b.answer(tag, 1, ok()),
            Ok(Matched::Report(t, Report::Complete { .. })) if t == to(1, 0)
        ));
        // A second COMPLETE with the same tag has nothing left to match.
        assert!(matches!(b.answer(tag, 1, ok()), Ok(Matched::Stale)));
        assert_eq!(b.waiting(), 0);
    }

    #[test]
    fn any_chunk_of_several_may_carry_the_join_complete() {
        let mut b = LaneBook::<()>::default();
        let (t0, t1) = (b.next_tag(), b.next_tag());
        b.sending_write(t0, to(5, 2), false, always);
        b.sending_write(t1, to(5, 2), false, always);
        assert!(matches!(b.answer(t1, 5, ok()), Ok(Matched::Report(..))));
        // The lane's death still fails the transfer through chunk t0, unless it ended.
        assert_eq!(b.die(always), Some((vec![to(5, 2)], vec![])));
        assert_eq!(b.die(always), None);
    }

    #[test]
    fn an_answer_for_another_uid_is_a_violation() {
        let mut b = LaneBook::<()>::default();
        let tag = b.next_tag();
        b.sending_write(tag, to(1, 0), false, always);
        assert!(b.answer(tag, 2, ok()).is_err());
        let tag = b.next_tag();
        b.sending_finish(tag, to(3, 0), false);
        assert!(b.answer(tag, 4, ok()).is_err());
    }

    /// A lane dies on an answer that breaks the protocol: what that answer named is still
    /// the lane's to report then (a write lost, a fence's FINISH as fenced), not dropped.
    #[test]
    fn an_answer_that_breaks_the_protocol_leaves_its_request_to_the_lanes_death() {
        let mut b = LaneBook::<()>::default();
        let (tw, tf, tc) = (b.next_tag(), b.next_tag(), b.next_tag());
        b.sending_write(tw, to(1, 0), true, always);
        b.sending_finish(tf, to(3, 0), true);
        b.sending_write(tc, to(5, 0), false, always);
        b.sent();
        assert!(b.answer(tw, 2, ok()).is_err(), "another transfer's uid");
        let data = Answer::ReadData {
            chunk: 0,
            final_: true,
            code: 0,
            msg: String::new(),
        };
        assert!(b.answer(tf, 3, data).is_err(), "READ_DATA for a FINISH");
        assert!(b.answer(tc, 6, ok()).is_err(), "another transfer's uid");
        let (mut hit, fenced) = b.die(always).expect("alive until now");
        hit.sort();
        assert_eq!((hit, fenced), (vec![to(1, 0), to(5, 0)], vec![to(3, 0)]));
    }

    /// A READ chunk whose data was cut off mid-payload is its lane's to report when it dies.
    #[test]
    fn a_read_cut_mid_payload_is_reported_by_the_lanes_death() {
        let mut b = LaneBook::<()>::default();
        let tag = b.next_tag();
        b.sending_read(tag, to(1, 0), read_wait(0, true));
        let data = Answer::ReadData {
            chunk: 0,
            final_: true,
            code: 0,
            msg: String::new(),
        };
        let Ok(Matched::ReadData(t, _, _)) = b.answer(tag, 1, data) else {
            panic!("no match");
        };
        b.read_cut(tag, t);
        assert_eq!(b.die(always), Some((vec![to(1, 0)], vec![])));
    }

    /// A failed read whose chunks' data already arrived here leaves nothing to land at its
    /// target: its lane need not be reset (which would fail the other transfers on it).
    #[test]
    fn a_cancelled_read_whose_data_arrived_needs_no_reset() {
        let mut b = LaneBook::<()>::default();
        let tag = b.next_tag();
        b.sending_read(tag, to(1, 0), read_wait(0, false));
        let data = Answer::ReadData {
            chunk: 0,
            final_: false,
            code: 0,
            msg: String::new(),
        };
        let Ok(Matched::ReadData(t, w, _)) = b.answer(tag, 1, data) else {
            panic!("no match");
        };
        b.read_done(tag, t, &w, 0, String::new(), always);
        assert_eq!(b.cancel(1, 0), Fence::None);
        // A write's chunk of several, sent and kept the same way, still needs one.
        let tag = b.next_tag();
        b.sending_write(tag, to(2, 0), false, always);
        b.sent();
        assert_eq!(b.cancel(2, 0), Fence::Unplaced);
    }

    #[test]
    fn read_data_must_match_its_request() {
        let mut b = LaneBook::<()>::default();
        let tag = b.next_tag();
        b.sending_read(tag, to(1, 0), read_wait(3, false));
        let wrong = Answer::ReadData {
            chunk: 4,
            final_: false,
            code: 0,
            msg: String::new(),
        };
        assert!(b.answer(tag, 1, wrong).is_err());
        let tag = b.next_tag();
        b.sending_read(tag, to(1, 0), read_wait(3, false));
        assert!(
            b.answer(tag, 1, ok()).is_err(),
            "COMPLETE for a READ request"
        );
        let tag = b.next_tag();
        b.sending_read(tag, to(1, 0), read_wait(3, false));
        assert_eq!(
            b.waiting(),
            3,
            "the requests answered wrongly still wait (their lane dies on the violation), and \
             this one for its data"
        );
        let right = Answer::ReadData {
            chunk: 3,
            final_: false,
            code: 0,
            msg: String::new(),
        };
        let Ok(Matched::ReadData(t, w, _)) = b.answer(tag, 1, right) else {
            panic!("no match");
        };
        let r = b.read_done(tag, t, &w, 0, String::new(), always);
        assert_eq!(
            r,
            Report::Chunk {
                chunk: 3,
                code: 0,
                msg: String::new()
            }
        );
        // The read's COMPLETE may now come on this lane with the same tag.
        assert!(matches!(
            b.answer(tag, 1, ok()),
            Ok(Matched::Report(_, Report::Complete { .. }))
        ));
    }

    #[test]
    fn cancel_drops_a_transfers_work_and_says_when_the_lane_must_be_reset() {
        let mut b = LaneBook::<()>::default();
        let t0 = b.next_tag();
        b.sending_write(t0, to(1, 0), true, always);
        assert_eq!(b.cancel(1, 0), Fence::HalfSent, "its frame is half sent");
        b.sent();
        // A whole final chunk sent, not answered: it may still land.
        let t1 = b.next_tag();
        b.sending_write(t1, to(2, 0), true, always);
        b.sent();
        assert_eq!(b.cancel(2, 0), Fence::Unplaced);
        assert!(matches!(b.answer(t1, 2, ok()), Ok(Matched::Stale)));
        // A chunk of several sent (kept unanswered): the same.
        let t2 = b.next_tag();
        b.sending_write(t2, to(3, 0), false, always);
        b.sent();
        assert_eq!(b.cancel(3, 0), Fence::Unplaced);
        // Answered (placed), or never sent, or a READ request: nothing to fence.
        let t3 = b.next_tag();
        b.sending_write(t3, to(4, 0), true, always);
        b.sent();
        assert!(matches!(b.answer(t3, 4, ok()), Ok(Matched::Report(..))));
        assert_eq!(b.cancel(4, 0), Fence::None);
        assert_eq!(b.cancel(5, 0), Fence::None);
        let t4 = b.next_tag();
        b.sending_read(t4, to(6, 0), read_wait(0, true));
        assert_eq!(b.cancel(6, 0), Fence::None);
        assert_eq!(b.die(always), Some((vec![], vec![])));
    }

    fn fence_spec() -> FinishSpec {
        FinishSpec {
            op: crate::proto::frame::Op::Write,
            n_chunks: 4,
            total: 4 << 20,
            code: codes::ERR_GPU_OP,
            msg: "refused".into(),
            fence: true,
        }
    }

    /// A write that failed early is fenced where its chunks went: FINISH first in the
    /// queue, its queued chunks dropped, the join's COMPLETE for a chunk sent here stale,
    /// and FINISH's own COMPLETE reported as the fence's answer.
    #[test]
    fn a_fence_finishes_after_the_chunks_sent_and_drops_the_rest() {
        let mut b = LaneBook::<()>::default();
        let other = to(2, 0);
        let t0 = b.next_tag();
        b.sending_write(t0, to(1, 0), false, always);
        b.sent();
        b.push([Item {
            to: other,
            work: Work::Finish(FinishSpec {
                fence: false,
                ..fence_spec()
            }),
        }]);
        assert_eq!(b.fence(to(1, 0), fence_spec(), false), Fence::Unplaced);
        assert!(matches!(b.answer(t0, 1, ok()), Ok(Matched::Stale)));
        let Some((t, Sendable::Finish(f))) = b.pop() else {
            panic!("FINISH first");
        };
        assert!(t == to(1, 0) && f.fence);
        let tag = b.next_tag();
        b.sending_finish(tag, t, true);
        b.sent();
        assert!(
            matches!(b.pop(), Some((t, _)) if t == other),
            "other work stays"
        );
        // Until its answer, the lane stands for the chunks it fences: a reset drops it.
        assert_eq!(b.cancel(1, 0), Fence::Unplaced);
        let tag = b.next_tag();
        let home = b.fence(to(3, 0), fence_spec(), true);
        assert_eq!(home, Fence::Unplaced, "the home lane always");
        let none = b.fence(to(4, 0), fence_spec(), false);
        assert_eq!(none, Fence::None, "nothing of it here");
        let Some((t, Sendable::Finish(_))) = b.pop() else {
            panic!("FINISH");
        };
        b.sending_finish(tag, t, true);
        b.sent();
        assert_eq!(
            b.answer(tag, 3, ok()).ok().and_then(|m| match m {
                Matched::Report(t, r) => Some((t, r)),
                _ => None,
            }),
            Some((to(3, 0), Report::Fenced))
        );
        // A chunk of it half sent: FINISH goes once it is whole.
        let t7 = b.next_tag();
        b.sending_write(t7, to(7, 0), false, always);
        assert_eq!(b.fence(to(7, 0), fence_spec(), false), Fence::Unplaced);
        b.sent();
        assert!(matches!(b.pop(), Some((t, Sendable::Finish(_))) if t == to(7, 0)));
        // A lane that dies with a fence unanswered reports it apart from the transfers lost.
        assert_eq!(b.fence(to(5, 0), fence_spec(), true), Fence::Unplaced);
        assert_eq!(b.die(always), Some((vec![], vec![to(5, 0)])));
        let dead = b.fence(to(6, 0), fence_spec(), true);
        assert_eq!(dead, Fence::None, "a dead lane sends nothing");
    }

    #[test]
    fn unanswered_chunks_of_ended_transfers_are_pruned_and_not_failed() {
        let mut b = LaneBook::<()>::default();
        for uid in 0..200 {
            let tag = b.next_tag();
            b.sending_write(tag, to(uid, uid), false, |t| t.gen >= 150);
        }
        assert!(b.unanswered.len() < 120, "pruned: {}", b.unanswered.len());
        let lost = b.die(|t| t.gen >= 190).unwrap().0;
        assert_eq!(lost.len(), 10);
    }

    /// Two lanes' books holding a write of eight 1 MiB chunks, its stripes shared.
    fn shared_write(uid: u64) -> (Vec<LaneBook<()>>, u32) {
        let layout = Layout::List(
            (0..8)
                .map(|i| Piece {
                    local: i << 20,
                    remote: i << 20,
                    len: 1 << 20,
                })
                .collect(),
        );
        let req = Request {
            op: Op::Write,
            mem_id: 1,
            access_key: crate::proto::access::AccessKey::NONE,
            remote_device: false,
            layout,
            total: 8 << 20,
        };
        let params = DispatchParams {
            n_lanes: 2,
            striping_threshold: 1,
            chunk_bytes: 1 << 20,
            share_stripes: true,
        };
        let plan = dispatch(req, params, 0, to(uid, 1), &()).unwrap().unwrap();
        let mut lanes: Vec<LaneBook<()>> = vec![LaneBook::default(), LaneBook::default()];
        for (l, items) in plan.lanes {
            lanes[l as usize].push(items);
        }
        (lanes, plan.n_chunks)
    }

    #[test]
    fn shared_stripes_are_taken_while_left_and_death_reports_their_transfer() {
        let (mut lanes, n_chunks) = shared_write(7);
        let mut sent = Vec::new();
        // Lane 0 takes chunk 0, then both take stripes in turn until none is left.
        while let Some((_, Sendable::Chunk(c, ()))) = lanes[0].pop() {
            sent.push(c.chunk);
            if let Some((_, Sendable::Chunk(c, ()))) = lanes[1].pop() {
                sent.push(c.chunk);
            }
        }
        sent.sort_unstable();
        assert_eq!(sent, (0..n_chunks).collect::<Vec<_>>());
        assert!(lanes[1].pop().is_none());
        assert_eq!(lanes[1].die(always), Some((vec![], vec![])));
    }

    #[test]
    fn the_next_chunk_is_fixed_for_its_lane_and_stays_its_queued_work() {
        let (mut lanes, n_chunks) = shared_write(7);
        // Lane 0's next chunk is chunk 0 (its own); once it is popped, the next is a stripe,
        // taken from the shared list now: lane 1 can no longer get it.
        assert_eq!(lanes[0].next_chunk().map(|(_, c, _)| c.chunk), Some(0));
        assert!(matches!(lanes[0].pop(), Some((_, Sendable::Chunk(c, ()))) if c.chunk == 0));
        let ahead = lanes[0].next_chunk().map(|(_, c, _)| c.chunk).unwrap();
        assert_eq!(lanes[0].next_chunk().map(|(_, c, _)| c.chunk), Some(ahead));
        let mut others = Vec::new();
        while let Some((_, Sendable::Chunk(c, ()))) = lanes[1].pop() {
            others.push(c.chunk);
        }
        assert!(!others.contains(&ahead) && others.len() as u32 == n_chunks - 2);
        // Still queued: popped next, and reported if the lane dies before sending it.
        assert!(matches!(lanes[0].pop(), Some((_, Sendable::Chunk(c, ()))) if c.chunk == ahead));
        let (mut lanes, _) = shared_write(9);
        lanes[0].pop();
        lanes[0].next_chunk().unwrap();
        assert_eq!(lanes[0].die(always), Some((vec![to(9, 1)], vec![])));
        // A cancelled transfer drops it; nothing is left to fix.
        let (mut lanes, _) = shared_write(11);
        lanes[0].pop();
        lanes[0].next_chunk().unwrap();
        assert_eq!(lanes[0].cancel(11, 1), Fence::None);
        assert!(lanes[0].next_chunk().is_none() && lanes[0].pop().is_none());
    }
}
