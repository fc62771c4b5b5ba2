//! Status codes as they travel on the wire (numerically equal to MORI-IO's `StatusCode`).

/// The transfer succeeded.
pub const SUCCESS: u32 = 0;
/// Bad arguments (ranges, shapes).
pub const ERR_INVALID_ARGS: u32 = 11;
/// A memory region or engine is unknown.
pub const ERR_NOT_FOUND: u32 = 12;
/// Connection lost, timeout, duplicate id, shutdown.
pub const ERR_BAD_STATE: u32 = 14;
/// A GPU copy failed.
pub const ERR_GPU_OP: u32 = 15;

/// Whether `code` may end a transfer (success or one of MORI's error codes).
pub fn is_terminal(code: u32) -> bool {
    code == SUCCESS || (11..=15).contains(&code)
}
