//! Per-peer counters: an initiator whose transfers to one peer succeed, to another are
//! refused by the target and to a third cannot connect; every per-peer counter on both sides
//! is what was done, and the exposition carries them as labelled series, keys escaped.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::common::*;
use morio::{IoEngine, PeerStats, StatusCode};

/// Keys with characters the exposition format must escape (quote, backslash).
const A: &str = r#"pm "a" \ key"#;
const B: &str = "pm_b";
const C: &str = r#"pm\c"#;
const D: &str = "pm_d";

/// `e`'s per-peer counters once `done` holds for its totals (a target counts some bytes just
/// after its answer leaves, so the initiator may see SUCCESS a moment before).
fn settled(e: &IoEngine, done: impl Fn(&morio::ShardStats) -> bool) -> BTreeMap<String, PeerStats> {
    let t0 = Instant::now();
    loop {
        let s = e.stats().unwrap();
        if done(&s.total()) || t0.elapsed() > Duration::from_secs(10) {
            return s.per_peer();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The lanes of `p` each connected once and none failed; their connects add up.
#[track_caller]
fn lanes_connected_once(p: &PeerStats, n_lanes: u16) {
    assert!(p.lane_connects >= 1, "{p:?}");
    assert_eq!(p.lane_failures, 0, "{p:?}");
    assert_eq!(p.lanes.len() as u64, p.lane_connects, "{p:?}");
    for (&i, l) in &p.lanes {
        assert!(i < n_lanes, "{p:?}");
        assert_eq!((l.connects, l.failures), (1, 0), "lane {i}: {p:?}");
    }
}

/// One sample line of an exposition, parsed strictly: name, labels (values unescaped: `\\`,
/// `\"`, `\n`) and value. `None` for comments.
fn sample(line: &str) -> Option<(String, BTreeMap<String, String>, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (name, mut rest) =
        line.split_at(line.find(['{', ' ']).unwrap_or_else(|| panic!("{line:?}")));
    let mut labels = BTreeMap::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let r = rest.strip_prefix(',').unwrap_or(rest);
            let (k, r) = r.split_once("=\"").unwrap_or_else(|| panic!("{line:?}"));
            let mut v = String::new();
            let mut chars = r.char_indices();
            let end = loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => v.push('\\'),
                        Some((_, '"')) => v.push('"'),
                        Some((_, 'n')) => v.push('\n'),
                        other => panic!("bad escape {other:?} in {line:?}"),
                    },
                    Some((i, '"')) => break i,
                    Some((_, c)) => v.push(c),
                    None => panic!("unterminated label value in {line:?}"),
                }
            };
            labels.insert(k.to_string(), v);
            rest = &r[end + 1..];
        }
    }
    let value = rest.trim().parse().unwrap_or_else(|_| panic!("{line:?}"));
    Some((name.to_string(), labels, value))
}

#[test]
fn per_peer_counters_match_what_was_done_on_both_sides() {
    let cfg = test_cfg();
    let n_lanes = cfg.num_data_conns as u16;
    let a = engine(A, cfg.clone());
    let b = engine(B, cfg.clone());
    let c = engine(C, cfg);
    a.register_remote_engine(&b.engine_desc()).unwrap();
    a.register_remote_engine(&c.engine_desc()).unwrap();
    a.register_remote_engine(&desc_at(D, closed_port()))
        .unwrap();
    let (big, small) = (3usize << 20, 4096usize);
    let src = random_buffer(&a, big, 1);
    let back = a.alloc_buffer(big).unwrap();

    // To B: a striped write, a small write and a read, all ok.
    let on_b = b.alloc_buffer(big).unwrap();
    for st in [
        a.write(
            src.desc(),
            0,
            on_b.desc(),
            0,
            big,
            a.allocate_transfer_uid(),
        ),
        a.write(
            src.desc(),
            0,
            on_b.desc(),
            0,
            small,
            a.allocate_transfer_uid(),
        ),
        a.read(
            back.desc(),
            0,
            on_b.desc(),
            0,
            small,
            a.allocate_transfer_uid(),
        ),
    ] {
        assert_ok(&st, "to B");
    }
    // To C: a write and a read of memory it no longer has, both refused by C.
    let gone = c.alloc_buffer(small).unwrap().desc().clone();
    c.deregister_memory(&gone).unwrap();
    let w = a.write(src.desc(), 0, &gone, 0, small, a.allocate_transfer_uid());
    let r = a.read(back.desc(), 0, &gone, 0, small, a.allocate_transfer_uid());
    for st in [w, r] {
        assert_eq!(wait(&st), StatusCode::ErrNotFound, "{}", st.message());
    }
    // To D: nothing listens, the lane fails to connect.
    let d_mem = morio::MemoryDesc {
        engine_key: D.into(),
        ..gone.clone()
    };
    let st = a.write(src.desc(), 0, &d_mem, 0, small, a.allocate_transfer_uid());
    assert_ne!(wait(&st), StatusCode::Success);

    // The initiator, per peer, once every lane to D failed: the first transfer to a peer
    // opens all its lanes (as MORI-IO does), and those without work fail on their own time.
    let t0 = Instant::now();
    let stats = loop {
        let s = a.stats().unwrap();
        let failed = s.per_peer().get(D).map_or(0, |p| p.lane_failures);
        if failed >= n_lanes as u64 || t0.elapsed() > Duration::from_secs(10) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let pa = stats.per_peer();
    let mut peers = vec![B, C, D];
    peers.sort();
    assert_eq!(pa.keys().collect::<Vec<_>>(), peers);
    let (to_b, to_c, to_d) = (&pa[B], &pa[C], &pa[D]);
    assert_eq!(
        (to_b.transfers_ok, to_b.transfers_failed),
        (3, 0),
        "{to_b:?}"
    );
    assert_eq!(
        (to_b.bytes_sent, to_b.bytes_received),
        ((big + small) as u64, small as u64),
        "{to_b:?}"
    );
    lanes_connected_once(to_b, n_lanes);
    assert_eq!(
        (to_c.transfers_ok, to_c.transfers_failed),
        (0, 2),
        "{to_c:?}"
    );
    // The refused write's chunk left; the refused read brought nothing back.
    assert_eq!(
        (to_c.bytes_sent, to_c.bytes_received),
        (small as u64, 0),
        "{to_c:?}"
    );
    lanes_connected_once(to_c, n_lanes);
    assert_eq!(
        (to_d.transfers_ok, to_d.transfers_failed),
        (0, 1),
        "{to_d:?}"
    );
    assert_eq!((to_d.bytes_sent, to_d.bytes_received), (0, 0), "{to_d:?}");
    assert_eq!(
        (to_d.lane_connects, to_d.lane_failures),
        (0, n_lanes as u64),
        "{to_d:?}"
    );
    assert_eq!(to_d.lanes.len(), n_lanes as usize, "{to_d:?}");
    for p in [to_b, to_c, to_d] {
        // Nobody wrote to or read from A.
        assert_eq!(
            (
                p.inbound_bytes_written,
                p.inbound_bytes_read,
                p.inbound_transfers
            ),
            (0, 0, 0),
            "{p:?}"
        );
    }
    // Summed over peers: the engine's totals.
    let t = stats.total();
    let sum = |f: fn(&PeerStats) -> u64| pa.values().map(f).sum::<u64>();
    assert_eq!(sum(|p| p.transfers_ok), t.transfers_ok);
    assert_eq!(sum(|p| p.transfers_failed), t.transfers_failed);
    assert_eq!(sum(|p| p.bytes_sent), t.bytes_sent);
    assert_eq!(sum(|p| p.bytes_received), t.bytes_received);
    assert_eq!(sum(|p| p.lane_connects), t.lane_connects);
    assert_eq!(sum(|p| p.lane_failures), t.lane_failures);

    // The targets, per peer: only A, as target.
    let pb = settled(&b, |t| {
        t.inbound_transfers == 3 && t.inbound_bytes_read == small as u64
    });
    assert_eq!(pb.keys().collect::<Vec<_>>(), [A]);
    let from_a = &pb[A];
    assert_eq!(
        (
            from_a.inbound_bytes_written,
            from_a.inbound_bytes_read,
            from_a.inbound_transfers
        ),
        ((big + small) as u64, small as u64, 3),
        "{from_a:?}"
    );
    // A target's byte counters include what it served.
    assert_eq!(
        (from_a.bytes_received, from_a.bytes_sent),
        ((big + small) as u64, small as u64)
    );
    assert_eq!(
        (
            from_a.transfers_ok,
            from_a.transfers_failed,
            from_a.lane_connects
        ),
        (0, 0, 0)
    );
    assert!(from_a.lanes.is_empty(), "{from_a:?}");
    let pc = settled(&c, |t| t.inbound_transfers == 2);
    assert_eq!(pc.keys().collect::<Vec<_>>(), [A]);
    let from_a = &pc[A];
    // Both refusals are inbound statuses; no byte was placed or served.
    assert_eq!(
        (
            from_a.inbound_transfers,
            from_a.inbound_bytes_written,
            from_a.inbound_bytes_read
        ),
        (2, 0, 0),
        "{from_a:?}"
    );
    assert_eq!((from_a.bytes_sent, from_a.bytes_received), (0, 0));

    // The exposition: it parses, and the labelled series carry the same figures, keys
    // intact.
    let text = a.metrics_text();
    for line in text.lines() {
        assert!(
            !matches!(
                prometheus_parse::LineInfo::parse(line),
                prometheus_parse::LineInfo::Ignored
            ),
            "not exposition format: {line:?}"
        );
    }
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let series: Vec<_> = text.lines().filter_map(sample).collect();
    let at = |name: &str, labels: &[(&str, &str)]| -> f64 {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let hits: Vec<f64> = series
            .iter()
            .filter(|(n, l, _)| n == name && *l == want)
            .map(|x| x.2)
            .collect();
        assert_eq!(hits.len(), 1, "{name}{want:?} in\n{text}");
        hits[0]
    };
    assert_eq!(
        at(
            "morio_peer_transfers_total",
            &[("peer", B), ("outcome", "ok")]
        ),
        3.0
    );
    assert_eq!(
        at(
            "morio_peer_transfers_total",
            &[("peer", B), ("outcome", "failed")]
        ),
        0.0
    );
    assert_eq!(
        at(
            "morio_peer_transfers_total",
            &[("peer", C), ("outcome", "failed")]
        ),
        2.0
    );
    assert_eq!(
        at(
            "morio_peer_transfers_total",
            &[("peer", D), ("outcome", "failed")]
        ),
        1.0
    );
    assert_eq!(
        at("morio_peer_sent_bytes_total", &[("peer", B)]),
        (big + small) as f64
    );
    assert_eq!(
        at("morio_peer_sent_bytes_total", &[("peer", C)]),
        small as f64
    );
    assert_eq!(
        at("morio_peer_received_bytes_total", &[("peer", B)]),
        small as f64
    );
    let d_lane = to_d.lanes.keys().next().unwrap().to_string();
    assert_eq!(
        at(
            "morio_peer_lane_failures_total",
            &[("peer", D), ("lane", &d_lane)]
        ),
        1.0
    );
    let b_lanes: f64 = series
        .iter()
        .filter(|(n, l, _)| {
            n == "morio_peer_lane_connects_total" && l.get("peer").map(String::as_str) == Some(B)
        })
        .map(|x| x.2)
        .sum();
    assert_eq!(b_lanes, to_b.lane_connects as f64);
    // The target's series name the initiator's key, escaped and intact.
    let text = b.metrics_text();
    assert!(text.contains(r#"peer="pm \"a\" \\ key""#), "{text}");
    let series: Vec<_> = text.lines().filter_map(sample).collect();
    let written = series
        .iter()
        .find(|(n, l, _)| {
            n == "morio_peer_inbound_written_bytes_total"
                && l.get("peer").map(String::as_str) == Some(A)
        })
        .map(|x| x.2);
    assert_eq!(written, Some((big + small) as f64), "{text}");
    // Without the per-peer families, no series names a peer.
    let open = a.metrics_text_without_peers();
    assert!(
        !open.contains("morio_peer_") && !open.contains("peer="),
        "{open}"
    );
    assert!(open.contains("morio_outbound_transfers_total"), "{open}");
}
