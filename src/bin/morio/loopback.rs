//! `morio loopback`: the README's main job. Two engines in this process, a striped write and
//! a striped read of `--size` bytes, each verified byte for byte, beside a plain
//! single-stream TCP copy of the same size.
//!
//! Memory: two registered buffers of `--size` bytes (the initiator's and the target's) and
//! nothing else of that size. The expected bytes come from a seeded generator, so each
//! verification regenerates them a few MiB at a time and compares in place; the baseline
//! sends from the initiator's buffer before it is registered. Each phase prints a line as it
//! ends, with the time since the start.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use morio::{IoEngine, IoEngineConfig, RegisteredBuffer, StatusCode, TcpBackendConfig};

use crate::bench::argv::{format_shard_cpus, parse_size};

/// Most shards per engine `--shards` accepts (as many as a CPU list may name).
const MAX_SHARDS: u64 = 1024;
/// Bytes generated and compared per step when filling and verifying.
const STEP: usize = 4 << 20;
/// Seed of the source bytes.
const SOURCE_SEED: u64 = 0x9E37_79B9_7F4A_7C15;
/// Seeds of what destinations hold before a transfer overwrites them.
const OTHER_SEEDS: [u64; 2] = [0x1234_5678, 0x0BAD_CAFE_F00D];

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Bytes to move each way (suffixes K, M, G, KiB, MiB, GiB); needs twice that in memory.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    size: usize,
    /// Shards per engine (default: one per allowed CPU, at most one per lane).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_SHARDS))]
    shards: Option<usize>,
    /// Lanes (data connections) per peer, 1..=16.
    #[arg(long, default_value_t = 8)]
    conns: usize,
    /// Largest chunk per frame (4 KiB ..= 64 MiB).
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    chunk: usize,
    /// Do not pin shards to CPUs.
    #[arg(long)]
    no_pin: bool,
    /// Skip the plain-TCP baseline.
    #[arg(long)]
    no_baseline: bool,
    /// Same-host transport between the two engines: auto (default: the environment's
    /// MORIO_SAME_HOST, else auto), off (TCP) or require.
    #[arg(long, value_name = "MODE")]
    same_host: Option<morio::SameHost>,
}

/// A deterministic byte stream (xorshift64*), generated a step at a time: a GiB of test data
/// costs little time and no memory beyond the step.
struct Stream(u64);

impl Stream {
    /// Fill `buf` with the stream's next bytes; every call but the last must be given a
    /// multiple of 8 bytes, so the stream does not depend on how it is cut.
    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let x = &mut self.0;
            *x ^= *x >> 12;
            *x ^= *x << 25;
            *x ^= *x >> 27;
            let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// Fill a registered buffer with the stream of `seed`, a step at a time.
fn fill_buffer(buf: &RegisteredBuffer, seed: u64) -> anyhow::Result<()> {
    let mut s = Stream(seed);
    let mut scratch = vec![0u8; STEP.min(buf.len())];
    let mut off = 0;
    while off < buf.len() {
        let n = STEP.min(buf.len() - off);
        s.fill(&mut scratch[..n]);
        ensure!(
            buf.write_at(off, &scratch[..n]),
            "fill out of range at {off}"
        );
        off += n;
    }
    Ok(())
}

/// Compare a registered buffer with the stream of `seed`, a step at a time; the first
/// differing offset, if any.
fn first_difference(buf: &RegisteredBuffer, seed: u64) -> anyhow::Result<Option<usize>> {
    let mut s = Stream(seed);
    let n0 = STEP.min(buf.len());
    let (mut want, mut got) = (vec![0u8; n0], vec![0u8; n0]);
    let mut off = 0;
    while off < buf.len() {
        let n = STEP.min(buf.len() - off);
        s.fill(&mut want[..n]);
        ensure!(
            buf.read_at(off, &mut got[..n]),
            "verify out of range at {off}"
        );
        if want[..n] != got[..n] {
            let i = want.iter().zip(&got).position(|(a, b)| a != b).unwrap_or(0);
            return Ok(Some(off + i));
        }
        off += n;
    }
    Ok(None)
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

/// `1 GiB`-style text for a byte count.
fn human(bytes: usize) -> String {
    const UNITS: [(&str, usize); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (u, m) in UNITS {
        if bytes >= m {
            return format!("{:.2} {u}", bytes as f64 / m as f64)
                .replace(".00 ", " ")
                .to_string();
        }
    }
    format!("{bytes} B")
}

/// Phase lines, each with the time since the start.
struct Phases(Instant);

impl Phases {
    fn done(&self, what: std::fmt::Arguments<'_>) {
        println!("  [{:6.2} s] {what}", self.0.elapsed().as_secs_f64());
        let _ = std::io::stdout().flush();
    }
}

/// Every check that needs no engine: bad values are errors, never panics.
fn check(a: &Args, cfg: &TcpBackendConfig) -> anyhow::Result<()> {
    ensure!(a.size > 0, "--size must be at least 1 byte");
    cfg.validate().map_err(|e| {
        let flag = match &e {
            morio::ConfigError::DataConns(_) => "--conns",
            morio::ConfigError::ChunkBytes(_) => "--chunk",
            morio::ConfigError::ZeroShards => "--shards",
            _ => "option",
        };
        anyhow::anyhow!("bad {flag}: {e}")
    })?;
    if let Some(ram) = physical_memory() {
        ensure!(
            a.size.checked_mul(2).is_some_and(|n| n as u64 <= ram),
            "--size {} needs two buffers of that size, more than this machine's {} of memory",
            human(a.size),
            human(usize::try_from(ram).unwrap_or(usize::MAX))
        );
    }
    Ok(())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let cfg = TcpBackendConfig {
        num_data_conns: a.conns,
        num_shards: a.shards,
        chunk_bytes: a.chunk,
        pin_shards: !a.no_pin,
        same_host: a.same_host,
        ..Default::default()
    };
    check(&a, &cfg)?;
    let p = Phases(Instant::now());
    println!(
        "morio loopback: {} ({} bytes) each way, {} lanes, chunk {}",
        human(a.size),
        a.size,
        a.conns,
        human(a.chunk)
    );
    // The source, filled before anything else: the baseline sends from it as plain memory.
    let mut data = crate::bench::alloc(a.size)?;
    Stream(SOURCE_SEED).fill(&mut data);
    p.done(format_args!("source filled: {}", human(a.size)));
    let base = if a.no_baseline {
        None
    } else {
        let d = tcp_copy(&data)?;
        p.done(format_args!(
            "plain TCP, 1 stream: {:.1} ms, {:.2} GB/s",
            d.as_secs_f64() * 1e3,
            gbps(a.size, d)
        ));
        Some(d)
    };

    let ea = IoEngine::new("loopback-initiator", IoEngineConfig::new("127.0.0.1", 0))?;
    let eb = IoEngine::new("loopback-target", IoEngineConfig::new("127.0.0.1", 0))?;
    // Two engines share this machine: give each its own half of the allowed CPUs, as two
    // processes on two hosts would have, when there are enough.
    let (cfg_a, mut cfg_b) = split_cpus(&cfg, a.shards);
    ea.create_backend(cfg_a).context("initiator backend")?;
    if cfg_b.pin_shards && cfg_b.cpus.is_none() {
        // Too few CPUs for two halves: both engines run on the same CPUs, as they always
        // have here. The initiator claimed its CPUs host-wide, so the target names them
        // explicitly (a claiming engine would find them taken and float).
        let pinned: Option<Vec<usize>> = ea.shard_cpus().into_iter().collect();
        cfg_b.cpus = pinned;
        cfg_b.num_shards = None;
    }
    eb.create_backend(cfg_b).context("target backend")?;
    // Descriptors cross "out of band" as packed bytes, as they would between processes.
    ea.register_remote_engine(&morio::EngineDesc::unpack(&eb.engine_desc().pack())?)?;
    p.done(format_args!(
        "engines up: {} shard(s) each, initiator CPUs {}, target CPUs {}",
        ea.n_shards(),
        format_shard_cpus(&ea.shard_cpus()),
        format_shard_cpus(&eb.shard_cpus()),
    ));

    let src = ea.register_buffer(data)?;
    // The destination holds other bytes (and is touched, as a live KV cache would be), so
    // the verification cannot pass by accident and page faults stay out of the timing.
    let dst = eb.register_buffer(crate::bench::alloc(a.size)?)?;
    fill_buffer(&dst, OTHER_SEEDS[0])?;
    let remote = morio::MemoryDesc::unpack(&dst.desc().pack())?;
    p.done(format_args!(
        "buffers registered: 2 x {} (the destination overwritten with other bytes)",
        human(a.size)
    ));

    let uid = ea.allocate_transfer_uid();
    let t = Instant::now();
    let st = ea.write(src.desc(), 0, &remote, 0, a.size, uid);
    let code = st.wait();
    let wt = t.elapsed();
    if code != StatusCode::Success {
        bail!("write failed: {code} {}", st.message());
    }
    let inbound = eb
        .pop_inbound_transfer_status(ea.key(), uid)
        .map(|s| s.code());
    ensure!(
        inbound == Some(StatusCode::Success),
        "target inbound status: {inbound:?}"
    );
    p.done(format_args!(
        "write: {:.1} ms, {:.2} GB/s",
        wt.as_secs_f64() * 1e3,
        gbps(a.size, wt)
    ));
    if let Some(off) = first_difference(&dst, SOURCE_SEED)? {
        bail!("write verification FAILED: the target's bytes differ from offset {off}");
    }
    p.done(format_args!("write verified byte for byte"));

    // The read lands in the initiator's buffer, first overwritten with other bytes.
    fill_buffer(&src, OTHER_SEEDS[1])?;
    let uid = ea.allocate_transfer_uid();
    let t = Instant::now();
    let st = ea.read(src.desc(), 0, &remote, 0, a.size, uid);
    let code = st.wait();
    let rt = t.elapsed();
    if code != StatusCode::Success {
        bail!("read failed: {code} {}", st.message());
    }
    p.done(format_args!(
        "read: {:.1} ms, {:.2} GB/s",
        rt.as_secs_f64() * 1e3,
        gbps(a.size, rt)
    ));
    if let Some(off) = first_difference(&src, SOURCE_SEED)? {
        bail!("read verification FAILED: the bytes read back differ from offset {off}");
    }
    p.done(format_args!("read verified byte for byte"));

    println!();
    println!(
        "{:<34} {:>12} {:>10} {:>10}",
        "transfer", "time (ms)", "GB/s", "vs TCP"
    );
    let row = |name: &str, d: Duration| {
        let g = gbps(a.size, d);
        let rel = base.map_or("-".to_string(), |b| format!("{:.2}x", g / gbps(a.size, b)));
        println!(
            "{name:<34} {:>12.1} {g:>10.2} {rel:>10}",
            d.as_secs_f64() * 1e3
        );
    };
    let t = ea.stats().map(|s| s.total());
    let transport = match t {
        Some(t) if t.lane_connects > 0 && t.lane_connects_same_host == t.lane_connects => {
            "same-host"
        }
        Some(t) if t.lane_connects_same_host == 0 => "TCP",
        _ => "mixed",
    };
    row(&format!("morio write (verified, {transport})"), wt);
    row(&format!("morio read (verified, {transport})"), rt);
    if let Some(b) = base {
        row("plain TCP, 1 stream, 4 MiB writes", b);
    }
    println!(
        "\nverified: {} bytes written and {} bytes read back, byte for byte",
        a.size, a.size
    );
    Ok(())
}

/// This machine's physical memory in bytes, if known.
fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let ram = u64::try_from(pages)
        .ok()?
        .checked_mul(u64::try_from(page).ok()?)?;
    (ram > 0).then_some(ram)
}

/// Per-engine configs with disjoint CPU sets when the machine has room for both.
fn split_cpus(
    cfg: &TcpBackendConfig,
    shards: Option<usize>,
) -> (TcpBackendConfig, TcpBackendConfig) {
    let allowed: Vec<usize> = morio::placement::allowed_cpus().iter().collect();
    let per = shards.unwrap_or_else(|| (allowed.len() / 2).clamp(1, cfg.num_data_conns.max(1)));
    if !cfg.pin_shards || allowed.len() < 2 * per {
        return (cfg.clone(), cfg.clone());
    }
    let half = |cpus: &[usize]| TcpBackendConfig {
        cpus: Some(cpus.to_vec()),
        num_shards: None,
        ..cfg.clone()
    };
    (half(&allowed[..per]), half(&allowed[per..2 * per]))
}

/// The ceiling reference: one blocking TCP stream over loopback moving the same bytes.
fn tcp_copy(data: &[u8]) -> anyhow::Result<Duration> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let n = data.len();
    let rx = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; 4 << 20];
        let mut got = 0usize;
        let mut sum = 0u64;
        while got < n {
            let k = s.read(&mut buf)?;
            if k == 0 {
                break;
            }
            sum = sum.wrapping_add(buf[0] as u64);
            got += k;
        }
        s.write_all(&[1])?;
        Ok(sum)
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let t = Instant::now();
    for c in data.chunks(4 << 20) {
        s.write_all(c)?;
    }
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack)?;
    let d = t.elapsed();
    rx.join()
        .map_err(|_| anyhow::anyhow!("receiver panicked"))??;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_does_not_depend_on_how_it_is_cut() {
        let mut whole = vec![0u8; 100];
        Stream(7).fill(&mut whole);
        let mut parts = vec![0u8; 100];
        let mut s = Stream(7);
        let (a, b) = parts.split_at_mut(48);
        s.fill(a);
        s.fill(b);
        assert_eq!(whole, parts);
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(3 << 19), "1.50 MiB");
        assert_eq!(human(10), "10 B");
    }
}
