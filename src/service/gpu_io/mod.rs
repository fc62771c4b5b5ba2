//! GPU memory on the wire: a shard's streams and staging pools, and the two pipelines that
//! move a chunk's payload between device memory and a connection through pinned slots (the
//! D2H of slot i+1 overlaps the send of slot i; the receive of slot i+1 overlaps the H2D of
//! slot i). Between two processes of one host a payload of exported GPU memory is offered as
//! device parts instead: the receiver opens the sender's allocation and copies it on its GPU,
//! one device-to-device copy and no staging (`local::Device`).

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use super::Shard;
use crate::gpu::staging::Staging;
use crate::gpu::{GpuError, GpuStream};
use crate::region::Region;

mod recv;
mod send;
pub(crate) use recv::{landed, read_into_device, receive_into_device, Landing};
pub(crate) use send::{copy_ahead, push_from_device, Ahead, DevicePayload, SendError};

/// Copies a pipeline keeps in flight at most (more only if slots are free).
const WINDOW: usize = 8;

/// A shard's GPU resources, created on its first GPU transfer.
#[derive(Default)]
pub(crate) struct GpuShard {
    /// Slots for outgoing payload (D2H then send).
    send: Option<Rc<Staging>>,
    /// Slots for incoming payload (receive then H2D). Separate from `send` so a receiver never
    /// waits for a sender whose progress depends on the peer's receivers: no circular wait.
    recv: Option<Rc<Staging>>,
    streams: HashMap<i32, Rc<dyn GpuStream>>,
}

impl GpuShard {
    /// The shard's stream on the device of `dm` (created on first use).
    pub(crate) fn stream(
        &mut self,
        dm: &crate::region::DeviceMem,
    ) -> Result<Rc<dyn GpuStream>, GpuError> {
        Ok(match self.streams.get(&dm.dev) {
            Some(s) => s.clone(),
            None => {
                let s: Rc<dyn GpuStream> = Rc::from(dm.gpu.create_stream(dm.dev)?);
                self.streams.insert(dm.dev, s.clone());
                s
            }
        })
    }

    /// (pinned bytes held, peak bytes in use) over both pools.
    pub(crate) fn staging_bytes(&self) -> (usize, usize) {
        [&self.send, &self.recv]
            .iter()
            .filter_map(|p| p.as_ref())
            .fold((0, 0), |(a, b), p| {
                (a + p.pinned_bytes(), b + p.peak_bytes())
            })
    }
}

/// What a pipeline needs for one region on this shard.
struct Ctx {
    staging: Rc<Staging>,
    stream: Rc<dyn GpuStream>,
    limit: Duration,
}

/// This shard's stream on the device of `region` (created on first use).
fn stream(shard: &Shard, region: &Region) -> Result<Rc<dyn GpuStream>, GpuError> {
    let dm = region.device().ok_or_else(|| GpuError::Call {
        call: "stream",
        msg: "not device memory".into(),
    })?;
    shard.gpu.borrow_mut().stream(dm)
}

/// Device memory was registered: create this shard's stream on its device and pin both
/// staging pools now, once per shard, so that the first transfer that stages does not wait
/// for them (pinning takes milliseconds per slot and blocks the shard's thread). A failure
/// here is only logged: the transfer that needs the pool reports it.
pub(crate) fn prewarm(shard: &Shard, region: &Region) {
    if region.device().is_none() {
        return;
    }
    for outgoing in [true, false] {
        if let Err(e) = ctx(shard, region, outgoing) {
            log::debug!("shard {}: GPU staging not prepared: {e}", shard.id);
            return;
        }
    }
}

fn ctx(shard: &Shard, region: &Region, outgoing: bool) -> Result<Ctx, GpuError> {
    let stream = stream(shard, region)?;
    let dm = region.device().ok_or_else(|| GpuError::Call {
        call: "staging",
        msg: "not device memory".into(),
    })?;
    let cfg = &shard.shared.cfg;
    let mut g = shard.gpu.borrow_mut();
    let n_shards = shard.n_shards().max(1);
    let per_pool = cfg.gpu_staging_bytes / n_shards / 2;
    let slot = cfg.staging_slot_bytes(n_shards);
    let pool = if outgoing { &mut g.send } else { &mut g.recv };
    let staging = pool
        .get_or_insert_with(|| {
            let s = Staging::new(dm.gpu.clone(), slot, per_pool);
            s.fill();
            s
        })
        .clone();
    Ok(Ctx {
        staging,
        stream,
        limit: cfg.op_timeout,
    })
}
