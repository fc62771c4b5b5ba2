//! Discovery on a real etcd (Debian's `etcd-server`), started by each test on free loopback
//! ports with a temporary data directory and killed after: engines publish under a lease, a
//! watcher registers and forgets them, transfers follow. Production settings too: etcd's
//! user and password authentication (enabled through etcd-client's own API) and TLS (a CA
//! and certificates made at test time with the `openssl` command; those tests say so and
//! pass without it).
//!
//! One module per concern: `server` (an etcd of the test's own), `pki` (its certificates),
//! `common` (engines, buffers, transfers through what etcd names), `discovery` (publish,
//! look up, watch), `serve` (`morio serve` publishing itself), `outages` (etcd restarts and
//! lost leases) and `security` (authentication and TLS).

mod common;
mod discovery;
mod outages;
mod pki;
mod security;
mod serve;
mod server;
