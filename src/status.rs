//! Transfer completion: `StatusCode`, the caller-owned `TransferStatus` object and `wait_all`, with MORI-IO's semantics (reference §1.2, §1.8).
//!
//! A transfer call returns at once; the backend moves the status to `IN_PROGRESS` before
//! returning and later to a terminal code (`SUCCESS` or an error). The first error wins:
//! [`TransferStatus::update`] is ignored once the status holds an error.
//!
//! `TransferStatus` itself is in `status/transfer.rs` (model-checked by `tests/loom.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod spin;
mod transfer;

pub(crate) use spin::record as record_wait;
pub use spin::{set_wait_spin, set_wait_spin_adaptive, wait_spin};

pub use transfer::TransferStatus;

/// Status of a transfer. The numeric values are part of MORI's API.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatusCode {
    /// Completed successfully.
    Success = 0,
    /// Created, not yet submitted.
    Init = 1,
    /// Submitted, not finished.
    InProgress = 2,
    /// Bad arguments (offsets, sizes, unknown engine, ...).
    ErrInvalidArgs = 11,
    /// Something looked up was not registered.
    ErrNotFound = 12,
    /// Transport operation failed (MORI uses this name for all transports).
    ErrRdmaOp = 13,
    /// Object in the wrong state (duplicate op id, shut down, ...).
    ErrBadState = 14,
    /// GPU operation failed.
    ErrGpuOp = 15,
}

impl StatusCode {
    /// Sentinel: codes strictly above this are errors. Not itself a valid code.
    pub const ERR_BEGIN: u32 = 10;

    /// Maps a numeric value back to the enum; `None` for unknown values (including 10).
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Success,
            1 => Self::Init,
            2 => Self::InProgress,
            11 => Self::ErrInvalidArgs,
            12 => Self::ErrNotFound,
            13 => Self::ErrRdmaOp,
            14 => Self::ErrBadState,
            15 => Self::ErrGpuOp,
            _ => return None,
        })
    }

    /// The numeric value.
    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// `code > ERR_BEGIN`, MORI's definition of "failed".
    pub fn is_error(self) -> bool {
        self.as_u32() > Self::ERR_BEGIN
    }

    /// `SUCCESS` or an error: the status will not change any more on its own.
    pub fn is_terminal(self) -> bool {
        self == Self::Success || self.is_error()
    }

    /// MORI's name for the code (`"SUCCESS"`, `"ERR_INVALID_ARGS"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Success => "SUCCESS",
            Self::Init => "INIT",
            Self::InProgress => "IN_PROGRESS",
            Self::ErrInvalidArgs => "ERR_INVALID_ARGS",
            Self::ErrNotFound => "ERR_NOT_FOUND",
            Self::ErrRdmaOp => "ERR_RDMA_OP",
            Self::ErrBadState => "ERR_BAD_STATE",
            Self::ErrGpuOp => "ERR_GPU_OP",
        }
    }
}

impl fmt::Display for StatusCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// MORI's `IOEngine::WaitAll`.
///
/// * empty list → `SUCCESS`;
/// * `timeout_ms == 0` → polls: the first error in list order among finished statuses,
///   else `IN_PROGRESS` if any is pending, else `SUCCESS`;
/// * `timeout_ms < 0` → waits for every status, then the first error in list order, else
///   `SUCCESS`;
/// * `timeout_ms > 0` → waits in list order against one shared deadline. If the deadline
///   passes with a status still pending, the rest are polled and the first error in list
///   order is returned if there is one, else `IN_PROGRESS`. Otherwise as for `< 0`.
///
/// `INIT` statuses count as finished and not failed, as `WaitFor` returns at once for them.
pub fn wait_all(statuses: &[Arc<TransferStatus>], timeout_ms: i64) -> StatusCode {
    let deadline = match u64::try_from(timeout_ms) {
        Err(_) => None,
        Ok(0) => return poll_all(statuses),
        Ok(ms) => Instant::now().checked_add(Duration::from_millis(ms)),
    };
    let mut first_err = None;
    let mut pending = false;
    for s in statuses {
        let c = match (deadline, pending) {
            (_, true) => s.code(),
            (None, false) => s.wait(),
            (Some(d), false) => s.wait_for(d.saturating_duration_since(Instant::now())),
        };
        if c.is_error() {
            first_err.get_or_insert(c);
        } else if c == StatusCode::InProgress {
            pending = true;
        }
    }
    match (first_err, pending) {
        (Some(e), _) => e,
        (None, true) => StatusCode::InProgress,
        (None, false) => StatusCode::Success,
    }
}

fn poll_all(statuses: &[Arc<TransferStatus>]) -> StatusCode {
    let mut pending = false;
    for s in statuses {
        let c = s.code();
        if c.is_error() {
            return c;
        }
        pending |= c == StatusCode::InProgress;
    }
    if pending {
        StatusCode::InProgress
    } else {
        StatusCode::Success
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    const ALL: [StatusCode; 8] = [
        StatusCode::Success,
        StatusCode::Init,
        StatusCode::InProgress,
        StatusCode::ErrInvalidArgs,
        StatusCode::ErrNotFound,
        StatusCode::ErrRdmaOp,
        StatusCode::ErrBadState,
        StatusCode::ErrGpuOp,
    ];

    fn status(code: StatusCode) -> Arc<TransferStatus> {
        let s = Arc::new(TransferStatus::new());
        s.set_code(code);
        s
    }

    /// Completion callbacks run once each, when the code first becomes terminal (not on
    /// IN_PROGRESS or INIT, not again on a later error), and at once where it already is.
    #[test]
    fn completion_callbacks_run_once_at_the_first_terminal_code() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = Arc::new(AtomicUsize::new(0));
        let hook = |c: &Arc<AtomicUsize>| {
            let c = c.clone();
            move || {
                c.fetch_add(1, Ordering::SeqCst);
            }
        };
        let s = TransferStatus::new();
        s.on_complete(hook(&calls));
        s.on_complete(hook(&calls));
        s.set_code(StatusCode::InProgress);
        s.update(StatusCode::InProgress, "still");
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        s.update(StatusCode::ErrRdmaOp, "lost");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        s.update(StatusCode::ErrBadState, "ignored");
        s.set_code(StatusCode::Success);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        s.on_complete(hook(&calls));
        assert_eq!(calls.load(Ordering::SeqCst), 3, "already terminal: at once");
        let init = TransferStatus::new();
        init.on_complete(hook(&calls));
        assert_eq!(calls.load(Ordering::SeqCst), 3, "INIT is not terminal");
    }

    /// Sets `code` on `s` from another thread after `ms` milliseconds.
    fn complete_later(
        s: &Arc<TransferStatus>,
        ms: u64,
        code: StatusCode,
    ) -> thread::JoinHandle<()> {
        let s = Arc::clone(s);
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(ms));
            s.update(code, format!("done {code}"));
        })
    }

    #[test]
    fn code_values_names_and_predicates() {
        let values = [0, 1, 2, 11, 12, 13, 14, 15];
        for (c, v) in ALL.into_iter().zip(values) {
            assert_eq!(c.as_u32(), v);
            assert_eq!(StatusCode::from_u32(v), Some(c));
            assert_eq!(c.to_string(), c.name());
            assert_eq!(c.is_error(), v > StatusCode::ERR_BEGIN);
            assert_eq!(c.is_terminal(), v == 0 || v > 10);
        }
        for v in [3, 9, 10, 16, 100, u32::MAX] {
            assert_eq!(StatusCode::from_u32(v), None);
        }
        let names: Vec<_> = ALL.iter().map(|c| c.name()).collect();
        assert_eq!(
            names,
            [
                "SUCCESS",
                "INIT",
                "IN_PROGRESS",
                "ERR_INVALID_ARGS",
                "ERR_NOT_FOUND",
                "ERR_RDMA_OP",
                "ERR_BAD_STATE",
                "ERR_GPU_OP"
            ]
        );
    }

    #[test]
    fn new_status_is_init() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<TransferStatus>();
        let s = TransferStatus::default();
        assert!(s.is_init());
        assert!(!s.in_progress() && !s.succeeded() && !s.failed());
        assert_eq!(s.code(), StatusCode::Init);
        assert_eq!(s.message(), "");
        assert!(format!("{s:?}").contains("Init"));
    }

    #[test]
    fn predicates_follow_code() {
        let s = TransferStatus::new();
        for c in ALL {
            s.set_code(c);
            assert_eq!(s.code(), c);
            assert_eq!(s.is_init(), c == StatusCode::Init);
            assert_eq!(s.in_progress(), c == StatusCode::InProgress);
            assert_eq!(s.succeeded(), c == StatusCode::Success);
            assert_eq!(s.failed(), c.is_error());
        }
    }

    #[test]
    fn first_error_wins() {
        let s = TransferStatus::new();
        s.update(StatusCode::InProgress, "");
        s.update(StatusCode::ErrNotFound, "first");
        s.update(StatusCode::ErrBadState, "second");
        s.update(StatusCode::Success, "late success");
        assert_eq!(s.code(), StatusCode::ErrNotFound);
        assert_eq!(s.message(), "first");
        // set_code and set_message are unconditional.
        s.set_message("overridden");
        assert_eq!(s.message(), "overridden");
        s.set_code(StatusCode::Success);
        assert!(s.succeeded());
    }

    #[test]
    fn update_after_success_is_applied() {
        let s = TransferStatus::new();
        s.update(StatusCode::Success, "ok");
        assert!(s.succeeded());
        assert_eq!(s.message(), "ok");
        s.update(StatusCode::ErrRdmaOp, "peer abort");
        assert_eq!(s.code(), StatusCode::ErrRdmaOp);
        assert_eq!(s.message(), "peer abort");
    }

    #[test]
    fn wait_returns_immediately_unless_in_progress() {
        let s = TransferStatus::new();
        assert_eq!(s.wait(), StatusCode::Init);
        assert_eq!(s.wait_for_ms(-1), StatusCode::Init);
        assert_eq!(s.wait_for(Duration::MAX), StatusCode::Init);
        s.set_code(StatusCode::ErrGpuOp);
        assert_eq!(s.wait(), StatusCode::ErrGpuOp);
        assert_eq!(s.wait_for_ms(0), StatusCode::ErrGpuOp);
    }

    #[test]
    fn bounded_wait_times_out_in_progress() {
        let s = TransferStatus::new();
        s.set_code(StatusCode::InProgress);
        assert_eq!(s.wait_for(Duration::ZERO), StatusCode::InProgress);
        assert_eq!(s.wait_for_ms(0), StatusCode::InProgress);
        let t = Instant::now();
        assert_eq!(
            s.wait_for(Duration::from_millis(50)),
            StatusCode::InProgress
        );
        assert!(t.elapsed() >= Duration::from_millis(50));
        let t = Instant::now();
        assert_eq!(s.wait_for_ms(30), StatusCode::InProgress);
        assert!(t.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn wait_sees_completion_from_another_thread() {
        let s = status(StatusCode::InProgress);
        let h = complete_later(&s, 50, StatusCode::Success);
        assert_eq!(s.wait(), StatusCode::Success);
        assert_eq!(s.message(), "done SUCCESS");
        h.join().unwrap();

        let s = status(StatusCode::InProgress);
        let h = complete_later(&s, 50, StatusCode::ErrBadState);
        let t = Instant::now();
        assert_eq!(s.wait_for_ms(60_000), StatusCode::ErrBadState);
        assert!(t.elapsed() < Duration::from_secs(30));
        h.join().unwrap();

        // An unrepresentable deadline means "forever", not a panic.
        let s = status(StatusCode::InProgress);
        let h = complete_later(&s, 20, StatusCode::Success);
        assert_eq!(s.wait_for(Duration::MAX), StatusCode::Success);
        h.join().unwrap();
    }

    #[test]
    fn no_lost_wakeups_under_races() {
        for i in 0..300 {
            let s = status(StatusCode::InProgress);
            let h = complete_later(&s, 0, StatusCode::Success);
            if i % 2 == 0 {
                assert_eq!(s.wait(), StatusCode::Success);
            } else {
                assert_eq!(s.wait_for_ms(60_000), StatusCode::Success);
            }
            h.join().unwrap();
        }
    }

    #[test]
    fn many_waiters_all_wake() {
        let s = status(StatusCode::InProgress);
        let waiters: Vec<_> = (0..16)
            .map(|i| {
                let s = Arc::clone(&s);
                thread::spawn(move || {
                    if i % 2 == 0 {
                        s.wait()
                    } else {
                        s.wait_for(Duration::from_secs(60))
                    }
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(50));
        s.update(StatusCode::ErrInvalidArgs, "bad");
        for w in waiters {
            assert_eq!(w.join().unwrap(), StatusCode::ErrInvalidArgs);
        }
    }

    #[test]
    fn wait_all_empty_is_success() {
        for t in [-1, 0, 10] {
            assert_eq!(wait_all(&[], t), StatusCode::Success);
        }
    }

    #[test]
    fn wait_all_poll() {
        use StatusCode::*;
        let list = [status(InProgress), status(ErrRdmaOp), status(Success)];
        assert_eq!(wait_all(&list, 0), ErrRdmaOp, "failure wins over pending");
        let list = [
            status(Success),
            status(ErrNotFound),
            status(ErrBadState),
            status(InProgress),
        ];
        assert_eq!(wait_all(&list, 0), ErrNotFound, "first error in list order");
        let list = [status(Success), status(InProgress)];
        assert_eq!(wait_all(&list, 0), InProgress);
        let list = [status(Success), status(Init), status(Success)];
        assert_eq!(wait_all(&list, 0), Success);
    }

    #[test]
    fn wait_all_bounded_times_out() {
        use StatusCode::*;
        let list = [status(Success), status(InProgress)];
        let t = Instant::now();
        assert_eq!(wait_all(&list, 50), InProgress);
        assert!(t.elapsed() >= Duration::from_millis(50));
        // Shared deadline: two pending statuses still take about one timeout, not two.
        let list = [status(InProgress), status(InProgress)];
        let t = Instant::now();
        assert_eq!(wait_all(&list, 100), InProgress);
        assert!(t.elapsed() < Duration::from_secs(10));
        // An error seen (before or after the pending one) beats IN_PROGRESS.
        let list = [status(ErrGpuOp), status(InProgress)];
        assert_eq!(wait_all(&list, 20), ErrGpuOp);
        let list = [status(InProgress), status(ErrBadState), status(ErrNotFound)];
        assert_eq!(wait_all(&list, 20), ErrBadState);
    }

    #[test]
    fn wait_all_bounded_completes() {
        use StatusCode::*;
        let list = [status(InProgress), status(InProgress), status(Success)];
        let hs = [
            complete_later(&list[0], 30, Success),
            complete_later(&list[1], 10, Success),
        ];
        assert_eq!(wait_all(&list, 60_000), Success);
        hs.into_iter().for_each(|h| h.join().unwrap());
    }

    #[test]
    fn wait_all_forever_returns_first_error_in_list_order() {
        use StatusCode::*;
        let list = [
            status(InProgress),
            status(InProgress),
            status(InProgress),
            status(InProgress),
        ];
        // The later-listed error finishes first; list order still decides.
        let hs = [
            complete_later(&list[0], 40, Success),
            complete_later(&list[1], 60, ErrBadState),
            complete_later(&list[2], 10, ErrNotFound),
            complete_later(&list[3], 80, Success),
        ];
        assert_eq!(wait_all(&list, -1), ErrBadState);
        // It waited for all of them.
        assert!(list.iter().all(|s| s.code() != InProgress));
        hs.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(wait_all(&[status(Success), status(Init)], -1), Success);
    }
}
