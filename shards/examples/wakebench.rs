//! Wake-up cost of a parked thread against how long it sat idle: why a shard idle for a few
//! milliseconds costs more to wake than a small transfer takes (docs/perf/same-host-chunks-h200.md).
//!
//! `cargo run --release -p morio-shards --example wakebench -- WAKER_CPU SLEEPER_CPU`: the
//! sleeper blocks on a condition variable (a futex), the waker sleeps IDLE µs, stamps the time
//! and notifies; the sleeper reports how late it woke. 60 rounds per idle time.
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the calls only read it.
    unsafe {
        let mut s: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut s);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &s);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let a_cpu: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let b_cpu: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(9);
    let n = 60;
    println!("waker cpu {a_cpu}, sleeper cpu {b_cpu}");
    println!(
        "{:>10} {:>9} {:>9} {:>9}",
        "idle_us", "p50_us", "p90_us", "max_us"
    );
    for idle_us in [20u64, 100, 300, 1000, 2000, 4000, 8000, 16000] {
        let st = Arc::new((Mutex::new((0u64, None::<Instant>)), Condvar::new()));
        let st2 = st.clone();
        let (tx, rx) = std::sync::mpsc::channel::<Duration>();
        let h = std::thread::spawn(move || {
            pin(b_cpu);
            let (m, cv) = &*st2;
            let mut seen = 0u64;
            loop {
                let mut g = m.lock().unwrap();
                while g.0 == seen {
                    g = cv.wait(g).unwrap();
                }
                seen = g.0;
                if seen == u64::MAX {
                    return;
                }
                let t0 = g.1.unwrap();
                drop(g);
                tx.send(t0.elapsed()).unwrap();
            }
        });
        pin(a_cpu);
        let mut v = Vec::new();
        for i in 1..=n {
            std::thread::sleep(Duration::from_micros(idle_us));
            let (m, cv) = &*st;
            {
                let mut g = m.lock().unwrap();
                g.0 = i;
                g.1 = Some(Instant::now());
            }
            cv.notify_one();
            v.push(rx.recv().unwrap());
        }
        {
            let (m, cv) = &*st;
            m.lock().unwrap().0 = u64::MAX;
            cv.notify_one();
        }
        h.join().unwrap();
        v.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "{:>10} {:>9.1} {:>9.1} {:>9.1}",
            idle_us,
            us(v[n as usize / 2]),
            us(v[n as usize * 9 / 10]),
            us(v[n as usize - 1])
        );
    }
}
