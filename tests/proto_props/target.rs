//! The target's `check_chunk`: chunks inside their region with its key are accepted; a wrong
//! or missing key is refused like an unknown region; extents past the region, inverted
//! extents and segments outside the extent are invalid arguments.

use morio::proto::access::AccessKey;
use morio::proto::codes::{ERR_INVALID_ARGS, ERR_NOT_FOUND};
use morio::proto::frame::{Chunk, Seg};
use morio::proto::inbound::{check_chunk, NOT_REGISTERED};
use morio::proto::limits::ACCESS_KEY_BYTES;
use proptest::prelude::*;

use crate::strategies::{access_key, config};

/// A region size and key, and a chunk carrying that key whose extent lies within the region
/// and whose segments lie within the extent.
fn good_chunk() -> impl Strategy<Value = (u64, AccessKey, Chunk)> {
    prop_oneof![1..=4096u64, 1..=(1u64 << 40), Just(u64::MAX)]
        .prop_flat_map(|size| (Just(size), 0..size))
        .prop_flat_map(|(size, lo)| (Just(size), Just(lo), (lo + 1)..=size))
        .prop_flat_map(|(size, lo, hi)| {
            let seg = (lo..hi).prop_flat_map(move |off| (Just(off), 1..=(hi - off)));
            (
                Just(size),
                Just((lo, hi)),
                proptest::collection::vec(seg, 1..6),
                any::<u32>(),
                access_key().prop_filter("a region's key is never none", |k| !k.is_none()),
            )
        })
        .prop_map(|(size, extent, segs, mem_id, key)| {
            (
                size,
                key,
                Chunk {
                    tag: 1,
                    uid: 2,
                    chunk: 0,
                    n_chunks: 1,
                    mem_id,
                    access_key: key,
                    extent,
                    join_lane: 0,
                    segs: segs
                        .into_iter()
                        .map(|(off, len)| Seg { off, len })
                        .collect(),
                },
            )
        })
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn check_chunk_accepts_contained((size, key, c) in good_chunk()) {
        prop_assert_eq!(check_chunk(&c, Some((size, key))), Ok(()));
        prop_assert_eq!(check_chunk(&c, None), Err(NOT_REGISTERED));
        prop_assert_eq!(NOT_REGISTERED.code, ERR_NOT_FOUND);
    }

    /// A chunk without the region's key is refused exactly like one for an unknown region,
    /// whatever else is wrong with it, and so is any chunk for a local-only region (no key).
    #[test]
    fn check_chunk_refuses_a_wrong_key_like_an_unknown_region(
        (size, key, mut c) in good_chunk(),
        other in access_key(),
        flip in (0..ACCESS_KEY_BYTES, 0..8u32),
        past_end in any::<bool>(),
    ) {
        if past_end {
            // With the right key this would be ERR_INVALID_ARGS: the key is checked first.
            c.extent.1 = c.extent.1.saturating_add(1).max(size.saturating_add(1));
        }
        let mut flipped = key.to_bytes();
        flipped[flip.0] ^= 1 << flip.1;
        for presented in [other, AccessKey::from_bytes(flipped), AccessKey::NONE] {
            if presented == key {
                continue;
            }
            c.access_key = presented;
            prop_assert_eq!(check_chunk(&c, Some((size, key))), Err(NOT_REGISTERED));
        }
        c.access_key = key;
        prop_assert_eq!(check_chunk(&c, Some((size, AccessKey::NONE))), Err(NOT_REGISTERED));
        c.access_key = AccessKey::NONE;
        prop_assert_eq!(check_chunk(&c, Some((size, AccessKey::NONE))), Err(NOT_REGISTERED));
    }

    #[test]
    fn check_chunk_refuses_extent_past_region(
        (size, key, c) in good_chunk(),
        cut_by in 1..=64u64,
    ) {
        // Shrink the region below the extent's end.
        let smaller = c.extent.1.saturating_sub(cut_by);
        let e = check_chunk(&c, Some((smaller, key))).unwrap_err();
        prop_assert_eq!(e.code, ERR_INVALID_ARGS);
        prop_assert!(!e.msg.is_empty());
        prop_assert!(size >= c.extent.1);
        // Unknown region wins over range problems.
        prop_assert_eq!(check_chunk(&c, None).unwrap_err().code, ERR_NOT_FOUND);
    }

    #[test]
    fn check_chunk_refuses_inverted_extent((size, key, mut c) in good_chunk()) {
        c.extent = (c.extent.1, c.extent.0);
        prop_assert_eq!(check_chunk(&c, Some((size, key))).unwrap_err().code, ERR_INVALID_ARGS);
    }

    #[test]
    fn check_chunk_refuses_segment_outside_extent(
        (size, key, mut c) in good_chunk(),
        which in any::<prop::sample::Index>(),
        before in any::<bool>(),
        by in 1..=64u64,
    ) {
        let (lo, hi) = c.extent;
        let i = which.index(c.segs.len());
        let mut segs = c.segs.to_vec();
        let s = &mut segs[i];
        if before && lo > 0 {
            // Start below the extent (keep the end inside).
            s.off = lo.saturating_sub(by);
        } else if hi < u64::MAX {
            // End past the extent (keep the segment from overflowing).
            s.len = (hi - s.off).saturating_add(by).min(u64::MAX - s.off);
        } else {
            s.off = lo.saturating_sub(by);
            if s.off == lo {
                return Ok(()); // extent covers all of u64 space from 0: nothing is outside
            }
        }
        prop_assert!(s.off < lo || s.off + s.len > hi);
        c.segs = segs.into();
        let e = check_chunk(&c, Some((size, key))).unwrap_err();
        prop_assert_eq!(e.code, ERR_INVALID_ARGS);
    }
}
