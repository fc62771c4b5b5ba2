//! Property tests for the sans-IO protocol (`morio::proto`): frame round trips and strict
//! prefixes, decoder robustness against garbage, transfer planning (`normalize`, `cut`,
//! `stripe_bytes`, ...), target-side `check_chunk`, and the `Outbound` state machine.

use std::collections::HashSet;

use morio::proto::access::AccessKey;
use morio::proto::codes::{ERR_BAD_STATE, ERR_GPU_OP, ERR_INVALID_ARGS, ERR_NOT_FOUND, SUCCESS};
use morio::proto::decode::{decode_frame, DecodeError};
use morio::proto::frame::{
    runs, Chunk, Finish, Frame, Hello, HelloAck, Kind, Op, Reply, Seg, FLAG_FINAL, FLAG_RUNS,
    FLAG_TO_DEVICE,
};
use morio::proto::inbound::{check_chunk, NOT_REGISTERED};
use morio::proto::layout::{layout_chunks, layout_stripe, normalize_layout, Layout};
use morio::proto::limits::{
    ACCESS_KEY_BYTES, CHUNK_FIXED_BYTES, FRAME_MAGIC, HEADER_BYTES, MAX_BODY_BYTES,
    MAX_CHUNK_BYTES, MAX_KEY_BYTES, MAX_LANES, MAX_MSG_BYTES, MAX_SEGS_PER_CHUNK, MIN_STRIPE_BYTES,
    RUN_BYTES, SAME_HOST_VERSION, SEG_BYTES,
};
use morio::proto::outbound::{Action, Outbound, Phase, Violation};
use morio::proto::plan::{
    cut, destination_overlaps, normalize, remote_extent, stripe_bytes, total_bytes, Piece,
    PlanError,
};
use proptest::prelude::*;
use proptest::sample::select;

/// A region's access key in the fixed examples.
const KEY: AccessKey = AccessKey::from_bytes([7; ACCESS_KEY_BYTES]);

/// Every code that may end a transfer (what the decoder accepts in a status field).
const TERMINAL: [u32; 6] = [0, 11, 12, 13, 14, 15];

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// A string of at most `max` bytes: short arbitrary text, ASCII up to the limit, or 3-byte
/// characters up to the limit.
fn text(max: usize) -> BoxedStrategy<String> {
    prop_oneof![
        4 => "\\PC{0,24}".prop_filter("within limit", move |s: &String| s.len() <= max),
        1 => (0..=max).prop_map(|n| "k".repeat(n)),
        1 => (0..=max / 3).prop_map(|n| "€".repeat(n)),
        1 => Just("x".repeat(max)),
    ]
    .boxed()
}

fn terminal_code() -> impl Strategy<Value = u32> {
    select(TERMINAL.to_vec())
}

/// 1..=max_segs segments, each non-empty and not overflowing, totalling at most
/// `MAX_CHUNK_BYTES`.
fn segs(max_segs: usize) -> impl Strategy<Value = Vec<Seg>> {
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
fn run_segs() -> impl Strategy<Value = Vec<Seg>> {
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
fn access_key() -> impl Strategy<Value = AccessKey> {
    prop_oneof![
        4 => any::<[u8; ACCESS_KEY_BYTES]>().prop_map(AccessKey::from_bytes),
        1 => Just(AccessKey::NONE),
        1 => Just(AccessKey::from_bytes([0xff; ACCESS_KEY_BYTES])),
    ]
}

fn chunk() -> impl Strategy<Value = Chunk> {
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
                segs,
            },
        )
}

fn reply() -> impl Strategy<Value = Reply> {
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
fn frame_and_payload() -> impl Strategy<Value = (Frame, u64)> {
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

fn encoded(frame: &Frame, payload_len: u64) -> Vec<u8> {
    let mut v = Vec::new();
    frame.encode(payload_len, &mut v);
    v
}

/// Invariants that must hold for any input, whatever decode_frame decides.
fn check_decode_invariants(buf: &[u8]) -> Result<(), TestCaseError> {
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

// ---------------------------------------------------------------------------------------------
// 1. Round trips
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn frame_round_trip_and_prefixes(
        (frame, payload_len) in frame_and_payload(),
        junk in proptest::collection::vec(any::<u8>(), 0..8),
    ) {
        // Encode after unrelated bytes: encode must only append.
        let mut out = junk.clone();
        frame.encode(payload_len, &mut out);
        prop_assert_eq!(&out[..junk.len()], &junk[..]);
        let bytes = &out[junk.len()..];

        // Header fields.
        prop_assert_eq!(u16::from_le_bytes([bytes[0], bytes[1]]), FRAME_MAGIC);
        prop_assert_eq!(bytes[2], frame.kind() as u8);
        prop_assert_eq!(Kind::from_u8(bytes[2]), Some(frame.kind()));
        let body_len = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
        prop_assert_eq!(body_len + HEADER_BYTES, bytes.len());
        prop_assert!(body_len <= MAX_BODY_BYTES);
        prop_assert_eq!(u64::from_le_bytes(bytes[8..16].try_into().unwrap()), payload_len);
        let final_ = matches!(
            frame,
            Frame::Write { final_: true, .. }
                | Frame::Read { final_: true, .. }
                | Frame::ReadData { final_: true, .. }
        );
        let to_device = matches!(frame, Frame::Read { to_device: true, .. });
        prop_assert_eq!(bytes[3] & FLAG_TO_DEVICE != 0, to_device);
        prop_assert_eq!(
            bytes[3] & !(FLAG_RUNS | FLAG_TO_DEVICE),
            if final_ { FLAG_FINAL } else { 0 }
        );
        // Chunks take the run form exactly when it is the smaller one.
        if let Frame::Write { chunk: c, .. } | Frame::Read { chunk: c, .. } = &frame {
            let n_runs = runs(&c.segs, |s| *s).count();
            let as_runs = n_runs * RUN_BYTES < c.segs.len() * SEG_BYTES;
            prop_assert_eq!(bytes[3] & FLAG_RUNS != 0, as_runs);
        } else {
            prop_assert_eq!(bytes[3] & FLAG_RUNS, 0);
        }

        let (got, got_payload, consumed) = decode_frame(bytes)
            .map_err(|e| TestCaseError::fail(format!("decode error {e}")))?
            .ok_or_else(|| TestCaseError::fail("complete frame decoded to None"))?;
        prop_assert_eq!(&got, &frame);
        prop_assert_eq!(got_payload, payload_len);
        prop_assert_eq!(consumed, bytes.len());

        for n in 0..bytes.len() {
            match decode_frame(&bytes[..n]) {
                Ok(None) => {}
                other => prop_assert!(false, "prefix of {} / {} bytes gave {:?}", n, bytes.len(), other),
            }
        }
    }

    /// Several frames back to back, each followed by its payload, with trailing junk: a reader
    /// that skips payloads gets the same sequence of frames.
    #[test]
    fn frame_stream_round_trip(
        frames in proptest::collection::vec(frame_and_payload(), 1..6),
        tail in proptest::collection::vec(any::<u8>(), 0..8),
    ) {
        // Keep the stream small: materialise payloads of at most 300 bytes.
        let frames: Vec<(Frame, u64)> = frames
            .into_iter()
            .filter(|(_, p)| *p <= 300)
            .collect();
        let mut stream = Vec::new();
        for (i, (f, p)) in frames.iter().enumerate() {
            f.encode(*p, &mut stream);
            stream.extend(std::iter::repeat_n(i as u8, *p as usize));
        }
        stream.extend_from_slice(&tail);
        let mut at = 0;
        for (i, (f, p)) in frames.iter().enumerate() {
            let (got, gp, consumed) = decode_frame(&stream[at..])
                .map_err(|e| TestCaseError::fail(format!("frame {i}: {e}")))?
                .ok_or_else(|| TestCaseError::fail(format!("frame {i}: None")))?;
            prop_assert_eq!(&got, f);
            prop_assert_eq!(gp, *p);
            at += consumed;
            prop_assert!(stream[at..at + gp as usize].iter().all(|&b| b == i as u8));
            at += gp as usize;
        }
        prop_assert_eq!(at, stream.len() - tail.len());
    }

    /// Over-long strings are truncated on a char boundary to their limit, and still decode.
    #[test]
    fn long_strings_truncate(n in 0usize..6000, pad in 0usize..3, code in terminal_code()) {
        let msg = format!("{}{}", "a".repeat(pad), "€".repeat(n));
        let key = format!("{}{}", "b".repeat(pad), "ü".repeat(n));
        let frames = [
            Frame::GoAway { code, msg: msg.clone() },
            Frame::Hello(Hello {
                version: 1,
                lane: 0,
                n_lanes: 1,
                src_key: key.clone(),
                dst_key: key.clone(),
                instance: u64::MAX,
                nonce: [0xA5; 16],
                host_tag: None,
            }),
        ];
        for f in frames {
            let bytes = encoded(&f, 0);
            let (got, _, consumed) = decode_frame(&bytes).unwrap().unwrap();
            prop_assert_eq!(consumed, bytes.len());
            match got {
                Frame::GoAway { msg: m, .. } => {
                    prop_assert!(msg.starts_with(&m));
                    prop_assert!(m.len() <= MAX_MSG_BYTES && m.len() + 3 > MAX_MSG_BYTES.min(msg.len()));
                }
                Frame::Hello(h) => {
                    prop_assert_eq!(&h.src_key, &h.dst_key);
                    prop_assert!(key.starts_with(&h.src_key));
                    prop_assert!(
                        h.src_key.len() <= MAX_KEY_BYTES
                            && h.src_key.len() + 2 > MAX_KEY_BYTES.min(key.len())
                    );
                }
                other => prop_assert!(false, "unexpected {:?}", other),
            }
        }
    }
}

/// The chunk body's fixed part, byte for byte: the access key's 16 bytes follow the region
/// id, as they are (no byte order: a key is opaque bytes).
#[test]
fn the_access_key_follows_the_region_id_in_the_chunk_body() {
    let key = AccessKey::from_bytes(std::array::from_fn(|i| 0xa0 + i as u8));
    let c = Chunk {
        tag: 0x0102_0304_0506_0708,
        uid: 0x1112_1314_1516_1718,
        chunk: 0,
        n_chunks: 1,
        mem_id: 0xaabb_ccdd,
        access_key: key,
        extent: (8, 16),
        join_lane: 0,
        segs: vec![Seg { off: 8, len: 8 }],
    };
    let f = Frame::Read {
        chunk: c,
        final_: true,
        to_device: false,
    };
    let bytes = encoded(&f, 0);
    let body = &bytes[HEADER_BYTES..];
    assert_eq!(body.len(), CHUNK_FIXED_BYTES + SEG_BYTES);
    assert_eq!(CHUNK_FIXED_BYTES, 66);
    assert_eq!(&body[..8], &0x0102_0304_0506_0708u64.to_le_bytes(), "tag");
    assert_eq!(&body[8..16], &0x1112_1314_1516_1718u64.to_le_bytes(), "uid");
    assert_eq!(&body[16..24], &[0, 0, 0, 0, 1, 0, 0, 0], "chunk, n_chunks");
    assert_eq!(&body[24..28], &0xaabb_ccddu32.to_le_bytes(), "mem_id");
    assert_eq!(&body[28..44], key.as_bytes(), "access key");
    assert_eq!(
        &body[44..60],
        &[8, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(&body[60..66], &[0, 0, 1, 0, 0, 0], "join lane, n_segs");
    let (got, _, _) = decode_frame(&bytes).unwrap().unwrap();
    assert_eq!(got, f);
    match got {
        Frame::Read { chunk, .. } => assert_eq!(chunk.access_key.to_bytes(), key.to_bytes()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn chunk_with_most_segments_fits_the_body_limit() {
    // Lengths alternate, so no two neighbours form a run and the list form is the one used.
    let mk = |n: usize| Chunk {
        tag: 1,
        uid: 2,
        chunk: 0,
        n_chunks: 1,
        mem_id: 3,
        access_key: KEY,
        extent: (0, 1 << 40),
        join_lane: 0,
        segs: (0..n as u64)
            .map(|i| Seg {
                off: i * 4,
                len: 1 + i % 2,
            })
            .collect(),
    };
    let c = mk(MAX_SEGS_PER_CHUNK);
    let bytes = encoded(
        &Frame::Write {
            chunk: c.clone(),
            final_: false,
        },
        c.bytes(),
    );
    assert_eq!(bytes.len(), HEADER_BYTES + MAX_BODY_BYTES);
    let (f, p, n) = decode_frame(&bytes).unwrap().unwrap();
    assert_eq!(n, bytes.len());
    assert_eq!(p, c.bytes());
    assert_eq!(
        f,
        Frame::Write {
            chunk: c,
            final_: false
        }
    );

    let c = mk(MAX_SEGS_PER_CHUNK + 1);
    let bytes = encoded(
        &Frame::Read {
            chunk: c,
            final_: false,
            to_device: false,
        },
        0,
    );
    assert!(matches!(
        decode_frame(&bytes),
        Err(DecodeError::BodyTooLarge(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// 2. Garbage
// ---------------------------------------------------------------------------------------------

/// How a valid encoding is damaged.
#[derive(Clone, Debug)]
enum Damage {
    Flip(Vec<(usize, u8)>),
    Truncate(usize),
    BodyLen(u32),
    PayloadLen(u64),
    Splice(usize, Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        proptest::collection::vec((any::<usize>(), 1..=255u8), 1..6).prop_map(Damage::Flip),
        any::<usize>().prop_map(Damage::Truncate),
        prop_oneof![
            any::<u32>(),
            (MAX_BODY_BYTES as u32 + 1)..=u32::MAX,
            0..64u32
        ]
        .prop_map(Damage::BodyLen),
        prop_oneof![any::<u64>(), (MAX_CHUNK_BYTES + 1)..=u64::MAX, 0..64u64]
            .prop_map(Damage::PayloadLen),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..32)
        )
            .prop_map(|(at, b)| Damage::Splice(at, b)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn garbage_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..4096)) {
        check_decode_invariants(&buf)?;
    }

    /// A well-formed header (magic, plausible kind and lengths) over a random body reaches the
    /// body decoder.
    #[test]
    fn random_bodies_never_panic(
        kind in 0u8..=10,
        flags in 0u8..=3,
        body in proptest::collection::vec(any::<u8>(), 0..600),
        body_len_delta in -2i64..=2,
        payload_len in prop_oneof![Just(0u64), 0..=64u64, any::<u64>()],
        extra in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let body_len = (body.len() as i64 + body_len_delta).max(0) as u32;
        let mut buf = Vec::new();
        buf.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
        buf.push(kind);
        buf.push(flags);
        buf.extend_from_slice(&body_len.to_le_bytes());
        buf.extend_from_slice(&payload_len.to_le_bytes());
        buf.extend_from_slice(&body);
        buf.extend_from_slice(&extra);
        check_decode_invariants(&buf)?;
    }

    #[test]
    fn damaged_frames_never_panic((frame, payload_len) in frame_and_payload(), d in damage()) {
        let mut buf = encoded(&frame, payload_len);
        match &d {
            Damage::Flip(flips) => {
                for &(i, x) in flips {
                    let n = buf.len();
                    buf[i % n] ^= x;
                }
            }
            Damage::Truncate(n) => {
                let n = n % buf.len();
                buf.truncate(n);
            }
            Damage::BodyLen(v) => buf[4..8].copy_from_slice(&v.to_le_bytes()),
            Damage::PayloadLen(v) => buf[8..16].copy_from_slice(&v.to_le_bytes()),
            Damage::Splice(at, b) => {
                let at = at % (buf.len() + 1);
                buf.splice(at..at, b.iter().copied());
            }
        }
        check_decode_invariants(&buf)?;
        match d {
            Damage::BodyLen(v) if v as usize > MAX_BODY_BYTES => {
                prop_assert_eq!(decode_frame(&buf), Err(DecodeError::BodyTooLarge(v)));
            }
            Damage::PayloadLen(v) if v > MAX_CHUNK_BYTES => {
                prop_assert_eq!(decode_frame(&buf), Err(DecodeError::PayloadTooLarge(v)));
            }
            Damage::PayloadLen(v) if v != payload_len => {
                // Only READ_DATA with SUCCESS leaves the payload length free.
                let free = matches!(&frame, Frame::ReadData { reply, .. } if reply.code == SUCCESS);
                if free {
                    prop_assert_eq!(decode_frame(&buf).unwrap().unwrap().1, v);
                } else {
                    let is_mismatch = matches!(
                        decode_frame(&buf),
                        Err(DecodeError::PayloadMismatch { .. })
                    );
                    prop_assert!(is_mismatch);
                }
            }
            Damage::Truncate(_) => {
                // A truncated valid frame is only ever incomplete.
                prop_assert_eq!(decode_frame(&buf), Ok(None));
            }
            _ => {}
        }
    }
}

#[test]
fn header_rejections() {
    let ok = encoded(
        &Frame::GoAway {
            code: ERR_BAD_STATE,
            msg: "bye".into(),
        },
        0,
    );
    let mut b = ok.clone();
    b[0] ^= 1;
    assert!(matches!(decode_frame(&b), Err(DecodeError::BadMagic(_))));
    let mut b = ok.clone();
    b[2] = 0;
    assert_eq!(decode_frame(&b), Err(DecodeError::BadKind(0)));
    // Kind 5 was ACK up to protocol v3; v4 has no such frame.
    b[2] = 5;
    assert_eq!(decode_frame(&b), Err(DecodeError::BadKind(5)));
    let mut b = ok.clone();
    b[3] = FLAG_FINAL;
    assert!(matches!(
        decode_frame(&b),
        Err(DecodeError::BadFlags { .. })
    ));
    // FLAG_TO_DEVICE is a READ's alone: on a WRITE it is refused.
    let c = Chunk::new(
        morio::proto::frame::ChunkHead {
            tag: 1,
            uid: 1,
            chunk: 0,
            n_chunks: 1,
            mem_id: 1,
            access_key: AccessKey::NONE,
            extent: (0, 8),
            join_lane: 0,
        },
        vec![Seg { off: 0, len: 8 }],
    );
    let mut w = encoded(
        &Frame::Write {
            chunk: c,
            final_: true,
        },
        8,
    );
    w.extend_from_slice(&[0u8; 8]);
    assert!(decode_frame(&w).is_ok());
    w[3] |= FLAG_TO_DEVICE;
    assert!(matches!(
        decode_frame(&w),
        Err(DecodeError::BadFlags { .. })
    ));
    // A bad header is reported as soon as the header is complete, before the body arrives.
    assert!(matches!(
        decode_frame(&b[..HEADER_BYTES]),
        Err(DecodeError::BadFlags { .. })
    ));
    let mut b = ok.clone();
    b[HEADER_BYTES..HEADER_BYTES + 4].copy_from_slice(&3u32.to_le_bytes());
    assert_eq!(decode_frame(&b), Err(DecodeError::BadCode(3)));
    let mut b = ok.clone();
    b.push(0);
    b[4..8].copy_from_slice(&((ok.len() - HEADER_BYTES + 1) as u32).to_le_bytes());
    assert_eq!(decode_frame(&b), Err(DecodeError::Trailing(1)));
    // A lying segment count cannot make the decoder allocate or read past the body.
    let w = Frame::Write {
        chunk: Chunk {
            tag: 0,
            uid: 0,
            chunk: 0,
            n_chunks: 1,
            mem_id: 0,
            access_key: KEY,
            extent: (0, 8),
            join_lane: 0,
            segs: vec![Seg { off: 0, len: 8 }],
        },
        final_: true,
    };
    let mut b = encoded(&w, 8);
    // n_segs follows tag, uid, chunk, n_chunks, mem_id, the access key, extent and the
    // join lane: it ends the fixed part of the body.
    let n_at = HEADER_BYTES + CHUNK_FIXED_BYTES - 4;
    b[n_at..n_at + 4].copy_from_slice(&(MAX_SEGS_PER_CHUNK as u32).to_le_bytes());
    assert_eq!(decode_frame(&b), Err(DecodeError::Truncated));
    b[n_at..n_at + 4].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(decode_frame(&b), Err(DecodeError::BadSegCount(0)));
}

// ---------------------------------------------------------------------------------------------
// 3. Planning
// ---------------------------------------------------------------------------------------------

/// `(local, remote)` byte pairs of a piece list, in logical stream order.
fn pairs(pieces: &[Piece]) -> Vec<(u64, u64)> {
    pieces
        .iter()
        .flat_map(|p| (0..p.len).map(move |i| (p.local + i, p.remote + i)))
        .collect()
}

fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 0..=80u64, 1 => (u64::MAX - 24)..=u64::MAX]
}

fn region_size() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 0..=64u64, 1 => Just(u64::MAX), 1 => (u64::MAX - 40)..=u64::MAX]
}

/// (local offs, remote offs, sizes, local size, remote size), lists usually of equal length.
type Request = (Vec<u64>, Vec<u64>, Vec<u64>, u64, u64);

/// Arbitrary requests: mostly out of range for small regions, sometimes overflowing.
fn random_request() -> impl Strategy<Value = Request> {
    (
        proptest::collection::vec(
            (offset(), offset(), prop_oneof![Just(0u64), 0..=20u64]),
            0..12,
        ),
        region_size(),
        region_size(),
    )
        .prop_map(|(entries, ls, rs)| {
            let l = entries.iter().map(|e| e.0).collect();
            let r = entries.iter().map(|e| e.1).collect();
            let s = entries.iter().map(|e| e.2).collect();
            (l, r, s, ls, rs)
        })
}

/// Requests whose entries fit both regions (some empty, some continuing the previous one on
/// both sides, some on one side only), in small or huge regions.
fn valid_request() -> impl Strategy<Value = Request> {
    (
        prop_oneof![3 => 1..=64u64, 1 => Just(u64::MAX)],
        prop_oneof![3 => 1..=64u64, 1 => Just(u64::MAX)],
        proptest::collection::vec((any::<u64>(), any::<u64>(), 0..=16u64, 0..4u8), 0..12),
    )
        .prop_map(|(ls, rs, raw)| {
            let (mut l, mut r, mut s) = (Vec::new(), Vec::new(), Vec::new());
            let mut prev: Option<(u64, u64)> = None; // ends of the previous non-empty entry
            for (a, b, len, how) in raw {
                let (mut lo, mut ro) = (a % ls, b % rs);
                match (how, prev) {
                    (1, Some((pl, pr))) => (lo, ro) = (pl, pr),
                    (2, Some((pl, _))) => lo = pl,
                    (3, Some((_, pr))) => ro = pr,
                    _ => {}
                }
                let len = len.min(ls - lo.min(ls)).min(rs - ro.min(rs));
                l.push(lo);
                r.push(ro);
                s.push(len);
                if len > 0 {
                    prev = Some((lo + len, ro + len));
                }
            }
            (l, r, s, ls, rs)
        })
}

/// Random or valid requests, sometimes with list lengths that disagree.
fn request() -> impl Strategy<Value = Request> {
    (
        prop_oneof![random_request(), valid_request()],
        prop_oneof![8 => Just(0u8), 1 => 1..=3u8],
    )
        .prop_map(|((mut l, mut r, mut s, ls, rs), skew)| {
            match skew {
                1 => l.push(0),
                2 => {
                    r.pop();
                }
                3 => s.push(1),
                _ => {}
            }
            (l, r, s, ls, rs)
        })
}

/// Errors `normalize` may legitimately return for one entry, or empty when it is fine.
fn entry_errors(l: u64, r: u64, len: u64, ls: u64, rs: u64) -> Vec<PlanError> {
    if len == 0 {
        return vec![];
    }
    let mut errs = vec![];
    match (l.checked_add(len), r.checked_add(len)) {
        (Some(le), Some(re)) => {
            if le > ls {
                errs.push(PlanError::LocalOutOfRange);
            }
            if re > rs {
                errs.push(PlanError::RemoteOutOfRange);
            }
        }
        (le, re) => {
            errs.push(PlanError::Overflow);
            // An overflowing end is also past any region.
            if le.is_none_or(|e| e > ls) {
                errs.push(PlanError::LocalOutOfRange);
            }
            if re.is_none_or(|e| e > rs) {
                errs.push(PlanError::RemoteOutOfRange);
            }
        }
    }
    errs
}

fn normalized_pieces() -> impl Strategy<Value = Vec<Piece>> {
    valid_request().prop_map(|(l, r, s, ls, rs)| {
        normalize(&l, &r, &s, ls, rs).expect("valid_request builds valid requests")
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn normalize_checks_and_preserves_mapping((l, r, s, ls, rs) in request()) {
        let res = normalize(&l, &r, &s, ls, rs);
        if l.len() != s.len() || r.len() != s.len() {
            prop_assert_eq!(res, Err(PlanError::LengthMismatch));
            return Ok(());
        }
        let first_bad = (0..s.len())
            .map(|i| entry_errors(l[i], r[i], s[i], ls, rs))
            .find(|e| !e.is_empty());
        match (res, first_bad) {
            (Err(e), Some(allowed)) => {
                prop_assert!(allowed.contains(&e), "got {:?}, first bad entry allows {:?}", e, allowed);
            }
            (Err(e), None) => prop_assert!(false, "valid request refused with {:?}", e),
            (Ok(p), Some(allowed)) => {
                prop_assert!(false, "invalid request ({:?}) accepted as {:?}", allowed, p)
            }
            (Ok(pieces), None) => {
                let want: Vec<(u64, u64)> = (0..s.len())
                    .flat_map(|i| {
 let (li, ri) = (l[i], r[i]);
 (0..s[i]).map(move |k| (li + k, ri + k))
 })
                    .collect();
                prop_assert_eq!(pairs(&pieces), want);
                prop_assert!(pieces.iter().all(|p| p.len > 0));
                prop_assert!(pieces.iter().all(|p| p.local + p.len <= ls && p.remote + p.len <= rs));
                prop_assert_eq!(total_bytes(&pieces), s.iter().sum::<u64>());
                // Maximal merging: no piece continues the previous one on both sides.
                for w in pieces.windows(2) {
                    prop_assert!(
                        !(w[0].local + w[0].len == w[1].local && w[0].remote + w[0].len == w[1].remote),
                        "unmerged continuation {:?}", w
                    );
                }
            }
        }
    }

    #[test]
    fn extent_and_overlap_match_bytes(pieces in normalized_pieces()) {
        let pr = pairs(&pieces);
        let ext = remote_extent(&pieces);
        if pr.is_empty() {
            prop_assert_eq!(ext, (0, 0));
        } else {
            let lo = pr.iter().map(|p| p.1).min().unwrap();
            let hi = pr.iter().map(|p| p.1).max().unwrap() + 1;
            prop_assert_eq!(ext, (lo, hi));
        }
        let remote_dup = pr.iter().map(|p| p.1).collect::<HashSet<_>>().len() != pr.len();
        let local_dup = pr.iter().map(|p| p.0).collect::<HashSet<_>>().len() != pr.len();
        prop_assert_eq!(destination_overlaps(&pieces, true), remote_dup);
        prop_assert_eq!(destination_overlaps(&pieces, false), local_dup);
    }

    #[test]
    fn cut_partitions_the_stream(
        pieces in normalized_pieces(),
        chunk_bytes in prop_oneof![1..=8u64, 1..=64u64, Just(u64::MAX)],
    ) {
        let chunks = cut(&pieces, chunk_bytes);
        let total = total_bytes(&pieces);
        prop_assert_eq!(chunks.is_empty(), total == 0);
        let mut flat = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            prop_assert!(!c.is_empty(), "empty chunk {}", i);
            prop_assert!(c.len() <= MAX_SEGS_PER_CHUNK);
            prop_assert!(c.iter().all(|p| p.len > 0), "zero-length piece in chunk {}", i);
            let b = total_bytes(c);
            prop_assert!(b <= chunk_bytes);
            // Greedy: every chunk but the last is full (bytes or pieces).
            if i + 1 < chunks.len() {
                prop_assert!(b == chunk_bytes || c.len() == MAX_SEGS_PER_CHUNK);
            }
            flat.extend(pairs(c));
        }
        prop_assert_eq!(flat, pairs(&pieces));
        if total > 0 {
            prop_assert_eq!(chunks.len() as u64, total.div_ceil(chunk_bytes));
        }
    }

    #[test]
    fn stripe_bytes_bounds(
        total in prop_oneof![0..=(1u64 << 24), any::<u64>()],
        n_lanes in 0..=64u64,
        chunk_bytes in prop_oneof![1..=4096u64, 1..=(1u64 << 30), any::<u64>().prop_map(|v| v.max(1))],
    ) {
        let s = stripe_bytes(total, n_lanes, chunk_bytes);
        prop_assert!((1..=chunk_bytes).contains(&s), "stripe {} cap {}", s, chunk_bytes);
        prop_assert!(s >= MIN_STRIPE_BYTES.min(chunk_bytes));
        // Unless capped, n_lanes stripes cover the transfer.
        prop_assert!(s == chunk_bytes || s >= total.div_ceil(n_lanes.max(1)));
    }
}

#[test]
fn cut_splits_at_the_piece_limit() {
    // Non-mergeable one-byte pieces: only the piece limit cuts.
    let n = 2 * MAX_SEGS_PER_CHUNK + 5;
    let pieces: Vec<Piece> = (0..n as u64)
        .map(|i| Piece {
            local: 2 * i,
            remote: 3 * i,
            len: 1,
        })
        .collect();
    let chunks = cut(&pieces, 1 << 40);
    let sizes: Vec<usize> = chunks.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![MAX_SEGS_PER_CHUNK, MAX_SEGS_PER_CHUNK, 5]);
    assert_eq!(chunks.concat(), pieces);
    // chunk_bytes 0 is treated as 1.
    assert_eq!(cut(&pieces[..3], 0).len(), 3);
}

// ---------------------------------------------------------------------------------------------
// 4. check_chunk
// ---------------------------------------------------------------------------------------------

/// A region size and key, and a chunk carrying that key whose extent lies within the region
/// and whose segments lie within the extent.
fn good_chunk() -> impl Strategy<Value = (u64, AccessKey, Chunk)> {
    prop_oneof![1..=4096u64, 1..=(1u64 << 40), Just(u64::MAX)]
        .prop_flat_map(|size| (Just(size), 0..size))
        .prop_flat_map(|(size, lo)| (Just(size), Just(lo), (lo + 1)..=size))
        .prop_flat_map(|(size, lo, hi)| {
            let seg = (lo..hi).prop_flat_map(move |off| (Just(off), 1..=(hi - off)));
            (
                Just(size),
                Just((lo, hi)),
                proptest::collection::vec(seg, 1..6),
                any::<u32>(),
                access_key().prop_filter("a region's key is never none", |k| !k.is_none()),
            )
        })
        .prop_map(|(size, extent, segs, mem_id, key)| {
            (
                size,
                key,
                Chunk {
                    tag: 1,
                    uid: 2,
                    chunk: 0,
                    n_chunks: 1,
                    mem_id,
                    access_key: key,
                    extent,
                    join_lane: 0,
                    segs: segs
                        .into_iter()
                        .map(|(off, len)| Seg { off, len })
                        .collect(),
                },
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn check_chunk_accepts_contained((size, key, c) in good_chunk()) {
        prop_assert_eq!(check_chunk(&c, Some((size, key))), Ok(()));
        prop_assert_eq!(check_chunk(&c, None), Err(NOT_REGISTERED));
        prop_assert_eq!(NOT_REGISTERED.code, ERR_NOT_FOUND);
    }

    /// A chunk without the region's key is refused exactly like one for an unknown region,
    /// whatever else is wrong with it, and so is any chunk for a local-only region (no key).
    #[test]
    fn check_chunk_refuses_a_wrong_key_like_an_unknown_region(
        (size, key, mut c) in good_chunk(),
        other in access_key(),
        flip in (0..ACCESS_KEY_BYTES, 0..8u32),
        past_end in any::<bool>(),
    ) {
        if past_end {
            // With the right key this would be ERR_INVALID_ARGS: the key is checked first.
            c.extent.1 = c.extent.1.saturating_add(1).max(size.saturating_add(1));
        }
        let mut flipped = key.to_bytes();
        flipped[flip.0] ^= 1 << flip.1;
        for presented in [other, AccessKey::from_bytes(flipped), AccessKey::NONE] {
            if presented == key {
                continue;
            }
            c.access_key = presented;
            prop_assert_eq!(check_chunk(&c, Some((size, key))), Err(NOT_REGISTERED));
        }
        c.access_key = key;
        prop_assert_eq!(check_chunk(&c, Some((size, AccessKey::NONE))), Err(NOT_REGISTERED));
        c.access_key = AccessKey::NONE;
        prop_assert_eq!(check_chunk(&c, Some((size, AccessKey::NONE))), Err(NOT_REGISTERED));
    }

    #[test]
    fn check_chunk_refuses_extent_past_region(
        (size, key, c) in good_chunk(),
        cut_by in 1..=64u64,
    ) {
        // Shrink the region below the extent's end.
        let smaller = c.extent.1.saturating_sub(cut_by);
        let e = check_chunk(&c, Some((smaller, key))).unwrap_err();
        prop_assert_eq!(e.code, ERR_INVALID_ARGS);
        prop_assert!(!e.msg.is_empty());
        prop_assert!(size >= c.extent.1);
        // Unknown region wins over range problems.
        prop_assert_eq!(check_chunk(&c, None).unwrap_err().code, ERR_NOT_FOUND);
    }

    #[test]
    fn check_chunk_refuses_inverted_extent((size, key, mut c) in good_chunk()) {
        c.extent = (c.extent.1, c.extent.0);
        prop_assert_eq!(check_chunk(&c, Some((size, key))).unwrap_err().code, ERR_INVALID_ARGS);
    }

    #[test]
    fn check_chunk_refuses_segment_outside_extent(
        (size, key, mut c) in good_chunk(),
        which in any::<prop::sample::Index>(),
        before in any::<bool>(),
        by in 1..=64u64,
    ) {
        let (lo, hi) = c.extent;
        let i = which.index(c.segs.len());
        let s = &mut c.segs[i];
        if before && lo > 0 {
            // Start below the extent (keep the end inside).
            s.off = lo.saturating_sub(by);
        } else if hi < u64::MAX {
            // End past the extent (keep the segment from overflowing).
            s.len = (hi - s.off).saturating_add(by).min(u64::MAX - s.off);
        } else {
            s.off = lo.saturating_sub(by);
            if s.off == lo {
                return Ok(()); // extent covers all of u64 space from 0: nothing is outside
            }
        }
        prop_assert!(s.off < lo || s.off + s.len > hi);
        let e = check_chunk(&c, Some((size, key))).unwrap_err();
        prop_assert_eq!(e.code, ERR_INVALID_ARGS);
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Outbound
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A joined transfer: chunk results in any order (a write reports only its errors, a
    /// read every chunk), with duplicates and strays, and the target's COMPLETE at any point
    /// among them. A write ends at COMPLETE, a read once COMPLETE and every chunk are in;
    /// the first chunk error wins over COMPLETE's code; nothing is accepted after the end.
    #[test]
    fn outbound_multi_chunk(
        order in (2..40u32).prop_flat_map(|n| Just((0..n).collect::<Vec<u32>>()).prop_shuffle()),
        codes in proptest::collection::vec(prop_oneof![6 => Just(SUCCESS), 1 => select(TERMINAL[1..].to_vec())], 40),
        complete_code in terminal_code(),
        complete_at in any::<prop::sample::Index>(),
        dup_at in any::<prop::sample::Index>(),
        read in any::<bool>(),
    ) {
        let n = order.len() as u32;
        let mut o = Outbound::new(n, 100, read);
        prop_assert_eq!(o.on_chunk(n, SUCCESS, ""), Err(Violation::UnknownChunk(n)));
        // Chunk results reported: all of a read's, only the errors of a write.
        let reported: Vec<u32> = order
            .iter()
            .copied()
            .filter(|&c| read || codes[c as usize] != SUCCESS)
            .collect();
        let at = complete_at.index(reported.len() + 1);
        let mut first_err: Option<(u32, String)> = None;
        let mut ended = None;
        let feed_complete = |o: &mut Outbound, first_err: &Option<(u32, String)>, left: usize| {
            let act = o.on_complete(complete_code, "target").unwrap();
            let want = match first_err {
                Some((c, m)) => Action::Complete { code: *c, msg: m.clone() },
                None => Action::Complete { code: complete_code, msg: "target".into() },
            };
            (act, want, left)
        };
        for (k, &c) in reported.iter().enumerate() {
            if k == at {
                let (act, want, left) = feed_complete(&mut o, &first_err, reported.len() - k);
                if !read {
                    prop_assert_eq!(act, Some(want));
                    ended = Some(k);
                    break;
                }
                prop_assert!(left > 0);
                prop_assert_eq!(act, None, "a read waits for its data");
                prop_assert!(o.on_complete(SUCCESS, "").is_err(), "COMPLETE twice");
            }
            let code = codes[c as usize];
            let msg = format!("chunk {c}");
            if code != SUCCESS && first_err.is_none() {
                first_err = Some((code, msg.clone()));
            }
            let act = o.on_chunk(c, code, &msg).unwrap();
            if act.is_none() && k == dup_at.index(reported.len()) {
                prop_assert_eq!(o.on_chunk(c, SUCCESS, ""), Err(Violation::DuplicateChunk(c)));
            }
            if read && k + 1 == reported.len() && at <= k {
                let (code, msg) = first_err.clone().unwrap_or((complete_code, "target".into()));
                prop_assert_eq!(act, Some(Action::Complete { code, msg }));
                ended = Some(k);
            } else {
                prop_assert_eq!(act, None);
                prop_assert_eq!(o.phase(), Phase::Chunks);
            }
        }
        if ended.is_none() {
            prop_assert_eq!(at, reported.len());
            let (act, want, _) = feed_complete(&mut o, &first_err, 0);
            prop_assert_eq!(act, Some(want));
        }
        prop_assert_eq!(o.phase(), Phase::Done);
        prop_assert_eq!(o.on_tick(1000), None);
        prop_assert_eq!(o.on_lane_lost("late"), None);
        prop_assert!(o.on_complete(SUCCESS, "").is_err());
        prop_assert!(o.on_chunk(order[0], SUCCESS, "").is_err());
    }

    /// A chunk that fails before it leaves: a multi-chunk transfer asks for FINISH once,
    /// keeps taking late chunk results, and ends with the first error at FINISH's COMPLETE.
    #[test]
    fn outbound_local_failure_finishes(
        n in 2..20u32,
        before in 0..20u32,
        read in any::<bool>(),
        code in select(TERMINAL[1..].to_vec()),
    ) {
        let mut o = Outbound::new(n, 100, read);
        let before = before.min(n - 1);
        for c in 0..before {
            prop_assert_eq!(o.on_chunk(c, SUCCESS, "").unwrap(), None);
        }
        prop_assert_eq!(
            o.on_local_failure(code, "local"),
            Some(Action::SendFinish { code, msg: "local".into() })
        );
        prop_assert_eq!(o.phase(), Phase::Finishing);
        prop_assert_eq!(o.on_local_failure(ERR_BAD_STATE, "again"), None);
        if before + 1 < n {
            prop_assert_eq!(o.on_chunk(n - 1, SUCCESS, "").unwrap(), None);
        }
        prop_assert_eq!(
            o.on_complete(code, "local").unwrap(),
            Some(Action::Complete { code, msg: "local".into() })
        );
        prop_assert_eq!(o.phase(), Phase::Done);
    }

    /// Lane loss or the deadline end a transfer with ERR_BAD_STATE from any live phase, once.
    #[test]
    fn outbound_fails_once(
        n in 1..10u32,
        answered in 0..10u32,
        deadline in 1..1000u64,
        by_tick in any::<bool>(),
    ) {
        let mut o = Outbound::new(n, deadline, by_tick);
        prop_assert_eq!(o.deadline(), deadline);
        if n > 1 {
            for c in 0..answered.min(n) {
                let _ = o.on_chunk(c, SUCCESS, "").unwrap();
            }
        }
        prop_assert_eq!(o.on_tick(deadline - 1), None);
        let act = if by_tick { o.on_tick(deadline) } else { o.on_lane_lost("lane lost") };
        let failed = matches!(act, Some(Action::Complete { code: ERR_BAD_STATE, .. }));
 prop_assert!(failed, "{:?}", act);
        prop_assert_eq!(o.phase(), Phase::Done);
        prop_assert_eq!(o.on_lane_lost("again"), None);
        prop_assert_eq!(o.on_tick(u64::MAX), None);
        prop_assert!(o.on_complete(SUCCESS, "").is_err());
        prop_assert!(o.on_chunk(0, SUCCESS, "").is_err());
    }
}

#[test]
fn outbound_single_chunk() {
    for code in TERMINAL {
        let mut o = Outbound::new(1, 10, code % 2 == 0);
        assert_eq!(
            o.on_chunk(0, SUCCESS, ""),
            Err(Violation::WrongPhase(Phase::Chunks))
        );
        assert_eq!(
            o.on_complete(code, "m").unwrap(),
            Some(Action::Complete {
                code,
                msg: "m".into()
            })
        );
        assert_eq!(o.on_lane_lost("x"), None);
    }
    assert_eq!(
        Outbound::new(1, 10, false).on_local_failure(ERR_GPU_OP, "gpu"),
        Some(Action::Complete {
            code: ERR_GPU_OP,
            msg: "gpu".into()
        })
    );
}

/// FINAL is only valid on a chunk that is the whole transfer; HELLO_ACK codes are terminal.
#[test]
fn final_on_partial_chunk_and_odd_hello_ack_code_are_rejected() {
    let chunk = Chunk {
        tag: 1,
        uid: 2,
        chunk: 0,
        n_chunks: 2,
        mem_id: 0,
        access_key: KEY,
        extent: (0, 8),
        join_lane: 0,
        segs: vec![Seg { off: 0, len: 8 }],
    };
    let mut buf = Vec::new();
    Frame::Write {
        chunk,
        final_: true,
    }
    .encode(8, &mut buf);
    assert_eq!(decode_frame(&buf), Err(DecodeError::BadChunk));
    // A join lane no peer can have.
    for (lane, want) in [(MAX_LANES - 1, true), (MAX_LANES, false), (u16::MAX, false)] {
        let c = Chunk {
            tag: 1,
            uid: 2,
            chunk: 1,
            n_chunks: 2,
            mem_id: 0,
            access_key: KEY,
            extent: (0, 8),
            join_lane: lane,
            segs: vec![Seg { off: 0, len: 8 }],
        };
        let mut buf = Vec::new();
        Frame::Write {
            chunk: c,
            final_: false,
        }
        .encode(8, &mut buf);
        let got = decode_frame(&buf);
        assert_eq!(got.is_ok(), want, "join lane {lane}: {got:?}");
        if !want {
            assert_eq!(got, Err(DecodeError::BadChunk));
        }
    }
    let mut buf = Vec::new();
    let ack = HelloAck {
        version: 1,
        code: 3,
        key: "k".into(),
        msg: String::new(),
        nonce: [0; 16],
        proof: None,
        same_host: false,
    };
    Frame::HelloAck(ack).encode(0, &mut buf);
    assert_eq!(decode_frame(&buf), Err(DecodeError::BadCode(3)));
}

#[test]
fn a_strided_batch_is_one_run_on_the_wire() {
    let segs: Vec<Seg> = (0..256u64).map(|i| Seg { off: i * 9, len: 8 }).collect();
    let c = Chunk {
        tag: 1,
        uid: 2,
        chunk: 0,
        n_chunks: 1,
        mem_id: 3,
        access_key: KEY,
        extent: (0, 256 * 9),
        join_lane: 0,
        segs,
    };
    let f = Frame::Write {
        chunk: c,
        final_: true,
    };
    let bytes = encoded(&f, 256 * 8);
    assert_eq!(bytes[3], FLAG_FINAL | FLAG_RUNS);
    assert_eq!(
        bytes.len(),
        HEADER_BYTES + morio::proto::limits::CHUNK_FIXED_BYTES + RUN_BYTES
    );
    let (got, payload, _) = decode_frame(&bytes).unwrap().unwrap();
    assert_eq!(got, f);
    assert_eq!(payload, 256 * 8);
}

/// A run-form chunk body with the given runs (`off`, `len`, `count`, `stride`).
fn run_frame(runs: &[(u64, u64, u32, u64)], payload: u64) -> Vec<u8> {
    let mut body = Vec::new();
    for v in [1u64, 2] {
        body.extend_from_slice(&v.to_le_bytes()); // tag, uid
    }
    for v in [0u32, 1, 3] {
        body.extend_from_slice(&v.to_le_bytes()); // chunk, n_chunks, mem_id
    }
    body.extend_from_slice(KEY.as_bytes()); // access key
    body.extend_from_slice(&0u64.to_le_bytes());
    body.extend_from_slice(&u64::MAX.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes()); // join lane
    body.extend_from_slice(&(runs.len() as u32).to_le_bytes());
    for &(off, len, count, stride) in runs {
        body.extend_from_slice(&off.to_le_bytes());
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(&count.to_le_bytes());
        body.extend_from_slice(&stride.to_le_bytes());
    }
    let mut b = Vec::new();
    b.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
    b.push(Kind::Write as u8);
    b.push(FLAG_RUNS);
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(&payload.to_le_bytes());
    b.extend_from_slice(&body);
    b
}

#[test]
fn hostile_runs_are_refused_before_they_allocate() {
    // A fine one first, so the builder is known to be right.
    assert!(decode_frame(&run_frame(&[(0, 8, 4, 16)], 32))
        .unwrap()
        .is_some());
    // More segments in all than a chunk may have, though each run is small on the wire.
    let many = [(0, 1, u32::MAX, 1), (0, 1, u32::MAX, 1)];
    assert!(matches!(
        decode_frame(&run_frame(&many, 1)),
        Err(DecodeError::BadSegCount(_))
    ));
    let over = [(0, 1, MAX_SEGS_PER_CHUNK as u32 + 1, 1)];
    assert!(matches!(
        decode_frame(&run_frame(&over, MAX_SEGS_PER_CHUNK as u64 + 1)),
        Err(DecodeError::BadSegCount(_))
    ));
    // Zero count, zero length, and a run whose last segment overflows.
    assert_eq!(
        decode_frame(&run_frame(&[(0, 8, 0, 8), (0, 8, 1, 0)], 8)),
        Err(DecodeError::BadSeg)
    );
    assert_eq!(
        decode_frame(&run_frame(&[(0, 0, 2, 8)], 0)),
        Err(DecodeError::BadSeg)
    );
    assert_eq!(
        decode_frame(&run_frame(&[(u64::MAX - 100, 8, 3, 50)], 24)),
        Err(DecodeError::BadSeg)
    );
    assert_eq!(
        decode_frame(&run_frame(&[(0, 8, 3, u64::MAX / 2)], 24)),
        Err(DecodeError::BadSeg)
    );
    // The payload must be what the runs describe.
    assert!(matches!(
        decode_frame(&run_frame(&[(0, 8, 4, 16)], 31)),
        Err(DecodeError::PayloadMismatch { .. })
    ));
    // A count that the body does not hold is truncation.
    let mut b = run_frame(&[(0, 8, 4, 16)], 32);
    // n_segs ends the fixed part of the body (after the access key, extent and join lane).
    let n_at = HEADER_BYTES + CHUNK_FIXED_BYTES - 4;
    b[n_at..n_at + 4].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(decode_frame(&b), Err(DecodeError::Truncated));
}

/// Requests of `n` equal segments at constant strides (what `normalize_layout` keeps
/// strided), sometimes with one entry nudged off the pattern, near region ends or u64::MAX.
fn strided_request() -> impl Strategy<Value = Request> {
    (
        prop_oneof![4 => 0..=4096u64, 1 => (u64::MAX - 4096)..=u64::MAX],
        0..=4096u64,
        prop_oneof![1..=64u64, Just(0u64)],
        0..=128u64,
        0..=128u64,
        1..=300usize,
        prop_oneof![3 => Just(None), 1 => (0..300usize, 1..=3u64).prop_map(Some)],
        prop_oneof![Just(u64::MAX), 0..=1u64 << 16],
    )
        .prop_map(|(l0, r0, len, ls, rs, n, nudge, size)| {
            let mut l: Vec<u64> = (0..n as u64).map(|i| l0.wrapping_add(i * ls)).collect();
            let r: Vec<u64> = (0..n as u64).map(|i| r0.wrapping_add(i * rs)).collect();
            if let Some((i, d)) = nudge {
                if let Some(x) = l.get_mut(i % n) {
                    *x = x.wrapping_add(d);
                }
            }
            (l, r, vec![len; n], size, size)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// The strided fast path is an optimisation only: it accepts and refuses exactly what
    /// `normalize` does, with the same pieces, extent, overlap verdict and chunks.
    #[test]
    fn layouts_agree_with_normalize(
        (l, r, s, ls, rs) in prop_oneof![strided_request(), request()],
        chunk in prop_oneof![1..=64u64, Just(1u64 << 20), 8..=8192u64],
    ) {
        let want = normalize(&l, &r, &s, ls, rs);
        let got = normalize_layout(&l, &r, &s, ls, rs);
        match (got, want) {
            (Ok(layout), Ok(pieces)) => {
                prop_assert_eq!(layout.total_bytes(), total_bytes(&pieces));
                prop_assert_eq!(layout.piece_count(), pieces.len());
                prop_assert_eq!(layout.last(), pieces.last().copied());
                if !pieces.is_empty() {
                    prop_assert_eq!(layout.remote_extent(), remote_extent(&pieces));
                }
                for side in [true, false] {
                    prop_assert_eq!(
                        layout.destination_overlaps(side),
                        destination_overlaps(&pieces, side)
                    );
                }
                let each: Vec<Piece> = layout.iter().collect();
                prop_assert_eq!(&each, &pieces);
                let chunks: Vec<Vec<Piece>> = layout_chunks(layout.clone(), chunk)
                    .into_iter()
                    .map(Layout::into_pieces)
                    .collect();
                prop_assert_eq!(chunks, cut(&pieces, chunk));
                prop_assert_eq!(layout.into_pieces(), pieces);
            }
            (Err(a), Err(b)) => prop_assert_eq!(a, b),
            (a, b) => prop_assert!(false, "layout {:?}, normalize {:?}", a, b),
        }
    }
    /// A strided stripe holds whole pieces whenever a piece fits the share, stays within
    /// the cap and never makes more stripes than lanes when it rounds up; its chunks are then
    /// strided (one run each), and they still cover the transfer exactly as `cut` would.
    #[test]
    fn strided_stripes_hold_whole_pieces(
        (l, r, s, ls, rs) in strided_request(),
        n_lanes in 1..=16u64,
        cap in prop_oneof![Just(1u64 << 20), 1..=(1u64 << 16)],
    ) {
        let Ok(layout) = normalize_layout(&l, &r, &s, ls, rs) else { return Ok(()) };
        let total = layout.total_bytes();
        let plain = stripe_bytes(total, n_lanes, cap);
        let stripe = layout_stripe(&layout, n_lanes, cap);
        prop_assert!((1..=cap).contains(&stripe));
        if let Layout::Strided(st) = &layout {
            let p = st.first.len;
            if p <= plain {
                prop_assert_eq!(stripe % p, 0, "stripe {} piece {}", stripe, p);
                if stripe >= plain {
                    prop_assert!(total.div_ceil(stripe) <= total.div_ceil(plain));
                }
                let chunks = layout_chunks(layout.clone(), stripe);
                prop_assert!(chunks.iter().all(|c| matches!(c, Layout::Strided(_))));
            } else {
                prop_assert_eq!(stripe, plain);
            }
        } else {
            prop_assert_eq!(stripe, plain);
        }
        let pieces = layout.clone().into_pieces();
        let chunks: Vec<Vec<Piece>> = layout_chunks(layout, stripe)
            .into_iter()
            .map(Layout::into_pieces)
            .collect();
        prop_assert_eq!(chunks, cut(&pieces, stripe));
    }
}
