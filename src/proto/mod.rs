//! The morio wire protocol as sans-IO code: frames, their bounded codec, chunk planning, and
//! the owner-side transfer state machine. No sockets, no clock, no logging.
//!
//! Everything here is a pure function or a state machine fed by its caller, the same code
//! the shard service runs and `tests/proto_sim/` drives over simulated lanes:
//! - [`handshake`]: HELLO / HELLO_ACK and their checks;
//! - [`access`]: the access keys of registered regions and their constant-time check;
//! - [`dispatch`]: the owner cuts a transfer into chunks on lanes;
//! - [`lane`]: an initiator lane's book of sent frames and the answers they wait for;
//! - [`target`]: the target's decisions per frame (checks, inbound status, join, answer);
//! - [`outbound`]: the owner's state machine of one transfer, fed with lane reports;
//! - [`frame`] / [`decode`] / [`segs`]: the frames and their bounded codec, a chunk's
//!   segments as decoded (one run kept a run); [`plan`] / [`layout`]:
//!   chunk planning; [`join`]: the target's join of one multi-chunk transfer.
//!
//! Time, when needed, is a parameter. `PROTOCOL.md` is the prose version.
//!
//! Architecture invariant: nothing in this module names `crate::` outside `crate::proto`, and
//! nothing here does I/O or reads a clock (checked by `tests/tidy.rs`).

pub mod access;
pub mod codes;
pub mod decode;
pub mod dispatch;
pub mod frame;
pub mod handshake;
pub mod inbound;
pub mod join;
pub mod lane;
pub mod layout;
pub mod limits;
pub mod outbound;
pub mod plan;
pub mod segs;
pub mod target;
