//! The timed loop of one row, as MORI's `run_single_once` / `run_batch_once`: a fresh uid per
//! transfer; non-batch mode issues `batch` single calls (at the row's strided, contiguous or
//! scattered offsets, unlike MORI's bug #611) and waits on each; batch mode issues one batch call
//! (session form, or the engine form with one-element outer lists) and waits on it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use morio::{IoEngine, IoEngineSession, MemoryDesc, TransferStatus};

use super::args::OpType;
use super::data;

/// How the initiator issues transfers.
#[derive(Debug)]
pub struct Runner<'a> {
    /// The initiator's engine.
    pub engine: &'a IoEngine,
    /// Session over (local, remote), with `--enable-sess`.
    pub session: Option<&'a IoEngineSession>,
    /// The initiator's buffer.
    pub local: &'a MemoryDesc,
    /// The target's buffer.
    pub remote: &'a MemoryDesc,
    /// Direction.
    pub op: OpType,
    /// One batch call per iteration.
    pub batch_mode: bool,
    /// Where the transfers lie.
    pub layout: data::Layout,
}

/// One row's argument lists, built before the clock starts.
struct Lists {
    offs: Vec<usize>,
    sizes: Vec<usize>,
    outer_offs: Vec<Vec<usize>>,
    outer_sizes: Vec<Vec<usize>>,
    locals: Vec<MemoryDesc>,
    remotes: Vec<MemoryDesc>,
}

impl Runner<'_> {
    /// Run `warmup` untimed and `iters` timed iterations of `batch` transfers of `size` bytes;
    /// `tick` is called after each iteration. Any failed transfer fails the row.
    pub fn row(
        &self,
        size: usize,
        batch: usize,
        warmup: usize,
        iters: usize,
        tick: &dyn Fn(),
    ) -> anyhow::Result<Vec<Duration>> {
        let offs = data::offsets(size, batch, self.layout);
        let sizes = vec![size; batch];
        let l = Lists {
            outer_offs: vec![offs.clone()],
            outer_sizes: vec![sizes.clone()],
            locals: vec![self.local.clone()],
            remotes: vec![self.remote.clone()],
            offs,
            sizes,
        };
        for _ in 0..warmup {
            self.once(&l)?;
            tick();
        }
        let mut out = Vec::with_capacity(iters);
        for _ in 0..iters {
            out.push(self.once(&l)?);
            tick();
        }
        Ok(out)
    }

    fn uid(&self) -> u64 {
        match self.session {
            Some(s) => s.allocate_transfer_uid(),
            None => self.engine.allocate_transfer_uid(),
        }
    }

    fn once(&self, l: &Lists) -> anyhow::Result<Duration> {
        if self.batch_mode {
            let uid = self.uid();
            let t = Instant::now();
            morio::trace::mark(uid, morio::trace::stage::CALL);
            let st = self.batch_call(l, uid);
            st.wait();
            let d = t.elapsed();
            morio::trace::mark(uid, morio::trace::stage::WOKE);
            check(&st, 0, 1, uid)?;
            return Ok(d);
        }
        let uids: Vec<u64> = l.offs.iter().map(|_| self.uid()).collect();
        let t = Instant::now();
        let sts: Vec<Arc<TransferStatus>> = l
            .offs
            .iter()
            .zip(&uids)
            .map(|(&o, &uid)| {
                morio::trace::mark(uid, morio::trace::stage::CALL);
                self.single_call(o, l.sizes[0], uid)
            })
            .collect();
        for (st, &uid) in sts.iter().zip(&uids) {
            st.wait();
            morio::trace::mark(uid, morio::trace::stage::WOKE);
        }
        let d = t.elapsed();
        for (i, (st, &uid)) in sts.iter().zip(&uids).enumerate() {
            check(st, i, sts.len(), uid)?;
        }
        Ok(d)
    }

    fn single_call(&self, off: usize, size: usize, uid: u64) -> Arc<TransferStatus> {
        let (e, lo, ro) = (self.engine, self.local, self.remote);
        match (self.session, self.op) {
            (Some(s), OpType::Read) => s.read(off, off, size, uid),
            (Some(s), OpType::Write) => s.write(off, off, size, uid),
            (None, OpType::Read) => e.read(lo, off, ro, off, size, uid),
            (None, OpType::Write) => e.write(lo, off, ro, off, size, uid),
        }
    }

    fn batch_call(&self, l: &Lists, uid: u64) -> Arc<TransferStatus> {
        let e = self.engine;
        let (lo, ro, sz) = (&l.outer_offs, &l.outer_offs, &l.outer_sizes);
        let mut sts = match (self.session, self.op) {
            (Some(s), OpType::Read) => return s.batch_read(&l.offs, &l.offs, &l.sizes, uid),
            (Some(s), OpType::Write) => return s.batch_write(&l.offs, &l.offs, &l.sizes, uid),
            (None, OpType::Read) => e.batch_read(&l.locals, lo, &l.remotes, ro, sz, &[uid]),
            (None, OpType::Write) => e.batch_write(&l.locals, lo, &l.remotes, ro, sz, &[uid]),
        };
        sts.pop().unwrap_or_else(|| {
            let s = TransferStatus::new();
            s.update(
                morio::StatusCode::ErrBadState,
                "batch call returned no status",
            );
            Arc::new(s)
        })
    }
}

fn check(st: &TransferStatus, i: usize, n: usize, uid: u64) -> anyhow::Result<()> {
    let code = st.code();
    if code != morio::StatusCode::Success {
        bail!(
            "transfer {i} of {n} (uid {uid}) failed: {code} ({}) {}",
            code.as_u32(),
            st.message()
        );
    }
    Ok(())
}
