//! Helpers: engine pairs on 127.0.0.1, random buffers, waiting with a bound.

use std::time::Duration;

use morio::{IoEngine, IoEngineConfig, RegisteredBuffer, StatusCode, TcpBackendConfig, TransferStatus};
use rand::{Rng, SeedableRng};

/// A small config for tests: 2 shards, unpinned (many engines share this machine).
pub fn test_cfg() -> TcpBackendConfig {
    TcpBackendConfig {
        num_shards: Some(2),
        pin_shards: false,
        op_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

pub fn engine(key: &str, cfg: TcpBackendConfig) -> IoEngine {
    let e = IoEngine::new(key, IoEngineConfig::new("127.0.0.1", 0)).expect("engine");
    e.create_backend(cfg).expect("backend");
    e
}

/// Two engines `{prefix}_a` and `{prefix}_b`, each registered with the other.
pub fn pair(prefix: &str, cfg: TcpBackendConfig) -> (IoEngine, IoEngine) {
    let a = engine(&format!("{prefix}_a"), cfg.clone());
    let b = engine(&format!("{prefix}_b"), cfg);
    a.register_remote_engine(&b.engine_desc()).unwrap();
    b.register_remote_engine(&a.engine_desc()).unwrap();
    (a, b)
}

pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; n];
    rng.fill(&mut v[..]);
    v
}

pub fn random_buffer(e: &IoEngine, n: usize, seed: u64) -> RegisteredBuffer {
    e.register_buffer(random_bytes(n, seed)).unwrap()
}

/// Wait (bounded) and return the final code.
pub fn wait(s: &TransferStatus) -> StatusCode {
    let c = s.wait_for(Duration::from_secs(60));
    assert_ne!(c, StatusCode::InProgress, "transfer did not finish in 60 s");
    c
}

/// Wait for the target's inbound status of `uid` from `key` (it exists before the
/// initiator's SUCCESS, so no retry loop is needed: one pop must find it).
pub fn inbound(e: &IoEngine, key: &str, uid: u64) -> StatusCode {
    e.pop_inbound_transfer_status(key, uid).map(|s| s.code()).expect("inbound status recorded")
}
