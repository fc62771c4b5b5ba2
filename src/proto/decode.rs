//! Bounded, panic-free decoding of frames from a byte buffer that may hold a partial frame.

use super::access::AccessKey;
use super::codes;
use super::frame::{
    Chunk, Finish, Frame, Hello, HelloAck, Kind, LocalOffer, Op, Reply, Run, Seg, Segs, FLAG_FINAL,
    FLAG_RUNS, FLAG_TO_DEVICE,
};
use super::limits::{
    ACCESS_KEY_BYTES, FRAME_MAGIC, HEADER_BYTES, MAX_BODY_BYTES, MAX_CHUNK_BYTES, MAX_KEY_BYTES,
    MAX_LANES, MAX_MSG_BYTES, MAX_SEGS_PER_CHUNK, NONCE_BYTES, PROOF_BYTES, RUN_BYTES,
    SAME_HOST_VERSION, SEG_BYTES,
};

/// Why bytes from the wire are not a valid frame. Any of these closes the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The header does not start with [`FRAME_MAGIC`]: the stream is not ours or is out of sync.
    #[error("bad frame magic {0:#06x}")]
    BadMagic(u16),
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    /// Flags set that the kind does not define.
    #[error("flags {flags:#04x} not valid for frame kind {kind}")]
    BadFlags {
        /// Kind byte.
        kind: u8,
        /// Flags byte.
        flags: u8,
    },
    /// `body_len` above [`MAX_BODY_BYTES`].
    #[error("frame body of {0} bytes exceeds the limit")]
    BodyTooLarge(u32),
    /// `payload_len` above [`MAX_CHUNK_BYTES`].
    #[error("frame payload of {0} bytes exceeds the limit")]
    PayloadTooLarge(u64),
    /// `payload_len` disagrees with what the body describes.
    #[error("frame payload of {declared} bytes, body describes {expected}")]
    PayloadMismatch {
        /// Declared in the header.
        declared: u64,
        /// Implied by the body.
        expected: u64,
    },
    /// The body ends before its fields do.
    #[error("frame body truncated")]
    Truncated,
    /// The body has bytes after its last field.
    #[error("frame body has {0} trailing bytes")]
    Trailing(usize),
    /// A key or message longer than its limit.
    #[error("string of {0} bytes exceeds its limit")]
    StringTooLong(usize),
    /// A key or message that is not UTF-8.
    #[error("string is not UTF-8")]
    BadUtf8,
    /// Segment count zero or above [`MAX_SEGS_PER_CHUNK`].
    #[error("bad segment count {0}")]
    BadSegCount(u32),
    /// A zero-length segment, or one whose end overflows u64.
    #[error("bad segment")]
    BadSeg,
    /// `chunk >= n_chunks`, `n_chunks == 0`, an inverted extent, a join lane past
    /// `MAX_LANES`, or FINAL on a chunk that is not the whole transfer.
    #[error("bad chunk index or extent")]
    BadChunk,
    /// A status code that cannot end a transfer.
    #[error("status code {0} is not terminal")]
    BadCode(u32),
    /// Unknown op byte in FINISH.
    #[error("unknown op {0}")]
    BadOp(u8),
    /// A handshake field of another length than it has (HELLO_ACK's proof, [`PROOF_BYTES`];
    /// HELLO's host tag, [`NONCE_BYTES`]).
    #[error("handshake field of {0} bytes")]
    BadProofLen(u8),
}

/// A decoded fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Frame kind.
    pub kind: Kind,
    /// Flag bits.
    pub flags: u8,
    /// Body length (≤ [`MAX_BODY_BYTES`]).
    pub body_len: u32,
    /// Payload length (≤ [`MAX_CHUNK_BYTES`]).
    pub payload_len: u64,
}

/// Decode and bound-check the fixed header.
pub fn decode_header(b: &[u8; HEADER_BYTES]) -> Result<Header, DecodeError> {
    let magic = u16::from_le_bytes([b[0], b[1]]);
    if magic != FRAME_MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let kind = Kind::from_u8(b[2]).ok_or(DecodeError::BadKind(b[2]))?;
    let flags = b[3];
    let allowed = match kind {
        Kind::Write => FLAG_FINAL | FLAG_RUNS,
        Kind::Read => FLAG_FINAL | FLAG_RUNS | FLAG_TO_DEVICE,
        Kind::ReadData => FLAG_FINAL,
        _ => 0,
    };
    if flags & !allowed != 0 {
        return Err(DecodeError::BadFlags { kind: b[2], flags });
    }
    let body_len = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    if body_len as usize > MAX_BODY_BYTES {
        return Err(DecodeError::BodyTooLarge(body_len));
    }
    let mut p = [0u8; 8];
    p.copy_from_slice(&b[8..16]);
    let payload_len = u64::from_le_bytes(p);
    if payload_len > MAX_CHUNK_BYTES {
        return Err(DecodeError::PayloadTooLarge(payload_len));
    }
    Ok(Header {
        kind,
        flags,
        body_len,
        payload_len,
    })
}

/// Try to decode one frame from the front of `buf`.
///
/// Returns `Ok(None)` when `buf` holds only part of the header and body (never more than
/// `HEADER_BYTES + MAX_BODY_BYTES` bytes are needed), or the frame, its payload length, and
/// the number of bytes consumed (header + body; the payload follows and is not consumed).
pub fn decode_frame(buf: &[u8]) -> Result<Option<(Frame, u64, usize)>, DecodeError> {
    let Some(hb) = buf.get(..HEADER_BYTES) else {
        return Ok(None);
    };
    let mut h = [0u8; HEADER_BYTES];
    h.copy_from_slice(hb);
    let header = decode_header(&h)?;
    let end = HEADER_BYTES + header.body_len as usize;
    let Some(body) = buf.get(HEADER_BYTES..end) else {
        return Ok(None);
    };
    let frame = decode_body(&header, body)?;
    Ok(Some((frame, header.payload_len, end)))
}

/// Decode a body whose header has already been checked.
pub fn decode_body(h: &Header, body: &[u8]) -> Result<Frame, DecodeError> {
    let mut r = Reader { b: body };
    let final_ = h.flags & FLAG_FINAL != 0;
    let as_runs = h.flags & FLAG_RUNS != 0;
    let frame = match h.kind {
        Kind::Hello => {
            let mut h = Hello {
                version: r.u32()?,
                lane: r.u16()?,
                n_lanes: r.u16()?,
                src_key: r.str16(MAX_KEY_BYTES)?,
                dst_key: r.str16(MAX_KEY_BYTES)?,
                instance: r.u64()?,
                nonce: r.array()?,
                host_tag: None,
            };
            // v7's field, when the HELLO has it (a v6 HELLO ends before it).
            if h.version >= SAME_HOST_VERSION && !r.b.is_empty() {
                h.host_tag = match r.u8()? {
                    0 => None,
                    n if n as usize == NONCE_BYTES => Some(r.array()?),
                    n => return Err(DecodeError::BadProofLen(n)),
                };
            }
            Frame::Hello(h)
        }
        Kind::HelloAck => {
            let mut a = HelloAck {
                version: r.u32()?,
                code: r.code()?,
                key: r.str16(MAX_KEY_BYTES)?,
                msg: r.msg()?,
                nonce: r.array()?,
                proof: match r.u8()? {
                    0 => None,
                    n if n as usize == PROOF_BYTES => Some(r.array()?),
                    n => return Err(DecodeError::BadProofLen(n)),
                },
                same_host: false,
            };
            if a.version >= SAME_HOST_VERSION && !r.b.is_empty() {
                a.same_host = r.u8()? != 0;
            }
            Frame::HelloAck(a)
        }
        Kind::Local => Frame::Local(LocalOffer {
            pid: r.u32()?,
            slot: r.u64()?,
        }),
        Kind::Auth => Frame::Auth(r.array()?),
        Kind::Write => Frame::Write {
            chunk: r.chunk(final_, as_runs)?,
            final_,
        },
        Kind::Read => Frame::Read {
            chunk: r.chunk(final_, as_runs)?,
            final_,
            to_device: h.flags & FLAG_TO_DEVICE != 0,
        },
        Kind::ReadData => Frame::ReadData {
            reply: r.reply()?,
            final_,
        },
        Kind::Finish => {
            let tag = r.u64()?;
            let uid = r.u64()?;
            let op = match r.u8()? {
                1 => Op::Read,
                2 => Op::Write,
                o => return Err(DecodeError::BadOp(o)),
            };
            let n_chunks = r.u32()?;
            let total_bytes = r.u64()?;
            let code = r.code()?;
            Frame::Finish(Finish {
                tag,
                uid,
                op,
                n_chunks,
                total_bytes,
                code,
                msg: r.msg()?,
            })
        }
        Kind::Complete => Frame::Complete(r.reply()?),
        Kind::GoAway => Frame::GoAway {
            code: r.code()?,
            msg: r.msg()?,
        },
    };
    // HELLO and HELLO_ACK may grow at their end in later versions: what follows the fields
    // this version knows is ignored there (and only there).
    let grows = matches!(h.kind, Kind::Hello | Kind::HelloAck);
    if !r.b.is_empty() && !grows {
        return Err(DecodeError::Trailing(r.b.len()));
    }
    let expected = match &frame {
        Frame::Write { chunk, .. } => chunk.bytes(),
        Frame::ReadData { reply, .. } if reply.code == codes::SUCCESS => h.payload_len,
        _ => 0,
    };
    if h.payload_len != expected {
        return Err(DecodeError::PayloadMismatch {
            declared: h.payload_len,
            expected,
        });
    }
    Ok(frame)
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let t = self.take(2)?;
        Ok(u16::from_le_bytes([t[0], t[1]]))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let t = self.take(4)?;
        Ok(u32::from_le_bytes([t[0], t[1], t[2], t[3]]))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let t = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(t);
        Ok(u64::from_le_bytes(a))
    }
    fn access_key(&mut self) -> Result<AccessKey, DecodeError> {
        let mut k = [0u8; ACCESS_KEY_BYTES];
        k.copy_from_slice(self.take(ACCESS_KEY_BYTES)?);
        Ok(AccessKey::from_bytes(k))
    }
    fn code(&mut self) -> Result<u32, DecodeError> {
        let c = self.u32()?;
        if codes::is_terminal(c) {
            Ok(c)
        } else {
            Err(DecodeError::BadCode(c))
        }
    }
    fn string(&mut self, len: usize, max: usize) -> Result<String, DecodeError> {
        if len > max {
            return Err(DecodeError::StringTooLong(len));
        }
        let raw = self.take(len)?;
        String::from_utf8(raw.to_vec()).map_err(|_| DecodeError::BadUtf8)
    }
    fn str16(&mut self, max: usize) -> Result<String, DecodeError> {
        let len = self.u16()? as usize;
        self.string(len, max)
    }
    fn msg(&mut self) -> Result<String, DecodeError> {
        let len = self.u32()? as usize;
        self.string(len, MAX_MSG_BYTES)
    }
    fn reply(&mut self) -> Result<Reply, DecodeError> {
        Ok(Reply {
            tag: self.u64()?,
            uid: self.u64()?,
            chunk: self.u32()?,
            code: self.code()?,
            msg: self.msg()?,
        })
    }
    /// `n` segments in list form: (segments, their total length, whether any is bad).
    fn segs(&mut self, n: u32) -> Result<(Segs, u128, bool), DecodeError> {
        // The count is bounded, and the body must actually hold n segments: check before
        // allocating so a lying count cannot reserve memory.
        let raw = self.take(SEG_BYTES * n as usize)?;
        let mut segs = Vec::with_capacity(n as usize);
        // One pass, no early exits: lengths are summed in u128 (n is bounded, so it cannot
        // overflow) and every check is folded into `bad`.
        let mut total = 0u128;
        let mut bad = false;
        for c in raw.chunks_exact(SEG_BYTES) {
            let (off, len) = (le64(c, 0), le64(c, 8));
            bad |= (len == 0) | off.checked_add(len).is_none();
            total += len as u128;
            segs.push(Seg { off, len });
        }
        Ok((Segs::List(segs), total, bad))
    }

    /// `n` runs: one run of two or more segments stays a run ([`Segs::Run`]), others are
    /// expanded into their segments. The runs must describe at most [`MAX_SEGS_PER_CHUNK`]
    /// segments in all, checked before anything is allocated.
    fn runs(&mut self, n: u32) -> Result<(Segs, u128, bool), DecodeError> {
        let raw = self.take(RUN_BYTES * n as usize)?;
        let mut count = 0u64;
        for c in raw.chunks_exact(RUN_BYTES) {
            count += u64::from(le32(c, 16));
        }
        if count == 0 || count > MAX_SEGS_PER_CHUNK as u64 {
            return Err(DecodeError::BadSegCount(
                u32::try_from(count).unwrap_or(u32::MAX),
            ));
        }
        let run = |c: &[u8]| {
            let r = Run {
                first: Seg {
                    off: le64(c, 0),
                    len: le64(c, 8),
                },
                count: le32(c, 16),
                stride: le64(c, 20),
            };
            // The last segment of the run must end without overflow.
            let bad = (r.first.len == 0) | (r.count == 0) | r.end().is_none();
            (r, bad)
        };
        if raw.len() == RUN_BYTES {
            let (r, bad) = run(raw);
            if r.count >= 2 {
                return Ok((
                    Segs::Run(r),
                    u128::from(r.first.len) * u128::from(r.count),
                    bad,
                ));
            }
        }
        let mut segs = Vec::with_capacity(count as usize);
        let mut total = 0u128;
        let mut bad = false;
        for c in raw.chunks_exact(RUN_BYTES) {
            let (r, b) = run(c);
            bad |= b;
            if bad {
                break;
            }
            total += u128::from(r.first.len) * u128::from(r.count);
            // No overflow: the last segment's end was checked above.
            segs.extend(Segs::Run(r).iter());
        }
        Ok((Segs::List(segs), total, bad))
    }

    /// A chunk body; `final_` chunks must be the whole transfer (`n_chunks == 1`);
    /// `as_runs`: the segments come as runs ([`FLAG_RUNS`]).
    fn chunk(&mut self, final_: bool, as_runs: bool) -> Result<Chunk, DecodeError> {
        let tag = self.u64()?;
        let uid = self.u64()?;
        let chunk = self.u32()?;
        let n_chunks = self.u32()?;
        let mem_id = self.u32()?;
        let access_key = self.access_key()?;
        let lo = self.u64()?;
        let hi = self.u64()?;
        let join_lane = self.u16()?;
        if chunk >= n_chunks || lo > hi || (final_ && n_chunks != 1) || join_lane >= MAX_LANES {
            return Err(DecodeError::BadChunk);
        }
        let n = self.u32()?;
        if n == 0 || n as usize > MAX_SEGS_PER_CHUNK {
            return Err(DecodeError::BadSegCount(n));
        }
        let (segs, total, bad) = if as_runs {
            self.runs(n)?
        } else {
            self.segs(n)?
        };
        if bad {
            return Err(DecodeError::BadSeg);
        }
        if total > MAX_CHUNK_BYTES as u128 {
            return Err(DecodeError::PayloadTooLarge(
                u64::try_from(total).unwrap_or(u64::MAX),
            ));
        }
        Ok(Chunk {
            tag,
            uid,
            chunk,
            n_chunks,
            mem_id,
            access_key,
            extent: (lo, hi),
            join_lane,
            segs,
        })
    }
}

/// The little-endian u64 at `at` of a slice known to be long enough (0 past its end).
fn le64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| <[u8; 8]>::try_from(s).ok())
        .map_or(0, u64::from_le_bytes)
}

/// The little-endian u32 at `at` (0 past the end).
fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map_or(0, u32::from_le_bytes)
}
