//! Socket busy polling for shards that spin: while a shard is busy, readers that find their
//! socket empty (and writers that find it full) wait here instead of on an io_uring
//! readiness poll, and a poller task checks all of them, and the shard's inbox, with
//! non-blocking `poll(2)` calls.
//!
//! Why: a readiness poll armed in io_uring completes through task work that the kernel runs
//! on the shard's thread, which (on the VMs we measure on) costs several microseconds per
//! message before the reader even runs, and glommio's own spin loop cannot shorten it.
//! `poll(2)` sees bytes the moment the sender's `send` queued them.
//!
//! States: *idle* (every reader waits on the runtime, as without busy polling) and *busy*.
//! Bytes read from any socket of the shard make it busy; it goes back to idle once no
//! socket has become readable for the spin window, and then hands every waiting reader back
//! to the runtime by waking it (it re-polls, finds the shard idle, and arms readiness).
//! A shard that busy-polls by default (not a configured spin) also goes idle, and stays
//! there for a while, when it was preempted while busy ([`contention`]).

mod contention;

use contention::Contention;
use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How long the poller sleeps between turns while busy: just long enough to send the
/// executor once round its loop (reactor, then every runnable task).
const POLL_PERIOD: Duration = Duration::from_nanos(500);

/// How long one turn of the poller polls inside its task at most. A turn ends at once when
/// it wakes anyone.
const TURN: Duration = Duration::from_micros(10);

/// The poller sends the executor round its whole loop (reactor: timers, the runtime's own
/// completions) once the shard has been quiet for this long since the last round...
const ROUND_TRIP_QUIET: Duration = Duration::from_micros(50);

/// ... or, under steady traffic, at least this often. A round trip takes a few
/// microseconds in which the poller is not polling, so it is put where it is least likely
/// to delay a message: in a quiet stretch longer than a small transfer's round trip.
const ROUND_TRIP_MAX: Duration = Duration::from_micros(200);

/// The two bounds above while no short timer ([`SHORT_TIMER`]) is pending on the shard:
/// then only long timers (deadline ticks, stall timeouts) and rare completions (accepts,
/// dials) wait for a round trip, and being a few milliseconds late costs them nothing,
/// while every round trip on a shard in the middle of a transfer delays it. (Sockets whose
/// readiness poll the runtime armed while the shard was idle do not wait for it: the
/// poller watches them too, see `Busy::armed`.)
const ROUND_TRIP_QUIET_UNTIMED: Duration = Duration::from_millis(1);
const ROUND_TRIP_MAX_UNTIMED: Duration = Duration::from_millis(5);

/// Sleeps shorter than this (a GPU fence's naps, say) are short timers: while one is
/// pending the poller keeps the tight round-trip bounds, so it fires on time.
pub(crate) const SHORT_TIMER: Duration = Duration::from_millis(1);

/// A reader of shared memory (a same-host ring) waiting until `probe` says it has bytes.
/// Held weakly: a reader that goes away (its connection closed) is forgotten, and whatever
/// its probe keeps alive (the ring's mapping) goes with it.
struct ProbeWaiter {
    probe: std::rc::Weak<dyn Fn() -> bool>,
    waker: Waker,
}

impl ProbeWaiter {
    /// Whether the probe says yes (`Some(true)`), no, or its reader is gone (`None`).
    fn ready(&self) -> Option<bool> {
        self.probe.upgrade().map(|p| p())
    }
}

/// Says whether a shared-memory source a reader waits on has something for it (cheap: a
/// load or two, no system call).
pub type Probe = std::rc::Rc<dyn Fn() -> bool>;

struct Waiter {
    fd: RawFd,
    /// `POLLIN` or `POLLOUT`.
    events: i16,
    waker: Waker,
}

struct Busy {
    window: Duration,
    /// `Some(last event)` while busy.
    busy_since_event: Option<Instant>,
    waiters: Vec<Waiter>,
    /// Readers and writers waiting on a readiness poll armed in the runtime (the shard was
    /// idle when they found their socket empty or full). That poll completes only when the
    /// executor goes round its loop, which a busy shard does rarely, so while busy the
    /// poller watches these sockets too and wakes them the moment they are ready.
    armed: Vec<Waiter>,
    /// Readers of shared memory, checked every turn before the sockets.
    probes: Vec<ProbeWaiter>,
    /// Readers of shared memory that wait on the runtime (for a doorbell: the shard was idle
    /// when they found their ring empty); while busy, the poller checks them too, since the
    /// doorbell's completion would wait for the executor's next round trip.
    armed_probes: Vec<ProbeWaiter>,
    /// Their sockets, which matter only when the peer goes away (its doorbells come only to
    /// parked readers, never to these): polled every [`WATCH_EVERY`] polls.
    watched: Vec<Waiter>,
    /// Polls of the sockets so far.
    polls: u32,
    /// The poller task, parked while the shard is idle.
    poller: Option<Waker>,
    pollfds: Vec<libc::pollfd>,
    /// Readers and writers woken by the poller so far.
    wakes: u64,
    /// Whether the shard's inbox holds messages (checked by the poller while busy).
    inbox_probe: Option<Box<dyn Fn() -> bool>>,
    /// The shard's message loop, waiting for its inbox.
    inbox_waiter: Option<Waker>,
    /// Whether it steps aside when preempted, and when it did.
    contention: Contention,
}

/// How long after the shard's last event a reader of shared memory keeps polling its ring
/// itself ([`self_poll`]) instead of waiting for the poller to wake it.
const HOT: Duration = Duration::from_micros(30);

thread_local! {
    /// A reader polled itself since the poller's last turn (the poller then does not spin
    /// inside its turn, which would hold that reader up).
    static SELF_POLLED: Cell<bool> = const { Cell::new(false) };
    /// The poller is sending the executor round its whole loop (a timer sleep): readers wait
    /// on it, so the executor's queue can empty.
    static ROUND_TRIP: Cell<bool> = const { Cell::new(false) };
    static BUSY: RefCell<Option<Busy>> = const { RefCell::new(None) };
    /// Short timers ([`SHORT_TIMER`]) pending on this thread.
    static SHORT_SLEEPS: Cell<usize> = const { Cell::new(0) };
    /// A task on this thread woke another since the poller's last turn ([`note_runnable`]).
    static RUNNABLE: Cell<bool> = const { Cell::new(false) };
}

/// A task on the calling shard just woke another one on it (a connection writer, say): the
/// busy poller's next turn yields to it before polling. Without the hint, the woken task
/// lands behind the poller in the run queue and waits for one `poll(2)` over every waiting
/// socket (most of a microsecond on the VMs we measure on) before it runs.
pub(crate) fn note_runnable() {
    RUNNABLE.with(|r| r.set(true));
}

/// Sleep for `d` on the calling shard; a short sleep keeps the busy poller's round trips
/// frequent while it is pending (see [`ROUND_TRIP_MAX_UNTIMED`]).
pub(crate) async fn sleep(d: Duration) {
    struct Pending;
    impl Drop for Pending {
        fn drop(&mut self) {
            SHORT_SLEEPS.with(|n| n.set(n.get().saturating_sub(1)));
        }
    }
    let _pending = (d < SHORT_TIMER).then(|| {
        SHORT_SLEEPS.with(|n| n.set(n.get() + 1));
        Pending
    });
    glommio::timer::sleep(d).await;
}

/// The round-trip bounds (quiet, max) for the calling shard now.
fn round_trip_bounds() -> (Duration, Duration) {
    if SHORT_SLEEPS.with(Cell::get) > 0 {
        (ROUND_TRIP_QUIET, ROUND_TRIP_MAX)
    } else {
        (ROUND_TRIP_QUIET_UNTIMED, ROUND_TRIP_MAX_UNTIMED)
    }
}

/// Turn busy polling on for the calling shard's thread, with this spin window;
/// `inbox_probe` tells whether the shard's inbox holds messages.
pub(crate) fn enable(window: Duration, inbox_probe: Box<dyn Fn() -> bool>) {
    BUSY.with(|b| {
        *b.borrow_mut() = Some(Busy {
            window,
            busy_since_event: None,
            waiters: Vec::new(),
            armed: Vec::new(),
            probes: Vec::new(),
            armed_probes: Vec::new(),
            watched: Vec::new(),
            polls: 0,
            poller: None,
            pollfds: Vec::new(),
            wakes: 0,
            inbox_probe: Some(inbox_probe),
            inbox_waiter: None,
            contention: Contention::default(),
        })
    });
}

/// Make the calling shard's busy poller step aside for a while (`contention`) whenever the shard
/// was preempted while it polled (after [`enable`]).
pub(crate) fn back_off_when_preempted() {
    BUSY.with(|b| {
        if let Some(b) = b.borrow_mut().as_mut() {
            b.contention.on = true;
        }
    });
}

/// Times the calling shard stopped busy polling because it was preempted.
pub(crate) fn backoffs() -> u64 {
    BUSY.with(|b| b.borrow().as_ref().map_or(0, |b| b.contention.backoffs))
}

/// Times the calling shard's busy poller found that another thread had taken its CPU when
/// offered (a thread sharing the shard's CPU).
pub(crate) fn handoffs() -> u64 {
    BUSY.with(|b| b.borrow().as_ref().map_or(0, |b| b.contention.handoffs))
}

/// Wait until the poller sees messages in the inbox (never completes on a shard that does
/// not busy-poll, or while it is idle: the inbox's own wake-up covers those).
///
/// Why: a message from another thread wakes the shard through glommio's foreign-wake queue,
/// which the executor drains only between task-queue runs; a busy shard sees the message
/// one poll later instead.
pub(crate) fn inbox_ready() -> impl std::future::Future<Output = ()> {
    let mut armed = false;
    std::future::poll_fn(move |cx| {
        if armed {
            // Woken by the poller (or spuriously): let the caller look at the inbox.
            return Poll::Ready(());
        }
        BUSY.with(|b| {
            if let Some(b) = b.borrow_mut().as_mut() {
                b.inbox_waiter = Some(cx.waker().clone());
                armed = true;
            }
        });
        Poll::Pending
    })
}

/// Whether the calling shard is busy-polling now.
pub(crate) fn is_busy() -> bool {
    BUSY.with(|b| {
        b.borrow()
            .as_ref()
            .is_some_and(|b| b.busy_since_event.is_some())
    })
}

/// Readers the calling shard's poller has woken (0 where busy polling is off).
pub(crate) fn wakes() -> u64 {
    BUSY.with(|b| b.borrow().as_ref().map_or(0, |b| b.wakes))
}

/// A reader found `fd` empty: if the shard is busy, wait here (`true`: the caller returns
/// `Pending` without arming the runtime's readiness); else `false`.
pub(crate) fn wait_readable(fd: RawFd, cx: &Context<'_>) -> bool {
    register(fd, libc::POLLIN, cx)
}

/// A writer found `fd` full: as [`wait_readable`], for writability.
pub(crate) fn wait_writable(fd: RawFd, cx: &Context<'_>) -> bool {
    register(fd, libc::POLLOUT, cx)
}

fn register(fd: RawFd, events: i16, cx: &Context<'_>) -> bool {
    BUSY.with(|b| {
        let mut b = b.borrow_mut();
        let Some(b) = b.as_mut().filter(|b| b.busy_since_event.is_some()) else {
            return false;
        };
        add(&mut b.waiters, fd, events, cx);
        true
    })
}

/// Sockets of shared-memory readers are polled once every this many polls of the others.
const WATCH_EVERY: u32 = 64;

/// A shared-memory reader waiting on the busy poller also wants to hear when its
/// connection's socket `fd` becomes readable (the peer closed it), which is rare: it is
/// polled now and then, not every turn.
pub(crate) fn watch_readable(fd: RawFd, cx: &Context<'_>) -> bool {
    BUSY.with(|b| {
        let mut b = b.borrow_mut();
        let Some(b) = b.as_mut().filter(|b| b.busy_since_event.is_some()) else {
            return false;
        };
        add(&mut b.watched, fd, libc::POLLIN, cx);
        true
    })
}

/// A reader of shared memory found it empty: if the shard is busy, the poller checks `probe`
/// every turn and wakes the reader once it says yes (`true`: return `Pending`); else
/// `false`, and the reader must arrange its own wake-up.
pub(crate) fn wait_probe(probe: &Probe, cx: &Context<'_>) -> bool {
    BUSY.with(|b| {
        let mut b = b.borrow_mut();
        let Some(b) = b.as_mut().filter(|b| b.busy_since_event.is_some()) else {
            return false;
        };
        add_probe(&mut b.probes, probe, cx);
        true
    })
}

/// A reader of shared memory now waits on the runtime (a doorbell): should the shard turn
/// busy before that completes, the poller checks `probe` and wakes the reader as soon as it
/// says yes.
pub(crate) fn note_armed_probe(probe: &Probe, cx: &Context<'_>) {
    BUSY.with(|b| {
        if let Some(b) = b.borrow_mut().as_mut() {
            add_probe(&mut b.armed_probes, probe, cx);
        }
    })
}

/// Add a waiter on `probe` to `list`, or give the existing one this waker.
fn add_probe(list: &mut Vec<ProbeWaiter>, probe: &Probe, cx: &Context<'_>) {
    let weak = std::rc::Rc::downgrade(probe);
    match list.iter_mut().find(|w| w.probe.ptr_eq(&weak)) {
        Some(w) => w.waker.clone_from(cx.waker()),
        None => list.push(ProbeWaiter {
            probe: weak,
            waker: cx.waker().clone(),
        }),
    }
}

/// A reader (`POLLIN`) or writer (`POLLOUT`) of `fd` now waits on a readiness poll armed in
/// the runtime: should the shard turn busy before that poll completes, the poller wakes it
/// as soon as `fd` is ready instead of leaving it to the executor's next round trip.
pub(crate) fn note_armed(fd: RawFd, events: i16, cx: &Context<'_>) {
    BUSY.with(|b| {
        if let Some(b) = b.borrow_mut().as_mut() {
            add(&mut b.armed, fd, events, cx);
        }
    })
}

/// The runtime's readiness poll for `(fd, events)` completed, or the socket was read or
/// written directly: whoever noted it with [`note_armed`] no longer waits on it, so the
/// poller stops watching it. (Without this, a socket that came ready through the runtime
/// while the shard was busy and then stayed quiet, as a same-host lane's does once its bytes
/// move through shared memory, was polled on every turn for the rest of its life.)
pub(crate) fn forget_armed(fd: RawFd, events: i16) {
    BUSY.with(|b| {
        if let Some(b) = b.borrow_mut().as_mut() {
            if !b.armed.is_empty() {
                b.armed.retain(|w| !(w.fd == fd && w.events == events));
            }
        }
    })
}

/// Add a waiter for `(fd, events)` to `list`, or give the existing one this waker.
fn add(list: &mut Vec<Waiter>, fd: RawFd, events: i16, cx: &Context<'_>) {
    match list.iter_mut().find(|w| w.fd == fd && w.events == events) {
        Some(w) => w.waker.clone_from(cx.waker()),
        None => list.push(Waiter {
            fd,
            events,
            waker: cx.waker().clone(),
        }),
    }
}

/// Bytes were read: the shard is (still) busy.
pub(crate) fn note_activity() {
    BUSY.with(|b| {
        let mut b = b.borrow_mut();
        let Some(b) = b.as_mut() else { return };
        let now = Instant::now();
        if b.contention.backing_off(now) {
            // Backing off after contention: stay idle (wait on the runtime).
            return;
        }
        if b.busy_since_event.is_none() {
            b.contention.start_spell();
            if let Some(p) = b.poller.take() {
                p.wake();
            }
        }
        b.busy_since_event = Some(now);
    })
}

/// What one turn of the poller ended with.
#[derive(Debug, PartialEq, Eq)]
enum Turn {
    /// The shard is idle (or never busy-polls).
    Idle,
    /// Nothing happened for the spin window: hand everything back to the runtime.
    GoIdle,
    /// Woke someone.
    Woke,
    /// Polled for a whole turn and saw nothing.
    Quiet,
}

/// One turn: poll the inbox and the waiting sockets once, or (`spin`) until something is
/// ready, the turn is over, or the spin window has passed without an event.
fn turn(spin: bool) -> Turn {
    BUSY.with(|b| {
        let mut b = b.borrow_mut();
        let Some(b) = b.as_mut() else {
            return Turn::Idle;
        };
        let Some(last) = b.busy_since_event else {
            return Turn::Idle;
        };
        let start = Instant::now();
        loop {
            let inbox = b.inbox_waiter.is_some() && b.inbox_probe.as_ref().is_some_and(|p| p());
            if inbox {
                if let Some(w) = b.inbox_waiter.take() {
                    w.wake();
                }
            }
            if poll_probes(b) + poll_waiters(b) > 0 || inbox {
                b.busy_since_event = Some(Instant::now());
                return Turn::Woke;
            }
            let now = Instant::now();
            let quiet = now.duration_since(last);
            if quiet > b.window {
                if b.contention.on && quiet <= b.window + yield_tail() {
                    // The yielding tail: awake, but any thread that wants this CPU gets it,
                    // so being preempted here is no contention (the next busy spell counts
                    // afresh).
                    b.contention.start_spell();
                    // SAFETY: sched_yield has no memory effects.
                    unsafe { libc::sched_yield() };
                    return Turn::Quiet;
                }
                return Turn::GoIdle;
            }
            b.contention.offer_cpu(now, quiet);
            if b.contention.check(now) {
                return Turn::GoIdle;
            }
            if !spin || now.duration_since(start) > TURN {
                return Turn::Quiet;
            }
            std::hint::spin_loop();
        }
    })
}

/// How long a default busy-polling shard stays awake after its busy window, polling once per
/// turn and yielding its CPU between turns (`sched_yield`) instead of parking:
/// `MORIO_BUSY_YIELD_US` (µs; 0: park at the window's end), 1 ms by default. Work that comes
/// back soon after the window (a request every 120 µs against a 100 µs window) then finds
/// the shard awake instead of paying a wake-up from park, which on a VM costs tens of
/// microseconds and kept such traffic slow; a thread that wants the CPU gets it at once.
pub(crate) fn yield_tail() -> Duration {
    static TAIL: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *TAIL.get_or_init(|| {
        let us = std::env::var("MORIO_BUSY_YIELD_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(1000);
        Duration::from_micros(us)
    })
}

/// Single-poll turns, each after re-queueing, before the poller spins inside a turn. The
/// tasks it wakes may wake others in turn (inbox → transfer owner → connection writer), and
/// each lands behind the poller in the run queue; a spinning turn would hold them up, so the
/// poller first lets that many rounds of them run.
const SETTLE_ROUNDS: u32 = 3;

/// A reader of shared memory found it empty: `true` if it should stay runnable and look
/// again on the executor's next round (the shard spins by configuration and is busy, its
/// last event was under [`HOT`] ago, and the poller is not sending the executor round its
/// loop), so that bytes
/// arriving are read without a wake-up and a switch from the poller. The caller then wakes
/// itself and returns `Pending`.
pub(crate) fn self_poll() -> bool {
    if ROUND_TRIP.with(Cell::get) {
        return false;
    }
    // Only on shards configured to spin: a shard that busy-polls by default steps aside
    // when preempted, and readers that keep its queue busy made its tails worse (H100,
    // docs/perf/h100-s32.md).
    let hot = BUSY.with(|b| {
        b.borrow()
            .as_ref()
            .filter(|b| !b.contention.on)
            .and_then(|b| b.busy_since_event)
            .is_some_and(|last| last.elapsed() < HOT)
    });
    if hot {
        SELF_POLLED.with(|c| c.set(true));
    }
    hot
}

/// Whether the poller's next round only yields, so that a task woken since its last turn
/// ([`note_runnable`]) runs first; never twice in a row (`yielded` tracks that), so the
/// sockets are polled at least every other round however busy the shard's tasks keep it.
fn yield_first(yielded: &mut bool) -> bool {
    let hint = RUNNABLE.with(|r| r.replace(false));
    *yielded = hint && !*yielded;
    *yielded
}

/// The poller: turns of `poll(2)` over the waiting sockets while the shard is busy.
///
/// Between turns it lets the tasks it woke run. Mostly it only re-queues itself behind
/// them (so the next turn starts the moment they are done); now and then
/// ([`ROUND_TRIP_QUIET`], [`ROUND_TRIP_MAX`], longer while no short timer is pending) it
/// instead sleeps on a timer, which sends
/// the executor round its whole loop: a task that only ever re-queued itself would keep
/// glommio inside its task queue, and timers and the runtime's own completions would
/// never be processed.
pub(crate) async fn poller() {
    let mut round_trip = Instant::now();
    let mut last_woke = Instant::now();
    let mut settled = 0u32;
    let mut yielded = false;
    loop {
        if yield_first(&mut yielded) {
            futures_lite::future::yield_now().await;
            continue;
        }
        // No spinning inside a turn while a reader polls itself: it would wait for the turn.
        let self_polled = SELF_POLLED.with(|c| c.replace(false));
        match turn(settled >= SETTLE_ROUNDS && !self_polled) {
            Turn::Idle => {
                sleep_until_busy().await;
                continue;
            }
            Turn::GoIdle => {
                hand_back();
                continue;
            }
            Turn::Woke => {
                settled = 0;
                last_woke = Instant::now();
            }
            Turn::Quiet => settled += 1,
        }
        let since = round_trip.elapsed();
        let (quiet, max) = round_trip_bounds();
        if since >= max || (since >= quiet && last_woke.elapsed() >= quiet) {
            ROUND_TRIP.with(|c| c.set(true));
            glommio::timer::sleep(POLL_PERIOD).await;
            ROUND_TRIP.with(|c| c.set(false));
            round_trip = Instant::now();
            settled = 0;
        } else {
            futures_lite::future::yield_now().await;
        }
    }
}

/// The shard went idle: every waiter re-polls, finds it idle, and waits on the runtime (the
/// message loop too: it registers with the inbox's own wake-up again).
fn hand_back() {
    let (waiters, watched, probes, inbox) = BUSY.with(|b| {
        let mut b = b.borrow_mut();
        b.as_mut().map_or_else(
            || (Vec::new(), Vec::new(), Vec::new(), None),
            |b| {
                b.busy_since_event = None;
                (
                    std::mem::take(&mut b.waiters),
                    std::mem::take(&mut b.watched),
                    std::mem::take(&mut b.probes),
                    b.inbox_waiter.take(),
                )
            },
        )
    });
    for w in waiters.into_iter().chain(watched) {
        w.waker.wake();
    }
    for w in probes {
        w.waker.wake();
    }
    if let Some(w) = inbox {
        w.wake();
    }
}

/// Wake (and forget) every reader of shared memory, waiting on the poller or on the runtime,
/// whose probe says yes (forget those whose reader is gone); how many were woken.
fn poll_probes(b: &mut Busy) -> usize {
    let woke = wake_probes(&mut b.probes) + wake_probes(&mut b.armed_probes);
    b.wakes += woke as u64;
    woke
}

/// Whether probe wakes are timed ([`note_wake_times`]).
static TIME_WAKES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

thread_local! {
    /// CLOCK_MONOTONIC ns of this thread's last probe wake, while wakes are timed.
    static PROBE_WOKE_NS: Cell<u64> = const { Cell::new(0) };
}

/// Time every probe wake from now on (latency tracing: when the poller saw shared memory
/// ready, against when its reader ran).
pub(crate) fn note_wake_times() {
    TIME_WAKES.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// CLOCK_MONOTONIC ns of the calling shard's last probe wake (0: none since the last call, or
/// wakes are not timed).
pub(crate) fn take_probe_wake_ns() -> u64 {
    PROBE_WOKE_NS.with(|c| c.replace(0))
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn wake_probes(list: &mut Vec<ProbeWaiter>) -> usize {
    let mut woke = 0;
    list.retain(|w| match w.ready() {
        Some(true) => {
            if TIME_WAKES.load(std::sync::atomic::Ordering::Relaxed) {
                PROBE_WOKE_NS.with(|c| c.set(monotonic_ns()));
            }
            w.waker.wake_by_ref();
            woke += 1;
            false
        }
        Some(false) => true,
        None => false,
    });
    woke
}

/// Wake (and forget) every waiter, and every runtime-armed one, whose socket is ready or
/// failed; how many.
fn poll_waiters(b: &mut Busy) -> usize {
    let parked = b.waiters.len();
    let armed = b.armed.len();
    b.polls = b.polls.wrapping_add(1);
    let watched = if b.polls % WATCH_EVERY == 0 {
        b.watched.len()
    } else {
        0
    };
    if parked + armed + watched == 0 {
        return 0;
    }
    b.pollfds.clear();
    b.pollfds.extend(
        b.waiters
            .iter()
            .chain(&b.armed)
            .chain(&b.watched[..watched])
            .map(|w| libc::pollfd {
                fd: w.fd,
                events: w.events,
                revents: 0,
            }),
    );
    // SAFETY: pollfds is a valid array of `len` entries that poll(2) may write revents into;
    // a zero timeout never blocks. A closed fd reports POLLNVAL, which wakes its reader.
    let n = unsafe { libc::poll(b.pollfds.as_mut_ptr(), b.pollfds.len() as _, 0) };
    if n <= 0 {
        return 0;
    }
    let (parked_fds, rest) = b.pollfds.split_at(parked);
    let (armed_fds, watched_fds) = rest.split_at(armed);
    let mut woke = wake_ready(&mut b.waiters, parked_fds) + wake_ready(&mut b.armed, armed_fds);
    if watched > 0 {
        woke += wake_ready(&mut b.watched, watched_fds);
    }
    b.wakes += woke as u64;
    woke
}

/// Wake and remove the waiters of `list` whose entry of `fds` (same order) reported an event.
fn wake_ready(list: &mut Vec<Waiter>, fds: &[libc::pollfd]) -> usize {
    let before = list.len();
    let mut i = 0;
    list.retain(|w| {
        let ready = fds[i].revents != 0;
        i += 1;
        if ready {
            w.waker.wake_by_ref();
        }
        !ready
    });
    before - list.len()
}

/// Wait until the busy poller sees `fd` writable; `false` (at once) if the shard is not busy,
/// and the caller should wait through the runtime instead.
pub(crate) async fn writable(fd: RawFd) -> bool {
    let mut registered = None;
    std::future::poll_fn(|cx| match registered {
        Some(r) => Poll::Ready(r),
        None => {
            let r = wait_writable(fd, cx);
            registered = Some(r);
            if r {
                Poll::Pending
            } else {
                Poll::Ready(false)
            }
        }
    })
    .await
}

/// Park the poller until the shard becomes busy (forever on a shard that never enabled
/// busy polling).
fn sleep_until_busy() -> impl std::future::Future<Output = ()> {
    std::future::poll_fn(|cx| {
        BUSY.with(|b| match b.borrow_mut().as_mut() {
            Some(b) if b.busy_since_event.is_some() => Poll::Ready(()),
            Some(b) => {
                b.poller = Some(cx.waker().clone());
                Poll::Pending
            }
            None => Poll::Pending,
        })
    })
}

#[cfg(test)]
mod tests;
