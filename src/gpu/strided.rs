//! Copies at constant strides: a run of equal copies whose sources and destinations each step
//! by a fixed pitch (MORI's batch layout, a strided KV-cache slice) goes to the GPU runtime as
//! one two-dimensional copy (CUDA's `cuMemcpy2DAsync`) instead of one operation per segment.

use super::BatchCopy;

/// `rows` copies of `width` bytes, the i-th from `src + i * src_pitch` to `dst + i * dst_pitch`
/// (each pitch at least `width`: rows never overlap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy2d {
    /// First row's destination address.
    pub dst: u64,
    /// Bytes from one destination row to the next.
    pub dst_pitch: u64,
    /// First row's source address.
    pub src: u64,
    /// Bytes from one source row to the next.
    pub src_pitch: u64,
    /// Bytes per row.
    pub width: usize,
    /// Rows.
    pub rows: usize,
}

impl Copy2d {
    /// The run's copies, one per row.
    pub fn row_copies(&self) -> impl Iterator<Item = BatchCopy> + '_ {
        (0..self.rows as u64).map(|i| BatchCopy {
            dst: self.dst + i * self.dst_pitch,
            src: self.src + i * self.src_pitch,
            len: self.width,
        })
    }
}

/// Fewer rows than this stay single copies (a batch takes them as cheaply).
pub const MIN_ROWS: usize = 4;

/// Pitches beyond this never form a run (CUDA bounds a copy's pitch; 1 GiB is well inside).
pub const MAX_PITCH: u64 = 1 << 30;

/// Rows of one 2D copy at most; a longer run becomes several (2 MiB of 8-byte rows is 262,144;
/// CUDA takes a million, HIP's 2D copies fail past about that, and 65,536 is safe for both).
pub const MAX_ROWS: usize = 1 << 16;

/// Whether runs of small copies go to the runtime as 2D copies: `MORIO_GPU_COPY_2D=off` keeps
/// them as batches (an A/B knob, read once).
pub(crate) fn copies_2d() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("MORIO_GPU_COPY_2D").as_deref(),
            Ok("off" | "0" | "false")
        )
    })
}

/// Split `copies` into runs (at least [`MIN_ROWS`] and at most [`MAX_ROWS`] consecutive copies
/// of one length of at most `max_width` bytes, whose sources and destinations rise by
/// constant pitches of at least that length and at most [`MAX_PITCH`]) and the copies left,
/// in their order.
pub(crate) fn runs_2d(copies: &[BatchCopy], max_width: usize) -> (Vec<Copy2d>, Vec<BatchCopy>) {
    let mut runs = Vec::new();
    let mut rest = Vec::new();
    let mut i = 0;
    while i < copies.len() {
        let end = run_end(copies, i, max_width);
        if end - i >= MIN_ROWS {
            let (a, b) = (copies[i], copies[i + 1]);
            runs.push(Copy2d {
                dst: a.dst,
                dst_pitch: b.dst - a.dst,
                src: a.src,
                src_pitch: b.src - a.src,
                width: a.len,
                rows: end - i,
            });
            i = end;
        } else {
            rest.push(copies[i]);
            i += 1;
        }
    }
    (runs, rest)
}

/// One past the last copy of the run that starts at `i` (`i + 1` when none does).
fn run_end(copies: &[BatchCopy], i: usize, max_width: usize) -> usize {
    let a = copies[i];
    let Some(b) = copies.get(i + 1) else {
        return i + 1;
    };
    let pitch = |x: u64, y: u64| {
        y.checked_sub(x)
            .filter(|p| *p >= a.len as u64 && *p <= MAX_PITCH)
    };
    let (Some(dp), Some(sp)) = (pitch(a.dst, b.dst), pitch(a.src, b.src)) else {
        return i + 1;
    };
    if a.len == 0 || a.len > max_width || b.len != a.len {
        return i + 1;
    }
    let mut end = i + 2;
    while let Some(c) = copies.get(end).filter(|_| end - i < MAX_ROWS) {
        let p = copies[end - 1];
        if c.len != a.len
            || c.dst.checked_sub(p.dst) != Some(dp)
            || c.src.checked_sub(p.src) != Some(sp)
        {
            break;
        }
        end += 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(dst: u64, src: u64, len: usize) -> BatchCopy {
        BatchCopy { dst, src, len }
    }

    /// MORI's layout (stride size + 1) packed into a slot: one run; a shorter or irregular
    /// tail, pitches below the width, descending addresses and wide rows stay single.
    #[test]
    fn strided_copies_form_runs_and_the_rest_stays_in_order() {
        let mori: Vec<BatchCopy> = (0..32)
            .map(|i| c(1000 + i * 4096, 9 + i * 4097, 4096))
            .collect();
        let (runs, rest) = runs_2d(&mori, 128 << 10);
        assert_eq!(
            runs,
            vec![Copy2d {
                dst: 1000,
                dst_pitch: 4096,
                src: 9,
                src_pitch: 4097,
                width: 4096,
                rows: 32
            }]
        );
        assert!(rest.is_empty());
        assert_eq!(runs[0].row_copies().collect::<Vec<_>>(), mori);

        let mut mixed: Vec<BatchCopy> = (0..5).map(|i| c(i * 8, 100 + i * 16, 8)).collect();
        mixed.push(c(7000, 50, 3)); // another length
        mixed.extend((0..3).map(|i| c(8000 + i * 8, 9000 + i * 8, 8))); // too few rows
        let (runs, rest) = runs_2d(&mixed, 128 << 10);
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].rows, 5);
        assert_eq!(rest, mixed[5..].to_vec());

        let overlapping: Vec<BatchCopy> = (0..8).map(|i| c(i * 4, i * 16, 8)).collect();
        assert!(
            runs_2d(&overlapping, 128 << 10).0.is_empty(),
            "dst pitch below the width"
        );
        let down: Vec<BatchCopy> = (0..8).map(|i| c(800 - i * 16, i * 16, 8)).collect();
        assert!(
            runs_2d(&down, 128 << 10).0.is_empty(),
            "descending destinations"
        );
        let wide: Vec<BatchCopy> = (0..8).map(|i| c(i << 20, i << 20, 256 << 10)).collect();
        assert!(
            runs_2d(&wide, 128 << 10).0.is_empty(),
            "rows wider than a batch takes"
        );
        let long: Vec<BatchCopy> = (0..(MAX_ROWS as u64 * 2 + 5))
            .map(|i| c(i * 8, i * 9, 8))
            .collect();
        let (runs, rest) = runs_2d(&long, 128 << 10);
        assert_eq!(
            runs.iter().map(|r| r.rows).collect::<Vec<_>>(),
            vec![MAX_ROWS, MAX_ROWS, 5]
        );
        assert!(rest.is_empty());
        assert_eq!(
            (runs[1].dst, runs[1].src),
            (MAX_ROWS as u64 * 8, MAX_ROWS as u64 * 9)
        );
        let far: Vec<BatchCopy> = (0..8).map(|i| c(i * 16, i * (MAX_PITCH + 1), 8)).collect();
        assert!(
            runs_2d(&far, 128 << 10).0.is_empty(),
            "pitch beyond MAX_PITCH"
        );
    }

    proptest! {
        /// Whatever the copies, the runs' rows and the copies left are exactly the copies
        /// given, each once, and every run is a valid 2D copy.
        #[test]
        fn runs_cover_every_copy_once_in_order(
            segs in prop::collection::vec((0u64..4, 0u64..3, 1usize..5), 0..40),
            base in 0u64..1000,
        ) {
            // Steps of 0..4 rows of 16 bytes: repeated steps make runs, others break them.
            let mut copies = Vec::new();
            let (mut d, mut s) = (base, base * 3);
            for (dstep, sstep, len) in segs {
                d += dstep * 16;
                s += sstep * 16;
                copies.push(c(d, s, len * 4));
            }
            let (runs, rest) = runs_2d(&copies, 128 << 10);
            let mut all: Vec<BatchCopy> = runs.iter().flat_map(|r| r.row_copies().collect::<Vec<_>>()).collect();
            all.extend(rest.iter().copied());
            let mut want = copies.clone();
            all.sort_by_key(|c| (c.dst, c.src, c.len));
            want.sort_by_key(|c| (c.dst, c.src, c.len));
            prop_assert_eq!(all, want);
            for r in &runs {
                prop_assert!(r.rows >= MIN_ROWS);
                prop_assert!(r.dst_pitch >= r.width as u64 && r.src_pitch >= r.width as u64);
            }
        }
    }
}
