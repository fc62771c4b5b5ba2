//! Dropping an engine: an initiator with transfers in flight (they fail, its threads join),
//! one still dialing (no helper thread panics), and a target (its connections close, so its
//! peers' next transfers fail at once).

use std::time::{Duration, Instant};

use morio::{MemoryDesc, StatusCode};

use super::{poll_until, MIB};
use crate::common::*;

#[test]
fn dropping_the_initiator_fails_in_flight_transfers_and_joins() {
    let (a, b) = pair("drop_init", test_cfg());
    let n = 32 * MIB;
    let probe_local = a.alloc_buffer(16).unwrap();
    let probe_remote = b.alloc_buffer(16).unwrap();
    let sess = a
        .create_session(probe_local.desc(), probe_remote.desc())
        .unwrap();
    // Buffers first, then every submission back to back, then the drop at once.
    let writes: Vec<_> = (0..4u8)
        .map(|k| {
            (
                a.register_buffer(vec![k + 1; n]).unwrap(),
                b.alloc_buffer(n).unwrap(),
            )
        })
        .collect();
    let reads: Vec<_> = (0..2u8)
        .map(|k| {
            (
                a.alloc_buffer(n).unwrap(),
                b.register_buffer(vec![k + 7; n]).unwrap(),
            )
        })
        .collect();
    let mut statuses = Vec::new();
    for (src, dst) in &writes {
        statuses.push(a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()));
    }
    for (local, remote) in &reads {
        statuses.push(a.read(
            local.desc(),
            0,
            remote.desc(),
            0,
            n,
            a.allocate_transfer_uid(),
        ));
    }
    let t = Instant::now();
    within(Duration::from_secs(10), "dropping engine a", move || {
        drop(a)
    });
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "drop took {:?}",
        t.elapsed()
    );
    // Right after the drop returned: nothing is left in progress.
    let codes: Vec<StatusCode> = statuses.iter().map(|s| s.code()).collect();
    for (i, (c, s)) in codes.iter().zip(&statuses).enumerate() {
        assert!(
            matches!(c, StatusCode::Success | StatusCode::ErrBadState),
            "transfer {i} is {c} after the drop: {}",
            s.message()
        );
    }
    assert!(
        codes.contains(&StatusCode::ErrBadState),
        "no transfer was in flight at the drop: {codes:?}"
    );
    // A session that outlived its engine refuses work.
    let st = sess.write(0, 0, 16, sess.allocate_transfer_uid());
    assert_eq!(st.code(), StatusCode::ErrBadState, "{}", st.message());
    // The target is unaffected: a new initiator with the same key works with it.
    let a2 = engine("drop_init_a", test_cfg());
    a2.register_remote_engine(&b.engine_desc()).unwrap();
    let src = a2.register_buffer(random_big(2 * MIB, 70)).unwrap();
    let dst = b.alloc_buffer(2 * MIB).unwrap();
    let uid = a2.allocate_transfer_uid();
    assert_ok(
        &a2.write(src.desc(), 0, dst.desc(), 0, 2 * MIB, uid),
        "new initiator",
    );
    assert_eq!(inbound(&b, a2.key(), uid), StatusCode::Success);
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "new initiator");
}

#[test]
fn dropping_an_engine_while_it_dials_panics_no_thread() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static HELPER_PANICS: AtomicUsize = AtomicUsize::new(0);
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info
                .location()
                .is_some_and(|l| l.file().contains("blocking"))
            {
                HELPER_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            prev(info);
        }));
    });
    let before = HELPER_PANICS.load(Ordering::SeqCst);
    let hole = BlackHole::new();
    let op_timeout = Duration::from_millis(300);
    let a = engine("dial_drop_a", cfg_with(|c| c.op_timeout = op_timeout));
    a.register_remote_engine(&desc_at("hole", hole.port))
        .unwrap();
    let src = a.alloc_buffer(4096).unwrap();
    let remote = MemoryDesc::cpu("hole", 0, 0x1000, 4096);
    let st = a.write(src.desc(), 0, &remote, 0, 4096, a.allocate_transfer_uid());
    assert_eq!(
        st.wait_for(Duration::from_millis(50)),
        StatusCode::InProgress
    );
    within(Duration::from_secs(5), "drop while dialing", move || {
        drop(a)
    });
    assert_eq!(st.code(), StatusCode::ErrBadState);
    // The pending connect gives up after op_timeout; nothing may panic when it does.
    let t = Instant::now();
    while t.elapsed() < op_timeout + Duration::from_secs(1) {
        assert_eq!(
            HELPER_PANICS.load(Ordering::SeqCst),
            before,
            "a helper thread panicked after the engine was dropped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn dropping_the_target_closes_its_connections() {
    let op_timeout = Duration::from_secs(3);
    let (a, b) = pair("drop_target", cfg_with(|c| c.op_timeout = op_timeout));
    let n = MIB;
    let src = a.register_buffer(random_big(n, 95)).unwrap();
    let dst = b.alloc_buffer(n).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "write",
    );
    let port = b.engine_desc().port;
    assert!(established_on_local_port(port) > 0, "no lane to b is up");
    within(Duration::from_secs(5), "dropping b", move || drop(b));
    poll_until(
        Duration::from_secs(2),
        "b's accepted connections closed",
        || established_on_local_port(port) == 0,
    );
    // So a's next transfer to b fails at once (its lanes see the close), not at op_timeout.
    let t = Instant::now();
    let st = a.write(
        src.desc(),
        0,
        dst.desc(),
        0,
        4096,
        a.allocate_transfer_uid(),
    );
    let code = wait_within(&st, op_timeout + Duration::from_secs(1));
    assert_eq!(code, StatusCode::ErrBadState, "{}", st.message());
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "failed only after {:?}: {}",
        t.elapsed(),
        st.message()
    );
}
