//! Engines as two hosts: each in a network namespace of its own (made here, with `ip netns`),
//! joined by a veth pair, so bytes cross a real link (1500-byte MTU, the kernel's full TCP
//! path between two stacks) and the link can be cut, narrowed or its MTU changed. Checks that
//! every transfer shape moves verified bytes over IPv4 and IPv6, that a cut link fails the
//! transfers on it within their deadline (no hang, no lost completion) and that the peer is
//! reached again once the link is back, and that a link too slow for a deadline fails only
//! what it must.
//!
//! Needs root (namespaces) and iproute2's `ip` and `tc`; without them every test says it is
//! skipped and passes. Each engine is made on a thread that joined its namespace first, so its
//! shards (threads it spawns) and sockets live there; the test's own thread submits and waits.
//!
//! One module per concern: `net` (the namespaces, their link, and engines made in them),
//! `common` (the engines' config, filled buffers, waiting, round trips), `links` (every shape
//! over the link, a cut link, a slow link), `stale` (a transfer failed on a cut or slow link
//! never lands over a later one) and `hosts` (pods with PID namespaces of their own, an engine
//! listening on every interface).

mod common;
mod hosts;
mod links;
mod net;
mod stale;
