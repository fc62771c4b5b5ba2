//! `morio loopback`: the README's main job.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use morio::{IoEngine, IoEngineConfig, StatusCode, TcpBackendConfig};

use crate::bench::argv::parse_size;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Bytes to move each way (suffixes K, M, G, KiB, MiB, GiB).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    size: usize,
    /// Shards per engine (default: one per allowed CPU, at most one per lane).
    #[arg(long)]
    shards: Option<usize>,
    /// Lanes (data connections) per peer.
    #[arg(long, default_value_t = 8)]
    conns: usize,
    /// Largest chunk per frame.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    chunk: usize,
    /// Do not pin shards to CPUs.
    #[arg(long)]
    no_pin: bool,
    /// Skip the plain-TCP baseline.
    #[arg(long)]
    no_baseline: bool,
}

/// Fast deterministic fill (xorshift64*), so a GiB of test data costs little time.
fn fill(buf: &mut [u8], mut x: u64) {
    for c in buf.chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

pub fn run(a: Args) -> anyhow::Result<()> {
    ensure!(a.size > 0, "--size must be positive");
    let cfg = TcpBackendConfig {
        num_data_conns: a.conns,
        num_shards: a.shards,
        chunk_bytes: a.chunk,
        pin_shards: !a.no_pin,
        ..Default::default()
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

    let mut data = vec![0u8; a.size];
    fill(&mut data, 0x9E37_79B9_7F4A_7C15);
    let src = ea.register_buffer(data)?;
    // Destinations hold other bytes (and are touched, as a live KV cache would be), so the
    // verification below cannot pass by accident and page faults stay out of the timing.
    let mut other = vec![0u8; a.size];
    fill(&mut other, 0x1234_5678);
    let dst = eb.register_buffer(other.clone())?;
    let back = ea.register_buffer(other)?;
    let remote = morio::MemoryDesc::unpack(&dst.desc().pack())?;
    println!(
        "morio loopback: {} bytes, {} shards per engine, {} lanes, chunk {} bytes",
        a.size,
        ea.n_shards(),
        a.conns,
        a.chunk
    );

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
    let (s, d) = (src.to_vec(), dst.to_vec());
    ensure!(s == d, "write verification FAILED: target bytes differ");
    drop(d);

    let uid = ea.allocate_transfer_uid();
    let t = Instant::now();
    let st = ea.read(back.desc(), 0, &remote, 0, a.size, uid);
    let code = st.wait();
    let rt = t.elapsed();
    if code != StatusCode::Success {
        bail!("read failed: {code} {}", st.message());
    }
    ensure!(back.to_vec() == s, "read verification FAILED: bytes differ");

    let base = if a.no_baseline {
        None
    } else {
        Some(tcp_copy(&s)?)
    };
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
    row("morio write (verified)", wt);
    row("morio read (verified)", rt);
    if let Some(b) = base {
        row("plain TCP, 1 stream, 4 MiB writes", b);
    }
    println!(
        "\nverified: {} bytes written and {} bytes read back, byte for byte",
        a.size, a.size
    );
    Ok(())
}

/// Per-engine configs with disjoint CPU sets when the machine has room for both.
fn split_cpus(
    cfg: &TcpBackendConfig,
    shards: Option<usize>,
) -> (TcpBackendConfig, TcpBackendConfig) {
    let allowed: Vec<usize> = morio::placement::allowed_cpus().iter().collect();
    let per = shards.unwrap_or_else(|| (allowed.len() / 2).clamp(1, cfg.num_data_conns));
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
