//! Named limits: every length read from the wire is checked against one of these before it
//! allocates or places a byte.

/// The newest protocol version this build speaks, offered in HELLO; the acceptor answers with
/// the version the connection then speaks (PROTOCOL.md, "Versions").
pub const VERSION: u32 = 11;
/// The oldest protocol version this build speaks (HELLO's and HELLO_ACK's layouts are fixed
/// from this version on; later versions only append fields to them).
pub const MIN_VERSION: u32 = 6;
/// The first version with the same-host transport (HELLO's host tag, HELLO_ACK's same-host
/// flag, the LOCAL frames; PROTOCOL.md "Same-host transport").
pub const SAME_HOST_VERSION: u32 = 7;
/// The first version whose same-host connections carry device parts (GPU memory reached
/// through IPC handles; PROTOCOL.md "Same-host transport").
pub const DEVICE_PARTS_VERSION: u32 = 8;
/// Smallest data area of a same-host ring (PROTOCOL.md "Rings"; a power of two).
pub const MIN_RING_BYTES: usize = 64 << 10;
/// Largest data area of a same-host ring.
pub const MAX_RING_BYTES: usize = 16 << 20;
/// The first version whose same-host connections carry their record streams in
/// shared-memory rings (PROTOCOL.md "Same-host transport", "Rings").
pub const RING_VERSION: u32 = 9;
/// The first version whose same-host connections offer device parts in several allocations
/// of any kind (DEVICES records: VMM memory, exported one chunk at a time as file
/// descriptors; PROTOCOL.md "Device parts").
pub const DEVICE_SETS_VERSION: u32 = 10;
/// The first version whose targets answer FINISH on every lane of a transfer (recording the
/// first), each once the chunks read before it on that connection are placed or dropped: an
/// initiator fences a write that failed early with one on each lane that carried its chunks
/// (PROTOCOL.md "Joins").
pub const FENCE_VERSION: u32 = 11;
/// Random bytes each side of a handshake contributes ([`super::handshake`]).
pub const NONCE_BYTES: usize = 16;
/// An HMAC-SHA-256 proof in the handshake.
pub const PROOF_BYTES: usize = 32;
/// Largest body of a handshake frame (the largest HELLO_ACK: version, code, key, message,
/// nonce, proof): what a connection that has not yet proven anything can make a target
/// allocate.
pub const MAX_HANDSHAKE_BODY_BYTES: usize =
    4 + 4 + 2 + MAX_KEY_BYTES + 4 + MAX_MSG_BYTES + NONCE_BYTES + 1 + PROOF_BYTES + 1;
// The largest HELLO (version, lane, lanes, two keys, instance, nonce, host tag) fits too.
const _: () = assert!(
    4 + 2 + 2 + 2 * (2 + MAX_KEY_BYTES) + 8 + NONCE_BYTES + 1 + NONCE_BYTES
        <= MAX_HANDSHAKE_BODY_BYTES
);
/// Magic at the start of every frame header ("MO" little-endian).
pub const FRAME_MAGIC: u16 = 0x4F4D;
/// Size of the fixed frame header.
pub const HEADER_BYTES: usize = 16;
/// Largest engine key accepted in a HELLO.
pub const MAX_KEY_BYTES: usize = 1024;
/// Largest status message carried in a response.
pub const MAX_MSG_BYTES: usize = 4096;
/// Most segments one chunk frame may describe.
pub const MAX_SEGS_PER_CHUNK: usize = 4096;
/// An access key (`proto::access::AccessKey`): in a chunk body and a packed `MemoryDesc`.
pub const ACCESS_KEY_BYTES: usize = 16;
/// Fixed part of a chunk body (tag, uid, chunk, n_chunks, mem id, access key, extent, join
/// lane, n_segs).
pub const CHUNK_FIXED_BYTES: usize = 8 + 8 + 4 + 4 + 4 + ACCESS_KEY_BYTES + 8 + 8 + 2 + 4;
/// One segment in a chunk's list form (`u64 off`, `u64 len`).
pub const SEG_BYTES: usize = 16;
/// One run in a chunk's run form (`u64 off`, `u64 len`, `u32 count`, `u64 stride`). An
/// encoder uses the run form only when it is smaller than the list form, so the body limit
/// below holds for both.
pub const RUN_BYTES: usize = 28;
/// Largest frame body: a chunk with the most segments in list form (everything else is
/// smaller).
pub const MAX_BODY_BYTES: usize = CHUNK_FIXED_BYTES + SEG_BYTES * MAX_SEGS_PER_CHUNK;
/// Largest payload one frame may carry; `TcpBackendConfig::chunk_bytes` is capped by it.
pub const MAX_CHUNK_BYTES: u64 = 64 << 20;
/// Most lanes (data connections) per peer.
pub const MAX_LANES: u16 = 16;
/// Smallest stripe a striped transfer is cut into (keeps per-frame overhead negligible).
pub const MIN_STRIPE_BYTES: u64 = 64 << 10;
/// A striped write shares its stripes between its lanes (`share_stripes`) when it has at
/// least this many full chunks per lane.
pub const SHARE_MIN_CHUNKS_PER_LANE: u64 = 2;
/// Most chunks one transfer may be cut into. A target joins a transfer of `n` chunks with a
/// bitmap of `n` bits, so this bounds what one frame's `n_chunks` can make it reserve (128 KiB).
/// It is 1 TiB at the default `chunk_bytes` (1 MiB) and 4 GiB at the smallest (4 KiB):
/// morio's initiator refuses a larger transfer (`ERR_INVALID_ARGS`) rather than send it, and a
/// target closes a connection whose chunk claims more.
pub const MAX_CHUNKS_PER_TRANSFER: u32 = 1 << 20;
/// A join counts against the join caps (`TcpBackendConfig::max_joins_per_peer`,
/// `max_joins`) as one slot per started this many chunks: its bitmap grows with its chunk
/// count, so the caps bound bytes, not only entries. A transfer of up to 512 chunks (512 MiB
/// at the default chunk size) takes one slot; one of [`MAX_CHUNKS_PER_TRANSFER`], 2048.
pub const JOIN_SLOT_CHUNKS: u32 = 512;
