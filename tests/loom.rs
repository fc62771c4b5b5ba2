//! Model checks (loom) of the primitives that cross threads: a transfer's `TransferStatus`
//! (one completion, any number of waiters), the target's join table `Joins` (the chunks of
//! one transfer report from different shards; one report answers) and the handshakes of a
//! same-host ring's header (`ring_sync`: a parked reader always gets its doorbell, a writer
//! waiting for room is always woken; they run across processes, the model across threads).
//!
//! The checked code is the shipped code: `src/status/transfer.rs` and `src/service/join.rs`
//! are compiled into this test crate as they are. They take their primitives from
//! `crate::sync`, which in the library re-exports std's and here ([`sync`]) loom's; the few
//! other names they use from their parent modules are defined below. So the library is not
//! rebuilt under `--cfg loom`, and this runs with the other tests (`cargo test --test loom`).
//!
//! The models are small enough to explore exhaustively (no preemption bound; under a second
//! in all, debug build). Each was seen to fail on a deliberately broken primitive: a
//! code stored after the lock is released (a lost wake-up: loom reports the deadlock), a
//! message stored after the code's critical section, the first-error check made before the
//! lock, and a join taken out of the table to be updated outside the lock.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

/// The primitives the two files name through `crate::sync`: loom's.
mod sync {
    pub use loom::sync::{Condvar, Mutex, MutexGuard};

    /// Atomics.
    pub mod atomic {
        pub use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    }

    /// A unit test inside one of the files runs as a model here.
    pub fn model<F: Fn() + Send + Sync + 'static>(f: F) {
        super::check(f)
    }
}

// What `status/transfer.rs` takes from its parent (`status.rs`).
use morio::StatusCode;

/// Waiters do not spin here: the spin loop reads the clock, and every run of a model must take
/// the same steps. (The spin only repeats the lock-free read of the code that a wait makes
/// first anyway, which the models cover.)
fn wait_spin() -> Duration {
    Duration::ZERO
}

/// The adaptive spin window's statistics are not modelled.
fn record_wait(_: Duration) {}

// What `service/join.rs` takes from the crate and from its parent (`service/mod.rs`).
use morio::proto;

/// A fixed clock: joins are created at 0.
fn now_ns() -> u64 {
    0
}

#[allow(dead_code)]
#[path = "../src/status/transfer.rs"]
mod transfer;

#[allow(dead_code)]
#[path = "../src/service/join.rs"]
mod join;

#[allow(dead_code)]
#[path = "../src/transport/local/ring_sync.rs"]
mod ring_sync;

use join::{JoinReport, Joins};
use proto::codes;
use proto::frame::Op;
use transfer::TransferStatus;

/// Explore every interleaving of `f` (loom's `LOOM_*` environment variables apply).
fn check<F: Fn() + Send + Sync + 'static>(f: F) {
    loom::model::Builder::new().check(f);
}

// ---- TransferStatus -------------------------------------------------------------------------

/// A waiter that sees SUCCESS also sees the message stored with it, on both ways of waiting.
#[test]
fn a_waiter_that_sees_success_sees_its_message() {
    for bounded in [false, true] {
        check(move || {
            let s = Arc::new(TransferStatus::started());
            let done = {
                let s = s.clone();
                thread::spawn(move || s.update(StatusCode::Success, "done"))
            };
            // loom never times a wait out: the bounded wait must be woken like the other.
            let c = if bounded {
                s.wait_for(Duration::from_secs(3600))
            } else {
                s.wait()
            };
            assert_eq!(c, StatusCode::Success);
            assert_eq!(s.message(), "done");
            done.join().unwrap();
        });
    }
}

/// Two waiters, one completion: neither sleeps through it (loom fails a model in which a
/// thread blocks forever, as a deadlock).
#[test]
fn no_waiter_sleeps_through_the_completion() {
    check(|| {
        let s = Arc::new(TransferStatus::started());
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                thread::spawn(move || s.wait())
            })
            .collect();
        s.update(StatusCode::ErrRdmaOp, "lost");
        for w in waiters {
            assert_eq!(w.join().unwrap(), StatusCode::ErrRdmaOp);
        }
    });
}

/// A completion callback registered while another thread completes the status runs exactly
/// once, whichever comes first, and sees the terminal code (as an event loop's wake-up
/// must: never lost, never twice).
#[test]
fn a_completion_callback_runs_once_whoever_comes_first() {
    check(|| {
        let s = Arc::new(TransferStatus::started());
        let calls = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let done = {
            let s = s.clone();
            thread::spawn(move || s.update(StatusCode::Success, "done"))
        };
        {
            let (calls, seen) = (calls.clone(), s.clone());
            s.on_complete(move || {
                assert_eq!(seen.code(), StatusCode::Success);
                calls.fetch_add(1, loom::sync::atomic::Ordering::SeqCst);
            });
        }
        done.join().unwrap();
        assert_eq!(calls.load(loom::sync::atomic::Ordering::SeqCst), 1);
    });
}

/// Two errors race: the first one stored is the one every observer sees, with its own
/// message, and it never changes.
#[test]
fn the_first_error_wins_whatever_the_order() {
    check(|| {
        let s = Arc::new(TransferStatus::started());
        let errors = [
            (StatusCode::ErrNotFound, "not found"),
            (StatusCode::ErrBadState, "bad state"),
        ];
        let updaters: Vec<_> = errors
            .into_iter()
            .map(|(c, m)| {
                let s = s.clone();
                thread::spawn(move || s.update(c, m))
            })
            .collect();
        let seen = s.wait();
        let msg = s.message();
        assert!(
            errors.contains(&(seen, msg.as_str())),
            "{seen} with {msg:?}"
        );
        for u in updaters {
            u.join().unwrap();
        }
        assert_eq!(
            (s.code(), s.message()),
            (seen, msg),
            "the first error changed"
        );
    });
}

/// A success never overwrites an error, and an error always overwrites a success: whatever
/// the order, the error stays.
#[test]
fn an_error_beats_a_racing_success() {
    check(|| {
        let s = Arc::new(TransferStatus::started());
        let ok = {
            let s = s.clone();
            thread::spawn(move || s.update(StatusCode::Success, "ok"))
        };
        s.update(StatusCode::ErrRdmaOp, "peer abort");
        ok.join().unwrap();
        assert_eq!(s.code(), StatusCode::ErrRdmaOp);
        assert_eq!(s.message(), "peer abort");
    });
}

// ---- Joins ----------------------------------------------------------------------------------

/// Chunk `chunk` of transfer 7 (`n_chunks` chunks of a write) from "peer", instance 1.
fn report(
    j: &Joins,
    peer: &std::sync::Arc<str>,
    n_chunks: u32,
    chunk: u32,
    code: u32,
) -> Option<(u32, String)> {
    j.report(&JoinReport {
        peer,
        instance: 1,
        uid: 7,
        op: Op::Write,
        n_chunks,
        chunk,
        code,
        msg: if code == codes::SUCCESS {
            ""
        } else {
            "chunk failed"
        },
    })
}

/// Two shards report the last two chunks of a transfer at once: exactly one of them gets
/// the verdict (the first error of any chunk), and the entry is gone.
#[test]
fn of_two_racing_reports_exactly_one_answers() {
    check(|| {
        let j = Arc::new(Joins::default());
        let peer: std::sync::Arc<str> = "peer".into();
        assert_eq!(report(&j, &peer, 3, 0, codes::SUCCESS), None);
        let shards: Vec<_> = [(1, codes::ERR_NOT_FOUND), (2, codes::SUCCESS)]
            .into_iter()
            .map(|(chunk, code)| {
                let (j, peer) = (j.clone(), peer.clone());
                thread::spawn(move || report(&j, &peer, 3, chunk, code))
            })
            .collect();
        let verdicts: Vec<_> = shards
            .into_iter()
            .filter_map(|s| s.join().unwrap())
            .collect();
        assert_eq!(
            verdicts,
            [(codes::ERR_NOT_FOUND, "chunk failed".to_string())],
            "one answer, with the first error"
        );
        assert_eq!(j.len(), 0, "the spent join stays in the table");
    });
}

/// FINISH (`end`) races the last chunk's report. Either the report comes first and answers
/// (a FINISH after that finds no join and leaves an ended one behind, for `prune`), or FINISH
/// comes first and nothing answers (the report is counted and the join goes). Never both,
/// never neither.
#[test]
fn finish_racing_the_last_report_answers_at_most_once() {
    check(|| {
        let j = Arc::new(Joins::default());
        let peer: std::sync::Arc<str> = "peer".into();
        assert_eq!(report(&j, &peer, 2, 0, codes::SUCCESS), None);
        let last = {
            let (j, peer) = (j.clone(), peer.clone());
            thread::spawn(move || report(&j, &peer, 2, 1, codes::SUCCESS))
        };
        j.end((&peer, 1, 7), Op::Write, 2);
        let answered = last.join().unwrap();
        match answered {
            Some(v) => {
                assert_eq!(v, (codes::SUCCESS, String::new()));
                assert_eq!(j.len(), 1, "the late FINISH's ended join");
            }
            None => assert_eq!(j.len(), 0, "the spent join stays in the table"),
        }
        j.prune(10, 5);
        assert_eq!(j.len(), 0);
    });
}

// ---- Ring handshakes ------------------------------------------------------------------------

/// What a side sleeps on until the other rings it (a doorbell socket, a wake socket): a
/// sleeper nobody rings never wakes, which loom reports as a deadlock. A ring that finds
/// nobody asleep is kept (a byte left in the socket) and makes the next sleep return at once.
struct Bell {
    rung: loom::sync::Mutex<bool>,
    cv: loom::sync::Condvar,
}

impl Bell {
    fn new() -> Self {
        Self {
            rung: loom::sync::Mutex::new(false),
            cv: loom::sync::Condvar::new(),
        }
    }

    fn ring(&self) {
        *self.rung.lock().unwrap() = true;
        self.cv.notify_one();
    }

    fn sleep(&self) {
        let mut rung = self.rung.lock().unwrap();
        while !*rung {
            rung = self.cv.wait(rung).unwrap();
        }
        *rung = false;
    }
}

/// A ring's two header words.
struct Words([loom::sync::atomic::AtomicU64; 2]);

impl Words {
    fn new() -> Self {
        Self(std::array::from_fn(|_| {
            loom::sync::atomic::AtomicU64::new(0)
        }))
    }

    fn header(&self) -> ring_sync::Header<'_> {
        ring_sync::Header {
            head: &self.0[0],
            tail: &self.0[1],
        }
    }
}

/// A writer puts `bytes` bytes into a ring of `cap`, one at a time, waiting for room when it
/// is full; a reader takes them one at a time, waiting for a doorbell when it is empty. Both
/// wait only as the handshakes say (no polling), so a lost doorbell or a lost wake for room
/// leaves a side asleep for ever.
fn ring_model(cap: u64, bytes: u64) {
    let words = Arc::new(Words::new());
    let (doorbell, room) = (Arc::new(Bell::new()), Arc::new(Bell::new()));
    let writer = {
        let (words, doorbell, room) = (words.clone(), doorbell.clone(), room.clone());
        thread::spawn(move || {
            let h = words.header();
            for head in 1..=bytes {
                while head - 1 - h.tail() >= cap {
                    if !h.wait_room(head - 1, cap) {
                        room.sleep();
                    }
                }
                if h.publish_head(head) {
                    doorbell.ring();
                }
            }
        })
    };
    let h = words.header();
    let mut tail = 0;
    while tail < bytes {
        if h.has_bytes(tail) {
            tail += 1;
            if h.publish_tail(tail) {
                room.ring();
            }
            h.unpark();
        } else if !h.park(tail) {
            doorbell.sleep();
        }
    }
    writer.join().unwrap();
}

/// Explore `f` with at most three preemptions (the ring models' state space is large: two
/// sides that both sleep on bells; three preemptions cover every order of one park and one
/// publish against each other, which is what a lost wake-up needs).
fn check_bounded<F: Fn() + Send + Sync + 'static>(f: F) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// Every byte written reaches a reader that parks whenever its ring is empty.
#[test]
fn a_parked_ring_reader_always_gets_its_doorbell() {
    check_bounded(|| ring_model(4, 2));
}

/// A writer that finds a ring of one byte full is always woken when the reader makes room,
/// while the reader parks on its doorbell in between.
#[test]
fn a_writer_waiting_for_ring_room_is_always_woken() {
    check_bounded(|| ring_model(1, 2));
}
