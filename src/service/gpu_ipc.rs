//! GPU memory between two processes of one host: a payload of exported GPU memory offered
//! as device parts (`transport::local::Device`), and taken by the receiver, which opens the
//! sender's allocation and copies it device to device on its own stream, with no staging.

use super::Shard;
use crate::gpu::{BatchCopy, CopyDir, GpuError, IpcExport};
use crate::region::Region;
use crate::transport::framed::{ConnError, FrameReader, FrameWriter};
use crate::transport::local::{Device, Verdict};
use crate::transport::Rx;

/// The exported allocation of `region` and the device parts (offsets in it) that carry its
/// `spans`, where the connection takes them and this engine has device parts on.
pub(super) fn device_parts(
    shard: &Shard,
    writer: &FrameWriter,
    region: &Region,
    spans: &[(u64, u64)],
) -> Option<(IpcExport, Vec<(u64, u64)>)> {
    let ex = region.device()?.ipc?;
    if shard.shared.cfg.gpu_ipc == Some(false) {
        return None;
    }
    if !writer.offers_device()
        || spans.is_empty()
        || spans.len() > crate::transport::local::MAX_DEVICE_PAIRS
        || spans.iter().any(|s| s.1 == 0)
    {
        return None;
    }
    let at = region.device_addr(0).checked_sub(ex.base)?;
    let parts: Vec<(u64, u64)> = spans.iter().map(|&(off, len)| (at + off, len)).collect();
    // Only parts inside the exported allocation: the receiver opens that much (a region of
    // several allocations is staged).
    parts
        .iter()
        .all(|&(off, len)| off.checked_add(len).is_some_and(|e| e <= ex.size))
        .then_some((ex, parts))
}

/// Copy offered device parts `d` of process `pid` into `spans` of `region` on this shard's
/// stream, then acknowledge them; `None` when they were declined (the bytes then follow).
/// Returns once the copies have completed on the device.
pub(super) async fn take_device(
    shard: &Shard,
    reader: &mut FrameReader<Rx>,
    region: &Region,
    spans: &[(u64, u64)],
    total: u64,
    d: &Device,
    pid: u32,
) -> Result<Option<Result<(), GpuError>>, ConnError> {
    if d.len() != total {
        return Err(ConnError::Violation(format!(
            "device parts of {} bytes for a {total}-byte payload",
            d.len()
        )));
    }
    let decline = |reader: &mut FrameReader<Rx>, v| reader.settle_device(v, 0).map(|()| None);
    if shard.shared.cfg.gpu_ipc == Some(false) {
        // Configured off: the peer stops offering on this connection.
        return decline(reader, Verdict::DeclinedForGood);
    }
    let Some(dm) = region.device() else {
        return decline(reader, Verdict::Declined);
    };
    let Ok(stream) = shard.gpu.borrow_mut().stream(dm) else {
        // The staging path reports the failure (and drains the bytes).
        return decline(reader, Verdict::Declined);
    };
    let map = match dm.gpu.ipc_open(dm.dev, pid, &d.export) {
        Ok(m) => m,
        Err(e) => {
            ipc_refused(pid, &e);
            return decline(reader, Verdict::DeclinedForGood);
        }
    };
    if let Some(&(off, len)) = d
        .parts
        .iter()
        .find(|&&(off, len)| off.checked_add(len).is_none_or(|end| end > map.size))
    {
        return Err(ConnError::Violation(format!(
            "device part {off}+{len} outside the peer's {}-byte allocation",
            map.size
        )));
    }
    let mut copies = Vec::new();
    let mut src = d.parts.iter().copied();
    let (mut s_off, mut s_left) = src.next().unwrap_or_default();
    'spans: for &(dst_off, len) in spans {
        let mut done = 0u64;
        while done < len {
            if s_left == 0 {
                match src.next() {
                    Some((o, l)) => (s_off, s_left) = (o, l),
                    None => break 'spans,
                }
            }
            let k = s_left.min(len - done);
            copies.push(BatchCopy {
                dst: region.device_addr(dst_off + done),
                src: map.base + s_off,
                len: k as usize,
            });
            done += k;
            s_off += k;
            s_left -= k;
        }
    }
    // SAFETY: the destinations lie in the region (checked before the transfer started) and
    // the sources in the opened allocation (checked above); neither is released before the
    // fence below completes (the region is held by this chunk, the mapping by the runtime,
    // the sender's memory by its waiting send).
    let mut failed: Option<GpuError> =
        unsafe { crate::gpu::enqueue_copies(&*stream, CopyDir::D2d, &copies) }.err();
    // Every copy queued is waited for before the sender may reuse its memory.
    match stream.fence() {
        Ok(f) => {
            if let Err(e) = crate::gpu::staging::wait_fence(&*f, shard.shared.cfg.op_timeout).await
            {
                failed.get_or_insert(e);
            }
        }
        Err(e) => {
            failed.get_or_insert(e);
        }
    }
    reader.settle_device(Verdict::Taken, total)?;
    Ok(Some(failed.map_or(Ok(()), Err)))
}

/// Log, once per peer process, that its GPU memory cannot be opened here.
fn ipc_refused(pid: u32, e: &GpuError) {
    static SEEN: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.contains(&pid) {
        seen.push(pid);
        log::warn!(
            "cannot open the GPU memory of same-host process {pid} ({e}): staging it through \
             host memory"
        );
    }
}
