//! Round trips: every valid frame encodes and decodes back (alone, in a stream, with
//! over-long strings cut), its strict prefixes are incomplete, and the chunk body's layout
//! and size limit hold byte for byte.

use morio::proto::access::AccessKey;
use morio::proto::decode::{decode_frame, DecodeError};
use morio::proto::frame::{
    runs, Chunk, Frame, Hello, Kind, Seg, FLAG_FINAL, FLAG_RUNS, FLAG_TO_DEVICE,
};
use morio::proto::limits::{
    CHUNK_FIXED_BYTES, FRAME_MAGIC, HEADER_BYTES, MAX_BODY_BYTES, MAX_KEY_BYTES, MAX_MSG_BYTES,
    MAX_SEGS_PER_CHUNK, RUN_BYTES, SEG_BYTES,
};
use proptest::prelude::*;

use crate::strategies::{config, encoded, frame_and_payload, terminal_code, KEY};

proptest! {
    #![proptest_config(config(512))]

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
            let n_runs = runs(&c.segs.to_vec(), |s| *s).count();
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
        segs: vec![Seg { off: 8, len: 8 }].into(),
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
