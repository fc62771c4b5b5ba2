//! Target side of multi-chunk transfers: every served chunk reports to the shard serving the
//! transfer's join lane (the lane of chunk 0), which joins the reports ([`Join`]) and, once
//! all are in, records the inbound status and queues COMPLETE on chunk 0's connection
//! ([`Outbox`]). Entries are bounded in number and age.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};

use super::{now_ns, Shard, ShardMsg};
use crate::proto::frame::{Frame, Op, Reply};
use crate::proto::join::Join;
use crate::status::StatusCode;
use crate::trace;

/// Transfers one shard joins at once; past this the oldest is dropped (its initiator then
/// times out), so a peer cannot grow the table without bound.
pub(crate) const MAX_JOINS: usize = 16384;

/// Answers queued for one served connection by other tasks of its shard (the join of a
/// transfer whose chunk 0 it carried), sent by the connection's own task between frames, or
/// straight away when that task is waiting with nothing unsent ([`Outbox::idle`]).
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    frames: RefCell<VecDeque<Queued>>,
    waker: RefCell<Option<Waker>>,
    /// The connection's socket while its task waits for the next frame or answer with
    /// nothing left unsent: the stream is between frames, so an answer may leave at once.
    idle_fd: Cell<Option<RawFd>>,
}

/// What waits in an [`Outbox`].
#[derive(Debug)]
pub(crate) enum Queued {
    Frame(Frame),
    /// The rest of an encoded answer the socket took only part of (it goes first).
    Bytes(Vec<u8>),
}

impl Outbox {
    /// Send `f` now if the connection is idle, else queue it and wake the connection's task.
    /// Whether it left now.
    pub fn push(&self, f: Frame) -> bool {
        if let Some(fd) = self
            .idle_fd
            .get()
            .filter(|_| self.frames.borrow().is_empty())
        {
            let mut buf = Vec::new();
            f.encode(0, &mut buf);
            let sent = try_send(fd, &buf);
            if sent == buf.len() {
                return true;
            }
            // Partly taken (or not at all: full, or an error the task will meet itself).
            buf.drain(..sent);
            self.queue(Queued::Bytes(buf));
            return false;
        }
        self.queue(Queued::Frame(f));
        false
    }

    fn queue(&self, q: Queued) {
        self.frames.borrow_mut().push_back(q);
        let w = self.waker.borrow_mut().take();
        if let Some(w) = w {
            w.wake();
        }
    }

    /// The next queued answer.
    pub fn pop(&self) -> Option<Queued> {
        self.frames.borrow_mut().pop_front()
    }

    /// Resolves once an answer is queued.
    pub fn ready(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.frames.borrow().is_empty() {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
    }

    /// The connection's task waits on socket `fd` with nothing unsent, until the guard drops.
    pub fn idle(&self, fd: RawFd) -> IdleGuard<'_> {
        self.idle_fd.set(Some(fd));
        IdleGuard(self)
    }
}

/// Ends an [`Outbox::idle`] stretch (also when the waiting task is dropped).
pub(crate) struct IdleGuard<'a>(&'a Outbox);

impl Drop for IdleGuard<'_> {
    fn drop(&mut self) {
        self.0.idle_fd.set(None);
    }
}

/// One non-blocking send of `buf` on `fd`: how many bytes the socket took (0 on any error).
fn try_send(fd: RawFd, buf: &[u8]) -> usize {
    // SAFETY: `fd` is the connection's open socket (its task is alive and waiting while it is
    // idle); `buf` is a valid slice.
    let r = unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    usize::try_from(r).unwrap_or(0)
}

/// Where chunk 0 says to answer: its connection's outbox and its tag.
#[derive(Debug)]
pub(crate) struct Answer {
    pub outbox: Rc<Outbox>,
    pub tag: u64,
}

/// One chunk's result, sent to the join shard.
#[derive(Debug)]
pub(crate) struct JoinReport {
    pub peer: Arc<str>,
    /// The initiator's instance ([`crate::proto::frame::Hello::instance`]).
    pub instance: u64,
    pub uid: u64,
    pub op: Op,
    pub n_chunks: u32,
    pub chunk: u32,
    pub code: u32,
    pub msg: String,
}

/// A joined transfer: initiator key and instance, uid. The instance keeps a restarted
/// initiator (same key, uids from the start again) clear of its predecessor's leftovers.
type Key = (Arc<str>, u64, u64);

/// The transfers a shard joins.
#[derive(Debug, Default)]
pub(crate) struct JoinTable {
    map: HashMap<Key, Join<Answer>>,
}

fn status_of(code: u32) -> StatusCode {
    StatusCode::from_u32(code).unwrap_or(StatusCode::ErrBadState)
}

/// Report a chunk other than chunk 0 to the join shard of `join_lane` (this one, handled at
/// once, or another, by message).
pub(crate) fn report(shard: &Rc<Shard>, join_lane: u16, r: JoinReport) {
    let to = shard.lane_shard(join_lane);
    if to == shard.id {
        on_report(shard, r, None);
    } else {
        shard.send(to, ShardMsg::Joined(Box::new(r)));
    }
}

/// A chunk's result arrives at its join shard.
pub(crate) fn on_report(shard: &Rc<Shard>, r: JoinReport, answer: Option<Answer>) {
    let key = (r.peer.clone(), r.instance, r.uid);
    let mut t = shard.joins.borrow_mut();
    if !t.map.contains_key(&key) && t.map.len() >= MAX_JOINS {
        evict_oldest(&mut t);
    }
    let j = t
        .map
        .entry(key.clone())
        .or_insert_with(|| Join::new(r.op, r.n_chunks, now_ns()));
    j.report(r.op, r.n_chunks, r.chunk, r.code, &r.msg);
    if let Some(a) = answer {
        j.set_answer(a);
    }
    let ready = j.ready();
    if j.spent() {
        t.map.remove(&key);
    }
    drop(t);
    if let Some((a, code, msg)) = ready {
        trace::mark(r.uid, trace::stage::T_FINISH);
        // The inbound status exists before the initiator can see the completion.
        shard
            .shared
            .inbound
            .record(&r.peer, r.uid, status_of(code), &msg);
        shard.stats.borrow_mut().inbound_transfers += 1;
        let now = a.outbox.push(Frame::Complete(Reply {
            tag: a.tag,
            uid: r.uid,
            chunk: 0,
            code,
            msg,
        }));
        if now {
            trace::mark(r.uid, trace::stage::T_ANSWERED);
            shard.stats.borrow_mut().direct_answers += 1;
        }
    }
}

fn evict_oldest(t: &mut JoinTable) {
    let oldest = t
        .map
        .iter()
        .min_by_key(|(_, j)| j.created())
        .map(|(k, _)| k.clone());
    if let Some(k) = oldest {
        log::warn!(
            "more than {MAX_JOINS} striped transfers in flight on one shard: dropping {} from {}",
            k.2,
            k.0
        );
        t.map.remove(&k);
    }
}

/// FINISH ended a transfer on the lane of its chunk 0 (a chunk never left the initiator):
/// its join answers nothing more, and reports still on their way are only counted.
pub(crate) fn end(
    shard: &Rc<Shard>,
    (peer, instance, uid): (&Arc<str>, u64, u64),
    op: Op,
    n_chunks: u32,
) {
    let mut t = shard.joins.borrow_mut();
    let key = (peer.clone(), instance, uid);
    if !t.map.contains_key(&key) && t.map.len() >= MAX_JOINS {
        evict_oldest(&mut t);
    }
    let j = t
        .map
        .entry(key.clone())
        .or_insert_with(|| Join::new(op, n_chunks, now_ns()));
    j.end();
    if j.spent() {
        t.map.remove(&key);
    }
}

/// Drop joins older than `max_age_ns`: a chunk of theirs never arrived (its lane was lost),
/// and the initiator has failed the transfer by its own deadline.
pub(crate) fn prune(shard: &Rc<Shard>, now: u64, max_age_ns: u64) {
    let mut t = shard.joins.borrow_mut();
    let before = t.map.len();
    t.map
        .retain(|_, j| now.saturating_sub(j.created()) < max_age_ns);
    if t.map.len() < before {
        log::debug!(
            "shard {}: dropped {} incomplete striped transfers",
            shard.id,
            before - t.map.len()
        );
    }
}
