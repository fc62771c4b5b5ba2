//! Opening a peer's connections ahead of its first transfer ([`IoEngine::connect_remote_engine`]):
//! every lane dialed, handshaken (authentication and the same-host step included) and
//! reported, so a first transfer pays no set-up and a peer that cannot be reached or refuses
//! this engine is an error at start-up rather than on a transfer.

use std::time::{Duration, Instant};

use crate::error::EngineError;
use crate::service::ShardMsg;
use crate::status::{StatusCode, TransferStatus};
use crate::submit::{read_lock, Core};

use super::IoEngine;

/// How one connection (lane) to a peer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LaneTransport {
    /// TCP.
    Tcp,
    /// The same-host transport, its records in the socket (a version 8 peer).
    SameHost,
    /// The same-host transport with shared-memory rings.
    SameHostRing,
}

impl LaneTransport {
    /// `"tcp"`, `"same-host"` or `"same-host-ring"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => crate::service::lane_transport::TCP,
            Self::SameHost => crate::service::lane_transport::SAME_HOST,
            Self::SameHostRing => crate::service::lane_transport::SAME_HOST_RING,
        }
    }

    fn from_name(n: &str) -> Option<Self> {
        [Self::Tcp, Self::SameHost, Self::SameHostRing]
            .into_iter()
            .find(|t| t.name() == n)
    }

    /// Whether the lane runs over the same-host transport.
    pub fn is_same_host(self) -> bool {
        self != Self::Tcp
    }
}

impl std::fmt::Display for LaneTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl IoEngine {
    /// Open every connection (lane, `num_data_conns` of them) to the registered peer `key`
    /// now instead of on its first transfers, and wait at most `timeout` until each is up:
    /// dialed, handshaken, authenticated, on the same-host transport where that applies. The
    /// first transfer then pays no set-up, and a peer that cannot be reached or refuses this
    /// engine (another `auth_secret`, no common protocol version) is an error here. Lanes
    /// already up count as they are; a lane that later fails is dialed again by the next
    /// transfer that needs it. Returns each lane's transport, by lane index.
    ///
    /// Errors: [`EngineError::UnknownRemote`], [`EngineError::NoBackend`],
    /// [`EngineError::Connect`] (the first lane that failed, or none up within `timeout`:
    /// lanes still dialing go on in the background, bounded by `op_timeout`).
    pub fn connect_remote_engine(
        &self,
        key: &str,
        timeout: Duration,
    ) -> Result<Vec<LaneTransport>, EngineError> {
        connect(&self.core, key, timeout)
    }
}

/// [`IoEngine::connect_remote_engine`] on the engine's state.
pub(crate) fn connect(
    core: &Core,
    key: &str,
    timeout: Duration,
) -> Result<Vec<LaneTransport>, EngineError> {
    let peer = read_lock(&core.remotes)
        .get(key)
        .cloned()
        .ok_or_else(|| EngineError::UnknownRemote(key.to_string()))?;
    let backend = core.backend().ok_or(EngineError::NoBackend)?;
    let n_shards = backend.n_shards().max(1);
    let n_lanes = backend.shared.cfg.num_data_conns as u16;
    let deadline = Instant::now().checked_add(timeout);
    let mut ready = Vec::with_capacity(n_lanes as usize);
    for lane in 0..n_lanes {
        let st = std::sync::Arc::new(TransferStatus::started());
        let msg = ShardMsg::Connect {
            peer: peer.clone(),
            lane,
            ready: st.clone(),
        };
        if backend.mesh.send(lane as usize % n_shards, msg).is_err() {
            return Err(EngineError::ShuttingDown);
        }
        ready.push(st);
    }
    // The shards answer; holding the backend while waiting would only delay its removal.
    drop(backend);
    let failed = |lane: usize, message: String| EngineError::Connect {
        key: key.to_string(),
        addr: peer.addr.to_string(),
        lane,
        message,
    };
    let mut out = Vec::with_capacity(ready.len());
    for (lane, st) in ready.iter().enumerate() {
        let code = match deadline {
            Some(d) => st.wait_for(d.saturating_duration_since(Instant::now())),
            None => st.wait(),
        };
        match code {
            StatusCode::Success => {
                let m = st.message();
                out.push(LaneTransport::from_name(&m).unwrap_or(LaneTransport::Tcp));
            }
            StatusCode::InProgress => {
                return Err(failed(lane, format!("not connected within {timeout:?}")))
            }
            _ => return Err(failed(lane, st.message())),
        }
    }
    Ok(out)
}
