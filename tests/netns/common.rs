//! What the netns tests share: engines that always go over the link, buffers of known bytes,
//! waiting on a status (at most a minute), and a verified round trip of every transfer shape.

use std::time::Duration;

use morio::{IoEngine, RegisteredBuffer, SameHost, StatusCode, TcpBackendConfig, TransferStatus};

/// Over the link, never through the same-host transport (both namespaces are on one host).
pub fn cfg(op_timeout: Duration) -> TcpBackendConfig {
    TcpBackendConfig {
        num_shards: Some(2),
        num_data_conns: 4,
        pin_shards: false,
        op_timeout,
        same_host: Some(SameHost::Off),
        ..Default::default()
    }
}

pub fn filled(e: &IoEngine, n: usize, seed: u64) -> RegisteredBuffer {
    let b = e.alloc_buffer(n).unwrap();
    let bytes: Vec<u8> = (0..n as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9) >> 7) as u8 ^ seed as u8)
        .collect();
    b.write_at(0, &bytes);
    b
}

pub fn wait(st: &TransferStatus, what: &str) -> StatusCode {
    let code = st.wait_for(Duration::from_secs(60));
    assert_ne!(
        code,
        StatusCode::InProgress,
        "{what}: still in progress after 60 s"
    );
    code
}

pub fn ok(st: &TransferStatus, what: &str) {
    assert_eq!(
        wait(st, what),
        StatusCode::Success,
        "{what}: {}",
        st.message()
    );
}

/// A small (express), a striped and a batched write from `a` to `b` and reads back, each
/// verified.
pub fn round_trips(a: &IoEngine, b: &IoEngine, seed: u64) {
    let n = 24 << 20;
    let src = filled(a, n, seed);
    let dst = b.alloc_buffer(n).unwrap();
    let back = a.alloc_buffer(n).unwrap();
    for len in [8usize, 4096, 300 << 10, 16 << 20] {
        let uid = a.allocate_transfer_uid();
        ok(&a.write(src.desc(), 0, dst.desc(), 0, len, uid), "write");
        let uid = a.allocate_transfer_uid();
        ok(&a.read(back.desc(), 0, dst.desc(), 0, len, uid), "read");
        assert!(
            back.to_vec()[..len] == src.to_vec()[..len],
            "{len} bytes read back differ"
        );
    }
    let offs: Vec<usize> = (0..256).map(|i| i * 8192).collect();
    let sizes = vec![4096; 256];
    let uid = a.allocate_transfer_uid();
    let sts = a.batch_write(
        &[src.desc().clone()],
        std::slice::from_ref(&offs),
        &[dst.desc().clone()],
        std::slice::from_ref(&offs),
        &[sizes],
        &[uid],
    );
    ok(&sts[0], "batch of 256 x 4 KiB");
    let (s, d) = (src.to_vec(), dst.to_vec());
    for &o in &offs {
        assert!(s[o..o + 4096] == d[o..o + 4096], "batch piece at {o}");
    }
}
