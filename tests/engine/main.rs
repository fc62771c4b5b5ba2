//! Two engines in one process over loopback: MORI-IO's TCP test cases and morio's own.

mod admission;
mod auth;
mod backend_lifecycle;
mod basic;
mod chaos;
mod common;
mod concurrency;
mod connect;
mod express;
mod failures;
mod fence;
mod gpu;
mod gpu_ahead;
mod gpu_landing;
mod gpu_same_host;
mod gpu_vmm;
mod host;
mod in_process;
mod ipv6;
mod mori_cases;
mod peer_stats;
mod same_host;
mod same_host_hostile;
mod same_host_ring;
mod sizes;
mod spin;
