//! One row's numbers from its per-iteration durations: MORI's formulas (TotalSize in MB =
//! size×batch/1e6, Avg BW = TotalSize/1e3/mean seconds, Max BW from the shortest iteration,
//! Min/Avg Lat in µs per batch iteration) plus hdrhistogram percentiles.

use std::time::Duration;

use anyhow::{ensure, Context};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::args::OpType;

/// A finished row. Latencies are microseconds per iteration (the whole batch).
#[derive(Serialize, Debug, Clone)]
pub struct RowStats {
    /// Direction.
    pub op: OpType,
    /// Bytes per transfer.
    pub msg_size: usize,
    /// Transfers per iteration.
    pub batch_size: usize,
    /// Timed iterations.
    pub iters: usize,
    /// size × batch / 1e6.
    pub total_size_mb: f64,
    /// From the shortest iteration.
    pub max_bw_gbps: f64,
    /// From the mean iteration.
    pub avg_bw_gbps: f64,
    /// Shortest iteration.
    pub min_lat_us: f64,
    /// Mean iteration.
    pub avg_lat_us: f64,
    /// Median iteration (hdrhistogram, 3 significant digits).
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Longest iteration.
    pub max_lat_us: f64,
    /// Avg BW over the run's ceiling, if measured.
    pub avg_over_ceiling: Option<f64>,
    /// The raw-TCP latency floor of this row's batch, if measured.
    pub floor: Option<super::floor::Floor>,
    /// p50 over the floor's p50.
    pub p50_over_floor: Option<f64>,
    /// Whether the row's bytes were checked after it ran.
    pub validated: bool,
    /// Which transport carried the row: `same-host`, `tcp`, or `mixed` (the initiator's lanes
    /// so far, some of each).
    pub transport: String,
    /// Every timed iteration, in order.
    pub durations_us: Vec<f64>,
    /// What the initiator's shards did during the row (warm-up included).
    pub initiator_counters: Option<Counters>,
    /// What the target's shards did during the row (warm-up included).
    pub target_counters: Option<Counters>,
}

/// Shard counters of one engine that say how a row's small transfers were served: busy
/// polling (wakes, and the times shards stepped aside because they were preempted, after
/// which they park for 50 ms), doorbells rung for parked ring readers, express writes and
/// lane failures, GPU bytes staged and chunks whose copies into GPU memory overlapped the next
/// frame's read. A row's figures are the differences over it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// `busy_poll_wakes`.
    pub busy_poll_wakes: u64,
    /// `busy_poll_backoffs`.
    pub busy_poll_backoffs: u64,
    /// `busy_poll_handoffs`.
    #[serde(default)]
    pub busy_poll_handoffs: u64,
    /// `same_host_doorbells`.
    pub same_host_doorbells: u64,
    /// `express_writes`.
    pub express_writes: u64,
    /// `express_reads`.
    #[serde(default)]
    pub express_reads: u64,
    /// `lane_failures`.
    pub lane_failures: u64,
    /// `gpu_staged_bytes`.
    #[serde(default)]
    pub gpu_staged_bytes: u64,
    /// `gpu_overlapped_landings`.
    #[serde(default)]
    pub gpu_overlapped_landings: u64,
    /// `gpu_copies_ahead`.
    #[serde(default)]
    pub gpu_copies_ahead: u64,
}

impl Counters {
    /// The engine's counters now (zeros without a backend).
    pub fn of(engine: &morio::IoEngine) -> Self {
        engine.stats().map_or_else(Self::default, |s| {
            let t = s.total();
            Self {
                busy_poll_wakes: t.busy_poll_wakes,
                busy_poll_backoffs: t.busy_poll_backoffs,
                busy_poll_handoffs: t.busy_poll_handoffs,
                same_host_doorbells: t.same_host_doorbells,
                express_writes: t.express_writes,
                express_reads: t.express_reads,
                lane_failures: t.lane_failures,
                gpu_staged_bytes: t.gpu_staged_bytes,
                gpu_overlapped_landings: t.gpu_overlapped_landings,
                gpu_copies_ahead: t.gpu_copies_ahead,
            }
        })
    }

    /// What changed since `before`.
    pub fn since(self, before: Self) -> Self {
        Self {
            busy_poll_wakes: self.busy_poll_wakes.saturating_sub(before.busy_poll_wakes),
            busy_poll_backoffs: self
                .busy_poll_backoffs
                .saturating_sub(before.busy_poll_backoffs),
            busy_poll_handoffs: self
                .busy_poll_handoffs
                .saturating_sub(before.busy_poll_handoffs),
            same_host_doorbells: self
                .same_host_doorbells
                .saturating_sub(before.same_host_doorbells),
            express_writes: self.express_writes.saturating_sub(before.express_writes),
            express_reads: self.express_reads.saturating_sub(before.express_reads),
            lane_failures: self.lane_failures.saturating_sub(before.lane_failures),
            gpu_staged_bytes: self
                .gpu_staged_bytes
                .saturating_sub(before.gpu_staged_bytes),
            gpu_overlapped_landings: self
                .gpu_overlapped_landings
                .saturating_sub(before.gpu_overlapped_landings),
            gpu_copies_ahead: self
                .gpu_copies_ahead
                .saturating_sub(before.gpu_copies_ahead),
        }
    }
}

impl RowStats {
    /// Compute a row from its timed iterations (at least one).
    pub fn new(
        op: OpType,
        msg_size: usize,
        batch_size: usize,
        durations: &[Duration],
    ) -> anyhow::Result<Self> {
        ensure!(!durations.is_empty(), "row without timed iterations");
        let secs: Vec<f64> = durations.iter().map(Duration::as_secs_f64).collect();
        let n = secs.len() as f64;
        let mean = secs.iter().sum::<f64>() / n;
        let min = secs.iter().copied().fold(f64::INFINITY, f64::min);
        let total_size_mb = msg_size as f64 * batch_size as f64 / 1e6;
        let mut h = Histogram::<u64>::new(3).context("histogram")?;
        for d in durations {
            let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
            h.record(ns).context("histogram record")?;
        }
        let q = |x: f64| h.value_at_quantile(x) as f64 / 1e3;
        Ok(Self {
            op,
            msg_size,
            batch_size,
            iters: durations.len(),
            total_size_mb,
            max_bw_gbps: total_size_mb / 1e3 / min,
            avg_bw_gbps: total_size_mb / 1e3 / mean,
            min_lat_us: min * 1e6,
            avg_lat_us: mean * 1e6,
            p50_us: q(0.5),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_lat_us: h.max() as f64 / 1e3,
            avg_over_ceiling: None,
            floor: None,
            p50_over_floor: None,
            validated: false,
            transport: String::new(),
            durations_us: secs.iter().map(|s| s * 1e6).collect(),
            initiator_counters: None,
            target_counters: None,
        })
    }

    /// A line for the report when a side's busy-polling shards handed their CPU to another
    /// thread in half the row's iterations or more: the application thread (or the
    /// target's) ran on a shard's CPU, which costs small transfers a few microseconds each.
    pub fn sharing_note(&self) -> Option<String> {
        let sides = [
            ("initiator", self.initiator_counters),
            ("target", self.target_counters),
        ];
        let shared: Vec<String> = sides
            .iter()
            .filter_map(|(who, c)| {
                let n = c.as_ref()?.busy_poll_handoffs;
                (n > 0 && n as usize * 2 >= self.iters).then(|| format!("{who} {n}"))
            })
            .collect();
        (!shared.is_empty()).then(|| {
            format!(
                "{} B x {}: busy-polling shards handed their CPU to another thread ({} times in {} iterations): a thread shared a shard's CPU; keep the application's threads off the shards' CPUs for the lowest latency.",
                self.msg_size,
                self.batch_size,
                shared.join(", "),
                self.iters
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_whose_shards_handed_over_their_cpu_often_get_a_note() {
        let mut r = RowStats::new(OpType::Write, 8, 1, &[Duration::from_micros(20); 100]).unwrap();
        assert_eq!(r.sharing_note(), None, "no counters: nothing to say");
        let c = |h| Counters {
            busy_poll_handoffs: h,
            ..Counters::default()
        };
        r.initiator_counters = Some(c(10));
        r.target_counters = Some(c(0));
        assert_eq!(
            r.sharing_note(),
            None,
            "a handoff now and then is no sharing"
        );
        r.initiator_counters = Some(c(97));
        let note = r.sharing_note().unwrap();
        assert!(
            note.contains("initiator 97") && !note.contains("target"),
            "{note}"
        );
    }

    #[test]
    fn mori_formulas() {
        // 1 MiB × 256 in 20 ms and 30 ms: the seed table's row shape.
        let d = [Duration::from_millis(20), Duration::from_millis(30)];
        let r = RowStats::new(OpType::Write, 1 << 20, 256, &d).unwrap();
        assert!((r.total_size_mb - 268.435456).abs() < 1e-9);
        assert!((r.max_bw_gbps - 268.435456 / 1e3 / 0.020).abs() < 1e-9);
        assert!((r.avg_bw_gbps - 268.435456 / 1e3 / 0.025).abs() < 1e-9);
        assert!((r.min_lat_us - 20_000.0).abs() < 1e-6);
        assert!((r.avg_lat_us - 25_000.0).abs() < 1e-6);
        assert!((r.max_lat_us - 30_000.0).abs() / 30_000.0 < 1e-3);
        assert!(RowStats::new(OpType::Read, 1, 1, &[]).is_err());
    }
}
