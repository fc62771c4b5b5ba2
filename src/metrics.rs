//! An engine's statistics in the Prometheus text exposition format (version 0.0.4), encoded
//! by `prometheus-client` from a snapshot of every shard's counters and histograms.
//!
//! The per-shard families carry a `shard` label and nothing else: no engine key, region,
//! peer or address. The per-peer families ([`peers`]: `morio_peer_*`, summed over shards)
//! carry the peer's engine key as `peer` (and `outcome` or `lane`); [`IoEngine::metrics_text`]
//! includes them, [`IoEngine::metrics_text_without_peers`] leaves them out for an exposition
//! anyone may scrape (`morio serve`'s open `/metrics` with a deployment secret, by default).
//! Latency is exported as a Prometheus histogram in seconds, its buckets counted
//! from the shard's hdrhistogram (3 significant digits: a sample within 0.1% of a bucket's
//! bound may land in the neighbouring bucket; the sum is exact to the same precision).
//! Histograms, unlike summaries, add up across shards and engines (`histogram_quantile`
//! over `sum by (le)`).

use hdrhistogram::Histogram;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::engine::IoEngine;
use crate::stats::{EngineStats, ShardStats};

mod peers;

/// The `Content-Type` of [`IoEngine::metrics_text`] and [`EngineStats::metrics_text`]: the
/// Prometheus text format, version 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Upper bounds of the latency histogram's buckets, in µs (`+Inf` follows): 5 µs to 60 s in
/// 1-2.5-5 steps.
const LATENCY_BUCKETS_US: [u64; 22] = [
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000, 60_000_000,
];

impl IoEngine {
    /// This engine's statistics ([`Self::stats`]) in the Prometheus text exposition format
    /// ([`METRICS_CONTENT_TYPE`]), ready to serve on a `/metrics` endpoint. Without a backend
    /// only `morio_backend_up 0` is reported. The metrics are listed in ARCHITECTURE.md
    /// ("Metrics"): per-shard families, and per-peer ones labelled with the peers' engine
    /// keys (see [`Self::metrics_text_without_peers`] for an exposition without them).
    pub fn metrics_text(&self) -> String {
        encode(self.stats().as_ref(), true)
    }

    /// As [`Self::metrics_text`], without the per-peer families (`morio_peer_*`): no series
    /// names a peer, for an endpoint that anyone may scrape.
    pub fn metrics_text_without_peers(&self) -> String {
        encode(self.stats().as_ref(), false)
    }
}

impl EngineStats {
    /// These statistics in the Prometheus text exposition format ([`METRICS_CONTENT_TYPE`]);
    /// see [`IoEngine::metrics_text`].
    pub fn metrics_text(&self) -> String {
        encode(Some(self), true)
    }

    /// These statistics without the per-peer families; see
    /// [`IoEngine::metrics_text_without_peers`].
    pub fn metrics_text_without_peers(&self) -> String {
        encode(Some(self), false)
    }
}

/// The exposition of `stats` (`None`: no backend), with the per-peer families if `peers`.
fn encode(stats: Option<&EngineStats>, peers: bool) -> String {
    let mut registry = Registry::with_prefix("morio");
    registry.register_collector(Box::new(Snapshot(stats.cloned(), peers)));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
    out
}

/// One stats snapshot, encoded once (with the per-peer families if the flag is set).
#[derive(Debug)]
struct Snapshot(Option<EngineStats>, bool);

type Labels = [(&'static str, String); 1];

fn shard_label(s: &ShardStats) -> Labels {
    [("shard", s.shard.to_string())]
}

/// One family: a descriptor, then one series per shard.
fn family<F>(
    enc: &mut DescriptorEncoder,
    shards: &[ShardStats],
    name: &str,
    help: &str,
    unit: Option<Unit>,
    ty: MetricType,
    mut value: F,
) -> Result<(), std::fmt::Error>
where
    F: FnMut(&ShardStats, &mut MetricEncoder) -> Result<(), std::fmt::Error>,
{
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), ty)?;
    for s in shards {
        let labels = shard_label(s);
        value(s, &mut m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter(m: &mut MetricEncoder, v: u64) -> Result<(), std::fmt::Error> {
    m.encode_counter::<NoLabelSet, u64, f64>(&v, None::<&Exemplar<NoLabelSet, f64>>)
}

/// The classic buckets of `h` (µs): per-bucket counts for [`LATENCY_BUCKETS_US`] and `+Inf`
/// (bounds in seconds), the sum in seconds and the count.
fn buckets(h: &Histogram<u64>) -> (Vec<(f64, u64)>, f64, u64) {
    let mut counts = [0u64; LATENCY_BUCKETS_US.len() + 1];
    let mut sum_us = 0f64;
    for v in h.iter_recorded() {
        let at = v.value_iterated_to();
        let n = v.count_at_value();
        // A sample belongs to the first bucket whose bound is at least the low end of its
        // hdrhistogram bucket (values below 2048 µs are exact).
        let low = h.lowest_equivalent(at);
        let i = LATENCY_BUCKETS_US.partition_point(|&b| b < low);
        counts[i] += n;
        sum_us += h.median_equivalent(at) as f64 * n as f64;
    }
    let mut out: Vec<(f64, u64)> = LATENCY_BUCKETS_US
        .iter()
        .zip(counts)
        .map(|(&b, n)| (b as f64 / 1e6, n))
        .collect();
    out.push((f64::INFINITY, counts[LATENCY_BUCKETS_US.len()]));
    (out, sum_us / 1e6, h.len())
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let up = enc.encode_descriptor(
            "backend_up",
            "1 while the engine's TCP backend runs, 0 without one",
            None,
            MetricType::Gauge,
        );
        up?.encode_gauge(&i64::from(self.0.is_some()))?;
        let Some(stats) = &self.0 else {
            return Ok(());
        };
        let shards = &stats.shards[..];
        enc.encode_descriptor(
            "shards",
            "Shards (one executor thread each) the backend runs",
            None,
            MetricType::Gauge,
        )?
        .encode_gauge(&(shards.len() as u64))?;
        let e = &mut enc;
        let (c, g, bytes) = (MetricType::Counter, MetricType::Gauge, Some(Unit::Bytes));
        family(
            e,
            shards,
            "outbound_transfers",
            "Transfers this engine started that ended (owned by the shard), in SUCCESS or not",
            None,
            c,
            |s, m| counter(m, s.transfers_ok + s.transfers_failed),
        )?;
        family(
            e,
            shards,
            "outbound_transfer_errors",
            "Transfers this engine started that ended in an error (owned by the shard)",
            None,
            c,
            |s, m| counter(m, s.transfers_failed),
        )?;
        family(
            e,
            shards,
            "outbound_sent",
            "Payload bytes the shard sent: its lanes' writes, and read data it served as target",
            bytes.clone(),
            c,
            |s, m| counter(m, s.bytes_sent),
        )?;
        family(
            e,
            shards,
            "outbound_received",
            "Payload bytes the shard received and placed: its lanes' reads, and writes it served",
            bytes.clone(),
            c,
            |s, m| counter(m, s.bytes_received),
        )?;
        family(
            e,
            shards,
            "outbound_latency",
            "Submission-to-completion time of the transfers the shard owned",
            Some(Unit::Seconds),
            MetricType::Histogram,
            |s, m| {
                let (b, sum, count) = buckets(&s.latency_us);
                m.encode_histogram::<NoLabelSet>(sum, count, &b, None)
            },
        )?;
        family(
            e,
            shards,
            "inbound_chunk_latency",
            "Time the shard took to serve each chunk of peers' transfers (frame read to answer \
             queued: payload received and placed, or read data sent)",
            Some(Unit::Seconds),
            MetricType::Histogram,
            |s, m| {
                let (b, sum, count) = buckets(&s.inbound_latency_us);
                m.encode_histogram::<NoLabelSet>(sum, count, &b, None)
            },
        )?;
        family(
            e,
            shards,
            "inbound_written",
            "Payload bytes peers wrote into this engine's memory through the shard",
            bytes.clone(),
            c,
            |s, m| counter(m, s.inbound_bytes_written),
        )?;
        family(
            e,
            shards,
            "inbound_read",
            "Payload bytes peers read from this engine's memory through the shard",
            bytes.clone(),
            c,
            |s, m| counter(m, s.inbound_bytes_read),
        )?;
        family(
            e,
            shards,
            "inbound_transfers",
            "Transfers of peers the shard finished (inbound statuses it recorded)",
            None,
            c,
            |s, m| counter(m, s.inbound_transfers),
        )?;
        family(
            e,
            shards,
            "inbound_joined_transfers",
            "Of those, multi-chunk transfers whose last chunk the shard served",
            None,
            c,
            |s, m| counter(m, s.joined_transfers),
        )?;
        family(
            e,
            shards,
            "gpu_staging_pinned",
            "Pinned host memory the shard holds for GPU staging",
            bytes.clone(),
            g,
            |s, m| m.encode_gauge(&(s.gpu_staging_bytes as u64)),
        )?;
        family(
            e,
            shards,
            "gpu_staging_peak",
            "Most GPU staging memory the shard had in use at once",
            bytes.clone(),
            g,
            |s, m| m.encode_gauge(&(s.gpu_staging_peak_bytes as u64)),
        )?;
        family(
            e,
            shards,
            "gpu_staged",
            "GPU payload bytes the shard moved through pinned staging",
            bytes.clone(),
            c,
            |s, m| counter(m, s.gpu_staged_bytes),
        )?;
        family(
            e,
            shards,
            "gpu_ipc",
            "GPU payload bytes the shard moved device to device with same-host peers (no staging)",
            bytes,
            c,
            |s, m| counter(m, s.gpu_ipc_bytes),
        )?;
        family(
            e,
            shards,
            "gpu_ipc_declined",
            "GPU payloads offered to same-host peers as device parts and declined (then staged)",
            None,
            c,
            |s, m| counter(m, s.gpu_ipc_declined),
        )?;
        family(
            e,
            shards,
            "gpu_overlapped_landings",
            "Chunks received into GPU memory whose last staging copies overlapped reading the next frame",
            None,
            c,
            |s, m| counter(m, s.gpu_overlapped_landings),
        )?;
        family(
            e,
            shards,
            "gpu_copies_ahead",
            "Chunks sent from GPU memory whose first staging copy overlapped sending the frame before",
            None,
            c,
            |s, m| counter(m, s.gpu_copies_ahead),
        )?;
        family(
            e,
            shards,
            "busy_poll_wakes",
            "Socket reads woken by the shard's busy poller (spinning shards only)",
            None,
            c,
            |s, m| counter(m, s.busy_poll_wakes),
        )?;
        family(
            e,
            shards,
            "busy_poll_backoffs",
            "Times the shard stopped busy polling because it was preempted",
            None,
            c,
            |s, m| counter(m, s.busy_poll_backoffs),
        )?;
        family(
            e,
            shards,
            "busy_poll_handoffs",
            "Times the shard's busy poller offered its CPU and another thread took it",
            None,
            c,
            |s, m| counter(m, s.busy_poll_handoffs),
        )?;
        family(
            e,
            shards,
            "same_host_doorbells",
            "Doorbells rung for same-host peers whose ring readers were parked",
            None,
            c,
            |s, m| counter(m, s.same_host_doorbells),
        )?;
        family(
            e,
            shards,
            "same_host_ring_full_waits",
            "Sends that found a same-host peer's ring full and waited for room",
            None,
            c,
            |s, m| counter(m, s.same_host_ring_full_waits),
        )?;
        family(
            e,
            shards,
            "express_writes",
            "Small writes the submitting thread sent itself (into a same-host ring or on a TCP lane)",
            None,
            c,
            |s, m| counter(m, s.express_writes),
        )?;
        family(
            e,
            shards,
            "express_reads",
            "Small reads the submitting thread sent itself (into a same-host ring or on a TCP lane)",
            None,
            c,
            |s, m| counter(m, s.express_reads),
        )?;
        family(
            e,
            shards,
            "lane_connects",
            "Lanes the shard connected (beyond its lanes: reconnects)",
            None,
            c,
            |s, m| counter(m, s.lane_connects),
        )?;
        family(
            e,
            shards,
            "lane_same_host_connects",
            "Of the lanes the shard connected, those on the same-host transport",
            None,
            c,
            |s, m| counter(m, s.lane_connects_same_host),
        )?;
        family(
            e,
            shards,
            "lane_ring_connects",
            "Of the same-host lanes the shard connected, those whose records travel through \
             shared-memory rings",
            None,
            c,
            |s, m| counter(m, s.lane_connects_ring),
        )?;
        family(
            e,
            shards,
            "lane_failures",
            "Lanes of the shard that failed (not closed on purpose)",
            None,
            c,
            |s, m| counter(m, s.lane_failures),
        )?;
        family(
            e,
            shards,
            "inbound_writes_dropped",
            "WRITE chunks the shard dropped unplaced: they waited unread on a lane the \
             initiator reset when that write failed by its deadline",
            None,
            c,
            |s, m| counter(m, s.inbound_writes_dropped),
        )?;
        family(
            e,
            shards,
            "writes_fenced",
            "Striped writes the shard owned that failed early and were fenced by FINISH on \
             their lanes before their failure was reported",
            None,
            c,
            |s, m| counter(m, s.writes_fenced),
        )?;
        family(
            e,
            shards,
            "fences_timed_out",
            "Fenced writes whose FINISHes were not all answered in time: their lanes were \
             reset instead",
            None,
            c,
            |s, m| counter(m, s.fences_timed_out),
        )?;
        family(
            e,
            shards,
            "finishes_held",
            "FINISHes the shard answered, as a target, only once a chunk of their transfer \
             another connection was placing had landed",
            None,
            c,
            |s, m| counter(m, s.finishes_held),
        )?;
        if self.1 {
            peers::encode(e, &stats.per_peer())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use prometheus_parse::{LineInfo, Scrape, Value};

    use super::*;

    /// Parse an exposition, every line of it: a line the parser would skip fails the test.
    fn parse(text: &str) -> Scrape {
        for line in text.lines() {
            assert!(
                !matches!(LineInfo::parse(line), LineInfo::Ignored),
                "not exposition format: {line:?}"
            );
        }
        Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
    }

    /// `metric{shard=…}` → value, for counters, gauges and untyped samples.
    fn scalars(s: &Scrape) -> HashMap<(String, String), f64> {
        s.samples
            .iter()
            .filter_map(|x| {
                let v = match x.value {
                    Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                    _ => return None,
                };
                let shard = x.labels.get("shard").unwrap_or("").to_string();
                Some(((x.metric.clone(), shard), v))
            })
            .collect()
    }

    #[test]
    fn no_backend_is_one_gauge() {
        let text = encode(None, true);
        let s = parse(&text);
        assert_eq!(s.samples.len(), 1, "{text}");
        assert_eq!(s.samples[0].metric, "morio_backend_up");
        assert_eq!(s.samples[0].value, Value::Gauge(0.0));
    }

    #[test]
    fn every_counter_gauge_and_histogram_per_shard() {
        let mut a = ShardStats::new(0);
        let mut b = ShardStats::new(1);
        let (pa, pb) = (a.peer(&"x".into()), b.peer(&"x".into()));
        a.record_transfer(pa, true, 3); // le 5 µs
        a.record_transfer(pa, true, 5); // le 5 µs (the bound is inclusive)
        a.record_transfer(pa, false, 7_000); // le 10 ms
        b.record_transfer(pb, true, 100_000_000); // +Inf
        a.bytes_sent = 1 << 20;
        a.bytes_received = 12;
        b.inbound_bytes_written = 5 << 20;
        b.inbound_bytes_read = 77;
        b.inbound_transfers = 3;
        b.joined_transfers = 2;
        a.gpu_staging_bytes = 4 << 20;
        a.gpu_staging_peak_bytes = 1 << 20;
        a.gpu_staged_bytes = 3 << 20;
        b.gpu_ipc_bytes = 6 << 20;
        b.gpu_ipc_declined = 4;
        a.gpu_overlapped_landings = 7;
        b.gpu_copies_ahead = 3;
        b.busy_poll_wakes = 9;
        b.busy_poll_backoffs = 4;
        a.busy_poll_handoffs = 8;
        a.same_host_doorbells = 5;
        b.same_host_ring_full_waits = 2;
        b.express_writes = 5;
        b.express_reads = 6;
        a.lane_connects = 4;
        b.lane_failures = 2;
        a.inbound_writes_dropped = 3;
        b.writes_fenced = 5;
        b.fences_timed_out = 1;
        a.finishes_held = 2;
        let stats = EngineStats { shards: vec![a, b] };
        let text = stats.metrics_text();
        let s = parse(&text);
        let v = scalars(&s);
        let at = |m: &str, shard: &str| {
            *v.get(&(m.to_string(), shard.to_string()))
                .unwrap_or_else(|| panic!("no {m}{{shard={shard}}} in\n{text}"))
        };
        assert_eq!(at("morio_backend_up", ""), 1.0);
        assert_eq!(at("morio_shards", ""), 2.0);
        assert_eq!(at("morio_outbound_transfers_total", "0"), 3.0);
        assert_eq!(at("morio_outbound_transfers_total", "1"), 1.0);
        assert_eq!(at("morio_outbound_transfer_errors_total", "0"), 1.0);
        assert_eq!(at("morio_outbound_transfer_errors_total", "1"), 0.0);
        assert_eq!(at("morio_outbound_sent_bytes_total", "0"), (1 << 20) as f64);
        assert_eq!(at("morio_outbound_received_bytes_total", "0"), 12.0);
        assert_eq!(
            at("morio_inbound_written_bytes_total", "1"),
            (5 << 20) as f64
        );
        assert_eq!(at("morio_inbound_read_bytes_total", "1"), 77.0);
        assert_eq!(at("morio_inbound_transfers_total", "1"), 3.0);
        assert_eq!(at("morio_inbound_joined_transfers_total", "1"), 2.0);
        assert_eq!(at("morio_gpu_staging_pinned_bytes", "0"), (4 << 20) as f64);
        assert_eq!(at("morio_gpu_staging_peak_bytes", "0"), (1 << 20) as f64);
        assert_eq!(at("morio_gpu_staged_bytes_total", "0"), (3 << 20) as f64);
        assert_eq!(at("morio_gpu_ipc_bytes_total", "1"), (6 << 20) as f64);
        assert_eq!(at("morio_gpu_ipc_declined_total", "1"), 4.0);
        assert_eq!(at("morio_gpu_overlapped_landings_total", "0"), 7.0);
        assert_eq!(at("morio_gpu_copies_ahead_total", "1"), 3.0);
        assert_eq!(at("morio_busy_poll_wakes_total", "1"), 9.0);
        assert_eq!(at("morio_busy_poll_backoffs_total", "1"), 4.0);
        assert_eq!(at("morio_busy_poll_handoffs_total", "0"), 8.0);
        assert_eq!(at("morio_same_host_doorbells_total", "0"), 5.0);
        assert_eq!(at("morio_same_host_ring_full_waits_total", "1"), 2.0);
        assert_eq!(at("morio_express_writes_total", "1"), 5.0);
        assert_eq!(at("morio_express_reads_total", "1"), 6.0);
        assert_eq!(at("morio_lane_connects_total", "0"), 4.0);
        assert_eq!(at("morio_lane_failures_total", "1"), 2.0);
        assert_eq!(at("morio_inbound_writes_dropped_total", "0"), 3.0);
        assert_eq!(at("morio_writes_fenced_total", "1"), 5.0);
        assert_eq!(at("morio_fences_timed_out_total", "1"), 1.0);
        assert_eq!(at("morio_finishes_held_total", "0"), 2.0);
        assert_eq!(at("morio_outbound_latency_seconds_count", "0"), 3.0);
        let sum = at("morio_outbound_latency_seconds_sum", "0");
        assert!((sum - 0.007_008).abs() < 1e-5, "sum {sum}");
        // Every family has a HELP and a TYPE line; names follow the conventions.
        for name in [
            "morio_outbound_transfers_total",
            "morio_outbound_latency_seconds",
            "morio_gpu_staging_pinned_bytes",
        ] {
            assert!(s.docs.contains_key(name), "no HELP for {name}");
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "no TYPE for {name}"
            );
        }
        // The per-peer families name the peer, summed over shards.
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("morio_peer_transfers_total{"))
                .collect::<Vec<_>>(),
            [
                r#"morio_peer_transfers_total{peer="x",outcome="ok"} 3"#,
                r#"morio_peer_transfers_total{peer="x",outcome="failed"} 1"#,
            ]
        );
        // Without them, only the shard label: nothing that names the engine, a peer or
        // memory; the rest is the same.
        let open = stats.metrics_text_without_peers();
        let without: Vec<&str> = text
            .lines()
            .filter(|l| !l.contains("morio_peer_"))
            .collect();
        assert_eq!(open.lines().collect::<Vec<_>>(), without);
        let s = parse(&open);
        for x in &s.samples {
            let mut keys: Vec<&str> = Vec::new();
            for k in ["shard", "engine", "peer", "key", "host", "region"] {
                if x.labels.get(k).is_some() {
                    keys.push(k);
                }
            }
            assert!(
                keys.is_empty() || keys == ["shard"],
                "{}: {keys:?}",
                x.metric
            );
        }
        let hist = |shard: &str| -> Vec<(f64, f64)> {
            let h = s
                .samples
                .iter()
                .find(|x| {
                    x.metric == "morio_outbound_latency_seconds"
                        && x.labels.get("shard") == Some(shard)
                })
                .unwrap_or_else(|| panic!("no histogram for shard {shard}"));
            let Value::Histogram(b) = &h.value else {
                panic!("not a histogram")
            };
            b.iter().map(|c| (c.less_than, c.count)).collect()
        };
        let h0 = hist("0");
        assert_eq!(h0.len(), LATENCY_BUCKETS_US.len() + 1);
        let le = |h: &[(f64, f64)], bound: f64| {
            h.iter()
                .find(|(b, _)| {
                    (*b - bound).abs() < 1e-12 || (b.is_infinite() && bound.is_infinite())
                })
                .map(|x| x.1)
                .unwrap()
        };
        assert_eq!(le(&h0, 5e-6), 2.0);
        assert_eq!(le(&h0, 5e-3), 2.0);
        assert_eq!(le(&h0, 1e-2), 3.0);
        assert_eq!(le(&h0, f64::INFINITY), 3.0);
        let h1 = hist("1");
        assert_eq!(le(&h1, 60.0), 0.0);
        assert_eq!(le(&h1, f64::INFINITY), 1.0);
        // Cumulative, as the format requires.
        for h in [&h0, &h1] {
            assert!(h.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        }
    }
}
