//! The per-peer families of the exposition: one series per peer (label `peer`, the remote
//! engine's key, escaped by `prometheus-client`), summed over shards, and per lane index
//! (label `lane`) for lane connects and failures. See [`crate::stats::PeerMap`] for what is
//! counted and how the number of peers is bounded (`peer="_other"`).

use std::collections::BTreeMap;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::counter;
use crate::stats::PeerStats;

type Peers = BTreeMap<String, PeerStats>;

/// One counter family with a series per peer.
fn per_peer(
    enc: &mut DescriptorEncoder,
    peers: &Peers,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    value: fn(&PeerStats) -> u64,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
    for (peer, s) in peers {
        series(&mut m, [("peer", peer.as_str())], value(s))?;
    }
    Ok(())
}

/// One counter family with a series per peer and lane.
fn per_lane(
    enc: &mut DescriptorEncoder,
    peers: &Peers,
    name: &str,
    help: &str,
    value: fn(&crate::stats::LaneStats) -> u64,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (peer, s) in peers {
        for (lane, l) in &s.lanes {
            let lane = lane.to_string();
            series(&mut m, [("peer", peer.as_str()), ("lane", &lane)], value(l))?;
        }
    }
    Ok(())
}

fn series(
    m: &mut MetricEncoder,
    labels: impl EncodeLabelSet,
    v: u64,
) -> Result<(), std::fmt::Error> {
    counter(&mut m.encode_family(&labels)?, v)
}

/// Every per-peer family, for `peers` (summed over shards, by engine key).
pub(super) fn encode(enc: &mut DescriptorEncoder, peers: &Peers) -> Result<(), std::fmt::Error> {
    {
        let mut m = enc.encode_descriptor(
            "peer_transfers",
            "Transfers this engine started with the peer that ended, by outcome (ok: SUCCESS)",
            None,
            MetricType::Counter,
        )?;
        for (peer, s) in peers {
            let p = peer.as_str();
            series(&mut m, [("peer", p), ("outcome", "ok")], s.transfers_ok)?;
            series(
                &mut m,
                [("peer", p), ("outcome", "failed")],
                s.transfers_failed,
            )?;
        }
    }
    let bytes = || Some(Unit::Bytes);
    per_peer(
        enc,
        peers,
        "peer_sent",
        "Payload bytes sent to the peer: this engine's writes, and what the peer read from it",
        bytes(),
        |s| s.bytes_sent,
    )?;
    per_peer(
        enc,
        peers,
        "peer_received",
        "Payload bytes received from the peer and placed: this engine's reads, and what the \
         peer wrote into it",
        bytes(),
        |s| s.bytes_received,
    )?;
    per_peer(
        enc,
        peers,
        "peer_inbound_written",
        "Payload bytes the peer wrote into this engine's memory",
        bytes(),
        |s| s.inbound_bytes_written,
    )?;
    per_peer(
        enc,
        peers,
        "peer_inbound_read",
        "Payload bytes the peer read from this engine's memory",
        bytes(),
        |s| s.inbound_bytes_read,
    )?;
    per_peer(
        enc,
        peers,
        "peer_inbound_transfers",
        "Transfers of the peer this engine finished as their target",
        None,
        |s| s.inbound_transfers,
    )?;
    per_lane(
        enc,
        peers,
        "peer_lane_connects",
        "Lanes to the peer that connected, by lane index (beyond one per lane: reconnects)",
        |l| l.connects,
    )?;
    per_lane(
        enc,
        peers,
        "peer_lane_failures",
        "Lanes to the peer that failed, by lane index (not closed on purpose)",
        |l| l.failures,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::stats::{EngineStats, ShardStats};

    #[test]
    fn every_peer_family_sums_shards_and_escapes_keys() {
        let mut a = ShardStats::new(0);
        let mut b = ShardStats::new(1);
        let weird: Arc<str> = "we\"ird\\key\nx".into();
        let plain: Arc<str> = "plain".into();
        let (aw, bw, bp) = (a.peer(&weird), b.peer(&weird), b.peer(&plain));
        a.record_transfer(aw, true, 10);
        b.record_transfer(bw, false, 10);
        a.count_sent(aw, 5);
        b.count_sent(bw, 6);
        b.count_received(bp, 7);
        a.count_inbound_write(aw, 100);
        b.count_inbound_read(bp, 30);
        b.count_inbound_transfer(bp, false);
        a.count_lane_connect(aw, 0, false, false);
        b.count_lane_connect(bw, 1, true, true);
        b.count_lane_failure(bw, 1);
        let text = EngineStats { shards: vec![a, b] }.metrics_text();
        let w = r#"peer="we\"ird\\key\nx""#;
        for want in [
            format!("morio_peer_transfers_total{{{w},outcome=\"ok\"}} 1"),
            format!("morio_peer_transfers_total{{{w},outcome=\"failed\"}} 1"),
            r#"morio_peer_transfers_total{peer="plain",outcome="ok"} 0"#.to_string(),
            "morio_peer_sent_bytes_total{peer=\"plain\"} 30".to_string(),
            "morio_peer_received_bytes_total{peer=\"plain\"} 7".to_string(),
            format!("morio_peer_received_bytes_total{{{w}}} 100"),
            format!("morio_peer_inbound_written_bytes_total{{{w}}} 100"),
            "morio_peer_inbound_read_bytes_total{peer=\"plain\"} 30".to_string(),
            "morio_peer_inbound_transfers_total{peer=\"plain\"} 1".to_string(),
            format!("morio_peer_inbound_transfers_total{{{w}}} 0"),
            format!("morio_peer_lane_connects_total{{{w},lane=\"0\"}} 1"),
            format!("morio_peer_lane_connects_total{{{w},lane=\"1\"}} 1"),
            format!("morio_peer_lane_failures_total{{{w},lane=\"0\"}} 0"),
            format!("morio_peer_lane_failures_total{{{w},lane=\"1\"}} 1"),
        ] {
            assert!(text.lines().any(|l| l == want), "no {want:?} in\n{text}");
        }
        // Sent: 5 on shard 0 and 6 on shard 1, one series.
        let sent: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("morio_peer_sent_bytes_total{"))
            .collect();
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert!(sent.contains(&format!("morio_peer_sent_bytes_total{{{w}}} 11").as_str()));
        // A peer without lanes of its own has no lane series; every family is typed.
        assert!(!text.contains("peer=\"plain\",lane="), "{text}");
        for name in [
            "morio_peer_transfers_total",
            "morio_peer_sent_bytes_total",
            "morio_peer_received_bytes_total",
            "morio_peer_inbound_written_bytes_total",
            "morio_peer_inbound_read_bytes_total",
            "morio_peer_inbound_transfers_total",
            "morio_peer_lane_connects_total",
            "morio_peer_lane_failures_total",
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} counter\n")),
                "no TYPE for {name}"
            );
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "no HELP for {name}"
            );
        }
        // The raw key appears nowhere unescaped.
        assert!(!text.contains("we\"ird"), "{text}");
    }
}
