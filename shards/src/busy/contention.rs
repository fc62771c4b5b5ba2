//! Whether a busy-polling shard should step aside: it watches its thread's involuntary
//! context switches while it polls, and one means another thread (the application's, another
//! shard's) wanted its CPU, so it stops polling for a while. And while it polls with nothing
//! to do, it offers its CPU now and then (`sched_yield`): a thread woken onto this CPU does
//! not preempt a poller (the kernel lets it wait), so without the offer it waited for the
//! end of the busy window, about 100 µs, every time (an application thread that the
//! scheduler had placed on a shard's CPU: `docs/perf/s37-colocated-app.md`).

use std::time::{Duration, Instant};

/// How long a shard whose busy polling was preempted stays idle (waits on the runtime)
/// before it may poll busily again: every µs it spins is a µs the other thread waits.
const BACKOFF: Duration = Duration::from_millis(50);
/// How often a busy shard asks the kernel whether it was preempted (a system call).
const CHECK_EVERY: Duration = Duration::from_micros(20);
/// A busy shard that has seen no event for this long offers its CPU ([`Contention::offer_cpu`])...
const OFFER_QUIET: Duration = Duration::from_micros(5);
/// ... at most this often (a `sched_yield` that finds no other thread costs a system call).
const OFFER_EVERY: Duration = Duration::from_micros(5);

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
    /// When the shard last offered its CPU, and whether it did since the last check.
    offered_at: Option<Instant>,
    offered: bool,
    /// Checks that found the CPU had gone to another thread at an offer: its sharer ran.
    pub handoffs: u64,
}

impl Contention {
    /// A busy spell starts: nothing to compare with yet.
    pub fn start_spell(&mut self) {
        self.mark = None;
        self.offered = false;
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
        self.settle(now, hit)
    }

    /// What a check that found the thread preempted (`hit`) or not decides: `true` to step
    /// aside.
    fn settle(&mut self, now: Instant, hit: bool) -> bool {
        if hit && std::mem::take(&mut self.offered) {
            // The switch came at an offer (a yield counts as an involuntary switch): the
            // thread that wanted this CPU had it and the poller goes on.
            self.handoffs += 1;
            return false;
        }
        self.offered = false;
        if hit {
            self.until = Some(now + BACKOFF);
            self.backoffs += 1;
        }
        hit
    }

    /// While busy and `quiet` since the last event: offer the CPU to any thread that wants it
    /// (`sched_yield`), once the shard was quiet for [`OFFER_QUIET`] and at most every
    /// [`OFFER_EVERY`]. Only on shards that step aside (a configured spin keeps its CPU).
    pub fn offer_cpu(&mut self, now: Instant, quiet: Duration) {
        if !self.on || !offer_due(self.offered_at, now, quiet) {
            return;
        }
        // SAFETY: sched_yield has no memory effects.
        unsafe { libc::sched_yield() };
        self.offered_at = Some(now);
        self.offered = true;
    }
}

/// Whether a shard quiet for `quiet` that last offered its CPU at `last` offers it at `now`.
fn offer_due(last: Option<Instant>, now: Instant, quiet: Duration) -> bool {
    quiet >= OFFER_QUIET && last.is_none_or(|t| now.saturating_duration_since(t) >= OFFER_EVERY)
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
    fn the_cpu_is_offered_only_after_a_quiet_spell_and_not_at_every_turn() {
        let t = Instant::now();
        assert!(!offer_due(None, t, OFFER_QUIET / 2), "busy: no offer");
        assert!(offer_due(None, t, OFFER_QUIET));
        assert!(!offer_due(Some(t), t + OFFER_EVERY / 2, OFFER_QUIET * 3));
        assert!(offer_due(Some(t), t + OFFER_EVERY, OFFER_QUIET * 3));
    }

    #[test]
    fn a_switch_at_an_offer_is_a_handoff_not_contention() {
        let mut c = Contention {
            on: true,
            ..Contention::default()
        };
        let t = Instant::now();
        c.offered = true;
        assert!(
            !c.settle(t, true),
            "an offer taken is no reason to step aside"
        );
        assert_eq!((c.handoffs, c.backoffs), (1, 0));
        assert!(!c.backing_off(t));
        // An offer nobody took, then a check without a switch: nothing.
        c.offered = true;
        assert!(!c.settle(t, false));
        assert!(!c.offered, "an offer counts only until the next check");
        // A switch with no offer since the last check: contention.
        assert!(c.settle(t, true));
        assert_eq!((c.handoffs, c.backoffs), (1, 1));
        assert!(c.backing_off(t));
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
