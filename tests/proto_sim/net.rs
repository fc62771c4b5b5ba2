//! What TCP carries in the simulation: byte pipes delivered in arbitrary cuts, and the
//! connections they make between an initiator's lane and the target's served end.

use std::fmt;

use morio::proto::decode::{decode_frame, DecodeError};
use morio::proto::frame::{Frame, Hello};
use morio::proto::limits::{HEADER_BYTES, MAX_BODY_BYTES};
use morio::proto::target::Served;

/// One direction of a connection: bytes sent and not yet delivered, then the receiver's
/// buffer and the frame it has decoded while it waits for that frame's payload.
#[derive(Debug, Default)]
pub struct Pipe {
    wire: Vec<u8>,
    delivered: usize,
    rx: Vec<u8>,
    pending: Option<(Frame, usize)>,
}

impl Pipe {
    /// The sender writes `bytes`.
    pub fn put(&mut self, bytes: &[u8]) {
        self.wire.extend_from_slice(bytes);
    }

    /// Encode `frame` with `payload` after it and send both.
    pub fn send(&mut self, frame: &Frame, payload: &[u8]) {
        let mut b = Vec::with_capacity(HEADER_BYTES + 64 + payload.len());
        frame.encode(payload.len() as u64, &mut b);
        b.extend_from_slice(payload);
        self.put(&b);
    }

    /// Bytes sent and not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.wire.len() - self.delivered
    }

    /// Deliver up to `n` bytes to the receiver.
    pub fn deliver(&mut self, n: usize) {
        let n = n.min(self.in_flight());
        let d = self.delivered;
        self.rx.extend_from_slice(&self.wire[d..d + n]);
        self.delivered += n;
        if self.delivered == self.wire.len() {
            self.wire.clear();
            self.delivered = 0;
        }
    }

    /// Keep only the first `keep` of the bytes in flight (the rest never arrive).
    pub fn cut(&mut self, keep: usize) {
        let end = self.delivered + keep.min(self.in_flight());
        self.wire.truncate(end);
    }

    /// Drop everything, in flight and received.
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// The next whole frame and its payload, if the receiver has all of it.
    pub fn poll(&mut self) -> Result<Option<(Frame, Vec<u8>)>, DecodeError> {
        loop {
            if let Some((_, need)) = &self.pending {
                if self.rx.len() < *need {
                    return Ok(None);
                }
                let (frame, need) = self.pending.take().expect("pending frame");
                let payload = self.rx.drain(..need).collect();
                return Ok(Some((frame, payload)));
            }
            match decode_frame(&self.rx)? {
                Some((frame, payload_len, consumed)) => {
                    assert!(consumed >= HEADER_BYTES && consumed <= self.rx.len());
                    self.rx.drain(..consumed);
                    self.pending = Some((frame, payload_len as usize));
                }
                None => {
                    assert!(
                        self.rx.len() < HEADER_BYTES + MAX_BODY_BYTES,
                        "decoder asked for more than a frame"
                    );
                    return Ok(None);
                }
            }
        }
    }

    /// Nothing in flight, nothing received and not handled.
    pub fn idle(&self) -> bool {
        self.in_flight() == 0 && self.rx.is_empty() && self.pending.is_none()
    }
}

/// Why one end closed a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Its decoder refused the bytes.
    Decode(DecodeError),
    /// A frame it must not carry (a state machine's violation, or a kind out of place).
    Violation(String),
    /// The other end said GOAWAY.
    GoAway(String),
    /// The other end closed the connection.
    Eof,
    /// The handshake failed.
    Handshake(String),
    /// The connection was reset under both ends.
    Reset,
    /// A transfer ended while its WRITE was half on the wire (`LaneBook::cancel`).
    MidFrame,
    /// A write failed by its deadline with chunks sent and unanswered on this connection:
    /// reset so that they cannot land later (`Fence::Unplaced`).
    Fenced,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Decode(e) => write!(f, "bad frame: {e}"),
            Self::Violation(v) => write!(f, "protocol violation: {v}"),
            Self::GoAway(m) => write!(f, "peer closed the lane: {m}"),
            Self::Eof => write!(f, "connection closed"),
            Self::Handshake(m) => write!(f, "handshake: {m}"),
            Self::Reset => write!(f, "connection reset"),
            Self::MidFrame => write!(f, "a transfer on this connection ended mid-frame"),
            Self::Fenced => write!(
                f,
                "a write failed by its deadline with bytes on this connection"
            ),
        }
    }
}

/// One TCP connection: an initiator's lane (`up` carries its frames) and the target's
/// served end (`down` carries the answers).
#[derive(Debug)]
pub struct Conn {
    /// The initiator instance that dialed it.
    pub inst: usize,
    /// Its lane.
    pub lane: u16,
    /// Initiator → target.
    pub up: Pipe,
    /// Target → initiator.
    pub down: Pipe,
    /// The target's end, once HELLO was accepted.
    pub served: Option<Served>,
    /// The initiator's end is open (it reads `down`).
    pub init_open: bool,
    /// The target's end is open (it reads `up`).
    pub target_open: bool,
    /// How often it is picked to deliver, relative to other connections.
    pub weight: usize,
    /// Delivers nothing in either direction.
    pub stalled: bool,
    /// `down` delivers only when nothing else can move.
    pub lagging: bool,
    /// Stalls once the initiator has its HELLO_ACK.
    pub stall_when_ready: bool,
    /// Lags once the initiator has its HELLO_ACK.
    pub lag_when_ready: bool,
    /// Bytes that follow the HELLO_ACK on `down` (garbage scenarios; put on the wire once
    /// the initiator has read the HELLO_ACK, which nothing else can have followed yet).
    pub garbage_after_ack: Option<Vec<u8>>,
    /// The HELLO the initiator sent (its HELLO_ACK is checked against it).
    pub hello: Hello,
}

impl Conn {
    /// A connection of instance `inst` on `lane` whose `up` starts with `hello`.
    pub fn new(inst: usize, lane: u16, hello: Hello) -> Self {
        let mut up = Pipe::default();
        up.send(&Frame::Hello(hello.clone()), &[]);
        Self {
            inst,
            lane,
            up,
            down: Pipe::default(),
            served: None,
            init_open: true,
            target_open: true,
            weight: 1,
            stalled: false,
            lagging: false,
            stall_when_ready: false,
            lag_when_ready: false,
            garbage_after_ack: None,
            hello,
        }
    }
}
