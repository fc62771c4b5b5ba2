//! Remote engines on an engine: making a peer reachable by its descriptor, and forgetting it
//! (which closes its connections and fails its transfers).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};

use crate::desc::EngineDesc;
use crate::error::EngineError;
use crate::service::{Peer, ShardMsg};
use crate::submit::{write_lock, Core};

use super::IoEngine;

impl IoEngine {
    /// Make a peer reachable by its descriptor (a later call with the same key replaces it;
    /// open connections to an old address are closed on next use).
    ///
    /// As in MORI-IO, the descriptor of a peer that has no backend yet (port 0) is accepted:
    /// transfers to it fail with an error status naming the cause until its descriptor is
    /// registered again after its `create_backend`. An empty host (an engine listening on
    /// all interfaces) is reached at 127.0.0.1. A host that is a name (an advertised address,
    /// [`crate::IoEngineConfig::advertise_host`]) is resolved here, once: its first IPv4
    /// address, else its first address.
    pub fn register_remote_engine(&self, desc: &EngineDesc) -> Result<(), EngineError> {
        register(&self.core, desc)
    }

    /// Forget a peer and close its connections; its transfers in flight fail.
    pub fn deregister_remote_engine(&self, desc: &EngineDesc) {
        deregister(&self.core, desc)
    }

    /// A handle on the engine's state that does not keep it alive (for a background watcher
    /// that registers and forgets peers while the engine lives).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn weak_core(&self) -> Weak<Core> {
        Arc::downgrade(&self.core)
    }
}

/// [`IoEngine::register_remote_engine`] on the engine's state.
pub(crate) fn register(core: &Core, desc: &EngineDesc) -> Result<(), EngineError> {
    let bad = || EngineError::BadRemoteAddress {
        key: desc.key.clone(),
        host: desc.host.clone(),
        port: desc.port,
    };
    let ip: IpAddr = if desc.host.is_empty() {
        IpAddr::from([127, 0, 0, 1])
    } else if let Some(ip) = crate::desc::parse_ip(&desc.host) {
        ip
    } else {
        resolve(&desc.host).ok_or_else(bad)?
    };
    if desc.key.is_empty() {
        return Err(bad());
    }
    let likely_same_host = !desc.node_id.is_empty()
        && core
            .desc
            .lock()
            .map(|d| d.node_id == desc.node_id)
            .unwrap_or(false);
    let peer = Arc::new(Peer::new(
        desc.key.as_str().into(),
        SocketAddr::new(ip, desc.port),
        likely_same_host,
    ));
    write_lock(&core.remotes).insert(desc.key.clone(), peer);
    Ok(())
}

/// [`IoEngine::deregister_remote_engine`] on the engine's state.
pub(crate) fn deregister(core: &Core, desc: &EngineDesc) {
    if write_lock(&core.remotes).remove(&desc.key).is_some() {
        if let Some(b) = core.backend() {
            for s in 0..b.n_shards() {
                let _ = b.mesh.send(s, ShardMsg::DropPeer(desc.key.as_str().into()));
            }
        }
    }
}

/// The address of host name `name`: its first IPv4 address, else its first address.
fn resolve(name: &str) -> Option<IpAddr> {
    use std::net::ToSocketAddrs;
    let addrs: Vec<IpAddr> = (name, 0).to_socket_addrs().ok()?.map(|a| a.ip()).collect();
    addrs
        .iter()
        .find(|ip| ip.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
}
