//! Transfer planning: normalise a request's segments, cut them into chunks, size stripes.
//!
//! A transfer is a list of [`Piece`]s (local offset, remote offset, length). Its *logical byte
//! stream* is the concatenation of the pieces in order. Chunks are consecutive ranges of that
//! stream, cut at `chunk_bytes` and at [`MAX_SEGS_PER_CHUNK`] pieces, so every byte belongs to
//! exactly one chunk (property-tested).

use super::limits::{MAX_SEGS_PER_CHUNK, MIN_STRIPE_BYTES, SHARE_MIN_CHUNKS_PER_LANE};

/// One contiguous piece of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Offset in the local region.
    pub local: u64,
    /// Offset in the remote region.
    pub remote: u64,
    /// Length in bytes (never zero after [`normalize`]).
    pub len: u64,
}

/// Why a request cannot be planned (all map to `ERR_INVALID_ARGS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The offset and size lists differ in length.
    #[error("batch vector size mismatch")]
    LengthMismatch,
    /// A segment reaches past the local region.
    #[error("local offset+size out of range")]
    LocalOutOfRange,
    /// A segment reaches past the remote region.
    #[error("remote offset+size out of range")]
    RemoteOutOfRange,
    /// Offsets or the total length overflow u64.
    #[error("offset+size overflows")]
    Overflow,
}

/// Check and normalise a request: drop empty entries, check every range against both region
/// sizes (overflow-safe), and merge entries that continue the previous one on both sides.
pub fn normalize(
    local_offs: &[u64],
    remote_offs: &[u64],
    sizes: &[u64],
    local_size: u64,
    remote_size: u64,
) -> Result<Vec<Piece>, PlanError> {
    if local_offs.len() != sizes.len() || remote_offs.len() != sizes.len() {
        return Err(PlanError::LengthMismatch);
    }
    let mut out: Vec<Piece> = Vec::with_capacity(sizes.len());
    let mut total = 0u64;
    for ((&l, &r), &len) in local_offs.iter().zip(remote_offs).zip(sizes) {
        if len == 0 {
            continue;
        }
        let l_end = l.checked_add(len).ok_or(PlanError::Overflow)?;
        let r_end = r.checked_add(len).ok_or(PlanError::Overflow)?;
        if l_end > local_size {
            return Err(PlanError::LocalOutOfRange);
        }
        if r_end > remote_size {
            return Err(PlanError::RemoteOutOfRange);
        }
        total = total.checked_add(len).ok_or(PlanError::Overflow)?;
        if let Some(p) = out.last_mut() {
            if p.local + p.len == l && p.remote + p.len == r {
                p.len += len;
                continue;
            }
        }
        out.push(Piece {
            local: l,
            remote: r,
            len,
        });
    }
    Ok(out)
}

/// Total bytes of `pieces` (normalised pieces cannot overflow).
pub fn total_bytes(pieces: &[Piece]) -> u64 {
    pieces.iter().map(|p| p.len).sum()
}

/// Whether any two destination ranges overlap (`remote_side`: destination is the remote
/// region, i.e. a write; else the local region, i.e. a read). Destinations that already
/// ascend without overlap (the common layout of a batch) are confirmed in one pass; only
/// other layouts are sorted.
pub fn destination_overlaps(pieces: &[Piece], remote_side: bool) -> bool {
    let dest = |p: &Piece| if remote_side { p.remote } else { p.local };
    if pieces
        .windows(2)
        .all(|w| dest(&w[0]) + w[0].len <= dest(&w[1]))
    {
        return false;
    }
    let mut r: Vec<(u64, u64)> = pieces
        .iter()
        .map(|p| {
            let o = dest(p);
            (o, o + p.len)
        })
        .collect();
    r.sort_unstable();
    r.windows(2).any(|w| w[1].0 < w[0].1)
}

/// `[lo, hi)` of the remote region that `pieces` touch (one pass).
pub fn remote_extent(pieces: &[Piece]) -> (u64, u64) {
    let (lo, hi) = pieces.iter().fold((u64::MAX, 0), |(lo, hi), p| {
        (lo.min(p.remote), hi.max(p.remote + p.len))
    });
    if pieces.is_empty() {
        (0, 0)
    } else {
        (lo, hi)
    }
}

/// Stripe size for spreading `total` bytes over `n_lanes`: an even share, at least
/// `limits::MIN_STRIPE_BYTES` (unless the cap is smaller) and at most `chunk_bytes`.
pub fn stripe_bytes(total: u64, n_lanes: u64, chunk_bytes: u64) -> u64 {
    let share = total.div_ceil(n_lanes.max(1));
    share.max(MIN_STRIPE_BYTES).min(chunk_bytes).max(1)
}

/// Whether a striped write of `total` bytes over `n_lanes` lanes shares its stripes (when
/// `share_stripes` is on): when it has at least [`SHARE_MIN_CHUNKS_PER_LANE`] full chunks per
/// lane. Only then does a lane that runs ahead see it (its socket fills, so it takes stripes
/// at the pace the peer drains them); a smaller write would only trade its even shares for
/// finer stripes, each a frame and a report more, and on the H200 that cost more than the
/// balance won (ARCHITECTURE.md, "Shared stripes").
pub fn shares_stripes(total: u64, n_lanes: u64, chunk_bytes: u64) -> bool {
    n_lanes > 1
        && total
            >= SHARE_MIN_CHUNKS_PER_LANE
                .saturating_mul(n_lanes)
                .saturating_mul(chunk_bytes)
}

/// [`cut`], taking the pieces: a transfer that fits one chunk becomes that chunk without a
/// copy (the common case of small transfers and batches).
pub fn into_chunks(pieces: Vec<Piece>, chunk_bytes: u64) -> Vec<Vec<Piece>> {
    if pieces.is_empty() {
        return Vec::new();
    }
    if pieces.len() <= MAX_SEGS_PER_CHUNK && total_bytes(&pieces) <= chunk_bytes.max(1) {
        return vec![pieces];
    }
    cut(&pieces, chunk_bytes)
}

/// Cut the logical byte stream of `pieces` into chunks of at most `chunk_bytes` bytes and
/// [`MAX_SEGS_PER_CHUNK`] pieces.
pub fn cut(pieces: &[Piece], chunk_bytes: u64) -> Vec<Vec<Piece>> {
    let chunk_bytes = chunk_bytes.max(1);
    // Pieces per chunk if they are of even size (a cut adds one), so chunks rarely regrow.
    let sum = pieces.iter().fold(0u64, |a, p| a.saturating_add(p.len));
    let avg = (sum / pieces.len().max(1) as u64).max(1);
    let per = (chunk_bytes / avg)
        .saturating_add(2)
        .min(MAX_SEGS_PER_CHUNK as u64) as usize;
    let mut chunks = Vec::new();
    let mut cur: Vec<Piece> = Vec::with_capacity(per.min(pieces.len()));
    let mut room = chunk_bytes;
    for p in pieces {
        let mut p = *p;
        while p.len > 0 {
            if room == 0 || cur.len() == MAX_SEGS_PER_CHUNK {
                chunks.push(std::mem::replace(&mut cur, Vec::with_capacity(per)));
                room = chunk_bytes;
            }
            let take = p.len.min(room);
            cur.push(Piece {
                local: p.local,
                remote: p.remote,
                len: take,
            });
            room -= take;
            p.local += take;
            p.remote += take;
            p.len -= take;
        }
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_merges_and_checks() {
        let p = normalize(&[0, 8, 20], &[100, 108, 200], &[8, 8, 4], 64, 256).unwrap();
        assert_eq!(
            p,
            vec![
                Piece {
                    local: 0,
                    remote: 100,
                    len: 16
                },
                Piece {
                    local: 20,
                    remote: 200,
                    len: 4
                }
            ]
        );
        assert_eq!(
            normalize(&[0], &[0], &[], 8, 8),
            Err(PlanError::LengthMismatch)
        );
        assert_eq!(
            normalize(&[1], &[0], &[8], 8, 8),
            Err(PlanError::LocalOutOfRange)
        );
        assert_eq!(
            normalize(&[0], &[1], &[8], 8, 8),
            Err(PlanError::RemoteOutOfRange)
        );
        assert_eq!(
            normalize(&[u64::MAX], &[0], &[2], 8, 8),
            Err(PlanError::Overflow)
        );
        assert!(normalize(&[0], &[0], &[0], 0, 0).unwrap().is_empty());
    }

    #[test]
    fn overlap_detection() {
        let a = [
            Piece {
                local: 0,
                remote: 0,
                len: 10,
            },
            Piece {
                local: 20,
                remote: 5,
                len: 10,
            },
        ];
        assert!(destination_overlaps(&a, true));
        assert!(!destination_overlaps(&a, false));
    }

    #[test]
    fn into_chunks_matches_cut() {
        let p = |local, len| Piece {
            local,
            remote: local * 3,
            len,
        };
        for (pieces, chunk) in [
            (vec![], 16),
            (vec![p(0, 8), p(100, 8)], 16),
            (vec![p(0, 8), p(100, 9)], 16),
            (vec![p(0, 40)], 16),
            (
                (0..MAX_SEGS_PER_CHUNK as u64 + 1)
                    .map(|i| p(i * 10, 1))
                    .collect(),
                1 << 20,
            ),
        ] {
            assert_eq!(into_chunks(pieces.clone(), chunk), cut(&pieces, chunk));
        }
    }

    #[test]
    fn stripes() {
        assert_eq!(stripe_bytes(1 << 20, 8, 1 << 20), 128 << 10);
        assert_eq!(stripe_bytes(100, 8, 1 << 20), MIN_STRIPE_BYTES);
        assert_eq!(stripe_bytes(256 << 20, 8, 1 << 20), 1 << 20);
        assert_eq!(stripe_bytes(100, 8, 16), 16);
        // Shared from two full chunks per lane on, never on one lane.
        assert!(shares_stripes(16 << 20, 8, 1 << 20));
        assert!(!shares_stripes((16 << 20) - 1, 8, 1 << 20));
        assert!(!shares_stripes(1 << 30, 1, 1 << 20));
        assert!(!shares_stripes(1 << 20, 8, 1 << 20));
        assert!(!shares_stripes(u64::MAX, 0, 1 << 20));
        assert!(shares_stripes(u64::MAX, 16, 64 << 20));
    }
}
