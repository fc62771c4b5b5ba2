//! Engine statistics: per-shard counters and latency histograms, merged on request.
//!
//! Each shard owns its own [`ShardStats`] (no sharing, no atomics on the data path); a stats
//! request collects a snapshot from every shard and [`EngineStats`] merges them.

use hdrhistogram::Histogram;

/// Highest latency a histogram records exactly (1 hour in µs); larger values saturate.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// One shard's counters and its owned transfers' latency.
#[derive(Debug, Clone)]
pub struct ShardStats {
    /// The shard.
    pub shard: usize,
    /// Transfers this shard owned that ended in SUCCESS.
    pub transfers_ok: u64,
    /// Transfers this shard owned that ended in an error.
    pub transfers_failed: u64,
    /// Payload bytes this shard's lanes sent (write chunks).
    pub bytes_sent: u64,
    /// Payload bytes this shard's lanes received and placed (read data).
    pub bytes_received: u64,
    /// Payload bytes peers wrote into this shard's regions (inbound write chunks).
    pub inbound_bytes_written: u64,
    /// Payload bytes peers read from this shard's regions (inbound read chunks).
    pub inbound_bytes_read: u64,
    /// Inbound transfers this shard finished (inbound statuses it recorded).
    pub inbound_transfers: u64,
    /// Of those, multi-chunk ones: this shard served the chunk that completed the join and
    /// answered COMPLETE for the whole transfer.
    pub joined_transfers: u64,
    /// Submission-to-completion latency of owned transfers, in µs.
    pub latency_us: Histogram<u64>,
    /// Pinned GPU staging memory this shard holds.
    pub gpu_staging_bytes: usize,
    /// Most GPU staging memory this shard had in use at once.
    pub gpu_staging_peak_bytes: usize,
    /// Socket reads woken by the shard's busy poller (spinning shards only).
    pub busy_poll_wakes: u64,
}

impl ShardStats {
    /// Empty statistics for `shard`.
    pub fn new(shard: usize) -> Self {
        Self {
            shard,
            transfers_ok: 0,
            transfers_failed: 0,
            bytes_sent: 0,
            bytes_received: 0,
            inbound_bytes_written: 0,
            inbound_bytes_read: 0,
            inbound_transfers: 0,
            joined_transfers: 0,
            latency_us: new_histogram(),
            gpu_staging_bytes: 0,
            gpu_staging_peak_bytes: 0,
            busy_poll_wakes: 0,
        }
    }

    /// Record one owned transfer's end.
    pub(crate) fn record_transfer(&mut self, ok: bool, latency_us: u64) {
        if ok {
            self.transfers_ok += 1;
        } else {
            self.transfers_failed += 1;
        }
        self.latency_us
            .saturating_record(latency_us.min(MAX_LATENCY_US));
    }
}

fn new_histogram() -> Histogram<u64> {
    // 3 significant digits over 1 µs .. 1 h: fixed bounds, so recording never resizes.
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).unwrap_or_else(|_| {
        Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant digits is valid"))
    })
}

/// Every shard's statistics, and their sum.
#[derive(Debug, Clone)]
pub struct EngineStats {
    /// Per shard, in shard order.
    pub shards: Vec<ShardStats>,
}

impl EngineStats {
    /// The sum over shards (the histogram merged).
    pub fn total(&self) -> ShardStats {
        let mut t = ShardStats::new(usize::MAX);
        for s in &self.shards {
            t.transfers_ok += s.transfers_ok;
            t.transfers_failed += s.transfers_failed;
            t.bytes_sent += s.bytes_sent;
            t.bytes_received += s.bytes_received;
            t.inbound_bytes_written += s.inbound_bytes_written;
            t.inbound_bytes_read += s.inbound_bytes_read;
            t.inbound_transfers += s.inbound_transfers;
            t.joined_transfers += s.joined_transfers;
            t.gpu_staging_bytes += s.gpu_staging_bytes;
            t.gpu_staging_peak_bytes += s.gpu_staging_peak_bytes;
            t.busy_poll_wakes += s.busy_poll_wakes;
            // Same bounds on every shard, so adding cannot fail.
            let _ = t.latency_us.add(&s.latency_us);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_up() {
        let mut a = ShardStats::new(0);
        let mut b = ShardStats::new(1);
        a.record_transfer(true, 10);
        b.record_transfer(false, 1000);
        b.record_transfer(true, u64::MAX);
        a.bytes_sent = 5;
        b.bytes_sent = 7;
        let t = EngineStats { shards: vec![a, b] }.total();
        assert_eq!(
            (t.transfers_ok, t.transfers_failed, t.bytes_sent),
            (2, 1, 12)
        );
        assert_eq!(t.latency_us.len(), 3);
        assert!(t.latency_us.max() >= MAX_LATENCY_US / 2);
    }
}
