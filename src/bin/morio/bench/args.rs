//! `morio bench` options: MORI benchmark.py's flags that apply to TCP plus morio's own, their
//! checks (bad values are errors, never panics), and what follows from them: the rows, the
//! buffer size and the backend config.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use morio::TcpBackendConfig;
use serde::Serialize;

use super::argv::{parse_cpus, parse_size};

/// Largest batch accepted (keeps the side channel's segment lists bounded).
pub const MAX_BATCH: usize = 1 << 20;
/// Largest batch of `--all-batch` (MORI: 32768).
pub const ALL_BATCH_MAX: usize = 32768;
/// Most rows one sweep may have.
pub const MAX_ROWS: usize = 4096;
/// Most timed (or warm-up) iterations per row.
pub const MAX_ITERS: usize = 10_000_000;
/// Longest --spin-us.
pub const MAX_SPIN_US: u64 = 1_000_000;
/// Most shards per engine (as many as a CPU list may name).
pub const MAX_SHARDS: u64 = 1024;

/// Transfer direction, as seen from the initiator.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    /// The initiator reads the target's buffer.
    Read,
    /// The initiator writes into the target's buffer.
    Write,
}

impl OpType {
    /// `read` or `write`.
    pub fn name(self) -> &'static str {
        match self {
            OpType::Read => "read",
            OpType::Write => "write",
        }
    }
}

/// Where a side's buffer lives.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemType {
    /// Host memory.
    Cpu,
    /// GPU memory (device --gpu-device; needs a build with `cuda` or `hip`, or
    /// --gpu-runtime fake).
    Gpu,
}

/// Which GPU runtime moves GPU memory.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuRuntimeKind {
    /// The machine's own (CUDA, else HIP), as the build allows.
    Auto,
    /// morio's in-memory stand-in (checks the pipeline on machines without a GPU; its
    /// speed says nothing about a GPU's).
    Fake,
}

/// Which side this process plays.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Owns the buffer being read or written; serves the side channel.
    Target,
    /// Issues the transfers and prints the table.
    Initiator,
}

/// A CPU list such as `0-7` or `0,2,4`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct CpuList(pub Vec<usize>);

/// Options of `morio bench`.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct Args {
    /// Run target and initiator as two child processes of this one, on disjoint CPU halves.
    #[arg(long, conflicts_with_all = ["role", "connect"])]
    pub loopback: bool,
    /// Play one side only (start the target first; it prints `MORIO_BENCH_TARGET <port>`
    /// and allocates the buffer the initiator's options need).
    #[arg(long, value_enum)]
    pub role: Option<Role>,
    /// The target's side channel (initiator role).
    #[arg(long, value_name = "HOST:PORT")]
    pub connect: Option<String>,
    /// Side-channel port the target listens on (0: ephemeral).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Numeric IP the engines (and the target's side channel) listen on and advertise.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Transfer direction.
    #[arg(long, value_enum, default_value_t = OpType::Read)]
    pub op_type: OpType,
    /// Bytes per transfer (suffixes K, M, G, KiB, MiB, GiB).
    #[arg(long, default_value = "32768", value_parser = parse_size)]
    pub buffer_size: usize,
    /// Sweep the message size from --sweep-start-size to --sweep-max-size.
    #[arg(long, conflicts_with = "all_batch")]
    pub all: bool,
    /// First size of the --all sweep.
    #[arg(long, default_value = "8", value_parser = parse_size)]
    pub sweep_start_size: usize,
    /// Last size of the --all sweep.
    #[arg(long, default_value = "1048576", value_parser = parse_size)]
    pub sweep_max_size: usize,
    /// Step of the --all sweep (0: double each step).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub sweep_step: usize,
    /// Sweep the batch size 1..=32768 (doubling) at --buffer-size.
    #[arg(long)]
    pub all_batch: bool,
    /// Transfers per iteration.
    #[arg(long, default_value_t = 256)]
    pub transfer_batch_size: usize,
    /// One batch call per iteration instead of batch-size single calls.
    #[arg(long)]
    pub enable_batch_transfer: bool,
    /// Contiguous offsets (i*size) instead of strided ones (i*(size+1)).
    #[arg(long)]
    pub batch_contiguous: bool,
    /// The row's offsets in a seeded shuffled order: consecutive segments at irregular
    /// places, as a paged KV cache's blocks (no 2D copies, no merging).
    #[arg(long)]
    pub batch_scattered: bool,
    /// Use the session API.
    #[arg(long)]
    pub enable_sess: bool,
    /// Timed iterations per row.
    #[arg(long, default_value_t = 128)]
    pub iters: usize,
    /// Data connections (lanes) per peer, 1..=16.
    #[arg(long, visible_alias = "tcp-num-data-conns", default_value_t = 8)]
    pub num_data_conns: usize,
    /// Lanes a transfer staged through GPU memory over TCP stripes over where each gets a
    /// whole GPU chunk, 1..=16 (at least --num-data-conns; default twice that, at most 16).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=16))]
    pub gpu_data_conns: Option<usize>,
    /// Transfers of at least this many bytes are striped over every lane.
    #[arg(long, visible_alias = "tcp-striping-threshold-bytes", default_value = "65536", value_parser = parse_size)]
    pub striping_threshold_bytes: usize,
    /// Memory type of both buffers.
    #[arg(long, value_enum, default_value_t = MemType::Cpu)]
    pub mem_type: MemType,
    /// Memory type of the initiator's buffer (default: --mem-type).
    #[arg(long, value_enum)]
    pub initiator_mem_type: Option<MemType>,
    /// Memory type of the target's buffer (default: --mem-type).
    #[arg(long, value_enum)]
    pub target_mem_type: Option<MemType>,
    /// GPU that holds GPU buffers.
    #[arg(long, default_value_t = 0)]
    pub gpu_device: i32,
    /// GPU that holds the loopback target's GPU buffers (default: --gpu-device): with two
    /// GPUs, each copies one way, as between two hosts.
    #[arg(long)]
    pub target_gpu_device: Option<i32>,
    /// GPU runtime for GPU buffers.
    #[arg(long, value_enum, default_value_t = GpuRuntimeKind::Auto)]
    pub gpu_runtime: GpuRuntimeKind,
    /// Pinned GPU staging memory per engine (default 64 MiB).
    #[arg(long, value_parser = parse_size)]
    pub gpu_staging_bytes: Option<usize>,
    /// GPU staging slot size: the copy/network pipeline unit (default 2 MiB).
    #[arg(long, value_parser = parse_size)]
    pub gpu_slot_bytes: Option<usize>,

    /// Socket send and receive buffer of each data connection (default 32 MiB, MORI's):
    /// how much a lane may queue in the kernel.
    #[arg(long, value_parser = parse_size)]
    pub sock_buf_bytes: Option<usize>,

    /// Shards per engine (default: one per allowed CPU, at most one per lane).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_SHARDS))]
    pub shards: Option<usize>,
    /// CPUs of this side's shards, e.g. 0-7 or 0,2,4 (--loopback: split between the sides).
    #[arg(long, value_parser = parse_cpus)]
    pub cpus: Option<CpuList>,
    /// Do not pin shards (nor the ceiling's threads) to CPUs.
    #[arg(long)]
    pub no_pin: bool,
    /// Largest chunk per frame (default 1 MiB).
    #[arg(long, value_parser = parse_size)]
    pub chunk_bytes: Option<usize>,
    /// Largest chunk per frame over TCP with GPU memory on either side (default 2 MiB).
    #[arg(long, value_parser = parse_size)]
    pub gpu_chunk_bytes: Option<usize>,
    /// Largest chunk per frame to a same-host peer (default 8 MiB).
    #[arg(long, value_parser = parse_size)]
    pub same_host_chunk_bytes: Option<usize>,
    /// Deal every striped write's stripes round-robin, even large ones (which otherwise
    /// share them between their lanes; see `TcpBackendConfig::share_stripes`).
    #[arg(long)]
    pub deal_stripes: bool,
    /// Busy-poll shards this many microseconds before parking them.
    #[arg(long)]
    pub spin_us: Option<u64>,
    /// Shards poll their sockets and rings this many microseconds after their last work, and
    /// stop while preempted (0: off; default: the engine's, 100 on hosts of 8 CPUs or more).
    #[arg(long)]
    pub busy_poll_us: Option<u64>,
    /// Same-host transport between the two sides: auto (when the handshake proves the peer
    /// is on this host), off (TCP) or require (fail rather than fall back to TCP). Default:
    /// the environment's MORIO_SAME_HOST, else auto. Each row says which carried it.
    #[arg(long, value_name = "MODE")]
    pub same_host: Option<morio::SameHost>,
    /// Render each side's Prometheus metrics every this many milliseconds while the rows run
    /// (what a scrape of `/metrics` costs the data path; e.g. 1000).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub scrape_ms: Option<u64>,
    /// Waiting application threads spin this many microseconds on a status before sleeping
    /// (default: a window adapted to how soon recent waits were answered).
    #[arg(long)]
    pub wait_spin_us: Option<u64>,
    /// Untimed iterations before each row (default max(2, iters/16)).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Write every row, its percentiles, the config and the ceiling to this JSON file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Skip the raw-TCP ceiling.
    #[arg(long)]
    pub no_ceiling: bool,
    /// Skip the raw-TCP latency floor measured after each row of at most 16 MiB (the row's
    /// bytes over as many busy-polling plain TCP streams as the engine stripes it across).
    #[arg(long)]
    pub no_floor: bool,
    /// Bytes the ceiling moves per run (best of 3 runs), split evenly over the streams.
    #[arg(long, default_value = "2GiB", value_parser = parse_size)]
    pub ceiling_bytes: usize,
    /// Skip the validation of each row's bytes.
    #[arg(long)]
    pub no_validate: bool,
    /// Target role: the largest buffer an initiator may ask for (default: half of this
    /// machine's memory).
    #[arg(long, value_parser = parse_size)]
    pub max_buffer_size: Option<usize>,
    /// Print a compact table of earlier --json files and exit.
    #[arg(long, value_name = "JSON", num_args = 1.., conflicts_with_all = ["loopback", "role"])]
    #[serde(skip)]
    pub summarize: Vec<PathBuf>,
    /// Set by --loopback: exit when this parent process goes away.
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub parent_pid: Option<u32>,
}

impl Args {
    /// Every check that does not need the network. Run before anything is started.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.gpu_device < 0 || self.target_gpu_device.is_some_and(|d| d < 0) {
            bail!("--gpu-device and --target-gpu-device must be device ordinals (0, 1, ...)");
        }
        if !self.loopback && self.summarize.is_empty() {
            match (self.role, &self.connect) {
                (None, _) => bail!(
                    "choose --loopback, --role target, or --role initiator --connect HOST:PORT"
                ),
                (Some(Role::Initiator), None) => {
                    bail!("--role initiator needs --connect HOST:PORT")
                }
                (Some(Role::Target), Some(_)) => bail!("--connect is for the initiator role"),
                _ => {}
            }
        }
        self.host
            .parse::<IpAddr>()
            .map_err(|_| anyhow::anyhow!("--host {:?} is not a numeric IP address", self.host))?;
        ensure!(
            (1..=MAX_ITERS).contains(&self.iters),
            "--iters must be in 1..={MAX_ITERS}"
        );
        ensure!(
            self.warmup.unwrap_or(0) <= MAX_ITERS,
            "--warmup must be at most {MAX_ITERS}"
        );
        ensure!(
            self.spin_us.unwrap_or(0) <= MAX_SPIN_US,
            "--spin-us must be at most {MAX_SPIN_US}"
        );
        ensure!(
            self.busy_poll_us.unwrap_or(0) <= MAX_SPIN_US,
            "--busy-poll-us must be at most {MAX_SPIN_US}"
        );
        ensure!(
            self.wait_spin_us.unwrap_or(0) <= MAX_SPIN_US,
            "--wait-spin-us must be at most {MAX_SPIN_US}"
        );
        ensure!(
            (1..=MAX_BATCH).contains(&self.transfer_batch_size),
            "--transfer-batch-size must be in 1..={MAX_BATCH}"
        );
        ensure!(self.buffer_size >= 1, "--buffer-size must be at least 1");
        if self.all {
            ensure!(
                self.sweep_start_size >= 1,
                "--sweep-start-size must be at least 1"
            );
            ensure!(
                self.sweep_start_size <= self.sweep_max_size,
                "--sweep-start-size {} exceeds --sweep-max-size {}",
                self.sweep_start_size,
                self.sweep_max_size
            );
        }
        if let (Some(n), Some(c)) = (self.shards, &self.cpus) {
            if self.loopback {
                // Both sides come from the list: the initiator takes the first n CPUs.
                ensure!(
                    2 * n <= c.0.len(),
                    "--loopback --shards {n} needs {} CPUs in --cpus (which names {})",
                    2 * n,
                    c.0.len()
                );
            } else {
                ensure!(
                    n == c.0.len(),
                    "--shards {n} disagrees with --cpus (which names {} CPUs)",
                    c.0.len()
                );
            }
        }
        ensure!(
            !(self.no_pin && self.cpus.is_some()),
            "--cpus pins shards; drop --no-pin"
        );
        if !self.no_ceiling {
            ensure!(
                self.ceiling_bytes >= self.num_data_conns.max(1),
                "--ceiling-bytes must give every stream at least one byte"
            );
        }
        let cfg = self.backend_config();
        cfg.validate().context("bad backend option")?;
        cfg.check_staging(self.shards.unwrap_or(1))
            .context("bad backend option")?;
        self.rows()?;
        let len = self.buffer_len()?;
        if self.role != Some(Role::Target) {
            // (The target allocates what the initiator asks for, up to its own bound.)
            let phys = physical_memory();
            ensure!(
                phys == 0 || len <= phys / 2,
                "each side needs a {len}-byte buffer, more than half of this machine's {phys} \
                 bytes"
            );
        }
        Ok(())
    }

    /// The largest buffer the target allocates for an initiator.
    pub fn max_buffer_len(&self) -> usize {
        self.max_buffer_size
            .unwrap_or_else(|| match physical_memory() {
                0 => usize::MAX,
                phys => phys / 2,
            })
    }

    /// The (message size, batch size) of each row, in order.
    pub fn rows(&self) -> anyhow::Result<Vec<(usize, usize)>> {
        let mut rows = Vec::new();
        if self.all {
            let mut s = self.sweep_start_size;
            while s <= self.sweep_max_size {
                ensure!(
                    rows.len() < MAX_ROWS,
                    "the sweep has more than {MAX_ROWS} rows"
                );
                rows.push((s, self.transfer_batch_size));
                let next = if self.sweep_step == 0 {
                    s.checked_mul(2)
                } else {
                    s.checked_add(self.sweep_step)
                };
                match next {
                    Some(n) => s = n,
                    None => break,
                }
            }
        } else if self.all_batch {
            let mut b = 1;
            while b <= ALL_BATCH_MAX {
                rows.push((self.buffer_size, b));
                b *= 2;
            }
        } else {
            rows.push((self.buffer_size, self.transfer_batch_size));
        }
        Ok(rows)
    }

    /// Registered buffer size of each side, as MORI: `(size+1)*batch`, or `size*batch`
    /// contiguous, for the largest size and batch of the run.
    pub fn buffer_len(&self) -> anyhow::Result<usize> {
        let size = if self.all {
            self.buffer_size.max(self.sweep_max_size)
        } else {
            self.buffer_size
        };
        let batch = if self.all_batch {
            self.transfer_batch_size.max(ALL_BATCH_MAX)
        } else {
            self.transfer_batch_size
        };
        let per = if self.batch_contiguous {
            Some(size)
        } else {
            size.checked_add(1)
        };
        per.and_then(|p| p.checked_mul(batch))
            .ok_or_else(|| anyhow::anyhow!("buffer size {size} × batch {batch} overflows"))
    }

    /// Where the rows' transfers lie.
    pub fn layout(&self) -> super::data::Layout {
        super::data::Layout {
            contiguous: self.batch_contiguous,
            scattered: self.batch_scattered,
        }
    }

    /// Untimed iterations before each row.
    pub fn warmup_iters(&self) -> usize {
        self.warmup.unwrap_or((self.iters / 16).max(2))
    }

    /// The TCP backend config both sides use.
    pub fn backend_config(&self) -> TcpBackendConfig {
        let d = TcpBackendConfig::default();
        TcpBackendConfig {
            num_data_conns: self.num_data_conns,
            gpu_data_conns: self.gpu_data_conns,
            striping_threshold_bytes: self.striping_threshold_bytes,
            num_shards: self.shards,
            cpus: self.cpus.as_ref().map(|c| c.0.clone()),
            pin_shards: !self.no_pin,
            chunk_bytes: self.chunk_bytes.unwrap_or(d.chunk_bytes),
            same_host_chunk_bytes: self
                .same_host_chunk_bytes
                .unwrap_or(d.same_host_chunk_bytes),
            gpu_chunk_bytes: self.gpu_chunk_bytes.unwrap_or(d.gpu_chunk_bytes),
            share_stripes: d.share_stripes && !self.deal_stripes,
            spin_before_park: self.spin_us.map(Duration::from_micros),
            busy_poll: self.busy_poll_us.map(Duration::from_micros),
            same_host: self.same_host,
            gpu_staging_bytes: self.gpu_staging_bytes.unwrap_or(d.gpu_staging_bytes),
            gpu_slot_bytes: self.gpu_slot_bytes.unwrap_or(d.gpu_slot_bytes),
            sock_sndbuf_bytes: self.sock_buf_bytes.unwrap_or(d.sock_sndbuf_bytes),
            sock_rcvbuf_bytes: self.sock_buf_bytes.unwrap_or(d.sock_rcvbuf_bytes),
            ..d
        }
    }

    /// Where the initiator's buffer lives.
    pub fn initiator_mem(&self) -> MemType {
        self.initiator_mem_type.unwrap_or(self.mem_type)
    }

    /// Where the target's buffer lives.
    pub fn target_mem(&self) -> MemType {
        self.target_mem_type.unwrap_or(self.mem_type)
    }

    /// CPUs this side's helper threads (the ceiling's) are pinned to, or `None` unpinned.
    pub fn pin_cpus(&self) -> Option<Vec<usize>> {
        if self.no_pin {
            return None;
        }
        match &self.cpus {
            Some(c) => Some(c.0.clone()),
            None => Some(morio::placement::allowed_cpus().iter().collect()),
        }
    }
}

/// Bytes of physical memory (0 if unknown).
fn physical_memory() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    match (usize::try_from(pages), usize::try_from(page)) {
        (Ok(a), Ok(b)) => a.saturating_mul(b),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct T {
        #[command(flatten)]
        a: Args,
    }

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        T::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|t| t.a)
    }

    #[test]
    fn defaults_are_mori_defaults() {
        let a = parse(&["--loopback"]).unwrap();
        assert_eq!(a.op_type, OpType::Read);
        assert_eq!(
            (a.buffer_size, a.transfer_batch_size, a.iters),
            (32768, 256, 128)
        );
        assert_eq!(
            (a.sweep_start_size, a.sweep_max_size, a.sweep_step),
            (8, 1 << 20, 0)
        );
        assert_eq!((a.num_data_conns, a.striping_threshold_bytes), (8, 65536));
        assert_eq!(a.buffer_len().unwrap(), 32769 * 256);
        assert_eq!(a.warmup_iters(), 8);
        a.check().unwrap();
        let a = parse(&["--loopback", "--tcp-num-data-conns", "4"]).unwrap();
        assert_eq!(a.num_data_conns, 4);
    }

    #[test]
    fn rows_and_buffers() {
        let a = parse(&["--loopback", "--all", "--sweep-max-size", "64"]).unwrap();
        let sizes: Vec<usize> = a.rows().unwrap().iter().map(|r| r.0).collect();
        assert_eq!(sizes, [8, 16, 32, 64]);
        assert_eq!(a.buffer_len().unwrap(), 32769 * 256);
        let a = parse(&[
            "--loopback",
            "--all",
            "--sweep-step",
            "8",
            "--sweep-max-size",
            "30",
        ])
        .unwrap();
        assert_eq!(a.rows().unwrap().len(), 3);
        let a = parse(&[
            "--loopback",
            "--all-batch",
            "--batch-contiguous",
            "--buffer-size",
            "8",
        ])
        .unwrap();
        assert_eq!(a.rows().unwrap().len(), 16);
        assert_eq!(a.buffer_len().unwrap(), 8 * 32768);
    }

    #[test]
    fn bad_options_are_errors() {
        for bad in [
            &["--loopback", "--gpu-device", "-1"][..],
            &["--loopback", "--target-gpu-device", "-1"],
            &["--loopback", "--iters", "0"],
            &["--loopback", "--iters", "18446744073709551615"],
            &["--loopback", "--warmup", "18446744073709551615"],
            &["--loopback", "--spin-us", "18446744073709551615"],
            &["--loopback", "--wait-spin-us", "18446744073709551615"],
            &["--loopback", "--num-data-conns", "17"],
            &["--loopback", "--chunk-bytes", "10"],
            &[
                "--loopback",
                "--all",
                "--sweep-start-size",
                "64",
                "--sweep-max-size",
                "8",
            ],
            &["--loopback", "--all", "--sweep-start-size", "0"],
            &["--loopback", "--transfer-batch-size", "0"],
            &["--loopback", "--shards", "0"],
            &["--loopback", "--shards", "2", "--cpus", "0"],
            &["--loopback", "--shards", "2", "--cpus", "0-2"],
            &["--loopback", "--host", "localhost"],
            &[
                "--loopback",
                "--buffer-size",
                "1000000G",
                "--transfer-batch-size",
                "1000000",
            ],
            &["--role", "initiator"],
            &["--role", "target", "--connect", "1.2.3.4:5"],
            &[],
        ] {
            let r = parse(bad)
                .map_err(anyhow::Error::from)
                .and_then(|a| a.check());
            assert!(r.is_err(), "{bad:?} was accepted");
        }
        for bad in [
            &["--loopback", "--cpus", "3-1"][..],
            &["--loopback", "--cpus", "0,0"],
            &["--loopback", "--cpus", ""],
            &["--loopback", "--buffer-size", "1Q"],
            &["--loopback", "--all", "--all-batch"],
            &["--loopback", "--role", "target"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
