//! The frame reader: frames from a stream through a bounded buffer, payloads placed straight
//! into the caller's memory, one deadline per begun frame.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncRead, AsyncReadExt};
use morio_shards::rt;

use crate::proto::decode::decode_frame;
use crate::proto::frame::Frame;
use crate::proto::limits::{HEADER_BYTES, MAX_BODY_BYTES};
use crate::transport::abort::{guarded, Abort};
use crate::transport::Rx;

use super::ConnError;

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
