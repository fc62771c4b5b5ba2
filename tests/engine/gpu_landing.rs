//! GPU memory received through staging: a chunk whose copies into device memory still run
//! while its connection reads the next frame ("landing"), answered after them, in order, and
//! never lost to a copy failure or a lost peer.

use std::sync::Arc;
use std::time::Duration;

use morio::gpu::fake::{FakeGpu, FaultAt};
use morio::gpu::GpuRuntime;
use morio::{StatusCode, TcpBackendConfig};

use crate::common::*;
use crate::gpu::{buffer, gpu_pair, Kind};

/// One shard and one lane, 64 KiB chunks in four 16 KiB slots each, two slots per pool: a
/// chunk still landing holds the pool, so the next one takes its slots back first.
fn one_lane() -> TcpBackendConfig {
    cfg_with(|c| {
        c.same_host = Some(morio::SameHost::Off);
        c.num_shards = Some(1);
        c.num_data_conns = 1;
        c.gpu_chunk_bytes = 64 << 10;
        c.gpu_slot_bytes = 16 << 10;
        c.gpu_staging_bytes = 2 * 2 * (16 << 10);
    })
}

/// A chunk received into GPU memory is answered only once its copies into device memory are
/// done, but its connection reads the next chunk meanwhile. With slow copies (the fake's
/// delay), one lane and one shard whose pools hold two slots (four per chunk, so a chunk still
/// landing holds the pool and the next one takes its slots back first), chunks of a write
/// into GPU memory and of a read into it overlap so (counted), and every byte lands.
#[test]
fn gpu_chunks_land_while_the_next_is_read() {
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_copy_delay(Duration::from_millis(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let (a, b) = gpu_pair("gpu_landing", one_lane(), &rt);
    let n = 1 << 20;
    let data = random_big(n, 29);
    let src = buffer(&a, Kind::Cpu, &data);
    let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), "write");
    assert_bytes_eq(&dst.to_vec(), &data, "write");
    let t = b.stats().unwrap().total();
    assert!(t.gpu_overlapped_landings > 0, "target: {t:?}");
    assert_eq!(t.gpu_staged_bytes, n as u64, "{t:?}");
    let host = buffer(&b, Kind::Cpu, &data);
    let back = buffer(&a, Kind::Gpu, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.read(back.desc(), 0, host.desc(), 0, n, uid), "read");
    assert_bytes_eq(&back.to_vec(), &data, "read");
    let t = a.stats().unwrap().total();
    assert!(t.gpu_overlapped_landings > 0, "initiator: {t:?}");
    assert_eq!(t.gpu_staged_bytes, n as u64, "{t:?}");
}

/// A copy into device memory that fails while its chunk is landing fails that chunk's
/// transfer (ERR_GPU_OP on both sides), never hangs it; on the target (a WRITE into its GPU)
/// and on the initiator (READ data into its GPU). The fault is sticky, as a CUDA device error
/// is, so each case uses its own engines.
#[test]
fn a_copy_failing_while_its_chunk_lands_fails_its_transfer() {
    let n = 1 << 20;
    let data = random_big(n, 31);
    for (what, read) in [
        ("write into the target's GPU", false),
        ("read into the initiator's GPU", true),
    ] {
        let fake = Arc::new(FakeGpu::new(1));
        fake.set_copy_delay(Duration::from_millis(1));
        let rt: Arc<dyn GpuRuntime> = fake.clone();
        let (a, b) = gpu_pair("gpu_landing_fault", one_lane(), &rt);
        let host = buffer(if read { &b } else { &a }, Kind::Cpu, &data);
        let gpu = buffer(if read { &a } else { &b }, Kind::Gpu, &vec![0u8; n]);
        // Past the first chunks (four copies each), so that earlier chunks landed well.
        fake.inject_fault(Some(10), FaultAt::Complete);
        let uid = a.allocate_transfer_uid();
        let st = if read {
            a.read(gpu.desc(), 0, host.desc(), 0, n, uid)
        } else {
            a.write(host.desc(), 0, gpu.desc(), 0, n, uid)
        };
        assert_eq!(wait(&st), StatusCode::ErrGpuOp, "{what}: {}", st.message());
        if !read {
            assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrGpuOp, "{what}");
        }
        let t = (if read { &a } else { &b }).stats().unwrap().total();
        assert!(t.gpu_overlapped_landings > 0, "{what}: {t:?}");
        fake.inject_fault(None, FaultAt::Submit);
    }
}

/// A peer lost while chunks of a read land in the initiator's GPU memory: the read ends with
/// an error (its chunks already read are reported, the rest fail with the lane), it does not
/// hang, and the initiator's next transfer to another peer works.
#[test]
fn a_peer_lost_while_chunks_land_fails_the_read_without_a_hang() {
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_copy_delay(Duration::from_millis(2));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let (a, b) = gpu_pair("gpu_landing_lost", one_lane(), &rt);
    // More than the sockets between them hold, so most of it is still at b when b goes.
    let n = 16 << 20;
    let data = random_big(n, 37);
    let host = buffer(&b, Kind::Cpu, &data);
    let gpu = buffer(&a, Kind::Gpu, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    let st = a.read(gpu.desc(), 0, host.desc(), 0, n, uid);
    // 256 chunks of 4 copies at 2 ms each: about two seconds; lose b well before the end.
    std::thread::sleep(Duration::from_millis(60));
    within(Duration::from_secs(30), "dropping the target", move || {
        drop((b, host))
    });
    let code = wait(&st);
    assert!(code.is_error(), "{code:?}: {}", st.message());
    let t = a.stats().unwrap().total();
    assert!(t.gpu_overlapped_landings > 0, "{t:?}");
    fake.set_copy_delay(Duration::ZERO);
    let c = engine("gpu_landing_lost_c", one_lane());
    c.set_gpu_runtime(rt.clone()).unwrap();
    let src = buffer(&c, Kind::Cpu, &data[..1 << 20]);
    a.register_remote_engine(&c.engine_desc()).unwrap();
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.read(gpu.desc(), 0, src.desc(), 0, 1 << 20, uid),
        "read from another peer",
    );
    assert_bytes_eq(
        &gpu.to_vec()[..1 << 20],
        &data[..1 << 20],
        "read from another peer",
    );
}

/// Between engines of one host, host memory into GPU memory is staged on the receiving side
/// (there are no device parts to offer), whether the stream rides a shared-memory ring or the
/// socket (`MORIO_SAME_HOST_RING=off` runs this suite again so): chunks of a WRITE into the
/// target's GPU and of READ data into the initiator's land as over TCP.
#[test]
fn same_host_chunks_into_gpu_memory_land_too() {
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_copy_delay(Duration::from_millis(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let cfg = cfg_with(|c| {
        c.same_host = Some(morio::SameHost::Require);
        c.num_shards = Some(1);
        c.num_data_conns = 1;
        c.same_host_chunk_bytes = 64 << 10;
        c.gpu_slot_bytes = 16 << 10;
        c.gpu_staging_bytes = 2 * 2 * (16 << 10);
    });
    let (a, b) = gpu_pair("gpu_landing_same_host", cfg, &rt);
    let n = 1 << 20;
    let data = random_big(n, 41);
    let src = buffer(&a, Kind::Cpu, &data);
    let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), "write");
    assert_bytes_eq(&dst.to_vec(), &data, "write");
    let host = buffer(&b, Kind::Cpu, &data);
    let back = buffer(&a, Kind::Gpu, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.read(back.desc(), 0, host.desc(), 0, n, uid), "read");
    assert_bytes_eq(&back.to_vec(), &data, "read");
    assert!(a.stats().unwrap().total().lane_connects_same_host > 0);
    for (e, side) in [(&b, "target"), (&a, "initiator")] {
        let t = e.stats().unwrap().total();
        assert!(t.gpu_overlapped_landings > 0, "{side}: {t:?}");
        assert_eq!(
            (t.gpu_staged_bytes, t.gpu_ipc_bytes),
            (n as u64, 0),
            "{t:?}"
        );
    }
}
