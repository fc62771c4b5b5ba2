//! The target's decisions for each frame a served connection brings: whether a chunk may
//! touch the region, what to record as the inbound status and when, what the join of a
//! multi-chunk transfer says, and which answer leaves. Pure: the caller moves the bytes
//! (placing a WRITE's payload, sending a READ's) between these steps.

use std::sync::Arc;

use super::access::AccessKey;
use super::frame::{Chunk, Finish, Frame, Op, Reply};
use super::inbound::{check_chunk, Refusal, NOT_REGISTERED};
pub use super::join::{JoinReport, JoinTable};
use super::limits::MAX_CHUNKS_PER_TRANSFER;

/// An inbound status to record (before the answer that follows it can leave).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The transfer.
    pub uid: u64,
    /// Its code.
    pub code: u32,
    /// Its message.
    pub msg: String,
}

/// What to do once a frame was handled: record, then send.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response {
    /// The inbound status to record first.
    pub record: Option<Record>,
    /// The answer to send on this connection.
    pub reply: Option<Frame>,
    /// Whether the record came from a join (a multi-chunk transfer completed here).
    pub joined: bool,
}

/// A frame the served connection must not carry: it is closed (with GOAWAY).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Violation(pub String);

/// A connection an initiator opened to this engine, as its HELLO described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// The initiator's key.
    pub peer: Arc<str>,
    /// The initiator's instance.
    pub instance: u64,
    /// This connection's lane.
    pub lane: u16,
    /// Lanes the initiator opens.
    pub n_lanes: u16,
}

fn reply(chunk: &Chunk, code: u32, msg: String) -> Reply {
    Reply {
        tag: chunk.tag,
        uid: chunk.uid,
        chunk: chunk.chunk,
        code,
        msg,
    }
}

impl Served {
    /// A WRITE or READ chunk arrived (header only) for a region of this size and access key
    /// (`None`: not registered here). `Ok(Ok)`: place or send its bytes; `Ok(Err)`: refuse
    /// it (drain a WRITE's payload untouched): a key the region does not grant is refused
    /// like an unknown region ([`check_chunk`]); `Err`: close the connection.
    pub fn check(
        &self,
        chunk: &Chunk,
        final_: bool,
        region: Option<(u64, AccessKey)>,
    ) -> Result<Result<(), Refusal>, Violation> {
        // A chunk of several must name a lane of this peer as its join lane (the initiator's
        // home lane, which also carries FINISH), and chunk 0 must ride it.
        if !final_
            && (chunk.join_lane >= self.n_lanes
                || (chunk.chunk == 0 && chunk.join_lane != self.lane))
        {
            return Err(Violation(format!(
                "chunk {} of transfer {} names join lane {} on lane {} of {}",
                chunk.chunk, chunk.uid, chunk.join_lane, self.lane, self.n_lanes
            )));
        }
        check_count(chunk)?;
        Ok(check_chunk(chunk, region))
    }

    /// A WRITE chunk was placed (or refused) with `code`. A whole transfer records its
    /// inbound status and answers COMPLETE; a chunk of several reports to the join, and only
    /// the chunk that completes it records and answers (for the whole transfer, with its
    /// own tag).
    pub fn write_done(
        &self,
        chunk: &Chunk,
        final_: bool,
        code: u32,
        msg: String,
        joins: &impl JoinTable,
    ) -> Response {
        if final_ {
            return Response {
                record: Some(Record {
                    uid: chunk.uid,
                    code,
                    msg: msg.clone(),
                }),
                reply: Some(Frame::Complete(reply(chunk, code, msg))),
                joined: false,
            };
        }
        self.join(Op::Write, chunk, code, &msg, joins)
    }

    /// The READ_DATA that answers a READ chunk with `code` (its bytes follow when SUCCESS),
    /// and, for a whole transfer, the inbound status to record before its bytes leave: once
    /// the initiator has them all, the target's status exists.
    pub fn read_reply(
        &self,
        chunk: &Chunk,
        final_: bool,
        code: u32,
        msg: String,
    ) -> (Option<Record>, Frame) {
        let record = final_.then(|| Record {
            uid: chunk.uid,
            code,
            msg: msg.clone(),
        });
        let frame = Frame::ReadData {
            reply: reply(chunk, code, msg),
            final_,
        };
        (record, frame)
    }

    /// A READ chunk's READ_DATA left with `code`: a chunk of several reports to the join
    /// (its COMPLETE, if it completed the join, follows on this connection).
    pub fn read_done(
        &self,
        chunk: &Chunk,
        final_: bool,
        code: u32,
        msg: String,
        joins: &impl JoinTable,
    ) -> Response {
        if final_ {
            return Response::default();
        }
        self.join(Op::Read, chunk, code, &msg, joins)
    }

    fn join(
        &self,
        op: Op,
        chunk: &Chunk,
        code: u32,
        msg: &str,
        joins: &impl JoinTable,
    ) -> Response {
        let r = JoinReport {
            peer: &self.peer,
            instance: self.instance,
            uid: chunk.uid,
            op,
            n_chunks: chunk.n_chunks,
            chunk: chunk.chunk,
            code,
            msg,
        };
        let Some((code, msg)) = joins.report(&r) else {
            return Response::default();
        };
        Response {
            record: Some(Record {
                uid: chunk.uid,
                code,
                msg: msg.clone(),
            }),
            reply: Some(Frame::Complete(reply(chunk, code, msg))),
            joined: true,
        }
    }

    /// FINISH: the initiator failed the transfer early; its verdict ends the transfer here
    /// (the first FINISH records it and ends the join) and is answered by COMPLETE. The
    /// caller answers only once every chunk read before it on this connection is placed or
    /// dropped: from protocol version 11 the initiator sends one on each lane that carried
    /// chunks of a failed write, and reports the failure once all are answered.
    pub fn finish(&self, f: Finish, joins: &impl JoinTable) -> Response {
        let first = joins.end(&self.peer, self.instance, f.uid, f.op, f.n_chunks);
        Response {
            record: first.then(|| Record {
                uid: f.uid,
                code: f.code,
                msg: f.msg.clone(),
            }),
            reply: Some(Frame::Complete(Reply {
                tag: f.tag,
                uid: f.uid,
                chunk: 0,
                code: f.code,
                msg: f.msg,
            })),
            joined: false,
        }
    }
}

/// A transfer's chunk count, checked before any join entry can exist for it: at most
/// [`MAX_CHUNKS_PER_TRANSFER`] (morio's initiator refuses a transfer it would cut finer), so
/// a join's bitmap is at most 128 KiB, and the join caps count it by its size. (The extent
/// bounds nothing here: a read may fetch the same remote bytes into many places, so a legal
/// transfer can have more chunks than its extent has bytes.)
fn check_count(chunk: &Chunk) -> Result<(), Violation> {
    if chunk.n_chunks > MAX_CHUNKS_PER_TRANSFER {
        return Err(Violation(format!(
            "transfer {} claims {} chunks (at most {MAX_CHUNKS_PER_TRANSFER})",
            chunk.uid, chunk.n_chunks
        )));
    }
    Ok(())
}

/// What to do with a frame from an initiator, before any payload is read.
#[derive(Debug)]
pub enum Inbound {
    /// A WRITE chunk (its payload follows).
    Write(Chunk, bool),
    /// A READ chunk (final, and whether the initiator places it into GPU memory).
    Read(Chunk, bool, bool),
    /// FINISH.
    Finish(Finish),
}

/// Sort a frame an initiator sent; anything else closes the connection.
pub fn classify(frame: Frame) -> Result<Inbound, Violation> {
    match frame {
        Frame::Write { chunk, final_ } => Ok(Inbound::Write(chunk, final_)),
        Frame::Read {
            chunk,
            final_,
            to_device,
        } => Ok(Inbound::Read(chunk, final_, to_device)),
        Frame::Finish(f) => Ok(Inbound::Finish(f)),
        other => Err(Violation(format!(
            "unexpected {:?} from initiator",
            other.kind()
        ))),
    }
}

/// The code of a refused chunk whose region vanished between check and use (the same as
/// an unknown region's).
pub const GONE: Refusal = NOT_REGISTERED;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::codes;
    use crate::proto::frame::Seg;
    use crate::proto::join::Join;
    use std::cell::RefCell;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Table(RefCell<HashMap<u64, Join>>);

    impl JoinTable for Table {
        fn report(&self, r: &JoinReport<'_>) -> Option<(u32, String)> {
            let mut t = self.0.borrow_mut();
            let j = t
                .entry(r.uid)
                .or_insert_with(|| Join::new(r.op, r.n_chunks, 0));
            j.report(r.op, r.n_chunks, r.chunk, r.code, r.msg)
        }
        fn end(&self, _: &Arc<str>, _: u64, uid: u64, op: Op, n: u32) -> bool {
            self.0
                .borrow_mut()
                .entry(uid)
                .or_insert_with(|| Join::new(op, n, 0))
                .end()
        }
    }

    fn served() -> Served {
        Served {
            peer: "init".into(),
            instance: 1,
            lane: 1,
            n_lanes: 4,
        }
    }

    const KEY: AccessKey = AccessKey::from_bytes([3; 16]);
    const REGION: Option<(u64, AccessKey)> = Some((64, KEY));

    fn chunk(chunk: u32, n_chunks: u32, join_lane: u16) -> Chunk {
        Chunk {
            tag: 10 + chunk as u64,
            uid: 5,
            chunk,
            n_chunks,
            mem_id: 1,
            access_key: KEY,
            extent: (0, 64),
            join_lane,
            segs: vec![Seg {
                off: chunk as u64 * 16,
                len: 16,
            }]
            .into(),
        }
    }

    #[test]
    fn join_lanes_are_checked() {
        let s = served();
        assert!(s.check(&chunk(0, 2, 1), false, REGION).unwrap().is_ok());
        assert!(
            s.check(&chunk(0, 2, 2), false, REGION).is_err(),
            "chunk 0 off its lane"
        );
        assert!(
            s.check(&chunk(1, 2, 4), false, REGION).is_err(),
            "no such lane"
        );
        assert!(s.check(&chunk(1, 2, 3), false, REGION).unwrap().is_ok());
        // A whole transfer names no join lane.
        assert!(s.check(&chunk(0, 1, 0), true, REGION).unwrap().is_ok());
        assert_eq!(
            s.check(&chunk(0, 1, 0), true, None).unwrap(),
            Err(GONE),
            "unregistered region"
        );
        let mut wrong = chunk(0, 1, 0);
        wrong.access_key = AccessKey::from_bytes([4; 16]);
        assert_eq!(
            s.check(&wrong, true, REGION).unwrap(),
            Err(GONE),
            "a wrong key is refused like an unregistered region"
        );
        assert_eq!(
            s.check(&chunk(0, 1, 0), true, Some((64, AccessKey::NONE)))
                .unwrap(),
            Err(GONE),
            "a local-only region is no target"
        );
    }

    #[test]
    fn chunk_counts_are_bounded_by_the_limit() {
        let s = served();
        let with = |n_chunks, extent| Chunk {
            n_chunks,
            extent,
            ..chunk(1, 2, 1)
        };
        // 2^32 - 1 chunks, or one more than the limit: closed.
        for c in [
            with(u32::MAX, (0, 64)),
            with(MAX_CHUNKS_PER_TRANSFER + 1, (0, u64::MAX)),
        ] {
            assert!(s.check(&c, false, Some((u64::MAX, KEY))).is_err(), "{c:?}");
        }
        // Up to the limit passes (then the region decides), whatever the extent: a read of
        // 64 remote bytes into many places has more chunks than bytes.
        let c = with(65, (0, 64));
        assert!(s.check(&c, false, Some((64, KEY))).unwrap().is_ok());
        let most = with(MAX_CHUNKS_PER_TRANSFER, (0, u64::MAX));
        assert!(s.check(&most, false, Some((1 << 40, KEY))).is_ok());
        // 256 MiB in 4 KiB chunks.
        let c = with(65536, (0, 256 << 20));
        assert!(s.check(&c, false, Some((256 << 20, KEY))).unwrap().is_ok());
    }

    #[test]
    fn a_whole_write_records_then_answers() {
        let r = served().write_done(&chunk(0, 1, 0), true, 0, String::new(), &Table::default());
        assert_eq!(r.record.map(|r| r.uid), Some(5));
        assert!(matches!(
            r.reply,
            Some(Frame::Complete(Reply { tag: 10, .. }))
        ));
        assert!(!r.joined);
    }

    #[test]
    fn only_the_chunk_that_completes_the_join_answers() {
        let (s, t) = (served(), Table::default());
        let r = s.write_done(&chunk(1, 2, 1), false, 0, String::new(), &t);
        assert_eq!(r, Response::default());
        let r = s.write_done(&chunk(0, 2, 1), false, codes::ERR_GPU_OP, "x".into(), &t);
        assert!(r.joined);
        assert_eq!(r.record.as_ref().map(|r| r.code), Some(codes::ERR_GPU_OP));
        assert!(matches!(
            r.reply,
            Some(Frame::Complete(Reply { tag: 10, .. }))
        ));
    }

    #[test]
    fn a_whole_read_records_before_its_data_and_a_partial_one_joins_after() {
        let (s, t) = (served(), Table::default());
        let (rec, f) = s.read_reply(&chunk(0, 1, 0), true, 0, String::new());
        assert!(rec.is_some());
        assert!(matches!(f, Frame::ReadData { final_: true, .. }));
        assert_eq!(
            s.read_done(&chunk(0, 1, 0), true, 0, String::new(), &t),
            Response::default()
        );
        let (rec, _) = s.read_reply(&chunk(0, 2, 1), false, 0, String::new());
        assert!(rec.is_none());
        assert_eq!(
            s.read_done(&chunk(0, 2, 1), false, 0, String::new(), &t)
                .reply,
            None
        );
        assert!(
            s.read_done(&chunk(1, 2, 1), false, 0, String::new(), &t)
                .joined
        );
    }

    #[test]
    fn finish_ends_the_join_and_answers() {
        let (s, t) = (served(), Table::default());
        assert_eq!(
            s.write_done(&chunk(0, 3, 1), false, 0, String::new(), &t),
            Response::default()
        );
        let f = Finish {
            tag: 77,
            uid: 5,
            op: Op::Write,
            n_chunks: 3,
            total_bytes: 48,
            code: codes::ERR_GPU_OP,
            msg: "gpu".into(),
        };
        let r = s.finish(f.clone(), &t);
        assert_eq!(r.record.map(|r| r.code), Some(codes::ERR_GPU_OP));
        assert!(matches!(
            r.reply,
            Some(Frame::Complete(Reply { tag: 77, .. }))
        ));
        // The same FINISH on another lane of the transfer is answered, and records nothing.
        let r = s.finish(Finish { tag: 78, ..f }, &t);
        assert_eq!(r.record, None, "recorded once");
        assert!(matches!(
            r.reply,
            Some(Frame::Complete(Reply {
                tag: 78,
                code: codes::ERR_GPU_OP,
                ..
            }))
        ));
        // Later chunks are only counted.
        assert_eq!(
            s.write_done(&chunk(1, 3, 1), false, 0, String::new(), &t),
            Response::default()
        );
        assert_eq!(
            s.write_done(&chunk(2, 3, 1), false, 0, String::new(), &t),
            Response::default()
        );
    }

    #[test]
    fn only_requests_are_served() {
        assert!(classify(Frame::GoAway {
            code: 0,
            msg: String::new()
        })
        .is_err());
    }
}
