//! Failure cases, one module per concern: argument errors and bad remote memory at
//! submission (`submission`), peers that die, reset or are deregistered (`peer_loss`), peers
//! that never answer (`timeouts`), deregistering memory (`deregistration`), dropping engines
//! (`engine_drop`) and `wait_all` over real failures (`wait_all`); hostile clients on the
//! listening port, built with the raw-frame tools of `raw`, are in `handshake`, `frames`,
//! `access_keys` and `bounded_state`. What several of them share is here.

mod access_keys;
mod bounded_state;
mod deregistration;
mod engine_drop;
mod frames;
mod handshake;
mod peer_loss;
pub(crate) mod raw;
mod submission;
mod timeouts;
mod wait_all;

use std::time::{Duration, Instant};

use morio::RegisteredBuffer;

const MIB: usize = 1 << 20;

/// Poll `cond` (a memory probe, where no status can tell) until it holds, at most `limit`.
#[track_caller]
fn poll_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < limit, "{what}: not after {limit:?}");
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Whether the last byte of any of the first eight 1 MiB stripes of `buf` holds `v`.
fn some_stripe_landed(buf: &RegisteredBuffer, v: u8) -> bool {
    (0..8).any(|k| {
        let mut b = [0u8];
        buf.read_at(k * MIB + MIB - 1, &mut b);
        b[0] == v
    })
}
