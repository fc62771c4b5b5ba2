"""morio: a thread-per-core TCP transfer engine with MORI-IO's Python API.

A MORI-IO user switches by changing the import line::

    from mori.io import IOEngine, IOEngineConfig, BackendType, TcpBackendConfig  # before
    from morio import IOEngine, IOEngineConfig, BackendType, TcpBackendConfig    # after

(``TransferStatus``, which MORI exports from ``mori.cpp``, is here too.) Memory registers
from torch tensors (CPU and CUDA), DLPack producers (numpy, cupy, JAX) and writable
buffers; batches take lists or numpy int64 arrays. Every submit and wait releases the GIL.
``Discovery`` publishes engines in etcd and keeps their peers registered.
"""

import atexit as _atexit

from ._morio import (
    GPU_RUNTIMES,
    BackendType,
    EngineDesc,
    FabricBackendConfig,
    IOEngine,
    IOEngineConfig,
    IOEngineSession,
    MemoryDesc,
    MemoryLocationType,
    PollCqMode,
    RdmaBackendConfig,
    StatusCode,
    TcpBackendConfig,
    TransferStatus,
    XgmiBackendConfig,
    __version__,
    check_host,
    gpu_ipc_unavailable,
    same_host_unavailable,
    same_host_rings_unavailable,
    fabric_alloc,
    fabric_free,
    set_log_level,
    set_wait_spin_adaptive,
    set_wait_spin_us,
)
from ._morio import _shutdown_all
from ._aio import wait_all_async, wait_async

try:
    from ._morio import Discovery
except ImportError:  # built without the `etcd` feature
    pass

# Close discovery handles (their leases go) and stop every engine's shards before the
# interpreter goes away (they may log through it).
_atexit.register(_shutdown_all)

__all__ = [
    "BackendType",
    "EngineDesc",
    "FabricBackendConfig",
    "GPU_RUNTIMES",
    "IOEngine",
    "IOEngineConfig",
    "IOEngineSession",
    "MemoryDesc",
    "MemoryLocationType",
    "PollCqMode",
    "RdmaBackendConfig",
    "StatusCode",
    "TcpBackendConfig",
    "TransferStatus",
    "XgmiBackendConfig",
    "__version__",
    "check_host",
    "gpu_ipc_unavailable",
    "same_host_unavailable",
    "same_host_rings_unavailable",
    "fabric_alloc",
    "fabric_free",
    "set_log_level",
    "set_wait_spin_adaptive",
    "set_wait_spin_us",
    "wait_all_async",
    "wait_async",
]
if "Discovery" in globals():
    __all__.append("Discovery")
