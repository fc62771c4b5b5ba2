//! The raw-TCP latency floor of a row: the row's bytes moved over as many plain TCP streams
//! as the engine stripes it across, by busy-polling threads pinned to the same CPUs as the
//! shards, one round per iteration (a request of `up` bytes on every stream, answered by
//! `down` bytes), timed from the release of a round to the last answer. It is what the
//! kernel allows for one batch on that machine with those cores, beside the row's latency.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::ceiling::pin_current_thread;

/// How long any single step may stall before the floor gives up.
const STALL: Duration = Duration::from_secs(30);

/// Rows above this many bytes get no floor: their figure is throughput, and the ceiling
/// covers it.
pub const MAX_FLOOR_BYTES: u64 = 16 << 20;

/// The shape of one floor: streams, and bytes each way per stream and round.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Parallel streams.
    pub streams: usize,
    /// Bytes the initiator sends per stream and round (a write's share, or a read's request).
    pub up: u64,
    /// Bytes the target answers with per stream and round (a read's share, or an ack).
    pub down: u64,
}

impl Shape {
    /// The floor of a batch of `total` bytes under `cfg`: the streams the engine stripes it
    /// across (one below the striping threshold), each with an even share going the way the
    /// data goes, answered by 1 byte (a write) or asked for with 8 (a read).
    pub fn of_batch(total: u64, write: bool, cfg: &morio::TcpBackendConfig) -> Self {
        let lanes = cfg.num_data_conns.max(1) as u64;
        let streams = if lanes > 1 && total >= cfg.striping_threshold_bytes as u64 {
            let stripe = morio::stripe_bytes(total, lanes, cfg.chunk_bytes as u64);
            total.div_ceil(stripe).clamp(1, lanes)
        } else {
            1
        };
        let share = total.div_ceil(streams).max(1);
        let (up, down) = if write { (share, 1) } else { (8, share) };
        Self {
            streams: streams as usize,
            up,
            down,
        }
    }
}

/// The measured floor of a row.
#[derive(Serialize, Debug, Clone)]
pub struct Floor {
    /// What was moved per round.
    pub shape: Shape,
    /// Timed rounds.
    pub rounds: usize,
    /// Median round (µs).
    pub p50_us: f64,
    /// Mean round (µs): what a row's Avg Lat compares with.
    pub avg_us: f64,
    /// Its p99 (µs).
    pub p99_us: f64,
    /// Fastest round (µs).
    pub min_us: f64,
}

/// Pure spinning lasts this long in any one wait; then each turn yields the CPU, so a
/// machine with fewer CPUs than threads (a 2-core VM) still makes progress.
const SPIN: Duration = Duration::from_micros(50);

/// One turn of a wait that began at `t0`: an error once it has stalled.
fn backoff(t0: Instant) -> std::io::Result<()> {
    let waited = t0.elapsed();
    if waited > STALL {
        return Err(ErrorKind::TimedOut.into());
    }
    if waited > SPIN {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
    Ok(())
}

/// Move `m` fully from a non-blocking socket, spinning on `WouldBlock`.
fn spin_read(s: &mut TcpStream, m: &mut [u8]) -> std::io::Result<()> {
    let t0 = Instant::now();
    let mut got = 0;
    while got < m.len() {
        match s.read(&mut m[got..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                backoff(t0)?
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Send `m` fully on a non-blocking socket, spinning on `WouldBlock`.
fn spin_write(s: &mut TcpStream, m: &[u8]) -> std::io::Result<()> {
    let t0 = Instant::now();
    let mut put = 0;
    while put < m.len() {
        match s.write(&m[put..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => put += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                backoff(t0)?
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn pin(cpus: &Option<Vec<usize>>, i: usize) {
    if let Some(c) = cpus.as_ref().filter(|c| !c.is_empty()) {
        if let Err(e) = pin_current_thread(c[i % c.len()]) {
            log::warn!("floor: cannot pin thread {i}: {e}");
        }
    }
}

/// Target side: accept `shape.streams` connections on `host`; each is served by a pinned,
/// busy-polling thread that, `rounds` times, reads `up` bytes and answers `down` bytes.
/// Returns the port and a handle that ends when every server thread has.
pub fn serve(
    host: IpAddr,
    shape: Shape,
    rounds: usize,
    cpus: Option<Vec<usize>>,
) -> anyhow::Result<(u16, JoinHandle<anyhow::Result<()>>)> {
    let l = TcpListener::bind((host, 0)).context("floor: bind")?;
    let port = l.local_addr()?.port();
    l.set_nonblocking(true)?;
    let h = std::thread::Builder::new()
        .name("floor-accept".into())
        .spawn(move || -> anyhow::Result<()> {
            let t0 = Instant::now();
            let mut threads = Vec::new();
            while threads.len() < shape.streams {
                match l.accept() {
                    Ok((s, _)) => {
                        let (i, cpus) = (threads.len(), cpus.clone());
                        threads.push(std::thread::spawn(move || -> anyhow::Result<()> {
                            pin(&cpus, i);
                            answer(s, shape, rounds)
                        }));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if t0.elapsed() > STALL {
                            bail!(
                                "floor: only {} of {} streams connected",
                                threads.len(),
                                shape.streams
                            );
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => return Err(e).context("floor: accept"),
                }
            }
            for t in threads {
                t.join()
                    .map_err(|_| anyhow::anyhow!("floor server panicked"))??;
            }
            Ok(())
        })
        .context("floor: spawn")?;
    Ok((port, h))
}

fn answer(mut s: TcpStream, shape: Shape, rounds: usize) -> anyhow::Result<()> {
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    let mut inb = vec![0u8; shape.up as usize];
    let out = vec![0x3Cu8; shape.down as usize];
    for _ in 0..rounds {
        spin_read(&mut s, &mut inb).context("floor: read request")?;
        spin_write(&mut s, &out).context("floor: answer")?;
    }
    Ok(())
}

/// Initiator side: connect `shape.streams` streams to `addr`, start one pinned busy-polling
/// thread per stream, then release `rounds` rounds one after another from the calling
/// thread and time each from its release to the last stream's answer. The first tenth of
/// the rounds warm up and are not counted.
pub fn measure(
    addr: SocketAddr,
    shape: Shape,
    rounds: usize,
    cpus: Option<Vec<usize>>,
) -> anyhow::Result<Floor> {
    let warm = rounds / 10;
    let timed = rounds - warm;
    if timed == 0 || shape.streams == 0 {
        bail!("floor: nothing to time");
    }
    let socks = (0..shape.streams)
        .map(|_| {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
            s.set_nodelay(true)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .collect::<std::io::Result<Vec<_>>>()
        .context("floor: connect")?;
    let round = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = socks
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            let (round, done, failed, cpus) =
                (round.clone(), done.clone(), failed.clone(), cpus.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                pin(&cpus, i);
                let out = vec![0x5Au8; shape.up as usize];
                let mut inb = vec![0u8; shape.down as usize];
                let r = (1..=rounds as u64).try_for_each(|r| -> anyhow::Result<()> {
                    let t0 = Instant::now();
                    while round.load(Ordering::Acquire) < r {
                        if failed.load(Ordering::Relaxed) {
                            bail!("floor: another stream failed");
                        }
                        if backoff(t0).is_err() {
                            bail!("floor: round {r} was never released");
                        }
                    }
                    spin_write(&mut s, &out).context("floor: send")?;
                    spin_read(&mut s, &mut inb).context("floor: wait for the answer")?;
                    done.fetch_add(1, Ordering::AcqRel);
                    Ok(())
                });
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                r
            })
        })
        .collect();
    let mut rtts = Vec::with_capacity(timed);
    let n = shape.streams as u64;
    for r in 1..=rounds as u64 {
        let t0 = Instant::now();
        round.store(r, Ordering::Release);
        while done.load(Ordering::Acquire) < r * n {
            if failed.load(Ordering::Relaxed) || backoff(t0).is_err() {
                failed.store(true, Ordering::Relaxed);
                break;
            }
        }
        if failed.load(Ordering::Relaxed) {
            break;
        }
        if r as usize > warm {
            rtts.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("floor stream panicked"))??;
    }
    if rtts.len() < timed {
        bail!("floor: stalled after {} of {timed} rounds", rtts.len());
    }
    let avg_us = rtts.iter().sum::<f64>() / rtts.len() as f64;
    rtts.sort_by(f64::total_cmp);
    let at = |q: f64| rtts[((rtts.len() - 1) as f64 * q) as usize];
    Ok(Floor {
        shape,
        rounds: timed,
        p50_us: at(0.5),
        avg_us,
        p99_us: at(0.99),
        min_us: rtts[0],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_floors_over_the_streams_the_engine_stripes_it_across() {
        let mut cfg = morio::TcpBackendConfig {
            num_data_conns: 7,
            ..Default::default()
        };
        let w = Shape::of_batch(1 << 20, true, &cfg);
        assert_eq!((w.streams, w.up, w.down), (7, (1u64 << 20).div_ceil(7), 1));
        let r = Shape::of_batch(1 << 20, false, &cfg);
        assert_eq!((r.streams, r.up, r.down), (7, 8, (1u64 << 20).div_ceil(7)));
        // Below the threshold, one stream; above, never stripes under the minimum size.
        assert_eq!(Shape::of_batch(2048, true, &cfg).streams, 1);
        assert_eq!(Shape::of_batch(256 << 10, true, &cfg).streams, 4);
        cfg.num_data_conns = 1;
        assert_eq!(Shape::of_batch(1 << 20, true, &cfg).up, 1 << 20);
    }

    #[test]
    fn floor_over_loopback_both_ways() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        for shape in [
            Shape {
                streams: 3,
                up: 100_000,
                down: 1,
            },
            Shape {
                streams: 2,
                up: 8,
                down: 70_000,
            },
        ] {
            let (port, h) = serve(ip, shape, 50, None).unwrap();
            let f = measure(SocketAddr::new(ip, port), shape, 50, None).unwrap();
            h.join().unwrap().unwrap();
            assert_eq!((f.shape, f.rounds), (shape, 45));
            assert!(f.min_us > 0.0 && f.min_us <= f.p50_us && f.p50_us <= f.p99_us);
            assert!(f.min_us <= f.avg_us && f.avg_us.is_finite());
        }
    }
}
