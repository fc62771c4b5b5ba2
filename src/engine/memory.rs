//! Memory on an engine: registering host and GPU memory (raw or engine-owned), the GPU
//! runtime, and deregistration, which is safe with transfers in flight.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::desc::{MemoryDesc, MemoryLocationType};
use crate::error::EngineError;
use crate::gpu::{self, GpuRuntime};
use crate::proto::access::AccessKey;
use crate::region::{random_access_key, random_mem_id, Backing, DeviceMem, Region, SharedRegion};
use crate::service::ShardMsg;
use crate::submit::{lock, write_lock};

use super::backend::broadcast;
use super::{IoEngine, RegisteredBuffer};

/// How long deregistration waits for in-flight chunks without a backend (with one: three
/// `op_timeout`s, by when every transfer that used the region has ended).
const NO_BACKEND_RELEASE_LIMIT: Duration = Duration::from_secs(5);

/// This machine's physical memory in bytes (`sysinfo(2)`, read once); `None` if unknown.
pub(crate) fn total_ram() -> Option<u64> {
    static RAM: OnceLock<Option<u64>> = OnceLock::new();
    *RAM.get_or_init(|| {
        // SAFETY: `sysinfo` only writes the struct it is given, which is plain data.
        let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
        // SAFETY: `si` is a valid, writable `sysinfo` struct.
        if unsafe { libc::sysinfo(&mut si) } != 0 {
            return None;
        }
        let ram = (si.totalram as u64).saturating_mul(u64::from(si.mem_unit.max(1)));
        (ram > 0).then_some(ram)
    })
}

/// Refuse a host region larger than physical memory: it cannot all be backed, and a peer
/// writing it would push the machine into swap or the OOM killer. (GPU regions are checked
/// against their allocation by the GPU runtime.)
fn check_host_size(size: u64) -> Result<(), EngineError> {
    match total_ram() {
        Some(ram) if size > ram => Err(EngineError::RegionTooLarge { size, ram }),
        _ => Ok(()),
    }
}

/// How memory is registered: the options of [`IoEngine::register_memory_with`] and
/// [`IoEngine::register_buffer_with`] (the plain calls use the default: a remote target).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegisterOptions {
    /// Never a remote target: no peer may read or write it, whatever it presents (a chunk for
    /// it is refused like one for an unknown region). Its descriptor carries no access key;
    /// it is still the local side of this engine's own reads and writes.
    pub local_only: bool,
}

impl RegisterOptions {
    /// The options of memory no peer may touch ([`Self::local_only`]).
    pub const LOCAL_ONLY: RegisterOptions = RegisterOptions { local_only: true };
}

impl IoEngine {
    /// Register host memory that the caller owns, as a remote target: peers holding its
    /// descriptor (with its access key) may read and write it. A region larger than the
    /// machine's physical memory is refused ([`EngineError::RegionTooLarge`]).
    ///
    /// # Safety
    /// `ptr..ptr+size` must stay valid for reads and writes until [`Self::deregister_memory`]
    /// for it has returned `Ok`. Peers may read and write it at any time in between.
    pub unsafe fn register_memory(
        &self,
        ptr: *mut u8,
        size: usize,
        device_id: i32,
        loc: MemoryLocationType,
    ) -> Result<MemoryDesc, EngineError> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.register_memory_with(ptr, size, device_id, loc, RegisterOptions::default()) }
    }

    /// [`Self::register_memory`] with options ([`RegisterOptions::LOCAL_ONLY`]: memory no
    /// peer may touch).
    ///
    /// # Safety
    /// As for [`Self::register_memory`] (peers may touch it only if it is not local-only).
    pub unsafe fn register_memory_with(
        &self,
        ptr: *mut u8,
        size: usize,
        device_id: i32,
        loc: MemoryLocationType,
        opts: RegisterOptions,
    ) -> Result<MemoryDesc, EngineError> {
        match loc {
            MemoryLocationType::Cpu if device_id == -1 => {
                check_host_size(size as u64)?;
                self.add_region(opts, |id| {
                    // SAFETY: forwarded from the caller's contract.
                    unsafe { Region::from_raw(id, ptr, size) }
                })
            }
            MemoryLocationType::Gpu => {
                let dm = self.device_mem(device_id, ptr as u64, size)?;
                self.add_region(opts, |id| {
                    // SAFETY: checked to be device memory of `device_id`; it stays allocated
                    // until deregistration by the caller's contract.
                    unsafe { Region::from_device(id, ptr as u64, size, dm, None) }
                })
            }
            _ => Err(EngineError::UnsupportedMemory(format!(
                "{loc} memory on device {device_id} (CPU memory takes device -1, GPU memory a \
                 device ordinal)"
            ))),
        }
    }

    /// Use `rt` for GPU memory (for example [`gpu::fake::FakeGpu`] in tests). Without this
    /// call the engine detects the runtime at the first GPU registration ([`gpu::detect`]).
    /// Fails once another runtime is in use.
    pub fn set_gpu_runtime(&self, rt: Arc<dyn GpuRuntime>) -> Result<(), EngineError> {
        let mut slot = lock(&self.core.gpu);
        match &*slot {
            Some(cur) if !Arc::ptr_eq(cur, &rt) => Err(EngineError::UnsupportedMemory(format!(
                "GPU runtime {} already in use",
                cur.name()
            ))),
            _ => {
                *slot = Some(rt);
                Ok(())
            }
        }
    }

    /// The engine's GPU runtime, detected on first use.
    pub fn gpu_runtime(&self) -> Result<Arc<dyn GpuRuntime>, EngineError> {
        let mut slot = lock(&self.core.gpu);
        if let Some(rt) = &*slot {
            return Ok(rt.clone());
        }
        let rt = gpu::detect()?;
        *slot = Some(rt.clone());
        Ok(rt)
    }

    /// Check that `ptr..ptr+size` is device memory of GPU `dev` in one allocation; how the
    /// region will reach it.
    fn device_mem(&self, dev: i32, ptr: u64, size: usize) -> Result<DeviceMem, EngineError> {
        let gpu = self.gpu_runtime()?;
        let info = gpu.device_info(dev)?;
        gpu.check_device_range(dev, ptr, size)?;
        // Exported once here, so same-host peers can copy it on their GPU; memory a runtime
        // cannot export (a virtual-memory pool) is staged through host memory instead.
        let ipc = match gpu.ipc_export_range(dev, ptr, size) {
            Ok(e) => {
                let covered: u64 = e
                    .list()
                    .iter()
                    .map(|x| {
                        let lo = x.base.max(ptr);
                        let hi = (x.base + x.size).min(ptr + size as u64);
                        hi.saturating_sub(lo)
                    })
                    .sum();
                if covered < size as u64 {
                    log::info!(
                        "{} of the {size} bytes of GPU memory at {ptr:#x} cannot be shared with \
                         processes of this host (VMM chunks the runtime could not export): \
                         transfers of them to and from those processes stage them through host \
                         memory",
                        size as u64 - covered
                    );
                }
                Some(Arc::new(e))
            }
            // A runtime that exports nothing at all: nothing to say per region.
            Err(e @ crate::gpu::GpuError::Unavailable(_)) => {
                log::debug!("GPU memory at {ptr:#x} is not exported for same-host peers: {e}");
                None
            }
            Err(e) => {
                // Not a silent slow path: between processes of this host this memory moves
                // at host-memory speed instead of the GPU's.
                log::info!(
                    "GPU memory at {ptr:#x} ({size} bytes) cannot be shared with processes of \
                     this host ({e}): transfers to and from them stage it through host memory"
                );
                None
            }
        };
        Ok(DeviceMem {
            dev,
            bus_id: info.bus_id,
            gpu,
            ipc,
        })
    }

    /// Allocate `size` bytes on GPU `dev` and register them (the safe form of GPU
    /// registration; copy data in and out through the returned [`RegisteredBuffer`]).
    pub fn alloc_gpu_buffer(&self, dev: i32, size: usize) -> Result<RegisteredBuffer, EngineError> {
        let gpu = self.gpu_runtime()?;
        let buf = gpu.clone().alloc_device(dev, size)?;
        let ptr = buf.ptr();
        let dm = self.device_mem(dev, ptr, size)?;
        let backing = Backing::device(buf);
        let desc = self.add_region(RegisterOptions::default(), |id| {
            // SAFETY: `backing` owns the allocation and outlives the region.
            unsafe { Region::from_device(id, ptr, size, dm.clone(), Some(backing.clone())) }
        })?;
        // SAFETY: as above.
        let handle = unsafe { Region::from_device(desc.id, ptr, size, dm, Some(backing)) };
        Ok(RegisteredBuffer::new(desc, Arc::new(handle)))
    }

    /// Register a buffer the engine owns (the safe form), as a remote target. Access it
    /// through the returned [`RegisteredBuffer`].
    pub fn register_buffer(&self, buf: Vec<u8>) -> Result<RegisteredBuffer, EngineError> {
        self.register_buffer_with(buf, RegisterOptions::default())
    }

    /// [`Self::register_buffer`] with options ([`RegisterOptions::LOCAL_ONLY`]: a buffer no
    /// peer may touch).
    pub fn register_buffer_with(
        &self,
        buf: Vec<u8>,
        opts: RegisterOptions,
    ) -> Result<RegisteredBuffer, EngineError> {
        check_host_size(buf.len() as u64)?;
        let backing = Backing::new(buf.into_boxed_slice());
        let desc = self.add_region(opts, |id| Region::owned(id, backing.clone()))?;
        // The handle gets its own view: it keeps the memory alive without counting as a user
        // of the registered region, so deregistration never waits for it.
        let region = Arc::new(Region::owned(desc.id, backing));
        Ok(RegisteredBuffer::new(desc, region))
    }

    /// A zero-filled registered buffer of `size` bytes.
    pub fn alloc_buffer(&self, size: usize) -> Result<RegisteredBuffer, EngineError> {
        check_host_size(size as u64)?;
        self.register_buffer(vec![0u8; size])
    }

    /// Make a region with `make` under a fresh random id (one the table does not hold) and
    /// a fresh random access key (none if local-only), put it in the engine's table and on
    /// every shard; its descriptor.
    fn add_region(
        &self,
        opts: RegisterOptions,
        make: impl FnOnce(u32) -> Region,
    ) -> Result<MemoryDesc, EngineError> {
        let core = &self.core;
        let random = |e: rand::Error| EngineError::Random(e.to_string());
        let key = if opts.local_only {
            AccessKey::NONE
        } else {
            random_access_key().map_err(random)?
        };
        let region: SharedRegion = {
            // The id is drawn and taken under one lock: two registrations cannot draw the
            // same one.
            let mut table = write_lock(&core.regions);
            let id = random_mem_id(|id| table.contains_key(&id)).map_err(random)?;
            let region = Arc::new(make(id).with_access_key(key));
            table.insert(id, region.clone());
            region
        };
        let mut desc = MemoryDesc::cpu(&core.key, region.id, region.addr(), region.len() as u64);
        desc.access_key = key;
        if let Some(dm) = region.device() {
            desc.device_id = dm.dev;
            desc.device_bus_id = dm.bus_id.clone();
            // MORI's descriptor carries one legacy handle (VMM chunks are offered on the wire).
            if let Some([ex]) = dm.ipc.as_deref().map(|e| e.list()) {
                if ex.kind == crate::gpu::IpcKind::Legacy {
                    desc.ipc_handle = ex.handle;
                }
            }
            desc.loc = MemoryLocationType::Gpu;
        }
        if let Some(b) = core.backend() {
            match broadcast(&b, |ack| ShardMsg::AddRegion(region.clone(), ack)) {
                // The backend is being removed: the region stays in the engine's table, which
                // the next backend's shards receive whole.
                Ok(()) | Err(EngineError::ShuttingDown) => {}
                Err(e) => {
                    write_lock(&core.regions).remove(&region.id);
                    return Err(e);
                }
            }
        }
        Ok(desc)
    }

    /// Deregister memory. Safe with transfers in flight: new transfers cannot resolve it once
    /// this returns, and it returns only when no chunk is placing into or sending from it.
    /// Transfers that were using it complete or fail within their deadline. Registered again,
    /// the memory gets a new id and access key, so descriptors of this registration are
    /// refused from then on. A descriptor of another registration (its id reused, its key
    /// not) is [`EngineError::UnknownMemory`].
    ///
    /// It blocks on the region's release signal (fired when the last chunk holding it lets
    /// go), for at most three `op_timeout`s (5 s without a backend); past that it fails with
    /// [`EngineError::Busy`] and the region is never freed.
    pub fn deregister_memory(&self, desc: &MemoryDesc) -> Result<(), EngineError> {
        let core = &self.core;
        if desc.engine_key != core.key {
            return Err(EngineError::UnknownMemory(desc.id));
        }
        let region = {
            let mut table = write_lock(&core.regions);
            match table.get(&desc.id) {
                Some(r) if r.access_key() == desc.access_key => table.remove(&desc.id),
                _ => None,
            }
        }
        .ok_or(EngineError::UnknownMemory(desc.id))?;
        let mut limit = NO_BACKEND_RELEASE_LIMIT;
        if let Some(b) = core.backend() {
            match broadcast(&b, |ack| ShardMsg::RemoveRegion(desc.id, ack)) {
                // A backend being removed drops every replica as its shards stop.
                Ok(()) | Err(EngineError::ShuttingDown) => {}
                Err(e) => return Err(e),
            }
            limit = b.shared.cfg.op_timeout * 3;
        }
        // Wait for the chunks still holding it: the region signals when its last `Arc` drops.
        let released = region.released();
        let weak = Arc::downgrade(&region);
        drop(region);
        if released.wait(limit) {
            return Ok(());
        }
        match weak.upgrade() {
            // Released between the timeout and this look.
            None => Ok(()),
            Some(region) => {
                // Keep it alive forever rather than free it under a placement.
                std::mem::forget(region);
                Err(EngineError::Busy(format!(
                    "memory {} still in use after {limit:?}",
                    desc.id
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;

    use super::*;
    use crate::config::{IoEngineConfig, TcpBackendConfig};
    use crate::submit::read_lock;

    #[test]
    fn host_regions_larger_than_physical_memory_are_refused() {
        let ram = total_ram().expect("sysinfo reports the machine's memory");
        assert!(ram >= 1 << 30, "{ram}");
        let engine = IoEngine::new("too_large", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
        let big = ram as usize + 1;
        // Refused before anything is allocated or registered (the pointer is never used).
        let ptr = std::ptr::NonNull::<u8>::dangling().as_ptr();
        // SAFETY: the registration is refused before the range is recorded or touched.
        let e = unsafe { engine.register_memory(ptr, big, -1, MemoryLocationType::Cpu) };
        assert!(
            matches!(e, Err(EngineError::RegionTooLarge { size, ram: r }) if size == big as u64 && r == ram),
            "{e:?}"
        );
        let e = engine.alloc_buffer(1 << 40).unwrap_err();
        assert!(e.to_string().contains("physical memory"), "{e}");
        assert!(read_lock(&engine.core.regions).is_empty());
        // A region within physical memory registers as before.
        let mut mem = vec![0u8; 64];
        // SAFETY: `mem` outlives the registration, which is removed below.
        let md = unsafe {
            engine.register_memory(mem.as_mut_ptr(), mem.len(), -1, MemoryLocationType::Cpu)
        }
        .unwrap();
        engine.deregister_memory(&md).unwrap();
        drop(mem);
    }

    /// `deregister_memory` blocks while a transfer still holds the region and returns `Ok`
    /// once the last holder drops. Without the release signal it would block until its limit
    /// (three `op_timeout`s, half an hour here) and trip the watchdog; one that does not wait
    /// answers before the holder drops (in the window, or with the flag unset).
    #[test]
    fn deregister_returns_once_the_last_in_flight_holder_drops_and_not_before() {
        let engine = IoEngine::new("dereg_signal", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
        engine
            .create_backend(TcpBackendConfig {
                num_shards: Some(1),
                op_timeout: Duration::from_secs(600),
                ..Default::default()
            })
            .unwrap();
        let engine = Arc::new(engine);
        let mut mem = vec![0u8; 64];
        // SAFETY: `mem` outlives the registration (deregistration returns before the end).
        let md = unsafe {
            engine.register_memory(mem.as_mut_ptr(), mem.len(), -1, MemoryLocationType::Cpu)
        }
        .unwrap();
        // What a chunk on a shard holds while it places into or sends from the region.
        let in_flight = read_lock(&engine.core.regions)[&md.id].clone();
        let holder_dropped = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        {
            let (engine, md, flag) = (engine.clone(), md.clone(), holder_dropped.clone());
            std::thread::spawn(move || {
                let r = engine.deregister_memory(&md);
                let _ = tx.send((r, flag.load(Ordering::SeqCst)));
            });
        }
        // Once it is out of the table, new transfers cannot resolve it; the holder remains.
        while read_lock(&engine.core.regions).contains_key(&md.id) {
            std::thread::yield_now();
        }
        // A window in which a deregistration that does not wait would answer (a correct one
        // cannot: the holder is alive), then the holder goes.
        assert!(
            rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "deregister returned while a transfer still held the region"
        );
        holder_dropped.store(true, Ordering::SeqCst);
        drop(in_flight);
        let (r, seen) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("deregister still blocked a minute after the last holder dropped");
        r.expect("deregister once the holder dropped");
        assert!(
            seen,
            "deregister returned while a transfer still held the region"
        );
        drop(mem);
    }
}
