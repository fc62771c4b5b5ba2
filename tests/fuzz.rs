//! Mutation fuzzing of the target's input, on stable Rust and within a time budget, so it runs
//! in CI: byte streams grown from valid frames by bit flips, boundary values, splices, cuts
//! and repeats go through (1) the frame decoder and (2) a served connection's real decisions
//! (`proto::target::Served` with a keyed region and a capped `JoinMap`), checking that nothing
//! panics, that decoding never reads past what it was given, that a region is touched only
//! within its bounds and with its key, and that the join table stays within its caps.
//!
//! `MORIO_FUZZ_SECS` (default 3) bounds each target's time, `MORIO_FUZZ_SEED` replays a run
//! (the seed is printed; a failure prints the input in hex).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::proto::access::AccessKey;
use morio::proto::decode::decode_frame;
use morio::proto::frame::{Chunk, Finish, Frame, Hello, HelloAck, Op, Reply, Seg};
use morio::proto::join::{JoinCaps, JoinMap, JoinReport, JoinTable};
use morio::proto::limits::{HEADER_BYTES, MAX_BODY_BYTES, MAX_CHUNK_BYTES, VERSION};
use morio::proto::target::{classify, Inbound, Served};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEY: AccessKey = AccessKey::from_bytes([0x3C; 16]);
const REGION_ID: u32 = 7;
const REGION_BYTES: u64 = 1 << 20;
const CAPS: JoinCaps = JoinCaps {
    per_peer: 64,
    total: 256,
};

fn budget() -> Duration {
    let secs = std::env::var("MORIO_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

fn rng(name: &str) -> StdRng {
    let seed = std::env::var("MORIO_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("{name}: MORIO_FUZZ_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

fn encoded(f: &Frame, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    f.encode(payload.len() as u64, &mut v);
    v.extend_from_slice(payload);
    v
}

fn chunk(chunk: u32, n_chunks: u32, segs: Vec<Seg>, key: AccessKey) -> Chunk {
    let lo = segs.iter().map(|s| s.off).min().unwrap_or(0);
    let hi = segs.iter().map(|s| s.off + s.len).max().unwrap_or(0);
    Chunk {
        tag: chunk as u64 + 1,
        uid: 42,
        chunk,
        n_chunks,
        mem_id: REGION_ID,
        access_key: key,
        extent: (lo, hi),
        join_lane: if n_chunks > 1 { 1 } else { 0 },
        segs: segs.into(),
    }
}

/// Valid frames of every kind, and whole exchanges, to grow inputs from.
fn seeds() -> Vec<Vec<u8>> {
    let hello = Frame::Hello(Hello {
        version: VERSION,
        lane: 1,
        n_lanes: 4,
        src_key: "fuzzer".into(),
        dst_key: "target".into(),
        instance: 9,
        nonce: [5; 16],
        host_tag: None,
    });
    let ack = Frame::HelloAck(HelloAck {
        version: VERSION,
        code: 0,
        key: "target".into(),
        msg: String::new(),
        nonce: [6; 16],
        proof: Some([7; 32]),
        same_host: false,
    });
    let segs = |n: u64, len: u64, stride: u64| -> Vec<Seg> {
        (0..n)
            .map(|i| Seg {
                off: i * stride,
                len,
            })
            .collect()
    };
    let write = |c: Chunk, final_| {
        let payload = vec![0xAB; c.bytes() as usize];
        encoded(&Frame::Write { chunk: c, final_ }, &payload)
    };
    let read = |c: Chunk, final_| {
        encoded(
            &Frame::Read {
                chunk: c,
                final_,
                to_device: false,
            },
            &[],
        )
    };
    let reply = Reply {
        tag: 1,
        uid: 42,
        chunk: 0,
        code: 0,
        msg: "ok".into(),
    };
    let mut out = vec![
        encoded(&hello, &[]),
        encoded(&ack, &[]),
        encoded(&Frame::Auth([8; 32]), &[]),
        write(chunk(0, 1, segs(1, 64, 0), KEY), true),
        write(chunk(0, 1, segs(256, 8, 4096), KEY), true),
        write(chunk(0, 3, segs(2, 100, 1000), KEY), false),
        write(chunk(2, 3, segs(1, 10, 0), AccessKey::NONE), false),
        read(chunk(0, 1, segs(4, 16, 64), KEY), true),
        read(chunk(1, 2, segs(1, 4096, 0), KEY), false),
        encoded(
            &Frame::Finish(Finish {
                tag: 9,
                uid: 42,
                op: Op::Write,
                n_chunks: 3,
                total_bytes: 210,
                code: 15,
                msg: "gpu".into(),
            }),
            &[],
        ),
        encoded(&Frame::Complete(reply.clone()), &[]),
        encoded(
            &Frame::ReadData {
                reply,
                final_: true,
            },
            &[1, 2, 3],
        ),
        encoded(
            &Frame::GoAway {
                code: 14,
                msg: "bye".into(),
            },
            &[],
        ),
    ];
    // A whole striped write: its three chunks in order, one stream.
    let whole: Vec<u8> = (0..3)
        .flat_map(|i| write(chunk(i, 3, segs(1, 100, i as u64 * 100), KEY), false))
        .collect();
    out.push(whole);
    // A striped write's first chunk, then FINISH on two of its lanes (protocol v11), one
    // stream.
    let finish = |tag| {
        let f = Finish {
            tag,
            uid: 42,
            op: Op::Write,
            n_chunks: 3,
            total_bytes: 300,
            code: 15,
            msg: "lost".into(),
        };
        encoded(&Frame::Finish(f), &[])
    };
    let fenced = [
        write(chunk(0, 3, segs(1, 100, 0), KEY), false),
        finish(20),
        finish(21),
    ]
    .concat();
    out.push(fenced);
    out
}

const INTERESTING: [u64; 10] = [
    0,
    1,
    0x7F,
    0x80,
    0xFF,
    0xFFFF,
    0xFFFF_FFFF,
    u64::MAX,
    MAX_BODY_BYTES as u64 + 1,
    MAX_CHUNK_BYTES + 1,
];

/// One mutation of `v` (using `other` for splices).
fn mutate(rng: &mut StdRng, v: &mut Vec<u8>, other: &[u8]) {
    let len = v.len().max(1);
    match rng.gen_range(0..8) {
        0 if !v.is_empty() => {
            let i = rng.gen_range(0..v.len());
            v[i] ^= 1 << rng.gen_range(0..8);
        }
        1 if !v.is_empty() => {
            let i = rng.gen_range(0..v.len());
            v[i] = rng.gen();
        }
        2 => {
            // A boundary value over 1, 2, 4 or 8 bytes at any offset (lengths, counts).
            let w = [1usize, 2, 4, 8][rng.gen_range(0..4)];
            let x = INTERESTING[rng.gen_range(0..INTERESTING.len())].to_le_bytes();
            let at = rng.gen_range(0..len);
            for (k, b) in x.iter().take(w).enumerate() {
                if let Some(slot) = v.get_mut(at + k) {
                    *slot = *b;
                }
            }
        }
        3 => {
            let at = rng.gen_range(0..=v.len());
            let n = rng.gen_range(1..64);
            let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            v.splice(at..at, bytes);
        }
        4 if !v.is_empty() => {
            let a = rng.gen_range(0..v.len());
            let b = rng.gen_range(a..=v.len().min(a + 256));
            v.drain(a..b);
        }
        5 if !v.is_empty() => {
            let a = rng.gen_range(0..v.len());
            let b = rng.gen_range(a..=v.len().min(a + 512));
            let dup = v[a..b].to_vec();
            v.splice(b..b, dup);
        }
        6 => {
            let at = rng.gen_range(0..=v.len());
            let from = rng.gen_range(0..=other.len());
            v.splice(at..at, other[from..].iter().copied());
        }
        _ => {
            let at = rng.gen_range(0..=v.len());
            v.truncate(at);
        }
    }
    v.truncate(256 << 10);
}

/// Run `target` over inputs grown from the seeds until the budget is spent.
fn fuzz(name: &str, target: impl Fn(&[u8])) {
    let mut rng = rng(name);
    let seeds = seeds();
    let t0 = Instant::now();
    let mut runs = 0u64;
    while t0.elapsed() < budget() {
        let mut v = seeds[rng.gen_range(0..seeds.len())].clone();
        let other = &seeds[rng.gen_range(0..seeds.len())];
        for _ in 0..rng.gen_range(1..8) {
            mutate(&mut rng, &mut v, other);
        }
        let input = v.clone();
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(&input)));
        if ok.is_err() {
            let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
            panic!("{name}: failed on input ({} bytes): {hex}", input.len());
        }
        runs += 1;
    }
    println!("{name}: {runs} inputs in {:?}", t0.elapsed());
    assert!(runs > 100, "{name}: only {runs} inputs ran");
}

/// Decode frame after frame, skipping payloads, as a connection's reader does.
fn decode_stream(mut buf: &[u8]) {
    loop {
        match decode_frame(buf) {
            Ok(Some((_, payload, used))) => {
                assert!(used >= HEADER_BYTES && used <= buf.len());
                assert!(payload <= MAX_CHUNK_BYTES);
                let skip = used.saturating_add(payload as usize).min(buf.len());
                buf = &buf[skip..];
            }
            Ok(None) => {
                assert!(buf.len() < HEADER_BYTES + MAX_BODY_BYTES);
                return;
            }
            Err(_) => return,
        }
    }
}

#[test]
fn fuzz_the_frame_decoder() {
    fuzz("decoder", decode_stream);
}

/// The join table behind a `RefCell`, as the engine's is behind its lock.
struct Table(RefCell<JoinMap>);

impl JoinTable for Table {
    fn report(&self, r: &JoinReport<'_>) -> Option<(u32, String)> {
        self.0.borrow_mut().report(r, 0)
    }
    fn end(&self, peer: &Arc<str>, instance: u64, uid: u64, op: Op, n_chunks: u32) -> bool {
        self.0
            .borrow_mut()
            .end((peer.clone(), instance, uid), op, n_chunks, 0)
    }
}

/// A served connection's decisions over a byte stream: decode, classify, check against one
/// keyed region, "place" or "send" (bounds asserted), report to the join table.
fn serve_stream(mut buf: &[u8]) {
    let served = Served {
        peer: "fuzzer".into(),
        instance: 9,
        lane: 1,
        n_lanes: 4,
    };
    let joins = Table(RefCell::new(JoinMap::new(CAPS)));
    let region = |id: u32| (id == REGION_ID).then_some((REGION_BYTES, KEY));
    // Transfers a FINISH has ended: a later FINISH for one (protocol v11: one per lane) is
    // answered and may record nothing.
    let mut finished = std::collections::HashSet::new();
    while let Ok(Some((frame, payload, used))) = decode_frame(buf) {
        let skip = used.saturating_add(payload as usize).min(buf.len());
        buf = &buf[skip..];
        let Ok(inbound) = classify(frame) else { return };
        let (chunk, final_, is_write) = match inbound {
            Inbound::Write(c, f) => (c, f, true),
            Inbound::Read(c, f, _) => (c, f, false),
            Inbound::Finish(f) => {
                let first = finished.insert(f.uid);
                let r = served.finish(f, &joins);
                assert!(r.reply.is_some());
                assert!(r.record.is_some() || !first, "the first FINISH records");
                continue;
            }
        };
        let Ok(checked) = served.check(&chunk, final_, region(chunk.mem_id)) else {
            return; // The connection closes.
        };
        let (code, msg) = match checked {
            Ok(()) => {
                // Only the keyed region, only within it.
                assert_eq!((chunk.mem_id, chunk.access_key), (REGION_ID, KEY));
                for s in &chunk.segs {
                    assert!(s.off.checked_add(s.len).is_some_and(|e| e <= REGION_BYTES));
                }
                (0, String::new())
            }
            Err(refusal) => (refusal.code, refusal.msg.to_string()),
        };
        let r = if is_write {
            served.write_done(&chunk, final_, code, msg, &joins)
        } else {
            let (_, frame) = served.read_reply(&chunk, final_, code, msg.clone());
            assert!(matches!(frame, Frame::ReadData { .. }));
            served.read_done(&chunk, final_, code, msg, &joins)
        };
        assert_eq!(r.record.is_some(), r.reply.is_some());
        let t = joins.0.borrow();
        let (mine, _) = t.slots("fuzzer");
        assert!(mine <= CAPS.per_peer, "{mine} join slots held");
    }
}

#[test]
fn fuzz_the_targets_frame_handling() {
    fuzz("target", serve_stream);
}

#[test]
fn the_seeds_are_valid_and_served() {
    for s in seeds() {
        assert!(matches!(decode_frame(&s), Ok(Some(_))), "{s:?}");
        serve_stream(&s);
    }
}
