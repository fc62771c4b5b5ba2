//! `morio serve`: a long-running transfer node. It registers host memory from its TOML
//! configuration, serves any number of peers, hands out its descriptors to initiators that
//! ask, reports stats and metrics over HTTP ([`control`]) and periodically, and shuts down
//! cleanly on SIGTERM/SIGINT.

pub mod auth;
pub mod config;
pub mod control;
pub mod http;

use std::io::Write as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use morio::{IoEngine, IoEngineConfig, RegisteredBuffer};
use serde_json::json;

use config::{ServeConfig, DEFAULT_TOML};
use control::{Descriptors, NamedDesc};

/// `morio serve` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The TOML configuration file.
    #[arg(long, required_unless_present = "dump_config")]
    config: Option<PathBuf>,
    /// Print the commented default configuration and exit.
    #[arg(long)]
    dump_config: bool,
    /// Shard CPUs (e.g. `5,6,7` from `morio topology`); overrides `[tcp] cpus` and `shards`.
    #[arg(long, value_delimiter = ',')]
    cpus: Option<Vec<usize>>,
}

/// `morio ctl` options: query a running `morio serve` over HTTP.
#[derive(clap::Args, Debug)]
pub struct CtlArgs {
    /// The node's control address, HOST:PORT (its `[control] listen`; a name or an address).
    #[arg(long)]
    connect: String,
    /// What to ask for: stats (JSON), descriptors (a summary; --json for the JSON), metrics
    /// (Prometheus text), healthz.
    #[arg(value_parser = ["stats", "descriptors", "metrics", "healthz"])]
    what: String,
    /// Print descriptors as the service's JSON.
    #[arg(long)]
    json: bool,
    /// A file holding the node's deployment secret (default: `MORIO_AUTH_SECRET`, if set).
    #[arg(long)]
    secret_file: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.dump_config {
        print!("{DEFAULT_TOML}");
        return Ok(());
    }
    let path = a.config.context("--config is required")?;
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let mut cfg = ServeConfig::parse(&text)?;
    if let Some(cpus) = a.cpus {
        cfg.tcp.cpus = Some(cpus);
        cfg.tcp.shards = None;
        cfg.tcp_config().validate().context("invalid --cpus")?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("install signal handler")?;
    }

    let engine = IoEngine::new(
        &cfg.engine.key,
        IoEngineConfig {
            advertise_host: cfg.engine.advertise_host.clone(),
            ..IoEngineConfig::new(&cfg.engine.host, cfg.engine.port)
        },
    )?;
    let mut tcp = cfg.tcp_config();
    tcp.auth_secret = cfg.auth_secret()?;
    if tcp.auth_secret.is_none() && morio::AuthSecret::from_env().is_none() {
        eprintln!(
            "morio serve: WARNING: no deployment secret ([auth] secret_file or {}): any peer \
             that reaches the data port can read and write this node's memory",
            morio::AUTH_SECRET_ENV
        );
    }
    engine
        .create_backend(tcp)
        .context("start the TCP backend")?;
    let mut regions: Vec<(String, RegisteredBuffer)> = Vec::new();
    for m in &cfg.memory {
        let b = match m.gpu {
            None => engine.alloc_buffer(m.size.0),
            Some(dev) => engine.alloc_gpu_buffer(dev, m.size.0),
        }
        .with_context(|| format!("register memory {:?}", m.name))?;
        regions.push((m.name.clone(), b));
    }
    let listener = TcpListener::bind(&cfg.control.listen)
        .with_context(|| format!("control service on {}", cfg.control.listen))?;
    let control_addr = listener.local_addr()?;
    let desc = engine.engine_desc();
    let descriptors = Descriptors {
        engine: desc.pack(),
        memory: regions
            .iter()
            .map(|(name, b)| NamedDesc {
                name: name.clone(),
                desc: b.desc().pack(),
            })
            .collect(),
    };
    let _discovery = discovery(&cfg.discovery, &engine, &regions)?;
    let engine = Arc::new(engine);
    let handler = control::handler(
        engine.clone(),
        &descriptors,
        cfg.auth_secret()?.or_else(morio::AuthSecret::from_env),
        cfg.control.peer_metrics,
    )?;
    let ctl = http::serve(listener, stop.clone(), handler)?;

    // The first line is for scripts and tests; the rest for people.
    println!("MORIO_SERVE_CONTROL {control_addr}");
    println!(
        "morio serve: engine {:?} on {}, {} shards on CPUs {}, memory {}",
        desc.key,
        desc.address(),
        engine.n_shards(),
        crate::bench::argv::format_shard_cpus(&engine.shard_cpus()),
        regions
            .iter()
            .map(|(n, b)| format!("{n}={}B", b.len()))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let every = Duration::from_secs(cfg.stats.interval_s);
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        if !every.is_zero() && last.elapsed() >= every {
            last = Instant::now();
            println!("stats {}", stats_json(&engine)["total"]);
        }
    }
    println!("morio serve: signal received, shutting down");
    let _ = ctl.join();
    // Unpublish first (the lease is revoked): peers forget this node before it goes.
    #[cfg(feature = "etcd")]
    drop(_discovery);
    drop(regions);
    match Arc::try_unwrap(engine) {
        Ok(e) => drop(e),
        Err(_) => bail!("engine still referenced at shutdown"),
    }
    println!("morio serve: shut down cleanly");
    Ok(())
}

/// With `[discovery] etcd` endpoints: publish the engine and its regions on a lease and
/// register every engine published under the prefix (the handle lives until shutdown).
#[cfg(feature = "etcd")]
fn discovery(
    d: &config::DiscoverySection,
    engine: &IoEngine,
    regions: &[(String, RegisteredBuffer)],
) -> anyhow::Result<Option<morio::discovery::Discovery>> {
    use morio::discovery::{Discovery, DiscoveryOptions};
    if d.etcd.is_empty() {
        return Ok(None);
    }
    let opts = DiscoveryOptions {
        lease_ttl: Duration::from_secs(d.lease_ttl_s),
        connect_peers: d.connect_peers,
        auth: d.etcd_auth()?,
        tls: d.etcd_tls(),
        ..Default::default()
    };
    let disc = Discovery::connect_with(&d.etcd, &d.prefix, opts).context("[discovery]")?;
    let named: Vec<(&str, &morio::MemoryDesc)> = regions
        .iter()
        .map(|(n, b)| (n.as_str(), b.desc()))
        .collect();
    disc.publish(engine, &named)
        .context("[discovery] publish")?;
    disc.watch(engine).context("[discovery] watch")?;
    println!(
        "morio serve: published in etcd {} under {}",
        d.etcd.join(","),
        d.prefix
    );
    Ok(Some(disc))
}

/// Without the `etcd` feature, configuration parsing refuses `[discovery] etcd` endpoints.
#[cfg(not(feature = "etcd"))]
fn discovery(
    _: &config::DiscoverySection,
    _: &IoEngine,
    _: &[(String, RegisteredBuffer)],
) -> anyhow::Result<Option<()>> {
    Ok(None)
}

pub fn ctl(a: CtlArgs) -> anyhow::Result<()> {
    let secret = match &a.secret_file {
        Some(p) => Some(
            morio::AuthSecret::from_file(p)
                .with_context(|| format!("--secret-file {}", p.display()))?,
        ),
        None => morio::AuthSecret::from_env(),
    };
    let c = control::Client::new(&a.connect, secret)?;
    match a.what.as_str() {
        "descriptors" if !a.json => {
            let d = c.descriptors()?;
            let e = morio::EngineDesc::unpack(&d.engine)?;
            println!(
                "engine {:?} at {} (pid {}, node {})",
                e.key,
                e.address(),
                e.pid,
                e.node_id
            );
            for m in d.memory {
                let md = morio::MemoryDesc::unpack(&m.desc)?;
                println!(
                    "memory {:?}: id {} size {} loc {}",
                    m.name, md.id, md.size, md.loc
                );
            }
        }
        what => {
            let body = c.get_ok(&format!("/{what}"), &[])?;
            let mut o = std::io::stdout().lock();
            let wrote = o
                .write_all(&body)
                .and_then(|()| match body.ends_with(b"\n") {
                    true => o.flush(),
                    false => o.write_all(b"\n"),
                });
            // A reader that stopped early (`| head`) is no error.
            match wrote {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                r => r.context("write to stdout")?,
            }
        }
    }
    Ok(())
}

/// What `/stats` returns (and, its `total`, the periodic stats line): per shard, the total,
/// and `peers`: per peer (engine key), the counters summed over shards, with `lanes` by
/// lane index.
fn stats_json(e: &IoEngine) -> serde_json::Value {
    let Some(s) = e.stats() else {
        return json!({"error": "no backend"});
    };
    let cpus = e.shard_cpus();
    let one = |st: &morio::ShardStats| {
        let h = &st.latency_us;
        json!({
            "transfers_ok": st.transfers_ok,
            "transfers_failed": st.transfers_failed,
            "bytes_sent": st.bytes_sent,
            "bytes_received": st.bytes_received,
            "inbound_bytes_written": st.inbound_bytes_written,
            "inbound_bytes_read": st.inbound_bytes_read,
            "inbound_transfers": st.inbound_transfers,
            "lane_connects": st.lane_connects,
            "lane_connects_same_host": st.lane_connects_same_host,
            "lane_connects_ring": st.lane_connects_ring,
            "gpu_staged_bytes": st.gpu_staged_bytes,
            "gpu_ipc_bytes": st.gpu_ipc_bytes,
            "gpu_ipc_declined": st.gpu_ipc_declined,
            "gpu_overlapped_landings": st.gpu_overlapped_landings,
            "gpu_copies_ahead": st.gpu_copies_ahead,
            "busy_poll_backoffs": st.busy_poll_backoffs,
            "busy_poll_handoffs": st.busy_poll_handoffs,
            "same_host_doorbells": st.same_host_doorbells,
            "same_host_ring_full_waits": st.same_host_ring_full_waits,
            "express_writes": st.express_writes,
            "express_reads": st.express_reads,
            "lane_failures": st.lane_failures,
            "inbound_writes_dropped": st.inbound_writes_dropped,
            "writes_fenced": st.writes_fenced,
            "fences_timed_out": st.fences_timed_out,
            "finishes_held": st.finishes_held,
            "latency_us": {
                "count": h.len(),
                "p50": h.value_at_quantile(0.5),
                "p99": h.value_at_quantile(0.99),
                "p999": h.value_at_quantile(0.999),
                "max": h.max(),
            },
            "inbound_chunk_latency_us": {
                "count": st.inbound_latency_us.len(),
                "p50": st.inbound_latency_us.value_at_quantile(0.5),
                "p99": st.inbound_latency_us.value_at_quantile(0.99),
                "max": st.inbound_latency_us.max(),
            },
        })
    };
    let shards: Vec<_> = s
        .shards
        .iter()
        .map(|st| {
            let mut v = one(st);
            v["shard"] = json!(st.shard);
            v["cpu"] = json!(cpus.get(st.shard).copied().flatten());
            v
        })
        .collect();
    let peers: serde_json::Map<String, serde_json::Value> = s
        .per_peer()
        .into_iter()
        .map(|(k, p)| (k, peer_json(&p)))
        .collect();
    json!({"engine": e.key(), "total": one(&s.total()), "shards": shards, "peers": peers})
}

/// One peer's counters in `/stats`.
fn peer_json(p: &morio::PeerStats) -> serde_json::Value {
    let lanes: serde_json::Map<String, serde_json::Value> = p
        .lanes
        .iter()
        .map(|(i, l)| {
            let v = json!({"connects": l.connects, "failures": l.failures});
            (i.to_string(), v)
        })
        .collect();
    json!({
        "transfers_ok": p.transfers_ok,
        "transfers_failed": p.transfers_failed,
        "bytes_sent": p.bytes_sent,
        "bytes_received": p.bytes_received,
        "inbound_bytes_written": p.inbound_bytes_written,
        "inbound_bytes_read": p.inbound_bytes_read,
        "inbound_transfers": p.inbound_transfers,
        "lane_connects": p.lane_connects,
        "lane_failures": p.lane_failures,
        "lanes": lanes,
    })
}
