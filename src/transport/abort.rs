//! A flag that stops a payload from being read into memory whose transfer was cancelled: set
//! by another task of the shard, it wakes the reader, whose next receive then ends with
//! [`Aborted`] before it reads a byte (the flag is checked before every poll of a receive,
//! and bytes reach the destination only inside such a poll).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// Set once; shared by the task that reads a payload and the one that cancels its transfer.
#[derive(Debug, Default)]
pub(crate) struct Abort {
    set: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Abort {
    /// A flag not yet set.
    pub(crate) fn new() -> Rc<Self> {
        Rc::new(Self::default())
    }

    /// Set the flag and wake the reader waiting under it.
    pub(crate) fn abort(&self) {
        self.set.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Whether the flag is set.
    pub(crate) fn is_set(&self) -> bool {
        self.set.get()
    }

    fn register(&self, w: &Waker) {
        let mut slot = self.waker.borrow_mut();
        if !slot.as_ref().is_some_and(|old| old.will_wake(w)) {
            *slot = Some(w.clone());
        }
    }
}

/// A receive stopped by its [`Abort`] flag.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Aborted;

/// Run the receive `fut`, unless `abort` is (or becomes) set first: then [`Aborted`], and
/// `fut` is not polled again, so it places nothing more.
pub(crate) async fn guarded<T>(
    abort: Option<Rc<Abort>>,
    fut: impl Future<Output = io::Result<T>>,
) -> Result<io::Result<T>, Aborted> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        if let Some(a) = &abort {
            if a.is_set() {
                return Poll::Ready(Err(Aborted));
            }
            a.register(cx.waker());
        }
        fut.as_mut().poll(cx).map(Ok)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake};

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_set_flag_stops_the_receive_before_its_next_poll_and_wakes_it() {
        let polls = Cell::new(0);
        let a = Abort::new();
        let recv = std::future::poll_fn(|_| {
            polls.set(polls.get() + 1);
            Poll::<io::Result<usize>>::Pending
        });
        let mut g = std::pin::pin!(guarded(Some(a.clone()), recv));
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(g.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.get(), 1);
        a.abort();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the reader is woken");
        match g.as_mut().poll(&mut cx) {
            Poll::Ready(Err(Aborted)) => {}
            other => panic!("expected Aborted, got {other:?}"),
        }
        assert_eq!(
            polls.get(),
            1,
            "the receive is not polled after the flag is set"
        );
    }

    #[test]
    fn without_a_flag_the_receive_runs_as_is() {
        let mut g = std::pin::pin!(guarded(None, async { Ok::<_, io::Error>(7usize) }));
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(matches!(g.as_mut().poll(&mut cx), Poll::Ready(Ok(Ok(7)))));
    }
}
