//! Seeded requests: disjoint windows of both regions, random batches inside them (lists
//! with gaps and reordering, or regular strides that travel as runs), and the owner's
//! configuration for each.

use morio::proto::frame::Op;
use morio::proto::layout::{normalize_layout, Layout};
use morio::proto::plan::Piece;
use rand::seq::SliceRandom;
use rand::Rng;

use crate::world::{Sim, Spec, Want, ACCESS_KEY, LOCAL_BYTES, MEM_ID, NO_DEADLINE, TARGET_BYTES};

/// A transfer's window: (local base, local len, remote base, remote len).
pub type Window = (u64, u64, u64, u64);

/// `layout` moved by `dl` bytes on the local side and `dr` on the remote side.
pub fn shift(layout: &Layout, dl: i64, dr: i64) -> Layout {
    let mv = |p: Piece| Piece {
        local: p.local.checked_add_signed(dl).expect("in range"),
        remote: p.remote.checked_add_signed(dr).expect("in range"),
        len: p.len,
    };
    match layout {
        Layout::List(v) => Layout::List(v.iter().copied().map(mv).collect()),
        Layout::Strided(s) => {
            let mut s = *s;
            s.first = mv(s.first);
            Layout::Strided(s)
        }
    }
}

impl Sim {
    /// `n` disjoint windows, one per transfer.
    pub fn windows(&mut self, n: usize) -> Vec<Window> {
        let (sl, sr) = (LOCAL_BYTES / n as u64, TARGET_BYTES / n as u64);
        let mut lp: Vec<u64> = (0..n as u64).collect();
        let mut rp = lp.clone();
        lp.shuffle(&mut self.rng);
        rp.shuffle(&mut self.rng);
        (0..n).map(|i| (lp[i] * sl, sl, rp[i] * sr, sr)).collect()
    }

    /// A random batch inside `window` whose destination ranges do not overlap, normalised
    /// by the real `normalize_layout` (so a regular batch stays strided).
    pub fn gen_layout(&mut self, op: Op, window: Window) -> Layout {
        let seed = self.seed;
        let (lb, ll, rb, rl) = window;
        // Destination and source windows.
        let (db, dl, sb, sl) = match op {
            Op::Write => (rb, rl, lb, ll),
            Op::Read => (lb, ll, rb, rl),
        };
        let entries = if self.rng.gen_ratio(1, 4) {
            self.strided_entries(dl, sl)
        } else {
            self.list_entries(dl, sl)
        };
        let (mut lo, mut ro, mut sz) = (Vec::new(), Vec::new(), Vec::new());
        for (s, d, len) in entries {
            let (l, r) = match op {
                Op::Write => (sb + s, db + d),
                Op::Read => (db + d, sb + s),
            };
            lo.push(l);
            ro.push(r);
            sz.push(len);
        }
        let layout = normalize_layout(&lo, &ro, &sz, LOCAL_BYTES, TARGET_BYTES)
            .unwrap_or_else(|e| panic!("seed {seed}: normalize refused a valid batch: {e}"));
        assert!(
            !layout.destination_overlaps(op == Op::Write),
            "seed {seed}: generated overlapping destinations"
        );
        assert_eq!(layout.total_bytes(), sz.iter().sum::<u64>(), "seed {seed}");
        layout
    }

    /// (source, destination, len) offsets in the windows: blocks in destination order with
    /// gaps, shuffled or with a contiguous source, and a few empty entries.
    fn list_entries(&mut self, dl: u64, sl: u64) -> Vec<(u64, u64, u64)> {
        let rng = &mut self.rng;
        let cap = dl.min(sl);
        let max_blk = (*[16u64, 128, 512, cap].choose(rng).unwrap()).clamp(1, cap);
        let max_blocks = rng.gen_range(1..=48);
        let mut blocks: Vec<(u64, u64)> = Vec::new(); // (dest offset, len)
        let mut pos = rng.gen_range(0..dl / 4);
        while pos < dl && blocks.len() < max_blocks {
            if rng.gen_ratio(1, 4) {
                pos += rng.gen_range(0..=32);
                if pos >= dl {
                    break;
                }
            }
            let len = rng.gen_range(1..=max_blk.min(dl - pos));
            blocks.push((pos, len));
            pos += len;
        }
        if blocks.is_empty() {
            blocks.push((0, 1));
        }
        let sum: u64 = blocks.iter().map(|b| b.1).sum();
        let mut entries = Vec::new();
        if sum <= sl && rng.gen_ratio(1, 3) {
            // In order, source contiguous: normalize merges where the destination is too.
            let mut s = rng.gen_range(0..=sl - sum);
            for (d, len) in blocks {
                entries.push((s, d, len));
                s += len;
            }
        } else {
            blocks.shuffle(rng);
            for (d, len) in blocks {
                entries.push((rng.gen_range(0..=sl - len), d, len));
            }
        }
        for _ in 0..rng.gen_range(0..3) {
            let at = rng.gen_range(0..=entries.len());
            entries.insert(at, (rng.gen_range(0..sl), rng.gen_range(0..dl), 0));
        }
        entries
    }

    /// A regular batch: `count` blocks of one length at constant strides on both sides (the
    /// destination's at least the length; the source's 0, the length, or more).
    fn strided_entries(&mut self, dl: u64, sl: u64) -> Vec<(u64, u64, u64)> {
        let rng = &mut self.rng;
        let len = rng.gen_range(1..=(dl / 2).min(sl / 2).min(512));
        let count = rng.gen_range(2..=(dl / len).min(96));
        let max_ds = (dl - len) / (count - 1);
        let ds = rng.gen_range(len..=max_ds.max(len));
        let d0 = rng.gen_range(0..=dl - ((count - 1) * ds + len));
        let max_ss = (sl - len) / (count - 1);
        let ss = match rng.gen_range(0..3) {
            0 => 0,
            1 if max_ss >= len => len,
            _ => rng.gen_range(0..=max_ss),
        };
        let s0 = rng.gen_range(0..=sl - ((count - 1) * ss + len));
        (0..count)
            .map(|i| (s0 + i * ss, d0 + i * ds, len))
            .collect()
    }

    /// A random request in `window`, with the owner's configuration for it: its chunk size,
    /// striping threshold and stripe sharing, and its owner shard.
    pub fn gen_spec(&mut self, window: Window, want: Want) -> Spec {
        let op = if self.rng.gen() { Op::Write } else { Op::Read };
        let layout = self.gen_layout(op, window);
        let chunk_bytes = if self.rng.gen_ratio(1, 5) {
            1 << 20
        } else {
            // Log-uniform over 64..=4096, so most transfers have many chunks.
            let lo = 64u64 << self.rng.gen_range(0..6);
            self.rng.gen_range(lo..=2 * lo)
        };
        let threshold = match self.rng.gen_range(0..5) {
            0 | 1 => 0,
            2 => u64::MAX,
            _ => self.rng.gen_range(256..=16 << 10),
        };
        Spec {
            op,
            layout,
            mem_id: MEM_ID,
            access_key: ACCESS_KEY,
            chunk_bytes,
            threshold,
            share: self.rng.gen_ratio(3, 4),
            owner: self.rng.gen_range(0..self.n_owners()),
            timeout: NO_DEADLINE,
            local_failure: false,
            want,
        }
    }

    /// [`Sim::gen_spec`] for each of `n` windows.
    pub fn gen_specs(&mut self, n: usize, want: Want) -> Vec<Spec> {
        let windows = self.windows(n);
        windows
            .into_iter()
            .map(|w| self.gen_spec(w, want))
            .collect()
    }
}
