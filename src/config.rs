//! Engine and TCP backend configuration, with MORI-IO's knobs and defaults plus morio's own.

use std::time::Duration;

use crate::inbound_status::StatusCaps;
use crate::proto::join::JoinCaps;
use crate::proto::limits::{
    MAX_CHUNK_BYTES, MAX_KEY_BYTES, MAX_LANES, MAX_RING_BYTES, MIN_RING_BYTES, MIN_VERSION, VERSION,
};

/// `IOEngineConfig`: where the engine listens and what it advertises.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IoEngineConfig {
    /// Address to listen on and advertise (numeric IPv4 or IPv6, the latter bare or in
    /// brackets: `::1`, `[::1]`; empty = all IPv4 interfaces, advertised as the address this
    /// host's default route leaves from, else 127.0.0.1 with a warning).
    pub host: String,
    /// Port; 0 binds an ephemeral port that [`crate::EngineDesc`] then carries.
    pub port: u16,
    /// What the engine's descriptor tells peers to dial instead of `host`: for an engine
    /// behind NAT or in a pod, the address (numeric, or a name peers resolve when they
    /// register the descriptor) at which they reach it. `None`: `host` (see above).
    pub advertise_host: Option<String>,
}

impl IoEngineConfig {
    /// Config for `host:port`.
    pub fn new(host: &str, port: u16) -> Self {
        Self {
            host: host.to_string(),
            port,
            advertise_host: None,
        }
    }
}

/// `TcpBackendConfig`. The first block mirrors MORI-IO's fields and defaults one to one; the
/// second holds morio's thread-per-core knobs. Defaults are tuned for 100–400 GbE with
/// sub-millisecond RTT and 8 lanes per peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpBackendConfig {
    /// `SO_SNDBUF` on data connections if > 0 (MORI default 32 MiB).
    pub sock_sndbuf_bytes: usize,
    /// `SO_RCVBUF` on data connections if > 0 (MORI default 32 MiB). Set on the listening and
    /// dialing sockets before the handshake so TCP window scaling follows it.
    pub sock_rcvbuf_bytes: usize,
    /// Deadline of every transfer from submission to terminal status (MORI default 30 s).
    /// Also the progress rule of every connection, on either side: once a frame has begun,
    /// all of it (header, body and payload) must arrive within `op_timeout` of the first
    /// wait for more of it, else the connection closes (a 64 MiB chunk needs at least
    /// 2.2 MB/s at the default). Waiting for a frame to begin is unbounded.
    pub op_timeout: Duration,
    /// `SO_KEEPALIVE` and the three settings below.
    pub enable_keepalive: bool,
    /// `TCP_KEEPIDLE` (MORI default 30 s).
    pub keepalive_idle: Duration,
    /// `TCP_KEEPINTVL` (MORI default 10 s).
    pub keepalive_intvl: Duration,
    /// `TCP_KEEPCNT` (MORI default 3).
    pub keepalive_cnt: u32,
    /// `TCP_NODELAY` on connections (MORI: the control connection; morio's lanes carry both
    /// control and data, so it applies to all of them).
    pub enable_ctrl_nodelay: bool,
    /// Lanes (data connections) per peer, 1..=16 (MORI default 8).
    pub num_data_conns: usize,
    /// Lanes a transfer staged through GPU memory over TCP stripes over where that gives each
    /// a whole `gpu_chunk_bytes` chunk, 1..=16, never fewer than `num_data_conns`; `None`
    /// (the default): twice `num_data_conns`, at most 16 ([`Self::gpu_lanes`]). A lane's
    /// staged chunk waits for its copy between device memory and a pinned slot before its
    /// first byte leaves and after its last lands, and a second lane on the same shard sends
    /// meanwhile: with copy-ahead, 16 lanes against 8 moved GPU → GPU writes 4–8 % and
    /// GPU → CPU writes 10 % faster on an H100, reads within noise (`docs/perf/s43-runs.md`),
    /// where striping every transfer over 16 costs a 4 KiB × 256 batch 29 % (s41); so only
    /// large staged transfers use the lanes past `num_data_conns` (dialed on a peer's first
    /// one).
    pub gpu_data_conns: Option<usize>,
    /// Transfers of at least this many bytes are striped over all lanes (MORI default 64 KiB).
    pub striping_threshold_bytes: usize,

    /// Number of shards (executor threads). `None`: one per CPU this process may run on (its
    /// affinity mask), at most `num_data_conns`; pinned, at most one per CPU no other pinned
    /// engine on the host holds (see [`crate::placement`]).
    pub num_shards: Option<usize>,
    /// Explicit CPUs to pin shards to, one per shard (overrides `num_shards` and the topology
    /// plan; implies pinning). Used exactly as given: each is also claimed host-wide where
    /// free, and one already claimed by another engine gets a warning, not an error.
    pub cpus: Option<Vec<usize>>,
    /// Pin shards to CPUs. Off by default: an engine made inside an application shares the
    /// host with other processes (one per GPU is the usual layout), so its shard threads float
    /// and the kernel places them. On, and without `cpus`, the engine plans its shards over
    /// the allowed CPUs that no other pinned morio engine on the host has claimed, claims them
    /// for the backend's lifetime, and runs fewer shards (or, with none free, unpinned) when
    /// too few are free (see [`crate::placement`]). `morio serve`, `morio bench` and
    /// `morio loopback` turn it on: they own the host.
    pub pin_shards: bool,
    /// Directory of the host-wide CPU claims of pinned engines. `None`: the environment
    /// variable `MORIO_CPU_CLAIM_DIR` when set, else `/dev/shm/morio-cpus`. Engines share
    /// CPUs safely only when they use the same directory; tests give each run its own.
    pub cpu_claim_dir: Option<std::path::PathBuf>,
    /// Largest chunk one frame carries; striped transfers are cut into stripes of at most this.
    pub chunk_bytes: usize,
    /// `chunk_bytes` for peers reached over the same-host transport (default 8 MiB; 8 × this
    /// between GPU memory on both sides, at most 64 MiB). There a
    /// large chunk is pulled by the receiver or copied on the GPU while its lane waits for
    /// the acknowledgement, so each chunk costs its lane a round trip between the processes:
    /// larger chunks pay it less often. Transfers to a peer before its first lane is up use
    /// `chunk_bytes`.
    pub same_host_chunk_bytes: usize,
    /// `chunk_bytes` for transfers over TCP with GPU memory on either side (default 2 MiB):
    /// each chunk of staged GPU memory pays a copy's fixed cost between device and pinned
    /// slot before its first byte leaves and after its last byte lands, so GPU memory moves
    /// fastest in larger chunks than host memory does (H100: 1 MiB × 256 GPU → GPU 18 → 24
    /// GB/s from 1 to 2 MiB, where host memory loses; `docs/perf/s39-runs.md`).
    pub gpu_chunk_bytes: usize,
    /// A striped write of at least two full chunks per lane (`2 × num_data_conns ×
    /// chunk_bytes` bytes) shares its stripes between its lanes: each lane takes the next
    /// one as it gets to it, so a lane that runs slow carries fewer. Smaller striped writes,
    /// and reads, deal their stripes round-robin (as all do when this is off).
    pub share_stripes: bool,
    /// Payloads up to this size are copied next to their header and sent with one syscall;
    /// larger ones are sent straight from registered memory.
    pub inline_write_bytes: usize,
    /// Busy-poll a shard this long before parking it (glommio's `spin_before_park`: lower
    /// wake-up latency, burns the core while it lasts). Off by default.
    pub spin_before_park: Option<Duration>,
    /// Poll sockets and rings directly (no system call per wake-up) for this long after a
    /// shard's last work before it parks, without glommio's spin; a shard preempted while it
    /// does so stops for 50 ms, so it never holds a CPU another thread wants. `None`: the
    /// environment variable `MORIO_BUSY_POLL_US` (µs, 0 for off) when set, else
    /// [`DEFAULT_BUSY_POLL`] where this process may run on at least [`BUSY_POLL_MIN_CPUS`]
    /// CPUs and off below (on a few cores the shards and the application share them).
    /// `Some(ZERO)`: off. `spin_before_park`, when set, replaces it.
    pub busy_poll: Option<Duration>,
    /// How long an accepted connection may take to send its HELLO.
    pub handshake_timeout: Duration,
    /// Pinned host memory for GPU staging, for the whole engine (split evenly over shards;
    /// pinned whole once device memory is registered, so no transfer waits for it; never
    /// more). Bounds staging whatever the transfer size; lower it where transfers of GPU
    /// memory never stage (same-host peers only).
    pub gpu_staging_bytes: usize,
    /// Size of one staging slot (default 2 MiB): the unit of the copy/network pipeline (the
    /// D2H of slot i+1 overlaps the send of slot i; the receive of slot i+1 overlaps the H2D
    /// of slot i). Every copy between device and slot has a fixed cost, so larger slots move
    /// GPU memory faster (H100: 1 MiB × 256 GPU → GPU 24 → 26 GB/s from 1 to 2 MiB slots,
    /// `docs/perf/s39-runs.md`). At most: each shard's send and receive pools hold at least
    /// two slots, so where `gpu_staging_bytes` split over many shards leaves less, slots are
    /// smaller ([`TcpBackendConfig::staging_slot_bytes`]).
    pub gpu_slot_bytes: usize,
    /// The deployment secret (at least 16 bytes) every engine that may talk to this one
    /// shares. With it, every connection authenticates both ends in its handshake
    /// (HMAC-SHA-256 over fresh nonces, PROTOCOL.md "Authentication") and a peer without it
    /// gets a generic refusal: no engine key, no region, no byte. `None`: the environment
    /// variable `MORIO_AUTH_SECRET` when set and not empty ([`AuthSecret::from_env`]), else
    /// no authentication, as in MORI-IO: any peer that reaches the port can read and write
    /// registered memory.
    pub auth_secret: Option<AuthSecret>,
    /// Connections still in their handshake, at most (further ones are closed at once): a
    /// client that opens connections and says nothing holds at most this many.
    pub max_handshakes: usize,
    /// Served connections in total, at most (about 340 KiB of buffers each).
    pub max_connections: usize,
    /// Served connections of one peer (engine key), at most; its records go with its last
    /// connection.
    pub max_connections_per_peer: usize,
    /// Target side: join slots one initiator (by engine key) may hold for its multi-chunk
    /// transfers in flight here. A join takes one slot per started 512 chunks
    /// (`proto::limits::JOIN_SLOT_CHUNKS`; one slot up to 512 MiB at the default chunk size)
    /// and costs at most about 250 bytes per slot, so the default (4096) bounds what one
    /// peer makes the table hold at about 1 MiB. A chunk that would start a join past the cap
    /// is refused (its transfer fails with `ERR_BAD_STATE`; one that needs more slots than
    /// the cap, more than 512 × cap chunks, always is); no other peer's join is evicted.
    pub max_joins_per_peer: usize,
    /// Target side: join slots all initiators together may hold (default 65536, about
    /// 16 MiB at most), refused past it like the per-peer cap.
    pub max_joins: usize,
    /// Target side: inbound statuses kept for one initiator until popped (MORI: 4096; its
    /// oldest goes first). About 100–200 bytes each plus its message (kept up to 256
    /// bytes): at most about 1.8 MiB per peer at the default, 0.5 MiB with empty messages.
    pub max_inbound_statuses_per_peer: usize,
    /// Target side: inbound statuses kept for all initiators together (default 65536);
    /// past it the initiator holding the most loses its oldest.
    pub max_inbound_statuses: usize,
    /// Whether connections to engines of this host use the same-host transport (payloads
    /// copied once, process to process, instead of twice through loopback TCP). `None`: the
    /// environment variable `MORIO_SAME_HOST` (`auto`, `off` or `require`) when set, else
    /// [`SameHost::Auto`].
    pub same_host: Option<SameHost>,
    /// Whether GPU memory moves device to device with same-host peers (CUDA or HIP IPC
    /// handles; protocol v8). `None`: the environment variable `MORIO_GPU_IPC` (`on` or `off`)
    /// when set, else on. Off, this engine neither offers its GPU memory to peers nor opens
    /// theirs: GPU payloads are staged through host memory as over TCP.
    pub gpu_ipc: Option<bool>,
    /// Data bytes of the shared-memory ring this engine offers each same-host connection for
    /// what it receives (protocol v9): a power of two from 64 KiB to 16 MiB. `None`: the
    /// environment variable `MORIO_SAME_HOST_RING_BYTES` when it holds such a size, else
    /// 1 MiB. Larger rings let more small frames be in flight per lane (see the metric
    /// `same_host_ring_full_waits`); memory is touched only as a ring is used.
    pub same_host_ring_bytes: Option<usize>,
    /// The newest protocol version this engine offers (default and most: the newest this
    /// build speaks, `proto::limits::VERSION`). For rolling upgrades: keep a fleet on the
    /// version its oldest node speaks until every node runs the new build, then raise it.
    pub max_protocol_version: u32,
}

/// Whether an engine uses the same-host transport (ARCHITECTURE.md, "Transports").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SameHost {
    /// For every peer proven to run on this host (a probe of its memory in the handshake),
    /// unless that cannot be set up: then TCP, with one log line, and no transfer fails.
    #[default]
    Auto,
    /// Never: TCP to every peer.
    Off,
    /// For every peer on this host, or not at all: a connection whose same-host set-up fails
    /// fails (its transfers with it) instead of falling back. For benchmarks and tests that
    /// must know which transport carried them; peers on other hosts still use TCP.
    Require,
}

/// The environment variable that picks [`SameHost`] when the configuration does not.
pub const SAME_HOST_ENV: &str = "MORIO_SAME_HOST";

/// The environment variable that turns same-host GPU copies (`TcpBackendConfig::gpu_ipc`) on
/// or off when the configuration does not.
pub const GPU_IPC_ENV: &str = "MORIO_GPU_IPC";

/// The environment variable that sets `TcpBackendConfig::busy_poll` (µs, 0 for off) when the
/// configuration does not.
pub const BUSY_POLL_ENV: &str = "MORIO_BUSY_POLL_US";

/// The busy-poll window shards get by default where [`BUSY_POLL_MIN_CPUS`] CPUs are there.
/// H200 host, default settings otherwise: 8 B × 64 batch avg 15.3 µs against 53.3 parked,
/// 4 KiB × 256 0.98×, 1 MiB × 256 1.02× (docs/perf/same-host-chunks-h200.md).
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(100);

/// CPUs this process must be allowed to run on for shards to busy-poll by default.
pub const BUSY_POLL_MIN_CPUS: usize = 8;

/// The window [`BUSY_POLL_ENV`] holds: `Ok(None)` when unset or empty.
pub fn busy_poll_from_env() -> Result<Option<Duration>, ConfigError> {
    match std::env::var(BUSY_POLL_ENV) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<u64>()
            .map(|us| Some(Duration::from_micros(us)))
            .map_err(|_| ConfigError::BusyPollEnv(v)),
        _ => Ok(None),
    }
}

/// The busy-poll window of `cfg.busy_poll` once the environment was consulted (`None`: off):
/// the default where the process may run on `cpus` CPUs.
pub fn busy_window(busy_poll: Option<Duration>, cpus: usize) -> Option<Duration> {
    match busy_poll {
        Some(d) => (!d.is_zero()).then_some(d),
        None => (cpus >= BUSY_POLL_MIN_CPUS).then_some(DEFAULT_BUSY_POLL),
    }
}

/// The setting [`GPU_IPC_ENV`] holds: `Ok(None)` when unset or empty.
pub fn gpu_ipc_from_env() -> Result<Option<bool>, ConfigError> {
    match std::env::var(GPU_IPC_ENV) {
        Ok(v) if !v.trim().is_empty() => match v.trim().to_ascii_lowercase().as_str() {
            "on" | "1" | "true" | "yes" => Ok(Some(true)),
            "off" | "0" | "false" | "no" => Ok(Some(false)),
            other => Err(ConfigError::GpuIpcEnv(other.to_string())),
        },
        _ => Ok(None),
    }
}

impl std::str::FromStr for SameHost {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "on" => Ok(Self::Auto),
            "off" | "tcp" => Ok(Self::Off),
            "require" | "required" => Ok(Self::Require),
            other => Err(format!(
                "same-host mode must be auto, off or require, got {other:?}"
            )),
        }
    }
}

impl std::fmt::Display for SameHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Off => "off",
            Self::Require => "require",
        })
    }
}

impl SameHost {
    /// The mode [`SAME_HOST_ENV`] picks: `Ok(None)` when it is unset or empty.
    pub fn from_env() -> Result<Option<Self>, ConfigError> {
        match std::env::var(SAME_HOST_ENV) {
            Ok(v) if !v.trim().is_empty() => v.parse().map(Some).map_err(ConfigError::SameHostEnv),
            _ => Ok(None),
        }
    }
}

/// A deployment secret. Its `Debug` output never shows the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthSecret(Vec<u8>);

/// Shortest secret accepted.
pub const MIN_AUTH_SECRET_BYTES: usize = 16;

/// The smallest staging slot (and `gpu_slot_bytes`' lower bound).
pub const MIN_SLOT_BYTES: usize = 4096;

/// The environment variable that holds the deployment secret when the configuration does not.
pub const AUTH_SECRET_ENV: &str = "MORIO_AUTH_SECRET";

impl AuthSecret {
    /// A secret of these bytes (checked by [`TcpBackendConfig::validate`]: at least
    /// [`MIN_AUTH_SECRET_BYTES`]).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// The secret in [`AUTH_SECRET_ENV`], if set and not empty (its bytes as given, without
    /// a trailing newline).
    pub fn from_env() -> Option<Self> {
        let v = std::env::var_os(AUTH_SECRET_ENV)?;
        let b = std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str());
        let b = b.strip_suffix(b"\n").unwrap_or(b);
        (!b.is_empty()).then(|| Self(b.to_vec()))
    }

    /// The secret in a file (a key file: its bytes, without a trailing newline).
    pub fn from_file(path: &std::path::Path) -> std::io::Result<Self> {
        let b = std::fs::read(path)?;
        let b = b.strip_suffix(b"\n").unwrap_or(&b);
        Ok(Self(b.to_vec()))
    }

    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for AuthSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuthSecret(<{} bytes>)", self.0.len())
    }
}

impl Default for TcpBackendConfig {
    fn default() -> Self {
        Self {
            sock_sndbuf_bytes: 32 << 20,
            sock_rcvbuf_bytes: 32 << 20,
            op_timeout: Duration::from_secs(30),
            enable_keepalive: true,
            keepalive_idle: Duration::from_secs(30),
            keepalive_intvl: Duration::from_secs(10),
            keepalive_cnt: 3,
            enable_ctrl_nodelay: true,
            num_data_conns: 8,
            gpu_data_conns: None,
            striping_threshold_bytes: 64 << 10,
            num_shards: None,
            cpus: None,
            pin_shards: false,
            cpu_claim_dir: None,
            chunk_bytes: 1 << 20,
            same_host_chunk_bytes: 8 << 20,
            gpu_chunk_bytes: 2 << 20,
            share_stripes: true,
            inline_write_bytes: 16 << 10,
            spin_before_park: None,
            busy_poll: None,
            handshake_timeout: Duration::from_secs(10),
            gpu_staging_bytes: 64 << 20,
            gpu_slot_bytes: 2 << 20,
            auth_secret: None,
            max_handshakes: 128,
            max_connections: 1024,
            max_connections_per_peer: 4 * MAX_LANES as usize,
            max_joins_per_peer: JoinCaps::DEFAULT.per_peer,
            max_joins: JoinCaps::DEFAULT.total,
            max_inbound_statuses_per_peer: StatusCaps::DEFAULT.per_peer,
            max_inbound_statuses: StatusCaps::DEFAULT.total,
            same_host: None,
            gpu_ipc: None,
            same_host_ring_bytes: None,
            max_protocol_version: VERSION,
        }
    }
}

/// A configuration value that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `num_data_conns` outside 1..=16.
    #[error("num_data_conns must be in [1, {MAX_LANES}], got {0}")]
    DataConns(usize),
    /// `gpu_data_conns` outside 1..=16.
    #[error("gpu_data_conns must be in [1, {MAX_LANES}], got {0}")]
    GpuDataConns(usize),
    /// `op_timeout` or `handshake_timeout` is zero.
    #[error("{0} must be greater than zero")]
    ZeroTimeout(&'static str),
    /// `chunk_bytes` outside 4 KiB..=64 MiB.
    #[error("chunk_bytes must be in [4096, {MAX_CHUNK_BYTES}], got {0}")]
    ChunkBytes(usize),
    /// `same_host_chunk_bytes` outside 4 KiB..=64 MiB.
    #[error("same_host_chunk_bytes must be in [4096, {MAX_CHUNK_BYTES}], got {0}")]
    SameHostChunkBytes(usize),
    /// `gpu_chunk_bytes` outside 4 KiB..=64 MiB.
    #[error("gpu_chunk_bytes must be in [4096, {MAX_CHUNK_BYTES}], got {0}")]
    GpuChunkBytes(usize),
    /// `max_handshakes`, `max_connections` or `max_connections_per_peer` is zero.
    #[error("max_handshakes, max_connections and max_connections_per_peer must be at least 1")]
    ZeroConnections,
    /// `auth_secret` shorter than [`MIN_AUTH_SECRET_BYTES`].
    #[error("auth_secret must be at least {MIN_AUTH_SECRET_BYTES} bytes, got {0}")]
    AuthSecretTooShort(usize),
    /// `num_shards` is zero.
    #[error("num_shards must be at least 1")]
    ZeroShards,
    /// An explicit CPU list is empty or repeats a CPU.
    #[error("cpus must be a non-empty list of distinct CPUs")]
    BadCpus,
    /// Keepalive values that the kernel refuses (zero or too large).
    #[error("keepalive settings must be between 1 s and 32767 s and count 1..=127")]
    Keepalive,
    /// An engine key that is empty or longer than the protocol allows.
    #[error("engine key must be 1..={MAX_KEY_BYTES} bytes")]
    Key,
    /// A host that is not a numeric IP address.
    #[error("host {0:?} is not a numeric IP address")]
    Host(String),
    /// `MORIO_SAME_HOST` holds something else than a mode.
    #[error("{SAME_HOST_ENV}: {0}")]
    SameHostEnv(String),
    /// `MORIO_BUSY_POLL_US` holds something else than a number of µs.
    #[error("{BUSY_POLL_ENV} must be a number of microseconds (0 for off), got {0:?}")]
    BusyPollEnv(String),
    /// `MORIO_GPU_IPC` holds something else than on or off.
    #[error("{GPU_IPC_ENV} must be on or off, got {0:?}")]
    GpuIpcEnv(String),
    /// `max_protocol_version` outside the versions this build speaks.
    #[error("max_protocol_version must be in [{MIN_VERSION}, {VERSION}], got {0}")]
    ProtocolVersion(u32),
    /// Socket buffer sizes above what `setsockopt` takes.
    #[error("socket buffer sizes must fit in an i32")]
    SockBuf,
    /// A same-host ring size that is not a power of two from 64 KiB to 16 MiB.
    #[error("same_host_ring_bytes must be a power of two from 65536 to 16777216, got {0}")]
    RingBytes(usize),
    /// A staging slot outside 4 KiB..=64 MiB.
    #[error("gpu_slot_bytes must be in [4096, {MAX_CHUNK_BYTES}], got {0}")]
    GpuSlot(usize),
    /// Too little staging for every shard to hold two pools of two slots of the smallest size.
    #[error(
        "gpu_staging_bytes ({staging}) must give each of {shards} shards at least {min} bytes \
         (two pools of two {MIN_SLOT_BYTES}-byte slots)",
        min = 4 * MIN_SLOT_BYTES
    )]
    GpuStaging {
        /// The configured total.
        staging: usize,
        /// Shards sharing it.
        shards: usize,
    },
    /// A per-peer cap of zero, or above its total.
    #[error("{0}_per_peer must be at least 1 and at most {0} ({1} > {2})")]
    Caps(&'static str, usize, usize),
}

impl TcpBackendConfig {
    /// Check every field and cross-field rule; nothing panics on a bad value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // MORI-compat: numDataConns in [1,16].
        if !(1..=MAX_LANES as usize).contains(&self.num_data_conns) {
            return Err(ConfigError::DataConns(self.num_data_conns));
        }
        if let Some(n) = self
            .gpu_data_conns
            .filter(|n| !(1..=MAX_LANES as usize).contains(n))
        {
            return Err(ConfigError::GpuDataConns(n));
        }
        if self.op_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout("op_timeout"));
        }
        if self.handshake_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout("handshake_timeout"));
        }
        if self.chunk_bytes < 4096 || self.chunk_bytes as u64 > MAX_CHUNK_BYTES {
            return Err(ConfigError::ChunkBytes(self.chunk_bytes));
        }
        if self.same_host_chunk_bytes < 4096 || self.same_host_chunk_bytes as u64 > MAX_CHUNK_BYTES
        {
            return Err(ConfigError::SameHostChunkBytes(self.same_host_chunk_bytes));
        }
        if self.gpu_chunk_bytes < 4096 || self.gpu_chunk_bytes as u64 > MAX_CHUNK_BYTES {
            return Err(ConfigError::GpuChunkBytes(self.gpu_chunk_bytes));
        }
        if self.num_shards == Some(0) {
            return Err(ConfigError::ZeroShards);
        }
        if let Some(cpus) = &self.cpus {
            let mut c = cpus.clone();
            c.sort_unstable();
            c.dedup();
            if cpus.is_empty() || c.len() != cpus.len() {
                return Err(ConfigError::BadCpus);
            }
        }
        if self.enable_keepalive {
            let ok = |d: Duration| (1..=32767).contains(&d.as_secs());
            if !ok(self.keepalive_idle)
                || !ok(self.keepalive_intvl)
                || !(1..=127).contains(&self.keepalive_cnt)
            {
                return Err(ConfigError::Keepalive);
            }
        }
        if self.sock_sndbuf_bytes > i32::MAX as usize || self.sock_rcvbuf_bytes > i32::MAX as usize
        {
            return Err(ConfigError::SockBuf);
        }
        if self.max_handshakes == 0
            || self.max_connections == 0
            || self.max_connections_per_peer == 0
        {
            return Err(ConfigError::ZeroConnections);
        }
        if !(MIN_VERSION..=VERSION).contains(&self.max_protocol_version) {
            return Err(ConfigError::ProtocolVersion(self.max_protocol_version));
        }
        if let Some(s) = &self.auth_secret {
            if s.as_bytes().len() < MIN_AUTH_SECRET_BYTES {
                return Err(ConfigError::AuthSecretTooShort(s.as_bytes().len()));
            }
        }
        if self.gpu_slot_bytes < MIN_SLOT_BYTES || self.gpu_slot_bytes as u64 > MAX_CHUNK_BYTES {
            return Err(ConfigError::GpuSlot(self.gpu_slot_bytes));
        }
        if let Some(n) = self.same_host_ring_bytes {
            if !n.is_power_of_two() || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&n) {
                return Err(ConfigError::RingBytes(n));
            }
        }
        for (name, per_peer, total) in [
            ("max_joins", self.max_joins_per_peer, self.max_joins),
            (
                "max_inbound_statuses",
                self.max_inbound_statuses_per_peer,
                self.max_inbound_statuses,
            ),
        ] {
            if per_peer == 0 || per_peer > total {
                return Err(ConfigError::Caps(name, per_peer, total));
            }
        }
        self.check_staging(1)
    }

    /// Whether `n_shards` shards can each hold a send and a receive pool of two slots of the
    /// smallest size.
    pub fn check_staging(&self, n_shards: usize) -> Result<(), ConfigError> {
        if self.gpu_staging_bytes / n_shards.max(1) < 4 * MIN_SLOT_BYTES {
            return Err(ConfigError::GpuStaging {
                staging: self.gpu_staging_bytes,
                shards: n_shards,
            });
        }
        Ok(())
    }

    /// Lanes a staged GPU transfer stripes over, and every lane a peer may have: the larger
    /// of `gpu_data_conns` and `num_data_conns`; unset, twice `num_data_conns` (at most 16).
    pub fn gpu_lanes(&self) -> usize {
        let n = self.num_data_conns;
        match self.gpu_data_conns {
            Some(g) => g.max(n),
            None => (2 * n).min(MAX_LANES as usize).max(n),
        }
    }

    /// The staging slot size each of `n_shards` shards uses: `gpu_slot_bytes`, or less (a
    /// multiple of 4 KiB) where its share of `gpu_staging_bytes` would otherwise hold fewer
    /// than two slots in each of its pools (send and receive).
    pub fn staging_slot_bytes(&self, n_shards: usize) -> usize {
        let per_pool = self.gpu_staging_bytes / n_shards.max(1) / 2;
        let fit = (per_pool / 2) / MIN_SLOT_BYTES * MIN_SLOT_BYTES;
        self.gpu_slot_bytes.min(fit).max(MIN_SLOT_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_mori_and_validate() {
        let c = TcpBackendConfig::default();
        assert_eq!(c.sock_sndbuf_bytes, 32 << 20);
        assert_eq!(c.sock_rcvbuf_bytes, 32 << 20);
        assert_eq!(c.op_timeout, Duration::from_secs(30));
        assert_eq!(c.num_data_conns, 8);
        assert_eq!(c.striping_threshold_bytes, 65536);
        assert_eq!(
            (c.keepalive_idle.as_secs(), c.keepalive_intvl.as_secs()),
            (30, 10)
        );
        assert_eq!(c.keepalive_cnt, 3);
        assert!(c.enable_keepalive && c.enable_ctrl_nodelay);
        // Library engines float (the embedding policy, `crate::placement`).
        assert!(!c.pin_shards && c.cpus.is_none() && c.num_shards.is_none());
        assert_eq!(c.cpu_claim_dir, None);
        // Target state caps: MORI keeps 4096 inbound statuses per peer.
        assert_eq!(
            (c.max_inbound_statuses_per_peer, c.max_inbound_statuses),
            (4096, 65536)
        );
        assert_eq!((c.max_joins_per_peer, c.max_joins), (4096, 65536));
        c.validate().unwrap();
    }

    #[test]
    fn staging_slots_shrink_so_every_pool_holds_two() {
        let c = TcpBackendConfig::default();
        assert_eq!((c.gpu_staging_bytes, c.gpu_slot_bytes), (64 << 20, 2 << 20));
        // Up to 8 shards the configured slot fits twice in each of a shard's two pools.
        for n in [1, 2, 8] {
            assert_eq!(c.staging_slot_bytes(n), 2 << 20, "{n} shards");
            c.check_staging(n).unwrap();
        }
        // Beyond, slots shrink (in 4 KiB steps) instead of refusing the shard count.
        assert_eq!(c.staging_slot_bytes(16), 1 << 20);
        assert_eq!(c.staging_slot_bytes(64), 256 << 10);
        assert_eq!(c.staging_slot_bytes(24), 680 << 10);
        c.check_staging(1024).unwrap();
        assert_eq!(c.staging_slot_bytes(1024), 16 << 10);
        // The floor: two pools of two 4 KiB slots per shard.
        assert_eq!(c.staging_slot_bytes(4096), MIN_SLOT_BYTES);
        c.check_staging(4096).unwrap();
        assert!(c.check_staging(4097).is_err());
        // A smaller slot than the pool allows is kept as configured.
        let small = TcpBackendConfig {
            gpu_slot_bytes: 16 << 10,
            ..TcpBackendConfig::default()
        };
        assert_eq!(small.staging_slot_bytes(8), 16 << 10);
    }

    #[test]
    fn gpu_lanes_are_twice_num_data_conns_unless_set() {
        let c = |num, gpu| TcpBackendConfig {
            num_data_conns: num,
            gpu_data_conns: gpu,
            ..TcpBackendConfig::default()
        };
        assert_eq!(TcpBackendConfig::default().gpu_lanes(), 16);
        assert_eq!(c(8, None).gpu_lanes(), 16);
        assert_eq!(c(2, None).gpu_lanes(), 4);
        assert_eq!(c(12, None).gpu_lanes(), 16);
        assert_eq!(c(16, None).gpu_lanes(), 16);
        assert_eq!(c(8, Some(8)).gpu_lanes(), 8);
        assert_eq!(c(2, Some(16)).gpu_lanes(), 16);
        assert_eq!(c(8, Some(4)).gpu_lanes(), 8);
        assert!(c(2, Some(16)).validate().is_ok());
    }

    #[test]
    fn bad_values_are_typed_errors() {
        let d = TcpBackendConfig::default;
        let cases = [
            (
                TcpBackendConfig {
                    num_data_conns: 0,
                    ..d()
                },
                ConfigError::DataConns(0),
            ),
            (
                TcpBackendConfig {
                    num_data_conns: 17,
                    ..d()
                },
                ConfigError::DataConns(17),
            ),
            (
                TcpBackendConfig {
                    gpu_data_conns: Some(0),
                    ..d()
                },
                ConfigError::GpuDataConns(0),
            ),
            (
                TcpBackendConfig {
                    gpu_data_conns: Some(17),
                    ..d()
                },
                ConfigError::GpuDataConns(17),
            ),
            (
                TcpBackendConfig {
                    op_timeout: Duration::ZERO,
                    ..d()
                },
                ConfigError::ZeroTimeout("op_timeout"),
            ),
            (
                TcpBackendConfig {
                    chunk_bytes: 10,
                    ..d()
                },
                ConfigError::ChunkBytes(10),
            ),
            (
                TcpBackendConfig {
                    same_host_chunk_bytes: (64 << 20) + 1,
                    ..d()
                },
                ConfigError::SameHostChunkBytes((64 << 20) + 1),
            ),
            (
                TcpBackendConfig {
                    gpu_chunk_bytes: 4095,
                    ..d()
                },
                ConfigError::GpuChunkBytes(4095),
            ),
            (
                TcpBackendConfig {
                    num_shards: Some(0),
                    ..d()
                },
                ConfigError::ZeroShards,
            ),
            (
                TcpBackendConfig {
                    cpus: Some(vec![1, 1]),
                    ..d()
                },
                ConfigError::BadCpus,
            ),
            (
                TcpBackendConfig {
                    cpus: Some(vec![]),
                    ..d()
                },
                ConfigError::BadCpus,
            ),
            (
                TcpBackendConfig {
                    keepalive_cnt: 0,
                    ..d()
                },
                ConfigError::Keepalive,
            ),
            (
                TcpBackendConfig {
                    sock_sndbuf_bytes: usize::MAX,
                    ..d()
                },
                ConfigError::SockBuf,
            ),
            (
                TcpBackendConfig {
                    gpu_slot_bytes: 100,
                    ..d()
                },
                ConfigError::GpuSlot(100),
            ),
            (
                TcpBackendConfig {
                    same_host_ring_bytes: Some(100 << 10),
                    ..d()
                },
                ConfigError::RingBytes(100 << 10),
            ),
            (
                TcpBackendConfig {
                    same_host_ring_bytes: Some(32 << 20),
                    ..d()
                },
                ConfigError::RingBytes(32 << 20),
            ),
            (
                TcpBackendConfig {
                    gpu_staging_bytes: 12 << 10,
                    ..d()
                },
                ConfigError::GpuStaging {
                    staging: 12 << 10,
                    shards: 1,
                },
            ),
            (
                TcpBackendConfig {
                    max_joins_per_peer: 0,
                    ..d()
                },
                ConfigError::Caps("max_joins", 0, 65536),
            ),
            (
                TcpBackendConfig {
                    max_inbound_statuses_per_peer: 10,
                    max_inbound_statuses: 9,
                    ..d()
                },
                ConfigError::Caps("max_inbound_statuses", 10, 9),
            ),
        ];
        for (c, e) in cases {
            assert_eq!(c.validate(), Err(e));
        }
        for n in 1..=16 {
            TcpBackendConfig {
                num_data_conns: n,
                ..d()
            }
            .validate()
            .unwrap();
        }
    }

    #[test]
    fn busy_poll_defaults_to_a_window_on_hosts_with_cpus_to_spare() {
        assert_eq!(busy_window(None, 16), Some(DEFAULT_BUSY_POLL));
        assert_eq!(busy_window(None, BUSY_POLL_MIN_CPUS - 1), None);
        assert_eq!(busy_window(Some(Duration::ZERO), 64), None, "zero is off");
        let d = Duration::from_micros(30);
        assert_eq!(
            busy_window(Some(d), 1),
            Some(d),
            "set explicitly, it applies anywhere"
        );
    }
}
