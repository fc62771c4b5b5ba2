//! What the small things a spinning shard and a waiting application do cost on this host: a
//! `pause`, a clock read, `sched_yield`, a zero-timeout `poll(2)`, and a cache line handed
//! back and forth between two spinning threads pinned to two CPUs (a thread crossing as the
//! hardware sees it). docs/perf/h100-s32.md has the H100 host's figures.
//!
//! `cargo run --release -p morio-shards --example cpu_costs -- [CPU_A] [CPU_B]` (2 and 3)
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Pin the calling thread to `cpu` (ignored if the CPU is not ours).
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; the call only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Mean ns of `f` over `n` calls.
fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn main() {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (a, b) = (arg(1, 2), arg(2, 3));
    pin(a);
    println!("pause_ns {:.1}", per_call(1_000_000, std::hint::spin_loop));
    let mut sink = 0u128;
    let clock = per_call(1_000_000, || sink += Instant::now().elapsed().as_nanos()) / 2.0;
    println!("clock_read_ns {clock:.1} ({})", sink % 2);
    // SAFETY: sched_yield has no preconditions.
    let y = per_call(10_000, || unsafe {
        libc::sched_yield();
    });
    println!("sched_yield_ns {y:.1}");
    let p = per_call(10_000, || {
        let mut fd = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        unsafe { libc::poll(&mut fd, 1, 0) };
    });
    println!("poll0_ns {p:.1}");
    let flag = Arc::new(AtomicU64::new(0));
    let rounds = 200_000u64;
    let other = {
        let flag = flag.clone();
        std::thread::spawn(move || {
            pin(b);
            for i in 0..rounds {
                while flag.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                flag.store(2 * i + 2, Ordering::Release);
            }
        })
    };
    let t = Instant::now();
    for i in 0..rounds {
        flag.store(2 * i + 1, Ordering::Release);
        while flag.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
    }
    let rtt = t.elapsed().as_nanos() as f64 / rounds as f64;
    other.join().expect("the other thread");
    println!("cache_line_round_trip_ns {rtt:.1} (CPUs {a} and {b})");
}
