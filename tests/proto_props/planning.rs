//! Transfer planning: `normalize` checks requests and keeps their byte mapping with maximal
//! merging, remote extents and overlap verdicts match the bytes, `cut` partitions the stream
//! greedily (at the byte and the piece limit), and `stripe_bytes` stays within its bounds.

use std::collections::HashSet;

use morio::proto::limits::{MAX_SEGS_PER_CHUNK, MIN_STRIPE_BYTES};
use morio::proto::plan::{
    cut, destination_overlaps, normalize, remote_extent, stripe_bytes, total_bytes, Piece,
    PlanError,
};
use proptest::prelude::*;

use crate::strategies::config;

/// `(local, remote)` byte pairs of a piece list, in logical stream order.
fn pairs(pieces: &[Piece]) -> Vec<(u64, u64)> {
    pieces
        .iter()
        .flat_map(|p| (0..p.len).map(move |i| (p.local + i, p.remote + i)))
        .collect()
}

fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 0..=80u64, 1 => (u64::MAX - 24)..=u64::MAX]
}

fn region_size() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 0..=64u64, 1 => Just(u64::MAX), 1 => (u64::MAX - 40)..=u64::MAX]
}

/// (local offs, remote offs, sizes, local size, remote size), lists usually of equal length.
pub type Request = (Vec<u64>, Vec<u64>, Vec<u64>, u64, u64);

/// Arbitrary requests: mostly out of range for small regions, sometimes overflowing.
fn random_request() -> impl Strategy<Value = Request> {
    (
        proptest::collection::vec(
            (offset(), offset(), prop_oneof![Just(0u64), 0..=20u64]),
            0..12,
        ),
        region_size(),
        region_size(),
    )
        .prop_map(|(entries, ls, rs)| {
            let l = entries.iter().map(|e| e.0).collect();
            let r = entries.iter().map(|e| e.1).collect();
            let s = entries.iter().map(|e| e.2).collect();
            (l, r, s, ls, rs)
        })
}

/// Requests whose entries fit both regions (some empty, some continuing the previous one on
/// both sides, some on one side only), in small or huge regions.
fn valid_request() -> impl Strategy<Value = Request> {
    (
        prop_oneof![3 => 1..=64u64, 1 => Just(u64::MAX)],
        prop_oneof![3 => 1..=64u64, 1 => Just(u64::MAX)],
        proptest::collection::vec((any::<u64>(), any::<u64>(), 0..=16u64, 0..4u8), 0..12),
    )
        .prop_map(|(ls, rs, raw)| {
            let (mut l, mut r, mut s) = (Vec::new(), Vec::new(), Vec::new());
            let mut prev: Option<(u64, u64)> = None; // ends of the previous non-empty entry
            for (a, b, len, how) in raw {
                let (mut lo, mut ro) = (a % ls, b % rs);
                match (how, prev) {
                    (1, Some((pl, pr))) => (lo, ro) = (pl, pr),
                    (2, Some((pl, _))) => lo = pl,
                    (3, Some((_, pr))) => ro = pr,
                    _ => {}
                }
                let len = len.min(ls - lo.min(ls)).min(rs - ro.min(rs));
                l.push(lo);
                r.push(ro);
                s.push(len);
                if len > 0 {
                    prev = Some((lo + len, ro + len));
                }
            }
            (l, r, s, ls, rs)
        })
}

/// Random or valid requests, sometimes with list lengths that disagree.
pub fn request() -> impl Strategy<Value = Request> {
    (
        prop_oneof![random_request(), valid_request()],
        prop_oneof![8 => Just(0u8), 1 => 1..=3u8],
    )
        .prop_map(|((mut l, mut r, mut s, ls, rs), skew)| {
            match skew {
                1 => l.push(0),
                2 => {
                    r.pop();
                }
                3 => s.push(1),
                _ => {}
            }
            (l, r, s, ls, rs)
        })
}

/// Errors `normalize` may legitimately return for one entry, or empty when it is fine.
fn entry_errors(l: u64, r: u64, len: u64, ls: u64, rs: u64) -> Vec<PlanError> {
    if len == 0 {
        return vec![];
    }
    let mut errs = vec![];
    match (l.checked_add(len), r.checked_add(len)) {
        (Some(le), Some(re)) => {
            if le > ls {
                errs.push(PlanError::LocalOutOfRange);
            }
            if re > rs {
                errs.push(PlanError::RemoteOutOfRange);
            }
        }
        (le, re) => {
            errs.push(PlanError::Overflow);
            // An overflowing end is also past any region.
            if le.is_none_or(|e| e > ls) {
                errs.push(PlanError::LocalOutOfRange);
            }
            if re.is_none_or(|e| e > rs) {
                errs.push(PlanError::RemoteOutOfRange);
            }
        }
    }
    errs
}

fn normalized_pieces() -> impl Strategy<Value = Vec<Piece>> {
    valid_request().prop_map(|(l, r, s, ls, rs)| {
        normalize(&l, &r, &s, ls, rs).expect("valid_request builds valid requests")
    })
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn normalize_checks_and_preserves_mapping((l, r, s, ls, rs) in request()) {
        let res = normalize(&l, &r, &s, ls, rs);
        if l.len() != s.len() || r.len() != s.len() {
            prop_assert_eq!(res, Err(PlanError::LengthMismatch));
            return Ok(());
        }
        let first_bad = (0..s.len())
            .map(|i| entry_errors(l[i], r[i], s[i], ls, rs))
            .find(|e| !e.is_empty());
        match (res, first_bad) {
            (Err(e), Some(allowed)) => {
                prop_assert!(allowed.contains(&e), "got {:?}, first bad entry allows {:?}", e, allowed);
            }
            (Err(e), None) => prop_assert!(false, "valid request refused with {:?}", e),
            (Ok(p), Some(allowed)) => {
                prop_assert!(false, "invalid request ({:?}) accepted as {:?}", allowed, p)
            }
            (Ok(pieces), None) => {
                let want: Vec<(u64, u64)> = (0..s.len())
                    .flat_map(|i| {
 let (li, ri) = (l[i], r[i]);
 (0..s[i]).map(move |k| (li + k, ri + k))
 })
                    .collect();
                prop_assert_eq!(pairs(&pieces), want);
                prop_assert!(pieces.iter().all(|p| p.len > 0));
                prop_assert!(pieces.iter().all(|p| p.local + p.len <= ls && p.remote + p.len <= rs));
                prop_assert_eq!(total_bytes(&pieces), s.iter().sum::<u64>());
                // Maximal merging: no piece continues the previous one on both sides.
                for w in pieces.windows(2) {
                    prop_assert!(
                        !(w[0].local + w[0].len == w[1].local && w[0].remote + w[0].len == w[1].remote),
                        "unmerged continuation {:?}", w
                    );
                }
            }
        }
    }

    #[test]
    fn extent_and_overlap_match_bytes(pieces in normalized_pieces()) {
        let pr = pairs(&pieces);
        let ext = remote_extent(&pieces);
        if pr.is_empty() {
            prop_assert_eq!(ext, (0, 0));
        } else {
            let lo = pr.iter().map(|p| p.1).min().unwrap();
            let hi = pr.iter().map(|p| p.1).max().unwrap() + 1;
            prop_assert_eq!(ext, (lo, hi));
        }
        let remote_dup = pr.iter().map(|p| p.1).collect::<HashSet<_>>().len() != pr.len();
        let local_dup = pr.iter().map(|p| p.0).collect::<HashSet<_>>().len() != pr.len();
        prop_assert_eq!(destination_overlaps(&pieces, true), remote_dup);
        prop_assert_eq!(destination_overlaps(&pieces, false), local_dup);
    }

    #[test]
    fn cut_partitions_the_stream(
        pieces in normalized_pieces(),
        chunk_bytes in prop_oneof![1..=8u64, 1..=64u64, Just(u64::MAX)],
    ) {
        let chunks = cut(&pieces, chunk_bytes);
        let total = total_bytes(&pieces);
        prop_assert_eq!(chunks.is_empty(), total == 0);
        let mut flat = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            prop_assert!(!c.is_empty(), "empty chunk {}", i);
            prop_assert!(c.len() <= MAX_SEGS_PER_CHUNK);
            prop_assert!(c.iter().all(|p| p.len > 0), "zero-length piece in chunk {}", i);
            let b = total_bytes(c);
            prop_assert!(b <= chunk_bytes);
            // Greedy: every chunk but the last is full (bytes or pieces).
            if i + 1 < chunks.len() {
                prop_assert!(b == chunk_bytes || c.len() == MAX_SEGS_PER_CHUNK);
            }
            flat.extend(pairs(c));
        }
        prop_assert_eq!(flat, pairs(&pieces));
        if total > 0 {
            prop_assert_eq!(chunks.len() as u64, total.div_ceil(chunk_bytes));
        }
    }

    #[test]
    fn stripe_bytes_bounds(
        total in prop_oneof![0..=(1u64 << 24), any::<u64>()],
        n_lanes in 0..=64u64,
        chunk_bytes in prop_oneof![1..=4096u64, 1..=(1u64 << 30), any::<u64>().prop_map(|v| v.max(1))],
    ) {
        let s = stripe_bytes(total, n_lanes, chunk_bytes);
        prop_assert!((1..=chunk_bytes).contains(&s), "stripe {} cap {}", s, chunk_bytes);
        prop_assert!(s >= MIN_STRIPE_BYTES.min(chunk_bytes));
        // Unless capped, n_lanes stripes cover the transfer.
        prop_assert!(s == chunk_bytes || s >= total.div_ceil(n_lanes.max(1)));
    }
}

#[test]
fn cut_splits_at_the_piece_limit() {
    // Non-mergeable one-byte pieces: only the piece limit cuts.
    let n = 2 * MAX_SEGS_PER_CHUNK + 5;
    let pieces: Vec<Piece> = (0..n as u64)
        .map(|i| Piece {
            local: 2 * i,
            remote: 3 * i,
            len: 1,
        })
        .collect();
    let chunks = cut(&pieces, 1 << 40);
    let sizes: Vec<usize> = chunks.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![MAX_SEGS_PER_CHUNK, MAX_SEGS_PER_CHUNK, 5]);
    assert_eq!(chunks.concat(), pieces);
    // chunk_bytes 0 is treated as 1.
    assert_eq!(cut(&pieces[..3], 0).len(), 3);
}
