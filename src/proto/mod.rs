//! The morio wire protocol as sans-IO code: frames, their bounded codec, chunk planning, and
//! the owner-side transfer state machine. No sockets, no clock, no logging.
//!
//! Everything here is a pure function or a state machine fed by its caller: the shard service
//! reads bytes from sockets and hands them to [`decode::decode_frame`], turns planned chunks
//! into frames with [`frame::Frame::encode`], and drives [`outbound::Outbound`] with the events
//! its lanes report. Time, when needed, is a parameter. `PROTOCOL.md` is the prose version.
//!
//! Architecture invariant: nothing in this module names `crate::` outside `crate::proto`, and
//! nothing here does I/O or reads a clock (checked by `tests/tidy.rs`).

pub mod codes;
pub mod decode;
pub mod frame;
pub mod inbound;
pub mod join;
pub mod layout;
pub mod limits;
pub mod outbound;
pub mod plan;
