//! HIP backend (AMD GPUs) over hip-sys: being written; until then it reports itself unavailable.

use super::GpuError;

/// The HIP runtime of this process.
#[derive(Debug)]
pub struct HipRuntime;

impl HipRuntime {
    /// Not yet implemented.
    pub fn new() -> Result<Self, GpuError> {
        Err(GpuError::Unavailable(
            "HIP backend not implemented yet".into(),
        ))
    }
}
