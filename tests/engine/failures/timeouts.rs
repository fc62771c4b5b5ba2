//! Peers that never answer: transfers fail by `op_timeout` against a fake peer silent before
//! or after the handshake, and a black-holed dial does not stall dials to other peers.

use std::time::{Duration, Instant};

use morio::proto::limits::VERSION;
use morio::{MemoryDesc, StatusCode};

use super::MIB;
use crate::common::*;

/// Writes and reads (small and striped) to a fake peer that never completes them: each fails
/// with ERR_BAD_STATE after about `op_timeout` (300 ms), well within 2 s. Each case runs on
/// a fresh initiator, so its lanes start from nothing and the lower bound is exact (on one
/// engine, a transfer queued behind a dial that is about to time out fails with that dial,
/// earlier than its own deadline, as MORI's peer abort fails waiting ops).
fn times_out_against(mode: FakeMode, prefix: &str) {
    let fake_key = format!("{prefix}_fake");
    let fake = FakePeer::start(&fake_key, mode);
    let cfg = cfg_with(|c| c.op_timeout = Duration::from_millis(300));
    let remote = MemoryDesc::cpu(&fake_key, 0, 0x10000, 16 << 20);
    let data = random_big(2 * MIB, 30);
    let mut keys = Vec::new();
    let mut last = None;
    for (i, (size, read)) in [
        (4096usize, false),
        (4096, true),
        (2 * MIB, false),
        (2 * MIB, true),
    ]
    .into_iter()
    .enumerate()
    {
        let a = engine(&format!("{prefix}_a{i}"), cfg.clone());
        keys.push(a.key().to_string());
        a.register_remote_engine(&desc_at(&fake_key, fake.port))
            .unwrap();
        let src = a.register_buffer(data.clone()).unwrap();
        let t = Instant::now();
        let uid = a.allocate_transfer_uid();
        let st = if read {
            a.read(src.desc(), 0, &remote, 0, size, uid)
        } else {
            a.write(src.desc(), 0, &remote, 0, size, uid)
        };
        let code = wait_within(&st, Duration::from_secs(2));
        let el = t.elapsed();
        let what = format!("{mode:?} size {size} read={read}");
        assert_eq!(code, StatusCode::ErrBadState, "{what}: {}", st.message());
        assert!(
            el >= Duration::from_millis(250),
            "{what}: failed before the timeout: {el:?}"
        );
        assert!(el < Duration::from_secs(2), "{what}: {el:?}");
        assert_bytes_eq(&src.to_vec(), &data, &format!("{what}: local buffer"));
        last = Some((a, src));
    }
    let hellos = fake.hellos.lock().unwrap().clone();
    assert!(!hellos.is_empty(), "no engine dialed the fake peer");
    for h in &hellos {
        assert_eq!(h.version, VERSION);
        assert!(keys.contains(&h.src_key), "{h:?}");
        assert_eq!(h.dst_key, fake_key);
        assert!(h.lane < h.n_lanes);
    }
    // The engine still works with a real peer.
    let (a, src) = last.unwrap();
    let b = engine(&format!("{prefix}_b"), test_cfg());
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let dst = b.alloc_buffer(2 * MIB).unwrap();
    assert_ok(
        &a.write(
            src.desc(),
            0,
            dst.desc(),
            0,
            2 * MIB,
            a.allocate_transfer_uid(),
        ),
        "real",
    );
    assert_bytes_eq(&dst.to_vec(), &data, "write to a real peer afterwards");
}

#[test]
fn op_timeout_when_peer_never_answers_hello() {
    times_out_against(FakeMode::Silent, "to_hello");
}

#[test]
fn op_timeout_when_peer_goes_silent_after_handshake() {
    times_out_against(FakeMode::AckThenSilent, "to_silent");
}

#[test]
fn unresponsive_peer_does_not_stall_dials_to_other_peers() {
    let hole = BlackHole::new();
    let a = engine(
        "hole_a",
        cfg_with(|c| c.op_timeout = Duration::from_secs(3)),
    );
    let c = engine("hole_c", test_cfg());
    a.register_remote_engine(&desc_at("hole", hole.port))
        .unwrap();
    a.register_remote_engine(&c.engine_desc()).unwrap();
    let n = 4 * MIB;
    let src = a.register_buffer(random_big(n, 90)).unwrap();
    let stuck = a.write(
        src.desc(),
        0,
        &MemoryDesc::cpu("hole", 0, 0x1000, n as u64),
        0,
        n,
        a.allocate_transfer_uid(),
    );
    // Give the black-holed dials a head start (they stay pending for op_timeout).
    assert_eq!(
        stuck.wait_for(Duration::from_millis(50)),
        StatusCode::InProgress
    );
    let dst = c.alloc_buffer(n).unwrap();
    let t = Instant::now();
    let ok = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait_within(&ok, Duration::from_secs(5));
    assert_eq!(
        code,
        StatusCode::Success,
        "healthy peer: {} after {:?}",
        ok.message(),
        t.elapsed()
    );
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "healthy peer took {:?}",
        t.elapsed()
    );
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "write to the healthy peer");
    assert_eq!(
        wait_within(&stuck, Duration::from_secs(5)),
        StatusCode::ErrBadState
    );
}
