//! A shard's pinned staging pool: fixed-size slots, all pinned when the pool is first used (up
//! to a byte cap) and then reused, so staging memory is bounded by the config, never grows
//! with a transfer, and no transfer after the first waits for memory to be pinned.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use morio_shards::rt;

use super::{GpuError, GpuFence, GpuRuntime, PinnedBuf};

/// The pool. Shard-local (`Rc`); slots go back to it when dropped.
#[derive(Debug)]
pub(crate) struct Staging {
    gpu: Arc<dyn GpuRuntime>,
    slot_bytes: usize,
    cap_slots: usize,
    free: RefCell<Vec<PinnedBuf>>,
    allocated: Cell<usize>,
    in_use: Cell<usize>,
    peak_in_use: Cell<usize>,
    waiters: RefCell<Vec<Waker>>,
}

/// A staging slot, with the fence of the last copy that uses it. Dropping it waits for that
/// copy (so memory a copy engine still uses is never handed out again) and returns it.
#[derive(Debug)]
pub(crate) struct Slot {
    pool: Rc<Staging>,
    buf: Option<PinnedBuf>,
    fence: Option<Box<dyn GpuFence>>,
}

impl Staging {
    /// A pool of `cap_bytes / slot_bytes` slots (at least one) of `slot_bytes`.
    pub(crate) fn new(gpu: Arc<dyn GpuRuntime>, slot_bytes: usize, cap_bytes: usize) -> Rc<Self> {
        Rc::new(Self {
            gpu,
            slot_bytes,
            cap_slots: (cap_bytes / slot_bytes.max(1)).max(1),
            free: RefCell::new(Vec::new()),
            allocated: Cell::new(0),
            in_use: Cell::new(0),
            peak_in_use: Cell::new(0),
            waiters: RefCell::new(Vec::new()),
        })
    }

    /// Pin every slot the cap allows now, so that no later transfer stalls its shard on a
    /// pinning call (`cuMemHostAlloc` takes milliseconds, blocks the shard's thread and
    /// serialises with the driver's other work). Stops at the first failure: the slots
    /// pinned so far serve, and a pool that could pin none reports the error when a slot is
    /// asked for, as a lazily filled one would.
    pub(crate) fn fill(&self) {
        let mut fresh = Vec::new();
        while self.allocated.get() + fresh.len() < self.cap_slots {
            match self.gpu.alloc_pinned(self.slot_bytes) {
                Ok(b) => fresh.push(b),
                Err(e) => {
                    log::debug!(
                        "staging pool pinned {} of {} slots: {e}",
                        fresh.len(),
                        self.cap_slots
                    );
                    break;
                }
            }
        }
        self.allocated.set(self.allocated.get() + fresh.len());
        self.free.borrow_mut().extend(fresh);
    }

    /// Bytes per slot.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Pinned bytes this pool holds (allocated, free or in use).
    pub(crate) fn pinned_bytes(&self) -> usize {
        self.allocated.get() * self.slot_bytes
    }

    /// Most bytes in use at once so far.
    pub(crate) fn peak_bytes(&self) -> usize {
        self.peak_in_use.get() * self.slot_bytes
    }

    /// A slot if one is free or may still be allocated.
    pub(crate) fn try_acquire(self: &Rc<Self>) -> Result<Option<Slot>, GpuError> {
        let buf = match self.free.borrow_mut().pop() {
            Some(b) => b,
            None if self.allocated.get() < self.cap_slots => {
                let b = self.gpu.alloc_pinned(self.slot_bytes)?;
                self.allocated.set(self.allocated.get() + 1);
                b
            }
            None => return Ok(None),
        };
        let n = self.in_use.get() + 1;
        self.in_use.set(n);
        self.peak_in_use.set(self.peak_in_use.get().max(n));
        Ok(Some(Slot {
            pool: self.clone(),
            buf: Some(buf),
            fence: None,
        }))
    }

    /// A slot, waiting for one to come back if all are in use.
    pub(crate) async fn acquire(self: &Rc<Self>) -> Result<Slot, GpuError> {
        std::future::poll_fn(|cx| match self.try_acquire() {
            Ok(Some(s)) => Poll::Ready(Ok(s)),
            Ok(None) => {
                self.waiters.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        })
        .await
    }

    fn release(&self, buf: PinnedBuf) {
        self.free.borrow_mut().push(buf);
        self.in_use.set(self.in_use.get() - 1);
        // Wake every waiter: one may have gone away, and the rest retry cheaply.
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in waiters {
            w.wake();
        }
    }
}

impl Slot {
    /// The slot's bytes.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.buf.as_mut().map_or(&mut [], |b| b.as_mut_slice())
    }

    /// The slot's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| b.as_slice())
    }

    /// Base pointer, for copy calls.
    pub(crate) fn ptr(&mut self) -> *mut u8 {
        self.bytes_mut().as_mut_ptr()
    }

    /// Remember the fence of the copy that now uses the slot.
    pub(crate) fn set_fence(&mut self, f: Box<dyn GpuFence>) {
        self.fence = Some(f);
    }

    /// Wait, without blocking the executor, until the slot's copy has completed.
    pub(crate) async fn settle(&mut self, limit: Duration) -> Result<(), GpuError> {
        if let Some(f) = &self.fence {
            wait_fence(&**f, limit).await?;
        }
        self.fence = None;
        Ok(())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(f) = self.fence.take() {
            if !matches!(f.poll(), Ok(true)) {
                // Only on error paths: the copy engine may still use this memory.
                let _ = f.wait_blocking();
            }
        }
        if let Some(b) = self.buf.take() {
            self.pool.release(b);
        }
    }
}

/// Poll `f` until it completes: yielding to the shard's other tasks (a slot's copy takes
/// microseconds, and a timer nap would cost a park and a wake-up), then, past `SPIN`, short
/// timer naps so a stalled copy does not keep the shard spinning.
pub(crate) async fn wait_fence(f: &dyn GpuFence, limit: Duration) -> Result<(), GpuError> {
    const SPIN: Duration = Duration::from_micros(200);
    let t0 = Instant::now();
    loop {
        if f.poll()? {
            return Ok(());
        }
        let waited = t0.elapsed();
        if waited > limit {
            return Err(GpuError::Timeout(limit));
        }
        if waited < SPIN {
            futures_lite::future::yield_now().await;
        } else {
            rt::sleep(Duration::from_micros(20)).await;
        }
    }
}
