//! `IOEngine.stats()` and `IOEngine.peer_stats()`: the engine's counters as Python dicts.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use morio::{EngineStats, PeerStats, ShardStats};

/// One shard's counters; `peers`: its per-peer counters by engine key.
fn shard<'py>(py: Python<'py>, s: &ShardStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shard", s.shard)?;
    d.set_item("transfers_ok", s.transfers_ok)?;
    d.set_item("transfers_failed", s.transfers_failed)?;
    d.set_item("bytes_sent", s.bytes_sent)?;
    d.set_item("bytes_received", s.bytes_received)?;
    d.set_item("inbound_transfers", s.inbound_transfers)?;
    d.set_item("inbound_bytes_written", s.inbound_bytes_written)?;
    d.set_item("inbound_bytes_read", s.inbound_bytes_read)?;
    d.set_item("gpu_staging_bytes", s.gpu_staging_bytes)?;
    d.set_item("gpu_staging_peak_bytes", s.gpu_staging_peak_bytes)?;
    d.set_item("gpu_staged_bytes", s.gpu_staged_bytes)?;
    d.set_item("gpu_ipc_bytes", s.gpu_ipc_bytes)?;
    d.set_item("gpu_ipc_declined", s.gpu_ipc_declined)?;
    d.set_item("gpu_overlapped_landings", s.gpu_overlapped_landings)?;
    d.set_item("gpu_copies_ahead", s.gpu_copies_ahead)?;
    d.set_item("busy_poll_backoffs", s.busy_poll_backoffs)?;
    d.set_item("busy_poll_handoffs", s.busy_poll_handoffs)?;
    d.set_item("same_host_doorbells", s.same_host_doorbells)?;
    d.set_item("same_host_ring_full_waits", s.same_host_ring_full_waits)?;
    d.set_item("inbound_writes_dropped", s.inbound_writes_dropped)?;
    d.set_item("writes_fenced", s.writes_fenced)?;
    d.set_item("fences_timed_out", s.fences_timed_out)?;
    d.set_item("finishes_held", s.finishes_held)?;
    d.set_item("express_writes", s.express_writes)?;
    d.set_item("express_reads", s.express_reads)?;
    d.set_item("lane_connects", s.lane_connects)?;
    d.set_item("lane_connects_same_host", s.lane_connects_same_host)?;
    d.set_item("lane_connects_ring", s.lane_connects_ring)?;
    d.set_item("lane_failures", s.lane_failures)?;
    d.set_item("latency_us_p50", s.latency_us.value_at_quantile(0.5))?;
    d.set_item("latency_us_p99", s.latency_us.value_at_quantile(0.99))?;
    let peers = PyDict::new(py);
    for (k, p) in s.peers.iter() {
        peers.set_item(k, peer(py, p)?)?;
    }
    d.set_item("peers", peers)?;
    Ok(d)
}

/// One peer's counters; `lanes`: lane index to `{"connects", "failures"}`.
fn peer<'py>(py: Python<'py>, p: &PeerStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("transfers_ok", p.transfers_ok)?;
    d.set_item("transfers_failed", p.transfers_failed)?;
    d.set_item("bytes_sent", p.bytes_sent)?;
    d.set_item("bytes_received", p.bytes_received)?;
    d.set_item("inbound_transfers", p.inbound_transfers)?;
    d.set_item("inbound_bytes_written", p.inbound_bytes_written)?;
    d.set_item("inbound_bytes_read", p.inbound_bytes_read)?;
    d.set_item("lane_connects", p.lane_connects)?;
    d.set_item("lane_failures", p.lane_failures)?;
    let lanes = PyDict::new(py);
    for (i, l) in &p.lanes {
        let ld = PyDict::new(py);
        ld.set_item("connects", l.connects)?;
        ld.set_item("failures", l.failures)?;
        lanes.set_item(i, ld)?;
    }
    d.set_item("lanes", lanes)?;
    Ok(d)
}

/// Every shard's counters, in shard order (empty without a backend).
pub(crate) fn shards<'py>(
    py: Python<'py>,
    s: Option<&EngineStats>,
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for s in s.map(|s| &s.shards[..]).unwrap_or_default() {
        out.append(shard(py, s)?)?;
    }
    Ok(out)
}

/// Every peer's counters summed over shards, by engine key (empty without a backend).
pub(crate) fn peers<'py>(py: Python<'py>, s: Option<&EngineStats>) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for (k, p) in s.map(EngineStats::per_peer).unwrap_or_default() {
        out.set_item(k, peer(py, &p)?)?;
    }
    Ok(out)
}
