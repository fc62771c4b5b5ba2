//! A shard-local doorbell: one task waits for "there is work" or "closed", others ring it.
//! Cheaper than a channel for the lane writer's wake-up (no atomics, no allocation).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::task::{Poll, Waker};

/// Rings coalesce: any number of rings before a wait wake it once.
#[derive(Debug, Default)]
pub(crate) struct Bell {
    rung: Cell<bool>,
    closed: Cell<bool>,
    waiter: RefCell<Option<Waker>>,
}

/// The bell was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed;

impl Bell {
    /// Wake the waiter (now, or its next wait returns at once).
    pub fn ring(&self) {
        self.rung.set(true);
        if let Some(w) = self.waiter.borrow_mut().take() {
            w.wake();
            // The waiter runs before the busy poller's next poll.
            morio_shards::rt::note_runnable();
        }
    }

    /// Close: the current and every later wait returns `Err(Closed)`.
    pub fn close(&self) {
        self.closed.set(true);
        if let Some(w) = self.waiter.borrow_mut().take() {
            w.wake();
        }
    }

    /// Wait for a ring (consuming it) or the close.
    pub fn wait(&self) -> impl Future<Output = Result<(), Closed>> + '_ {
        std::future::poll_fn(move |cx| {
            if self.closed.get() {
                return Poll::Ready(Err(Closed));
            }
            if self.rung.replace(false) {
                return Poll::Ready(Ok(()));
            }
            *self.waiter.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::{block_on, poll_once};

    #[test]
    fn rings_coalesce_and_close_sticks() {
        let b = Bell::default();
        assert_eq!(block_on(poll_once(b.wait())), None);
        b.ring();
        b.ring();
        assert_eq!(block_on(poll_once(b.wait())), Some(Ok(())));
        assert_eq!(block_on(poll_once(b.wait())), None);
        b.ring();
        b.close();
        assert_eq!(block_on(b.wait()), Err(Closed));
        assert_eq!(block_on(b.wait()), Err(Closed));
    }
}
