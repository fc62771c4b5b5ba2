//! What one peer's frames can make the target hold: chunk counts that reserve no memory, a
//! join flood refused past its cap while others transfer, inbound statuses capped per peer
//! and in total, and host regions larger than physical memory refused.

use std::io::Write;
use std::time::Duration;

use morio::proto::codes;
use morio::proto::frame::Frame;
use morio::{EngineError, MemoryLocationType, StatusCode};

use super::raw::*;
use crate::common::*;

/// This process's address space and resident memory, in bytes (`/proc/self/statm`).
fn statm() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let mut v = s.split_whitespace().map(|x| x.parse::<u64>().unwrap());
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    (v.next().unwrap() * page, v.next().unwrap() * page)
}

/// WRITE frames of 95 bytes (111 with the access key), each claiming 2^32 - 1 chunks (a join's bitmap is sized by the
/// count: 512 MiB each before counts were checked), close their connection and reserve
/// nothing; counts at the limit (2^20, for a wide extent) reserve no more than the join caps
/// allow. The process's memory stays put, and normal traffic flows after.
#[test]
fn hostile_chunk_counts_reserve_no_memory() {
    run_alone("failures::bounded_state::hostile_chunk_counts_reserve_no_memory_case");
}

#[test]
#[ignore = "run alone by hostile_chunk_counts_reserve_no_memory: it measures the process's memory"]
fn hostile_chunk_counts_reserve_no_memory_case() {
    let (a, b) = hostile_pair("hostile_counts");
    let dst = b.alloc_buffer(4096).unwrap();
    let id = target_of(dst.desc());
    let client = "hostile_counts_client";
    // A one-byte whole write after each hostile frame: answered only if the hostile frame
    // left the connection open.
    let sync = |uid| write_frame(uid, id, (0, 1), &[(0, 1)]);
    let before = statm();
    let mut conns = Vec::new();
    for i in 0..128u64 {
        let mut s = handshaken(&b, client);
        let mut bytes = part_frame(1000 + i, (1, u32::MAX, 0), id, (0, 64), &[(0, 13)]);
        // The attack's 95-byte frame, plus the 16-byte access key chunks carry since v6.
        assert_eq!(bytes.len(), 95 + 16);
        bytes.extend(sync(5000 + i));
        s.write_all(&bytes).unwrap();
        let first = try_read_frame(&mut s, Duration::from_secs(5));
        conns.push((s, first));
    }
    // Counts at the limit for an extent no region has: every chunk is refused (unknown
    // region) and still reports to the join table, where a join of 2^20 chunks takes 2048
    // slots: two per peer at the default cap, the rest refused.
    let mut open = Vec::new();
    for k in 0..8 {
        let mut s = handshaken(&b, &format!("hostile_counts_peer{k}"));
        for uid in 0..16u64 {
            let f = part_frame(
                uid,
                (1, 1 << 20, 0),
                (id.0.wrapping_add(99), id.1),
                (0, 1 << 40),
                &[(0, 13)],
            );
            s.write_all(&f).unwrap();
        }
        s.write_all(&sync(99)).unwrap();
        match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => assert_eq!((r.uid, r.code), (99, codes::SUCCESS), "{r:?}"),
            f => panic!("peer {k}: unexpected {f:?}"),
        }
        open.push(s);
    }
    let after = statm();
    let (space, resident) = (
        after.0.saturating_sub(before.0),
        after.1.saturating_sub(before.1),
    );
    assert!(
        space < 1 << 30 && resident < 16 << 20,
        "the target grew by {} MiB of address space and {} MiB resident",
        space >> 20,
        resident >> 20
    );
    for (i, (mut s, first)) in conns.into_iter().enumerate() {
        assert!(
            matches!(first, Ok(Frame::GoAway { .. })),
            "connection {i}: expected a GOAWAY, got {first:?}"
        );
        read_until_closed(&mut s, CLOSE_LIMIT);
    }
    assert!(b.pop_inbound_transfer_status(client, 1000).is_none());
    assert!(b.pop_inbound_transfer_status(client, 5000).is_none());
    normal_traffic(&a, &b);
    drop(open);
}

/// A peer that starts more joins than its cap (chunk 0 of transfers whose chunk 1 never
/// comes) gets each further transfer refused at once (COMPLETE with ERR_BAD_STATE, recorded
/// as its inbound status), while another peer's striped transfers go on; a join that
/// completes gives its slot back, and another key has a cap of its own.
#[test]
fn hostile_join_flood_is_refused_past_its_cap_while_others_transfer() {
    let (a, b) = pair(
        "hostile_joincap",
        cfg_with(|c| {
            c.handshake_timeout = Duration::from_millis(300);
            c.max_joins_per_peer = 8;
        }),
    );
    let dst = b.alloc_buffer(4096).unwrap();
    let id = target_of(dst.desc());
    let client = "hostile_joincap_client";
    let mut s = handshaken(&b, client);
    for uid in 0..40u64 {
        s.write_all(&part_frame(uid, (0, 2, 0), id, (0, 64), &[(0, 32)]))
            .unwrap();
    }
    for uid in 8..40u64 {
        match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => {
                assert_eq!(
                    (r.tag, r.uid, r.code),
                    (uid * 10, uid, codes::ERR_BAD_STATE)
                );
                assert!(r.msg.contains("max_joins_per_peer"), "{}", r.msg);
            }
            f => panic!("uid {uid}: unexpected {f:?}"),
        }
    }
    let st = b
        .pop_inbound_transfer_status(client, 8)
        .expect("inbound status");
    assert_eq!(st.code(), StatusCode::ErrBadState);
    assert!(
        b.pop_inbound_transfer_status(client, 0).is_none(),
        "in flight"
    );
    // Another peer transfers meanwhile, striped (joined) transfers included.
    normal_traffic(&a, &b);
    // Chunk 1 of transfer 0 completes its join and gives its slot back...
    s.write_all(&part_frame(0, (1, 2, 0), id, (0, 64), &[(32, 32)]))
        .unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.tag, r.uid, r.code), (1, 0, codes::SUCCESS)),
        f => panic!("unexpected {f:?}"),
    }
    // ... so a new transfer fits again.
    for chunk in 0..2u32 {
        let f = part_frame(
            100,
            (chunk, 2, 0),
            id,
            (0, 64),
            &[(u64::from(chunk) * 32, 32)],
        );
        s.write_all(&f).unwrap();
    }
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (100, codes::SUCCESS), "{r:?}"),
        f => panic!("unexpected {f:?}"),
    }
    // Another key has a cap of its own.
    let mut other = handshaken(&b, "hostile_joincap_other");
    for chunk in 0..2u32 {
        let f = part_frame(
            7,
            (chunk, 2, 0),
            id,
            (0, 64),
            &[(u64::from(chunk) * 32, 32)],
        );
        other.write_all(&f).unwrap();
    }
    match read_frame(&mut other, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (7, codes::SUCCESS), "{r:?}"),
        f => panic!("unexpected {f:?}"),
    }
    normal_traffic(&a, &b);
}

/// Inbound statuses nobody pops are bounded per peer (its newest kept) and in total, over
/// many connections with distinct 1000-byte source keys; the newest status is always there.
#[test]
fn hostile_inbound_statuses_are_capped_per_peer_and_in_total() {
    let (a, b) = pair(
        "hostile_status",
        cfg_with(|c| {
            c.max_inbound_statuses_per_peer = 16;
            c.max_inbound_statuses = 64;
        }),
    );
    let dst = b.alloc_buffer(4096).unwrap();
    let id = target_of(dst.desc());
    let client = "hostile_status_client";
    let mut s = handshaken(&b, client);
    for uid in 0..100u64 {
        s.write_all(&write_frame(uid, id, (0, 1), &[(0, 1)]))
            .unwrap();
    }
    for uid in 0..100u64 {
        match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => assert_eq!((r.uid, r.code), (uid, codes::SUCCESS)),
            f => panic!("unexpected {f:?}"),
        }
    }
    let kept: Vec<u64> = (0..100)
        .filter(|&uid| b.pop_inbound_transfer_status(client, uid).is_some())
        .collect();
    assert_eq!(kept, (84..100).collect::<Vec<_>>(), "the newest 16");
    let keys: Vec<String> = (0..300).map(|i| format!("{i:0>1000}")).collect();
    for key in &keys {
        let mut s = handshaken(&b, key);
        s.write_all(&write_frame(1, id, (0, 1), &[(0, 1)])).unwrap();
        match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => assert_eq!((r.uid, r.code), (1, codes::SUCCESS)),
            f => panic!("unexpected {f:?}"),
        }
    }
    let last = b.pop_inbound_transfer_status(keys.last().unwrap(), 1);
    assert!(last.is_some(), "the newest status is kept");
    let kept = keys
        .iter()
        .filter(|k| b.pop_inbound_transfer_status(k, 1).is_some())
        .count();
    assert!(kept < 64, "{kept} statuses kept past the total of 64");
    normal_traffic(&a, &b);
}

/// A host region larger than the machine's memory (a 1 PiB registration) is refused.
#[test]
fn regions_larger_than_physical_memory_are_refused() {
    let e = engine("too_big", test_cfg());
    let ptr = std::ptr::NonNull::<u8>::dangling().as_ptr();
    // SAFETY: refused before the range is recorded or touched.
    let r = unsafe { e.register_memory(ptr, 1 << 50, -1, MemoryLocationType::Cpu) };
    assert!(
        matches!(r, Err(EngineError::RegionTooLarge { size, .. }) if size == 1 << 50),
        "{r:?}"
    );
    assert!(matches!(
        e.alloc_buffer(1 << 50),
        Err(EngineError::RegionTooLarge { .. })
    ));
}
