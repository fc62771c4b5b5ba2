//! An in-memory GPU runtime for machines without one: "device memory" lives in host vectors
//! behind addresses the CPU cannot dereference (so any code path that touches device memory
//! directly crashes), copies run asynchronously on a worker thread per stream, and faults
//! can be injected. Tests and `morio bench --gpu-runtime fake` use it to drive the pipeline.
//! VMM memory (chunks mapped side by side, exported as file descriptors) is in `vmm.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

mod vmm;

use super::ipc::IpcCache;
use super::{
    BatchCopy, CopyDir, DeviceBuf, DeviceInfo, GpuError, GpuFence, GpuRuntime, GpuStream,
    IpcExport, IpcExports, IpcKind, IpcLease, PinnedBuf, IPC_HANDLE_BYTES,
};

/// Allocations exported by every fake runtime of the process, by handle: a fake "other
/// process" opens them from here (and maps them at an address of its own, as CUDA does).
static EXPORTS: Mutex<BTreeMap<[u8; IPC_HANDLE_BYTES], std::sync::Weak<Alloc>>> =
    Mutex::new(BTreeMap::new());

/// Non-canonical on x86-64 and unmapped elsewhere: a stray host dereference faults at once.
const BASE: u64 = 0x4000_0000_0000_0000;
/// Address space per allocation (so each allocation can be up to 16 GiB).
const SPAN: u64 = 1 << 34;

/// Where an injected fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAt {
    /// The copy call itself returns an error.
    Submit,
    /// The copy is accepted and fails later: its fence reports the error.
    Complete,
}

/// The fake runtime. Cheap to clone; clones share devices and counters.
#[derive(Debug, Clone)]
pub struct FakeGpu {
    st: Arc<State>,
}

#[derive(Debug)]
struct State {
    devices: usize,
    /// Allocations and opened mappings by base (shared with the mapping cache's closer).
    allocs: Arc<Mutex<BTreeMap<u64, Arc<Alloc>>>>,
    next: AtomicU64,
    pinned_live: AtomicUsize,
    pinned_peak: AtomicUsize,
    copies: AtomicU64,
    delay_ns: AtomicU64,
    fault_countdown: AtomicI64,
    fault_at_complete: AtomicBool,
    refuse_ipc: AtomicBool,
    refuse_export: AtomicBool,
    refuse_vmm_export: AtomicBool,
    vmm_fabric: AtomicBool,
    ipc_opens: AtomicU64,
    d2d_copies: AtomicU64,
    batches: AtomicU64,
    copies_2d: AtomicU64,
    opened: Arc<IpcCache>,
    ipc_closes: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Alloc {
    dev: i32,
    bytes: Mutex<Vec<u8>>,
    /// A VMM chunk: a range may go on into the chunk mapped right after it.
    vmm: bool,
}

impl FakeGpu {
    /// A runtime with `devices` GPUs.
    pub fn new(devices: usize) -> Self {
        let allocs: Arc<Mutex<BTreeMap<u64, Arc<Alloc>>>> = Arc::default();
        let ipc_closes = Arc::new(AtomicU64::new(0));
        let (a, n) = (allocs.clone(), ipc_closes.clone());
        let opened = IpcCache::new(Box::new(move |_, base, _, _| {
            lock(&a).remove(&base);
            n.fetch_add(1, Ordering::Relaxed);
        }));
        Self {
            st: Arc::new(State {
                devices,
                allocs,
                next: AtomicU64::new(0),
                pinned_live: AtomicUsize::new(0),
                pinned_peak: AtomicUsize::new(0),
                copies: AtomicU64::new(0),
                delay_ns: AtomicU64::new(0),
                fault_countdown: AtomicI64::new(-1),
                fault_at_complete: AtomicBool::new(false),
                refuse_ipc: AtomicBool::new(false),
                refuse_export: AtomicBool::new(false),
                refuse_vmm_export: AtomicBool::new(false),
                vmm_fabric: AtomicBool::new(false),
                ipc_opens: AtomicU64::new(0),
                d2d_copies: AtomicU64::new(0),
                batches: AtomicU64::new(0),
                copies_2d: AtomicU64::new(0),
                opened,
                ipc_closes,
            }),
        }
    }

    /// Make every asynchronous copy take at least `d` (to widen the windows the pipeline
    /// must wait through).
    pub fn set_copy_delay(&self, d: Duration) {
        self.st
            .delay_ns
            .store(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Fail the asynchronous copy after the next `n` succeed (`None`: no fault).
    pub fn inject_fault(&self, n: Option<u64>, at: FaultAt) {
        self.st
            .fault_at_complete
            .store(at == FaultAt::Complete, Ordering::Relaxed);
        self.st
            .fault_countdown
            .store(n.map_or(-1, |n| n as i64), Ordering::Relaxed);
    }

    /// Pinned bytes allocated and not yet freed.
    pub fn pinned_live_bytes(&self) -> usize {
        self.st.pinned_live.load(Ordering::Relaxed)
    }

    /// Most pinned bytes allocated at once.
    pub fn pinned_peak_bytes(&self) -> usize {
        self.st.pinned_peak.load(Ordering::Relaxed)
    }

    /// Asynchronous copies submitted so far.
    pub fn copies(&self) -> u64 {
        self.st.copies.load(Ordering::Relaxed)
    }

    /// Refuse to open IPC handles (as a container without the peer's GPU would).
    pub fn refuse_ipc(&self, on: bool) {
        self.st.refuse_ipc.store(on, Ordering::Relaxed);
    }

    /// Refuse to export allocations (as CUDA does for memory from a virtual-memory pool).
    pub fn refuse_export(&self, on: bool) {
        self.st.refuse_export.store(on, Ordering::Relaxed);
    }

    /// IPC handles opened so far (not counting cached ones).
    pub fn ipc_opens(&self) -> u64 {
        self.st.ipc_opens.load(Ordering::Relaxed)
    }

    /// IPC mappings closed so far (replaced, or unused for a while).
    pub fn ipc_closes(&self) -> u64 {
        self.st.ipc_closes.load(Ordering::Relaxed)
    }

    /// Device-to-device copies submitted so far.
    pub fn d2d_copies(&self) -> u64 {
        self.st.d2d_copies.load(Ordering::Relaxed)
    }

    /// Batches of copies submitted so far ([`GpuStream::copy_batch`]; their copies count in
    /// [`Self::copies`] one by one).
    pub fn batches(&self) -> u64 {
        self.st.batches.load(Ordering::Relaxed)
    }

    /// 2D copies submitted so far ([`GpuStream::copy_2d`]; their rows count in
    /// [`Self::copies`] one by one).
    pub fn copies_2d(&self) -> u64 {
        self.st.copies_2d.load(Ordering::Relaxed)
    }

    /// The allocation holding `ptr..ptr+len` and where it starts in this runtime's space
    /// (its own address, or where this runtime mapped another's export).
    fn find(&self, ptr: u64, len: usize) -> Option<(u64, Arc<Alloc>)> {
        let allocs = self.st.allocs.lock().unwrap_or_else(|e| e.into_inner());
        let (&base, a) = allocs.range(..=ptr).next_back()?;
        let len_a = a.bytes.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
        (ptr.checked_add(len as u64)? <= base + len_a).then(|| (base, a.clone()))
    }

    /// The pieces of `ptr..ptr+len`: (allocation, offset in it, bytes), one allocation, or
    /// VMM chunks mapped side by side; `None` where any byte is not mapped.
    fn pieces(&self, ptr: u64, len: usize) -> Option<Vec<(Arc<Alloc>, usize, usize)>> {
        let allocs = self.st.allocs.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        let (mut at, mut left) = (ptr, len as u64);
        ptr.checked_add(len as u64)?;
        loop {
            let (&base, a) = allocs.range(..=at).next_back()?;
            let len_a = lock(&a.bytes).len() as u64;
            if at >= base + len_a {
                return None;
            }
            if let Some((prev, _, _)) = out.last() {
                let prev: &Arc<Alloc> = prev;
                if !(prev.vmm && a.vmm) {
                    return None;
                }
            }
            let k = left.min(base + len_a - at);
            out.push((a.clone(), (at - base) as usize, k as usize));
            left -= k;
            at += k;
            if left == 0 {
                return Some(out);
            }
        }
    }

    /// Copy device bytes at `src` into `dst` (`false`: not mapped).
    fn read_dev(&self, src: u64, dst: &mut [u8]) -> bool {
        let Some(p) = self.pieces(src, dst.len()) else {
            return false;
        };
        let mut at = 0;
        for (a, off, k) in p {
            dst[at..at + k].copy_from_slice(&lock(&a.bytes)[off..off + k]);
            at += k;
        }
        true
    }

    /// Copy `src` into device bytes at `dst` (`false`: not mapped).
    fn write_dev(&self, dst: u64, src: &[u8]) -> bool {
        let Some(p) = self.pieces(dst, src.len()) else {
            return false;
        };
        let mut at = 0;
        for (a, off, k) in p {
            lock(&a.bytes)[off..off + k].copy_from_slice(&src[at..at + k]);
            at += k;
        }
        true
    }

    /// A fresh address range for one allocation.
    fn next_base(&self) -> u64 {
        BASE + self.st.next.fetch_add(1, Ordering::Relaxed) * SPAN
    }

    /// Whether the next copy is the faulty one.
    fn take_fault(&self) -> Option<FaultAt> {
        let left = self.st.fault_countdown.load(Ordering::Relaxed);
        if left < 0 {
            return None;
        }
        self.st.fault_countdown.fetch_sub(1, Ordering::Relaxed);
        if left > 0 {
            return None;
        }
        Some(if self.st.fault_at_complete.load(Ordering::Relaxed) {
            FaultAt::Complete
        } else {
            FaultAt::Submit
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GpuRuntime for FakeGpu {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn device_count(&self) -> Result<usize, GpuError> {
        Ok(self.st.devices)
    }

    fn device_info(&self, dev: i32) -> Result<DeviceInfo, GpuError> {
        if dev < 0 || dev as usize >= self.st.devices {
            return Err(GpuError::NoDevice {
                dev,
                count: self.st.devices,
            });
        }
        Ok(DeviceInfo {
            ordinal: dev,
            bus_id: format!("0000:{:02x}:00.0", 0x10 + dev),
            name: "morio fake GPU".into(),
        })
    }

    fn check_device_range(&self, dev: i32, ptr: u64, len: usize) -> Result<(), GpuError> {
        self.device_info(dev)?;
        let bad = |why: &str| GpuError::NotDeviceMemory {
            dev,
            ptr,
            len,
            why: why.into(),
        };
        let p = self
            .pieces(ptr, len.max(1))
            .ok_or_else(|| bad("not inside one allocation"))?;
        if let Some((a, _, _)) = p.iter().find(|(a, _, _)| a.dev != dev) {
            return Err(bad(&format!("it belongs to GPU {}", a.dev)));
        }
        Ok(())
    }

    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuf, GpuError> {
        let mut v = vec![0u8; len].into_boxed_slice();
        let ptr = v.as_mut_ptr();
        let raw = Box::into_raw(v) as *mut u8 as usize;
        let live = self.st.pinned_live.fetch_add(len, Ordering::Relaxed) + len;
        self.st.pinned_peak.fetch_max(live, Ordering::Relaxed);
        let st = self.st.clone();
        let free = Box::new(move || {
            // SAFETY: re-boxing the slice leaked above, exactly once.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(raw as *mut u8, len)) });
            st.pinned_live.fetch_sub(len, Ordering::Relaxed);
        });
        // SAFETY: `ptr..ptr+len` is the leaked boxed slice, freed only by `free`.
        Ok(unsafe { PinnedBuf::from_raw(ptr, len, free) })
    }

    fn create_stream(&self, dev: i32) -> Result<Box<dyn GpuStream>, GpuError> {
        self.device_info(dev)?;
        Ok(Box::new(FakeStream::new(self.clone(), dev)))
    }

    fn alloc_device(self: Arc<Self>, dev: i32, len: usize) -> Result<DeviceBuf, GpuError> {
        self.device_info(dev)?;
        if len as u64 > SPAN {
            return Err(GpuError::Call {
                call: "fake alloc",
                msg: format!("{len} bytes is more than one fake allocation holds"),
            });
        }
        let base = self.next_base();
        let a = Arc::new(Alloc {
            dev,
            bytes: Mutex::new(vec![0u8; len]),
            vmm: false,
        });
        lock(&self.st.allocs).insert(base, a);
        let st = self.st.clone();
        let free = Box::new(move || {
            lock(&st.allocs).remove(&base);
        });
        // SAFETY: the allocation stays in the table until `free` removes it.
        Ok(unsafe { DeviceBuf::from_raw(self, dev, base, len, free) })
    }

    fn ipc_export(&self, dev: i32, ptr: u64) -> Result<IpcExport, GpuError> {
        self.check_device_range(dev, ptr, 1)?;
        if self.st.refuse_export.load(Ordering::Relaxed) {
            return Err(GpuError::Call {
                call: "fake ipc export",
                msg: "refused (injected)".into(),
            });
        }
        let (base, a) = self.find(ptr, 1).ok_or(GpuError::Call {
            call: "fake export",
            msg: "freed".into(),
        })?;
        if a.vmm {
            return Err(GpuError::Call {
                call: "fake ipc export",
                msg: "a VMM chunk has no legacy IPC handle".into(),
            });
        }
        let mut handle = [0u8; IPC_HANDLE_BYTES];
        handle[..8].copy_from_slice(b"fakeipc\0");
        handle[8..16].copy_from_slice(&rand::random::<u64>().to_le_bytes());
        handle[16..24].copy_from_slice(&base.to_le_bytes());
        let size = lock(&a.bytes).len() as u64;
        let mut ex = lock(&EXPORTS);
        ex.retain(|_, w| w.strong_count() > 0);
        ex.insert(handle, Arc::downgrade(&a));
        Ok(IpcExport::legacy(handle, base, size))
    }

    fn ipc_export_range(&self, dev: i32, ptr: u64, len: usize) -> Result<IpcExports, GpuError> {
        self.check_device_range(dev, ptr, len)?;
        let pieces = self.pieces(ptr, len.max(1)).ok_or(GpuError::Call {
            call: "fake export",
            msg: "freed".into(),
        })?;
        let (mut list, mut keep) = (Vec::new(), Vec::new());
        let mut at = ptr;
        for (a, off, k) in pieces {
            if !a.vmm {
                list.push(self.ipc_export(dev, at)?);
            } else if self.vmm_exports_fabric() {
                list.push(vmm::export_fabric(&a, at - off as u64));
            } else if self.vmm_exports() && super::export_fd_allowed(keep.len()) {
                let (ex, fd) = vmm::export(&a, at - off as u64)?;
                list.push(ex);
                keep.push(fd);
            }
            at += k as u64;
        }
        if list.is_empty() {
            return Err(GpuError::Call {
                call: "fake vmm export",
                msg: "refused (injected)".into(),
            });
        }
        Ok(IpcExports::new(list, keep))
    }

    fn ipc_open(&self, dev: i32, pid: u32, export: &IpcExport) -> Result<IpcLease, GpuError> {
        self.device_info(dev)?;
        if self.st.refuse_ipc.load(Ordering::Relaxed) {
            return Err(GpuError::Call {
                call: "fake ipc open",
                msg: "refused (injected)".into(),
            });
        }
        // Every fake runtime opens through the export tables, whatever the pid: a test's two
        // engines in one process take the path two processes would (a descriptor is taken
        // from process `pid` with `pidfd_getfd`, as CUDA's importer must).
        let open = |h: &[u8; IPC_HANDLE_BYTES]| {
            let a = match export.kind {
                IpcKind::Legacy => lock(&EXPORTS).get(h).and_then(|w| w.upgrade()),
                IpcKind::PosixFd => vmm::import(pid, export)?,
                IpcKind::Fabric => vmm::import_fabric(export),
            }
            .ok_or(GpuError::Call {
                call: "fake ipc open",
                msg: "no such handle".into(),
            })?;
            let size = lock(&a.bytes).len() as u64;
            let base = self.next_base();
            lock(&self.st.allocs).insert(base, a);
            self.st.ipc_opens.fetch_add(1, Ordering::Relaxed);
            Ok((base, size))
        };
        self.st.opened.get_or_open(dev, pid, export, open)
    }

    unsafe fn copy_to_device(&self, dev: i32, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        self.check_device_range(dev, dst, src.len())?;
        if !self.write_dev(dst, src) {
            return Err(GpuError::Call {
                call: "fake copy",
                msg: "freed".into(),
            });
        }
        Ok(())
    }

    unsafe fn copy_from_device(&self, dev: i32, dst: &mut [u8], src: u64) -> Result<(), GpuError> {
        self.check_device_range(dev, src, dst.len())?;
        if !self.read_dev(src, dst) {
            return Err(GpuError::Call {
                call: "fake copy",
                msg: "freed".into(),
            });
        }
        Ok(())
    }
}

enum Op {
    D2h { dst: usize, src: u64, len: usize },
    H2d { dst: u64, src: usize, len: usize },
    D2d { dst: u64, src: u64, len: usize },
    Fault,
    Mark(Arc<Mark>),
}

#[derive(Debug, Default)]
struct Mark {
    /// 0 pending, 1 done, 2 failed.
    state: AtomicU8,
    msg: Mutex<String>,
    cv: Condvar,
}

/// A fake stream: a worker thread executing copies in order.
#[derive(Debug)]
struct FakeStream {
    gpu: FakeGpu,
    dev: i32,
    tx: Option<mpsc::Sender<Op>>,
    worker: Option<JoinHandle<()>>,
}

impl FakeStream {
    fn new(gpu: FakeGpu, dev: i32) -> Self {
        let (tx, rx) = mpsc::channel::<Op>();
        let g = gpu.clone();
        let worker = std::thread::Builder::new()
            .name(format!("fake-gpu{dev}"))
            .spawn(move || run_stream(g, rx))
            .ok();
        Self {
            gpu,
            dev,
            tx: Some(tx),
            worker,
        }
    }

    fn submit(&self, op: Op) -> Result<(), GpuError> {
        let fault = match op {
            Op::D2h { .. } | Op::H2d { .. } | Op::D2d { .. } => {
                self.gpu.st.copies.fetch_add(1, Ordering::Relaxed);
                self.gpu.take_fault()
            }
            _ => None,
        };
        let op = match fault {
            Some(FaultAt::Submit) => {
                return Err(GpuError::Call {
                    call: "fake copy",
                    msg: "injected fault".into(),
                })
            }
            Some(FaultAt::Complete) => Op::Fault,
            None => op,
        };
        self.tx
            .as_ref()
            .and_then(|t| t.send(op).ok())
            .ok_or(GpuError::Call {
                call: "fake stream",
                msg: "worker thread gone".into(),
            })
    }

    fn check(&self, ptr: u64, len: usize) -> Result<(), GpuError> {
        self.gpu.check_device_range(self.dev, ptr, len)
    }
}

fn run_stream(gpu: FakeGpu, rx: mpsc::Receiver<Op>) {
    let mut error: Option<String> = None;
    while let Ok(op) = rx.recv() {
        let delay = gpu.st.delay_ns.load(Ordering::Relaxed);
        let copy = matches!(op, Op::D2h { .. } | Op::H2d { .. } | Op::D2d { .. });
        if copy && error.is_none() && delay > 0 {
            std::thread::sleep(Duration::from_nanos(delay));
        }
        match op {
            Op::Mark(m) => {
                let st = if let Some(e) = &error {
                    *lock(&m.msg) = e.clone();
                    2
                } else {
                    1
                };
                let _g = lock(&m.msg);
                m.state.store(st, Ordering::Release);
                m.cv.notify_all();
            }
            _ if error.is_some() => {}
            Op::Fault => error = Some("injected fault (sticky, as a CUDA device error)".into()),
            Op::D2h { dst, src, len } => {
                // SAFETY: `dst` is pinned memory the submitter keeps alive and untouched
                // until the fence after this copy completes.
                let dst = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, len) };
                if !gpu.read_dev(src, dst) {
                    error = Some(format!("D2H from freed memory {src:#x}"));
                }
            }
            Op::H2d { dst, src, len } => {
                // SAFETY: as above, `src` is live pinned memory.
                let src = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
                if !gpu.write_dev(dst, src) {
                    error = Some(format!("H2D into freed memory {dst:#x}"));
                }
            }
            Op::D2d { dst, src, len } => {
                // Copied out first: source and destination may be one allocation.
                let mut bytes = vec![0u8; len];
                if !(gpu.read_dev(src, &mut bytes) && gpu.write_dev(dst, &bytes)) {
                    error = Some(format!("D2D between freed memory {src:#x} -> {dst:#x}"));
                }
            }
        }
    }
}

impl GpuStream for FakeStream {
    unsafe fn d2h(&self, dst: *mut u8, src: u64, len: usize) -> Result<(), GpuError> {
        self.check(src, len)?;
        self.submit(Op::D2h {
            dst: dst as usize,
            src,
            len,
        })
    }

    unsafe fn h2d(&self, dst: u64, src: *const u8, len: usize) -> Result<(), GpuError> {
        self.check(dst, len)?;
        self.submit(Op::H2d {
            dst,
            src: src as usize,
            len,
        })
    }

    unsafe fn d2d(&self, dst: u64, src: u64, len: usize) -> Result<(), GpuError> {
        self.check(dst, len)?;
        if self.gpu.pieces(src, len).is_none() {
            return Err(GpuError::NotDeviceMemory {
                dev: self.dev,
                ptr: src,
                len,
                why: "not inside one allocation (or mapping)".into(),
            });
        }
        self.gpu.st.d2d_copies.fetch_add(1, Ordering::Relaxed);
        self.submit(Op::D2d { dst, src, len })
    }

    unsafe fn copy_batch(&self, dir: CopyDir, copies: &[BatchCopy]) -> Result<(), GpuError> {
        self.gpu.st.batches.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded from the caller.
        unsafe { super::one_by_one(self, dir, copies) }
    }

    unsafe fn copy_2d(&self, dir: CopyDir, run: &super::Copy2d) -> Result<(), GpuError> {
        self.gpu.st.copies_2d.fetch_add(1, Ordering::Relaxed);
        let rows: Vec<BatchCopy> = run.row_copies().collect();
        // SAFETY: forwarded from the caller.
        unsafe { super::one_by_one(self, dir, &rows) }
    }

    fn fence(&self) -> Result<Box<dyn GpuFence>, GpuError> {
        let m = Arc::new(Mark::default());
        self.submit(Op::Mark(m.clone()))?;
        Ok(Box::new(FakeFence(m)))
    }
}

impl Drop for FakeStream {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

#[derive(Debug)]
struct FakeFence(Arc<Mark>);

impl GpuFence for FakeFence {
    fn poll(&self) -> Result<bool, GpuError> {
        match self.0.state.load(Ordering::Acquire) {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(GpuError::Call {
                call: "fake copy",
                msg: lock(&self.0.msg).clone(),
            }),
        }
    }

    fn wait_blocking(&self) -> Result<(), GpuError> {
        let mut g = lock(&self.0.msg);
        while self.0.state.load(Ordering::Acquire) == 0 {
            g = self.0.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        drop(g);
        self.poll().map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_round_trip_through_a_stream_and_faults_surface() {
        let gpu = Arc::new(FakeGpu::new(2));
        let d = gpu.clone().alloc_device(1, 1000).unwrap();
        assert!(gpu.check_device_range(1, d.ptr() + 10, 990).is_ok());
        assert!(gpu.check_device_range(1, d.ptr() + 10, 991).is_err());
        assert!(
            gpu.check_device_range(0, d.ptr(), 1).is_err(),
            "wrong device"
        );
        assert!(
            gpu.check_device_range(2, d.ptr(), 1).is_err(),
            "no such device"
        );
        d.write_at(0, &[5u8; 1000]).unwrap();
        let s = gpu.create_stream(1).unwrap();
        let mut p = gpu.alloc_pinned(100).unwrap();
        // SAFETY: here and in the copies below, the device ranges lie inside `d`'s 1000
        // bytes on GPU 1, the stream's device, and the host ones inside the 100 pinned bytes
        // of `p`; both outlive the stream, and neither is touched until the fence after the
        // copy has been waited for.
        unsafe { s.d2h(p.as_mut_slice().as_mut_ptr(), d.ptr() + 900, 100) }.unwrap();
        s.fence().unwrap().wait_blocking().unwrap();
        assert_eq!(p.as_slice(), &[5u8; 100]);
        p.as_mut_slice().fill(9);
        // SAFETY: as above.
        unsafe { s.h2d(d.ptr(), p.as_slice().as_ptr(), 100) }.unwrap();
        s.fence().unwrap().wait_blocking().unwrap();
        let mut back = [0u8; 101];
        d.read_at(0, &mut back).unwrap();
        assert_eq!(&back[..100], &[9u8; 100]);
        assert_eq!(back[100], 5);
        gpu.inject_fault(Some(0), FaultAt::Submit);
        // SAFETY: as above (and this copy is refused before it is queued).
        assert!(unsafe { s.h2d(d.ptr(), p.as_slice().as_ptr(), 1) }.is_err());
        gpu.inject_fault(Some(0), FaultAt::Complete);
        // SAFETY: as above.
        unsafe { s.h2d(d.ptr(), p.as_slice().as_ptr(), 1) }.unwrap();
        assert!(s.fence().unwrap().wait_blocking().is_err(), "sticky error");
        assert_eq!(gpu.pinned_live_bytes(), 100);
        drop(p);
        assert_eq!(gpu.pinned_live_bytes(), 0);
        assert_eq!(gpu.pinned_peak_bytes(), 100);
    }

    #[test]
    fn the_ipc_check_passes_and_says_why_not() {
        let gpu = Arc::new(FakeGpu::new(2));
        let ok = crate::gpu::check_ipc_with(gpu.clone()).unwrap();
        assert_eq!(ok, "fake with 2 device(s)");
        gpu.refuse_export(true);
        let why = crate::gpu::check_ipc_with(gpu).unwrap_err();
        assert!(why.contains("refused"), "{why}");
    }

    #[test]
    fn an_exported_allocation_opens_elsewhere_at_its_own_address() {
        let a = Arc::new(FakeGpu::new(1));
        let b = Arc::new(FakeGpu::new(1));
        let src = a.clone().alloc_device(0, 4096).unwrap();
        src.write_at(1000, &[7u8; 100]).unwrap();
        let ex = a.ipc_export(0, src.ptr() + 1000).unwrap();
        assert_eq!((ex.base, ex.size), (src.ptr(), 4096));
        let m = b.ipc_open(0, 1, &ex).unwrap();
        assert_eq!(m.size, 4096);
        assert_eq!(b.ipc_open(0, 1, &ex).unwrap().base, m.base, "cached");
        assert_eq!(b.ipc_opens(), 1);
        let dst = b.clone().alloc_device(0, 100).unwrap();
        let s = b.create_stream(0).unwrap();
        // SAFETY: both ranges lie in live allocations (the mapping and `dst`), untouched
        // until the fence is waited for.
        unsafe { s.d2d(dst.ptr(), m.base + 1000, 100) }.unwrap();
        s.fence().unwrap().wait_blocking().unwrap();
        let mut back = [0u8; 100];
        dst.read_at(0, &mut back).unwrap();
        assert_eq!(back, [7u8; 100]);
        assert_eq!(b.d2d_copies(), 1);
        // SAFETY: refused before anything is queued (the source is not mapped here).
        assert!(unsafe { s.d2d(dst.ptr(), 0x10, 1) }.is_err());
        b.refuse_ipc(true);
        let other = a.clone().alloc_device(0, 10).unwrap();
        let ex2 = a.ipc_export(0, other.ptr()).unwrap();
        assert!(b.ipc_open(0, 1, &ex2).is_err());
    }
}
