//! Target-side checks of a chunk against the local region before a byte is placed or sent.

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

/// Check `chunk` against the target region's size (`None`: no region with that id).
///
/// Every chunk of a transfer carries the transfer's whole extent, so a transfer that reaches
/// past the region is refused by every chunk: zero bytes are written.
pub fn check_chunk(chunk: &Chunk, region_size: Option<u64>) -> Result<(), Refusal> {
    let Some(size) = region_size else {
        return Err(Refusal {
            code: codes::ERR_NOT_FOUND,
            msg: "remote memory region not registered",
        });
    };
    let (lo, hi) = chunk.extent;
    if lo > hi || hi > size {
        return Err(Refusal {
            code: codes::ERR_INVALID_ARGS,
            msg: "transfer range outside the remote memory region",
        });
    }
    for s in &chunk.segs {
        if s.off < lo || s.off.checked_add(s.len).is_none_or(|end| end > hi) {
            return Err(Refusal {
                code: codes::ERR_INVALID_ARGS,
                msg: "segment outside the transfer's declared extent",
            });
        }
    }
    Ok(())
}
