//! `morio bench --role initiator`: join the target over the side channel, run every row with
//! validation after each, measure the raw-TCP ceiling once (after the rows), print MORI's table
//! and write the JSON report.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use morio::{EngineDesc, IoEngine, IoEngineConfig, MemoryDesc, RegisteredBuffer};

use super::args::{Args, MemType, OpType};
use super::ceiling::{self, Ceiling};
use super::data;
use super::floor::{self, Floor, Shape};
use super::report::{self, Report, Side};
use super::runner::Runner;
use super::stats::{Counters, RowStats};
use super::wire::{Channel, Reply, Request, Setup, Welcome, MAGIC};

/// Seed of the initiator's initial contents.
const INITIAL_SEED: u64 = 0x1A17_1A70_0000_0001;

/// Seed of row `i`'s scramble (different from both initial seeds).
fn row_seed(i: usize) -> u64 {
    0x9E37_79B9_7F4A_7C15 ^ ((i as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03))
}

/// Run the initiator role: the whole benchmark.
pub fn run(a: &Args) -> anyhow::Result<()> {
    if let Some(us) = a.wait_spin_us {
        morio::status::set_wait_spin(Duration::from_micros(us));
    }
    let rows = a.rows()?;
    let blen = a.buffer_len()?;
    let connect = a
        .connect
        .as_deref()
        .context("--connect HOST:PORT is required")?;
    let mut ch = Channel::connect(connect, a.backend_config().op_timeout)?;
    ch.send(&Setup {
        magic: MAGIC.to_string(),
        buffer_len: blen as u64,
    })?;
    let welcome = {
        let _notice = Notice::after(
            Duration::from_secs(2),
            format!(
                "waiting for the target at {connect} to set up its {blen}-byte buffer \
                 (allocate, fill, register)"
            ),
        );
        ch.recv::<Welcome>()
            .with_context(|| format!("no setup answer from the target at {connect}"))?
    };
    let (tdesc, tmem, tinfo) = match welcome {
        Welcome::Ready {
            magic,
            engine,
            memory,
            info,
        } => {
            ensure!(
                magic == MAGIC,
                "the target at {connect} speaks {magic:?}, this initiator {MAGIC:?}: use the \
                 same morio on both sides"
            );
            let tdesc = EngineDesc::unpack(&engine).context("target's EngineDesc")?;
            let tmem = MemoryDesc::unpack(&memory).context("target's MemoryDesc")?;
            (tdesc, tmem, info)
        }
        Welcome::Refused { message } => bail!("the target at {connect}: {message}"),
    };
    ensure!(
        tmem.size >= blen as u64,
        "the target's buffer has {} bytes, this run needs {blen}",
        tmem.size
    );

    let engine = IoEngine::new("morio-bench-initiator", IoEngineConfig::new(&a.host, 0))?;
    engine
        .create_backend(a.backend_config())
        .context("initiator: TCP backend")?;
    engine.register_remote_engine(&tdesc)?;
    ch.send_frame(&engine.engine_desc().pack())?;
    let buf = data::side_buffer(&engine, a, a.initiator_mem(), blen)?;
    if !a.no_validate {
        data::scramble(&buf, INITIAL_SEED, blen)?;
    }
    let session = if a.enable_sess {
        let s = engine.create_session(buf.desc(), &tmem);
        Some(s.context("create_session: no backend")?)
    } else {
        None
    };
    let idesc = engine.engine_desc();
    let sides = [
        Side::new(
            &idesc,
            engine.n_shards(),
            a.cpus.as_ref().map(|c| c.0.clone()),
        ),
        Side::new(&tdesc, tinfo.shards, tinfo.cpus.clone()),
    ];
    report::print_config(a, &sides, rows.len(), blen);

    let runner = Runner {
        engine: &engine,
        session: session.as_ref(),
        local: buf.desc(),
        remote: &tmem,
        op: a.op_type,
        batch_mode: a.enable_batch_transfer,
        layout: a.layout(),
    };
    let mut done = Vec::new();
    let (res, scrapes) = super::scrape::while_running(&engine, a.scrape_ms, || {
        run_rows(a, &rows, &runner, &mut ch, &buf, &mut done)
    });
    if a.scrape_ms.is_some() {
        log::info!("initiator: {scrapes} metrics scrapes during the rows");
    }
    let res = res.and_then(|()| {
        if a.no_ceiling {
            Ok(None)
        } else {
            measure_ceiling(a, &mut ch).map(Some)
        }
    });
    let ceiling = match res {
        Ok(c) => c,
        Err(e) => {
            if !done.is_empty() {
                println!("{}", report::table(&done, None));
            }
            // Best effort: the target may be gone, or the network with it.
            ch.set_reply_timeout(Some(Duration::from_secs(5)));
            let _ = ch.call(&Request::Done);
            return Err(e);
        }
    };
    let mut sides = sides;
    if a.initiator_mem() == MemType::Gpu || a.target_mem() == MemType::Gpu {
        sides[0].gpu_staging = Some(data::staging(&engine));
        if let Reply::Staging { pinned, peak } = ch.call(&Request::Staging)? {
            sides[1].gpu_staging = Some((pinned, peak));
        }
    }
    ch.call(&Request::Done)?;
    if let Some(p) = morio::trace::dump("initiator")? {
        eprintln!("trace: {}", p.display());
    }
    finish(a, blen, sides, ceiling, done)
}

/// Print the table (and the ceiling's line), write the JSON report.
fn finish(
    a: &Args,
    blen: usize,
    [initiator, target]: [Side; 2],
    ceiling: Option<Ceiling>,
    mut done: Vec<RowStats>,
) -> anyhow::Result<()> {
    if let Some(c) = &ceiling {
        for r in &mut done {
            r.avg_over_ceiling = Some(r.avg_bw_gbps / c.gbps);
        }
    }
    println!("{}", report::table(&done, ceiling.as_ref()));
    if let Some(c) = &ceiling {
        println!(
            "Ceiling: raw TCP, {} streams × {} B with {} MiB writes, {:.3} s, measured {}.",
            c.streams,
            c.bytes / c.streams.max(1) as u64,
            ceiling::IO_BYTES >> 20,
            c.seconds,
            c.measured
        );
        if let (Some(p50), Some(p99)) = (c.rtt_p50_us, c.rtt_p99_us) {
            println!("Latency floor: raw TCP 8 B round trip between pinned threads, p50 {p50:.2} us, p99 {p99:.2} us.");
        }
        if let (Some(p50), Some(p99)) = (c.rtt_spin_p50_us, c.rtt_spin_p99_us) {
            println!("Latency floor, both threads busy-polling: p50 {p50:.2} us, p99 {p99:.2} us.");
        }
    }
    for (who, s) in [("initiator", &initiator), ("target", &target)] {
        if let Some((pinned, peak)) = s.gpu_staging {
            println!(
                "GPU staging ({who}): {:.1} MiB pinned, at most {:.1} MiB in use (cap {:.1} MiB).",
                pinned as f64 / 1048576.0,
                peak as f64 / 1048576.0,
                a.backend_config().gpu_staging_bytes as f64 / 1048576.0
            );
        }
    }
    for note in done.iter().filter_map(RowStats::sharing_note) {
        println!("Note: {note}");
    }
    if let Some(path) = &a.json {
        let r = Report::new(a, blen, initiator, target, ceiling, done);
        report::write_json(path, &r)?;
        println!("JSON: {}", path.display());
    }
    Ok(())
}

fn run_rows(
    a: &Args,
    rows: &[(usize, usize)],
    runner: &Runner<'_>,
    ch: &mut Channel,
    buf: &RegisteredBuffer,
    done: &mut Vec<RowStats>,
) -> anyhow::Result<()> {
    let (warmup, iters) = (a.warmup_iters(), a.iters);
    let pb = progress(rows.len(), warmup + iters);
    for (i, &(size, batch)) in rows.iter().enumerate() {
        let name = format!("{} {size} B × {batch}", a.op_type.name());
        pb.set_message(name.clone());
        let extent = data::extent(size, batch, a.layout());
        let seed = row_seed(i);
        if !a.no_validate {
            match a.op_type {
                OpType::Write => {
                    ch.call(&Request::Scramble {
                        seed,
                        len: extent as u64,
                    })?;
                }
                OpType::Read => data::scramble(buf, seed, extent)?,
            }
        }
        let before = (Counters::of(runner.engine), target_counters(ch)?);
        let durs = runner
            .row(size, batch, warmup, iters, &|| pb.inc(1))
            .with_context(|| format!("row {name} failed"))?;
        let mut st = RowStats::new(a.op_type, size, batch, &durs)?;
        st.initiator_counters = Some(Counters::of(runner.engine).since(before.0));
        st.target_counters = target_counters(ch)?
            .zip(before.1)
            .map(|(now, b)| now.since(b));
        st.transport = transport(runner.engine);
        if !a.no_validate {
            validate(a, ch, buf, size, batch).with_context(|| format!("row {name}"))?;
            st.validated = true;
        }
        let total = (size * batch) as u64;
        if !a.no_floor && total <= floor::MAX_FLOOR_BYTES {
            let f = measure_floor(a, ch, total).with_context(|| format!("floor of row {name}"))?;
            st.p50_over_floor = Some(st.p50_us / f.p50_us);
            st.floor = Some(f);
        }
        done.push(st);
    }
    pb.finish_and_clear();
    Ok(())
}

/// The target engine's shard counters (`None` from a target that does not say).
fn target_counters(ch: &mut Channel) -> anyhow::Result<Option<Counters>> {
    Ok(match ch.call(&Request::Counters)? {
        Reply::Counters(c) => Some(c),
        _ => None,
    })
}

/// Which transport the initiator's lanes use so far (`same-host`: small frames through
/// shared-memory rings; `same-host:socket`: in the socket, as with a version 8 peer or rings
/// turned off), and for GPU memory whether it moved device to device (`+ipc`), through
/// staging (`+staged`) or both.
fn transport(engine: &IoEngine) -> String {
    let t = match engine.stats() {
        Some(s) => s.total(),
        None => return "-".into(),
    };
    let lanes = match (t.lane_connects_same_host, t.lane_connects) {
        (_, 0) => "-",
        (0, _) => "tcp",
        (s, c) if s == c && t.lane_connects_ring == c => "same-host",
        (s, c) if s == c && t.lane_connects_ring == 0 => "same-host:socket",
        (s, c) if s == c => "same-host:mixed",
        _ => "mixed",
    };
    let gpu = match (t.gpu_ipc_bytes > 0, t.gpu_staged_bytes > 0) {
        (true, false) => "+ipc",
        (true, true) => "+ipc/staged",
        (false, true) => "+staged",
        (false, false) => "",
    };
    format!("{lanes}{gpu}")
}

/// Compare xxh3 of the row's segments on both sides (source of a write is ours, of a read
/// theirs; either way the same offsets).
fn validate(
    a: &Args,
    ch: &mut Channel,
    buf: &RegisteredBuffer,
    size: usize,
    batch: usize,
) -> anyhow::Result<()> {
    let segs = data::segments(size, batch, a.layout());
    let ours = data::hash_segments(buf, &segs)?;
    let theirs = match ch.call(&Request::Hash { segs })? {
        Reply::Hash { xxh3 } => xxh3,
        r => bail!("unexpected reply to Hash: {r:?}"),
    };
    let (what_ours, what_theirs) = match a.op_type {
        OpType::Write => ("initiator source", "target destination"),
        OpType::Read => ("initiator destination", "target source"),
    };
    ensure!(
        ours == theirs,
        "validation FAILED: {what_ours} xxh3 {ours:#018x} != {what_theirs} xxh3 {theirs:#018x}"
    );
    Ok(())
}

/// Timed rounds of a row's floor: as many as the row's iterations, within these bounds.
const FLOOR_ROUNDS: (usize, usize) = (20, 2000);

fn measure_floor(a: &Args, ch: &mut Channel, total: u64) -> anyhow::Result<Floor> {
    let shape = Shape::of_batch(total, a.op_type == OpType::Write, &a.backend_config());
    let timed = a.iters.clamp(FLOOR_ROUNDS.0, FLOOR_ROUNDS.1);
    // `measure` counts all but the first tenth.
    let rounds = timed + timed.div_ceil(9);
    let port = match ch.call(&Request::FloorStart {
        shape,
        rounds: rounds as u32,
    })? {
        Reply::CeilingReady { port } => port,
        r => bail!("unexpected reply to FloorStart: {r:?}"),
    };
    let addr = SocketAddr::new(ch.peer()?.ip(), port);
    let measured = floor::measure(addr, shape, rounds, a.pin_cpus());
    let joined = ch.call(&Request::CeilingJoin);
    let f = measured?;
    joined.context("floor servers")?;
    Ok(f)
}

/// The ceiling is the best of this many runs: it stands for what the kernel allows, and a
/// single short run is at the mercy of scheduling noise.
const CEILING_RUNS: usize = 3;

fn measure_ceiling(a: &Args, ch: &mut Channel) -> anyhow::Result<Ceiling> {
    let mut best: Option<Ceiling> = None;
    for _ in 0..CEILING_RUNS {
        let c = measure_ceiling_once(a, ch)?;
        if best.as_ref().is_none_or(|b| c.gbps > b.gbps) {
            best = Some(c);
        }
    }
    let mut best = best.context("no ceiling run")?;
    for spin in [false, true] {
        let port = match ch.call(&Request::EchoStart { spin })? {
            Reply::CeilingReady { port } => port,
            r => bail!("unexpected reply to EchoStart: {r:?}"),
        };
        let addr = SocketAddr::new(ch.peer()?.ip(), port);
        let (p50, p99) = ceiling::ping(addr, a.pin_cpus(), spin)?;
        if spin {
            (best.rtt_spin_p50_us, best.rtt_spin_p99_us) = (Some(p50), Some(p99));
        } else {
            (best.rtt_p50_us, best.rtt_p99_us) = (Some(p50), Some(p99));
        }
    }
    Ok(best)
}

fn measure_ceiling_once(a: &Args, ch: &mut Channel) -> anyhow::Result<Ceiling> {
    let streams = a.num_data_conns;
    let per = (a.ceiling_bytes / streams) as u64;
    let port = match ch.call(&Request::CeilingStart {
        streams: streams as u32,
        bytes_per_stream: per,
    })? {
        Reply::CeilingReady { port } => port,
        r => bail!("unexpected reply to CeilingStart: {r:?}"),
    };
    let addr = SocketAddr::new(ch.peer()?.ip(), port);
    let sent = ceiling::send(addr, streams, per, a.pin_cpus());
    let joined = ch.call(&Request::CeilingJoin);
    let c = sent?;
    joined.context("ceiling receivers")?;
    Ok(c)
}

fn progress(rows: usize, per_row: usize) -> ProgressBar {
    let len = (rows * per_row) as u64;
    if rows < 2 || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{bar:40} {pos}/{len} iterations  {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb
}

/// A line on stderr saying what this process waits for, printed only if the wait lasts
/// (after `after`, then every 10 s); silent once dropped.
struct Notice {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Notice {
    fn after(after: Duration, what: String) -> Self {
        let (stop, rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            let mut wait = after;
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(wait) {
                eprintln!("morio bench: {what} ... {} s", t0.elapsed().as_secs());
                wait = Duration::from_secs(10);
            }
        });
        Self {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Notice {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
