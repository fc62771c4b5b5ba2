//! Frames over a connection of any transport: a bounded frame reader that places payloads
//! straight into registered memory, and a frame writer that batches small frames and sends
//! large payloads straight from it.

use std::cell::Cell;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncRead, AsyncReadExt};
use morio_shards::rt;

use super::abort::{guarded, Abort, Aborted};
use super::{Rx, Tx};
use crate::proto::decode::{decode_frame, DecodeError};
use crate::proto::frame::{
    encode_chunk_segs, ChunkHead, ChunkSegs, Frame, Kind, Seg, FLAG_TO_DEVICE,
};
use crate::proto::limits::{HEADER_BYTES, MAX_BODY_BYTES, MAX_HANDSHAKE_BODY_BYTES};

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    /// The socket failed or closed.
    #[error("connection lost: {0}")]
    Io(#[from] io::Error),
    /// The peer sent bytes that are not a valid frame.
    #[error("protocol error: {0}")]
    Decode(#[from] DecodeError),
    /// The peer sent a valid frame that makes no sense here.
    #[error("protocol violation: {0}")]
    Violation(String),
    /// A frame began but did not finish within the deadline (`op_timeout`).
    #[error("a begun frame did not complete within {0:?}")]
    Stalled(Duration),
    /// The peer closed the connection.
    #[error("connection closed by peer")]
    Closed,
    /// The initiator reset the connection while a WRITE waited unread at this side (its
    /// bytes had arrived up to this long before): the WRITE is dropped, not placed (its
    /// transfer was reported failed).
    #[error(
        "the initiator reset this lane while its WRITE chunks waited here unread (up to {} \
         ms): they are dropped, not placed (their transfer failed there)",
        .0.as_millis()
    )]
    ResetWhileQueued(Duration),
    /// The payload being read belongs to a transfer cancelled meanwhile: the reader stopped
    /// before its next receive (the rest of the payload is still to be dropped).
    #[error("the transfer was cancelled while its data was being read")]
    Aborted,
}

impl From<Aborted> for ConnError {
    fn from(_: Aborted) -> Self {
        ConnError::Aborted
    }
}

/// Reads frames from a stream. Header and body go through an internal buffer that never
/// holds more than one read's worth beyond `HEADER_BYTES + MAX_BODY_BYTES`; payloads are read
/// into the caller's destination (registered memory) directly once the buffered part is used.
///
/// **Progress rule.** Waiting for a frame to begin is unbounded (idle connections are
/// normal). Once begun, the whole rest of the frame (header, body and payload) must arrive
/// within `stall` (`op_timeout`) of the first time the reader has to wait for more of it,
/// which is right after its first bytes were read: one deadline per frame, not per read, so
/// a peer that trickles a byte now and then cannot hold the connection. A frame that arrives
/// in the read that began it never reads the clock; one that needs more reads it once per
/// wait, next to the timer that wait arms anyway.
pub(crate) struct FrameReader<R> {
    r: R,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    stall: Duration,
    /// When the frame being read must be complete: set at its first wait, cleared when the
    /// next frame starts.
    deadline: Option<Instant>,
    /// Payload bytes of the current frame not yet consumed.
    payload_left: u64,
    /// When the first bytes of the frame being read arrived (tracing only, else 0).
    first_read_ns: u64,
    /// When the busy poller woke this shard's reader of shared memory before that read (0:
    /// not tracing, or not woken so).
    noticed_ns: u64,
    /// Stops payload reads once set ([`Self::set_abort`]).
    abort: Option<Rc<Abort>>,
    /// Whether frame ages are kept ([`Self::keep_ages`]).
    ages: bool,
    /// Whether a read that returns less than it asked for says the input is empty (a
    /// socket's does; a same-host connection's stops at a record's end).
    short_drains: bool,
    /// When a read last saw the input empty (it had to wait, or it returned less than it
    /// asked for): every byte read since arrived after that.
    drained: Instant,
    /// Whether the last read left the input empty (`drained` is then when it did, so a read
    /// that waits next needs no clock reading of its own).
    fresh_empty: bool,
    /// The earliest the bytes buffered now can have arrived (`drained` as it was before the
    /// read that put them into an empty buffer).
    buf_since: Instant,
    /// The same for the bytes read after the start of a frame still incomplete: once that
    /// frame is taken, they are all that is buffered.
    next_since: Option<Instant>,
    /// The earliest the last frame returned can have arrived ([`Self::frame_age`]).
    frame_since: Instant,
}

const READ_BUF_BYTES: usize = 256 << 10;
/// How much to read when no frame is pending: many small frames (or one batch of 256 tiny
/// segments with their payload) per syscall, little payload copied through the buffer.
const READ_WINDOW_BYTES: usize = 8 << 10;
/// Queued small frames are flushed once this many bytes wait.
const FLUSH_BYTES: usize = 64 << 10;
/// Payloads up to this size go through the buffer when they are scattered over pieces.
const SMALL_PAYLOAD_BYTES: usize = 64 << 10;
const _: () = assert!(READ_BUF_BYTES >= HEADER_BYTES + MAX_BODY_BYTES);

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader that fails a frame not complete within `stall` once it has begun.
    pub(crate) fn new(r: R, stall: Duration) -> Self {
        Self {
            r,
            buf: vec![0u8; READ_BUF_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            stall,
            deadline: None,
            payload_left: 0,
            first_read_ns: 0,
            noticed_ns: 0,
            abort: None,
            ages: false,
            short_drains: false,
            fresh_empty: false,
            drained: Instant::now(),
            buf_since: Instant::now(),
            next_since: None,
            frame_since: Instant::now(),
        }
    }

    /// Keep frame ages ([`Self::frame_age`]) from now on: one clock read per read that
    /// empties the input or waits for it, not both (a target's connections; an initiator's
    /// lanes need none). `short_drains`: a read that returns less than it asked for leaves
    /// the input empty (true of a socket; a same-host connection's reads stop at the end of
    /// a record, so there only a read that has to wait says so).
    pub(crate) fn keep_ages(&mut self, short_drains: bool) {
        self.ages = true;
        self.short_drains = short_drains;
        self.drained = Instant::now();
    }

    /// How long the last frame returned by [`Self::next_frame`] may have waited for this
    /// reader: at most this long ago its bytes arrived, as the input was last seen empty
    /// then (a frame read right after the reader waited for its connection reads as old as
    /// that wait, as nothing says when in it the frame came). Kept only after
    /// [`Self::keep_ages`]; before, the age since the reader was made.
    pub(crate) fn frame_age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.frame_since)
    }

    /// Book a read of `n` bytes that asked for `asked`: a short one left the input empty.
    fn note_read(&mut self, asked: usize, n: usize) {
        self.fresh_empty = self.short_drains && n < asked;
        if self.ages && self.fresh_empty {
            self.drained = Instant::now();
        }
    }

    /// Payload reads from now on fail with [`ConnError::Aborted`] before their next receive
    /// once `abort` is set (`None`: never). What was read stays counted, so
    /// [`Self::payload_left`] says what is still to be dropped.
    pub(crate) fn set_abort(&mut self, abort: Option<Rc<Abort>>) {
        self.abort = abort;
    }

    /// Payload bytes of the current frame not yet read.
    pub(crate) fn payload_left(&self) -> u64 {
        self.payload_left
    }

    fn consume(&mut self, n: usize) {
        self.payload_left = self.payload_left.saturating_sub(n as u64);
    }

    /// The time left for the frame being read, starting its clock at its first wait;
    /// `Stalled` once it is spent.
    fn time_left(&mut self) -> Result<Duration, ConnError> {
        let left = match self.deadline {
            None => {
                self.deadline = Some(Instant::now() + self.stall);
                self.stall
            }
            Some(d) => d.saturating_duration_since(Instant::now()),
        };
        if left.is_zero() {
            return Err(ConnError::Stalled(self.stall));
        }
        Ok(left)
    }

    /// When the busy poller woke this reader before the first read of the last frame (0 if
    /// untraced, not woken by the poller, or the frame was already buffered).
    pub(crate) fn take_noticed_ns(&mut self) -> u64 {
        std::mem::take(&mut self.noticed_ns)
    }

    /// When the first bytes of the last frame read from the socket arrived (0 if untraced,
    /// or if that frame was already buffered with the one before).
    pub(crate) fn take_first_read_ns(&mut self) -> u64 {
        std::mem::take(&mut self.first_read_ns)
    }

    /// The next frame and its payload length; `Ok(None)` on a clean EOF between frames.
    /// Waiting for a frame to *start* is unbounded (idle connections are normal); once its
    /// first byte is in, the rest of it, payload included, must arrive within the stall
    /// deadline (the progress rule above).
    pub(crate) async fn next_frame(&mut self) -> Result<Option<(Frame, u64)>, ConnError> {
        self.deadline = None;
        loop {
            if let Some((f, payload, used)) = decode_frame(&self.buf[self.start..self.end])? {
                self.start += used;
                self.payload_left = payload;
                self.frame_since = self.buf_since;
                if let Some(t) = self.next_since.take() {
                    self.buf_since = t;
                }
                return Ok(Some((f, payload)));
            }
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let partial = self.end > 0;
            // Read a small window, or exactly the rest of a body whose size is known: bytes
            // read past a frame's body are payload, and payload that lands here costs an extra
            // copy (large payloads should go straight from the socket into their region).
            let want = match self.pending_read() {
                Some(rest) => rest,
                None => READ_WINDOW_BYTES,
            };
            let upto = (self.end + want.max(1)).min(self.buf.len());
            let empty = Cell::new(None);
            let n = if partial {
                let left = self.time_left()?;
                let read = self.r.read(&mut self.buf[self.end..upto]);
                rt::timeout(left, watched(self.ages && !self.fresh_empty, &empty, read))
                    .await
                    .ok_or(ConnError::Stalled(self.stall))??
            } else {
                watched(
                    self.ages && !self.fresh_empty,
                    &empty,
                    self.r.read(&mut self.buf[self.end..upto]),
                )
                .await?
            };
            // What this read got arrived after the input was last seen empty, during the read
            // or before it.
            if let Some(t) = empty.get() {
                self.drained = t;
            }
            if !partial {
                self.buf_since = self.drained;
                self.next_since = None;
            } else if self.next_since.is_none() {
                self.next_since = Some(self.drained);
            }
            self.note_read(upto - self.end, n);
            if !partial && n > 0 {
                self.first_read_ns = crate::trace::now_if_enabled();
                if self.first_read_ns > 0 {
                    self.noticed_ns = rt::take_probe_wake_ns();
                }
            }
            if n == 0 {
                return if partial {
                    Err(ConnError::Closed)
                } else {
                    Ok(None)
                };
            }
            self.end += n;
        }
    }

    /// The next frame, when it is buffered whole and the frame before has no payload left to
    /// read, decoded without taking it; `None` otherwise (a frame that does not decode is
    /// left for `next_frame` to report).
    pub(crate) fn peek_frame(&self) -> Option<Frame> {
        if self.payload_left > 0 {
            return None;
        }
        decode_frame(&self.buf[self.start..self.end])
            .ok()
            .flatten()
            .map(|(f, _, _)| f)
    }

    /// Whether a whole header and body are already buffered (the next `next_frame` will not
    /// wait for the socket).
    pub(crate) fn frame_ready(&self) -> bool {
        self.missing_body() == Some(0)
    }

    /// Bytes still missing from the body of the frame whose header is buffered; `None`
    /// while the header itself is incomplete.
    fn missing_body(&self) -> Option<usize> {
        let have = self.end - self.start;
        let h = self.buf[self.start..self.end].get(..HEADER_BYTES)?;
        let body = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
        // A bad length is reported by the decoder, which has already seen this header.
        Some((HEADER_BYTES + body.min(MAX_BODY_BYTES)).saturating_sub(have))
    }

    /// How much to read for the frame whose header is buffered: the rest of its body, and
    /// a small payload with it (one syscall for a whole batch frame; large payloads still
    /// go straight into their destination).
    fn pending_read(&self) -> Option<usize> {
        let rest = self.missing_body()?.max(1);
        let h = &self.buf[self.start..self.start + HEADER_BYTES];
        let mut p = [0u8; 8];
        p.copy_from_slice(&h[8..16]);
        let payload = u64::from_le_bytes(p);
        Some(if payload <= SMALL_PAYLOAD_BYTES as u64 {
            rest + payload as usize
        } else {
            rest
        })
    }

    /// The next `n` payload bytes, if they are all in the buffer already (consumed). A batch
    /// of tiny segments is placed from here in one synchronous loop.
    pub(crate) fn take_buffered(&mut self, n: usize) -> Option<&[u8]> {
        if self.end - self.start < n || (n as u64) > self.payload_left {
            return None;
        }
        let at = self.start;
        self.start += n;
        self.payload_left -= n as u64;
        Some(&self.buf[at..at + n])
    }

    /// Fill `dst` with the next payload bytes.
    pub(crate) async fn read_payload(&mut self, dst: &mut [u8]) -> Result<(), ConnError> {
        if self.end - self.start < dst.len() {
            self.prefetch_small_payload(dst.len()).await?;
        }
        let have = (self.end - self.start).min(dst.len());
        dst[..have].copy_from_slice(&self.buf[self.start..self.start + have]);
        self.start += have;
        self.consume(have);
        let rest = &mut dst[have..];
        if rest.is_empty() {
            return Ok(());
        }
        // One timer for the whole rest (not one per receive: a large payload takes many);
        // what was read is counted even when the deadline or the abort flag ends it.
        let left = self.time_left()?;
        let got = std::cell::Cell::new(0usize);
        let drained = Cell::new(None);
        let fresh = Cell::new(self.fresh_empty);
        let (abort, r, ages, short) = (
            self.abort.clone(),
            &mut self.r,
            self.ages,
            self.short_drains,
        );
        let fill = async {
            let mut rest = rest;
            while !rest.is_empty() {
                let read = guarded(abort.clone(), r.read(rest));
                let n = watched(ages && !fresh.get(), &drained, read).await??;
                if n == 0 {
                    return Err(ConnError::Closed);
                }
                fresh.set(short && n < rest.len());
                if ages && fresh.get() {
                    drained.set(Some(Instant::now()));
                }
                got.set(got.get() + n);
                rest = &mut rest[n..];
            }
            Ok(())
        };
        let done = rt::timeout(left, fill).await;
        self.consume(got.get());
        if let Some(at) = drained.get() {
            self.drained = at;
        }
        self.fresh_empty = fresh.get();
        done.ok_or(ConnError::Stalled(self.stall))?
    }

    /// Fill `dsts`, in order, with the next payload bytes: what the buffer holds first, the
    /// rest straight from the socket, scattered with vectored reads (one syscall for many
    /// pieces rather than one each).
    pub(crate) async fn read_payload_scatter(
        &mut self,
        dsts: &mut [&mut [u8]],
    ) -> Result<(), ConnError> {
        use futures_lite::AsyncReadExt;
        let total: usize = dsts.iter().map(|d| d.len()).sum();
        if total <= SMALL_PAYLOAD_BYTES || dsts.len() < 2 {
            for d in dsts.iter_mut() {
                self.read_payload(d).await?;
            }
            return Ok(());
        }
        let lens: Vec<usize> = dsts.iter().map(|d| d.len()).collect();
        // (piece, offset within it) of the first byte still missing.
        let (mut idx, mut off) = (0usize, 0usize);
        let skip_empty = |idx: &mut usize| {
            while *idx < lens.len() && lens[*idx] == 0 {
                *idx += 1;
            }
        };
        let advance = |mut n: usize, idx: &mut usize, off: &mut usize| {
            while n > 0 && *idx < lens.len() {
                let left = lens[*idx] - *off;
                if n < left {
                    *off += n;
                    n = 0;
                } else {
                    n -= left;
                    *idx += 1;
                    *off = 0;
                }
            }
            // Empty pieces need no bytes.
            skip_empty(idx);
        };
        skip_empty(&mut idx);
        // Buffered bytes first.
        while self.start < self.end && idx < dsts.len() {
            let d = &mut dsts[idx][off..];
            let k = d.len().min(self.end - self.start);
            d[..k].copy_from_slice(&self.buf[self.start..self.start + k]);
            self.start += k;
            self.consume(k);
            advance(k, &mut idx, &mut off);
        }
        while idx < dsts.len() {
            let left = self.time_left()?;
            let asked;
            let empty = Cell::new(None);
            let n = {
                let rest = &mut dsts[idx..];
                asked = rest.iter().map(|d| d.len()).sum::<usize>() - off;
                let mut iov: Vec<std::io::IoSliceMut<'_>> = Vec::with_capacity(rest.len());
                let (head, tail) = rest.split_at_mut(1);
                iov.push(std::io::IoSliceMut::new(&mut head[0][off..]));
                iov.extend(tail.iter_mut().map(|d| std::io::IoSliceMut::new(d)));
                let read = guarded(self.abort.clone(), self.r.read_vectored(&mut iov));
                rt::timeout(left, watched(self.ages && !self.fresh_empty, &empty, read))
                    .await
                    .ok_or(ConnError::Stalled(self.stall))???
            };
            if n == 0 {
                return Err(ConnError::Closed);
            }
            if let Some(t) = empty.get() {
                self.drained = t;
            }
            self.note_read(asked, n);
            self.consume(n);
            advance(n, &mut idx, &mut off);
        }
        Ok(())
    }

    /// A small payload scattered over many pieces (a batch of tiny segments) is read into
    /// the buffer in one go rather than with one `recv` per piece.
    async fn prefetch_small_payload(&mut self, need: usize) -> Result<(), ConnError> {
        // What is left of this frame's payload, counting the piece being read.
        let total = self.payload_left.max(need as u64);
        if total > SMALL_PAYLOAD_BYTES as u64 {
            return Ok(());
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let target = total as usize;
        while self.end < target {
            let left = self.time_left()?;
            let empty = Cell::new(None);
            let read = guarded(
                self.abort.clone(),
                self.r.read(&mut self.buf[self.end..target]),
            );
            let n = rt::timeout(left, watched(self.ages && !self.fresh_empty, &empty, read))
                .await
                .ok_or(ConnError::Stalled(self.stall))???;
            if n == 0 {
                return Err(ConnError::Closed);
            }
            if let Some(t) = empty.get() {
                self.drained = t;
            }
            self.note_read(target - self.end, n);
            self.end += n;
        }
        Ok(())
    }

    /// Skip `n` payload bytes (a refused chunk, or a response nobody waits for any more).
    pub(crate) async fn discard_payload(&mut self, mut n: u64) -> Result<(), ConnError> {
        let mut scratch = [0u8; 16 << 10];
        while n > 0 {
            let k = n.min(scratch.len() as u64) as usize;
            self.read_payload(&mut scratch[..k]).await?;
            n -= k as u64;
        }
        Ok(())
    }
}

/// Run the read `fut`; with `ages`, note in `empty` when it last found its input empty (it
/// had to wait: every byte it then gets arrived after that).
async fn watched<F: std::future::Future>(
    ages: bool,
    empty: &Cell<Option<Instant>>,
    fut: F,
) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let p = fut.as_mut().poll(cx);
        if ages && p.is_pending() {
            empty.set(Some(Instant::now()));
        }
        p
    })
    .await
}

/// Whether `(offset, len)` ranges come in ascending order without overlapping (so mutable
/// slices of all of them can exist at once).
pub(crate) fn ascending_disjoint(mut ranges: impl Iterator<Item = (u64, u64)>) -> bool {
    let mut end = 0u64;
    ranges.all(|(off, len)| {
        let ok = off >= end;
        end = off.saturating_add(len);
        ok
    })
}

impl FrameReader<Rx> {
    /// Whether bytes of a next frame are already here, buffered or queued in the socket (so
    /// the frame has begun and its sender will finish it): a connection may then read it
    /// before it answers the one before. Never waits.
    pub(crate) fn input_waiting(&self) -> bool {
        self.end > self.start || self.r.input_queued()
    }

    /// The device parts the peer offers as the current frame's payload, and the process
    /// they are in; `None` when the payload comes as bytes. Settle an offer with
    /// [`Self::settle_device`].
    pub(crate) async fn device_offer(
        &mut self,
    ) -> Result<Option<(crate::transport::local::Device, u32)>, ConnError> {
        // Payload bytes already buffered (or none due) mean the payload is not device parts.
        if self.end != self.start || self.payload_left == 0 {
            return Ok(None);
        }
        if !matches!(self.r, Rx::Local(_)) {
            return Ok(None);
        }
        let left = self.time_left()?;
        let Rx::Local(r) = &mut self.r else {
            return Ok(None);
        };
        let pid = r.peer();
        let d = rt::timeout(left, std::future::poll_fn(|cx| r.poll_device(cx)))
            .await
            .ok_or(ConnError::Stalled(self.stall))?
            .map_err(ConnError::Io)?;
        Ok(d.map(|d| (d, pid)))
    }

    /// Whether exports of `kind` from the peer could not be opened here before (on this
    /// connection).
    pub(crate) fn device_refused(&self, kind: crate::gpu::IpcKind) -> bool {
        matches!(&self.r, Rx::Local(r) if r.refused(kind))
    }

    /// Remember that exports of `kind` from the peer cannot be opened here.
    pub(crate) fn refuse_device(&mut self, kind: crate::gpu::IpcKind) {
        if let Rx::Local(r) = &mut self.r {
            r.refuse(kind);
        }
    }

    /// Answer the offered device parts (see [`crate::transport::local::Verdict`]); taken,
    /// they stand for `len` payload bytes.
    pub(crate) fn settle_device(
        &mut self,
        v: crate::transport::local::Verdict,
        len: u64,
    ) -> Result<(), ConnError> {
        let Rx::Local(r) = &mut self.r else {
            return Err(ConnError::Violation("no device parts offered".into()));
        };
        r.settle_device(v).map_err(ConnError::Io)?;
        if v == crate::transport::local::Verdict::Taken {
            self.payload_left = self.payload_left.saturating_sub(len);
        }
        Ok(())
    }
}

/// Writes frames, copying small payloads next to their header so the whole frame leaves in
/// one `send`, and sending large ones straight from registered memory.
pub(crate) struct FrameWriter {
    w: Tx,
    buf: Vec<u8>,
    inline_bytes: usize,
}

impl FrameWriter {
    pub(crate) fn new(w: Tx, inline_bytes: usize) -> Self {
        Self {
            w,
            buf: Vec::with_capacity(64 << 10),
            inline_bytes,
        }
    }

    /// Queue `frame` and its payload for sending. Small payloads are copied next to the
    /// header and wait in the buffer for [`Self::flush`] (so a burst of small frames leaves
    /// in one syscall); a large payload is sent at once, gathered straight from registered
    /// memory together with everything queued before it.
    pub(crate) async fn push(&mut self, frame: &Frame, payload: &[&[u8]]) -> io::Result<()> {
        let total: usize = payload.iter().map(|p| p.len()).sum();
        frame.encode(total as u64, &mut self.buf);
        if total <= self.inline_bytes {
            self.buf.reserve(total);
            for p in payload {
                crate::small_copy::extend(&mut self.buf, p);
            }
            if self.buf.len() >= FLUSH_BYTES {
                self.flush().await?;
            }
            Ok(())
        } else {
            let mut parts: Vec<&[u8]> = Vec::with_capacity(payload.len() + 1);
            parts.push(&self.buf);
            parts.extend_from_slice(payload);
            let r = send_head_first(&mut self.w, &parts).await;
            self.buf.clear();
            r
        }
    }

    /// Where express writers may put frames between this writer's runs
    /// ([`crate::transport::Tx::express_port`]).
    pub(crate) fn express_port(&self) -> Option<crate::transport::express_port::ExpressPort> {
        self.w.express_port()
    }

    /// Queue bytes that must leave before anything else queued (the rest of an express
    /// frame the socket took only in part, whose start is already on the wire); they leave
    /// with the next flush.
    pub(crate) fn queue_first(&mut self, bytes: &[u8]) {
        self.buf.splice(0..0, bytes.iter().copied());
    }

    /// Payloads up to this size are copied next to their header.
    pub(crate) fn inline_bytes(&self) -> usize {
        self.inline_bytes
    }

    /// Queue a WRITE chunk (header and segments from `segs`, see
    /// [`crate::proto::frame::encode_chunk_segs`]) whose `payload_len` payload bytes, at most
    /// [`Self::inline_bytes`], `fill` appends right after it: nothing is built per segment
    /// but the frame itself.
    pub(crate) async fn push_inline_chunk<S, F: Fn(&S) -> Seg + Copy>(
        &mut self,
        final_: bool,
        head: &ChunkHead,
        segs: ChunkSegs<'_, S, F>,
        payload_len: usize,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<()> {
        debug_assert!(payload_len <= self.inline_bytes);
        let len = payload_len as u64;
        encode_chunk_segs(Kind::Write, final_, head, segs, len, &mut self.buf);
        let at = self.buf.len();
        self.buf.reserve(payload_len);
        fill(&mut self.buf);
        debug_assert_eq!(self.buf.len() - at, payload_len);
        self.flush_if_full().await
    }

    /// Queue `frame` and its `payload_len` payload bytes, at most [`Self::inline_bytes`],
    /// which `fill` appends right after it (a strided read's pieces, gathered in one loop).
    pub(crate) async fn push_inline(
        &mut self,
        frame: &Frame,
        payload_len: usize,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<()> {
        debug_assert!(payload_len <= self.inline_bytes);
        frame.encode(payload_len as u64, &mut self.buf);
        let at = self.buf.len();
        fill(&mut self.buf);
        debug_assert_eq!(self.buf.len() - at, payload_len);
        self.flush_if_full().await
    }

    /// Send what is queued once enough waits (so a long run of small frames goes out in
    /// bounded pieces).
    pub(crate) async fn flush_if_full(&mut self) -> io::Result<()> {
        if self.buf.len() >= FLUSH_BYTES {
            self.flush().await?;
        }
        Ok(())
    }

    /// Queue a READ chunk (no payload); it leaves with the next flush. `to_device`: the data
    /// goes into GPU memory, said to the target ([`FLAG_TO_DEVICE`]) only on a connection
    /// that takes device parts (a peer of an older version would refuse the flag).
    pub(crate) fn queue_read_chunk<S, F: Fn(&S) -> Seg + Copy>(
        &mut self,
        final_: bool,
        head: &ChunkHead,
        segs: ChunkSegs<'_, S, F>,
        to_device: bool,
    ) {
        let start = self.buf.len();
        encode_chunk_segs(Kind::Read, final_, head, segs, 0, &mut self.buf);
        if to_device && self.w.offers_device() != crate::transport::local::DeviceRecords::None {
            self.buf[start + 3] |= FLAG_TO_DEVICE;
        }
    }

    /// Send a WRITE chunk whose payload is `payload`, gathered straight from registered
    /// memory together with everything queued before it.
    pub(crate) async fn send_chunk<S, F: Fn(&S) -> Seg + Copy>(
        &mut self,
        final_: bool,
        head: &ChunkHead,
        segs: ChunkSegs<'_, S, F>,
        payload: &[&[u8]],
    ) -> io::Result<()> {
        let total = payload.iter().map(|p| p.len() as u64).sum();
        encode_chunk_segs(Kind::Write, final_, head, segs, total, &mut self.buf);
        self.send_gathered(payload).await
    }

    /// Send what is queued and `payload` after it, in one gather.
    async fn send_gathered(&mut self, payload: &[&[u8]]) -> io::Result<()> {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(payload.len() + 1);
        parts.push(&self.buf);
        parts.extend_from_slice(payload);
        let r = send_head_first(&mut self.w, &parts).await;
        self.buf.clear();
        r
    }

    /// Queue the header of `frame` whose `payload` bytes follow through [`Self::send_part`].
    pub(crate) fn push_header(&mut self, frame: &Frame, payload: u64) {
        frame.encode(payload, &mut self.buf);
    }

    /// Which device records GPU memory may be offered in on this connection.
    pub(crate) fn offers_device(&self) -> crate::transport::local::DeviceRecords {
        self.w.offers_device()
    }

    /// Send everything queued (a frame's header last), then offer `parts` of `allocs` as
    /// that frame's payload; `Ok(false)` when the peer declined: send its bytes then.
    pub(crate) async fn send_device(
        &mut self,
        allocs: &[crate::gpu::IpcExport],
        parts: &[crate::transport::local::DevicePart],
    ) -> io::Result<bool> {
        let r = self.w.send_device(&self.buf, allocs, parts).await;
        self.buf.clear();
        r
    }

    /// Send everything queued, then `part` (the next payload bytes), in one gather.
    pub(crate) async fn send_part(&mut self, part: &[u8]) -> io::Result<()> {
        let r = if self.buf.is_empty() {
            self.w.send_all(&[part]).await
        } else {
            self.w.send_all(&[&self.buf, part]).await
        };
        self.buf.clear();
        r
    }

    /// Send everything queued.
    pub(crate) async fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let r = self.w.send_all(&[&self.buf]).await;
        self.buf.clear();
        r
    }

    /// Queue and flush at once.
    pub(crate) async fn send(&mut self, frame: &Frame, payload: &[&[u8]]) -> io::Result<()> {
        self.push(frame, payload).await?;
        self.flush().await
    }
}

/// A frame whose payload is larger than this leaves in two sends: its header with the first
/// this many payload bytes, then the rest. TCP hands a send's bytes to the peer in segments
/// of up to 64 KiB over loopback, so the peer's reader would otherwise see the header only
/// once the sender has copied the first 64 KiB; with a short first send it starts placing
/// the payload while the sender copies the rest.
const HEAD_FIRST_BYTES: usize = 16 << 10;

/// Payloads below this leave in one send: a send costs about 5 µs of its own on the H200
/// VM, more than a small chunk's pipelining gains (docs/results/h200-bench-657c8e3.txt).
const HEAD_FIRST_MIN_BYTES: usize = 512 << 10;

/// Send `parts` (a header, then payload slices) as [`HEAD_FIRST_BYTES`] describes.
async fn send_head_first(w: &mut Tx, parts: &[&[u8]]) -> io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let head = parts.first().map_or(0, |p| p.len());
    if total <= head + 2 * HEAD_FIRST_BYTES || total < HEAD_FIRST_MIN_BYTES {
        return w.send_all(parts).await;
    }
    let (first, rest) = split_parts(parts, head + HEAD_FIRST_BYTES);
    w.send_all(&first).await?;
    crate::trace::mark_current(crate::trace::stage::HEAD_SENT);
    w.send_all(&rest).await
}

/// `parts` cut after `n` bytes: the slices before, the slices after (one slice may be split).
fn split_parts<'a>(parts: &[&'a [u8]], mut n: usize) -> (Vec<&'a [u8]>, Vec<&'a [u8]>) {
    let mut first = Vec::new();
    let mut rest = Vec::with_capacity(parts.len());
    for &p in parts {
        if n >= p.len() {
            first.push(p);
            n -= p.len();
        } else if n > 0 {
            first.push(&p[..n]);
            rest.push(&p[n..]);
            n = 0;
        } else {
            rest.push(p);
        }
    }
    (first, rest)
}

/// Read exactly one frame without payload and without reading past it (handshakes, where
/// the connection may be handed to another shard right after).
pub(crate) async fn read_frame_exact<R: AsyncRead + Unpin>(r: &mut R) -> Result<Frame, ConnError> {
    use crate::proto::decode::{decode_body, decode_header};
    let mut h = [0u8; HEADER_BYTES];
    r.read_exact(&mut h).await.map_err(eof_is_closed)?;
    let header = decode_header(&h)?;
    // Before a peer has proven anything it gets no more than a handshake's worth of memory.
    if header.body_len as usize > MAX_HANDSHAKE_BODY_BYTES {
        return Err(ConnError::Violation(format!(
            "handshake frame body of {} bytes",
            header.body_len
        )));
    }
    let mut body = vec![0u8; header.body_len as usize];
    r.read_exact(&mut body).await.map_err(eof_is_closed)?;
    let frame = decode_body(&header, &body)?;
    if header.payload_len != 0 {
        return Err(ConnError::Violation(
            "handshake frame with a payload".into(),
        ));
    }
    Ok(frame)
}

fn eof_is_closed(e: io::Error) -> ConnError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ConnError::Closed
    } else {
        ConnError::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::ascending_disjoint;
    use super::FrameReader;
    use crate::proto::frame::Frame;
    use std::cell::RefCell;
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::rc::Rc;
    use std::task::{Context, Poll};
    use std::time::Duration;

    /// A stream whose bytes arrive when the test pushes them; a read takes what is there.
    #[derive(Clone, Default)]
    struct Arrivals(Rc<RefCell<Vec<u8>>>);

    impl Arrivals {
        fn push(&self, bytes: &[u8]) {
            self.0.borrow_mut().extend_from_slice(bytes);
        }
    }

    impl futures_lite::AsyncRead for Arrivals {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<io::Result<usize>> {
            let mut q = self.0.borrow_mut();
            if q.is_empty() {
                // The tests poll again themselves once they pushed more.
                return Poll::Pending;
            }
            let n = buf.len().min(q.len());
            buf[..n].copy_from_slice(&q[..n]);
            q.drain(..n);
            Poll::Ready(Ok(n))
        }
    }

    fn goaway(msg_bytes: usize) -> Vec<u8> {
        let mut v = Vec::new();
        let f = Frame::GoAway {
            code: crate::proto::codes::ERR_BAD_STATE,
            msg: "x".repeat(msg_bytes),
        };
        f.encode(0, &mut v);
        v
    }

    fn next(r: &mut FrameReader<Arrivals>) -> Duration {
        let f = futures_lite::future::block_on(r.next_frame()).unwrap();
        assert!(matches!(f, Some((Frame::GoAway { .. }, 0))));
        r.frame_age(std::time::Instant::now())
    }

    const WAIT: Duration = Duration::from_millis(20);

    /// Frames that were queued while the reader did not read (every read took all it asked
    /// for, so the input was never seen empty) read as old as that; once a read leaves the
    /// input empty, what arrives next reads young.
    #[test]
    fn a_frame_is_as_old_as_the_input_was_last_seen_not_empty() {
        let input = Arrivals::default();
        let mut r = FrameReader::new(input.clone(), Duration::from_secs(1));
        r.keep_ages(true);
        std::thread::sleep(WAIT);
        // More than one read window: the first read is full.
        for _ in 0..8 {
            input.push(&goaway(2000));
        }
        for i in 0..8 {
            assert!(next(&mut r) >= WAIT, "frame {i}");
        }
        // The last read was short: the input is empty now, and a frame that comes now is
        // young however long the reader had waited before.
        input.push(&goaway(10));
        assert!(next(&mut r) < WAIT);
    }

    /// Where a read that returns less than it asked for does not mean an empty input (a
    /// same-host connection's reads stop at a record's end), frames stay as old as the last
    /// read that had to wait says.
    #[test]
    fn without_short_drains_only_a_wait_marks_the_input_empty() {
        let input = Arrivals::default();
        let mut r = FrameReader::new(input.clone(), Duration::from_secs(1));
        r.keep_ages(false);
        std::thread::sleep(WAIT);
        input.push(&goaway(10));
        assert!(next(&mut r) >= WAIT);
        input.push(&goaway(10));
        assert!(next(&mut r) >= WAIT, "a short read marked the input empty");
    }

    /// A reader that found its input empty (its read had to wait) knows that what comes
    /// next arrived after that, even when the read that gets it takes all it asked for.
    #[test]
    fn a_read_that_had_to_wait_marks_the_input_empty() {
        let input = Arrivals::default();
        let mut r = FrameReader::new(input.clone(), Duration::from_secs(1));
        r.keep_ages(true);
        std::thread::sleep(WAIT);
        {
            let mut f = std::pin::pin!(r.next_frame());
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(f.as_mut().poll(&mut cx).is_pending());
            // More than a read window: the read is not short.
            input.push(&goaway(10_000));
            assert!(matches!(f.as_mut().poll(&mut cx), Poll::Ready(Ok(Some(_)))));
        }
        assert!(r.frame_age(std::time::Instant::now()) < WAIT);
    }

    /// A frame whose first bytes came with an old frame is as old as those bytes; what came
    /// with the rest of it is younger (the input was seen empty before that read).
    #[test]
    fn a_frame_split_over_reads_keeps_the_age_of_its_first_bytes() {
        let input = Arrivals::default();
        let mut r = FrameReader::new(input.clone(), Duration::from_secs(1));
        r.keep_ages(true);
        std::thread::sleep(WAIT);
        let (a, b, c) = (goaway(10), goaway(100), goaway(10));
        input.push(&a);
        // Part of b's header: the read that finishes it takes a whole window, c with it.
        input.push(&b[..10]);
        assert!(next(&mut r) >= WAIT, "a");
        input.push(&b[10..]);
        input.push(&c);
        assert!(next(&mut r) >= WAIT, "b");
        assert!(next(&mut r) < WAIT, "c");
    }

    #[test]
    fn parts_split_at_any_byte() {
        let (a, b, c) = (&[1u8, 2, 3][..], &[4u8][..], &[5u8, 6][..]);
        let flat = |v: &[&[u8]]| v.concat();
        for n in 0..=7 {
            let (x, y) = super::split_parts(&[a, b, c], n);
            assert_eq!(flat(&x), [1u8, 2, 3, 4, 5, 6][..n.min(6)].to_vec(), "n {n}");
            assert_eq!(flat(&y), [1u8, 2, 3, 4, 5, 6][n.min(6)..].to_vec(), "n {n}");
            assert!(x.iter().chain(&y).all(|p| !p.is_empty()), "n {n}");
        }
    }

    #[test]
    fn ascending_disjoint_ranges() {
        assert!(ascending_disjoint([].into_iter()));
        assert!(ascending_disjoint([(0, 8), (8, 8), (20, 1)].into_iter()));
        assert!(!ascending_disjoint([(0, 8), (7, 8)].into_iter()));
        assert!(!ascending_disjoint([(10, 8), (0, 8)].into_iter()));
        assert!(!ascending_disjoint([(u64::MAX - 1, 8), (5, 1)].into_iter()));
    }
}
