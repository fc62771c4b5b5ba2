//! Option values and argument lists of `morio bench`: sizes with units, CPU lists, and the
//! arguments --loopback hands its two children (every option of the run, re-spelled).

use std::ffi::OsString;

use super::args::{Args, CpuList, Role};

/// A size with an optional unit: `4096`, `64K`, `1MiB`, `1GB`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mul: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        u => return Err(format!("unknown unit {u:?} in {s:?}")),
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

/// A CPU list: comma-separated CPUs and inclusive ranges, distinct, below 1024.
pub fn parse_cpus(s: &str) -> Result<CpuList, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        let num = |x: &str| -> Result<usize, String> {
            let n: usize = x
                .trim()
                .parse()
                .map_err(|_| format!("bad CPU {x:?} in {s:?}"))?;
            if n >= 1024 {
                return Err(format!("CPU {n} out of range (0..1024)"));
            }
            Ok(n)
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("bad CPU range {part:?}"));
                }
                out.extend(a..=b);
            }
            None => out.push(num(part)?),
        }
    }
    let mut sorted = out.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != out.len() {
        return Err(format!("CPU list {s:?} repeats a CPU"));
    }
    Ok(CpuList(out))
}

/// `0-3,8,10,11` style text for a CPU list (runs of three or more as ranges).
pub fn format_cpus(cpus: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            parts.push(format!("{}-{}", cpus[i], cpus[j]));
        } else {
            parts.extend(cpus[i..=j].iter().map(usize::to_string));
        }
        i = j + 1;
    }
    parts.join(",")
}

/// What an engine's shards run on, for people: `0,1`, `4-7`, or `unpinned`.
pub fn format_shard_cpus(cpus: &[Option<usize>]) -> String {
    match cpus.iter().copied().collect::<Option<Vec<usize>>>() {
        Some(c) if !c.is_empty() => format_cpus(&c),
        Some(_) => "none".to_string(),
        None if cpus.iter().all(Option::is_none) => "unpinned".to_string(),
        None => cpus
            .iter()
            .map(|c| c.map_or("unpinned".to_string(), |c| c.to_string()))
            .collect::<Vec<_>>()
            .join(","),
    }
}

impl Args {
    /// The arguments (after `bench`) of one loopback child: every option of this run, the
    /// role, and this child's CPUs (or `--no-pin`).
    pub fn child_args(
        &self,
        role: Role,
        cpus: Option<&[usize]>,
        no_pin: bool,
        connect: Option<&str>,
    ) -> Vec<OsString> {
        let mut v: Vec<OsString> = Vec::new();
        let mut opt = |k: &str, val: String| {
            v.push(k.into());
            v.push(val.into());
        };
        opt(
            "--role",
            match role {
                Role::Target => "target",
                Role::Initiator => "initiator",
            }
            .into(),
        );
        if let Some(c) = connect {
            opt("--connect", c.into());
        }
        opt("--host", self.host.clone());
        opt("--parent-pid", std::process::id().to_string());
        opt("--op-type", name(self.op_type));
        opt("--buffer-size", self.buffer_size.to_string());
        opt("--sweep-start-size", self.sweep_start_size.to_string());
        opt("--sweep-max-size", self.sweep_max_size.to_string());
        opt("--sweep-step", self.sweep_step.to_string());
        opt(
            "--transfer-batch-size",
            self.transfer_batch_size.to_string(),
        );
        opt("--iters", self.iters.to_string());
        opt("--num-data-conns", self.num_data_conns.to_string());
        opt(
            "--striping-threshold-bytes",
            self.striping_threshold_bytes.to_string(),
        );
        opt("--mem-type", name(self.mem_type));
        opt("--ceiling-bytes", self.ceiling_bytes.to_string());
        if let Some(m) = self.initiator_mem_type {
            opt("--initiator-mem-type", name(m));
        }
        if let Some(m) = self.target_mem_type {
            opt("--target-mem-type", name(m));
        }
        // Each child holds its buffers on its own GPU.
        let dev = match role {
            Role::Target => self.target_gpu_device.unwrap_or(self.gpu_device),
            Role::Initiator => self.gpu_device,
        };
        opt("--gpu-device", dev.to_string());
        opt("--gpu-runtime", name(self.gpu_runtime));
        if let Some(n) = self.gpu_data_conns {
            opt("--gpu-data-conns", n.to_string());
        }
        if let Some(b) = self.gpu_staging_bytes {
            opt("--gpu-staging-bytes", b.to_string());
        }
        if let Some(b) = self.gpu_slot_bytes {
            opt("--gpu-slot-bytes", b.to_string());
        }
        if let Some(b) = self.sock_buf_bytes {
            opt("--sock-buf-bytes", b.to_string());
        }
        if let Some(c) = cpus {
            opt("--cpus", format_cpus(c));
        } else if let Some(n) = self.shards {
            opt("--shards", n.to_string());
        }
        if let Some(c) = self.chunk_bytes {
            opt("--chunk-bytes", c.to_string());
        }
        if let Some(c) = self.gpu_chunk_bytes {
            opt("--gpu-chunk-bytes", c.to_string());
        }
        if let Some(c) = self.same_host_chunk_bytes {
            opt("--same-host-chunk-bytes", c.to_string());
        }
        if let Some(s) = self.spin_us {
            opt("--spin-us", s.to_string());
        }
        if let Some(s) = self.busy_poll_us {
            opt("--busy-poll-us", s.to_string());
        }
        if let Some(ms) = self.scrape_ms {
            opt("--scrape-ms", ms.to_string());
        }
        if let Some(m) = self.same_host {
            opt("--same-host", m.to_string());
        }
        if let Some(s) = self.wait_spin_us {
            opt("--wait-spin-us", s.to_string());
        }
        if let Some(w) = self.warmup {
            opt("--warmup", w.to_string());
        }
        if let (Role::Initiator, Some(j)) = (role, &self.json) {
            v.push("--json".into());
            v.push(j.clone().into_os_string());
        }
        for (on, flag) in [
            (self.all, "--all"),
            (self.all_batch, "--all-batch"),
            (self.enable_batch_transfer, "--enable-batch-transfer"),
            (self.batch_contiguous, "--batch-contiguous"),
            (self.batch_scattered, "--batch-scattered"),
            (self.enable_sess, "--enable-sess"),
            (self.no_ceiling, "--no-ceiling"),
            (self.no_floor, "--no-floor"),
            (self.no_validate, "--no-validate"),
            (self.deal_stripes, "--deal-stripes"),
            (no_pin, "--no-pin"),
        ] {
            if on {
                v.push(flag.into());
            }
        }
        v
    }
}

fn name<T: clap::ValueEnum>(v: T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::args::OpType;
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
    fn cpu_lists() {
        assert_eq!(parse_cpus("0-3,8").unwrap().0, [0, 1, 2, 3, 8]);
        assert_eq!(format_cpus(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10,11");
        assert_eq!(format_shard_cpus(&[Some(0), Some(1)]), "0,1");
        assert_eq!(format_shard_cpus(&[None, None]), "unpinned");
        assert_eq!(format_shard_cpus(&[Some(4), None]), "4,unpinned");
        assert!(parse_cpus("5000").is_err());
    }

    #[test]
    fn child_args_round_trip() {
        let a = parse(&[
            "--loopback",
            "--op-type",
            "write",
            "--all",
            "--sweep-max-size",
            "4K",
            "--enable-sess",
            "--enable-batch-transfer",
            "--spin-us",
            "50",
            "--json",
            "x.json",
            "--ceiling-bytes",
            "1M",
            "--same-host",
            "require",
            "--scrape-ms",
            "1000",
            "--sock-buf-bytes",
            "4MiB",
            "--gpu-chunk-bytes",
            "4MiB",
            "--gpu-device",
            "0",
            "--target-gpu-device",
            "1",
        ])
        .unwrap();
        let v = a.child_args(Role::Initiator, Some(&[2, 3]), false, Some("127.0.0.1:9"));
        let strs: Vec<String> = v.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        let strs: Vec<&str> = strs.iter().map(String::as_str).collect();
        let b = parse(&strs).unwrap();
        b.check().unwrap();
        assert_eq!(b.role, Some(Role::Initiator));
        assert_eq!(b.cpus, Some(CpuList(vec![2, 3])));
        assert_eq!(b.rows().unwrap(), a.rows().unwrap());
        assert_eq!(b.buffer_len().unwrap(), a.buffer_len().unwrap());
        assert_eq!(
            (b.op_type, b.spin_us, b.ceiling_bytes),
            (OpType::Write, Some(50), 1 << 20)
        );
        assert!(b.enable_sess && b.enable_batch_transfer && b.json.is_some());
        assert_eq!(
            (b.same_host, b.scrape_ms),
            (Some(morio::SameHost::Require), Some(1000))
        );
        assert_eq!(b.sock_buf_bytes, Some(4 << 20));
        let cfg = b.backend_config();
        assert_eq!(
            (cfg.sock_sndbuf_bytes, cfg.sock_rcvbuf_bytes),
            (4 << 20, 4 << 20)
        );
        assert_eq!(cfg.gpu_chunk_bytes, 4 << 20);
        assert_eq!((b.gpu_device, b.target_gpu_device), (0, None));
        let t = a.child_args(Role::Target, None, true, None);
        assert!(t.iter().all(|s| s != "--json") && t.iter().any(|s| s == "--no-pin"));
        let t: Vec<String> = t.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        let t = parse(&t.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        assert_eq!((t.gpu_device, t.target_gpu_device), (1, None));
    }
}
