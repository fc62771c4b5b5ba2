"""Type stubs of morio's extension module (re-exported by ``morio``)."""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from typing import Any, Generator, Optional, Protocol, Union

__version__: str
GPU_RUNTIMES: list[str]

class _SupportsIndexArray(Protocol):
    """A 1-D integer array (numpy int64/uint64/int32/uint32) read through the buffer protocol."""
    def __len__(self) -> int: ...

Offsets = Union[Sequence[int], _SupportsIndexArray]

class StatusCode(enum.IntEnum):
    """Transfer outcome codes (MORI-IO's values; errors are > 10)."""
    SUCCESS = 0
    INIT = 1
    IN_PROGRESS = 2
    ERR_INVALID_ARGS = 11
    ERR_NOT_FOUND = 12
    ERR_RDMA_OP = 13
    ERR_BAD_STATE = 14
    ERR_GPU_OP = 15

class BackendType(enum.IntEnum):
    """Backend kinds (morio implements TCP)."""
    Unknown = 0
    XGMI = 1
    RDMA = 2
    TCP = 3
    FABRIC = 4

class MemoryLocationType(enum.IntEnum):
    """Where registered memory lives."""
    Unknown = 0
    CPU = 1
    GPU = 2

class PollCqMode(enum.IntEnum):
    """RDMA completion polling (accepted, unused)."""
    POLLING = 0
    EVENT = 1

class IOEngineConfig:
    """Where an engine listens and what it advertises."""
    host: str
    port: int
    advertise_host: Optional[str]
    def __init__(self, host: str = "", port: int = 0, *, advertise_host: Optional[str] = None) -> None: ...

class TcpBackendConfig:
    """The TCP backend's settings: MORI-IO's keywords and defaults, then morio's (keyword-only).

    Invalid values raise ValueError here and at ``create_backend``.
    """
    sock_sndbuf_bytes: int
    sock_rcvbuf_bytes: int
    op_timeout_ms: int
    enable_keepalive: bool
    keepalive_idle_sec: int
    keepalive_intvl_sec: int
    keepalive_cnt: int
    enable_ctrl_nodelay: bool
    num_data_conns: int
    striping_threshold_bytes: int
    num_shards: Optional[int]
    cpus: Optional[list[int]]
    pin_shards: bool
    chunk_bytes: int
    same_host_chunk_bytes: int
    gpu_chunk_bytes: int
    gpu_data_conns: Optional[int]
    share_stripes: bool
    inline_write_bytes: int
    spin_us: int
    busy_poll_us: Optional[int]
    handshake_timeout_ms: int
    gpu_staging_bytes: int
    gpu_slot_bytes: int
    auth_secret: bool  # write bytes | str | None; reads whether a secret is set
    max_handshakes: int
    max_connections: int
    max_connections_per_peer: int
    max_joins: int
    max_joins_per_peer: int
    max_inbound_statuses: int
    max_inbound_statuses_per_peer: int
    same_host: Optional[str]  # "auto" | "off" | "require" | None (MORIO_SAME_HOST, else auto)
    max_protocol_version: int
    gpu_ipc: Optional[bool]  # same-host GPU copies through IPC handles; None: MORIO_GPU_IPC, else on
    same_host_ring_bytes: Optional[int]  # same-host ring size (power of two, 64 KiB..16 MiB); None: env, else 1 MiB
    def __init__(
        self,
        sock_sndbuf_bytes: int = 33554432,
        sock_rcvbuf_bytes: int = 33554432,
        op_timeout_ms: int = 30000,
        enable_keepalive: bool = True,
        keepalive_idle_sec: int = 30,
        keepalive_intvl_sec: int = 10,
        keepalive_cnt: int = 3,
        enable_ctrl_nodelay: bool = True,
        num_data_conns: int = 8,
        striping_threshold_bytes: int = 65536,
        *,
        num_shards: Optional[int] = None,
        cpus: Optional[Sequence[int]] = None,
        pin_shards: Optional[bool] = None,
        chunk_bytes: Optional[int] = None,
        same_host_chunk_bytes: Optional[int] = None,
        gpu_chunk_bytes: Optional[int] = None,
        gpu_data_conns: Optional[int] = None,
        share_stripes: Optional[bool] = None,
        inline_write_bytes: Optional[int] = None,
        spin_us: int = 0,
        busy_poll_us: Optional[int] = None,
        handshake_timeout_ms: Optional[int] = None,
        gpu_staging_bytes: Optional[int] = None,
        gpu_slot_bytes: Optional[int] = None,
        auth_secret: Union[bytes, str, None] = None,
        max_handshakes: Optional[int] = None,
        max_connections: Optional[int] = None,
        max_connections_per_peer: Optional[int] = None,
        max_joins: Optional[int] = None,
        max_joins_per_peer: Optional[int] = None,
        max_inbound_statuses: Optional[int] = None,
        max_inbound_statuses_per_peer: Optional[int] = None,
        same_host: Optional[str] = None,
        max_protocol_version: Optional[int] = None,
        gpu_ipc: Optional[bool] = None,
        same_host_ring_bytes: Optional[int] = None,
    ) -> None: ...

class RdmaBackendConfig:
    """MORI's RDMA settings; accepted, but morio implements TCP only."""
    qp_per_transfer: int
    post_batch_size: int
    num_worker_threads: int
    poll_cq_mode: PollCqMode
    enable_notification: bool
    notif_per_qp: int
    enable_transfer_chunking: bool
    chunk_bytes: int
    max_chunks_per_transfer: int
    num_nics_per_transfer: int
    max_send_wr: int
    max_cqe_num: int
    max_msg_sge: int
    def __init__(
        self,
        qp_per_transfer: int = 1,
        post_batch_size: int = -1,
        num_worker_threads: int = -1,
        poll_cq_mode: Optional[PollCqMode] = None,
        enable_notification: bool = True,
        notif_per_qp: int = 1024,
        enable_transfer_chunking: bool = False,
        chunk_bytes: int = 65536,
        max_chunks_per_transfer: int = 64,
        num_nics_per_transfer: int = 1,
    ) -> None: ...

class XgmiBackendConfig:
    """MORI's XGMI settings; accepted, but morio implements TCP only."""
    num_streams: int
    num_events: int
    def __init__(self, num_streams: int = 64, num_events: int = 64) -> None: ...

class FabricBackendConfig:
    """MORI's FABRIC settings; accepted, but morio implements TCP only."""
    num_streams: int
    num_events: int
    def __init__(self, num_streams: int = 64, num_events: int = 64) -> None: ...

class EngineDesc:
    """The identity of an engine: ``pack()`` it to peers, who ``register_remote_engine(EngineDesc.unpack(b))``."""
    @property
    def key(self) -> str: ...
    @property
    def node_id(self) -> str: ...
    @property
    def hostname(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def pid(self) -> int: ...
    def pack(self) -> bytes: ...
    @classmethod
    def unpack(cls, data: bytes) -> EngineDesc: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class MemoryDesc:
    """A registered memory region: what a peer needs to read or write it."""
    def __init__(self) -> None: ...
    @property
    def engine_key(self) -> str: ...
    @property
    def id(self) -> int: ...
    @property
    def device_id(self) -> int: ...
    @property
    def device_bus_id(self) -> str: ...
    @property
    def data(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def loc(self) -> MemoryLocationType: ...
    @property
    def ipc_handle(self) -> bytes: ...
    @property
    def numa_node(self) -> int: ...
    @property
    def remote_access(self) -> bool:
        """Carries an access key: peers may reach it (False: local_only, or MORI's form)."""
    def pack(self) -> bytes:
        """MORI's 15 fields, then the 16-byte access key as a 16th when there is one."""
    @classmethod
    def unpack(cls, data: bytes) -> MemoryDesc:
        """15 fields (MORI's form, no access key) or 16."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class TransferStatus:
    """Completion object of one transfer (``TransferStatus()`` makes one in INIT)."""
    def __init__(self) -> None: ...
    def Code(self) -> StatusCode: ...
    def Message(self) -> str: ...
    def Update(self, code: int, message: str) -> None:
        """Set code and message unless the status already holds an error (first error wins)."""
    def Init(self) -> bool: ...
    def InProgress(self) -> bool: ...
    def Succeeded(self) -> bool: ...
    def Failed(self) -> bool: ...
    def SetCode(self, code: int) -> None: ...
    def SetMessage(self, message: str) -> None: ...
    def __await__(self) -> Generator[Any, None, StatusCode]:
        """morio: ``await status`` in a running asyncio loop: its code once not IN_PROGRESS,
        without blocking the loop (RuntimeError outside a running loop)."""
        ...
    def Wait(self) -> StatusCode:
        """Block (GIL released, Ctrl-C honoured) until not IN_PROGRESS."""
    def WaitFor(self, timeout_ms: int = -1) -> StatusCode:
        """< 0 blocks, 0 polls, > 0 waits at most that long (may return IN_PROGRESS)."""

class IOEngineSession:
    """Transfers over one (local, remote) memory pair, by offsets only."""
    def allocate_transfer_uid(self) -> int: ...
    def read(self, local_offset: int, remote_offset: int, size: int, transfer_uid: int) -> TransferStatus: ...
    def write(self, local_offset: int, remote_offset: int, size: int, transfer_uid: int) -> TransferStatus: ...
    def batch_read(self, local_offsets: Offsets, remote_offsets: Offsets, sizes: Offsets, transfer_uid: int) -> TransferStatus: ...
    def batch_write(self, local_offsets: Offsets, remote_offsets: Offsets, sizes: Offsets, transfer_uid: int) -> TransferStatus: ...
    def alive(self) -> bool: ...

class IOEngine:
    """One engine per process endpoint, named by a unique key (MORI-IO's IOEngine)."""
    def __init__(self, key: str, config: IOEngineConfig) -> None: ...
    def get_engine_desc(self) -> EngineDesc: ...
    def create_backend(self, type: BackendType, config: Optional[TcpBackendConfig] = None) -> None:
        """TCP only: other types raise NotImplementedError."""
    def remove_backend(self, type: BackendType) -> None: ...
    def register_remote_engine(self, engine_desc: EngineDesc) -> None: ...
    def connect_remote_engine(self, remote_key: str, timeout_ms: int = 10000) -> list[str]:
        """Open every connection to a registered peer now (not on its first transfer) and
        wait until each is up; each lane's transport ("tcp", "same-host", "same-host-ring").
        Raises ConnectionError when a lane cannot be opened in time, ValueError for an
        unknown key."""
        ...
    def deregister_remote_engine(self, engine_desc: EngineDesc) -> None: ...
    def register_memory(self, ptr: int, size: int, device_id: int, mem_loc: MemoryLocationType, *, local_only: bool = False) -> MemoryDesc:
        """Register raw memory; the caller keeps it valid until deregister_memory.

        local_only: no peer may read or write it (still the local side of this engine's transfers)."""
    def register_torch_tensor(self, tensor: Any, *, local_only: bool = False) -> MemoryDesc:
        """A contiguous CPU or CUDA torch.Tensor; the registration keeps it alive."""
    def register_array(self, array: Any, *, local_only: bool = False) -> MemoryDesc:
        """A torch tensor, a DLPack producer (numpy, cupy) or a writable buffer; kept alive."""
    def deregister_memory(self, mem_desc: MemoryDesc) -> None: ...
    def allocate_transfer_uid(self) -> int: ...
    def read(self, local_dest_mem_desc: MemoryDesc, local_offset: int, remote_src_mem_desc: MemoryDesc, remote_offset: int, size: int, transfer_uid: int) -> TransferStatus: ...
    def write(self, local_src_mem_desc: MemoryDesc, local_offset: int, remote_dest_mem_desc: MemoryDesc, remote_offset: int, size: int, transfer_uid: int) -> TransferStatus: ...
    def batch_read(self, local_mem_descs: Sequence[MemoryDesc], local_offsets: Sequence[Offsets], remote_mem_descs: Sequence[MemoryDesc], remote_offsets: Sequence[Offsets], sizes: Sequence[Offsets], transfer_uids: Offsets) -> list[TransferStatus]: ...
    def batch_write(self, local_mem_descs: Sequence[MemoryDesc], local_offsets: Sequence[Offsets], remote_mem_descs: Sequence[MemoryDesc], remote_offsets: Sequence[Offsets], sizes: Sequence[Offsets], transfer_uids: Offsets) -> list[TransferStatus]: ...
    def create_session(self, local_mem_desc: MemoryDesc, remote_mem_desc: MemoryDesc) -> Optional[IOEngineSession]: ...
    def pop_inbound_transfer_status(self, remote_key: str, transfer_uid: int) -> Optional[TransferStatus]: ...
    def wait_inbound_transfer_status(self, remote_key: str, transfer_uid: int, timeout_ms: int = -1) -> Optional[TransferStatus]:
        """morio: pop_inbound_transfer_status, waiting at most timeout_ms (-1: without end)
        for the transfer to end here; None once the time is up."""
        ...
    def wait_all(self, statuses: Sequence[Optional[TransferStatus]], timeout_ms: int = -1) -> StatusCode: ...
    def close(self) -> None:
        """Stop the engine now; transfers in flight end with ERR_BAD_STATE."""
    def __enter__(self) -> IOEngine: ...
    def __exit__(self, *exc: object) -> bool: ...
    def num_shards(self) -> int: ...
    def shard_cpus(self) -> list[Optional[int]]: ...
    def stats(self) -> list[dict[str, Any]]:
        """morio: per-shard counters; each dict's "peers" holds that shard's per-peer counters."""
    def peer_stats(self) -> dict[str, dict[str, Any]]:
        """morio: counters per peer (engine key), summed over shards; "lanes" maps a lane
        index to {"connects", "failures"}. At most 1024 peers per shard, later ones under
        "_other"."""
    def metrics(self, *, peers: bool = True) -> str:
        """morio: the Prometheus text exposition (version 0.0.4) of the engine's statistics;
        peers=False leaves out the per-peer families (morio_peer_*, labelled with peer keys)."""

class Discovery:
    """morio: discovery on etcd. Engines publish their EngineDesc and named MemoryDescs under
    ``{prefix}/engines/{key}`` and ``{prefix}/regions/{key}/{name}`` on a lease this handle
    keeps alive; closing it (or exiting) revokes the lease. Every call releases the GIL.

    A production etcd: ``user`` and ``password`` for its authentication; ``ca_file`` (the PEM
    CA of its TLS certificate) and, where it asks clients for one, ``cert_file`` and
    ``key_file``: paths, read at connect.

    Errors: ConnectionError when etcd is unreachable, does not answer in time or the TLS
    handshake fails; PermissionError when etcd refuses the user or password (or asks for a
    user and none is given); OSError naming a TLS file that cannot be read or holds no PEM;
    ValueError for bad names or options; RuntimeError on a closed handle.
    """
    def __init__(
        self,
        endpoints: Union[str, Sequence[str]],
        prefix: str = "/morio",
        *,
        lease_ttl_s: Optional[int] = None,
        connect_timeout_s: Optional[float] = None,
        request_timeout_s: Optional[float] = None,
        user: Optional[str] = None,
        password: Optional[str] = None,
        ca_file: Optional[Union[str, os.PathLike[str]]] = None,
        cert_file: Optional[Union[str, os.PathLike[str]]] = None,
        key_file: Optional[Union[str, os.PathLike[str]]] = None,
        connect_peers: bool = False,
    ) -> None:
        """Connect (``"host:port"`` or URLs); defaults: TTL 10 s, timeouts 5 s, no user, no TLS.
        ``connect_peers``: ``watch`` also opens every connection to each peer it registers."""
    @property
    def prefix(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def publish(
        self,
        engine: IOEngine,
        regions: Union[dict[str, MemoryDesc], Sequence[tuple[str, MemoryDesc]], None] = None,
    ) -> None:
        """Publish the engine (after create_backend) and its named regions; again replaces them."""
    def lookup(self, key: str) -> Optional[EngineDesc]: ...
    def regions(self, key: str) -> dict[str, MemoryDesc]: ...
    def watch(self, engine: IOEngine) -> None:
        """Register every published peer on ``engine`` now and later; deregister those that go."""
    def close(self) -> None:
        """Revoke the lease (the published keys go at once) and stop watching."""
    def __enter__(self) -> Discovery: ...
    def __exit__(self, *exc: object) -> bool: ...

def same_host_unavailable() -> Optional[str]: ...
def same_host_rings_unavailable() -> Optional[str]: ...
def gpu_ipc_unavailable() -> Optional[str]:
    """None when GPU memory moves device to device between engines of this host, else why not."""
def check_host() -> None:
    """Raise RuntimeError saying what to change if this host cannot run engines."""
    ...

def set_log_level(level: str) -> None:
    """trace, debug, info, warning, error, critical or off (env MORIO_LOG_LEVEL sets it at import)."""
def set_wait_spin_us(us: int) -> None:
    """How long waits spin before sleeping, process-wide (default: adapted to recent waits)."""
def set_wait_spin_adaptive() -> None:
    """Let waits spin as long as recent completion times justify (the default)."""
def fabric_alloc(size: int, device: int) -> int:
    """MORI's FABRIC allocator: raises NotImplementedError (morio implements TCP only)."""
def fabric_free(ptr: int) -> None:
    """MORI's FABRIC allocator: raises NotImplementedError (morio implements TCP only)."""
def _shutdown_all() -> None: ...

class _Notifier:
    """Internal: the eventfd one asyncio loop watches (see ``morio._aio``)."""
    def __init__(self) -> None: ...
    def fileno(self) -> int: ...
    def watch(self, status: TransferStatus) -> int: ...
    def drain(self) -> list[int]: ...
