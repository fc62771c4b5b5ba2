//! `--scrape-ms N`: while the rows run, a thread renders the engine's Prometheus exposition
//! every N ms, as a 1 s Prometheus scrape of `/metrics` would (what scraping costs the data
//! path shows as the difference to a run without it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use morio::IoEngine;

/// Run `f` with `engine` scraped every `every_ms` (none: just `f`); `f`'s result and the
/// scrapes made.
pub fn while_running<T>(
    engine: &IoEngine,
    every_ms: Option<u64>,
    f: impl FnOnce() -> T,
) -> (T, u64) {
    let Some(ms) = every_ms else {
        return (f(), 0);
    };
    let every = Duration::from_millis(ms);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let scraper = s.spawn(|| {
            let mut n = 0u64;
            let mut next = Instant::now() + every;
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now >= next {
                    std::hint::black_box(engine.metrics_text());
                    n += 1;
                    next += every;
                } else {
                    std::thread::sleep((next - now).min(Duration::from_millis(10)));
                }
            }
            n
        });
        let r = f();
        stop.store(true, Ordering::Relaxed);
        (r, scraper.join().unwrap_or(0))
    })
}
