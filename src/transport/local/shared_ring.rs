//! A peer's ring shared by the connection's sender (its lane's shard) and application
//! threads that put a small frame straight into it (express writes,
//! [`crate::service::express`]): a lock around the ring's write position, and a gate the
//! sender holds closed while its own stream is under way (one of its frames may span
//! several of its writes, and nothing may land between them).

use std::os::fd::RawFd;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

use super::records::{inline_head, MAX_INLINE};
use super::ring::{ring_doorbell_for, Outbound};

/// The ring and who may write it.
#[derive(Debug)]
pub(crate) struct SharedRing {
    state: Mutex<State>,
    /// The socket that rings the peer's doorbell, owned by the connection's sending half
    /// (not duplicated: a duplicate of a socket keeps it open, and its peer would never see
    /// it closed). Express writes use it only under the lock and while the ring is not
    /// broken, and the sending half breaks the ring before it closes the socket
    /// ([`Self::close_express`] in its drop).
    bell: RawFd,
    /// Where the doorbells express writes ring are counted: the lane's shard's
    /// [`super::ring::express_bells`].
    bells: Arc<AtomicU64>,
}

/// What the lock guards.
#[derive(Debug)]
pub(crate) struct State {
    /// The peer's ring.
    pub(crate) ring: Outbound,
    /// The sender has work under way: its stream may stand in the middle of a frame.
    sender_busy: bool,
    /// A write failed (the peer's index is impossible): nobody writes again.
    broken: bool,
}

/// Why an express write did not go in (the caller sends it the usual way), into a ring
/// or through any other express port ([`crate::transport::express_port`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Declined {
    /// The writer is busy, or another application thread holds the port.
    Busy,
    /// Not enough room (a ring without room for the whole record, a full socket).
    Full,
    /// The port is closed or broken.
    Broken,
}

impl State {
    /// Whether nobody may write again (a write failed, or the ring was closed).
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }
}

impl SharedRing {
    /// Share `ring`, whose doorbell is rung on `bell`, a socket the caller keeps open until
    /// it called [`Self::close_express`].
    /// On the lane's shard: its doorbells are counted there.
    pub(crate) fn new(ring: Outbound, bell: RawFd) -> Self {
        Self {
            state: Mutex::new(State {
                ring,
                sender_busy: false,
                broken: false,
            }),
            bell,
            bells: super::ring::express_bells(),
        }
    }

    /// The sender's access: the lock, waited for (an express write holds it for a copy of
    /// a few hundred bytes).
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sender starts (`true`) or has finished (`false`) a run of work: while it runs, no
    /// express write goes in.
    pub(crate) fn set_sender_busy(&self, busy: bool) {
        self.lock().sender_busy = busy;
    }

    /// An express write: `parts` (one whole record) into the ring, all of it or nothing,
    /// never waiting. Rings the doorbell if the peer waits for one.
    pub(crate) fn put_whole(&self, parts: &[&[u8]]) -> Result<(), Declined> {
        let Ok(mut st) = self.state.try_lock() else {
            return Err(Declined::Busy);
        };
        if st.broken {
            return Err(Declined::Broken);
        }
        if st.sender_busy {
            return Err(Declined::Busy);
        }
        let need: usize = parts.iter().map(|p| p.len()).sum();
        match st.ring.room() {
            Ok(room) if room >= need => {}
            Ok(_) => return Err(Declined::Full),
            Err(_) => {
                st.broken = true;
                return Err(Declined::Broken);
            }
        }
        let (mut idx, mut off) = (0, 0);
        match st.ring.write(parts, &mut idx, &mut off) {
            Ok(n) if n == need => {}
            _ => {
                // Room was checked under the lock and the consumer only frees more: a short
                // write means the peer's index moved impossibly.
                st.broken = true;
                return Err(Declined::Broken);
            }
        }
        // Rung under the lock: the socket is open while the ring is not broken.
        if st.ring.doorbell_wanted() {
            ring_doorbell_for(self.bell, &self.bells);
        }
        drop(st);
        Ok(())
    }

    /// An express write of one whole frame (as one INLINE record): see [`Self::put_whole`].
    pub(crate) fn put_frame(&self, frame: &[u8]) -> Result<(), Declined> {
        if frame.is_empty() || frame.len() > MAX_INLINE {
            return Err(Declined::Full);
        }
        self.put_whole(&[&inline_head(frame.len()), frame])
    }

    /// Mark the ring broken (the sender's write failed).
    pub(crate) fn set_broken(st: &mut State) {
        st.broken = true;
    }

    /// Close the ring to express writes for good (its lane is going away): once this
    /// returns, no express write goes in.
    pub(crate) fn close_express(&self) {
        self.lock().broken = true;
    }
}
