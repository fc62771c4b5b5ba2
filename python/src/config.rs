//! `IOEngineConfig`, `TcpBackendConfig` (MORI's keywords and defaults plus morio's own) and
//! MORI's other backend configs, accepted so that code naming them imports and runs.

use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use morio::{IoEngineConfig, TcpBackendConfig};

/// Where an engine listens and what it advertises (MORI-IO's `IOEngineConfig`).
#[pyclass(module = "morio", name = "IOEngineConfig", eq)]
#[derive(Clone, PartialEq)]
pub struct PyIoEngineConfig {
    /// Numeric IP address to listen on and advertise ("" = all IPv4 interfaces).
    #[pyo3(get, set)]
    pub host: String,
    /// Port; 0 binds an ephemeral port that the engine's descriptor then carries.
    #[pyo3(get, set)]
    pub port: u16,
    /// morio: what the descriptor tells peers to dial instead of `host` (behind NAT or in a
    /// pod; a numeric address or a name peers resolve).
    #[pyo3(get, set)]
    pub advertise_host: Option<String>,
}

#[pymethods]
impl PyIoEngineConfig {
    #[new]
    #[pyo3(signature = (host = String::new(), port = 0, *, advertise_host = None))]
    fn new(host: String, port: u16, advertise_host: Option<String>) -> Self {
        Self {
            host,
            port,
            advertise_host,
        }
    }

    fn __repr__(&self) -> String {
        match &self.advertise_host {
            None => format!("IOEngineConfig(host={:?}, port={})", self.host, self.port),
            Some(a) => format!(
                "IOEngineConfig(host={:?}, port={}, advertise_host={a:?})",
                self.host, self.port
            ),
        }
    }
}

impl PyIoEngineConfig {
    pub fn to_rust(&self) -> IoEngineConfig {
        IoEngineConfig {
            advertise_host: self.advertise_host.clone(),
            ..IoEngineConfig::new(&self.host, self.port)
        }
    }
}

/// MORI's `op_timeout_ms <= 0` means "no deadline"; morio keeps a deadline on every
/// transfer so none can hang forever, and takes this one instead.
const NO_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

fn ms(v: i64) -> Duration {
    match u64::try_from(v) {
        Ok(0) | Err(_) => NO_TIMEOUT,
        Ok(ms) => Duration::from_millis(ms),
    }
}

fn secs(name: &str, v: i64) -> PyResult<Duration> {
    u64::try_from(v)
        .map(Duration::from_secs)
        .map_err(|_| PyValueError::new_err(format!("{name} must be >= 0, got {v}")))
}

fn bytes(name: &str, v: i64) -> PyResult<usize> {
    // MORI: "SO_SNDBUF/SO_RCVBUF if > 0": zero or negative leaves the kernel default.
    if v <= 0 {
        return Ok(0);
    }
    usize::try_from(v).map_err(|_| PyValueError::new_err(format!("{name} is too large: {v}")))
}

/// The TCP backend's settings (MORI-IO's `TcpBackendConfig`, same keywords and defaults,
/// plus morio's own keywords). Invalid values raise `ValueError` here and again at
/// `create_backend` (fields stay writable after construction, as in MORI).
#[pyclass(module = "morio", name = "TcpBackendConfig")]
#[derive(Clone)]
pub struct PyTcpBackendConfig {
    pub cfg: TcpBackendConfig,
    /// As given (MORI keeps the integer; `<= 0` means no deadline there).
    op_timeout_ms: i64,
    sndbuf: i64,
    rcvbuf: i64,
}

impl PyTcpBackendConfig {
    /// MORI's defaults with morio's, validated.
    pub fn default_config() -> TcpBackendConfig {
        TcpBackendConfig::default()
    }

    pub fn validated(&self) -> PyResult<TcpBackendConfig> {
        self.cfg
            .validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(self.cfg.clone())
    }
}

#[pymethods]
impl PyTcpBackendConfig {
    #[new]
    #[pyo3(signature = (
        sock_sndbuf_bytes = 32 * 1024 * 1024,
        sock_rcvbuf_bytes = 32 * 1024 * 1024,
        op_timeout_ms = 30_000,
        enable_keepalive = true,
        keepalive_idle_sec = 30,
        keepalive_intvl_sec = 10,
        keepalive_cnt = 3,
        enable_ctrl_nodelay = true,
        num_data_conns = 8,
        striping_threshold_bytes = 64 * 1024,
        *,
        num_shards = None,
        cpus = None,
        pin_shards = None,
        chunk_bytes = None,
        same_host_chunk_bytes = None,
        gpu_chunk_bytes = None,
        gpu_data_conns = None,
        share_stripes = None,
        inline_write_bytes = None,
        spin_us = 0,
        busy_poll_us = None,
        handshake_timeout_ms = None,
        gpu_staging_bytes = None,
        gpu_slot_bytes = None,
        auth_secret = None,
        max_handshakes = None,
        max_connections = None,
        max_connections_per_peer = None,
        max_joins = None,
        max_joins_per_peer = None,
        max_inbound_statuses = None,
        max_inbound_statuses_per_peer = None,
        same_host = None,
        max_protocol_version = None,
        gpu_ipc = None,
        same_host_ring_bytes = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        sock_sndbuf_bytes: i64,
        sock_rcvbuf_bytes: i64,
        op_timeout_ms: i64,
        enable_keepalive: bool,
        keepalive_idle_sec: i64,
        keepalive_intvl_sec: i64,
        keepalive_cnt: i64,
        enable_ctrl_nodelay: bool,
        num_data_conns: i64,
        striping_threshold_bytes: i64,
        num_shards: Option<usize>,
        cpus: Option<Vec<usize>>,
        pin_shards: Option<bool>,
        chunk_bytes: Option<usize>,
        same_host_chunk_bytes: Option<usize>,
        gpu_chunk_bytes: Option<usize>,
        gpu_data_conns: Option<i64>,
        share_stripes: Option<bool>,
        inline_write_bytes: Option<usize>,
        spin_us: u64,
        busy_poll_us: Option<u64>,
        handshake_timeout_ms: Option<u64>,
        gpu_staging_bytes: Option<usize>,
        gpu_slot_bytes: Option<usize>,
        auth_secret: Option<&Bound<'_, PyAny>>,
        max_handshakes: Option<usize>,
        max_connections: Option<usize>,
        max_connections_per_peer: Option<usize>,
        max_joins: Option<usize>,
        max_joins_per_peer: Option<usize>,
        max_inbound_statuses: Option<usize>,
        max_inbound_statuses_per_peer: Option<usize>,
        same_host: Option<String>,
        max_protocol_version: Option<u32>,
        gpu_ipc: Option<bool>,
        same_host_ring_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let mut me = Self {
            cfg: TcpBackendConfig::default(),
            op_timeout_ms: 30_000,
            sndbuf: 32 << 20,
            rcvbuf: 32 << 20,
        };
        me.set_sock_sndbuf_bytes(sock_sndbuf_bytes)?;
        me.set_sock_rcvbuf_bytes(sock_rcvbuf_bytes)?;
        me.set_op_timeout_ms(op_timeout_ms);
        me.cfg.enable_keepalive = enable_keepalive;
        me.set_keepalive_idle_sec(keepalive_idle_sec)?;
        me.set_keepalive_intvl_sec(keepalive_intvl_sec)?;
        me.set_keepalive_cnt(keepalive_cnt)?;
        me.cfg.enable_ctrl_nodelay = enable_ctrl_nodelay;
        me.set_num_data_conns(num_data_conns)?;
        me.set_striping_threshold_bytes(striping_threshold_bytes)?;
        me.cfg.num_shards = num_shards;
        me.cfg.cpus = cpus;
        if let Some(p) = pin_shards {
            me.cfg.pin_shards = p;
        }
        if let Some(c) = chunk_bytes {
            me.cfg.chunk_bytes = c;
        }
        if let Some(c) = same_host_chunk_bytes {
            me.cfg.same_host_chunk_bytes = c;
        }
        me.set_gpu_data_conns(gpu_data_conns)?;
        if let Some(c) = gpu_chunk_bytes {
            me.cfg.gpu_chunk_bytes = c;
        }
        if let Some(s) = share_stripes {
            me.cfg.share_stripes = s;
        }
        if let Some(b) = inline_write_bytes {
            me.cfg.inline_write_bytes = b;
        }
        me.set_spin_us(spin_us);
        me.set_busy_poll_us(busy_poll_us);
        if let Some(h) = handshake_timeout_ms {
            me.cfg.handshake_timeout = Duration::from_millis(h);
        }
        if let Some(b) = gpu_staging_bytes {
            me.cfg.gpu_staging_bytes = b;
        }
        if let Some(b) = gpu_slot_bytes {
            me.cfg.gpu_slot_bytes = b;
        }
        me.set_auth_secret(auth_secret)?;
        if let Some(v) = max_handshakes {
            me.cfg.max_handshakes = v;
        }
        if let Some(v) = max_connections {
            me.cfg.max_connections = v;
        }
        if let Some(v) = max_connections_per_peer {
            me.cfg.max_connections_per_peer = v;
        }
        if let Some(v) = max_joins {
            me.cfg.max_joins = v;
        }
        if let Some(v) = max_joins_per_peer {
            me.cfg.max_joins_per_peer = v;
        }
        if let Some(v) = max_inbound_statuses {
            me.cfg.max_inbound_statuses = v;
        }
        if let Some(v) = max_inbound_statuses_per_peer {
            me.cfg.max_inbound_statuses_per_peer = v;
        }
        me.set_same_host(same_host)?;
        me.cfg.gpu_ipc = gpu_ipc;
        me.cfg.same_host_ring_bytes = same_host_ring_bytes;
        if let Some(v) = max_protocol_version {
            me.cfg.max_protocol_version = v;
        }
        me.validated()?;
        Ok(me)
    }

    /// morio: connections still in their handshake, at most (default 128).
    #[getter]
    fn max_handshakes(&self) -> usize {
        self.cfg.max_handshakes
    }
    #[setter]
    fn set_max_handshakes(&mut self, v: usize) {
        self.cfg.max_handshakes = v;
    }
    /// morio: served connections in total, at most (default 1024).
    #[getter]
    fn max_connections(&self) -> usize {
        self.cfg.max_connections
    }
    #[setter]
    fn set_max_connections(&mut self, v: usize) {
        self.cfg.max_connections = v;
    }
    /// morio: served connections of one peer, at most (default 64).
    #[getter]
    fn max_connections_per_peer(&self) -> usize {
        self.cfg.max_connections_per_peer
    }
    #[setter]
    fn set_max_connections_per_peer(&mut self, v: usize) {
        self.cfg.max_connections_per_peer = v;
    }
    /// morio: join slots of multi-chunk transfers, all peers (default 65536).
    #[getter]
    fn max_joins(&self) -> usize {
        self.cfg.max_joins
    }
    #[setter]
    fn set_max_joins(&mut self, v: usize) {
        self.cfg.max_joins = v;
    }
    /// morio: join slots one peer may hold (default 4096).
    #[getter]
    fn max_joins_per_peer(&self) -> usize {
        self.cfg.max_joins_per_peer
    }
    #[setter]
    fn set_max_joins_per_peer(&mut self, v: usize) {
        self.cfg.max_joins_per_peer = v;
    }
    /// morio: inbound statuses kept, all peers (default 65536).
    #[getter]
    fn max_inbound_statuses(&self) -> usize {
        self.cfg.max_inbound_statuses
    }
    #[setter]
    fn set_max_inbound_statuses(&mut self, v: usize) {
        self.cfg.max_inbound_statuses = v;
    }
    /// morio: inbound statuses kept per peer (default 4096, as MORI).
    #[getter]
    fn max_inbound_statuses_per_peer(&self) -> usize {
        self.cfg.max_inbound_statuses_per_peer
    }
    #[setter]
    fn set_max_inbound_statuses_per_peer(&mut self, v: usize) {
        self.cfg.max_inbound_statuses_per_peer = v;
    }
    /// The same-host transport: "auto", "off", "require", or None (the environment's
    /// MORIO_SAME_HOST, else auto).
    #[getter]
    fn same_host(&self) -> Option<String> {
        self.cfg.same_host.map(|m| m.to_string())
    }

    #[setter]
    fn set_same_host(&mut self, v: Option<String>) -> PyResult<()> {
        self.cfg.same_host = match v {
            None => None,
            Some(s) => Some(s.parse().map_err(PyValueError::new_err)?),
        };
        Ok(())
    }

    /// Same-host GPU copies through IPC handles: True, False, or None (the environment's
    /// MORIO_GPU_IPC, else on).
    #[getter]
    fn gpu_ipc(&self) -> Option<bool> {
        self.cfg.gpu_ipc
    }

    #[setter]
    fn set_gpu_ipc(&mut self, v: Option<bool>) {
        self.cfg.gpu_ipc = v;
    }

    /// Data bytes of the shared-memory ring offered to each same-host connection (a power of
    /// two from 64 KiB to 16 MiB), or None (MORIO_SAME_HOST_RING_BYTES, else 1 MiB).
    #[getter]
    fn same_host_ring_bytes(&self) -> Option<usize> {
        self.cfg.same_host_ring_bytes
    }

    #[setter]
    fn set_same_host_ring_bytes(&mut self, v: Option<usize>) -> PyResult<()> {
        let old = self.cfg.same_host_ring_bytes;
        self.cfg.same_host_ring_bytes = v;
        if let Err(e) = self.cfg.validate() {
            self.cfg.same_host_ring_bytes = old;
            return Err(PyValueError::new_err(e.to_string()));
        }
        Ok(())
    }

    /// The newest protocol version the engine offers (rolling upgrades).
    #[getter]
    fn max_protocol_version(&self) -> u32 {
        self.cfg.max_protocol_version
    }

    #[setter]
    fn set_max_protocol_version(&mut self, v: u32) {
        self.cfg.max_protocol_version = v;
    }

    /// morio: the deployment secret (`bytes` or `str`, at least 16 bytes) every engine allowed
    /// to talk to this one shares; `None`: `MORIO_AUTH_SECRET` when set, else no
    /// authentication. Write-only: reading gives whether one is set.
    #[getter]
    fn auth_secret(&self) -> bool {
        self.cfg.auth_secret.is_some()
    }
    #[setter]
    fn set_auth_secret(&mut self, v: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.cfg.auth_secret = match v {
            None => None,
            Some(o) if o.is_none() => None,
            Some(o) => {
                let bytes: Vec<u8> = if let Ok(s) = o.extract::<String>() {
                    s.into_bytes()
                } else {
                    o.extract::<Vec<u8>>().map_err(|_| {
                        PyTypeError::new_err("auth_secret must be bytes, str or None")
                    })?
                };
                Some(morio::AuthSecret::new(bytes))
            }
        };
        Ok(())
    }

    /// `SO_SNDBUF` on data connections if > 0 (MORI default 32 MiB).
    #[getter]
    fn sock_sndbuf_bytes(&self) -> i64 {
        self.sndbuf
    }
    #[setter]
    fn set_sock_sndbuf_bytes(&mut self, v: i64) -> PyResult<()> {
        self.cfg.sock_sndbuf_bytes = bytes("sock_sndbuf_bytes", v)?;
        self.sndbuf = v;
        Ok(())
    }
    /// `SO_RCVBUF` on data connections if > 0 (MORI default 32 MiB).
    #[getter]
    fn sock_rcvbuf_bytes(&self) -> i64 {
        self.rcvbuf
    }
    #[setter]
    fn set_sock_rcvbuf_bytes(&mut self, v: i64) -> PyResult<()> {
        self.cfg.sock_rcvbuf_bytes = bytes("sock_rcvbuf_bytes", v)?;
        self.rcvbuf = v;
        Ok(())
    }
    /// Deadline of every transfer in ms (MORI default 30000; `<= 0`, MORI's "none", is
    /// taken as 24 h).
    #[getter]
    fn op_timeout_ms(&self) -> i64 {
        self.op_timeout_ms
    }
    #[setter]
    fn set_op_timeout_ms(&mut self, v: i64) {
        self.cfg.op_timeout = ms(v);
        self.op_timeout_ms = v;
    }
    /// `SO_KEEPALIVE` with the three settings below.
    #[getter]
    fn enable_keepalive(&self) -> bool {
        self.cfg.enable_keepalive
    }
    #[setter]
    fn set_enable_keepalive(&mut self, v: bool) {
        self.cfg.enable_keepalive = v;
    }
    /// `TCP_KEEPIDLE` in seconds (default 30).
    #[getter]
    fn keepalive_idle_sec(&self) -> u64 {
        self.cfg.keepalive_idle.as_secs()
    }
    #[setter]
    fn set_keepalive_idle_sec(&mut self, v: i64) -> PyResult<()> {
        self.cfg.keepalive_idle = secs("keepalive_idle_sec", v)?;
        Ok(())
    }
    /// `TCP_KEEPINTVL` in seconds (default 10).
    #[getter]
    fn keepalive_intvl_sec(&self) -> u64 {
        self.cfg.keepalive_intvl.as_secs()
    }
    #[setter]
    fn set_keepalive_intvl_sec(&mut self, v: i64) -> PyResult<()> {
        self.cfg.keepalive_intvl = secs("keepalive_intvl_sec", v)?;
        Ok(())
    }
    /// `TCP_KEEPCNT` (default 3).
    #[getter]
    fn keepalive_cnt(&self) -> u32 {
        self.cfg.keepalive_cnt
    }
    #[setter]
    fn set_keepalive_cnt(&mut self, v: i64) -> PyResult<()> {
        self.cfg.keepalive_cnt = u32::try_from(v)
            .map_err(|_| PyValueError::new_err(format!("keepalive_cnt must be >= 0, got {v}")))?;
        Ok(())
    }
    /// `TCP_NODELAY` on every connection (morio's lanes carry control and data).
    #[getter]
    fn enable_ctrl_nodelay(&self) -> bool {
        self.cfg.enable_ctrl_nodelay
    }
    #[setter]
    fn set_enable_ctrl_nodelay(&mut self, v: bool) {
        self.cfg.enable_ctrl_nodelay = v;
    }
    /// Lanes (data connections) per peer, 1..=16 (default 8).
    #[getter]
    fn num_data_conns(&self) -> usize {
        self.cfg.num_data_conns
    }
    #[setter]
    fn set_num_data_conns(&mut self, v: i64) -> PyResult<()> {
        self.cfg.num_data_conns = lanes("num_data_conns", v)?;
        Ok(())
    }
    /// Transfers of at least this many bytes are striped over all lanes (default 64 KiB).
    #[getter]
    fn striping_threshold_bytes(&self) -> usize {
        self.cfg.striping_threshold_bytes
    }
    #[setter]
    fn set_striping_threshold_bytes(&mut self, v: i64) -> PyResult<()> {
        self.cfg.striping_threshold_bytes = usize::try_from(v).map_err(|_| {
            PyValueError::new_err(format!("striping_threshold_bytes must be >= 0, got {v}"))
        })?;
        Ok(())
    }
    /// morio: shards (executor threads); None = one per allowed CPU, at most `num_data_conns`.
    #[getter]
    fn num_shards(&self) -> Option<usize> {
        self.cfg.num_shards
    }
    #[setter]
    fn set_num_shards(&mut self, v: Option<usize>) {
        self.cfg.num_shards = v;
    }
    /// morio: explicit CPUs to pin shards to (overrides `num_shards`).
    #[getter]
    fn cpus(&self) -> Option<Vec<usize>> {
        self.cfg.cpus.clone()
    }
    #[setter]
    fn set_cpus(&mut self, v: Option<Vec<usize>>) {
        self.cfg.cpus = v;
    }
    /// morio: pin shards to CPUs (off by default for library engines; see the README's
    /// "Several engines on one host").
    #[getter]
    fn pin_shards(&self) -> bool {
        self.cfg.pin_shards
    }
    #[setter]
    fn set_pin_shards(&mut self, v: bool) {
        self.cfg.pin_shards = v;
    }
    /// morio: largest chunk one frame carries (default 1 MiB).
    #[getter]
    fn chunk_bytes(&self) -> usize {
        self.cfg.chunk_bytes
    }
    #[setter]
    fn set_chunk_bytes(&mut self, v: usize) {
        self.cfg.chunk_bytes = v;
    }
    /// morio: largest chunk one frame carries to a same-host peer (default 8 MiB).
    #[getter]
    fn same_host_chunk_bytes(&self) -> usize {
        self.cfg.same_host_chunk_bytes
    }
    #[setter]
    fn set_same_host_chunk_bytes(&mut self, v: usize) {
        self.cfg.same_host_chunk_bytes = v;
    }
    /// morio: largest chunk one frame carries over TCP with GPU memory on either side
    /// (default 2 MiB).
    #[getter]
    fn gpu_chunk_bytes(&self) -> usize {
        self.cfg.gpu_chunk_bytes
    }
    #[setter]
    fn set_gpu_chunk_bytes(&mut self, v: usize) {
        self.cfg.gpu_chunk_bytes = v;
    }
    /// morio: lanes a transfer staged through GPU memory over TCP stripes over where each
    /// gets a whole `gpu_chunk_bytes` chunk, 1..=16, never fewer than `num_data_conns`; None
    /// (the default): twice `num_data_conns`, at most 16. Small batches keep
    /// `num_data_conns` lanes.
    #[getter]
    fn gpu_data_conns(&self) -> Option<usize> {
        self.cfg.gpu_data_conns
    }
    #[setter]
    fn set_gpu_data_conns(&mut self, v: Option<i64>) -> PyResult<()> {
        self.cfg.gpu_data_conns = v.map(|v| lanes("gpu_data_conns", v)).transpose()?;
        Ok(())
    }
    /// morio: large striped writes share their stripes between lanes.
    #[getter]
    fn share_stripes(&self) -> bool {
        self.cfg.share_stripes
    }
    #[setter]
    fn set_share_stripes(&mut self, v: bool) {
        self.cfg.share_stripes = v;
    }
    /// morio: payloads up to this size leave with their header in one syscall.
    #[getter]
    fn inline_write_bytes(&self) -> usize {
        self.cfg.inline_write_bytes
    }
    #[setter]
    fn set_inline_write_bytes(&mut self, v: usize) {
        self.cfg.inline_write_bytes = v;
    }
    /// morio: busy-poll each shard this many µs before it parks (0 = off, the default).
    #[getter]
    fn spin_us(&self) -> u64 {
        self.cfg
            .spin_before_park
            .map_or(0, |d| d.as_micros() as u64)
    }
    #[setter]
    fn set_spin_us(&mut self, v: u64) {
        self.cfg.spin_before_park = (v > 0).then(|| Duration::from_micros(v));
    }
    /// morio: shards poll their sockets and rings this many µs after their last work, and
    /// stop while preempted (0 = off; None, the default: MORIO_BUSY_POLL_US, else 100 on
    /// hosts of 8 CPUs or more).
    #[getter]
    fn busy_poll_us(&self) -> Option<u64> {
        self.cfg.busy_poll.map(|d| d.as_micros() as u64)
    }
    #[setter]
    fn set_busy_poll_us(&mut self, v: Option<u64>) {
        self.cfg.busy_poll = v.map(Duration::from_micros);
    }
    /// morio: how long an accepted connection may take to send its HELLO, in ms.
    #[getter]
    fn handshake_timeout_ms(&self) -> u64 {
        self.cfg.handshake_timeout.as_millis() as u64
    }
    #[setter]
    fn set_handshake_timeout_ms(&mut self, v: u64) {
        self.cfg.handshake_timeout = Duration::from_millis(v);
    }
    /// morio: pinned host memory for GPU staging, for the whole engine (default 64 MiB),
    /// pinned once GPU memory is registered.
    #[getter]
    fn gpu_staging_bytes(&self) -> usize {
        self.cfg.gpu_staging_bytes
    }
    #[setter]
    fn set_gpu_staging_bytes(&mut self, v: usize) {
        self.cfg.gpu_staging_bytes = v;
    }
    /// morio: one staging slot, the unit of the GPU copy pipeline (default 2 MiB; at most:
    /// smaller where the staging split over many shards would hold fewer than two per pool).
    #[getter]
    fn gpu_slot_bytes(&self) -> usize {
        self.cfg.gpu_slot_bytes
    }
    #[setter]
    fn set_gpu_slot_bytes(&mut self, v: usize) {
        self.cfg.gpu_slot_bytes = v;
    }

    fn __repr__(&self) -> String {
        let c = &self.cfg;
        format!(
            "TcpBackendConfig(sock_sndbuf_bytes={}, sock_rcvbuf_bytes={}, op_timeout_ms={}, \
             enable_keepalive={}, keepalive_idle_sec={}, keepalive_intvl_sec={}, keepalive_cnt={}, \
             enable_ctrl_nodelay={}, num_data_conns={}, striping_threshold_bytes={}, \
             num_shards={:?}, cpus={:?}, pin_shards={}, chunk_bytes={}, spin_us={}, auth={})",
            self.sndbuf,
            self.rcvbuf,
            self.op_timeout_ms,
            py_bool(c.enable_keepalive),
            c.keepalive_idle.as_secs(),
            c.keepalive_intvl.as_secs(),
            c.keepalive_cnt,
            py_bool(c.enable_ctrl_nodelay),
            c.num_data_conns,
            c.striping_threshold_bytes,
            c.num_shards,
            c.cpus,
            py_bool(c.pin_shards),
            c.chunk_bytes,
            self.spin_us(),
            py_bool(c.auth_secret.is_some()),
        )
    }
}

/// A lane count from Python, 1..=16 (MORI's range), or a `ValueError` naming `what`.
fn lanes(what: &str, v: i64) -> PyResult<usize> {
    if !(1..=16).contains(&v) {
        return Err(PyValueError::new_err(format!(
            "TCP {what} must be in [1, 16], got {v}"
        )));
    }
    Ok(v as usize)
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// MORI's RDMA settings, accepted so code that builds one runs; `create_backend` with it
/// raises `NotImplementedError` (morio implements TCP only).
#[pyclass(module = "morio", name = "RdmaBackendConfig", get_all, set_all)]
pub struct PyRdmaBackendConfig {
    qp_per_transfer: i64,
    post_batch_size: i64,
    num_worker_threads: i64,
    poll_cq_mode: Py<PyAny>,
    enable_notification: bool,
    notif_per_qp: u32,
    enable_transfer_chunking: bool,
    chunk_bytes: usize,
    max_chunks_per_transfer: i64,
    num_nics_per_transfer: i64,
    max_send_wr: i64,
    max_cqe_num: i64,
    max_msg_sge: i64,
}

#[pymethods]
impl PyRdmaBackendConfig {
    #[new]
    #[pyo3(signature = (
        qp_per_transfer = 1, post_batch_size = -1, num_worker_threads = -1, poll_cq_mode = None,
        enable_notification = true, notif_per_qp = 1024, enable_transfer_chunking = false,
        chunk_bytes = 65536, max_chunks_per_transfer = 64, num_nics_per_transfer = 1,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        qp_per_transfer: i64,
        post_batch_size: i64,
        num_worker_threads: i64,
        poll_cq_mode: Option<Py<PyAny>>,
        enable_notification: bool,
        notif_per_qp: u32,
        enable_transfer_chunking: bool,
        chunk_bytes: usize,
        max_chunks_per_transfer: i64,
        num_nics_per_transfer: i64,
    ) -> PyResult<Self> {
        let poll_cq_mode = match poll_cq_mode {
            Some(p) => p,
            None => crate::enums::get(py)?.poll_cq_mode.getattr(py, "POLLING")?,
        };
        Ok(Self {
            qp_per_transfer,
            post_batch_size,
            num_worker_threads,
            poll_cq_mode,
            enable_notification,
            notif_per_qp,
            enable_transfer_chunking,
            chunk_bytes,
            max_chunks_per_transfer,
            num_nics_per_transfer,
            max_send_wr: 0,
            max_cqe_num: 0,
            max_msg_sge: 0,
        })
    }
}

/// MORI's XGMI settings (accepted; `create_backend` with it raises `NotImplementedError`).
#[pyclass(module = "morio", name = "XgmiBackendConfig", get_all, set_all)]
#[derive(Clone)]
pub struct PyXgmiBackendConfig {
    num_streams: i64,
    num_events: i64,
}

#[pymethods]
impl PyXgmiBackendConfig {
    #[new]
    #[pyo3(signature = (num_streams = 64, num_events = 64))]
    fn new(num_streams: i64, num_events: i64) -> Self {
        Self {
            num_streams,
            num_events,
        }
    }
}

/// MORI's FABRIC settings (accepted; `create_backend` with it raises `NotImplementedError`).
#[pyclass(module = "morio", name = "FabricBackendConfig", get_all, set_all)]
#[derive(Clone)]
pub struct PyFabricBackendConfig {
    num_streams: i64,
    num_events: i64,
}

#[pymethods]
impl PyFabricBackendConfig {
    #[new]
    #[pyo3(signature = (num_streams = 64, num_events = 64))]
    fn new(num_streams: i64, num_events: i64) -> Self {
        Self {
            num_streams,
            num_events,
        }
    }
}
