//! Read data that must not land after its transfer's failure is reported: the read transfers
//! whose bytes a lane is putting into local memory, stopped when one is cancelled, and the
//! owner's acknowledgement held back while copies of it into GPU memory may still run.
//!
//! A read's chunk is *placing* from the moment its READ_DATA is matched (the lane's book no
//! longer holds it, so cancelling the transfer there cannot reach it) until its bytes are in
//! place, or its copies into device memory have completed. Cancelling the transfer sets the
//! chunk's [`Abort`]: the reader stops before its next receive, and nothing reaches host
//! memory after that (bytes land there only inside a receive), so the owner is answered at
//! once. Copies into device memory already queued still run: the owner is answered when the
//! reader has waited for them.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use super::super::msg::ShardMsg;
use super::super::Shard;
use super::Lane;
use crate::proto::dispatch::TransferRef;
use crate::transport::abort::Abort;

/// A read transfer with chunks being placed on one lane.
pub(super) struct Placing {
    to: TransferRef,
    abort: Rc<Abort>,
    /// Its chunks being placed or landing.
    depth: u32,
    /// Whether bytes of it go into device memory (copies may run after the reader stops).
    device: bool,
    /// Owners to answer once nothing of it can land any more.
    acks: Vec<Ack>,
}

/// An owner's acknowledgement for a cancelled transfer, shared by this shard's lanes that
/// still place it: the last of them sends it.
struct Ack {
    owner: usize,
    peer: Arc<str>,
    left: Rc<Cell<usize>>,
}

/// A chunk of `to` starts placing: its stop flag (shared by the transfer's chunks on the
/// lane); `device` when its bytes go into GPU memory.
pub(super) fn begin(lane: &Lane, to: TransferRef, device: bool) -> Rc<Abort> {
    let mut all = lane.placing.borrow_mut();
    if let Some(p) = all.iter_mut().find(|p| p.to == to) {
        p.depth += 1;
        p.device |= device;
        return p.abort.clone();
    }
    let abort = Abort::new();
    all.push(Placing {
        to,
        abort: abort.clone(),
        depth: 1,
        device,
        acks: Vec::new(),
    });
    abort
}

/// Whether `to` was cancelled while placing on the lane.
pub(super) fn aborted(lane: &Lane, to: TransferRef) -> bool {
    lane.placing
        .borrow()
        .iter()
        .any(|p| p.to == to && p.abort.is_set())
}

/// A chunk of `to` is in place, dropped or failed (its copies done): the last one answers
/// the owners waiting for it.
pub(super) fn end(shard: &Rc<Shard>, lane: &Lane, to: TransferRef) {
    let done = {
        let mut all = lane.placing.borrow_mut();
        let Some(i) = all.iter().position(|p| p.to == to) else {
            return;
        };
        all[i].depth -= 1;
        if all[i].depth > 0 {
            return;
        }
        all.swap_remove(i)
    };
    answer(shard, done);
}

/// The lane stops reading (it died): nothing of what it placed can land any more.
pub(super) fn end_all(shard: &Rc<Shard>, lane: &Lane) {
    let all = std::mem::take(&mut *lane.placing.borrow_mut());
    shard
        .dying_lanes
        .borrow_mut()
        .retain(|l| !std::ptr::eq(Rc::as_ptr(l), lane));
    for p in all {
        answer(shard, p);
    }
}

fn answer(shard: &Rc<Shard>, p: Placing) {
    for a in p.acks {
        a.left.set(a.left.get() - 1);
        if a.left.get() == 0 {
            let (uid, gen) = (p.to.uid, p.to.gen);
            shard.send(
                a.owner,
                ShardMsg::Fenced {
                    peer: a.peer,
                    uid,
                    gen,
                    finishes: 0,
                },
            );
        }
    }
}

/// Transfer (`uid`, `gen`) was cancelled: stop its chunks placing on `lanes`. With `ack_to`,
/// whether that owner's answer waits for lanes whose copies into GPU memory of it may still
/// run (the last of them sends it); `false`: the caller answers, nothing of it can land.
pub(super) fn cancel(
    lanes: &[Rc<Lane>],
    peer: &Arc<str>,
    (uid, gen): (u64, u64),
    ack_to: Option<usize>,
) -> bool {
    let hit = |p: &Placing| (p.to.uid, p.to.gen) == (uid, gen);
    let mut waiting = Vec::new();
    for l in lanes {
        let all = l.placing.borrow();
        for p in all.iter().filter(|p| hit(p)) {
            p.abort.abort();
            if p.device {
                waiting.push(l.clone());
            }
        }
    }
    let Some(owner) = ack_to else { return false };
    if waiting.is_empty() {
        return false;
    }
    let left = Rc::new(Cell::new(waiting.len()));
    for l in waiting {
        if let Some(p) = l.placing.borrow_mut().iter_mut().find(|p| hit(p)) {
            p.acks.push(Ack {
                owner,
                peer: peer.clone(),
                left: left.clone(),
            });
        }
    }
    true
}
