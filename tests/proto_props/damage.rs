//! The decoder against hostile input: random bytes and bodies, valid frames damaged (flipped,
//! cut, lying lengths, spliced) never panic and keep its invariants; bad headers, codes,
//! segment counts, FINAL on part of a transfer and impossible join lanes are refused.

use morio::proto::access::AccessKey;
use morio::proto::codes::{ERR_BAD_STATE, SUCCESS};
use morio::proto::decode::{decode_frame, DecodeError};
use morio::proto::frame::{Chunk, Frame, HelloAck, Seg, FLAG_FINAL, FLAG_TO_DEVICE};
use morio::proto::limits::{
    CHUNK_FIXED_BYTES, FRAME_MAGIC, HEADER_BYTES, MAX_BODY_BYTES, MAX_CHUNK_BYTES, MAX_LANES,
    MAX_SEGS_PER_CHUNK,
};
use proptest::prelude::*;

use crate::strategies::{check_decode_invariants, config, encoded, frame_and_payload, KEY};

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
    #![proptest_config(config(1024))]

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
            segs: vec![Seg { off: 0, len: 8 }].into(),
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
        segs: vec![Seg { off: 0, len: 8 }].into(),
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
            segs: vec![Seg { off: 0, len: 8 }].into(),
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
