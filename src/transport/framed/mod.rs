//! Frames over a connection of any transport: a bounded frame reader that places payloads
//! straight into registered memory (`reader.rs`), and a frame writer that batches small
//! frames and sends large payloads straight from it (`writer.rs`); why a connection ended,
//! and the handshake's exact read, here.

use std::io;
use std::time::Duration;

use futures_lite::{AsyncRead, AsyncReadExt};

use super::abort::Aborted;
use crate::proto::decode::DecodeError;
use crate::proto::frame::Frame;
use crate::proto::limits::{HEADER_BYTES, MAX_HANDSHAKE_BODY_BYTES};

mod reader;
mod writer;

pub(crate) use reader::{ascending_disjoint, FrameReader};
pub(crate) use writer::FrameWriter;

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    /// The socket failed or closed.
    #[error("connection lost: {0}")]
    Io(#[from] io::Error),
    /// The peer sent bytes that are not a valid frame.
    #[error("protocol error: {0}")]
    Decode(#[from] DecodeError),
    /// The peer sent a valid frame that makes no sense here.
    #[error("protocol violation: {0}")]
    Violation(String),
    /// A frame began but did not finish within the deadline (`op_timeout`).
    #[error("a begun frame did not complete within {0:?}")]
    Stalled(Duration),
    /// The peer closed the connection.
    #[error("connection closed by peer")]
    Closed,
    /// The initiator reset the connection while a WRITE waited unread at this side (its
    /// bytes had arrived up to this long before): the WRITE is dropped, not placed (its
    /// transfer was reported failed).
    #[error(
        "the initiator reset this lane while its WRITE chunks waited here unread (up to {} \
         ms): they are dropped, not placed (their transfer failed there)",
        .0.as_millis()
    )]
    ResetWhileQueued(Duration),
    /// The payload being read belongs to a transfer cancelled meanwhile: the reader stopped
    /// before its next receive (the rest of the payload is still to be dropped).
    #[error("the transfer was cancelled while its data was being read")]
    Aborted,
}

impl From<Aborted> for ConnError {
    fn from(_: Aborted) -> Self {
        ConnError::Aborted
    }
}

/// Read exactly one frame without payload and without reading past it (handshakes, where
/// the connection may be handed to another shard right after).
pub(crate) async fn read_frame_exact<R: AsyncRead + Unpin>(r: &mut R) -> Result<Frame, ConnError> {
    use crate::proto::decode::{decode_body, decode_header};
    let mut h = [0u8; HEADER_BYTES];
    r.read_exact(&mut h).await.map_err(eof_is_closed)?;
    let header = decode_header(&h)?;
    // Before a peer has proven anything it gets no more than a handshake's worth of memory.
    if header.body_len as usize > MAX_HANDSHAKE_BODY_BYTES {
        return Err(ConnError::Violation(format!(
            "handshake frame body of {} bytes",
            header.body_len
        )));
    }
    let mut body = vec![0u8; header.body_len as usize];
    r.read_exact(&mut body).await.map_err(eof_is_closed)?;
    let frame = decode_body(&header, &body)?;
    if header.payload_len != 0 {
        return Err(ConnError::Violation(
            "handshake frame with a payload".into(),
        ));
    }
    Ok(frame)
}

fn eof_is_closed(e: io::Error) -> ConnError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ConnError::Closed
    } else {
        ConnError::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::ascending_disjoint;
    use super::FrameReader;
    use crate::proto::frame::Frame;
    use std::cell::RefCell;
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::rc::Rc;
    use std::task::{Context, Poll};
    use std::time::Duration;

    /// A stream whose bytes arrive when the test pushes them; a read takes what is there.
    #[derive(Clone, Default)]
    struct Arrivals(Rc<RefCell<Vec<u8>>>);

    impl Arrivals {
        fn push(&self, bytes: &[u8]) {
            self.0.borrow_mut().extend_from_slice(bytes);
        }
    }

    impl futures_lite::AsyncRead for Arrivals {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<io::Result<usize>> {
            let mut q = self.0.borrow_mut();
            if q.is_empty() {
                // The tests poll again themselves once they pushed more.
                return Poll::Pending;
            }
            let n = buf.len().min(q.len());
            buf[..n].copy_from_slice(&q[..n]);
            q.drain(..n);
            Poll::Ready(Ok(n))
        }
    }

    fn goaway(msg_bytes: usize) -> Vec<u8> {
        let mut v = Vec::new();
        let f = Frame::GoAway {
            code: crate::proto::codes::ERR_BAD_STATE,
            msg: "x".repeat(msg_bytes),
        };
        f.encode(0, &mut v);
        v
    }

    fn next(r: &mut FrameReader<Arrivals>) -> Duration {
        let f = futures_lite::future::block_on(r.next_frame()).unwrap();
        assert!(matches!(f, Some((Frame::GoAway { .. }, 0))));
        r.frame_age(std::time::Instant::now())
    }

    const WAIT: Duration = Duration::from_millis(20);

    /// Frames that were queued while the reader did not read (every read took all it asked
    /// for, so the input was never seen empty) read as old as that; once a read leaves the
    /// input empty, what arrives next reads young.
    #[test]
    fn a_frame_is_as_old_as_the_input_was_last_seen_not_empty() {
        let input = Arrivals::default();
        let mut r = FrameReader::new(input.clone(), Duration::from_secs(1));
        r.keep_ages(true);
        std::thread::sleep(WAIT);
        // More than one read window: the first read is full.
        for _ in 0..8 {
            input.push(&goaway(2000));
        }
        for i in 0..8 {
            assert!(next(&mut r) >= WAIT, "frame {i}");
        }
        // The last read was short: the input is empty now, and a frame that comes now is
        // young however long the reader had waited before.
        input.push(&goaway(10));
        assert!(next(&mut r) < WAIT);
    }

    /// Where a read that returns less than it asked for does not mean an empty input (a
    /// same-host connection's reads stop at a record's end), frames stay as old as the last
    /// read that had to wait says.
    #[test]
    fn without_short_drains_only_a_wait_marks_the_input_empty() {
        let input = Arrivals::default();
        let mut r = FrameReader::new(input.clone(), Duration::from_secs(1));
        r.keep_ages(false);
        std::thread::sleep(WAIT);
        input.push(&goaway(10));
        assert!(next(&mut r) >= WAIT);
        input.push(&goaway(10));
        assert!(next(&mut r) >= WAIT, "a short read marked the input empty");
    }

    /// A reader that found its input empty (its read had to wait) knows that what comes
    /// next arrived after that, even when the read that gets it takes all it asked for.
    #[test]
    fn a_read_that_had_to_wait_marks_the_input_empty() {
        let input = Arrivals::default();
        let mut r = FrameReader::new(input.clone(), Duration::from_secs(1));
        r.keep_ages(true);
        std::thread::sleep(WAIT);
        {
            let mut f = std::pin::pin!(r.next_frame());
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(f.as_mut().poll(&mut cx).is_pending());
            // More than a read window: the read is not short.
            input.push(&goaway(10_000));
            assert!(matches!(f.as_mut().poll(&mut cx), Poll::Ready(Ok(Some(_)))));
        }
        assert!(r.frame_age(std::time::Instant::now()) < WAIT);
    }

    /// A frame whose first bytes came with an old frame is as old as those bytes; what came
    /// with the rest of it is younger (the input was seen empty before that read).
    #[test]
    fn a_frame_split_over_reads_keeps_the_age_of_its_first_bytes() {
        let input = Arrivals::default();
        let mut r = FrameReader::new(input.clone(), Duration::from_secs(1));
        r.keep_ages(true);
        std::thread::sleep(WAIT);
        let (a, b, c) = (goaway(10), goaway(100), goaway(10));
        input.push(&a);
        // Part of b's header: the read that finishes it takes a whole window, c with it.
        input.push(&b[..10]);
        assert!(next(&mut r) >= WAIT, "a");
        input.push(&b[10..]);
        input.push(&c);
        assert!(next(&mut r) >= WAIT, "b");
        assert!(next(&mut r) < WAIT, "c");
    }

    #[test]
    fn parts_split_at_any_byte() {
        let (a, b, c) = (&[1u8, 2, 3][..], &[4u8][..], &[5u8, 6][..]);
        let flat = |v: &[&[u8]]| v.concat();
        for n in 0..=7 {
            let (x, y) = super::writer::split_parts(&[a, b, c], n);
            assert_eq!(flat(&x), [1u8, 2, 3, 4, 5, 6][..n.min(6)].to_vec(), "n {n}");
            assert_eq!(flat(&y), [1u8, 2, 3, 4, 5, 6][n.min(6)..].to_vec(), "n {n}");
            assert!(x.iter().chain(&y).all(|p| !p.is_empty()), "n {n}");
        }
    }

    #[test]
    fn ascending_disjoint_ranges() {
        assert!(ascending_disjoint([].into_iter()));
        assert!(ascending_disjoint([(0, 8), (8, 8), (20, 1)].into_iter()));
        assert!(!ascending_disjoint([(0, 8), (7, 8)].into_iter()));
        assert!(!ascending_disjoint([(10, 8), (0, 8)].into_iter()));
        assert!(!ascending_disjoint([(u64::MAX - 1, 8), (5, 1)].into_iter()));
    }
}
