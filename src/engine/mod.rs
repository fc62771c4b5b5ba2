//! `IoEngine`: MORI-IO's engine object over morio's thread-per-core TCP data plane. This file
//! holds the object itself (construction, identity, drop); its calls are grouped by concern:
//! [`backend`] (create and remove the TCP backend, statistics), [`memory`] (local and GPU
//! memory), [`remote`] (peers), [`connect`] (a peer's connections opened ahead of its first
//! transfer), [`transfer`] (reads, writes, sessions, statuses) and
//! [`buffer`] ([`RegisteredBuffer`]). The state it shares with its sessions and the
//! submission path live in [`crate::submit`].

mod backend;
mod buffer;
pub(crate) mod connect;
mod memory;
pub(crate) mod remote;
mod transfer;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;

use crate::config::{ConfigError, IoEngineConfig};
use crate::desc::EngineDesc;
use crate::error::EngineError;
use crate::proto::limits::MAX_KEY_BYTES;
use crate::submit::{lock, Core};

pub use buffer::RegisteredBuffer;
pub use connect::LaneTransport;
pub use memory::RegisterOptions;

/// One engine per process endpoint, named by a unique key (MORI-IO's `IOEngine`).
///
/// Create it, add the TCP backend, register memory, exchange [`EngineDesc`] and
/// [`crate::MemoryDesc`] with peers out of band, then read and write their memory. Every
/// transfer call returns at once with a [`crate::TransferStatus`] already `IN_PROGRESS` (or
/// terminal, for argument errors); completion happens on the engine's shards. Dropping the
/// engine (like [`Self::remove_backend`]) fails everything in flight with `ERR_BAD_STATE` and
/// joins every shard thread.
pub struct IoEngine {
    core: Arc<Core>,
}

impl std::fmt::Debug for IoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoEngine")
            .field("key", &self.core.key)
            .finish()
    }
}

impl IoEngine {
    /// A new engine named `key` (1..=1024 bytes) that will listen on `cfg.host:cfg.port`.
    ///
    /// An empty host (MORI-IO's default) or an unspecified one (`0.0.0.0`, `::`) listens on
    /// every interface. Its [`EngineDesc`] cannot advertise that, so it carries this host's
    /// primary address instead: the one its default route leaves from (found without
    /// sending anything). A host without a default route advertises the loopback address,
    /// with a warning, and only engines on this host can reach it; give `cfg.host` to choose.
    /// (MORI-IO advertises the configured string as it is, which peers cannot dial.)
    pub fn new(key: &str, cfg: IoEngineConfig) -> Result<Self, EngineError> {
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return Err(ConfigError::Key.into());
        }
        let ip = match cfg.host.as_str() {
            "" => None,
            h => Some(crate::desc::parse_ip(h).ok_or_else(|| ConfigError::Host(h.to_string()))?),
        };
        let advertise = match ip {
            None => Some(advertised_address(false, key)),
            Some(ip) if ip.is_unspecified() => Some(advertised_address(ip.is_ipv6(), key)),
            // Brackets (`[::1]`) are for addresses with ports: advertise the bare address.
            Some(ip) if cfg.host.starts_with('[') => Some(ip),
            Some(_) => None,
        };
        let explicit = match cfg.advertise_host.as_deref() {
            Some(h) if h.is_empty() || h.len() > MAX_KEY_BYTES => {
                return Err(ConfigError::Host(h.to_string()).into());
            }
            other => other.map(str::to_string),
        };
        let advertise = explicit.or_else(|| advertise.map(|ip| ip.to_string()));
        let core = Core::new(key, cfg);
        if let Some(host) = advertise {
            lock(&core.desc).host = host;
        }
        Ok(Self {
            core: Arc::new(core),
        })
    }

    /// This engine's key.
    pub fn key(&self) -> &str {
        &self.core.key
    }

    /// The engine's descriptor, to hand to peers (fetch it after `create_backend`).
    pub fn engine_desc(&self) -> EngineDesc {
        lock(&self.core.desc).clone()
    }
}

/// The address an engine listening on every interface advertises: the source address of a
/// route to a documentation address (a UDP `connect` chooses it; nothing is sent), else
/// loopback, with a warning.
fn advertised_address(v6: bool, key: &str) -> IpAddr {
    let (any, probe, loopback): (IpAddr, IpAddr, IpAddr) = if v6 {
        (
            Ipv6Addr::UNSPECIFIED.into(),
            Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1).into(),
            Ipv6Addr::LOCALHOST.into(),
        )
    } else {
        (
            Ipv4Addr::UNSPECIFIED.into(),
            Ipv4Addr::new(192, 0, 2, 1).into(),
            Ipv4Addr::LOCALHOST.into(),
        )
    };
    let routed = UdpSocket::bind(SocketAddr::new(any, 0))
        .and_then(|s| {
            s.connect(SocketAddr::new(probe, 9))?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified() && !ip.is_loopback());
    match routed {
        Some(ip) => {
            log::info!(
                "engine {key} listens on every interface and advertises {ip}, this host's \
                 primary address"
            );
            ip
        }
        None => {
            log::warn!(
                "engine {key} listens on every interface, but this host has no default route: \
                 it advertises {loopback}, which only engines on this host can reach (set the \
                 engine's host to an address peers can reach)"
            );
            loopback
        }
    }
}

impl Drop for IoEngine {
    fn drop(&mut self) {
        // Sessions may hold the engine's core; the shards go now regardless. Stopping joins
        // the shard threads (no polling here).
        backend::stop(&self.core);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine listening on every interface never advertises an address no peer can dial.
    #[test]
    fn all_interfaces_advertise_a_dialable_address() {
        for host in ["", "0.0.0.0", "::"] {
            let e = IoEngine::new("adv", IoEngineConfig::new(host, 0)).unwrap();
            let d = e.engine_desc();
            let ip: IpAddr = d.host.parse().unwrap_or_else(|_| panic!("{host:?}: {d:?}"));
            assert!(!ip.is_unspecified(), "{host:?}: {ip}");
            assert_eq!(ip.is_ipv6(), host == "::", "{host:?}: {ip}");
        }
        let e = IoEngine::new("adv", IoEngineConfig::new("127.0.0.2", 0)).unwrap();
        assert_eq!(e.engine_desc().host, "127.0.0.2");
        assert!(IoEngine::new("adv", IoEngineConfig::new("localhost", 0)).is_err());
    }
}
