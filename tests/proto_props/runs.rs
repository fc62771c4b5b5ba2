//! The run form and strided layouts: a strided batch is one run on the wire, hostile runs are
//! refused before they allocate, `normalize_layout` agrees with `normalize` (pieces, extent,
//! overlaps, chunks), and strided stripes hold whole pieces.

use morio::proto::decode::{decode_frame, DecodeError};
use morio::proto::frame::{Chunk, Frame, Kind, Run, Seg, Segs, FLAG_FINAL, FLAG_RUNS};
use morio::proto::layout::{layout_chunks, layout_stripe, normalize_layout, Layout};
use morio::proto::limits::{
    CHUNK_FIXED_BYTES, FRAME_MAGIC, HEADER_BYTES, MAX_SEGS_PER_CHUNK, RUN_BYTES,
};
use morio::proto::plan::{
    cut, destination_overlaps, normalize, remote_extent, stripe_bytes, total_bytes, Piece,
};
use proptest::prelude::*;

use crate::planning::{request, Request};
use crate::strategies::{config, encoded, KEY};

#[test]
fn a_strided_batch_is_one_run_on_the_wire() {
    let segs: Vec<Seg> = (0..256u64).map(|i| Seg { off: i * 9, len: 8 }).collect();
    let c = Chunk {
        tag: 1,
        uid: 2,
        chunk: 0,
        n_chunks: 1,
        mem_id: 3,
        access_key: KEY,
        extent: (0, 256 * 9),
        join_lane: 0,
        segs: segs.into(),
    };
    let f = Frame::Write {
        chunk: c,
        final_: true,
    };
    let bytes = encoded(&f, 256 * 8);
    assert_eq!(bytes[3], FLAG_FINAL | FLAG_RUNS);
    assert_eq!(
        bytes.len(),
        HEADER_BYTES + morio::proto::limits::CHUNK_FIXED_BYTES + RUN_BYTES
    );
    let (got, payload, _) = decode_frame(&bytes).unwrap().unwrap();
    assert_eq!(got, f);
    assert_eq!(payload, 256 * 8);
    // The target gets it as one run (checked by its ends, placed in one loop), and encoding
    // it again gives the same bytes.
    let Frame::Write { chunk, .. } = &got else {
        panic!("not a write: {got:?}");
    };
    let run = Run {
        first: Seg { off: 0, len: 8 },
        count: 256,
        stride: 9,
    };
    assert!(
        matches!(chunk.segs, Segs::Run(r) if r == run),
        "{:?}",
        chunk.segs
    );
    assert_eq!(encoded(&got, 256 * 8), bytes);
}

#[test]
fn only_one_run_of_several_segments_stays_a_run() {
    let segs_of = |runs: &[(u64, u64, u32, u64)]| {
        let payload = runs.iter().map(|r| r.1 * u64::from(r.2)).sum();
        match decode_frame(&run_frame(runs, payload)) {
            Ok(Some((Frame::Write { chunk, .. }, _, _))) => chunk.segs,
            other => panic!("{runs:?}: {other:?}"),
        }
    };
    assert!(matches!(segs_of(&[(0, 8, 2, 16)]), Segs::Run(_)));
    let one = segs_of(&[(0, 8, 1, 16)]);
    assert!(
        matches!(&one, Segs::List(l) if l == &[Seg { off: 0, len: 8 }]),
        "{one:?}"
    );
    let two = segs_of(&[(0, 8, 2, 16), (100, 4, 2, 4)]);
    let want = [(0, 8), (16, 8), (100, 4), (104, 4)].map(|(off, len)| Seg { off, len });
    assert!(matches!(&two, Segs::List(l) if l == &want), "{two:?}");
}

/// A run-form chunk body with the given runs (`off`, `len`, `count`, `stride`).
fn run_frame(runs: &[(u64, u64, u32, u64)], payload: u64) -> Vec<u8> {
    let mut body = Vec::new();
    for v in [1u64, 2] {
        body.extend_from_slice(&v.to_le_bytes()); // tag, uid
    }
    for v in [0u32, 1, 3] {
        body.extend_from_slice(&v.to_le_bytes()); // chunk, n_chunks, mem_id
    }
    body.extend_from_slice(KEY.as_bytes()); // access key
    body.extend_from_slice(&0u64.to_le_bytes());
    body.extend_from_slice(&u64::MAX.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes()); // join lane
    body.extend_from_slice(&(runs.len() as u32).to_le_bytes());
    for &(off, len, count, stride) in runs {
        body.extend_from_slice(&off.to_le_bytes());
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(&count.to_le_bytes());
        body.extend_from_slice(&stride.to_le_bytes());
    }
    let mut b = Vec::new();
    b.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
    b.push(Kind::Write as u8);
    b.push(FLAG_RUNS);
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(&payload.to_le_bytes());
    b.extend_from_slice(&body);
    b
}

#[test]
fn hostile_runs_are_refused_before_they_allocate() {
    // A fine one first, so the builder is known to be right.
    assert!(decode_frame(&run_frame(&[(0, 8, 4, 16)], 32))
        .unwrap()
        .is_some());
    // More segments in all than a chunk may have, though each run is small on the wire.
    let many = [(0, 1, u32::MAX, 1), (0, 1, u32::MAX, 1)];
    assert!(matches!(
        decode_frame(&run_frame(&many, 1)),
        Err(DecodeError::BadSegCount(_))
    ));
    let over = [(0, 1, MAX_SEGS_PER_CHUNK as u32 + 1, 1)];
    assert!(matches!(
        decode_frame(&run_frame(&over, MAX_SEGS_PER_CHUNK as u64 + 1)),
        Err(DecodeError::BadSegCount(_))
    ));
    // Zero count, zero length, and a run whose last segment overflows.
    assert_eq!(
        decode_frame(&run_frame(&[(0, 8, 0, 8), (0, 8, 1, 0)], 8)),
        Err(DecodeError::BadSeg)
    );
    assert_eq!(
        decode_frame(&run_frame(&[(0, 0, 2, 8)], 0)),
        Err(DecodeError::BadSeg)
    );
    assert_eq!(
        decode_frame(&run_frame(&[(u64::MAX - 100, 8, 3, 50)], 24)),
        Err(DecodeError::BadSeg)
    );
    assert_eq!(
        decode_frame(&run_frame(&[(0, 8, 3, u64::MAX / 2)], 24)),
        Err(DecodeError::BadSeg)
    );
    // The payload must be what the runs describe.
    assert!(matches!(
        decode_frame(&run_frame(&[(0, 8, 4, 16)], 31)),
        Err(DecodeError::PayloadMismatch { .. })
    ));
    // A count that the body does not hold is truncation.
    let mut b = run_frame(&[(0, 8, 4, 16)], 32);
    // n_segs ends the fixed part of the body (after the access key, extent and join lane).
    let n_at = HEADER_BYTES + CHUNK_FIXED_BYTES - 4;
    b[n_at..n_at + 4].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(decode_frame(&b), Err(DecodeError::Truncated));
}

/// Requests of `n` equal segments at constant strides (what `normalize_layout` keeps
/// strided), sometimes with one entry nudged off the pattern, near region ends or u64::MAX.
fn strided_request() -> impl Strategy<Value = Request> {
    (
        prop_oneof![4 => 0..=4096u64, 1 => (u64::MAX - 4096)..=u64::MAX],
        0..=4096u64,
        prop_oneof![1..=64u64, Just(0u64)],
        0..=128u64,
        0..=128u64,
        1..=300usize,
        prop_oneof![3 => Just(None), 1 => (0..300usize, 1..=3u64).prop_map(Some)],
        prop_oneof![Just(u64::MAX), 0..=1u64 << 16],
    )
        .prop_map(|(l0, r0, len, ls, rs, n, nudge, size)| {
            let mut l: Vec<u64> = (0..n as u64).map(|i| l0.wrapping_add(i * ls)).collect();
            let r: Vec<u64> = (0..n as u64).map(|i| r0.wrapping_add(i * rs)).collect();
            if let Some((i, d)) = nudge {
                if let Some(x) = l.get_mut(i % n) {
                    *x = x.wrapping_add(d);
                }
            }
            (l, r, vec![len; n], size, size)
        })
}

proptest! {
    #![proptest_config(config(1024))]

    /// The strided fast path is an optimisation only: it accepts and refuses exactly what
    /// `normalize` does, with the same pieces, extent, overlap verdict and chunks.
    #[test]
    fn layouts_agree_with_normalize(
        (l, r, s, ls, rs) in prop_oneof![strided_request(), request()],
        chunk in prop_oneof![1..=64u64, Just(1u64 << 20), 8..=8192u64],
    ) {
        let want = normalize(&l, &r, &s, ls, rs);
        let got = normalize_layout(&l, &r, &s, ls, rs);
        match (got, want) {
            (Ok(layout), Ok(pieces)) => {
                prop_assert_eq!(layout.total_bytes(), total_bytes(&pieces));
                prop_assert_eq!(layout.piece_count(), pieces.len());
                prop_assert_eq!(layout.last(), pieces.last().copied());
                if !pieces.is_empty() {
                    prop_assert_eq!(layout.remote_extent(), remote_extent(&pieces));
                }
                for side in [true, false] {
                    prop_assert_eq!(
                        layout.destination_overlaps(side),
                        destination_overlaps(&pieces, side)
                    );
                }
                let each: Vec<Piece> = layout.iter().collect();
                prop_assert_eq!(&each, &pieces);
                let chunks: Vec<Vec<Piece>> = layout_chunks(layout.clone(), chunk)
                    .into_iter()
                    .map(Layout::into_pieces)
                    .collect();
                prop_assert_eq!(chunks, cut(&pieces, chunk));
                prop_assert_eq!(layout.into_pieces(), pieces);
            }
            (Err(a), Err(b)) => prop_assert_eq!(a, b),
            (a, b) => prop_assert!(false, "layout {:?}, normalize {:?}", a, b),
        }
    }
    /// A strided stripe holds whole pieces whenever a piece fits the share, stays within
    /// the cap and never makes more stripes than lanes when it rounds up; its chunks are then
    /// strided (one run each), and they still cover the transfer exactly as `cut` would.
    #[test]
    fn strided_stripes_hold_whole_pieces(
        (l, r, s, ls, rs) in strided_request(),
        n_lanes in 1..=16u64,
        cap in prop_oneof![Just(1u64 << 20), 1..=(1u64 << 16)],
    ) {
        let Ok(layout) = normalize_layout(&l, &r, &s, ls, rs) else { return Ok(()) };
        let total = layout.total_bytes();
        let plain = stripe_bytes(total, n_lanes, cap);
        let stripe = layout_stripe(&layout, n_lanes, cap);
        prop_assert!((1..=cap).contains(&stripe));
        if let Layout::Strided(st) = &layout {
            let p = st.first.len;
            if p <= plain {
                prop_assert_eq!(stripe % p, 0, "stripe {} piece {}", stripe, p);
                if stripe >= plain {
                    prop_assert!(total.div_ceil(stripe) <= total.div_ceil(plain));
                }
                let chunks = layout_chunks(layout.clone(), stripe);
                prop_assert!(chunks.iter().all(|c| matches!(c, Layout::Strided(_))));
            } else {
                prop_assert_eq!(stripe, plain);
            }
        } else {
            prop_assert_eq!(stripe, plain);
        }
        let pieces = layout.clone().into_pieces();
        let chunks: Vec<Vec<Piece>> = layout_chunks(layout, stripe)
            .into_iter()
            .map(Layout::into_pieces)
            .collect();
        prop_assert_eq!(chunks, cut(&pieces, stripe));
    }
}
