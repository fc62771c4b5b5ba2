//! How long a waiter spins on a status before sleeping on it: a fixed window if the
//! application set one, else a window adapted to how soon recent waits were answered.
//!
//! A spin that ends just before the completion costs the most: the thread burnt the window
//! and then pays a futex sleep and wake-up (tens of µs, and a scheduler's tail) on top. So
//! the adaptive window follows the waits themselves: each finished wait is counted in a
//! histogram of power-of-two µs buckets (halved every [`DECAY_EVERY`] waits, so it follows
//! the recent traffic); the window covers [`COVER`] of the recent waits that finished within
//! [`MAX_SPIN`], provided those are a fair share ([`MIN_SHARE`]) of all waits. Traffic of
//! small transfers so gets a spin that catches nearly every completion, and waits for large
//! ones (milliseconds, where a wake-up costs nothing next to the wait) get only [`FLOOR`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// `WINDOW_NS` while the window is adaptive (the default).
const ADAPTIVE: u64 = u64::MAX;
/// The window set by the application, in ns, or [`ADAPTIVE`].
static WINDOW_NS: AtomicU64 = AtomicU64::new(ADAPTIVE);

/// Buckets: waits of < 1 µs, < 2 µs, ... < 2^(BUCKETS-2) µs; the last holds the longer ones.
const BUCKETS: usize = 12;
/// Waits up to this long are worth spinning for (the last bounded bucket's edge).
pub(crate) const MAX_SPIN: Duration = Duration::from_micros(1 << (BUCKETS - 2));
/// The window where recent waits give no better answer (too few, or mostly long).
pub(crate) const FLOOR: Duration = Duration::from_micros(10);
/// The share of short waits the window should catch.
const COVER: f64 = 0.95;
/// Short waits below this share of all waits: the traffic is mostly long transfers.
const MIN_SHARE: f64 = 0.25;
/// Waits counted before the histogram is halved.
const DECAY_EVERY: u64 = 512;
/// Waits counted before the histogram is trusted at all.
const MIN_SAMPLES: u64 = 16;

static HIST: [AtomicU64; BUCKETS] = [const { AtomicU64::new(0) }; BUCKETS];
static COUNTED: AtomicU64 = AtomicU64::new(0);

/// Spin for `d` before sleeping, in every wait of this process (`Duration::ZERO`: never
/// spin). Replaces the adaptive window until [`set_wait_spin_adaptive`].
pub fn set_wait_spin(d: Duration) {
    let ns = d.as_nanos().min((ADAPTIVE - 1) as u128) as u64;
    WINDOW_NS.store(ns, Ordering::Relaxed);
}

/// Go back to the adaptive window (the default).
pub fn set_wait_spin_adaptive() {
    WINDOW_NS.store(ADAPTIVE, Ordering::Relaxed);
}

/// The window the next wait spins for.
#[inline]
pub fn wait_spin() -> Duration {
    match WINDOW_NS.load(Ordering::Relaxed) {
        ADAPTIVE => adaptive_window(&snapshot()),
        ns => Duration::from_nanos(ns),
    }
}

/// Count a wait that ended (the status left `IN_PROGRESS`) after `waited`.
pub(crate) fn record(waited: Duration) {
    let us = waited.as_micros().min(u64::MAX as u128) as u64;
    // Bucket k holds waits of [2^(k-1), 2^k) µs; bucket 0 those under 1 µs.
    let k = ((u64::BITS - us.leading_zeros()) as usize).min(BUCKETS - 1);
    HIST[k].fetch_add(1, Ordering::Relaxed);
    if COUNTED.fetch_add(1, Ordering::Relaxed) % DECAY_EVERY == DECAY_EVERY - 1 {
        // Relaxed halving races with concurrent counts: a count or two lost, no harm.
        for h in &HIST {
            h.store(h.load(Ordering::Relaxed) / 2, Ordering::Relaxed);
        }
    }
}

fn snapshot() -> [u64; BUCKETS] {
    std::array::from_fn(|k| HIST[k].load(Ordering::Relaxed))
}

/// The window for histogram `h` (see the module's text).
fn adaptive_window(h: &[u64; BUCKETS]) -> Duration {
    let total: u64 = h.iter().sum();
    let short: u64 = h[..BUCKETS - 1].iter().sum();
    if total < MIN_SAMPLES || (short as f64) < MIN_SHARE * total as f64 {
        return FLOOR;
    }
    let want = (COVER * short as f64).ceil() as u64;
    let mut seen = 0;
    for (k, &n) in h[..BUCKETS - 1].iter().enumerate() {
        seen += n;
        if seen >= want {
            // The bucket's upper edge, with room for the wake-up of the shard that answers.
            let edge = Duration::from_micros(1 << k);
            return (edge + edge / 2).clamp(FLOOR, MAX_SPIN);
        }
    }
    MAX_SPIN
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(samples: &[(u64, u64)]) -> [u64; BUCKETS] {
        let mut h = [0u64; BUCKETS];
        for &(us, n) in samples {
            let k = ((u64::BITS - us.leading_zeros()) as usize).min(BUCKETS - 1);
            h[k] += n;
        }
        h
    }

    #[test]
    fn small_transfers_get_a_window_that_catches_them() {
        // Answers in 40-60 µs: the window covers them (a fixed 50 µs spin would miss half).
        let w = adaptive_window(&hist(&[(40, 50), (60, 50)]));
        assert!(w >= Duration::from_micros(64), "{w:?}");
        assert!(w <= Duration::from_micros(128), "{w:?}");
        // Faster answers, a shorter window.
        let fast = adaptive_window(&hist(&[(12, 100)]));
        assert!(fast < w && fast >= Duration::from_micros(16), "{fast:?}");
    }

    #[test]
    fn long_waits_and_too_few_samples_get_the_floor() {
        assert_eq!(adaptive_window(&hist(&[(5_000, 100)])), FLOOR);
        assert_eq!(adaptive_window(&hist(&[(20, 5)])), FLOOR);
        assert_eq!(adaptive_window(&hist(&[(20, 10), (5_000, 90)])), FLOOR);
        // A mix with enough short waits: the window fits the short ones, not the long.
        let mixed = adaptive_window(&hist(&[(20, 50), (5_000, 50)]));
        assert!(mixed <= Duration::from_micros(48), "{mixed:?}");
    }

    #[test]
    fn the_window_is_bounded() {
        let w = adaptive_window(&hist(&[(900, 100)]));
        assert_eq!(w, MAX_SPIN);
        let tiny = adaptive_window(&hist(&[(0, 100)]));
        assert_eq!(tiny, FLOOR);
    }
}
