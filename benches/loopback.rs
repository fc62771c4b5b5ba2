//! End-to-end loopback benchmark: two engines in one process, session batch writes and reads
//! at 4 KiB, 64 KiB and 1 MiB × batch 64 (MORI's strided offsets), reported with MORI's
//! formulas and checked byte for byte. `cargo bench --bench loopback`; with `--test` (or run
//! without `--bench`, as `cargo test --benches` does) it is a seconds-long smoke run.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use morio::{
    EngineDesc, IoEngine, IoEngineConfig, IoEngineSession, MemoryDesc, RegisteredBuffer,
    StatusCode, TcpBackendConfig,
};

/// Deterministic bytes (xorshift64*).
fn fill(buf: &RegisteredBuffer, mut x: u64) {
    let mut v = vec![0u8; buf.len()];
    for c in v.chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        c.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes()[..c.len()]);
    }
    buf.write_at(0, &v);
}

/// Both engines' configs: disjoint halves of the allowed CPUs when there are enough.
fn configs() -> (TcpBackendConfig, TcpBackendConfig) {
    let cpus: Vec<usize> = morio::placement::allowed_cpus().iter().collect();
    let per = (cpus.len() / 2).clamp(1, 8);
    if cpus.len() < 2 * per {
        let c = TcpBackendConfig {
            pin_shards: false,
            num_shards: Some(1),
            ..Default::default()
        };
        return (c.clone(), c);
    }
    let half = |c: &[usize]| TcpBackendConfig {
        cpus: Some(c.to_vec()),
        ..Default::default()
    };
    (half(&cpus[..per]), half(&cpus[per..2 * per]))
}

struct Row {
    op: &'static str,
    size: usize,
    batch: usize,
    durations: Vec<Duration>,
}

fn run_row(
    sess: &IoEngineSession,
    write: bool,
    size: usize,
    batch: usize,
    warmup: usize,
    iters: usize,
) -> anyhow::Result<Vec<Duration>> {
    let offs: Vec<usize> = (0..batch).map(|i| i * (size + 1)).collect();
    let sizes = vec![size; batch];
    let mut out = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        let uid = sess.allocate_transfer_uid();
        let t = Instant::now();
        let st = if write {
            sess.batch_write(&offs, &offs, &sizes, uid)
        } else {
            sess.batch_read(&offs, &offs, &sizes, uid)
        };
        let code = st.wait();
        let d = t.elapsed();
        if code != StatusCode::Success {
            bail!("{size} B × {batch}: {code} {}", st.message());
        }
        if i >= warmup {
            out.push(d);
        }
    }
    Ok(out)
}

/// The row's segments are equal in both buffers.
fn check(a: &RegisteredBuffer, b: &RegisteredBuffer, size: usize, batch: usize) -> bool {
    let (mut x, mut y) = (vec![0u8; size], vec![0u8; size]);
    (0..batch).all(|i| {
        let o = i * (size + 1);
        a.read_at(o, &mut x) && b.read_at(o, &mut y) && x == y
    })
}

fn print(rows: &[Row]) {
    println!(
        "{:<6} {:>11} {:>9} {:>14} {:>13} {:>13} {:>12} {:>12}",
        "op",
        "MsgSize (B)",
        "BatchSize",
        "TotalSize (MB)",
        "Max BW (GB/s)",
        "Avg BW (GB/s)",
        "Min Lat (us)",
        "Avg Lat (us)"
    );
    for r in rows {
        let secs: Vec<f64> = r.durations.iter().map(Duration::as_secs_f64).collect();
        let mean = secs.iter().sum::<f64>() / secs.len().max(1) as f64;
        let min = secs.iter().copied().fold(f64::INFINITY, f64::min);
        let mb = r.size as f64 * r.batch as f64 / 1e6;
        println!(
            "{:<6} {:>11} {:>9} {:>14.2} {:>13.2} {:>13.2} {:>12.2} {:>12.2}",
            r.op,
            r.size,
            r.batch,
            mb,
            mb / 1e3 / min,
            mb / 1e3 / mean,
            min * 1e6,
            mean * 1e6
        );
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--test") || !args.iter().any(|a| a == "--bench");
    let (sizes, batch, warmup, iters): (&[usize], _, _, _) = if quick {
        (&[4 << 10, 64 << 10], 8, 1, 4)
    } else {
        (&[4 << 10, 64 << 10, 1 << 20], 64, 4, 64)
    };
    let len = (sizes.iter().max().copied().unwrap_or(0) + 1) * batch;

    let ini = IoEngine::new("bench-initiator", IoEngineConfig::new("127.0.0.1", 0))?;
    let tgt = IoEngine::new("bench-target", IoEngineConfig::new("127.0.0.1", 0))?;
    let (ci, ct) = configs();
    ini.create_backend(ci).context("initiator backend")?;
    tgt.create_backend(ct).context("target backend")?;
    ini.register_remote_engine(&EngineDesc::unpack(&tgt.engine_desc().pack())?)?;
    let local = ini.alloc_buffer(len)?;
    let remote_buf = tgt.alloc_buffer(len)?;
    let remote = MemoryDesc::unpack(&remote_buf.desc().pack())?;
    let sess = ini
        .create_session(local.desc(), &remote)
        .context("session")?;

    let mut rows = Vec::new();
    for (op, write) in [("write", true), ("read", false)] {
        for (k, &size) in sizes.iter().enumerate() {
            // Source and destination differ before every row, so the check means something.
            let (src, dst) = if write {
                (&local, &remote_buf)
            } else {
                (&remote_buf, &local)
            };
            fill(src, 0x9E37_79B9 + k as u64);
            fill(dst, 0x5151_0000 + k as u64);
            let durations = run_row(&sess, write, size, batch, warmup, iters)?;
            ensure!(
                check(&local, &remote_buf, size, batch),
                "{op} {size} B × {batch}: bytes differ after the row"
            );
            rows.push(Row {
                op,
                size,
                batch,
                durations,
            });
        }
    }
    println!(
        "morio loopback bench ({} mode): two engines in one process, session batch, strided, \
         {iters} iterations per row, verified",
        if quick { "smoke" } else { "full" }
    );
    print(&rows);
    Ok(())
}
