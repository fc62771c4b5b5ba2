//! What glommio's park costs (docs/perf/experiments/glommio-no-membarrier.patch): every
//! executor about to sleep issues `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which
//! interrupts every CPU running a thread of the process and waits for them. This measures,
//! with N other threads spinning (as busy-polling shards and waiting applications do), the
//! call's own cost, and how much time the spinners lose: the largest gaps between their clock
//! reads while one thread issues a barrier every 100 µs, against none.
//!
//! `cargo run --release -p morio-shards --example membarrier -- [MAX_SPINNERS]`
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 16;
const PRIVATE_EXPEDITED: libc::c_int = 8;

fn membarrier(cmd: libc::c_int) -> i64 {
    // SAFETY: a system call with integer arguments only.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0) }
}

/// Spin for `run`, reading the clock; the gaps between reads above 2 µs, in µs.
fn spin_gaps(run: Duration, stop: &AtomicBool) -> Vec<f64> {
    let mut gaps = Vec::new();
    let t0 = Instant::now();
    let mut last = t0;
    while !stop.load(Ordering::Relaxed) && last.duration_since(t0) < run {
        let now = Instant::now();
        let gap = now.duration_since(last).as_secs_f64() * 1e6;
        if gap > 2.0 {
            gaps.push(gap);
        }
        last = now;
    }
    gaps
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p) as usize]
}

/// `spinners` threads spin for `run` while (if `barriers`) this thread issues a barrier every
/// 100 µs; the barrier's mean cost (µs), and the spinners' gaps: count, p50, p99, max.
fn round(spinners: usize, run: Duration, barriers: bool) -> (f64, usize, f64, f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..spinners)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || spin_gaps(run, &stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    let (mut n, mut spent) = (0u32, Duration::ZERO);
    let t0 = Instant::now();
    while t0.elapsed() < run {
        if barriers {
            let b = Instant::now();
            membarrier(PRIVATE_EXPEDITED);
            spent += b.elapsed();
            n += 1;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    stop.store(true, Ordering::Relaxed);
    let mut gaps: Vec<f64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap_or_default())
        .collect();
    let cost = if n > 0 {
        spent.as_secs_f64() * 1e6 / n as f64
    } else {
        0.0
    };
    let count = gaps.len();
    let p50 = pct(&mut gaps, 0.5);
    (cost, count, p50, pct(&mut gaps, 0.99), pct(&mut gaps, 1.0))
}

fn main() {
    let max: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    if membarrier(REGISTER_PRIVATE_EXPEDITED) < 0 {
        eprintln!("membarrier is not available here");
        return;
    }
    let run = Duration::from_millis(500);
    println!(
        "{:>8} {:>10} | {:>30} | {:>30}",
        "spinners", "barrier_us", "gaps>2us n/p50/p99/max, none", "with a barrier every 100us"
    );
    let mut s = 1;
    while s <= max {
        let (_, n0, q0, p0, m0) = round(s, run, false);
        let (cost, n1, q1, p1, m1) = round(s, run, true);
        println!(
            "{s:>8} {cost:>10.2} | {n0:>6} {q0:>7.1} {p0:>7.1} {m0:>7.1} | {n1:>6} {q1:>7.1} \
             {p1:>7.1} {m1:>7.1}"
        );
        s *= 2;
    }
}
