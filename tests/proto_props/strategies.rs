//! Strategies and helpers the property tests share: valid frames with their payload lengths
//! (strings, segment lists, run-shaped segment lists, access keys, chunks, replies), the
//! encoder's bytes, and the invariants any decode must keep.

use morio::proto::access::AccessKey;
use morio::proto::codes::SUCCESS;
use morio::proto::decode::decode_frame;
use morio::proto::frame::{Chunk, Finish, Frame, Hello, HelloAck, Op, Reply, Seg};
use morio::proto::limits::{
    ACCESS_KEY_BYTES, HEADER_BYTES, MAX_BODY_BYTES, MAX_CHUNK_BYTES, MAX_KEY_BYTES, MAX_LANES,
    MAX_MSG_BYTES, SAME_HOST_VERSION,
};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::FileFailurePersistence;

/// The settings of every `proptest!` block here: `cases` cases, and failing seeds saved beside
/// the module whose test found them (`tests/proto_props/<module>.proptest-regressions`) and
/// replayed from there.
/// `MORIO_SOAK=k`: k times every property's cases, for a long run by hand.
fn soak() -> u32 {
    std::env::var("MORIO_SOAK")
        .ok()
        .map(|s| s.parse().expect("MORIO_SOAK must be a positive integer"))
        .filter(|&k| k > 0)
        .unwrap_or(1)
}

pub fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::with_cases(cases.saturating_mul(soak()))
    }
}

/// A region's access key in the fixed examples.
pub const KEY: AccessKey = AccessKey::from_bytes([7; ACCESS_KEY_BYTES]);

/// Every code that may end a transfer (what the decoder accepts in a status field).
pub const TERMINAL: [u32; 6] = [0, 11, 12, 13, 14, 15];

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// A string of at most `max` bytes: short arbitrary text, ASCII up to the limit, or 3-byte
/// characters up to the limit.
pub fn text(max: usize) -> BoxedStrategy<String> {
    prop_oneof![
        4 => "\\PC{0,24}".prop_filter("within limit", move |s: &String| s.len() <= max),
        1 => (0..=max).prop_map(|n| "k".repeat(n)),
        1 => (0..=max / 3).prop_map(|n| "€".repeat(n)),
        1 => Just("x".repeat(max)),
    ]
    .boxed()
}

pub fn terminal_code() -> impl Strategy<Value = u32> {
    select(TERMINAL.to_vec())
}

/// 1..=max_segs segments, each non-empty and not overflowing, totalling at most
/// `MAX_CHUNK_BYTES`.
pub fn segs(max_segs: usize) -> impl Strategy<Value = Vec<Seg>> {
    let max_len = MAX_CHUNK_BYTES / max_segs as u64;
    proptest::collection::vec(
        (
            prop_oneof![
                0..1u64 << 20,
                any::<u64>(),
                (u64::MAX - (1 << 20))..=u64::MAX
            ],
            prop_oneof![1..=16u64, 1..=max_len],
        ),
        1..=max_segs,
    )
    .prop_map(|v| {
        v.into_iter()
            .map(|(off, len)| Seg {
                off: off.min(u64::MAX - len),
                len,
            })
            .collect()
    })
}

/// Segment lists made of regular runs (equal lengths at a constant stride, as batches of
/// equal-sized blocks are), sometimes mixed with odd segments: what the run form is for.
pub fn run_segs() -> impl Strategy<Value = Vec<Seg>> {
    proptest::collection::vec(
        (
            0..1u64 << 30,
            prop_oneof![1..=16u64, 1..=4096u64],
            1..=64u64,
            prop_oneof![Just(0u64), 0..=8192u64],
        ),
        1..=6,
    )
    .prop_map(|runs| {
        runs.into_iter()
            .flat_map(|(off, len, count, gap)| {
                (0..count).map(move |i| Seg {
                    off: off + i * (len + gap),
                    len,
                })
            })
            .collect()
    })
}

/// An access key: random bytes mostly, sometimes none (all zeros) or all ones.
pub fn access_key() -> impl Strategy<Value = AccessKey> {
    prop_oneof![
        4 => any::<[u8; ACCESS_KEY_BYTES]>().prop_map(AccessKey::from_bytes),
        1 => Just(AccessKey::NONE),
        1 => Just(AccessKey::from_bytes([0xff; ACCESS_KEY_BYTES])),
    ]
}

pub fn chunk() -> impl Strategy<Value = Chunk> {
    (
        any::<u64>(),
        any::<u64>(),
        (1..=u32::MAX).prop_flat_map(|n| (0..n, Just(n))),
        any::<u32>(),
        access_key(),
        (any::<u64>(), any::<u64>()),
        0..MAX_LANES,
        prop_oneof![3 => segs(8), 1 => segs(300), 2 => run_segs()],
    )
        .prop_map(
            |(tag, uid, (chunk, n_chunks), mem_id, access_key, (a, b), join_lane, segs)| Chunk {
                tag,
                uid,
                chunk,
                n_chunks,
                mem_id,
                access_key,
                extent: (a.min(b), a.max(b)),
                join_lane,
                segs: segs.into(),
            },
        )
}

pub fn reply() -> impl Strategy<Value = Reply> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        terminal_code(),
        text(MAX_MSG_BYTES),
    )
        .prop_map(|(tag, uid, chunk, code, msg)| Reply {
            tag,
            uid,
            chunk,
            code,
            msg,
        })
}

/// A valid frame together with the payload length its sender would declare.
pub fn frame_and_payload() -> impl Strategy<Value = (Frame, u64)> {
    let hello = (
        any::<u32>(),
        any::<u16>(),
        any::<u16>(),
        text(MAX_KEY_BYTES),
        text(MAX_KEY_BYTES),
        any::<u64>(),
        any::<[u8; 16]>(),
        proptest::option::of(any::<[u8; 16]>()),
    )
        .prop_map(
            |(version, lane, n_lanes, src_key, dst_key, instance, nonce, host_tag)| {
                (
                    Frame::Hello(Hello {
                        version,
                        lane,
                        n_lanes,
                        src_key,
                        dst_key,
                        instance,
                        nonce,
                        // Carried from v7 on only.
                        host_tag: host_tag.filter(|_| version >= SAME_HOST_VERSION),
                    }),
                    0,
                )
            },
        );
    let hello_ack = (
        any::<u32>(),
        terminal_code(),
        text(MAX_KEY_BYTES),
        text(MAX_MSG_BYTES),
        any::<[u8; 16]>(),
        proptest::option::of(any::<[u8; 32]>()),
        any::<bool>(),
    )
        .prop_map(|(version, code, key, msg, nonce, proof, same_host)| {
            (
                Frame::HelloAck(HelloAck {
                    version,
                    code,
                    key,
                    msg,
                    nonce,
                    proof,
                    same_host: same_host && version >= SAME_HOST_VERSION,
                }),
                0,
            )
        });
    let auth = any::<[u8; 32]>().prop_map(|p| (Frame::Auth(p), 0));
    // FINAL marks a chunk that is the whole transfer: such chunks have n_chunks == 1.
    let as_final = |mut c: Chunk, final_: bool| {
        if final_ {
            c.chunk = 0;
            c.n_chunks = 1;
        }
        c
    };
    let write = (chunk(), any::<bool>()).prop_map(move |(chunk, final_)| {
        let chunk = as_final(chunk, final_);
        let n = chunk.bytes();
        (Frame::Write { chunk, final_ }, n)
    });
    let read = (chunk(), any::<bool>(), any::<bool>()).prop_map(move |(chunk, final_, dev)| {
        (
            Frame::Read {
                chunk: as_final(chunk, final_),
                final_,
                to_device: dev,
            },
            0,
        )
    });
    let read_data = (
        reply(),
        any::<bool>(),
        prop_oneof![0..=4096u64, 0..=MAX_CHUNK_BYTES, Just(MAX_CHUNK_BYTES)],
    )
        .prop_map(|(reply, final_, n)| {
            let n = if reply.code == SUCCESS { n } else { 0 };
            (Frame::ReadData { reply, final_ }, n)
        });
    let finish = (
        any::<u64>(),
        any::<u64>(),
        select(vec![Op::Read, Op::Write]),
        any::<u32>(),
        any::<u64>(),
        terminal_code(),
        text(MAX_MSG_BYTES),
    )
        .prop_map(|(tag, uid, op, n_chunks, total_bytes, code, msg)| {
            (
                Frame::Finish(Finish {
                    tag,
                    uid,
                    op,
                    n_chunks,
                    total_bytes,
                    code,
                    msg,
                }),
                0,
            )
        });
    let complete = reply().prop_map(|r| (Frame::Complete(r), 0));
    let go_away = (terminal_code(), text(MAX_MSG_BYTES))
        .prop_map(|(code, msg)| (Frame::GoAway { code, msg }, 0));
    prop_oneof![hello, hello_ack, auth, write, read, read_data, finish, complete, go_away]
}

pub fn encoded(frame: &Frame, payload_len: u64) -> Vec<u8> {
    let mut v = Vec::new();
    frame.encode(payload_len, &mut v);
    v
}

/// Invariants that must hold for any input, whatever decode_frame decides.
pub fn check_decode_invariants(buf: &[u8]) -> Result<(), TestCaseError> {
    match decode_frame(buf) {
        Ok(None) => {
            prop_assert!(
                buf.len() < HEADER_BYTES + MAX_BODY_BYTES,
                "Ok(None) with {} bytes buffered",
                buf.len()
            );
            if buf.len() >= HEADER_BYTES {
                let body_len = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
                prop_assert!(buf.len() < HEADER_BYTES + body_len);
            }
        }
        Ok(Some((frame, payload, consumed))) => {
            prop_assert!(consumed <= buf.len());
            prop_assert!(consumed >= HEADER_BYTES);
            prop_assert!(payload <= MAX_CHUNK_BYTES);
            // A decoded frame re-encodes to bytes that decode to the same frame. (Not always
            // to the bytes it came from: segments sent as runs may be cut into runs in more
            // than one way, and the encoder picks one.)
            let again = encoded(&frame, payload);
            let back = decode_frame(&again).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(back, Some((frame, payload, again.len())));
        }
        Err(_) => {}
    }
    Ok(())
}
