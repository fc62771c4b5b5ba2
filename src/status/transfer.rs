//! [`TransferStatus`]: the completion object one transfer's caller and backend share. Its
//! primitives come from `crate::sync` (std's), so `tests/loom.rs` can compile this file
//! against loom's and model-check it; the file names nothing else of the crate but its
//! parent's [`StatusCode`] and [`wait_spin`].
//!
//! The code lives in an atomic so predicates are lock-free. Every store of the code happens
//! under the message mutex, and waiters re-check the code under that mutex before sleeping
//! on the condition variable, so no wake-up can be lost.

use std::fmt;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use super::{record_wait, wait_spin, StatusCode};
use crate::sync::atomic::{AtomicU32, Ordering};
use crate::sync::{Condvar, Mutex, MutexGuard};

/// Completion object of one transfer, shared between the caller and the backend
/// (typically as `Arc<TransferStatus>`). Starts as `INIT`.
pub struct TransferStatus {
    code: AtomicU32,
    message: Mutex<Locked>,
    changed: Condvar,
    /// Threads asleep on `changed` (changed under `message`'s lock): a completion with no
    /// sleeper skips the futex wake-up syscall.
    sleepers: AtomicU32,
}

/// What the status's mutex guards besides the code's stores.
#[derive(Default)]
struct Locked {
    msg: String,
    /// Called once the code is first terminal ([`TransferStatus::on_complete`]).
    on_done: Vec<Box<dyn FnOnce() + Send>>,
}

impl TransferStatus {
    /// A fresh status in `INIT`.
    pub fn new() -> Self {
        Self::with_code(StatusCode::Init)
    }

    /// A fresh status already `IN_PROGRESS` (what the engine hands out for a submitted
    /// transfer; nobody can be waiting on it yet, so nothing needs waking).
    pub(crate) fn started() -> Self {
        Self::with_code(StatusCode::InProgress)
    }

    fn with_code(code: StatusCode) -> Self {
        TransferStatus {
            code: AtomicU32::new(code.as_u32()),
            message: Mutex::new(Locked::default()),
            changed: Condvar::new(),
            sleepers: AtomicU32::new(0),
        }
    }

    /// Wake sleepers, if any. Called after a store made under the lock: a waiter checks the
    /// code and registers as a sleeper under that same lock, so it either saw the store or
    /// is counted here.
    fn wake_sleepers(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.changed.notify_all();
        }
    }

    /// Current code (lock-free).
    pub fn code(&self) -> StatusCode {
        // Only valid codes are ever stored; the fallback is unreachable.
        StatusCode::from_u32(self.code.load(Ordering::Acquire)).unwrap_or(StatusCode::ErrBadState)
    }

    /// Current message (empty unless set).
    pub fn message(&self) -> String {
        self.lock().msg.clone()
    }

    /// Call `f` once the code is terminal (`SUCCESS` or an error): at once, on this thread,
    /// if it is already; else on the thread that makes it terminal (an engine's shard), right
    /// after it wakes the waiters, so `f` must be quick and must not block (an event loop's
    /// wake-up: a queue push and an `eventfd` write, say). Any number may be registered.
    pub fn on_complete(&self, f: impl FnOnce() + Send + 'static) {
        let mut guard = self.lock();
        if self.code().is_terminal() {
            drop(guard);
            f();
        } else {
            guard.on_done.push(Box::new(f));
        }
    }

    /// Run the completion callbacks taken from under the lock.
    fn complete(hooks: Vec<Box<dyn FnOnce() + Send>>) {
        for h in hooks {
            h();
        }
    }

    /// Code is `INIT`.
    pub fn is_init(&self) -> bool {
        self.code() == StatusCode::Init
    }

    /// Code is `IN_PROGRESS`.
    pub fn in_progress(&self) -> bool {
        self.code() == StatusCode::InProgress
    }

    /// Code is `SUCCESS`.
    pub fn succeeded(&self) -> bool {
        self.code() == StatusCode::Success
    }

    /// Code is an error (`> ERR_BEGIN`).
    pub fn failed(&self) -> bool {
        self.code().is_error()
    }

    /// Stores `msg` and `code` and wakes waiters, unless the status already holds an error
    /// (first error wins; the call is then ignored entirely, message included).
    pub fn update(&self, code: StatusCode, msg: impl Into<String>) {
        let mut guard = self.lock();
        if self.code().is_error() {
            return;
        }
        guard.msg = msg.into();
        self.code.store(code.as_u32(), Ordering::Release);
        let hooks = if code.is_terminal() {
            std::mem::take(&mut guard.on_done)
        } else {
            Vec::new()
        };
        drop(guard);
        self.wake_sleepers();
        Self::complete(hooks);
    }

    /// Stores `code` unconditionally (even over an error) and wakes waiters.
    pub fn set_code(&self, code: StatusCode) {
        let mut guard = self.lock();
        self.code.store(code.as_u32(), Ordering::Release);
        let hooks = if code.is_terminal() {
            std::mem::take(&mut guard.on_done)
        } else {
            Vec::new()
        };
        drop(guard);
        self.wake_sleepers();
        Self::complete(hooks);
    }

    /// Replaces the message, leaving the code alone.
    pub fn set_message(&self, msg: impl Into<String>) {
        self.lock().msg = msg.into();
    }

    /// Blocks until the code is not `IN_PROGRESS` and returns it. Returns at once for
    /// any other code, `INIT` included.
    pub fn wait(&self) -> StatusCode {
        self.wait_until(None)
    }

    /// Like [`wait`](Self::wait) but gives up after `timeout`, returning `IN_PROGRESS`.
    /// A zero timeout polls once. Timeouts too large to represent wait forever.
    pub fn wait_for(&self, timeout: Duration) -> StatusCode {
        let c = self.code();
        if c != StatusCode::InProgress || timeout.is_zero() {
            return c;
        }
        self.wait_until(Instant::now().checked_add(timeout))
    }

    /// MORI's `WaitFor(timeout_ms)`: `< 0` blocks until not `IN_PROGRESS`, `0` polls once,
    /// `> 0` waits at most that many milliseconds (may return `IN_PROGRESS`).
    pub fn wait_for_ms(&self, timeout_ms: i64) -> StatusCode {
        match u64::try_from(timeout_ms) {
            Err(_) => self.wait(),
            Ok(ms) => self.wait_for(Duration::from_millis(ms)),
        }
    }

    /// Waits until not `IN_PROGRESS` or until `deadline` (`None` = forever).
    fn wait_until(&self, deadline: Option<Instant>) -> StatusCode {
        let c = self.code();
        if c != StatusCode::InProgress {
            return c;
        }
        // Small transfers complete within a few microseconds of a round trip: spin briefly
        // (as long as recent waits justify, `status::spin`) before paying for a futex sleep
        // and wake-up.
        let t0 = Instant::now();
        let spin_until = t0 + wait_spin();
        let spin_until = deadline.map_or(spin_until, |d| d.min(spin_until));
        // Looks at the status: every 2 `pause`s (each 15-50 ns on the hosts we measure) for
        // the first [`EAGER_LOOKS`] of the wait, where small transfers complete and a late
        // look is a large share of their latency, every 64 after (for a long transfer a µs
        // late costs nothing, and fewer looks disturb it less). The clock every 64 pauses,
        // and now and then the CPU given to whatever else wants it (the shard that will
        // answer may be queued behind this thread on an oversubscribed machine).
        let (mut every, later) = look_every();
        let mut pauses = 0u32;
        while pauses % 64 != 0 || {
            let now = Instant::now();
            if now.duration_since(t0) >= EAGER_LOOKS {
                every = later;
            }
            now < spin_until
        } {
            for _ in 0..every {
                std::hint::spin_loop();
            }
            let c = self.code();
            if c != StatusCode::InProgress {
                record_wait(t0.elapsed());
                return c;
            }
            pauses = pauses.wrapping_add(every);
            if pauses % 256 == 0 {
                std::thread::yield_now();
            }
        }
        let mut guard = self.lock();
        loop {
            // Stores happen under the mutex we hold, so this cannot miss a notify.
            let c = self.code();
            if c != StatusCode::InProgress {
                record_wait(t0.elapsed());
                return c;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return c;
            }
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            guard = match deadline {
                None => self
                    .changed
                    .wait(guard)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    self.changed
                        .wait_timeout(guard, d - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Locked> {
        // A panic elsewhere while holding the lock cannot leave a String half-written in a
        // way that matters here; keep going rather than propagate the panic.
        self.message.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for TransferStatus {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for TransferStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("TransferStatus");
        d.field("code", &self.code());
        match self.message.try_lock() {
            Ok(m) => d.field("message", &m.msg),
            Err(_) => d.field("message", &"<locked>"),
        };
        d.finish()
    }
}

/// How long a waiter looks at its status every 2 pauses before it looks every 64.
const EAGER_LOOKS: Duration = Duration::from_micros(32);

/// `pause`s between two looks at a status in a waiter's spin, early in the wait and later:
/// 2 and 64, or `MORIO_WAIT_PAUSES` for both (1, 2, 4, ... 64; for A/B runs). On the H100
/// host (a `pause` there takes 15 ns) a look every 64 let the waiter of a spinning 8 B
/// write see its completion 1.5 µs late in the trace, every 8 0.5 µs; looks every 8 or 2
/// for the whole wait made the 4 KiB × 256 row slow in most rounds (`docs/perf/h100-s32.md`).
fn look_every() -> (u32, u32) {
    static EVERY: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *EVERY.get_or_init(|| {
        std::env::var("MORIO_WAIT_PAUSES")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|n| n.is_power_of_two() && *n <= 64)
            .map_or((2, 64), |n| (n, n))
    })
}
