//! morio: placeholder during bring-up.
pub mod proto;
