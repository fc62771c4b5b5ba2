//! The IPC mappings a runtime opened: one per exported allocation and exporting process,
//! reused by every transfer, replaced when the exporter reuses the address for a new
//! allocation, and bounded in number (each pins its allocation in the exporter).

use std::collections::HashMap;
use std::sync::Mutex;

use super::{GpuError, IpcExport, IpcMapping, IPC_HANDLE_BYTES};

/// Mappings kept open at most; beyond it opening is refused (peers then stage through host
/// memory) rather than closing one another shard may be copying from.
pub(crate) const MAX_OPENED: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Entry {
    handle: [u8; IPC_HANDLE_BYTES],
    dev: i32,
    map: IpcMapping,
}

/// Opened mappings by (exporting process, allocation base there).
#[derive(Debug, Default)]
pub(crate) struct IpcCache {
    map: Mutex<HashMap<(u32, u64), Entry>>,
}

impl IpcCache {
    /// The mapping of `export` from process `pid` on device `dev`: cached, or opened with
    /// `open`. A cached mapping of the same address under another handle (the exporter freed
    /// that allocation and made a new one there, which it can only do once every transfer
    /// from the old one was acknowledged) is closed with `close(dev, base)` first.
    pub(crate) fn get_or_open(
        &self,
        dev: i32,
        pid: u32,
        export: &IpcExport,
        open: impl FnOnce(&[u8; IPC_HANDLE_BYTES]) -> Result<IpcMapping, GpuError>,
        close: impl Fn(i32, u64),
    ) -> Result<IpcMapping, GpuError> {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let key = (pid, export.base);
        if let Some(e) = m.get(&key) {
            if e.handle == export.handle && e.dev == dev {
                return Ok(e.map);
            }
            if e.handle != export.handle {
                close(e.dev, e.map.base);
                m.remove(&key);
            }
        }
        if m.len() >= MAX_OPENED {
            return Err(GpuError::Call {
                call: "ipc open",
                msg: format!("{MAX_OPENED} IPC mappings are open already"),
            });
        }
        let map = open(&export.handle)?;
        m.insert(
            key,
            Entry {
                handle: export.handle,
                dev,
                map,
            },
        );
        Ok(map)
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

    fn export(tag: u8, base: u64) -> IpcExport {
        IpcExport {
            handle: [tag; IPC_HANDLE_BYTES],
            base,
            size: 4096,
        }
    }

    #[test]
    fn opens_once_and_replaces_a_reused_address() {
        let c = IpcCache::default();
        let opens = RefCell::new(0u64);
        let closed = RefCell::new(Vec::new());
        let open = |_: &[u8; IPC_HANDLE_BYTES]| {
            *opens.borrow_mut() += 1;
            Ok(IpcMapping {
                base: 0x1000 * *opens.borrow(),
                size: 4096,
            })
        };
        let close = |dev, base| closed.borrow_mut().push((dev, base));
        let a = c
            .get_or_open(0, 7, &export(1, 0xa000), open, close)
            .unwrap();
        let again = c
            .get_or_open(0, 7, &export(1, 0xa000), open, close)
            .unwrap();
        assert_eq!(a, again);
        assert_eq!(*opens.borrow(), 1);
        // Another process exporting the same address is another mapping.
        c.get_or_open(0, 8, &export(1, 0xa000), open, close)
            .unwrap();
        assert_eq!((*opens.borrow(), c.len()), (2, 2));
        // A new handle at the same address: the old mapping is closed, a new one opened.
        let b = c
            .get_or_open(0, 7, &export(2, 0xa000), open, close)
            .unwrap();
        assert_ne!(a, b);
        assert_eq!(*closed.borrow(), vec![(0, a.base)]);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn a_refused_open_caches_nothing_and_the_count_is_bounded() {
        let c = IpcCache::default();
        let refuse = |_: &[u8; IPC_HANDLE_BYTES]| {
            Err(GpuError::Call {
                call: "open",
                msg: "refused".into(),
            })
        };
        assert!(c
            .get_or_open(0, 1, &export(1, 0), refuse, |_, _| {})
            .is_err());
        assert_eq!(c.len(), 0);
        for i in 0..MAX_OPENED as u64 {
            let ok = |_: &[u8; IPC_HANDLE_BYTES]| Ok(IpcMapping { base: i, size: 1 });
            c.get_or_open(0, 1, &export(1, i << 12), ok, |_, _| {})
                .unwrap();
        }
        let ok = |_: &[u8; IPC_HANDLE_BYTES]| Ok(IpcMapping { base: 0, size: 1 });
        let over = c.get_or_open(0, 1, &export(1, u64::MAX), ok, |_, _| {});
        assert!(matches!(over, Err(GpuError::Call { .. })), "{over:?}");
    }
}
