//! What the etcd tests share besides etcd itself: engines on loopback, filled buffers, a
//! write to a region found through discovery, temporary directories, and time bounds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use morio::discovery::Discovery;
use morio::{IoEngine, IoEngineConfig, RegisteredBuffer, StatusCode, TcpBackendConfig};

pub fn engine(key: &str) -> IoEngine {
    engine_at(key, "127.0.0.1")
}

pub fn engine_at(key: &str, host: &str) -> IoEngine {
    let e = IoEngine::new(key, IoEngineConfig::new(host, 0)).unwrap();
    e.create_backend(TcpBackendConfig {
        num_shards: Some(2),
        pin_shards: false,
        op_timeout: Duration::from_secs(10),
        ..Default::default()
    })
    .unwrap();
    e
}

pub fn filled(e: &IoEngine, n: usize, seed: u8) -> RegisteredBuffer {
    let b = e.alloc_buffer(n).unwrap();
    let bytes: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
    b.write_at(0, &bytes);
    b
}

/// Write `n` bytes from `src` into `remote`'s region published as `kv` by engine `key`
/// (looked up in etcd) and return the status code.
pub fn write_to(d: &Discovery, me: &IoEngine, src: &RegisteredBuffer, key: &str) -> StatusCode {
    let regions = d.regions(key).unwrap();
    let (_, dst) = regions.iter().find(|(n, _)| n == "kv").expect("kv region");
    let st = me.write(src.desc(), 0, dst, 0, src.len(), me.allocate_transfer_uid());
    st.wait_for(Duration::from_secs(10));
    st.code()
}

/// A directory of this test's own, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!(
            "morio-etcd-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `f` returns within `bound`.
pub fn within<T>(bound: Duration, f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let r = f();
    assert!(t0.elapsed() < bound, "took {:?}", t0.elapsed());
    r
}

pub fn s(p: &Path) -> String {
    p.display().to_string()
}
