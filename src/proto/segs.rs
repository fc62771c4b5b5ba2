//! A chunk's target-side segments (`Seg`, one piece) as the decoder hands them to the
//! target (`Segs`): a frame that names one run (a strided batch, the usual KV-cache layout)
//! stays one run, so the target checks it in constant time and places it in one loop, where a
//! list of 256 segments would be built, checked and walked piece by piece.

/// One contiguous piece of a region: `len` bytes at `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg {
    /// Offset within the region.
    pub off: u64,
    /// Length in bytes.
    pub len: u64,
}

/// `count` segments of `first.len` bytes at `first.off`, `first.off + stride`, ... in
/// ascending order (a run of one has stride 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// The first segment.
    pub first: Seg,
    /// How many segments (at least one).
    pub count: u32,
    /// From one segment's offset to the next.
    pub stride: u64,
}

impl Run {
    /// The end of the run's last segment, `None` if it overflows `u64` (the decoder refuses
    /// such runs; a caller building one must check).
    pub fn end(&self) -> Option<u64> {
        u64::from(self.count.saturating_sub(1))
            .checked_mul(self.stride)
            .and_then(|d| d.checked_add(self.first.off))
            .and_then(|o| o.checked_add(self.first.len))
    }

    /// Segment `i` (`i < count`; offsets wrap rather than panic past a bad run's end).
    fn seg(&self, i: u32) -> Seg {
        Seg {
            off: self
                .first
                .off
                .wrapping_add(u64::from(i).wrapping_mul(self.stride)),
            len: self.first.len,
        }
    }
}

/// A chunk's target segments, in payload order. Equality is by the segments they name, so a
/// run equals the list of its segments.
#[derive(Clone, Debug)]
pub enum Segs {
    /// Segments as listed.
    List(Vec<Seg>),
    /// One run.
    Run(Run),
}

impl Segs {
    /// How many segments.
    pub fn len(&self) -> usize {
        match self {
            Self::List(v) => v.len(),
            Self::Run(r) => r.count as usize,
        }
    }

    /// Whether there are none (a decoded chunk always has some).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The segments, in payload order.
    pub fn iter(&self) -> SegsIter<'_> {
        SegsIter { segs: self, i: 0 }
    }

    /// Sum of segment lengths (saturating).
    pub fn bytes(&self) -> u64 {
        match self {
            Self::List(v) => v.iter().fold(0u64, |a, s| a.saturating_add(s.len)),
            Self::Run(r) => r.first.len.saturating_mul(u64::from(r.count)),
        }
    }

    /// Whether every segment lies within `[lo, hi)`; a run is checked by its ends alone
    /// (its offsets ascend).
    pub fn within(&self, lo: u64, hi: u64) -> bool {
        match self {
            Self::List(v) => v
                .iter()
                .all(|s| s.off >= lo && s.off.checked_add(s.len).is_some_and(|end| end <= hi)),
            Self::Run(r) => r.first.off >= lo && r.end().is_some_and(|end| end <= hi),
        }
    }

    /// The segments as a list.
    pub fn to_vec(&self) -> Vec<Seg> {
        match self {
            Self::List(v) => v.clone(),
            Self::Run(_) => self.iter().collect(),
        }
    }
}

impl From<Vec<Seg>> for Segs {
    fn from(v: Vec<Seg>) -> Self {
        Self::List(v)
    }
}

impl FromIterator<Seg> for Segs {
    fn from_iter<I: IntoIterator<Item = Seg>>(it: I) -> Self {
        Self::List(it.into_iter().collect())
    }
}

impl PartialEq for Segs {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::List(a), Self::List(b)) => a == b,
            (Self::Run(a), Self::Run(b)) if a == b => true,
            _ => self.len() == other.len() && self.iter().eq(other.iter()),
        }
    }
}

impl Eq for Segs {}

impl<'a> IntoIterator for &'a Segs {
    type Item = Seg;
    type IntoIter = SegsIter<'a>;
    fn into_iter(self) -> SegsIter<'a> {
        self.iter()
    }
}

/// The segments of a [`Segs`], by value.
#[derive(Clone, Debug)]
pub struct SegsIter<'a> {
    segs: &'a Segs,
    i: usize,
}

impl Iterator for SegsIter<'_> {
    type Item = Seg;

    fn next(&mut self) -> Option<Seg> {
        let s = match self.segs {
            Segs::List(v) => *v.get(self.i)?,
            Segs::Run(r) if self.i < r.count as usize => r.seg(self.i as u32),
            Segs::Run(_) => return None,
        };
        self.i += 1;
        Some(s)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.segs.len().saturating_sub(self.i);
        (n, Some(n))
    }
}

impl ExactSizeIterator for SegsIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(off: u64, len: u64) -> Seg {
        Seg { off, len }
    }

    #[test]
    fn a_run_names_its_segments_and_equals_their_list() {
        let run = Segs::Run(Run {
            first: seg(10, 8),
            count: 3,
            stride: 9,
        });
        let list = Segs::from(vec![seg(10, 8), seg(19, 8), seg(28, 8)]);
        assert_eq!(run.to_vec(), list.to_vec());
        assert_eq!(run, list);
        assert_eq!(list, run);
        assert_eq!((run.len(), run.bytes()), (3, 24));
        assert_eq!(run.iter().len(), 3);
        assert_ne!(run, Segs::from(vec![seg(10, 8), seg(19, 8)]));
        assert_ne!(run, Segs::from(vec![seg(10, 8), seg(19, 8), seg(29, 8)]));
    }

    #[test]
    fn within_checks_a_run_by_its_ends_as_a_list_by_every_segment() {
        let run = |off, count, stride| {
            Segs::Run(Run {
                first: seg(off, 8),
                count,
                stride,
            })
        };
        // Last segment at 10 + 2 * 9 = 28, ending at 36.
        assert!(run(10, 3, 9).within(10, 36));
        assert!(!run(10, 3, 9).within(10, 35));
        assert!(!run(10, 3, 9).within(11, 36));
        assert!(run(10, 1, u64::MAX).within(10, 18));
        // A run whose end overflows is never within anything.
        assert!(!run(10, 3, u64::MAX / 2).within(0, u64::MAX));
        for (lo, hi) in [(10, 36), (10, 35), (11, 36), (0, 100)] {
            assert_eq!(
                run(10, 3, 9).within(lo, hi),
                Segs::from(run(10, 3, 9).to_vec()).within(lo, hi),
                "[{lo}, {hi})"
            );
        }
        assert!(!Segs::from(vec![seg(u64::MAX, 1)]).within(0, u64::MAX));
    }
}
