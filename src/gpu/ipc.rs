//! The IPC mappings a runtime opened: one per exported allocation and exporting process,
//! reused by every transfer, replaced when the exporter reuses the address for a new
//! allocation, bounded in number, and closed once unused for a while.
//!
//! A mapping pins its allocation: memory the exporter frees stays allocated on its GPU
//! while another process has it open. So mappings not used for [`IDLE_CLOSE`] are closed
//! (shard 0 sweeps once a second, [`sweep_all`]); a mapping is never closed while a copy
//! uses it (each holds an [`IpcLease`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::{GpuError, IpcExport, IpcKind, IPC_HANDLE_BYTES};

/// Mappings kept open at most; beyond it unused ones are closed first, and if all are in use
/// opening is refused (peers then stage through host memory).
pub(crate) const MAX_OPENED: usize = 4096;

/// How long an unused mapping stays open.
pub const IDLE_CLOSE: Duration = Duration::from_secs(10);

/// Closes one mapping: its device, its base and size in this process, and how it was opened.
pub(crate) type Closer = Box<dyn Fn(i32, u64, u64, IpcKind) + Send + Sync>;

/// An exported allocation as this process reaches it, held open while the lease lives.
#[derive(Debug, Clone)]
pub struct IpcLease {
    /// Where the allocation starts in this process.
    pub base: u64,
    /// Its size in bytes.
    pub size: u64,
    _use: Option<Arc<()>>,
}

impl IpcLease {
    /// Memory of this very process (nothing was opened, nothing to close).
    pub fn own(base: u64, size: u64) -> Self {
        Self {
            base,
            size,
            _use: None,
        }
    }
}

#[derive(Debug)]
struct Entry {
    kind: IpcKind,
    handle: [u8; IPC_HANDLE_BYTES],
    dev: i32,
    base: u64,
    size: u64,
    uses: Arc<()>,
    last: Instant,
}

impl Entry {
    fn unused_since(&self, now: Instant, idle: Duration) -> bool {
        Arc::strong_count(&self.uses) == 1 && now.duration_since(self.last) >= idle
    }
}

/// Opened mappings by (exporting process, allocation base there).
pub(crate) struct IpcCache {
    map: Mutex<HashMap<(u32, u64), Entry>>,
    close: Closer,
}

impl std::fmt::Debug for IpcCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcCache").finish_non_exhaustive()
    }
}

/// Every cache of the process, for the sweep.
static CACHES: Mutex<Vec<Weak<IpcCache>>> = Mutex::new(Vec::new());

/// Close the IPC mappings of every runtime of this process that no copy has used for `idle`
/// (engines do this themselves once a second with [`IDLE_CLOSE`]; a process that knows its
/// peers freed memory may call it sooner). Mappings in use stay open.
pub fn sweep_all(idle: Duration) {
    let caches: Vec<Arc<IpcCache>> = {
        let mut v = CACHES.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(Weak::upgrade).collect()
    };
    for c in caches {
        c.sweep(idle);
    }
}

impl IpcCache {
    /// A cache whose mappings `close` closes, registered for the sweep.
    pub(crate) fn new(close: Closer) -> Arc<Self> {
        let c = Arc::new(Self {
            map: Mutex::new(HashMap::new()),
            close,
        });
        CACHES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&c));
        c
    }

    /// The mapping of `export` from process `pid` on device `dev`: cached, or opened with
    /// `open` (base and size in this process). A cached mapping of the same address under
    /// another handle (the exporter freed that allocation and made a new one there, which it
    /// can only do once every transfer from the old one was acknowledged) is closed first.
    pub(crate) fn get_or_open(
        &self,
        dev: i32,
        pid: u32,
        export: &IpcExport,
        open: impl FnOnce(&[u8; IPC_HANDLE_BYTES]) -> Result<(u64, u64), GpuError>,
    ) -> Result<IpcLease, GpuError> {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let key = (pid, export.base);
        let now = Instant::now();
        if let Some(e) = m.get_mut(&key) {
            if e.handle == export.handle && e.kind == export.kind && e.dev == dev {
                e.last = now;
                return Ok(IpcLease {
                    base: e.base,
                    size: e.size,
                    _use: Some(e.uses.clone()),
                });
            }
            if e.handle != export.handle || e.kind != export.kind {
                (self.close)(e.dev, e.base, e.size, e.kind);
                m.remove(&key);
            }
        }
        if m.len() >= MAX_OPENED {
            self.close_unused(&mut m, now, Duration::ZERO);
        }
        if m.len() >= MAX_OPENED {
            return Err(GpuError::Call {
                call: "ipc open",
                msg: format!("{MAX_OPENED} IPC mappings are open and in use"),
            });
        }
        let (base, size) = open(&export.handle)?;
        let uses = Arc::new(());
        let lease = IpcLease {
            base,
            size,
            _use: Some(uses.clone()),
        };
        m.insert(
            key,
            Entry {
                kind: export.kind,
                handle: export.handle,
                dev,
                base,
                size,
                uses,
                last: now,
            },
        );
        Ok(lease)
    }

    /// Close the mappings no copy has used for `idle`.
    fn sweep(&self, idle: Duration) {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        self.close_unused(&mut m, Instant::now(), idle);
    }

    fn close_unused(&self, m: &mut HashMap<(u32, u64), Entry>, now: Instant, idle: Duration) {
        m.retain(|_, e| {
            let close = e.unused_since(now, idle);
            if close {
                (self.close)(e.dev, e.base, e.size, e.kind);
            }
            !close
        });
    }

    /// How many mappings are open.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn export(tag: u8, base: u64) -> IpcExport {
        IpcExport::legacy([tag; IPC_HANDLE_BYTES], base, 4096)
    }

    /// The (device, base) pairs a cache closed.
    type Closed = Arc<Mutex<Vec<(i32, u64)>>>;

    fn recording() -> (Arc<IpcCache>, Closed) {
        let closed = Arc::new(Mutex::new(Vec::new()));
        let c = closed.clone();
        let cache = IpcCache::new(Box::new(move |dev, base, _, _| {
            c.lock().unwrap().push((dev, base))
        }));
        (cache, closed)
    }

    #[test]
    fn opens_once_and_replaces_a_reused_address() {
        let (c, closed) = recording();
        let opens = RefCell::new(0u64);
        let open = |_: &[u8; IPC_HANDLE_BYTES]| {
            *opens.borrow_mut() += 1;
            Ok((0x1000 * *opens.borrow(), 4096))
        };
        let a = c.get_or_open(0, 7, &export(1, 0xa000), open).unwrap();
        let again = c.get_or_open(0, 7, &export(1, 0xa000), open).unwrap();
        assert_eq!(a.base, again.base);
        assert_eq!(*opens.borrow(), 1);
        // Another process exporting the same address is another mapping.
        c.get_or_open(0, 8, &export(1, 0xa000), open).unwrap();
        assert_eq!((*opens.borrow(), c.len()), (2, 2));
        // A new handle at the same address: the old mapping is closed, a new one opened.
        let b = c.get_or_open(0, 7, &export(2, 0xa000), open).unwrap();
        assert_ne!(a.base, b.base);
        assert_eq!(*closed.lock().unwrap(), vec![(0, a.base)]);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn unused_mappings_close_after_the_idle_time_and_leased_ones_never() {
        let (c, closed) = recording();
        let n = AtomicU64::new(0);
        let open =
            |_: &[u8; IPC_HANDLE_BYTES]| Ok((0x1000 * (n.fetch_add(1, Ordering::Relaxed) + 1), 64));
        let held = c.get_or_open(0, 1, &export(1, 0x10000), open).unwrap();
        drop(c.get_or_open(0, 1, &export(2, 0x20000), open).unwrap());
        c.sweep(Duration::from_secs(3600));
        assert_eq!(c.len(), 2, "used too recently");
        c.sweep(Duration::ZERO);
        assert_eq!(c.len(), 1, "the unused one closed");
        assert_eq!(closed.lock().unwrap().len(), 1);
        sweep_all(Duration::ZERO);
        assert_eq!(c.len(), 1, "a leased mapping stays open");
        drop(held);
        sweep_all(Duration::ZERO);
        assert_eq!(c.len(), 0);
        assert_eq!(closed.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_refused_open_caches_nothing_and_a_full_table_frees_unused_mappings() {
        let (c, _) = recording();
        let refuse = |_: &[u8; IPC_HANDLE_BYTES]| {
            Err(GpuError::Call {
                call: "open",
                msg: "refused".into(),
            })
        };
        assert!(c.get_or_open(0, 1, &export(1, 0), refuse).is_err());
        assert_eq!(c.len(), 0);
        let mut leases = Vec::new();
        for i in 0..MAX_OPENED as u64 {
            let ok = |_: &[u8; IPC_HANDLE_BYTES]| Ok((i, 1));
            leases.push(c.get_or_open(0, 1, &export(1, i << 12), ok).unwrap());
        }
        let ok = |_: &[u8; IPC_HANDLE_BYTES]| Ok((0, 1));
        let over = c.get_or_open(0, 1, &export(1, u64::MAX), ok);
        assert!(matches!(over, Err(GpuError::Call { .. })), "all in use");
        leases.pop();
        assert!(
            c.get_or_open(0, 1, &export(1, u64::MAX), ok).is_ok(),
            "an unused one went"
        );
        assert_eq!(c.len(), MAX_OPENED);
    }
}
