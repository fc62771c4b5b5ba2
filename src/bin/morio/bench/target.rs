//! `morio bench --role target`: create the engine, print `MORIO_BENCH_TARGET <port>` first
//! on stdout, then serve one initiator over the side channel: allocate the buffer its
//! [`Setup`] asks for (within `--max-buffer-size`), hand out the descriptors, then answer
//! its requests (scramble, hash, ceiling receivers) until it says it is done.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::thread::JoinHandle;

use anyhow::{bail, Context};
use morio::{EngineDesc, IoEngine, IoEngineConfig, RegisteredBuffer};

use super::args::Args;
use super::wire::{Channel, Reply, Request, Setup, TargetInfo, Welcome, MAGIC};
use super::{ceiling, data};

/// Seed of the target's initial contents.
const INITIAL_SEED: u64 = 0x7A56_E7C3_0000_0001;

/// Run the target role to the end of the initiator's session.
pub fn run(a: &Args) -> anyhow::Result<()> {
    let host: IpAddr = a.host.parse().context("--host")?;
    let engine = IoEngine::new("morio-bench-target", IoEngineConfig::new(&a.host, 0))?;
    let cfg = a.backend_config();
    let link_timeout = cfg.op_timeout;
    engine.create_backend(cfg).context("target: TCP backend")?;
    let listener = TcpListener::bind((host, a.port))
        .with_context(|| format!("target: side channel on {}", SocketAddr::new(host, a.port)))?;
    let port = listener.local_addr()?.port();
    let mut out = std::io::stdout().lock();
    writeln!(out, "MORIO_BENCH_TARGET {port}")?;
    out.flush()?;
    drop(out);
    if a.parent_pid.is_none() {
        eprintln!(
            "morio bench target: waiting for an initiator on {at} (`morio bench --role \
             initiator --connect {at}`)",
            at = SocketAddr::new(host, port)
        );
    }

    let (stream, peer) = listener.accept().context("target: accept")?;
    drop(listener);
    log::info!("target: initiator connected from {peer}");
    let mut ch = Channel::new(stream, link_timeout, None)?;
    let setup: Setup = ch.recv().context("the initiator's setup")?;
    let buf = match prepare(&engine, a, &setup) {
        Ok(b) => b,
        Err(e) => {
            let message = format!("{e:#}");
            let _ = ch.send(&Welcome::Refused {
                message: message.clone(),
            });
            bail!("{message}");
        }
    };
    ch.send(&Welcome::Ready {
        magic: MAGIC.to_string(),
        engine: engine.engine_desc().pack(),
        memory: buf.desc().pack(),
        info: TargetInfo {
            shards: engine.n_shards(),
            cpus: a.cpus.as_ref().map(|c| c.0.clone()),
            pid: std::process::id(),
        },
    })?;
    let idesc = EngineDesc::unpack(&ch.recv_frame()?).context("initiator's EngineDesc")?;
    engine.register_remote_engine(&idesc)?;
    let (r, scrapes) = super::scrape::while_running(&engine, a.scrape_ms, || {
        serve(&mut ch, a, host, &engine, &buf)
    });
    if a.scrape_ms.is_some() {
        log::info!("target: {scrapes} metrics scrapes during the session");
    }
    r
}

/// The buffer the initiator's setup asks for, filled unless `--no-validate`.
fn prepare(engine: &IoEngine, a: &Args, setup: &Setup) -> anyhow::Result<RegisteredBuffer> {
    if setup.magic != MAGIC {
        bail!(
            "the initiator speaks {:?}, this target {MAGIC:?}: use the same morio on both sides",
            setup.magic
        );
    }
    let max = a.max_buffer_len();
    let len = usize::try_from(setup.buffer_len)
        .ok()
        .filter(|&l| l >= 1 && l <= max)
        .with_context(|| {
            format!(
                "the target refuses a {}-byte buffer: it allows 1..={max} bytes \
                 (--max-buffer-size on the target; default half its memory)",
                setup.buffer_len
            )
        })?;
    let buf = data::side_buffer(engine, a, a.target_mem(), len)?;
    if !a.no_validate {
        data::scramble(&buf, INITIAL_SEED, buf.len())?;
    }
    Ok(buf)
}

fn serve(
    ch: &mut Channel,
    a: &Args,
    host: IpAddr,
    engine: &IoEngine,
    buf: &RegisteredBuffer,
) -> anyhow::Result<()> {
    let mut receivers: Option<JoinHandle<anyhow::Result<()>>> = None;
    loop {
        let req: Request = ch.recv()?;
        let reply = match req {
            Request::Scramble { seed, len } => usize::try_from(len)
                .map_err(anyhow::Error::from)
                .and_then(|len| data::scramble(buf, seed, len))
                .map(|()| Reply::Ok),
            Request::Hash { segs } => {
                data::hash_segments(buf, &segs).map(|xxh3| Reply::Hash { xxh3 })
            }
            Request::CeilingStart {
                streams,
                bytes_per_stream,
            } => ceiling::serve(host, streams as usize, bytes_per_stream, a.pin_cpus()).map(
                |(port, h)| {
                    receivers = Some(h);
                    Reply::CeilingReady { port }
                },
            ),
            Request::FloorStart { shape, rounds } => {
                super::floor::serve(host, shape, rounds as usize, a.pin_cpus()).map(|(port, h)| {
                    receivers = Some(h);
                    Reply::CeilingReady { port }
                })
            }
            Request::EchoStart { spin } => ceiling::serve_echo(host, a.pin_cpus(), spin)
                .map(|port| Reply::CeilingReady { port }),
            Request::CeilingJoin => match receivers.take() {
                Some(h) => h
                    .join()
                    .map_err(|_| anyhow::anyhow!("ceiling receivers panicked"))
                    .and_then(|r| r)
                    .map(|()| Reply::Ok),
                None => Err(anyhow::anyhow!("no ceiling is running")),
            },
            Request::Staging => {
                let (pinned, peak) = super::data::staging(engine);
                Ok(Reply::Staging { pinned, peak })
            }
            Request::Counters => Ok(Reply::Counters(super::stats::Counters::of(engine))),
            Request::Done => {
                ch.send(&Reply::Ok)?;
                if let Some(p) = morio::trace::dump("target")? {
                    eprintln!("trace: {}", p.display());
                }
                return Ok(());
            }
        };
        ch.send(&reply.unwrap_or_else(|e| Reply::Error {
            message: format!("{e:#}"),
        }))?;
    }
}
