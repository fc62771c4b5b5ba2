//! The checks at the end of a run: every transfer against what it had to end as (with lane
//! losses overlaid), the target's inbound statuses and what it saw of each transfer, the data
//! in both regions against a model, and the joins left in the target's table.

use std::collections::BTreeSet;

use morio::proto::codes::{ERR_BAD_STATE, ERR_GPU_OP, ERR_NOT_FOUND, SUCCESS};
use morio::proto::frame::Op;
use morio::proto::inbound::NOT_REGISTERED;

use crate::world::{Done, Sim, Want, LOST, STAGE_IN_FAILED, STAGE_OUT_FAILED, TIMEOUT};

/// Events, steps, both regions, and every transfer's (uid, result) at the end of a run.
pub type Digest = (u64, u64, Vec<u8>, Vec<u8>, Vec<(u64, Option<Done>)>);

/// How a transfer ended, as the checks sort it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// As it had to.
    AsWanted,
    /// A lane it used was lost.
    Lost,
    /// Its deadline passed.
    TimedOut,
    /// Its initiator crashed first.
    Abandoned,
}

impl Sim {
    /// Check every transfer, the regions and the joins; how each transfer ended, and the
    /// number of joins left in the target's table (dropped here, as the target prunes them).
    pub fn verify(&mut self) -> (Vec<Ended>, usize) {
        let seed = self.seed;
        self.check_quiet();
        let mut exp_local = self.init_local.clone();
        let mut exp_target = self.init_target.clone();
        let mut ended = Vec::new();
        for x in 0..self.xfers.len() {
            let e = self.check_xfer(x, &mut exp_local, &mut exp_target);
            ended.push(e);
        }
        let diff = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y);
        if let Some(i) = diff(&self.target, &exp_target) {
            panic!("seed {seed}: target region differs from the model at byte {i}");
        }
        if let Some(i) = diff(&self.local, &exp_local) {
            panic!("seed {seed}: local region differs from the model at byte {i}");
        }
        // A join stays while some but not all of its chunks reached the target; every other
        // one was answered (or ended by FINISH with all chunks in) and went.
        let left = self
            .seen
            .values()
            .filter(|s| {
                s.n_chunks > 1 && (s.chunks.len() < s.n_chunks as usize || s.finish_after_join)
            })
            .count();
        let joins = self.joins.map.get_mut();
        assert_eq!(joins.len(), left, "seed {seed}: joins left in the table");
        assert_eq!(joins.refused(), 0, "seed {seed}");
        assert_eq!(joins.prune(u64::MAX, 1), left, "seed {seed}: joins pruned");
        assert!(joins.is_empty(), "seed {seed}");
        assert_eq!(
            joins.peers(),
            0,
            "seed {seed}: per-peer records went with the joins"
        );
        (ended, left)
    }

    /// Check transfer `x` and fold what its destination must hold into the model.
    fn check_xfer(&self, x: usize, exp_local: &mut [u8], exp_target: &mut [u8]) -> Ended {
        let seed = self.seed;
        let xf = &self.xfers[x];
        let want = xf.spec.want;
        let ctx = format!(
            "seed {seed}: transfer {x} (instance {}, uid {}, {:?}, {} chunks, home {}, lanes {:?}, \
             fails {:?}, want {want:?})",
            xf.inst, xf.uid, xf.spec.op, xf.n_chunks, xf.home, xf.plan_lanes, xf.fail_chunk
        );
        let key = (xf.inst, xf.uid);
        let inbound = self.inbound.get(&key);
        let seen = self.seen.get(&key).cloned().unwrap_or_default();
        // Its destination bytes are unspecified: the model takes them as they are.
        let unspecified = |exp_local: &mut [u8], exp_target: &mut [u8]| {
            for p in xf.spec.layout.iter() {
                let (local, off, n) = self.destination(x, &p);
                if local {
                    exp_local[off..off + n].copy_from_slice(&self.local[off..off + n]);
                } else {
                    exp_target[off..off + n].copy_from_slice(&self.target[off..off + n]);
                }
            }
        };
        if self.inits[xf.inst].crashed {
            // Its initiator is gone (and so are its memory's contents): what had ended had
            // succeeded (nothing else was asked of it); the rest never will.
            assert_eq!(xf.abandoned, xf.result.is_none(), "{ctx}");
            if let Some(d) = &xf.result {
                assert_eq!(d.code, SUCCESS, "{ctx}: ({})", d.msg);
            }
            unspecified(exp_local, exp_target);
            return Ended::Abandoned;
        }
        let Some(done) = &xf.result else {
            panic!("{ctx}: never completed");
        };
        let (code, msg) = (done.code, done.msg.as_str());
        if msg.starts_with(LOST) {
            assert_eq!(code, ERR_BAD_STATE, "{ctx}: ({msg})");
            assert!(
                xf.must_lose || xf.may_lose,
                "{ctx}: lost ({msg}), but no lane it held work on died"
            );
            unspecified(exp_local, exp_target);
            return Ended::Lost;
        }
        assert!(
            !xf.must_lose,
            "{ctx}: a lane holding its work died, yet it ended with {code} ({msg})"
        );
        if msg == TIMEOUT {
            assert_eq!(code, ERR_BAD_STATE, "{ctx}");
            assert!(
                matches!(want, Want::TimedOut | Want::SuccessOrTimeout),
                "{ctx}: timed out"
            );
            assert!(done.at >= xf.deadline, "{ctx}: timed out early");
            unspecified(exp_local, exp_target);
            return Ended::TimedOut;
        }
        assert!(want != Want::TimedOut, "{ctx}: ended {code} ({msg})");
        // (code, inbound status) it must end with.
        let (want_code, want_inbound) = match want {
            Want::Success | Want::SuccessOrTimeout => (SUCCESS, Some(SUCCESS)),
            Want::Refused(c) => (c, Some(c)),
            Want::RefusedHere(c) => (c, None),
            Want::LocalFailure => {
                let prefix = match xf.spec.op {
                    Op::Write => STAGE_OUT_FAILED,
                    Op::Read => STAGE_IN_FAILED,
                };
                assert!(msg.starts_with(prefix), "{ctx}: message {msg:?}");
                let inbound = match (xf.spec.op, xf.multi()) {
                    (Op::Write, true) => Some(ERR_GPU_OP),
                    (Op::Write, false) => None,
                    (Op::Read, _) => Some(SUCCESS),
                };
                (ERR_GPU_OP, inbound)
            }
            Want::TimedOut => unreachable!(),
        };
        assert_eq!(code, want_code, "{ctx}: final status ({msg})");
        if want == Want::Refused(ERR_NOT_FOUND) {
            // An unknown id, a wrong key and a local-only region read the same.
            assert_eq!(msg, NOT_REGISTERED.msg, "{ctx}");
        }
        // With fences, a failed write's FINISHes may all have been lost with their lanes:
        // then its target never heard of the failure.
        let unheard = self.fences && want == Want::LocalFailure && xf.spec.op == Op::Write;
        match (want_inbound, inbound) {
            (None, None) => {}
            (Some(_), None) if unheard => {}
            (Some(w), Some(&(in_code, in_at))) => {
                assert_eq!(in_code, w, "{ctx}: inbound status");
                // (A FINISH whose lane died after it left may still reach the target.)
                assert!(
                    unheard || in_at < done.event,
                    "{ctx}: inbound recorded at event {in_at}, after completion at {}",
                    done.event
                );
            }
            (w, got) => panic!("{ctx}: inbound status {got:?}, want {w:?}"),
        }
        if let Want::RefusedHere(_) = want {
            assert!(!xf.dispatched && seen.chunks.is_empty(), "{ctx}");
            return Ended::AsWanted;
        }
        // Chunks are the transfer, cut once: every chunk was taken by a lane at most once
        // (checked as they were taken), and all of them when it ran to its end.
        let all: BTreeSet<u32> = (0..xf.n_chunks).collect();
        let taken: BTreeSet<u32> = xf.chunks.keys().copied().collect();
        let bytes_of = |cs: &BTreeSet<u32>| -> u64 {
            cs.iter().map(|c| xf.chunks[c].total_bytes()).sum::<u64>()
        };
        // The target saw only chunks that left, once each, with their bytes.
        assert!(
            seen.chunks.is_subset(&xf.sent),
            "{ctx}: chunks at the target"
        );
        assert_eq!(
            seen.bytes,
            bytes_of(&seen.chunks),
            "{ctx}: bytes at the target"
        );
        let failed_write = (want == Want::LocalFailure && xf.spec.op == Op::Write)
            .then_some(xf.fail_chunk)
            .flatten();
        match failed_write {
            Some(f) => {
                assert!(!xf.sent.contains(&f), "{ctx}: its failed chunk left");
                assert!(!seen.chunks.contains(&f), "{ctx}");
            }
            None => {
                assert_eq!(taken, all, "{ctx}: chunks taken");
                assert_eq!(seen.chunks, all, "{ctx}: chunks at the target");
                let total = xf.spec.layout.total_bytes();
                assert_eq!(bytes_of(&all), total, "{ctx}: chunks cover the transfer");
            }
        }
        // The bytes: a refused transfer moved none; a read whose chunk failed here has every
        // other chunk in place; a write whose chunk never left has the chunks the target saw.
        let landed: Vec<u32> = match want {
            Want::Refused(_) => Vec::new(),
            Want::LocalFailure if xf.spec.op == Op::Write => seen.chunks.iter().copied().collect(),
            _ => all
                .iter()
                .copied()
                .filter(|&c| !(want == Want::LocalFailure && xf.fail_chunk == Some(c)))
                .collect(),
        };
        for c in landed {
            for p in xf.chunks[&c].iter() {
                let (l, r, n) = (p.local as usize, p.remote as usize, p.len as usize);
                match xf.spec.op {
                    Op::Write => exp_target[r..r + n].copy_from_slice(&self.init_local[l..l + n]),
                    Op::Read => exp_local[l..l + n].copy_from_slice(&self.init_target[r..r + n]),
                }
            }
        }
        Ended::AsWanted
    }

    /// Everything observable at the end of a run, for determinism checks.
    pub fn digest(&self) -> Digest {
        (
            self.events,
            self.steps,
            self.local.clone(),
            self.target.clone(),
            self.xfers
                .iter()
                .map(|x| (x.uid, x.result.clone()))
                .collect(),
        )
    }

    /// Multi-chunk transfers whose join the target answered on a lane other than its home.
    pub fn joins_off_home(&self) -> usize {
        self.xfers
            .iter()
            .filter(|x| {
                self.answered
                    .get(&(x.inst, x.uid))
                    .is_some_and(|&(c, _)| self.conns[c].lane != x.home)
            })
            .count()
    }
}
