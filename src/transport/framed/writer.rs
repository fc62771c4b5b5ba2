//! The frame writer: small frames batched with their payloads copied next to their
//! headers, large payloads sent straight from registered memory (head first).

use std::io;

use crate::proto::frame::{
    encode_chunk_segs, ChunkHead, ChunkSegs, Frame, Kind, Seg, FLAG_TO_DEVICE,
};
use crate::transport::Tx;

/// Queued small frames are flushed once this many bytes wait.
const FLUSH_BYTES: usize = 64 << 10;

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
pub(super) fn split_parts<'a>(parts: &[&'a [u8]], mut n: usize) -> (Vec<&'a [u8]>, Vec<&'a [u8]>) {
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
