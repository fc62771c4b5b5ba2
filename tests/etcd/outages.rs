//! etcd outages: the keep-alive and the watch survive an etcd restart, and a lost lease is
//! replaced with everything published again.

use std::time::{Duration, Instant};

use morio::StatusCode;

use crate::common::{engine, filled, write_to};
use crate::server::Etcd;

/// etcd restarts under a live handle: the keep-alive and the watch reconnect by themselves,
/// so the published engine stays (well past its TTL) and a peer published after the restart
/// is registered by the watcher.
#[test]
fn keep_alive_and_watch_survive_an_etcd_restart() {
    let mut etcd = Etcd::start();
    let n = 4096;
    let (a, b, c) = (engine("rs_a"), engine("rs_b"), engine("rs_c"));
    let ra = a.alloc_buffer(n).unwrap();
    let da = etcd.connect("/t4");
    da.publish(&a, &[("kv", ra.desc())]).unwrap();
    let dc = etcd.connect("/t4");
    dc.watch(&c).unwrap();
    etcd.restart(Duration::from_millis(500));
    std::thread::sleep(Duration::from_secs(5)); // more than twice the 2 s TTL
    assert!(
        dc.lookup("rs_a").unwrap().is_some(),
        "a's lease was not kept alive"
    );
    let rb = b.alloc_buffer(n).unwrap();
    let db = etcd.connect("/t4");
    db.publish(&b, &[("kv", rb.desc())]).unwrap();
    let src = filled(&c, n, 9);
    let t0 = Instant::now();
    while write_to(&dc, &c, &src, "rs_b") != StatusCode::Success {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the watch did not resume"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(rb.to_vec(), src.to_vec());
    assert_eq!(write_to(&dc, &c, &src, "rs_a"), StatusCode::Success);
}

/// Revoke every lease `etcd` holds (as an expiry during a long outage would end them).
fn revoke_all_leases(endpoint: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        let ids: Vec<i64> = c
            .leases()
            .await
            .unwrap()
            .leases()
            .iter()
            .map(|l| l.id())
            .collect();
        assert!(!ids.is_empty());
        for id in ids {
            c.lease_revoke(id).await.unwrap();
        }
    });
}

/// A handle whose lease is lost while it lives takes a new one and publishes everything
/// again (the watcher sees the engine go and come back); publishing again with fewer regions
/// removes the ones no longer named.
#[test]
fn a_lost_lease_is_replaced_and_everything_published_again() {
    let etcd = Etcd::start();
    let n = 4096;
    let (a, c) = (engine("lost_a"), engine("lost_c"));
    let (r1, r2) = (a.alloc_buffer(n).unwrap(), a.alloc_buffer(n).unwrap());
    let da = etcd.connect("/t5");
    da.publish(&a, &[("kv", r1.desc()), ("extra", r2.desc())])
        .unwrap();
    da.publish(&a, &[("kv", r1.desc())]).unwrap();
    let dc = etcd.connect("/t5");
    let names: Vec<String> = dc
        .regions("lost_a")
        .unwrap()
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(names, ["kv"]);
    dc.watch(&c).unwrap();
    revoke_all_leases(&etcd.endpoint);
    let t0 = Instant::now();
    while dc.lookup("lost_a").unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "not published again on a new lease"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(dc.regions("lost_a").unwrap().len(), 1);
    let src = filled(&c, n, 4);
    let t0 = Instant::now();
    while write_to(&dc, &c, &src, "lost_a") != StatusCode::Success {
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "not registered again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(r1.to_vec(), src.to_vec());
}
