"""morio: a thread-per-core TCP transfer engine with MORI-IO's Python API.

A MORI-IO user switches by changing the import line::

    from mori.io import IOEngine, IOEngineConfig, BackendType, TcpBackendConfig  # before
    from morio import IOEngine, IOEngineConfig, BackendType, TcpBackendConfig    # after

(``TransferStatus``, which MORI exports from ``mori.cpp``, is here too.) Memory registers
from torch tensors (CPU and CUDA), DLPack producers (numpy, cupy, JAX) and writable
buffers; batches take lists or numpy int64 arrays. Every submit and wait releases the GIL.
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
    fabric_alloc,
    fabric_free,
    set_log_level,
    set_wait_spin_us,
)
from ._morio import _shutdown_all

# Stop every engine's shards before the interpreter goes away (they may log through it).
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
    "fabric_alloc",
    "fabric_free",
    "set_log_level",
    "set_wait_spin_us",
]
