//! Target side of multi-chunk transfers: every served chunk reports to the shard serving the
//! transfer's join lane (the lane of chunk 0), which joins the reports ([`Join`]) and, once
//! all are in, records the inbound status and queues COMPLETE on chunk 0's connection
//! ([`Outbox`]). Entries are bounded in number and age.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
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
/// transfer whose chunk 0 it carried), sent by the connection's own task between frames.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    frames: RefCell<VecDeque<Frame>>,
    waker: RefCell<Option<Waker>>,
}

impl Outbox {
    /// Queue `f` and wake the connection's task.
    pub fn push(&self, f: Frame) {
        self.frames.borrow_mut().push_back(f);
        let w = self.waker.borrow_mut().take();
        if let Some(w) = w {
            w.wake();
        }
    }

    /// The next queued answer.
    pub fn pop(&self) -> Option<Frame> {
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
        a.outbox.push(Frame::Complete(Reply {
            tag: a.tag,
            uid: r.uid,
            chunk: 0,
            code,
            msg,
        }));
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
