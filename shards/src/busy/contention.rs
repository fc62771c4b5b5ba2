//! Whether a busy-polling shard should step aside: it watches its thread's involuntary
//! context switches while it polls, and one means another thread (the application's, another
//! shard's) wanted its CPU, so it stops polling for a while.

use std::time::{Duration, Instant};

/// How long a shard whose busy polling was preempted stays idle (waits on the runtime)
/// before it may poll busily again: every µs it spins is a µs the other thread waits.
const BACKOFF: Duration = Duration::from_millis(50);
/// How often a busy shard asks the kernel whether it was preempted (a system call).
const CHECK_EVERY: Duration = Duration::from_micros(20);

/// One shard's preemption watch.
#[derive(Debug, Default)]
pub(super) struct Contention {
    /// Whether the shard steps aside at all (the `busy_window` way; a configured spin
    /// keeps spinning).
    pub on: bool,
    /// When the last check of the current busy spell ran, and the thread's involuntary
    /// switches then.
    mark: Option<(Instant, u64)>,
    /// Preempted while busy: no busy polling before this.
    until: Option<Instant>,
    /// Times the shard stepped aside.
    pub backoffs: u64,
}

impl Contention {
    /// A busy spell starts: nothing to compare with yet.
    pub fn start_spell(&mut self) {
        self.mark = None;
    }

    /// Whether the shard is stepping aside at `now`.
    pub fn backing_off(&self, now: Instant) -> bool {
        self.until.is_some_and(|t| now < t)
    }

    /// While busy: whether the shard was preempted since the last check; if so it steps
    /// aside for [`BACKOFF`]. Asks the kernel at most every [`CHECK_EVERY`].
    pub fn check(&mut self, now: Instant) -> bool {
        let recent = |(t, _): (Instant, u64)| now.duration_since(t) < CHECK_EVERY;
        if !self.on || self.mark.is_some_and(recent) {
            return false;
        }
        let n = preemptions();
        let hit = preempted_since(self.mark.map(|(_, m)| m), n);
        self.mark = Some((now, n));
        if hit {
            self.until = Some(now + BACKOFF);
            self.backoffs += 1;
        }
        hit
    }
}

/// Involuntary context switches of the calling thread so far: each one is the scheduler
/// giving its CPU to another thread that wanted it.
fn preemptions() -> u64 {
    // SAFETY: a zeroed rusage is valid; getrusage writes into the one we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    ru.ru_nivcsw as u64
}

/// Whether a thread whose involuntary switches were `mark` at the last check and are `now`
/// was preempted in between (no mark: the first check of a busy spell).
fn preempted_since(mark: Option<u64>, now: u64) -> bool {
    mark.is_some_and(|m| now > m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preemption_is_seen_only_between_two_checks() {
        assert!(
            !preempted_since(None, 5),
            "the first check of a spell has nothing to compare"
        );
        assert!(!preempted_since(Some(5), 5));
        assert!(preempted_since(Some(5), 6));
    }

    #[test]
    fn a_watch_that_is_off_never_steps_aside() {
        let mut c = Contention::default();
        let t = Instant::now();
        for i in 0..100 {
            assert!(!c.check(t + CHECK_EVERY * i));
        }
        assert_eq!(c.backoffs, 0);
        assert!(!c.backing_off(t));
    }
}
