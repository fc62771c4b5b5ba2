//! Strided layouts: a transfer's checked segments as they cross from the application thread
//! to the owner shard and on to the frame, kept as a stride (first piece, count, strides)
//! when a batch is regular, so no per-segment list is built for it.

use super::frame::{ChunkSegs, Seg};
use super::limits::MAX_SEGS_PER_CHUNK;
use super::plan::{
    destination_overlaps, into_chunks, normalize, remote_extent, stripe_bytes, total_bytes, Piece,
    PlanError,
};

/// A checked transfer's segments in the form that crosses from the application thread to
/// the owner shard. A batch of equal-sized segments at constant strides (the usual layout
/// of KV-cache blocks) travels as one [`Stride`] of a few words, so the per-segment list is
/// never written by one core and read by another, and becomes one run on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Normalised pieces, in logical order.
    List(Vec<Piece>),
    /// Pieces at constant strides.
    Strided(Stride),
}

/// `count` (≥ 1) pieces of `first.len` (> 0) bytes, piece `i` at `first.local + i *
/// local_stride` and `first.remote + i * remote_stride`. From [`normalize_layout`]: at
/// least two, never contiguous on both sides at once (those merge into one piece), every
/// piece range-checked (so no offset below overflows); [`layout_chunks`] cuts it into
/// strided chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stride {
    /// The first piece.
    pub first: Piece,
    /// Number of pieces.
    pub count: u64,
    /// Distance between consecutive local offsets.
    pub local_stride: u64,
    /// Distance between consecutive remote offsets.
    pub remote_stride: u64,
}

impl Stride {
    /// Piece `i`.
    pub fn piece(&self, i: u64) -> Piece {
        Piece {
            local: self
                .first
                .local
                .wrapping_add(i.wrapping_mul(self.local_stride)),
            remote: self
                .first
                .remote
                .wrapping_add(i.wrapping_mul(self.remote_stride)),
            len: self.first.len,
        }
    }

    /// The last piece (strides do not go backwards, so it reaches furthest on both sides).
    pub fn last(&self) -> Piece {
        self.piece(self.count.saturating_sub(1))
    }

    /// Total bytes.
    pub fn total_bytes(&self) -> u64 {
        self.first.len * self.count
    }

    /// Whether two destination ranges overlap (`remote_side`: the remote side is the
    /// destination).
    pub fn destination_overlaps(&self, remote_side: bool) -> bool {
        let stride = if remote_side {
            self.remote_stride
        } else {
            self.local_stride
        };
        self.count > 1 && stride < self.first.len
    }
}

/// A piece's remote side, as a chunk frame describes it.
pub fn remote_seg(p: &Piece) -> Seg {
    Seg {
        off: p.remote,
        len: p.len,
    }
}

impl Layout {
    /// Total bytes (checked at normalisation: cannot overflow).
    pub fn total_bytes(&self) -> u64 {
        match self {
            Self::List(p) => total_bytes(p),
            Self::Strided(s) => s.total_bytes(),
        }
    }

    /// Number of pieces.
    pub fn piece_count(&self) -> usize {
        match self {
            Self::List(p) => p.len(),
            Self::Strided(s) => s.count as usize,
        }
    }

    /// Every piece, in logical order, without building a list.
    pub fn iter(&self) -> impl Iterator<Item = Piece> + '_ {
        let (list, stride) = match self {
            Self::List(p) => (&p[..], None),
            Self::Strided(s) => (&[][..], Some(*s)),
        };
        let strided = stride
            .into_iter()
            .flat_map(|s| (0..s.count).map(move |i| s.piece(i)));
        list.iter().copied().chain(strided)
    }

    /// The segments a chunk frame of this layout carries (its remote side): one run for a
    /// strided layout, else the list.
    pub fn remote_segs(&self) -> ChunkSegs<'_, Piece, fn(&Piece) -> Seg> {
        match self {
            Self::Strided(s) => {
                ChunkSegs::Run(remote_seg(&s.first), s.count as u32, s.remote_stride)
            }
            Self::List(list) => ChunkSegs::List(list, remote_seg),
        }
    }

    /// The last piece.
    #[cfg(any(test, feature = "testing"))]
    pub fn last(&self) -> Option<Piece> {
        match self {
            Self::List(p) => p.last().copied(),
            Self::Strided(s) => (s.count > 0).then(|| s.last()),
        }
    }

    /// `[lo, hi)` of the remote region the pieces touch.
    pub fn remote_extent(&self) -> (u64, u64) {
        match self {
            Self::List(p) => remote_extent(p),
            Self::Strided(s) => (s.first.remote, s.last().remote + s.first.len),
        }
    }

    /// Whether two destination ranges overlap; see [`destination_overlaps`].
    pub fn destination_overlaps(&self, remote_side: bool) -> bool {
        match self {
            Self::List(p) => destination_overlaps(p, remote_side),
            Self::Strided(s) => s.destination_overlaps(remote_side),
        }
    }

    /// The pieces, as [`normalize`] gives them.
    pub fn into_pieces(self) -> Vec<Piece> {
        match self {
            Self::List(p) => p,
            Self::Strided(s) => (0..s.count).map(|i| s.piece(i)).collect(),
        }
    }
}

/// Stripe size for spreading `layout` over `n_lanes` ([`stripe_bytes`]), moved to a whole
/// number of pieces when the layout is strided and a stripe holds at least one: up when
/// that stays within `chunk_bytes`, else down. [`layout_chunks`] then cuts strided chunks
/// (one run each on the wire) instead of splitting pieces into per-segment lists, and no
/// more stripes than lanes result when rounding up.
pub fn layout_stripe(layout: &Layout, n_lanes: u64, chunk_bytes: u64) -> u64 {
    let stripe = stripe_bytes(layout.total_bytes(), n_lanes, chunk_bytes);
    whole_pieces(layout, stripe, chunk_bytes)
}

/// `stripe` moved to a whole number of a strided layout's pieces (see [`layout_stripe`]).
fn whole_pieces(layout: &Layout, stripe: u64, chunk_bytes: u64) -> u64 {
    let Layout::Strided(s) = layout else {
        return stripe;
    };
    let p = s.first.len;
    if p == 0 || p > stripe {
        return stripe;
    }
    let up = stripe.div_ceil(p).saturating_mul(p);
    if up <= chunk_bytes.max(1) {
        up
    } else {
        stripe / p * p
    }
}

/// Cut a layout into chunks of at most `chunk_bytes` bytes and [`MAX_SEGS_PER_CHUNK`]
/// pieces, covering its logical byte stream exactly as [`cut`](super::plan::cut) does. A
/// strided layout whose pieces fit the chunks whole is cut into strided chunks; any other is
/// cut as a list.
pub fn layout_chunks(layout: Layout, chunk_bytes: u64) -> Vec<Layout> {
    let chunk_bytes = chunk_bytes.max(1);
    if let Layout::Strided(s) = layout {
        let per = (chunk_bytes / s.first.len).min(MAX_SEGS_PER_CHUNK as u64);
        // Whole pieces per chunk, and chunks exactly full (else `cut` would split pieces).
        let whole = per * s.first.len == chunk_bytes || per == MAX_SEGS_PER_CHUNK as u64;
        if per > 0 && (s.count <= per || whole) {
            return (0..s.count.div_ceil(per))
                .map(|c| {
                    Layout::Strided(Stride {
                        first: s.piece(c * per),
                        count: per.min(s.count - c * per),
                        ..s
                    })
                })
                .collect();
        }
    }
    into_chunks(layout.into_pieces(), chunk_bytes)
        .into_iter()
        .map(Layout::List)
        .collect()
}

/// [`normalize`] into a [`Layout`]: a request of equal, non-zero sizes at constant
/// non-negative strides on both sides is checked in one pass and kept strided; anything
/// else is normalised into a list. `into_pieces` of the result equals `normalize`'s.
pub fn normalize_layout(
    local_offs: &[u64],
    remote_offs: &[u64],
    sizes: &[u64],
    local_size: u64,
    remote_size: u64,
) -> Result<Layout, PlanError> {
    if let Some(l) = strided(local_offs, remote_offs, sizes, local_size, remote_size) {
        return Ok(l);
    }
    normalize(local_offs, remote_offs, sizes, local_size, remote_size).map(Layout::List)
}

/// The strided layout of a request, if it is one and every piece is in range.
fn strided(
    local_offs: &[u64],
    remote_offs: &[u64],
    sizes: &[u64],
    local_size: u64,
    remote_size: u64,
) -> Option<Layout> {
    let n = sizes.len();
    if n < 2 || local_offs.len() != n || remote_offs.len() != n {
        return None;
    }
    let len = sizes[0];
    let (l0, r0) = (local_offs[0], remote_offs[0]);
    let ls = local_offs[1].checked_sub(l0)?;
    let rs = remote_offs[1].checked_sub(r0)?;
    if len == 0 || (ls == len && rs == len) {
        return None; // Empty, or contiguous on both sides: the list form merges it.
    }
    // One branch-free pass over the three lists.
    let mut same = true;
    let (mut l, mut r) = (l0, r0);
    for ((&lo, &ro), &sz) in local_offs.iter().zip(remote_offs).zip(sizes) {
        same &= (lo == l) & (ro == r) & (sz == len);
        l = l.wrapping_add(ls);
        r = r.wrapping_add(rs);
    }
    if !same {
        return None;
    }
    // Offsets ascend, so the last piece reaches furthest; its end must not overflow.
    let last = (n - 1) as u64;
    let l_end = ls.checked_mul(last)?.checked_add(l0)?.checked_add(len)?;
    let r_end = rs.checked_mul(last)?.checked_add(r0)?.checked_add(len)?;
    len.checked_mul(n as u64)?;
    if l_end > local_size || r_end > remote_size {
        return None; // normalize reports which side is out of range.
    }
    Some(Layout::Strided(Stride {
        first: Piece {
            local: l0,
            remote: r0,
            len,
        },
        count: n as u64,
        local_stride: ls,
        remote_stride: rs,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_layouts_expand_to_what_normalize_gives() {
        let offs: Vec<u64> = (0..256u64).map(|i| i * 9).collect();
        let sizes = vec![8u64; 256];
        let l = normalize_layout(&offs, &offs, &sizes, 1 << 20, 1 << 20).unwrap();
        assert!(matches!(l, Layout::Strided(Stride { count: 256, .. })));
        assert_eq!(l.total_bytes(), 2048);
        let want = normalize(&offs, &offs, &sizes, 1 << 20, 1 << 20).unwrap();
        assert_eq!(l.into_pieces(), want);
        // Contiguous on both sides: one merged piece, as a list.
        let c: Vec<u64> = (0..4u64).map(|i| i * 8).collect();
        assert_eq!(
            normalize_layout(&c, &c, &[8; 4], 64, 64).unwrap(),
            Layout::List(vec![Piece {
                local: 0,
                remote: 0,
                len: 32
            }])
        );
        // Out of range is the list path's error, naming the side.
        assert_eq!(
            normalize_layout(&offs, &offs, &sizes, 1 << 20, 100),
            Err(PlanError::RemoteOutOfRange)
        );
        // Not a progression, or unequal sizes: a list.
        let mut odd = offs.clone();
        odd[100] += 1;
        assert!(matches!(
            normalize_layout(&odd, &offs, &sizes, 1 << 20, 1 << 20).unwrap(),
            Layout::List(_)
        ));
    }
}
