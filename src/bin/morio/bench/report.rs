//! What `morio bench` prints and writes: the configuration block (as MORI's `print_config`),
//! MORI's table with percentile and ceiling columns (comfy-table), the JSON report, and the
//! compact summary of earlier JSON reports (`--summarize`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use comfy_table::{presets, CellAlignment, Table, TableComponent};
use morio::EngineDesc;
use serde::Serialize;
use serde_json::Value;

use super::args::{Args, MemType};
use super::argv::format_cpus;
use super::ceiling::Ceiling;
use super::stats::RowStats;

/// Title of the table (MORI: `TCP Benchmark: Initiator Rank 0`).
pub const TITLE: &str = "TCP Benchmark (morio): Initiator";

/// One side of the run, as reported.
#[derive(Serialize, Debug, Clone)]
pub struct Side {
    /// Engine key.
    pub engine_key: String,
    /// Advertised host.
    pub host: String,
    /// Engine port.
    pub port: u16,
    /// Shards its engine runs.
    pub shards: usize,
    /// CPUs given with --cpus (`None`: planned by the engine, or unpinned).
    pub cpus: Option<Vec<usize>>,
    /// Process id.
    pub pid: i32,
    /// Pinned GPU staging its engine held at the end, and the most in use at once (bytes).
    pub gpu_staging: Option<(u64, u64)>,
}

impl Side {
    /// From an engine's descriptor.
    pub fn new(d: &EngineDesc, shards: usize, cpus: Option<Vec<usize>>) -> Self {
        Self {
            engine_key: d.key.clone(),
            host: d.host.clone(),
            port: d.port,
            shards,
            cpus,
            pid: d.pid,
            gpu_staging: None,
        }
    }

    fn describe(&self) -> String {
        let cpus = self
            .cpus
            .as_ref()
            .map_or("planned".to_string(), |c| format_cpus(c));
        format!("{} (cpus {cpus})", self.shards)
    }
}

/// The JSON report.
#[derive(Serialize, Debug)]
pub struct Report<'a> {
    /// `morio bench`.
    pub tool: &'static str,
    /// Crate version.
    pub version: &'static str,
    /// Table title.
    pub title: &'static str,
    /// Every option of the run (as the initiator got them).
    pub config: &'a Args,
    /// Whether `--loopback` started this initiator (and the target beside it).
    pub loopback: bool,
    /// Untimed iterations per row.
    pub warmup_iters: usize,
    /// Registered bytes per side.
    pub buffer_bytes: usize,
    /// The initiator.
    pub initiator: Side,
    /// The target.
    pub target: Side,
    /// Raw-TCP ceiling (`null` with --no-ceiling).
    pub ceiling: Option<Ceiling>,
    /// Every row, in order.
    pub rows: Vec<RowStats>,
}

impl<'a> Report<'a> {
    /// Assemble the report.
    pub fn new(
        config: &'a Args,
        buffer_bytes: usize,
        initiator: Side,
        target: Side,
        ceiling: Option<Ceiling>,
        rows: Vec<RowStats>,
    ) -> Self {
        Self {
            tool: "morio bench",
            version: env!("CARGO_PKG_VERSION"),
            title: TITLE,
            config,
            loopback: config.parent_pid.is_some(),
            warmup_iters: config.warmup_iters(),
            buffer_bytes,
            initiator,
            target,
            ceiling,
            rows,
        }
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// The configuration block, printed before the rows run.
pub fn print_config(a: &Args, sides: &[Side; 2], n_rows: usize, buffer_bytes: usize) {
    let [i, t] = sides;
    let cfg = a.backend_config();
    let sweep = if a.all {
        let step = match a.sweep_step {
            0 => "doubling".to_string(),
            s => format!("step {s}"),
        };
        format!(
            "message size {}..={} B, {step}",
            a.sweep_start_size, a.sweep_max_size
        )
    } else if a.all_batch {
        "batch size 1..=32768, doubling".to_string()
    } else {
        "none".to_string()
    };
    let lines = [
        ("backend", "TCP (morio)".to_string()),
        ("op_type", a.op_type.name().to_string()),
        ("host", i.host.clone()),
        ("port", i.port.to_string()),
        ("role", "INITIATOR".to_string()),
        (
            "target",
            format!(
                "{} at {} (pid {})",
                t.engine_key,
                morio::host_port(&t.host, t.port),
                t.pid
            ),
        ),
        ("buffer_size", format!("{} B", a.buffer_size)),
        ("transfer_batch_size", a.transfer_batch_size.to_string()),
        (
            "enable_batch_transfer",
            py_bool(a.enable_batch_transfer).into(),
        ),
        ("enable_sess", py_bool(a.enable_sess).into()),
        ("batch_contiguous", py_bool(a.batch_contiguous).into()),
        ("batch_scattered", py_bool(a.batch_scattered).into()),
        ("sweep", format!("{sweep} ({n_rows} rows)")),
        (
            "iters",
            format!("{} (+{} warm-up per row)", a.iters, a.warmup_iters()),
        ),
        (
            "mem_type",
            format!(
                "{} / {}{}",
                mem_name(a.initiator_mem()),
                mem_name(a.target_mem()),
                if a.initiator_mem() == MemType::Gpu || a.target_mem() == MemType::Gpu {
                    format!(
                        " (GPU {}, runtime {:?}, staging {} B in {} B slots per engine, {} B \
                         chunks over TCP)",
                        a.gpu_device,
                        a.gpu_runtime,
                        cfg.gpu_staging_bytes,
                        cfg.gpu_slot_bytes,
                        cfg.gpu_chunk_bytes
                    )
                } else {
                    String::new()
                }
            ),
        ),
        ("buffer_bytes", format!("{buffer_bytes} per side")),
        ("num_data_conns", cfg.num_data_conns.to_string()),
        (
            "striping_threshold_bytes",
            cfg.striping_threshold_bytes.to_string(),
        ),
        ("chunk_bytes", cfg.chunk_bytes.to_string()),
        (
            "same_host_chunk_bytes",
            cfg.same_host_chunk_bytes.to_string(),
        ),
        ("initiator_shards", i.describe()),
        ("target_shards", t.describe()),
        (
            "spin_before_park",
            a.spin_us.map_or("off".into(), |u| format!("{u} us")),
        ),
        (
            "busy_poll",
            if a.spin_us.is_some() {
                "as spin_before_park".into()
            } else {
                // What the engines resolve: the flag, else the environment, else the default
                // for this many CPUs.
                let set = cfg
                    .busy_poll
                    .or_else(|| morio::busy_poll_from_env().ok().flatten());
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                morio::busy_window(set, cpus).map_or("off".into(), |d| {
                    format!(
                        "{} us{}",
                        d.as_micros(),
                        if set.is_none() { " (default)" } else { "" }
                    )
                })
            },
        ),
        (
            "wait_spin",
            a.wait_spin_us
                .map_or_else(|| "adaptive".to_string(), |us| format!("{us} us")),
        ),
        (
            "scrape",
            a.scrape_ms.map_or("off".into(), |ms| {
                format!("metrics every {ms} ms, both sides")
            }),
        ),
        (
            "validate",
            if a.no_validate {
                "off".into()
            } else {
                "xxh3 of every row's segments on both sides".to_string()
            },
        ),
        (
            "ceiling",
            if a.no_ceiling {
                "off".into()
            } else {
                format!(
                    "raw TCP, {} streams, {} B, measured after the rows",
                    a.num_data_conns,
                    a.ceiling_bytes / a.num_data_conns.max(1) * a.num_data_conns
                )
            },
        ),
        (
            "floor",
            if a.no_floor {
                "off".into()
            } else {
                format!(
                    "raw TCP, busy-polling, the streams each row stripes over, after each row of \
                     at most {} MiB",
                    super::floor::MAX_FLOOR_BYTES >> 20
                )
            },
        ),
    ];
    println!("MORIO Benchmark Configurations:");
    for (k, v) in lines {
        println!("  {k}: {v}");
    }
    println!();
}

fn new_table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::ASCII_FULL_CONDENSED);
    t.set_style(TableComponent::HeaderLines, '-');
    t.set_style(TableComponent::MiddleHeaderIntersections, '+');
    t.set_header(header.to_vec());
    for c in t.column_iter_mut() {
        c.set_cell_alignment(CellAlignment::Right);
    }
    t
}

/// Put a MORI-style title box above a rendered table.
fn titled(title: &str, table: &Table) -> String {
    let body = table.to_string();
    let width = body.lines().next().map_or(0, |l| l.chars().count()).max(4);
    let inner = width - 2;
    let rule = format!("+{}+", "-".repeat(inner));
    format!("{rule}\n|{title:^inner$}|\n{body}")
}

fn f2(x: f64) -> String {
    format!("{x:.2}")
}

/// MORI's table plus percentiles and the ceiling, one line per row.
pub fn table(rows: &[RowStats], ceiling: Option<&Ceiling>) -> String {
    let mut t = new_table(&[
        "MsgSize (B)",
        "BatchSize",
        "TotalSize (MB)",
        "Max BW (GB/s)",
        "Avg BW (GB/s)",
        "Min Lat (us)",
        "Avg Lat (us)",
        "p50 (us)",
        "p99 (us)",
        "p99.9 (us)",
        "Max Lat (us)",
        "Ceiling (GB/s)",
        "Avg/Ceil",
        "Floor p50 (us)",
        "Floor avg (us)",
        "p50/Floor",
        "Transport",
    ]);
    for r in rows {
        t.add_row(vec![
            r.msg_size.to_string(),
            r.batch_size.to_string(),
            f2(r.total_size_mb),
            f2(r.max_bw_gbps),
            f2(r.avg_bw_gbps),
            f2(r.min_lat_us),
            f2(r.avg_lat_us),
            f2(r.p50_us),
            f2(r.p99_us),
            f2(r.p999_us),
            f2(r.max_lat_us),
            ceiling.map_or("-".into(), |c| f2(c.gbps)),
            r.avg_over_ceiling.map_or("-".into(), f2),
            r.floor.as_ref().map_or("-".into(), |f| f2(f.p50_us)),
            r.floor.as_ref().map_or("-".into(), |f| f2(f.avg_us)),
            r.p50_over_floor.map_or("-".into(), f2),
            r.transport.clone(),
        ]);
    }
    titled(TITLE, &t)
}

/// Write the JSON report.
pub fn write_json(path: &Path, r: &Report<'_>) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(r).context("JSON report")?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// `--summarize`: one line per row of every JSON report given.
pub fn summarize(files: &[PathBuf]) -> anyhow::Result<()> {
    let mut t = new_table(&[
        "run",
        "op",
        "mode",
        "shards",
        "MsgSize (B)",
        "BatchSize",
        "Avg BW (GB/s)",
        "Max BW (GB/s)",
        "Avg Lat (us)",
        "p50 (us)",
        "p99 (us)",
        "Ceiling (GB/s)",
        "Avg/Ceil",
        "Floor p50 (us)",
        "Floor avg (us)",
        "p50/Floor",
        "Transport",
    ]);
    for c in 0..3 {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Left);
        }
    }
    for f in files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let v: Value =
            serde_json::from_str(&text).with_context(|| format!("{} is not JSON", f.display()))?;
        let name = f.file_stem().map_or(f.display().to_string(), |s| {
            s.to_string_lossy().into_owned()
        });
        let c = &v["config"];
        let flag = |k: &str| c[k].as_bool().unwrap_or(false);
        let mode = format!(
            "{}{} {}",
            if flag("enable_batch_transfer") {
                "batch"
            } else {
                "single"
            },
            if flag("enable_sess") { "+sess" } else { "" },
            match (flag("batch_contiguous"), flag("batch_scattered")) {
                (true, false) => "contig",
                (true, true) => "contig scattered",
                (false, false) => "strided",
                (false, true) => "scattered",
            },
        );
        let num = |x: &Value| x.as_f64().map_or("-".into(), f2);
        let int = |x: &Value| x.as_u64().map_or("-".into(), |n| n.to_string());
        let shards = format!(
            "{}/{}",
            int(&v["initiator"]["shards"]),
            int(&v["target"]["shards"])
        );
        for r in v["rows"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            t.add_row(vec![
                name.clone(),
                r["op"].as_str().unwrap_or("-").to_string(),
                mode.clone(),
                shards.clone(),
                int(&r["msg_size"]),
                int(&r["batch_size"]),
                num(&r["avg_bw_gbps"]),
                num(&r["max_bw_gbps"]),
                num(&r["avg_lat_us"]),
                num(&r["p50_us"]),
                num(&r["p99_us"]),
                num(&v["ceiling"]["gbps"]),
                num(&r["avg_over_ceiling"]),
                num(&r["floor"]["p50_us"]),
                num(&r["floor"]["avg_us"]),
                num(&r["p50_over_floor"]),
                r["transport"].as_str().unwrap_or("-").to_string(),
            ]);
        }
    }
    println!("{}", titled("morio bench summary", &t));
    Ok(())
}

fn mem_name(m: MemType) -> &'static str {
    match m {
        MemType::Cpu => "cpu",
        MemType::Gpu => "gpu",
    }
}
