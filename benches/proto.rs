//! Hot-path micro-benchmarks of the sans-IO protocol: chunk encoding, decoding and planning.
//! Run with `cargo bench --bench proto`; CI only builds it.

use std::hint::black_box;
use std::time::Instant;

use morio::proto::access::AccessKey;
use morio::proto::decode::decode_frame;
use morio::proto::frame::{Chunk, Frame, Seg};
use morio::proto::inbound::check_chunk;
use morio::proto::plan::{cut, destination_overlaps, normalize, stripe_bytes};

fn time<F: FnMut()>(name: &str, iters: u64, mut f: F) {
    for _ in 0..iters / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    let ns = t.elapsed().as_nanos() as f64 / iters as f64;
    println!("{name:<44} {ns:>10.1} ns/iter");
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let iters = if quick { 1_000 } else { 200_000 };
    // 256 strided segments go as one run; "irregular" ones (alternating lengths) as a list.
    for (n_segs, irregular) in [(1usize, false), (256, false), (256, true)] {
        let chunk = Chunk {
            tag: 1,
            uid: 2,
            chunk: 0,
            n_chunks: 1,
            mem_id: 3,
            access_key: AccessKey::from_bytes([9; 16]),
            extent: (0, 1 << 30),
            join_lane: 0,
            segs: (0..n_segs as u64)
                .map(|i| Seg {
                    off: i * 16,
                    len: if irregular { 8 - i % 2 } else { 8 },
                })
                .collect::<Vec<_>>()
                .into(),
        };
        let frame = Frame::Write {
            chunk,
            final_: true,
        };
        let payload = frame_payload(&frame);
        let form = if irregular { "list" } else { "runs" };
        let mut buf = Vec::with_capacity(1 << 16);
        time(
            &format!("encode WRITE header, {n_segs} segs ({form})"),
            iters,
            || {
                buf.clear();
                black_box(&frame).encode(payload, &mut buf);
            },
        );
        time(
            &format!("decode WRITE header, {n_segs} segs ({form})"),
            iters,
            || {
                black_box(decode_frame(black_box(&buf)).ok());
            },
        );
        let region = Some((1u64 << 30, AccessKey::from_bytes([9; 16])));
        time(
            &format!("decode + check WRITE, {n_segs} segs ({form})"),
            iters,
            || {
                if let Ok(Some((Frame::Write { chunk, .. }, _, _))) = decode_frame(black_box(&buf))
                {
                    black_box(check_chunk(&chunk, region).is_ok());
                }
            },
        );
    }
    let strided: Vec<u64> = (0..256u64).map(|i| i * 9).collect();
    let eights = vec![8u64; 256];
    time("normalize 256 x 8 B strided", iters, || {
        black_box(normalize(&strided, &strided, &eights, 1 << 20, 1 << 20).ok());
    });
    let strided4k: Vec<u64> = (0..256u64).map(|i| i * 4097).collect();
    let fours = vec![4096u64; 256];
    time(
        "normalize + overlap + cut 256 x 4 KiB strided",
        iters / 10,
        || {
            let p = normalize(&strided4k, &strided4k, &fours, 1 << 30, 1 << 30).unwrap_or_default();
            black_box(destination_overlaps(&p, true));
            black_box(cut(&p, stripe_bytes(1 << 20, 8, 1 << 20)));
        },
    );
    let offs: Vec<u64> = (0..256u64).map(|i| i * (1 << 20)).collect();
    let sizes = vec![1u64 << 20; 256];
    time(
        "normalize + cut 256 x 1 MiB over 8 lanes",
        iters / 10,
        || {
            let p = normalize(&offs, &offs, &sizes, 1 << 40, 1 << 40).unwrap_or_default();
            black_box(cut(&p, stripe_bytes(256 << 20, 8, 1 << 20)));
        },
    );
}

fn frame_payload(f: &Frame) -> u64 {
    match f {
        Frame::Write { chunk, .. } => chunk.bytes(),
        _ => 0,
    }
}
