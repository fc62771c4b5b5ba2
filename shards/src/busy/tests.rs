//! Tests of the busy poller: waiters, probes, windows, stepping aside and the yielding tail.

use super::*;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Wake;

struct Count(AtomicUsize);
impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn pin_to_cpu0() {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the calls only read it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// A busy shard that shares its CPU with another thread that wants it is preempted, sees
/// it, and backs off: no busy polling, whatever activity comes, for the back-off.
#[test]
fn a_preempted_busy_shard_backs_off() {
    pin_to_cpu0();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rival = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            pin_to_cpu0();
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    enable(Duration::from_secs(60), Box::new(|| false));
    back_off_when_preempted();
    note_activity();
    let t0 = Instant::now();
    let mut backed_off = false;
    while !backed_off && t0.elapsed() < Duration::from_secs(10) {
        backed_off = BUSY.with(|b| {
            let mut b = b.borrow_mut();
            b.as_mut().unwrap().contention.check(Instant::now())
        });
    }
    stop.store(true, Ordering::Relaxed);
    rival.join().unwrap();
    assert!(
        backed_off,
        "two spinning threads on one CPU: one is preempted"
    );
    assert_eq!(backoffs(), 1);
    BUSY.with(|b| b.borrow_mut().as_mut().unwrap().busy_since_event = None);
    note_activity();
    assert!(
        BUSY.with(|b| b.borrow().as_ref().unwrap().busy_since_event.is_none()),
        "activity during the back-off does not start busy polling"
    );
}

/// A thread woken onto a busy shard's CPU (an application thread the scheduler put there)
/// runs at the poller's next offer, and taking the CPU so is no contention: the shard goes
/// on polling. Without offers the woken thread waited for the end of the busy window (the
/// kernel does not preempt the poller for it), or preempted it and made it back off.
#[test]
fn a_thread_woken_onto_a_busy_shards_cpu_runs_at_an_offer_without_a_back_off() {
    pin_to_cpu0();
    let ran = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let sharer = {
        let ran = ran.clone();
        std::thread::spawn(move || {
            pin_to_cpu0();
            while rx.recv().is_ok() {
                ran.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    enable(Duration::from_secs(60), Box::new(|| false));
    back_off_when_preempted();
    note_activity();
    let t0 = Instant::now();
    let mut sent = 0;
    while ran.load(Ordering::SeqCst) < 20 && t0.elapsed() < Duration::from_secs(20) {
        if sent == ran.load(Ordering::SeqCst) {
            tx.send(()).unwrap();
            sent += 1;
        }
        assert_ne!(turn(true), Turn::GoIdle, "the shard stepped aside");
    }
    drop(tx);
    sharer.join().unwrap();
    assert!(ran.load(Ordering::SeqCst) >= 20, "the sharer ran");
    assert_eq!(backoffs(), 0);
    assert!(handoffs() >= 1, "the sharer took the CPU at an offer");
}

#[test]
fn after_its_window_a_default_shard_yields_awake_for_the_tail_then_goes_idle() {
    let window = Duration::from_micros(100);
    let tail = yield_tail();
    let quiet_for = |ago: Duration| {
        BUSY.with(|b| {
            b.borrow_mut().as_mut().unwrap().busy_since_event = Some(Instant::now() - ago)
        });
        turn(false)
    };
    enable(window, Box::new(|| false));
    note_activity();
    assert_eq!(
        quiet_for(Duration::from_micros(150)),
        Turn::GoIdle,
        "a configured spin parks"
    );
    back_off_when_preempted();
    note_activity();
    assert_eq!(quiet_for(Duration::ZERO), Turn::Quiet, "within the window");
    if tail > Duration::from_micros(200) {
        assert_eq!(
            quiet_for(window + Duration::from_micros(50)),
            Turn::Quiet,
            "past the window, in the yielding tail: still awake"
        );
    }
    assert_eq!(
        quiet_for(window + tail + Duration::from_millis(1)),
        Turn::GoIdle,
        "past the tail: idle"
    );
}

/// A reader of shared memory polls itself only on a shard configured to spin, while its
/// last event is recent and the poller is not sending the executor round its loop.
#[test]
fn readers_poll_themselves_only_while_hot_on_spinning_shards() {
    assert!(!self_poll(), "no busy polling at all");
    enable(Duration::from_secs(60), Box::new(|| false));
    assert!(!self_poll(), "busy polling, but nothing happened yet");
    note_activity();
    assert!(self_poll(), "a configured spin, just active");
    assert!(
        SELF_POLLED.with(Cell::get),
        "the poller is told not to spin"
    );
    ROUND_TRIP.with(|c| c.set(true));
    assert!(!self_poll(), "not while the executor goes round its loop");
    ROUND_TRIP.with(|c| c.set(false));
    std::thread::sleep(HOT + Duration::from_millis(1));
    assert!(!self_poll(), "the last event is too old");
    back_off_when_preempted();
    note_activity();
    assert!(
        !self_poll(),
        "a shard that busy-polls by default waits for its poller"
    );
}

/// A reader that armed the runtime's readiness poll while the shard was idle is woken by
/// the poller once the shard is busy and its socket has bytes, exactly once.
#[test]
fn runtime_armed_readers_are_woken_by_the_busy_poller() {
    enable(Duration::from_secs(60), Box::new(|| false));
    let (mut tx, rx) = UnixStream::pair().unwrap();
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    let cx = Context::from_waker(&waker);
    // Idle: the reader waits on the runtime, and only tells the poller so.
    assert!(!wait_readable(rx.as_raw_fd(), &cx));
    note_armed(rx.as_raw_fd(), libc::POLLIN, &cx);
    assert!(matches!(turn(false), Turn::Idle));
    // Another socket's bytes make the shard busy; this one is still empty.
    note_activity();
    assert!(matches!(turn(false), Turn::Quiet));
    assert_eq!(count.0.load(Ordering::SeqCst), 0);
    tx.write_all(b"x").unwrap();
    assert!(matches!(turn(false), Turn::Woke));
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    assert_eq!(wakes(), 1);
    // Woken once and forgotten: the bytes still queued wake nobody again.
    assert!(matches!(turn(false), Turn::Quiet));
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
}

/// A reader the runtime woke itself (or that read its socket directly) is no longer
/// watched: its quiet socket is not polled on every turn afterwards.
#[test]
fn armed_sockets_are_forgotten_once_the_runtime_answered() {
    enable(Duration::from_secs(60), Box::new(|| false));
    let (_tx, rx) = UnixStream::pair().unwrap();
    let (_tx2, rx2) = UnixStream::pair().unwrap();
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    let cx = Context::from_waker(&waker);
    note_armed(rx.as_raw_fd(), libc::POLLIN, &cx);
    note_armed(rx.as_raw_fd(), libc::POLLOUT, &cx);
    note_armed(rx2.as_raw_fd(), libc::POLLIN, &cx);
    let armed = || BUSY.with(|b| b.borrow().as_ref().map_or(0, |b| b.armed.len()));
    assert_eq!(armed(), 3);
    forget_armed(rx.as_raw_fd(), libc::POLLIN);
    assert_eq!(armed(), 2, "only that socket and direction");
    forget_armed(rx.as_raw_fd(), libc::POLLOUT);
    forget_armed(rx2.as_raw_fd(), libc::POLLIN);
    assert_eq!(armed(), 0);
    note_activity();
    assert!(matches!(turn(false), Turn::Quiet));
    assert_eq!(count.0.load(Ordering::SeqCst), 0);
}

/// A task woken on the shard runs before the poller's next poll, but the poller never
/// yields two rounds in a row however often it is told to.
#[test]
fn woken_tasks_run_before_the_next_poll_but_never_starve_it() {
    let mut yielded = false;
    assert!(!yield_first(&mut yielded), "no hint: poll");
    note_runnable();
    assert!(yield_first(&mut yielded), "hint: yield first");
    note_runnable();
    assert!(
        !yield_first(&mut yielded),
        "a second hint in a row: poll anyway"
    );
    assert!(!yield_first(&mut yielded), "that hint was used up");
    note_runnable();
    assert!(
        yield_first(&mut yielded),
        "after a poll, a hint yields again"
    );
}

/// Long round trips only while no short timer is pending.
#[test]
fn short_timers_keep_round_trips_tight() {
    assert_eq!(
        round_trip_bounds(),
        (ROUND_TRIP_QUIET_UNTIMED, ROUND_TRIP_MAX_UNTIMED)
    );
    SHORT_SLEEPS.with(|n| n.set(1));
    assert_eq!(round_trip_bounds(), (ROUND_TRIP_QUIET, ROUND_TRIP_MAX));
    SHORT_SLEEPS.with(|n| n.set(0));
}

/// A probe that says what `flag` holds, and a waker that counts its wakes.
fn flagged_probe() -> (std::rc::Rc<std::cell::Cell<bool>>, Probe, Arc<Count>, Waker) {
    let flag = std::rc::Rc::new(std::cell::Cell::new(false));
    let f = flag.clone();
    let probe: Probe = std::rc::Rc::new(move || f.get());
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    (flag, probe, count, waker)
}

/// A reader of shared memory waits on its probe only while the shard is busy, is woken
/// once when the probe says yes, and is handed back when the shard goes idle.
#[test]
fn probe_waiters_are_woken_by_their_probe() {
    enable(Duration::from_millis(50), Box::new(|| false));
    let (flag, probe, count, waker) = flagged_probe();
    let cx = Context::from_waker(&waker);
    assert!(
        !wait_probe(&probe, &cx),
        "idle: the reader arms its own wake-up"
    );
    note_activity();
    assert!(wait_probe(&probe, &cx));
    assert!(
        wait_probe(&probe, &cx),
        "registering twice keeps one waiter"
    );
    assert!(matches!(turn(false), Turn::Quiet));
    flag.set(true);
    assert!(matches!(turn(false), Turn::Woke));
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    assert!(
        matches!(turn(false), Turn::Quiet),
        "woken once, then forgotten"
    );
    flag.set(false);
    assert!(wait_probe(&probe, &cx));
    std::thread::sleep(Duration::from_millis(60));
    assert!(matches!(turn(false), Turn::GoIdle));
    hand_back();
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        2,
        "handed back on going idle"
    );
    assert!(!wait_probe(&probe, &cx));
}

/// A reader that waits on the runtime for a doorbell is woken by the busy poller once the
/// shard is busy and its probe says yes; a reader that went away is forgotten, and what
/// its probe held is freed.
#[test]
fn armed_probes_are_checked_while_busy_and_forgotten_when_gone() {
    enable(Duration::from_secs(60), Box::new(|| false));
    let (flag, probe, count, waker) = flagged_probe();
    let cx = Context::from_waker(&waker);
    note_armed_probe(&probe, &cx);
    flag.set(true);
    assert!(
        matches!(turn(false), Turn::Idle),
        "idle: the runtime's doorbell wakes it"
    );
    note_activity();
    assert!(matches!(turn(false), Turn::Woke));
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    assert!(
        matches!(turn(false), Turn::Quiet),
        "woken once, then forgotten"
    );
    // A reader that is dropped while waiting: its probe (and what it holds) is freed.
    let held = std::rc::Rc::new(());
    let h = held.clone();
    let gone: Probe = std::rc::Rc::new(move || {
        let _ = &h;
        false
    });
    note_armed_probe(&gone, &cx);
    drop(gone);
    assert!(matches!(turn(false), Turn::Quiet));
    assert_eq!(std::rc::Rc::strong_count(&held), 1, "the probe was freed");
    BUSY.with(|b| assert!(b.borrow().as_ref().unwrap().armed_probes.is_empty()));
}

/// A shared-memory reader's socket is polled now and then, not every turn, and still
/// wakes its reader when the peer closes it.
#[test]
fn watched_sockets_are_polled_now_and_then() {
    enable(Duration::from_secs(60), Box::new(|| false));
    let (tx, rx) = UnixStream::pair().unwrap();
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    let cx = Context::from_waker(&waker);
    note_activity();
    assert!(watch_readable(rx.as_raw_fd(), &cx));
    drop(tx);
    let mut turns = 0;
    while count.0.load(Ordering::SeqCst) == 0 {
        turn(false);
        turns += 1;
        assert!(turns <= WATCH_EVERY as usize, "never polled");
    }
    assert!(turns > 1, "polled every turn");
}

/// A task waiting on a Unix-domain socket through [`crate::rt::UnixReader`] on a busy shard
/// is woken by the poller when a byte arrives (a plain glommio read would wait for the
/// runtime, which a busy shard's poller lets round its loop only now and then: up to a
/// millisecond; same-host senders wait on such a socket for their peer's acknowledgement).
#[test]
fn unix_readers_on_a_busy_shard_are_woken_by_the_poller() {
    use futures_lite::AsyncReadExt;
    let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(1 << 20)
        .make()
        .unwrap();
    ex.run(async {
        enable(Duration::from_secs(60), Box::new(|| false));
        note_activity();
        glommio::spawn_local(poller()).detach();
        let (tx, rx) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            (&tx).write_all(b"x").unwrap();
            tx
        });
        let mut r = crate::rt::UnixReader::from_fd(rx.into());
        let mut b = [0u8; 8];
        assert_eq!(r.read(&mut b).await.unwrap(), 1);
        assert_eq!(wakes(), 1, "the poller woke the reader");
        drop(writer.join().unwrap());
        assert_eq!(r.read(&mut b).await.unwrap(), 0, "the peer's end");
    });
}
