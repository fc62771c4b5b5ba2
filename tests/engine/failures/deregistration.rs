//! Deregistering memory: target memory under a large write (untouched once the call returns),
//! unknown, foreign, stale or misdescribed regions (typed errors), and a `RegisteredBuffer`
//! deregistered while its handle is alive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::{AccessKey, EngineError, MemoryLocationType, StatusCode};

use super::{poll_until, MIB};
use crate::common::*;

#[test]
fn deregister_target_memory_during_large_write() {
    let (a, b) = pair("dereg_busy", test_cfg());
    let n = 256 * MIB;
    let src = a.register_buffer(vec![0xC3; n]).unwrap();
    let mut mem = vec![0u8; n];
    let base = mem.as_mut_ptr();
    // SAFETY: `mem` lives until the end of the test, after its deregistration returned.
    let md = unsafe { b.register_memory(base, n, -1, MemoryLocationType::Cpu) }.unwrap();
    let st = a.write(src.desc(), 0, &md, 0, n, a.allocate_transfer_uid());
    poll_until(Duration::from_secs(10), "first stripe", || {
        // SAFETY: in bounds; a volatile probe of bytes the engine is placing.
        (0..8).any(|k| unsafe { base.add(k * MIB + MIB - 1).read_volatile() } == 0xC3)
    });
    assert!(
        st.in_progress(),
        "precondition: the write is still in flight"
    );
    let t = Instant::now();
    b.deregister_memory(&md)
        .expect("deregister with a write in flight");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "deregister took {:?}",
        t.elapsed()
    );
    // From here on the engine must not touch `mem`.
    let snapshot = mem.clone();
    let code = wait_within(&st, Duration::from_secs(25));
    assert!(
        matches!(
            code,
            StatusCode::Success | StatusCode::ErrNotFound | StatusCode::ErrBadState
        ),
        "{code}: {}",
        st.message()
    );
    assert_bytes_eq(
        &mem,
        &snapshot,
        "memory written after deregister_memory returned",
    );
    // The deregistered descriptor is gone; the engine keeps working with other regions.
    let small = random_buffer(&a, 4096, 60);
    let st = a.write(small.desc(), 0, &md, 0, 4096, a.allocate_transfer_uid());
    assert_eq!(wait(&st), StatusCode::ErrNotFound, "{}", st.message());
    let other = b.alloc_buffer(4 * MIB).unwrap();
    let data = a.register_buffer(random_big(4 * MIB, 61)).unwrap();
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(data.desc(), 0, other.desc(), 0, 4 * MIB, uid),
        "write afterwards",
    );
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_bytes_eq(&other.to_vec(), &data.to_vec(), "write afterwards");
    drop(mem);
}

#[test]
fn deregister_unknown_or_foreign_desc_is_an_error() {
    let (a, b) = pair("dereg_unknown", test_cfg());
    let buf = b.alloc_buffer(64).unwrap();
    let mut bogus = buf.desc().clone();
    bogus.id = 31337;
    assert!(matches!(
        b.deregister_memory(&bogus),
        Err(EngineError::UnknownMemory(31337))
    ));
    // A descriptor of another engine (same id, other key).
    let theirs = a.alloc_buffer(64).unwrap();
    assert!(b.deregister_memory(theirs.desc()).is_err());
    // The right id with another access key (a descriptor of an earlier registration whose
    // id was drawn again) names no memory of this engine.
    let mut stale = buf.desc().clone();
    stale.access_key = AccessKey::NONE;
    assert!(matches!(
        b.deregister_memory(&stale),
        Err(EngineError::UnknownMemory(_))
    ));
    // Twice: the second is unknown. (Raw registration, so nothing else holds the region.)
    let mut mem = vec![0u8; 64];
    // SAFETY: `mem` outlives the registration.
    let md =
        unsafe { b.register_memory(mem.as_mut_ptr(), 64, -1, MemoryLocationType::Cpu) }.unwrap();
    b.deregister_memory(&md).unwrap();
    assert!(matches!(
        b.deregister_memory(&md),
        Err(EngineError::UnknownMemory(_))
    ));
    // Host memory claimed as GPU memory: no runtime here, or one that says it is not device
    // memory; either way a typed error.
    // SAFETY: refused before the pointer is used.
    let gpu = unsafe { b.register_memory(mem.as_mut_ptr(), 64, 0, MemoryLocationType::Gpu) };
    assert!(matches!(gpu, Err(EngineError::Gpu(_))), "{gpu:?}");
    // CPU memory with a device id, and an unknown location.
    // SAFETY: refused before the pointer is used.
    let cpu = unsafe { b.register_memory(mem.as_mut_ptr(), 64, 0, MemoryLocationType::Cpu) };
    assert!(matches!(cpu, Err(EngineError::UnsupportedMemory(_))));
    // SAFETY: refused before the pointer is used.
    let unk = unsafe { b.register_memory(mem.as_mut_ptr(), 64, -1, MemoryLocationType::Unknown) };
    assert!(matches!(unk, Err(EngineError::UnsupportedMemory(_))));
    drop(mem);
}

#[test]
fn deregister_registered_buffer_while_the_handle_is_alive() {
    let b = engine(
        "dereg_owned",
        cfg_with(|c| c.op_timeout = Duration::from_millis(500)),
    );
    let buf = b.alloc_buffer(4096).unwrap();
    let desc = buf.desc().clone();
    let b = Arc::new(b);
    let b2 = b.clone();
    let t = Instant::now();
    let r = within(Duration::from_secs(10), "deregister_memory", move || {
        b2.deregister_memory(&desc).map_err(|e| e.to_string())
    });
    assert!(
        r.is_ok(),
        "deregister of a held RegisteredBuffer: {r:?} after {:?}",
        t.elapsed()
    );
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "took {:?}",
        t.elapsed()
    );
    // The handle still reads and writes its own bytes; peers can no longer resolve it.
    assert!(buf.write_at(0, &[1, 2, 3]));
    assert_eq!(bytes_at(&buf, 0, 3), [1, 2, 3]);
}
