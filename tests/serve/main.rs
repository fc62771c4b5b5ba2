//! `morio serve` end to end: start the binary, fetch its descriptors from the HTTP control
//! port (msgpack and JSON), move verified bytes into and out of its memory, read its stats,
//! metrics (parsed as Prometheus text) and health, ask through `morio ctl`, survive a flood
//! of silent connections, require proofs with a secret, stop it with SIGTERM.
//!
//! One module per concern: `common` (the descriptors' wire form, a plain HTTP client, proofs,
//! Prometheus parsing, `morio ctl`), `end_to_end` (a node's whole life over loopback),
//! `config` (`--dump-config` and bad configs), `auth` (a node with a secret), `ipv6` (a node
//! on IPv6 loopback) and `stopped` (a node stopped with SIGSTOP while a write fails).

mod auth;
mod common;
mod config;
mod end_to_end;
mod ipv6;
mod stopped;
