//! Latency tracing: per-transfer stage timestamps, for finding where a small transfer's time
//! goes. Off unless the process starts with `MORIO_TRACE=DIR`; then every [`mark`] records
//! (uid, stage, CLOCK_MONOTONIC ns) into a fixed lock-free buffer, and [`dump`] writes it to
//! `DIR/<label>-<pid>.csv`. CLOCK_MONOTONIC is one clock for every process of a host, so an
//! initiator's and a target's files line up by uid (`scripts/bench/trace-stages.py` does that).
//! A multi-chunk transfer marks the per-chunk stages once per chunk; the script takes the
//! first of each for the main line and shows first-to-last spreads and the target's join.

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Stages, in the order a write passes them.
pub mod stage {
    /// Initiator, application thread: the transfer call was entered (marked by callers
    /// that time their calls, like `morio bench`).
    pub const CALL: u8 = 1;
    /// Initiator, application thread: the transfer is handed to its owner shard.
    pub const SUBMIT: u8 = 2;
    /// Initiator, owner shard: the submission is taken up.
    pub const OWNER: u8 = 3;
    /// Initiator, lane shard: the chunk's frame is being encoded.
    pub const ENCODE: u8 = 4;
    /// Initiator, lane shard: the frame is encoded (and a small payload copied after it).
    pub const PUSHED: u8 = 5;
    /// Initiator, lane shard: the send that carried the frame returned.
    pub const SENT: u8 = 6;
    /// Target: the frame header and body were decoded.
    pub const T_RECV: u8 = 7;
    /// Target: the payload is placed and the answer queued.
    pub const T_PLACED: u8 = 8;
    /// Target: the send that carried the answer returned.
    pub const T_SENT: u8 = 9;
    /// Initiator, lane shard: a chunk's answer was decoded.
    pub const RESP: u8 = 10;
    /// Initiator, owner shard: the user-visible status was completed.
    pub const DONE: u8 = 11;
    /// Initiator, application thread: the waiter saw the completion.
    pub const WOKE: u8 = 12;
    /// Initiator, application thread: backend, local region and peer were looked up
    /// (between CALL and SUBMIT).
    pub const RESOLVED: u8 = 13;
    /// Initiator, application thread: the segments were checked and normalised (between
    /// RESOLVED and SUBMIT).
    pub const NORMALIZED: u8 = 14;
    /// Initiator, owner shard: chunks planned and handed to their lanes (between OWNER and
    /// ENCODE).
    pub const PLANNED: u8 = 15;
    /// Target: the chunk was checked against the region (between T_RECV and T_PLACED).
    pub const T_CHECKED: u8 = 16;

    /// Initiator, owner shard: a chunk of a multi-chunk transfer failed before it left, and
    /// FINISH is handed to the home lane to end the transfer at the target.
    pub const FINISH: u8 = 17;
    /// Target, join shard: every chunk of a multi-chunk transfer is in (or FINISH arrived);
    /// the inbound status is recorded next, then COMPLETE queued on chunk 0's lane.
    pub const T_FINISH: u8 = 18;
    /// Initiator, lane shard: the COMPLETE of a multi-chunk transfer was decoded (a chunk's
    /// answer, or a one-chunk transfer's COMPLETE, is [`RESP`]).
    pub const COMPLETED: u8 = 19;
    /// Target, join shard: the send that carried a multi-chunk transfer's COMPLETE returned
    /// (between T_FINISH and COMPLETED).
    pub const T_ANSWERED: u8 = 20;
    /// Initiator, lane shard: the owner's work for this lane was taken from the shard's
    /// inbox and queued on the lane (between PLANNED and ENCODE).
    pub const HANDED: u8 = 21;
    /// Initiator, lane shard: the first send of a large chunk (its header and first bytes,
    /// `transport::framed::send_head_first`) returned (between ENCODE and PUSHED).
    pub const HEAD_SENT: u8 = 22;
    /// Target: the first bytes of the frame were read from the socket (between SENT and
    /// T_RECV: how long the bytes waited to be noticed, against how long they took to
    /// arrive).
    pub const T_READABLE: u8 = 23;
    /// Target: the busy poller saw the frame's first bytes in the ring and woke the reader
    /// (spinning shards only; between SENT and T_READABLE: noticing, against the switch to
    /// the reader).
    pub const T_NOTICED: u8 = 24;
    /// Initiator, lane shard: the busy poller saw the answer in the ring and woke the
    /// reader (spinning shards only; between T_SENT and RESP).
    pub const NOTICED: u8 = 25;
    /// Sending side of a chunk staged from GPU memory (initiator WRITE, target READ_DATA):
    /// the copy of its first staging slot out of device memory is done and its bytes may
    /// leave (between ENCODE and PUSHED, or T_RECV and T_PLACED: waiting for the GPU,
    /// against sending).
    pub const G_STAGED: u8 = 26;

    /// The stages a one-chunk write passes, in order (sub-stages in their places; FINISH,
    /// T_FINISH and COMPLETED belong to multi-chunk transfers only).
    pub const ORDER: [u8; 16] = [
        CALL, RESOLVED, NORMALIZED, SUBMIT, OWNER, PLANNED, ENCODE, PUSHED, SENT, T_RECV,
        T_CHECKED, T_PLACED, T_SENT, RESP, DONE, WOKE,
    ];
}

/// Records kept per process (three words each); marks past this are dropped.
const CAPACITY: usize = 1 << 18;

/// 0 = not yet decided, 1 = off, 2 = on.
static STATE: AtomicU8 = AtomicU8::new(0);
static NEXT: AtomicUsize = AtomicUsize::new(0);
static BUF: OnceLock<Box<[AtomicU64]>> = OnceLock::new();

/// Whether tracing is on (decided once, from `MORIO_TRACE`).
#[inline]
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => decide(),
    }
}

#[cold]
fn decide() -> bool {
    let on = std::env::var_os("MORIO_TRACE").is_some_and(|v| !v.is_empty());
    if on {
        BUF.get_or_init(|| (0..CAPACITY * 3).map(|_| AtomicU64::new(0)).collect());
        morio_shards::rt::note_wake_times();
    }
    STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
    on
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn clock_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; CLOCK_MONOTONIC always exists.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

thread_local! {
    /// The transfer this thread is sending a frame of ([`set_current`]), for marks made by
    /// code that does not know it.
    static CURRENT: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// The calling thread now works on transfer `uid` (or on none): [`mark_current`] marks it.
#[inline]
pub fn set_current(uid: Option<u64>) {
    if enabled() {
        CURRENT.with(|c| c.set(uid));
    }
}

/// Mark `stage` for the transfer [`set_current`] named, if any.
#[inline]
pub fn mark_current(stage: u8) {
    if enabled() {
        if let Some(uid) = CURRENT.with(|c| c.get()) {
            record_at(uid, stage, clock_ns());
        }
    }
}

/// The time to give a later [`mark_at`] (0 when tracing is off).
#[inline]
pub fn now_if_enabled() -> u64 {
    if enabled() {
        clock_ns()
    } else {
        0
    }
}

/// Record that transfer `uid` reached `stage` at `ns` ([`now_if_enabled`]), found out later.
#[inline]
pub fn mark_at(uid: u64, stage: u8, ns: u64) {
    if enabled() && ns > 0 {
        record_at(uid, stage, ns);
    }
}

/// Record that transfer `uid` reached `stage` now (a no-op unless tracing is on).
#[inline]
pub fn mark(uid: u64, stage: u8) {
    if enabled() {
        record(uid, stage);
    }
}

#[cold]
fn record(uid: u64, stage: u8) {
    record_at(uid, stage, clock_ns())
}

#[cold]
fn record_at(uid: u64, stage: u8, ns: u64) {
    let Some(buf) = BUF.get() else { return };
    let i = NEXT.fetch_add(1, Ordering::Relaxed);
    if i >= CAPACITY {
        return;
    }
    buf[3 * i].store(uid, Ordering::Relaxed);
    // The CPU the mark ran on, beside the stage: which shard (or application thread) it was.
    // SAFETY: sched_getcpu has no preconditions; it returns -1 on failure.
    let cpu = unsafe { libc::sched_getcpu() }.max(0) as u64 & 0xffff;
    buf[3 * i + 1].store(stage as u64 | cpu << 8, Ordering::Relaxed);
    buf[3 * i + 2].store(ns, Ordering::Release);
}

/// Write what was recorded to `$MORIO_TRACE/<label>-<pid>.csv` and
/// return the path; `Ok(None)` when tracing is off.
/// Lines are `uid,stage,ns,cpu`.
pub fn dump(label: &str) -> std::io::Result<Option<std::path::PathBuf>> {
    let (Some(dir), Some(buf)) = (std::env::var_os("MORIO_TRACE"), BUF.get()) else {
        return Ok(None);
    };
    let n = NEXT.load(Ordering::Acquire).min(CAPACITY);
    let path = std::path::Path::new(&dir).join(format!("{label}-{}.csv", std::process::id()));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
    writeln!(out, "uid,stage,ns,cpu")?;
    for i in 0..n {
        let t = buf[3 * i + 2].load(Ordering::Acquire);
        if t == 0 {
            continue; // Claimed but not yet written.
        }
        let uid = buf[3 * i].load(Ordering::Relaxed);
        let w = buf[3 * i + 1].load(Ordering::Relaxed);
        writeln!(out, "{uid},{},{t},{}", w & 0xff, w >> 8)?;
    }
    out.flush()?;
    Ok(Some(path))
}
