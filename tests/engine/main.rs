//! Two engines in one process over loopback: MORI-IO's TCP test cases and morio's own.

mod common;
mod basic;
