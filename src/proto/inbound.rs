//! Target-side checks of a chunk against the local region before a byte is placed or sent:
//! the region exists and grants the chunk's access key, then the chunk's ranges fit it.

use super::access::AccessKey;
use super::codes;
use super::frame::Chunk;

/// Why a chunk is refused; the refusal is answered with this code and message, and the
/// chunk's payload (if any) is drained without touching memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Wire status code.
    pub code: u32,
    /// Reason.
    pub msg: &'static str,
}

/// The refusal of a chunk whose region is not registered here, is local-only, or whose
/// access key it does not carry: one answer for all three, so a peer cannot tell a wrong key
/// from a wrong id.
pub const NOT_REGISTERED: Refusal = Refusal {
    code: codes::ERR_NOT_FOUND,
    msg: "remote memory region not registered",
};

/// Check `chunk` against the target region, given as its size and access key (`None`: no
/// region with that id).
///
/// The key is checked first, in constant time ([`AccessKey::grants`]): a chunk without the
/// region's key (a wrong key, the zero key, or any key for a local-only region, whose key is
/// zero) is refused exactly like one naming an unknown region ([`NOT_REGISTERED`]), before
/// any range check could tell it the region's size.
///
/// Every chunk of a transfer carries the transfer's whole extent, so a transfer that reaches
/// past the region is refused by every chunk: zero bytes are written.
pub fn check_chunk(chunk: &Chunk, region: Option<(u64, AccessKey)>) -> Result<(), Refusal> {
    // An unknown id is compared against the zero key, which grants nothing, so both paths
    // run the same comparison.
    let (size, key) = region.unwrap_or((0, AccessKey::NONE));
    if !key.grants(&chunk.access_key) {
        return Err(NOT_REGISTERED);
    }
    let (lo, hi) = chunk.extent;
    if lo > hi || hi > size {
        return Err(Refusal {
            code: codes::ERR_INVALID_ARGS,
            msg: "transfer range outside the remote memory region",
        });
    }
    if !chunk.segs.within(lo, hi) {
        return Err(Refusal {
            code: codes::ERR_INVALID_ARGS,
            msg: "segment outside the transfer's declared extent",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::frame::Seg;

    fn key(b: u8) -> AccessKey {
        AccessKey::from_bytes([b; 16])
    }

    fn chunk(access_key: AccessKey, extent: (u64, u64)) -> Chunk {
        Chunk {
            tag: 1,
            uid: 2,
            chunk: 0,
            n_chunks: 1,
            mem_id: 3,
            access_key,
            extent,
            join_lane: 0,
            segs: vec![Seg { off: 0, len: 8 }].into(),
        }
    }

    #[test]
    fn the_key_is_checked_before_the_ranges_and_refused_like_an_unknown_region() {
        let good = chunk(key(9), (0, 8));
        assert_eq!(check_chunk(&good, Some((64, key(9)))), Ok(()));
        for presented in [key(8), AccessKey::NONE] {
            let c = chunk(presented, (0, 8));
            assert_eq!(check_chunk(&c, Some((64, key(9)))), Err(NOT_REGISTERED));
        }
        assert_eq!(check_chunk(&good, None), Err(NOT_REGISTERED));
        // A local-only region (zero key) is refused even to a chunk presenting zero.
        let zero = chunk(AccessKey::NONE, (0, 8));
        assert_eq!(
            check_chunk(&zero, Some((64, AccessKey::NONE))),
            Err(NOT_REGISTERED)
        );
        // A wrong key past the region's end learns nothing about its size.
        let far = chunk(key(8), (0, 1 << 40));
        assert_eq!(check_chunk(&far, Some((64, key(9)))), Err(NOT_REGISTERED));
        let far = chunk(key(9), (0, 1 << 40));
        assert_eq!(
            check_chunk(&far, Some((64, key(9)))).unwrap_err().code,
            codes::ERR_INVALID_ARGS
        );
    }
}
