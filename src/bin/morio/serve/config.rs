//! `morio serve`'s TOML configuration, with the commented defaults `--dump-config` prints.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::bench::argv::parse_size;

/// The commented default configuration (every value shown is the default).
pub const DEFAULT_TOML: &str = r#"# morio serve configuration. Every value shown is the default.

[engine]
# Engine key peers address this node by; unique among engines.
key = "morio-serve"
# Numeric IP (IPv4, or IPv6 such as "::1") the data plane listens on and advertises.
host = "127.0.0.1"
# Data port (0: ephemeral; the control service reports the one bound).
port = 0
# What descriptors tell peers to dial, when it is not `host` (behind NAT, in a pod): a
# numeric address or a name peers resolve.
# advertise_host = "node-7.example"

[tcp]
# Lanes (TCP connections) per peer, 1..=16.
num_data_conns = 8
# Transfers of at least this many bytes are striped over all lanes.
striping_threshold_bytes = 65536
# Deadline of every transfer, in milliseconds.
op_timeout_ms = 30000
# Largest chunk one frame carries.
chunk_bytes = "1MiB"
# Largest chunk one frame carries to a same-host peer.
same_host_chunk_bytes = "8MiB"
# Largest chunk one frame carries over TCP with GPU memory on either side.
gpu_chunk_bytes = "2MiB"
# Lanes a large transfer staged through GPU memory over TCP stripes over, 1..=16 (never
# fewer than num_data_conns); leave out for twice num_data_conns, at most 16.
# gpu_data_conns = 12
# Shard count; leave out for one per allowed CPU (at most num_data_conns).
# shards = 8
# Explicit shard CPUs, e.g. from `morio topology` (overrides shards).
# cpus = [2, 3, 4, 5]
# Pin shards to CPUs.
pin_shards = true
# Spin this many microseconds before sleeping (lower latency, burns the core).
spin_us = 0
# Poll sockets and rings this many microseconds after the last work, stopping while
# preempted (leave out: 100 on hosts of 8 CPUs or more; 0: off).
# busy_poll_us = 100
# What peers may make this node hold (every peer / one peer, by engine key): connections
# still in their handshake, served connections, join slots of striped transfers, inbound
# statuses not yet popped.
# max_handshakes = 128
# max_connections = 1024
# max_connections_per_peer = 64
# max_joins = 65536
# max_joins_per_peer = 4096
# max_inbound_statuses = 65536
# max_inbound_statuses_per_peer = 4096
# The same-host transport to engines of this host: "auto" (when the handshake proves the
# peer runs here and may be read: payloads copied once, process to process), "off" (TCP
# only) or "require" (fail rather than fall back). Default: MORIO_SAME_HOST, else auto.
# same_host = "auto"
# GPU memory between engines of this host moves device to device (CUDA/HIP IPC handles);
# false stages it through host memory as over TCP. Default: MORIO_GPU_IPC, else true.
# gpu_ipc = true
# Shared-memory ring offered to each same-host connection for small frames (a power of two
# from 64KiB to 16MiB). Default: MORIO_SAME_HOST_RING_BYTES, else 1MiB.
# same_host_ring_bytes = "1MiB"
# The newest protocol version this node offers. For rolling upgrades: keep the fleet on the
# version its oldest node speaks until every node runs the new build, then raise it.
# max_protocol_version = 10

[auth]
# A file holding the deployment secret (at least 16 bytes; a trailing newline is ignored)
# that every engine allowed to reach this node shares. Without it (and without the
# MORIO_AUTH_SECRET environment variable), any peer that reaches the data port can read and
# write this node's memory, and anyone who reaches the control port gets its descriptors.
# secret_file = "/etc/morio/secret"

[control]
# The HTTP control service (host:port, IPv6 in brackets: "[::1]:7070"; port 0: ephemeral):
# GET /descriptors and /stats (with a deployment secret, only with a Morio-HMAC proof),
# /metrics (Prometheus) and /healthz (open), /nonce.
listen = "127.0.0.1:7070"
# Whether the open /metrics carries the per-peer series (morio_peer_*, labelled with the
# peers' engine keys). Default: only without a deployment secret; set it true where only a
# trusted network reaches this port.
# peer_metrics = true

[discovery]
# etcd endpoints (host:port) to publish this node in (a build with the `etcd` feature; none:
# no discovery). Its descriptor goes to {prefix}/engines/{key} and each region's to
# {prefix}/regions/{key}/{name}, on a lease that ends with the node; every engine published
# under the prefix is registered as a peer (and forgotten when its lease ends).
etcd = []
prefix = "/morio"
# Seconds a node that died stays published.
lease_ttl_s = 10
# Open every connection to each engine found there as soon as it appears (its first
# transfer then pays no set-up, and one that cannot be reached or refuses this node is
# logged at once); off, connections open on first use.
connect_peers = false
# etcd with authentication on: the user to authenticate as (its role must read and write
# keys under the prefix) and a file holding its password (never the password itself here; a
# trailing newline is ignored).
# user = "morio"
# password_file = "/etc/morio/etcd-password"
# etcd serving TLS (its --cert-file): the PEM file of the CA that signed its certificate
# (endpoints are then host:port or https:// URLs, and the certificate must name the host
# dialed) and, where etcd asks clients for one (--client-cert-auth), this node's
# certificate and key.
# ca_file = "/etc/morio/etcd-ca.pem"
# cert_file = "/etc/morio/etcd-client.pem"
# key_file = "/etc/morio/etcd-client-key.pem"

[stats]
# Print a stats line every this many seconds (0: never).
interval_s = 10

# Memory regions to register, each handed out by name. Host memory by default; `gpu = N`
# allocates the region on GPU N instead (a build with the `cuda` or `hip` feature).
[[memory]]
name = "kv"
size = "1GiB"
# gpu = 0
"#;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    pub engine: EngineSection,
    #[serde(default)]
    pub tcp: TcpSection,
    #[serde(default)]
    pub auth: AuthSection,
    pub control: ControlSection,
    #[serde(default)]
    pub stats: StatsSection,
    #[serde(default)]
    pub discovery: DiscoverySection,
    #[serde(default)]
    pub memory: Vec<MemorySection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSection {
    pub key: String,
    pub host: String,
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub advertise_host: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcpSection {
    pub num_data_conns: usize,
    pub striping_threshold_bytes: usize,
    pub op_timeout_ms: u64,
    pub chunk_bytes: Size,
    pub same_host_chunk_bytes: Size,
    pub gpu_chunk_bytes: Size,
    pub gpu_data_conns: Option<usize>,
    pub shards: Option<usize>,
    pub cpus: Option<Vec<usize>>,
    pub pin_shards: bool,
    pub spin_us: u64,
    pub busy_poll_us: Option<u64>,
    pub max_handshakes: Option<usize>,
    pub max_connections: Option<usize>,
    pub max_connections_per_peer: Option<usize>,
    pub max_joins: Option<usize>,
    pub max_joins_per_peer: Option<usize>,
    pub max_inbound_statuses: Option<usize>,
    pub max_inbound_statuses_per_peer: Option<usize>,
    pub same_host: Option<morio::SameHost>,
    pub gpu_ipc: Option<bool>,
    pub same_host_ring_bytes: Option<Size>,
    pub max_protocol_version: Option<u32>,
}

impl Default for TcpSection {
    fn default() -> Self {
        let d = morio::TcpBackendConfig::default();
        Self {
            num_data_conns: d.num_data_conns,
            striping_threshold_bytes: d.striping_threshold_bytes,
            op_timeout_ms: d.op_timeout.as_millis() as u64,
            chunk_bytes: Size(d.chunk_bytes),
            same_host_chunk_bytes: Size(d.same_host_chunk_bytes),
            gpu_chunk_bytes: Size(d.gpu_chunk_bytes),
            gpu_data_conns: d.gpu_data_conns,
            shards: None,
            cpus: None,
            pin_shards: true,
            spin_us: 0,
            busy_poll_us: None,
            max_handshakes: None,
            max_connections: None,
            max_connections_per_peer: None,
            max_joins: None,
            max_joins_per_peer: None,
            max_inbound_statuses: None,
            max_inbound_statuses_per_peer: None,
            same_host: None,
            gpu_ipc: None,
            same_host_ring_bytes: None,
            max_protocol_version: None,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    pub secret_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlSection {
    pub listen: String,
    /// Whether the open `/metrics` carries the per-peer families (default: only without a
    /// secret).
    #[serde(default)]
    pub peer_metrics: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatsSection {
    pub interval_s: u64,
}

impl Default for StatsSection {
    fn default() -> Self {
        Self { interval_s: 10 }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoverySection {
    pub etcd: Vec<String>,
    pub prefix: String,
    pub lease_ttl_s: u64,
    pub connect_peers: bool,
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl Default for DiscoverySection {
    fn default() -> Self {
        Self {
            etcd: Vec::new(),
            prefix: "/morio".into(),
            lease_ttl_s: 10,
            connect_peers: false,
            user: None,
            password_file: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
        }
    }
}

impl DiscoverySection {
    /// Check the user and TLS settings: a user comes with a password_file and the other way
    /// round, a client certificate with its key and a CA, and every file named exists.
    fn check_etcd_access(&self) -> anyhow::Result<()> {
        match (&self.user, &self.password_file) {
            (Some(u), _) if u.is_empty() => bail!("[discovery] user must not be empty"),
            (Some(_), None) => bail!(
                "[discovery] user needs password_file (a file holding the password; never \
                 the password itself)"
            ),
            (None, Some(_)) => bail!("[discovery] password_file needs user"),
            _ => {}
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            bail!("[discovery] cert_file and key_file go together (the client certificate and its key)");
        }
        if self.cert_file.is_some() && self.ca_file.is_none() {
            bail!("[discovery] cert_file needs ca_file (the CA of etcd's certificate)");
        }
        for (what, path) in [
            ("password_file", &self.password_file),
            ("ca_file", &self.ca_file),
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
        ] {
            if let Some(p) = path {
                std::fs::File::open(p)
                    .with_context(|| format!("[discovery] {what} {}", p.display()))?;
            }
        }
        Ok(())
    }

    /// The etcd user and its password (read from password_file now).
    #[cfg(feature = "etcd")]
    pub fn etcd_auth(&self) -> anyhow::Result<Option<morio::discovery::EtcdAuth>> {
        match (&self.user, &self.password_file) {
            (Some(user), Some(file)) => Ok(Some(
                morio::discovery::EtcdAuth::from_password_file(user, file)
                    .context("[discovery]")?,
            )),
            _ => Ok(None),
        }
    }

    /// TLS to etcd, where `ca_file` is set (the files are read at connect).
    #[cfg(feature = "etcd")]
    pub fn etcd_tls(&self) -> Option<morio::discovery::EtcdTls> {
        let ca = self.ca_file.as_ref()?;
        let mut t = morio::discovery::EtcdTls::new(ca);
        t.cert_file.clone_from(&self.cert_file);
        t.key_file.clone_from(&self.key_file);
        Some(t)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySection {
    pub name: String,
    pub size: Size,
    /// GPU ordinal for device memory; host memory when absent.
    #[serde(default)]
    pub gpu: Option<i32>,
}

/// A byte size written as a number or a string with a unit ("1GiB").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub usize);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => usize::try_from(n)
                .map(Size)
                .map_err(serde::de::Error::custom),
            Raw::S(s) => parse_size(&s).map(Size).map_err(serde::de::Error::custom),
        }
    }
}

impl ServeConfig {
    /// Parse and check a configuration text.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let c: Self = toml::from_str(text).context("invalid morio serve configuration")?;
        let mut names = std::collections::HashSet::new();
        for m in &c.memory {
            if m.size.0 == 0 {
                bail!("memory {:?}: size must be positive", m.name);
            }
            if !names.insert(m.name.as_str()) {
                bail!("memory {:?} is listed twice", m.name);
            }
        }
        c.tcp_config().validate().context("invalid [tcp] section")?;
        c.auth_secret()?;
        let d = &c.discovery;
        if !d.etcd.is_empty() {
            if !cfg!(feature = "etcd") {
                bail!("[discovery] etcd: this morio was built without the `etcd` feature");
            }
            if d.lease_ttl_s == 0 {
                bail!("[discovery] lease_ttl_s must be positive");
            }
            if !d.prefix.starts_with('/') {
                bail!("[discovery] prefix {:?} must start with '/'", d.prefix);
            }
            d.check_etcd_access()?;
            #[cfg(feature = "etcd")]
            d.etcd_auth()?;
        }
        Ok(c)
    }

    /// The deployment secret from `[auth] secret_file`, if one is named (checked: readable,
    /// long enough).
    pub fn auth_secret(&self) -> anyhow::Result<Option<morio::AuthSecret>> {
        let Some(path) = &self.auth.secret_file else {
            return Ok(None);
        };
        let s = morio::AuthSecret::from_file(path)
            .with_context(|| format!("[auth] secret_file {}", path.display()))?;
        let check = morio::TcpBackendConfig {
            auth_secret: Some(s.clone()),
            ..Default::default()
        };
        check
            .validate()
            .with_context(|| format!("[auth] secret_file {}", path.display()))?;
        Ok(Some(s))
    }

    /// The engine's TCP backend configuration.
    pub fn tcp_config(&self) -> morio::TcpBackendConfig {
        let t = &self.tcp;
        let d = morio::TcpBackendConfig::default();
        morio::TcpBackendConfig {
            max_handshakes: t.max_handshakes.unwrap_or(d.max_handshakes),
            max_connections: t.max_connections.unwrap_or(d.max_connections),
            max_connections_per_peer: t
                .max_connections_per_peer
                .unwrap_or(d.max_connections_per_peer),
            max_joins: t.max_joins.unwrap_or(d.max_joins),
            max_joins_per_peer: t.max_joins_per_peer.unwrap_or(d.max_joins_per_peer),
            max_inbound_statuses: t.max_inbound_statuses.unwrap_or(d.max_inbound_statuses),
            max_inbound_statuses_per_peer: t
                .max_inbound_statuses_per_peer
                .unwrap_or(d.max_inbound_statuses_per_peer),
            same_host: t.same_host,
            gpu_ipc: t.gpu_ipc,
            same_host_ring_bytes: t.same_host_ring_bytes.map(|s| s.0),
            max_protocol_version: t.max_protocol_version.unwrap_or(d.max_protocol_version),
            num_data_conns: t.num_data_conns,
            striping_threshold_bytes: t.striping_threshold_bytes,
            op_timeout: Duration::from_millis(t.op_timeout_ms),
            chunk_bytes: t.chunk_bytes.0,
            same_host_chunk_bytes: t.same_host_chunk_bytes.0,
            gpu_chunk_bytes: t.gpu_chunk_bytes.0,
            gpu_data_conns: t.gpu_data_conns,
            // Unpinned, `cpus` only counts shards (the engine would pin to explicit CPUs).
            num_shards: t
                .shards
                .or_else(|| t.cpus.as_ref().filter(|_| !t.pin_shards).map(Vec::len)),
            cpus: t.cpus.clone().filter(|_| t.pin_shards),
            pin_shards: t.pin_shards,
            spin_before_park: (t.spin_us > 0).then(|| Duration::from_micros(t.spin_us)),
            busy_poll: t.busy_poll_us.map(Duration::from_micros),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_match_the_engine() {
        let c = ServeConfig::parse(DEFAULT_TOML).unwrap();
        assert_eq!(c.engine.key, "morio-serve");
        assert_eq!(c.memory.len(), 1);
        assert_eq!(c.memory[0].size, Size(1 << 30));
        assert_eq!(c.memory[0].gpu, None);
        assert_eq!(c.engine.advertise_host, None);
        let adv = DEFAULT_TOML.replace(
            "# advertise_host = \"node-7.example\"",
            "advertise_host = \"10.1.2.3\"",
        );
        let adv = ServeConfig::parse(&adv).unwrap();
        assert_eq!(adv.engine.advertise_host.as_deref(), Some("10.1.2.3"));
        let g = ServeConfig::parse(&DEFAULT_TOML.replace("# gpu = 0", "gpu = 1")).unwrap();
        assert_eq!(g.memory[0].gpu, Some(1));
        assert_eq!(c.control.peer_metrics, None);
        let pm = DEFAULT_TOML.replace("# peer_metrics = true", "peer_metrics = true");
        let pm = ServeConfig::parse(&pm).unwrap();
        assert_eq!(pm.control.peer_metrics, Some(true));
        let t = c.tcp_config();
        let d = morio::TcpBackendConfig::default();
        assert_eq!(
            (t.num_data_conns, t.chunk_bytes, t.op_timeout),
            (d.num_data_conns, d.chunk_bytes, d.op_timeout)
        );
        assert_eq!(
            (t.max_connections, t.max_joins_per_peer),
            (d.max_connections, d.max_joins_per_peer)
        );
        let capped = DEFAULT_TOML
            .replace("# max_connections = 1024", "max_connections = 7")
            .replace("# max_joins_per_peer = 4096", "max_joins_per_peer = 9");
        let t = ServeConfig::parse(&capped).unwrap().tcp_config();
        assert_eq!((t.max_connections, t.max_joins_per_peer), (7, 9));
        assert_eq!(
            (
                c.tcp_config().same_host,
                c.tcp_config().max_protocol_version
            ),
            (None, morio::proto::limits::VERSION)
        );
        assert_eq!(c.tcp_config().gpu_ipc, None);
        assert_eq!(c.tcp_config().same_host_ring_bytes, None);
        assert_eq!(
            c.tcp_config().busy_poll,
            None,
            "busy polling: the engine's default"
        );
        assert_eq!(c.tcp_config().same_host_chunk_bytes, 8 << 20);
        assert_eq!(c.tcp_config().gpu_chunk_bytes, 2 << 20);
        let busy = DEFAULT_TOML.replace("# busy_poll_us = 100", "busy_poll_us = 0");
        assert_eq!(
            ServeConfig::parse(&busy).unwrap().tcp_config().busy_poll,
            Some(Duration::ZERO)
        );
        let rings = DEFAULT_TOML.replace(
            "# same_host_ring_bytes = \"1MiB\"",
            "same_host_ring_bytes = \"256KiB\"",
        );
        assert_eq!(
            ServeConfig::parse(&rings)
                .unwrap()
                .tcp_config()
                .same_host_ring_bytes,
            Some(256 << 10)
        );
        let off = DEFAULT_TOML.replace("# gpu_ipc = true", "gpu_ipc = false");
        assert_eq!(
            ServeConfig::parse(&off).unwrap().tcp_config().gpu_ipc,
            Some(false)
        );
        let sh = DEFAULT_TOML
            .replace("# same_host = \"auto\"", "same_host = \"off\"")
            .replace("# max_protocol_version = 10", "max_protocol_version = 6");
        let t = ServeConfig::parse(&sh).unwrap().tcp_config();
        assert_eq!(
            (t.same_host, t.max_protocol_version),
            (Some(morio::SameHost::Off), 6)
        );
        for bad in [
            DEFAULT_TOML.replace("# same_host = \"auto\"", "same_host = \"sideways\""),
            DEFAULT_TOML.replace("# max_protocol_version = 10", "max_protocol_version = 99"),
        ] {
            assert!(ServeConfig::parse(&bad).is_err());
        }
        let zero = DEFAULT_TOML.replace("# max_connections = 1024", "max_connections = 0");
        assert!(ServeConfig::parse(&zero).is_err());
    }

    #[test]
    fn serve_pins_by_default_and_unpinned_cpus_only_count_shards() {
        let c = ServeConfig::parse(DEFAULT_TOML).unwrap().tcp_config();
        assert!(c.pin_shards && c.cpus.is_none() && c.num_shards.is_none());
        let cpus = DEFAULT_TOML.replace("# cpus = [2, 3, 4, 5]", "cpus = [2, 3]");
        let c = ServeConfig::parse(&cpus).unwrap().tcp_config();
        assert_eq!((c.cpus, c.num_shards), (Some(vec![2, 3]), None));
        // Unpinned as before: two floating shards (explicit CPUs would pin them).
        let floating = cpus.replace("pin_shards = true", "pin_shards = false");
        let c = ServeConfig::parse(&floating).unwrap().tcp_config();
        assert_eq!((c.pin_shards, c.cpus, c.num_shards), (false, None, Some(2)));
    }

    #[test]
    fn the_secret_comes_from_its_file() {
        let dir = std::env::temp_dir().join(format!("morio-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secret");
        std::fs::write(&file, b"sixteen bytes or more\n").unwrap();
        let with = |p: &std::path::Path| {
            DEFAULT_TOML.replace(
                "# secret_file = \"/etc/morio/secret\"",
                &format!("secret_file = {:?}", p.display().to_string()),
            )
        };
        let c = ServeConfig::parse(&with(&file)).unwrap();
        let s = c.auth_secret().unwrap().unwrap();
        assert_eq!(s.as_bytes(), b"sixteen bytes or more");
        assert!(ServeConfig::parse(DEFAULT_TOML)
            .unwrap()
            .auth_secret()
            .unwrap()
            .is_none());
        std::fs::write(&file, b"short").unwrap();
        let e = ServeConfig::parse(&with(&file)).unwrap_err();
        assert!(format!("{e:#}").contains("at least 16 bytes"), "{e:#}");
        let e = ServeConfig::parse(&with(&dir.join("missing"))).unwrap_err();
        assert!(format!("{e:#}").contains("secret_file"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_configs_are_clear_errors() {
        let base = DEFAULT_TOML.replace("num_data_conns = 8", "num_data_conns = 17");
        let e = ServeConfig::parse(&base).unwrap_err();
        assert!(format!("{e:#}").contains("num_data_conns"), "{e:#}");
        let d = ServeConfig::parse(DEFAULT_TOML).unwrap().tcp_config();
        assert_eq!((d.gpu_data_conns, d.gpu_lanes()), (None, 16));
        let gpu = DEFAULT_TOML.replace("# gpu_data_conns = 12", "gpu_data_conns = 12");
        let c = ServeConfig::parse(&gpu).unwrap().tcp_config();
        assert_eq!((c.gpu_data_conns, c.gpu_lanes()), (Some(12), 12));
        let e = ServeConfig::parse(&gpu.replace("gpu_data_conns = 12", "gpu_data_conns = 17"))
            .unwrap_err();
        assert!(format!("{e:#}").contains("gpu_data_conns"), "{e:#}");
        let e = ServeConfig::parse("[engine]\nkey='k'\nhost='x'\n[control]\nlisten='a'\n[oops]\n")
            .unwrap_err();
        assert!(format!("{e:#}").contains("oops"), "{e:#}");
        let dup = format!("{DEFAULT_TOML}\n[[memory]]\nname = \"kv\"\nsize = 8\n");
        assert!(format!("{:#}", ServeConfig::parse(&dup).unwrap_err()).contains("twice"));
        let bad = DEFAULT_TOML.replace("size = \"1GiB\"", "size = \"1XB\"");
        assert!(ServeConfig::parse(&bad).is_err());
    }

    /// `[discovery]`: off by default; with endpoints, a build without `etcd` refuses it and a
    /// zero TTL or a relative prefix is an error.
    #[test]
    fn discovery_section() {
        let c = ServeConfig::parse(DEFAULT_TOML).unwrap();
        assert!(c.discovery.etcd.is_empty());
        assert_eq!(
            (c.discovery.prefix.as_str(), c.discovery.lease_ttl_s),
            ("/morio", 10)
        );
        let on = DEFAULT_TOML.replace("etcd = []", "etcd = [\"127.0.0.1:2379\"]");
        let r = ServeConfig::parse(&on);
        if cfg!(feature = "etcd") {
            let d = r.unwrap().discovery;
            assert_eq!(d.etcd, ["127.0.0.1:2379"]);
            assert!(!d.connect_peers);
            let conn = on.replace("connect_peers = false", "connect_peers = true");
            assert!(ServeConfig::parse(&conn).unwrap().discovery.connect_peers);
            let ttl = on.replace("lease_ttl_s = 10", "lease_ttl_s = 0");
            let e = ServeConfig::parse(&ttl).unwrap_err();
            assert!(format!("{e:#}").contains("lease_ttl_s"), "{e:#}");
            let rel = on.replace("prefix = \"/morio\"", "prefix = \"morio\"");
            let e = ServeConfig::parse(&rel).unwrap_err();
            assert!(format!("{e:#}").contains("prefix"), "{e:#}");
        } else {
            let e = r.unwrap_err();
            assert!(format!("{e:#}").contains("`etcd` feature"), "{e:#}");
        }
    }

    /// `[discovery]` user, password_file and TLS files: a user comes with its password_file
    /// (read, trailing newline dropped), a client certificate with its key and a CA, every
    /// file named must exist.
    #[cfg(feature = "etcd")]
    #[test]
    fn discovery_user_and_tls_files() {
        let dir = std::env::temp_dir().join(format!("morio-etcd-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (pw, ca, cert, key) = (
            dir.join("pw"),
            dir.join("ca.pem"),
            dir.join("c.pem"),
            dir.join("k.pem"),
        );
        std::fs::write(&pw, "s3cret\n").unwrap();
        for f in [&ca, &cert, &key] {
            std::fs::write(f, "-----BEGIN CERTIFICATE-----\n").unwrap();
        }
        let on = DEFAULT_TOML.replace("etcd = []", "etcd = [\"127.0.0.1:2379\"]");
        let set = |pairs: &[(&str, &std::path::Path)], user: bool| {
            let mut t = on.clone();
            if user {
                t = t.replace("# user = \"morio\"", "user = \"morio\"");
            }
            for (k, p) in pairs {
                let commented = DEFAULT_TOML
                    .lines()
                    .find(|l| l.starts_with(&format!("# {k} = ")))
                    .unwrap();
                t = t.replace(commented, &format!("{k} = {:?}", p.display().to_string()));
            }
            ServeConfig::parse(&t)
        };
        let c = set(
            &[
                ("password_file", &pw),
                ("ca_file", &ca),
                ("cert_file", &cert),
                ("key_file", &key),
            ],
            true,
        )
        .unwrap();
        let auth = c.discovery.etcd_auth().unwrap().unwrap();
        assert_eq!(auth.user(), "morio");
        assert!(!format!("{auth:?}").contains("s3cret"));
        let tls = c.discovery.etcd_tls().unwrap();
        assert_eq!(
            (tls.ca_file, tls.cert_file, tls.key_file),
            (ca.clone(), Some(cert.clone()), Some(key.clone()))
        );
        // Plain etcd: neither.
        let c = ServeConfig::parse(&on).unwrap();
        assert!(c.discovery.etcd_auth().unwrap().is_none() && c.discovery.etcd_tls().is_none());
        let err = |r: anyhow::Result<ServeConfig>| format!("{:#}", r.unwrap_err());
        let e = err(set(&[], true));
        assert!(e.contains("user needs password_file"), "{e}");
        let e = err(set(&[("password_file", &pw)], false));
        assert!(e.contains("password_file needs user"), "{e}");
        let e = err(set(&[("ca_file", &ca), ("cert_file", &cert)], false));
        assert!(e.contains("cert_file and key_file"), "{e}");
        let e = err(set(&[("cert_file", &cert), ("key_file", &key)], false));
        assert!(e.contains("cert_file needs ca_file"), "{e}");
        let missing = dir.join("missing.pem");
        let e = err(set(&[("ca_file", &missing)], false));
        assert!(e.contains("ca_file") && e.contains("missing.pem"), "{e}");
        let e = err(set(&[("password_file", &missing)], true));
        assert!(
            e.contains("password_file") && e.contains("missing.pem"),
            "{e}"
        );
        std::fs::write(&pw, "\n").unwrap();
        let e = err(set(&[("password_file", &pw)], true));
        assert!(e.contains("empty"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
