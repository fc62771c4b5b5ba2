//! GPU memory between two processes of one host: a payload of exported GPU memory offered
//! as device parts (`transport::local::Device`), and taken by the receiver, which opens the
//! sender's allocation and copies it device to device on its own stream, with no staging.

use super::Shard;
use crate::gpu::{BatchCopy, CopyDir, GpuError, IpcExport, IpcKind, IpcLease};
use crate::region::Region;
use crate::transport::framed::{ConnError, FrameReader, FrameWriter};
use crate::transport::local::{
    Device, DevicePart, DeviceRecords, Verdict, MAX_DEVICE_ALLOCS, MAX_DEVICE_PAIRS,
};
use crate::transport::Rx;

/// The exported allocations holding `spans` of `region` and the device parts that carry
/// them, where the connection takes them and this engine has device parts on; `None` when
/// any byte lies outside what was exported (a VMM chunk that could not be), or the offer
/// would pass the record's limits or the connection's version: the payload is staged.
pub(super) fn device_parts(
    shard: &Shard,
    writer: &FrameWriter,
    region: &Region,
    spans: &[(u64, u64)],
) -> Option<(Vec<IpcExport>, Vec<DevicePart>)> {
    let exports = region.device()?.ipc.as_deref()?;
    let records = writer.offers_device();
    if shard.shared.cfg.gpu_ipc == Some(false)
        || records == DeviceRecords::None
        || spans.is_empty()
        || spans.len() > MAX_DEVICE_PAIRS
        || spans.iter().any(|s| s.1 == 0)
    {
        return None;
    }
    // Many tiny parts are staged (the receiver judges its own spans too, `take_device`).
    if !worth_copying(region, spans) {
        return None;
    }
    // Offer index of each export used, in order of first use.
    let mut used: Vec<(usize, u16)> = Vec::new();
    let mut allocs: Vec<IpcExport> = Vec::new();
    let mut parts: Vec<DevicePart> = Vec::with_capacity(spans.len());
    for &(off, len) in spans {
        let mut at = region.device_addr(off);
        let mut left = len;
        while left > 0 {
            let (i, e) = exports.find(at)?;
            let k = left.min(e.base + e.size - at);
            let alloc = match used.iter().find(|u| u.0 == i) {
                Some(&(_, a)) => a,
                None => {
                    if allocs.len() == MAX_DEVICE_ALLOCS {
                        return None;
                    }
                    used.push((i, allocs.len() as u16));
                    allocs.push(*e);
                    allocs.len() as u16 - 1
                }
            };
            match parts.last_mut() {
                // A part that goes on where the last one ended (spans of one chunk after
                // another) extends it.
                Some(p) if p.alloc == alloc && p.off + p.len == at - e.base => p.len += k,
                _ => parts.push(DevicePart {
                    alloc,
                    off: at - e.base,
                    len: k,
                }),
            }
            at += k;
            left -= k;
        }
    }
    let single = matches!(&allocs[..], [a] if a.kind == IpcKind::Legacy);
    (parts.len() <= MAX_DEVICE_PAIRS && (single || records == DeviceRecords::Sets))
        .then_some((allocs, parts))
}

/// Whether device-to-device copies of `spans` of `region` (one side's view of a payload's
/// copies) pay against staging them: the payload holds at least [`ipc_min_part`] bytes for
/// each span that cannot go as part of a 2D copy (runs of equal spans at constant pitches,
/// MORI's layout, cost one operation a run, whatever their rows). A device-to-device copy
/// between processes costs the receiver several microseconds each, batched or not, where
/// staged copies batch into one call per pinned slot on each side. Each side judges its own
/// spans: the sender before it offers, the receiver before it takes (a payload whose spans
/// form runs on one side only is staged).
fn worth_copying(region: &Region, spans: &[(u64, u64)]) -> bool {
    let copies: Vec<BatchCopy> = spans
        .iter()
        .map(|&(off, len)| {
            let at = region.device_addr(off);
            BatchCopy {
                dst: at,
                src: at,
                len: len as usize,
            }
        })
        .collect();
    let loose = crate::gpu::loose_copies(CopyDir::D2d, &copies).len() as u64;
    let total: u64 = spans.iter().map(|s| s.1).sum();
    loose <= FEW_PARTS || total >= ipc_min_part().saturating_mul(loose)
}

/// Payloads of at most this many spans outside 2D runs move device to device whatever their
/// size: staging's two copies and host hop cost more than a few device-to-device copies (H100
/// host, two processes, scattered 8 B and 2 KiB parts: one or two parts 0.78–1.02× staged's
/// time, eight 1.13–1.28×, `docs/perf/s48-runs.md`).
const FEW_PARTS: u64 = 2;

/// Payloads holding fewer bytes than this for each span outside 2D runs are staged rather
/// than moved as device parts (`MORIO_GPU_IPC_MIN_PART`, bytes, read once; 0 moves every
/// payload so): on the H100 host 1024 parts of 8 B took 4.8–5.6 ms device to device against
/// 1.8–1.9 ms staged with batched copies, 256 of 4 KiB 0.8–1.0 ms against 0.47–0.55, while
/// 1024 of 16 KiB took 1.6–1.9 ms device to device against 2.4 staged (docs/perf/h100-s31.md).
fn ipc_min_part() -> u64 {
    static MIN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("MORIO_GPU_IPC_MIN_PART")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8 << 10)
    })
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
    if !worth_copying(region, spans) {
        // The sender's spans form runs where these do not (the two layouts differ).
        return decline(reader, Verdict::Declined);
    }
    let mut maps: Vec<IpcLease> = Vec::with_capacity(d.allocs.len());
    for ex in &d.allocs {
        if reader.device_refused(ex.kind) {
            return decline(reader, Verdict::Declined);
        }
        match dm.gpu.ipc_open(dm.dev, pid, ex) {
            Ok(m) => maps.push(m),
            Err(e) => {
                ipc_refused(pid, ex.kind, &e);
                reader.refuse_device(ex.kind);
                // A runtime that cannot open legacy handles opens none: the peer stops
                // offering on this connection. Other kinds are declined each time (without
                // trying again), so the peer's legacy memory still moves device to device.
                let v = if ex.kind == IpcKind::Legacy {
                    Verdict::DeclinedForGood
                } else {
                    Verdict::Declined
                };
                return decline(reader, v);
            }
        }
    }
    if let Some(p) = d.parts.iter().find(|p| {
        p.off
            .checked_add(p.len)
            .is_none_or(|end| end > maps[p.alloc as usize].size)
    }) {
        return Err(ConnError::Violation(format!(
            "device part {}+{} outside the peer's {}-byte allocation",
            p.off, p.len, maps[p.alloc as usize].size
        )));
    }
    let mut copies = Vec::new();
    let mut src = d.parts.iter().copied();
    let (mut s_base, mut s_off, mut s_left) = (0u64, 0u64, 0u64);
    'spans: for &(dst_off, len) in spans {
        let mut done = 0u64;
        while done < len {
            if s_left == 0 {
                match src.next() {
                    Some(p) => {
                        (s_base, s_off, s_left) = (maps[p.alloc as usize].base, p.off, p.len)
                    }
                    None => break 'spans,
                }
            }
            let k = s_left.min(len - done);
            copies.push(BatchCopy {
                dst: region.device_addr(dst_off + done),
                src: s_base + s_off,
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

/// Log, once per peer process and kind, that its GPU memory cannot be opened here.
fn ipc_refused(pid: u32, kind: IpcKind, e: &GpuError) {
    static SEEN: std::sync::Mutex<Vec<(u32, IpcKind)>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.contains(&(pid, kind)) {
        seen.push((pid, kind));
        log::warn!(
            "cannot open the GPU memory ({kind:?} export) of same-host process {pid} ({e}): \
             staging it through host memory"
        );
    }
}
