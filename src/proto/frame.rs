//! Frame types and their encoding. Layout (little-endian) is documented in `PROTOCOL.md`.

use super::access::AccessKey;
use super::limits::{FRAME_MAGIC, HEADER_BYTES, NONCE_BYTES, PROOF_BYTES};
pub use super::segs::{Run, Seg, Segs};

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Dialer → acceptor, first frame of every connection.
    Hello = 1,
    /// Acceptor → dialer, answer to HELLO.
    HelloAck = 2,
    /// A chunk of a write, payload = the chunk's bytes.
    Write = 3,
    /// A chunk of a read request (no payload).
    Read = 4,
    /// Target → initiator: the bytes of a read chunk (or why not).
    ReadData = 6,
    /// Initiator → target, on the join lane: a chunk failed before it left, so the join
    /// cannot complete; record this verdict as the inbound status and end the join.
    Finish = 7,
    /// Target → initiator: the transfer's inbound status is recorded; here is its code.
    Complete = 8,
    /// Target → initiator, before closing a connection for a protocol error.
    GoAway = 9,
    /// Dialer → acceptor, after a HELLO_ACK that carried a proof: the dialer's proof that it
    /// holds the deployment secret (the connection's last handshake frame).
    Auth = 10,
    /// Either way, last in a handshake whose HELLO_ACK said both ends are on one host (from
    /// protocol v7): the sender's process id and the address of its probe slot, whose
    /// contents prove the sender is this connection's peer ([`super::handshake`]); from the
    /// acceptor, a zero pid declines.
    Local = 11,
}

impl Kind {
    /// Decode a kind byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Hello,
            2 => Self::HelloAck,
            3 => Self::Write,
            4 => Self::Read,
            // 5 was ACK (a write chunk other than chunk 0 placed) up to protocol v3.
            6 => Self::ReadData,
            7 => Self::Finish,
            8 => Self::Complete,
            9 => Self::GoAway,
            10 => Self::Auth,
            11 => Self::Local,
            _ => return None,
        })
    }
}

/// Flag on WRITE / READ: the chunk is the whole transfer; the target records the inbound
/// status itself and answers with COMPLETE (write) or a final READ_DATA (read).
pub const FLAG_FINAL: u8 = 1;

/// Flag on WRITE / READ: the segment list is sent as runs (`off`, `len`, `count`, `stride`:
/// `count` segments of `len` bytes at `off`, `off + stride`, ...). The encoder picks this form
/// whenever it is smaller, so a batch of equal-sized segments at a constant stride costs one
/// run on the wire instead of one entry per segment.
pub const FLAG_RUNS: u8 = 2;

/// Flag on READ (version 8, same-host connections only): the initiator places the data into
/// GPU memory, so the target may offer its own GPU memory as device parts (PROTOCOL.md,
/// "Device parts"). A peer of version 7 or older never receives it.
pub const FLAG_TO_DEVICE: u8 = 4;

/// Which way a transfer moves bytes, seen from its initiator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// Remote → local.
    Read = 1,
    /// Local → remote.
    Write = 2,
}

/// A WRITE or READ chunk: self-describing, so the receiving core can validate and place it
/// with nothing but the region table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Lane-local request tag, echoed in the response.
    pub tag: u64,
    /// The initiator's transfer uid.
    pub uid: u64,
    /// Index of this chunk within the transfer.
    pub chunk: u32,
    /// Number of chunks of the transfer.
    pub n_chunks: u32,
    /// Target region id (the target's `MemoryDesc.id`).
    pub mem_id: u32,
    /// The target region's access key (its `MemoryDesc.access_key`): the target refuses the
    /// chunk unless it is the region's key, exactly as if `mem_id` were unknown.
    pub access_key: AccessKey,
    /// `[lo, hi)` range of the region the whole transfer touches; every chunk of a transfer
    /// carries the same extent, so a transfer out of range is refused before any byte lands.
    pub extent: (u64, u64),
    /// The initiator's home lane of a multi-chunk transfer, which carries chunk 0 (and FINISH,
    /// if one is sent): the target checks chunk 0 arrived on it and that every chunk names a
    /// lane of the peer (0, and ignored, for a one-chunk transfer). The target's join itself
    /// is engine-wide: whichever lane carries the chunk that completes it answers COMPLETE.
    pub join_lane: u16,
    /// Target-side segments of this chunk, in payload order (one run as a run).
    pub segs: Segs,
}

impl Chunk {
    /// Sum of segment lengths (saturating; the decoder rejects overflow).
    pub fn bytes(&self) -> u64 {
        self.segs.bytes()
    }
}

/// A response that carries a status: READ_DATA, or COMPLETE (whose `chunk` is the index of
/// the chunk that completed a joined transfer, with that chunk's tag; 0 for a whole one and
/// for FINISH's answer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The request's tag.
    pub tag: u64,
    /// The transfer uid.
    pub uid: u64,
    /// The chunk index (0 for COMPLETE).
    pub chunk: u32,
    /// Wire status code ([`super::codes`]).
    pub code: u32,
    /// Human-readable reason for an error, empty on success.
    pub msg: String,
}

/// The initiator's verdict that ends a transfer at the target when one of its chunks never
/// left (see [`Kind::Finish`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    /// Lane-local tag, echoed by COMPLETE.
    pub tag: u64,
    /// The transfer uid.
    pub uid: u64,
    /// Read or write.
    pub op: Op,
    /// Number of chunks the transfer had.
    pub n_chunks: u32,
    /// Total bytes of the transfer.
    pub total_bytes: u64,
    /// First error seen over the chunks, or success.
    pub code: u32,
    /// Its message.
    pub msg: String,
}

/// First frame of every connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version ([`super::limits::VERSION`]).
    pub version: u32,
    /// Lane index of this connection.
    pub lane: u16,
    /// Lanes the dialer opens to this peer.
    pub n_lanes: u16,
    /// The dialer's engine key.
    pub src_key: String,
    /// The engine key the dialer expects to reach.
    pub dst_key: String,
    /// A number the dialing engine drew when it started, the same on all its connections:
    /// tells a restarted engine with the same key (whose uids start over) from its
    /// predecessor, whose unfinished transfers the target may still hold.
    pub instance: u64,
    /// Fresh random bytes of this connection, bound into both proofs of an authenticated
    /// handshake ([`super::handshake`]).
    pub nonce: [u8; NONCE_BYTES],
    /// From v7, when the dialer offers the same-host transport: a tag of its host for this
    /// connection ([`super::handshake::host_tag`]), which an acceptor on the same host
    /// recognises and one on another learns nothing from.
    pub host_tag: Option<[u8; NONCE_BYTES]>,
}

/// Answer to HELLO.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloAck {
    /// The acceptor's protocol version.
    pub version: u32,
    /// SUCCESS, or why the connection is refused.
    pub code: u32,
    /// The acceptor's engine key (empty in a refusal, and when the acceptor authenticates:
    /// its proof names the key instead).
    pub key: String,
    /// Reason for a refusal.
    pub msg: String,
    /// Fresh random bytes of the acceptor (zero when it does not authenticate).
    pub nonce: [u8; NONCE_BYTES],
    /// The acceptor's proof that it holds the deployment secret, when it has one.
    pub proof: Option<[u8; PROOF_BYTES]>,
    /// From v7: the acceptor recognised the dialer's host tag as its own host and is willing
    /// to move bytes through the same-host transport (the LOCAL frames follow).
    pub same_host: bool,
}

/// A LOCAL frame's body: whose memory the peer may read, and where this connection's proof is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalOffer {
    /// The sender's process id (0: the acceptor declines).
    pub pid: u32,
    /// The address, in that process, of the probe slot holding the sender's proof.
    pub slot: u64,
}

/// A decoded frame (the payload, if any, follows on the stream and is not part of it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// See [`Kind::Hello`].
    Hello(Hello),
    /// See [`Kind::HelloAck`].
    HelloAck(HelloAck),
    /// See [`Kind::Write`]; `final_` is [`FLAG_FINAL`].
    Write {
        /// The chunk.
        chunk: Chunk,
        /// Whole-transfer chunk.
        final_: bool,
    },
    /// See [`Kind::Read`].
    Read {
        /// The chunk.
        chunk: Chunk,
        /// Whole-transfer chunk.
        final_: bool,
        /// The initiator places the data into GPU memory ([`FLAG_TO_DEVICE`]).
        to_device: bool,
    },
    /// See [`Kind::ReadData`]; the payload follows when `reply.code == SUCCESS`.
    ReadData {
        /// Status of the chunk.
        reply: Reply,
        /// This answers a final read: the target has recorded its inbound status.
        final_: bool,
    },
    /// See [`Kind::Finish`].
    Finish(Finish),
    /// See [`Kind::Complete`].
    Complete(Reply),
    /// See [`Kind::Auth`]: the dialer's proof.
    Auth([u8; PROOF_BYTES]),
    /// See [`Kind::Local`].
    Local(LocalOffer),
    /// See [`Kind::GoAway`].
    GoAway {
        /// Why.
        code: u32,
        /// Reason.
        msg: String,
    },
}

impl Frame {
    /// The frame's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Self::Hello(_) => Kind::Hello,
            Self::HelloAck(_) => Kind::HelloAck,
            Self::Write { .. } => Kind::Write,
            Self::Read { .. } => Kind::Read,
            Self::ReadData { .. } => Kind::ReadData,
            Self::Finish(_) => Kind::Finish,
            Self::Complete(_) => Kind::Complete,
            Self::GoAway { .. } => Kind::GoAway,
            Self::Auth(_) => Kind::Auth,
            Self::Local(_) => Kind::Local,
        }
    }

    /// Append header + body to `out`. `payload_len` is the number of payload bytes the caller
    /// will send right after (WRITE: the chunk's bytes; READ_DATA: the data; else 0).
    ///
    /// Strings longer than the protocol's limits are truncated (keys are validated at engine
    /// creation, messages are informative).
    pub fn encode(&self, payload_len: u64, out: &mut Vec<u8>) {
        if let Self::Write { chunk, final_ } | Self::Read { chunk, final_, .. } = self {
            let start = out.len();
            let (kind, head) = (self.kind(), chunk.head());
            match &chunk.segs {
                Segs::List(list) => {
                    encode_chunk(kind, *final_, &head, list, |s| *s, payload_len, out)
                }
                Segs::Run(r) => encode_chunk_run(
                    kind,
                    *final_,
                    &head,
                    (r.first, r.count, r.stride),
                    payload_len,
                    out,
                ),
            }
            if let Self::Read {
                to_device: true, ..
            } = self
            {
                out[start + 3] |= FLAG_TO_DEVICE;
            }
            return;
        }
        let start = out.len();
        out.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
        out.push(self.kind() as u8);
        let flags = match self {
            Self::ReadData { final_: true, .. } => FLAG_FINAL,
            _ => 0,
        };
        out.push(flags);
        out.extend_from_slice(&0u32.to_le_bytes()); // body_len, patched below
        out.extend_from_slice(&payload_len.to_le_bytes());
        let body = out.len();
        match self {
            Self::Hello(h) => {
                put_u32(out, h.version);
                put_u16(out, h.lane);
                put_u16(out, h.n_lanes);
                put_str16(out, &h.src_key, super::limits::MAX_KEY_BYTES);
                put_str16(out, &h.dst_key, super::limits::MAX_KEY_BYTES);
                put_u64(out, h.instance);
                out.extend_from_slice(&h.nonce);
                // v7 appends the host tag (v6 peers ignore what follows the fields they know;
                // a v6 HELLO carries none).
                if h.version >= super::limits::SAME_HOST_VERSION {
                    match &h.host_tag {
                        Some(t) => {
                            out.push(NONCE_BYTES as u8);
                            out.extend_from_slice(t);
                        }
                        None => out.push(0),
                    }
                }
            }
            Self::HelloAck(a) => {
                put_u32(out, a.version);
                put_u32(out, a.code);
                put_str16(out, &a.key, super::limits::MAX_KEY_BYTES);
                put_msg(out, &a.msg);
                out.extend_from_slice(&a.nonce);
                match &a.proof {
                    Some(p) => {
                        out.push(PROOF_BYTES as u8);
                        out.extend_from_slice(p);
                    }
                    None => out.push(0),
                }
                if a.version >= super::limits::SAME_HOST_VERSION {
                    out.push(a.same_host as u8);
                }
            }
            Self::Auth(p) => out.extend_from_slice(p),
            Self::Local(l) => {
                put_u32(out, l.pid);
                put_u64(out, l.slot);
            }
            Self::Write { .. } | Self::Read { .. } => unreachable!("encoded above"),
            Self::Complete(r) | Self::ReadData { reply: r, .. } => {
                put_u64(out, r.tag);
                put_u64(out, r.uid);
                put_u32(out, r.chunk);
                put_u32(out, r.code);
                put_msg(out, &r.msg);
            }
            Self::Finish(f) => {
                put_u64(out, f.tag);
                put_u64(out, f.uid);
                out.push(f.op as u8);
                put_u32(out, f.n_chunks);
                put_u64(out, f.total_bytes);
                put_u32(out, f.code);
                put_msg(out, &f.msg);
            }
            Self::GoAway { code, msg } => {
                put_u32(out, *code);
                put_msg(out, msg);
            }
        }
        let body_len = (out.len() - body) as u32;
        out[start + 4..start + 8].copy_from_slice(&body_len.to_le_bytes());
        debug_assert_eq!(body - start, HEADER_BYTES);
    }
}

/// A chunk frame's fields other than its segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHead {
    /// See [`Chunk::tag`].
    pub tag: u64,
    /// See [`Chunk::uid`].
    pub uid: u64,
    /// See [`Chunk::chunk`].
    pub chunk: u32,
    /// See [`Chunk::n_chunks`].
    pub n_chunks: u32,
    /// See [`Chunk::mem_id`].
    pub mem_id: u32,
    /// See [`Chunk::access_key`].
    pub access_key: AccessKey,
    /// See [`Chunk::extent`].
    pub extent: (u64, u64),
    /// See [`Chunk::join_lane`].
    pub join_lane: u16,
}

impl Chunk {
    /// The chunk of `head` with `segs`.
    pub fn new(head: ChunkHead, segs: impl Into<Segs>) -> Self {
        let ChunkHead {
            tag,
            uid,
            chunk,
            n_chunks,
            mem_id,
            access_key,
            extent,
            join_lane,
        } = head;
        Self {
            tag,
            uid,
            chunk,
            n_chunks,
            mem_id,
            access_key,
            extent,
            join_lane,
            segs: segs.into(),
        }
    }

    /// The fields other than the segments.
    pub fn head(&self) -> ChunkHead {
        ChunkHead {
            tag: self.tag,
            uid: self.uid,
            chunk: self.chunk,
            n_chunks: self.n_chunks,
            mem_id: self.mem_id,
            access_key: self.access_key,
            extent: self.extent,
            join_lane: self.join_lane,
        }
    }
}

/// The runs of a segment list, greedily: each run is the longest stretch of segments of
/// one length at one constant, non-negative stride from the first (a lone segment is a run
/// of one, stride 0), as `(first segment, count, stride)`.
pub fn runs<'a, S>(
    segs: &'a [S],
    seg: impl Fn(&S) -> Seg + 'a,
) -> impl Iterator<Item = (Seg, u32, u64)> + 'a {
    let mut i = 0;
    std::iter::from_fn(move || {
        let first = seg(segs.get(i)?);
        let mut count = 1usize;
        let mut stride = 0;
        if let Some(second) = segs.get(i + 1).map(&seg) {
            if second.len == first.len && second.off >= first.off {
                stride = second.off - first.off;
                let mut at = second.off;
                count = 2;
                for next in segs[i + 2..].iter().map(&seg) {
                    if next.len != first.len
                        || at.checked_add(stride) != Some(next.off)
                        || count == u32::MAX as usize
                    {
                        break;
                    }
                    at = next.off;
                    count += 1;
                }
            }
        }
        i += count;
        Some((first, count as u32, stride))
    })
}

/// Encode a WRITE or READ chunk frame whose target segments are `seg(s)` for each element
/// of `segs` (so callers holding their own piece type need not build a `Vec<Seg>`). Picks
/// the run form ([`FLAG_RUNS`]) when it is the smaller one.
pub fn encode_chunk<S>(
    kind: Kind,
    final_: bool,
    head: &ChunkHead,
    segs: &[S],
    seg: impl Fn(&S) -> Seg + Copy,
    payload_len: u64,
    out: &mut Vec<u8>,
) {
    use super::limits::{CHUNK_FIXED_BYTES, RUN_BYTES, SEG_BYTES};
    debug_assert!(matches!(kind, Kind::Write | Kind::Read));
    let list_bytes = segs.len() * SEG_BYTES;
    out.reserve(HEADER_BYTES + CHUNK_FIXED_BYTES + list_bytes);
    let flags = if final_ { FLAG_FINAL } else { 0 } | FLAG_RUNS;
    let start = chunk_prefix(kind, flags, head, payload_len, out);
    let count_at = out.len();
    put_u32(out, 0); // n_runs or n_segs, patched below
                     // Runs first, in one pass; once they are no smaller than the list, fall back to it.
    let mut n_runs = 0usize;
    for (s, count, stride) in runs(segs, seg) {
        n_runs += 1;
        if n_runs * RUN_BYTES >= list_bytes {
            break;
        }
        put_run(out, s, count, stride);
    }
    let n = if n_runs * RUN_BYTES < list_bytes {
        n_runs
    } else {
        out.truncate(count_at + 4);
        out[start + 3] &= !FLAG_RUNS;
        for s in segs {
            let s = seg(s);
            put_u64(out, s.off);
            put_u64(out, s.len);
        }
        segs.len()
    };
    out[count_at..count_at + 4].copy_from_slice(&(n as u32).to_le_bytes());
    patch_body_len(start, out);
}

/// A chunk's target segments as the encoder takes them: a caller's own piece type with a
/// projection to [`Seg`] (encoded as runs or as a list, whichever is smaller), or one run
/// (`first`, `count` ≥ 1, `stride`).
#[derive(Clone, Copy, Debug)]
pub enum ChunkSegs<'a, S, F> {
    /// Segments `seg(s)` for each `s`.
    List(&'a [S], F),
    /// `count` segments of `first.len` bytes at `first.off`, `first.off + stride`, ...
    Run(Seg, u32, u64),
}

/// Encode a WRITE or READ chunk frame with its segments given as [`ChunkSegs`].
pub fn encode_chunk_segs<S, F: Fn(&S) -> Seg + Copy>(
    kind: Kind,
    final_: bool,
    head: &ChunkHead,
    segs: ChunkSegs<'_, S, F>,
    payload_len: u64,
    out: &mut Vec<u8>,
) {
    match segs {
        ChunkSegs::List(list, seg) => encode_chunk(kind, final_, head, list, seg, payload_len, out),
        ChunkSegs::Run(first, count, stride) => {
            encode_chunk_run(kind, final_, head, (first, count, stride), payload_len, out)
        }
    }
}

/// Encode a WRITE or READ chunk frame whose target segments are one run: `count` segments
/// of `first.len` bytes at `first.off`, `first.off + stride`, ... (`count` ≥ 1).
pub fn encode_chunk_run(
    kind: Kind,
    final_: bool,
    head: &ChunkHead,
    (first, count, stride): (Seg, u32, u64),
    payload_len: u64,
    out: &mut Vec<u8>,
) {
    use super::limits::{CHUNK_FIXED_BYTES, RUN_BYTES};
    debug_assert!(matches!(kind, Kind::Write | Kind::Read) && count >= 1);
    out.reserve(HEADER_BYTES + CHUNK_FIXED_BYTES + RUN_BYTES);
    let flags = if final_ { FLAG_FINAL } else { 0 } | FLAG_RUNS;
    let start = chunk_prefix(kind, flags, head, payload_len, out);
    put_u32(out, 1);
    put_run(out, first, count, stride);
    patch_body_len(start, out);
}

/// Header (body length left 0) and the fixed chunk fields; returns where the frame starts.
fn chunk_prefix(
    kind: Kind,
    flags: u8,
    head: &ChunkHead,
    payload_len: u64,
    out: &mut Vec<u8>,
) -> usize {
    let start = out.len();
    out.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
    out.push(kind as u8);
    out.push(flags);
    out.extend_from_slice(&0u32.to_le_bytes()); // body_len, patched by patch_body_len
    out.extend_from_slice(&payload_len.to_le_bytes());
    put_u64(out, head.tag);
    put_u64(out, head.uid);
    put_u32(out, head.chunk);
    put_u32(out, head.n_chunks);
    put_u32(out, head.mem_id);
    out.extend_from_slice(head.access_key.as_bytes());
    put_u64(out, head.extent.0);
    put_u64(out, head.extent.1);
    out.extend_from_slice(&head.join_lane.to_le_bytes());
    start
}

fn put_run(out: &mut Vec<u8>, s: Seg, count: u32, stride: u64) {
    put_u64(out, s.off);
    put_u64(out, s.len);
    put_u32(out, count);
    put_u64(out, stride);
}

fn patch_body_len(start: usize, out: &mut [u8]) {
    let body_len = (out.len() - start - HEADER_BYTES) as u32;
    out[start + 4..start + 8].copy_from_slice(&body_len.to_le_bytes());
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_str16(out: &mut Vec<u8>, s: &str, max: usize) {
    let b = truncate(s, max);
    put_u16(out, b.len() as u16);
    out.extend_from_slice(b);
}
fn put_msg(out: &mut Vec<u8>, s: &str) {
    let b = truncate(s, super::limits::MAX_MSG_BYTES);
    put_u32(out, b.len() as u32);
    out.extend_from_slice(b);
}
/// Longest prefix of `s` of at most `max` bytes that ends on a char boundary.
fn truncate(s: &str, max: usize) -> &[u8] {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}
