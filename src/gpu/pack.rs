//! Cutting a chunk's payload into staging-slot jobs: consecutive payload bytes are packed into
//! slots of a fixed size, each job listing the device ranges its slot holds.

/// One device range inside a staging slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    /// Offset in the device region.
    pub dev_off: u64,
    /// Offset in the slot.
    pub slot_off: usize,
    /// Bytes.
    pub len: usize,
}

/// What one slot carries: `bytes` consecutive payload bytes, from (or to) `parts`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Job {
    pub parts: Vec<Part>,
    pub bytes: usize,
}

/// Cut the payload formed by `spans` (region offset, length; in payload order) into jobs of at
/// most `slot` bytes. Small spans share a slot; a large span is split across slots.
pub(crate) fn jobs(spans: &[(u64, u64)], slot: usize) -> Vec<Job> {
    let slot = slot.max(1);
    let mut out = Vec::new();
    let mut cur = Job::default();
    for &(off, len) in spans {
        let mut done = 0u64;
        while done < len {
            if cur.bytes == slot {
                out.push(std::mem::take(&mut cur));
            }
            let take = (len - done).min((slot - cur.bytes) as u64) as usize;
            cur.parts.push(Part {
                dev_off: off + done,
                slot_off: cur.bytes,
                len: take,
            });
            cur.bytes += take;
            done += take as u64;
        }
    }
    if cur.bytes > 0 {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_spans_share_a_slot_and_large_ones_split() {
        let j = jobs(&[(0, 8), (100, 8), (1000, 20)], 16);
        assert_eq!(j.len(), 3);
        assert_eq!(j[0].bytes, 16);
        assert_eq!(j[0].parts.len(), 2);
        assert_eq!(
            j[1].parts,
            vec![Part {
                dev_off: 1000,
                slot_off: 0,
                len: 16
            }]
        );
        assert_eq!(
            j[2].parts,
            vec![Part {
                dev_off: 1016,
                slot_off: 0,
                len: 4
            }]
        );
        assert!(jobs(&[], 16).is_empty());
        assert!(jobs(&[(5, 0)], 16).is_empty());
    }

    proptest! {
        /// Jobs cover the payload exactly once, in order, never overfill a slot, and every
        /// slot but the last is full.
        #[test]
        fn jobs_cover_the_payload_in_order(
            spans in proptest::collection::vec((0u64..1 << 30, 0u64..5000), 0..40),
            slot in 1usize..4096,
        ) {
            let js = jobs(&spans, slot);
            let mut flat: Vec<(u64, u64)> = Vec::new();
            for (i, j) in js.iter().enumerate() {
                prop_assert!(j.bytes <= slot && j.bytes > 0);
                if i + 1 < js.len() {
                    prop_assert_eq!(j.bytes, slot);
                }
                let mut at = 0;
                for p in &j.parts {
                    prop_assert_eq!(p.slot_off, at);
                    at += p.len;
                    flat.push((p.dev_off, p.len as u64));
                }
                prop_assert_eq!(at, j.bytes);
            }
            // Re-joining adjacent parts gives back the non-empty spans.
            let mut joined: Vec<(u64, u64)> = Vec::new();
            let mut k = 0;
            for &(off, len) in spans.iter().filter(|s| s.1 > 0) {
                let mut have = 0;
                while have < len {
                    let (o, l) = flat[k];
                    prop_assert_eq!(o, off + have);
                    have += l;
                    k += 1;
                }
                prop_assert_eq!(have, len);
                joined.push((off, len));
            }
            prop_assert_eq!(k, flat.len());
        }
    }
}
