//! Copying a small write's pieces out of registered host memory next to its frame (express
//! writes and the lane writer's inline chunks): a strided layout is resolved against the
//! region once and copied piece by piece from that one span.

use crate::proto::layout::Layout;
use crate::region::SharedRegion;

/// Append the bytes of `pieces` of `local` to `buf`, in order; `false` (and `buf` holding
/// some of them) if a piece is outside the region or the region is not host memory.
///
/// # Safety
/// The pieces' bytes may be read for the transfer (its contract: nobody writes them while
/// it is in flight); a strided layout's span between its pieces is only addressed, not read.
pub(crate) unsafe fn gather(local: &SharedRegion, pieces: &Layout, buf: &mut Vec<u8>) -> bool {
    match pieces {
        Layout::Strided(s) => {
            let (first, last) = (s.first, s.last());
            let Some(span_len) = (last.local + last.len).checked_sub(first.local) else {
                return false;
            };
            // SAFETY: the caller's contract; the span is checked against the region here.
            let Some(span) = (unsafe { local.slice(first.local, span_len) }) else {
                return false;
            };
            let (len, stride) = (first.len as usize, s.local_stride as usize);
            crate::small_copy::gather(buf, span, stride, len, s.count as usize)
        }
        Layout::List(list) => {
            for p in list {
                // SAFETY: the caller's contract.
                match unsafe { local.slice(p.local, p.len) } {
                    Some(b) => crate::small_copy::extend(buf, b),
                    None => return false,
                }
            }
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::layout::Stride;
    use crate::proto::plan::Piece;
    use crate::region::{Backing, Region};
    use std::sync::Arc;

    #[test]
    fn strided_and_listed_pieces_gather_alike_and_out_of_range_fails() {
        let bytes: Vec<u8> = (0..=255u8).collect();
        let region: SharedRegion = Arc::new(Region::owned(
            1,
            Backing::new(bytes.clone().into_boxed_slice()),
        ));
        let stride = Stride {
            first: Piece {
                local: 3,
                remote: 0,
                len: 5,
            },
            count: 20,
            local_stride: 9,
            remote_stride: 5,
        };
        let list: Vec<Piece> = (0..20).map(|i| stride.piece(i)).collect();
        let want: Vec<u8> = list
            .iter()
            .flat_map(|p| bytes[p.local as usize..(p.local + p.len) as usize].to_vec())
            .collect();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        // SAFETY: a test region nobody else touches.
        assert!(unsafe { gather(&region, &Layout::Strided(stride), &mut a) });
        // SAFETY: as above.
        assert!(unsafe { gather(&region, &Layout::List(list), &mut b) });
        assert_eq!(a, want);
        assert_eq!(b, want);
        let past = Stride {
            count: 40,
            ..stride
        };
        // SAFETY: as above.
        assert!(!unsafe { gather(&region, &Layout::Strided(past), &mut Vec::new()) });
    }
}
