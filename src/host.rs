//! What an engine needs from the machine, checked up front: io_uring (blocked by the default
//! seccomp profiles of Docker and containerd) and enough locked memory.

use crate::error::EngineError;

/// Check that this host (or container) can run an engine's shards; the error says what to
/// change. `create_backend` checks the same before it starts anything; this lets a program
/// (or `morio check`) find out at its own start.
pub fn check_host() -> Result<(), EngineError> {
    morio_shards::preflight::check().map_err(|e| EngineError::Shards(e.into()))
}

/// Whether engines of this process could use the same-host transport with engines of the
/// same user on this host (ARCHITECTURE.md, "Transports"); `Err` says why not. Not a
/// requirement: without it, those engines use TCP.
pub fn check_same_host() -> Result<(), String> {
    crate::transport::local::readiness()
}
