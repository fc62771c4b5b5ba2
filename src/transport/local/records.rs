//! The record stream of a same-host connection: what each direction of its socket carries.
//!
//! Every `send_all` of the connection becomes records. Small parts travel in the socket as
//! `INLINE` records (`u8 1`, `u32 len`, then `len` bytes). A large part stays where it is and
//! travels as a `PULL` record (`u8 2`, `u64 addr`, `u64 len`, `u64 cell`, `u64 token`,
//! `u32 index`): the receiver copies `len` bytes at `addr` out of the sender's memory straight
//! into its destination, checks the sender's `cell` still holds `token` (the bytes were still
//! the sender's to give), then writes `index` into the cell's second word (the sender's send
//! completes once every pulled part of it is acknowledged). A part of GPU memory travels as a
//! `DEVICE` record (`u8 3`, the 64-byte IPC handle of the sender's allocation, `u64 base` (the
//! allocation's address in the sender), `u64 cell`, `u64 token`, `u32 n`, then `n` pairs of
//! `u64 offset`, `u64 len` within the allocation, in payload order): the receiver either takes
//! it (opens the handle, copies on its GPU, checks the token, writes 1 into the cell's second
//! word) or declines it (writes [`DECLINED`] or [`DECLINED_FOR_GOOD`]); after a decline the
//! same bytes follow as ordinary records. A `RING` record (`u8 4`, version 9) says the rest
//! of the sender's stream is in the shared-memory ring the receiver offered ([`super::ring`]).
//! A `DEVICES` record (`u8 5`, version 10) offers GPU memory as DEVICE does, in up to
//! [`MAX_DEVICE_ALLOCS`] allocations of any [`IpcKind`] (VMM memory maps one per chunk):
//! `u64 cell`, `u64 token`, `u16 k`, `u32 n`, then `k` allocations (`u8 kind`, the 64-byte
//! handle, `u64 base`, `u64 size`), then `n` parts (`u16 alloc`, `u64 offset`, `u64 len`).
//! All little-endian.

use std::fmt;

use crate::gpu::{IpcExport, IpcKind, IPC_HANDLE_BYTES};

/// Tag of an INLINE record.
pub(crate) const INLINE: u8 = 1;
/// Tag of a PULL record.
pub(crate) const PULL: u8 = 2;
/// Tag of a DEVICE record.
pub(crate) const DEVICE: u8 = 3;
/// Tag of the RING record (version 9): the sender's next bytes are in the ring the receiver
/// offered, and the socket carries only doorbells from here on.
pub(crate) const RING: u8 = 4;
/// Tag of a DEVICES record (version 10): device parts in several allocations of any kind.
pub(crate) const DEVICES: u8 = 5;
/// Bytes of a DEVICES record before its allocations.
pub(crate) const DEVICES_HEAD: usize = 1 + 8 + 8 + 2 + 4;
/// Bytes of one allocation of a DEVICES record.
pub(crate) const DEVICES_ALLOC: usize = 1 + IPC_HANDLE_BYTES + 8 + 8;
/// Bytes of one part of a DEVICES record.
pub(crate) const DEVICES_PART: usize = 2 + 8 + 8;
/// Most allocations a DEVICES record names (a chunk spread over more is staged).
pub(crate) const MAX_DEVICE_ALLOCS: usize = 256;
/// Bytes of a DEVICE record before its pairs.
pub(crate) const DEVICE_HEAD: usize = 1 + IPC_HANDLE_BYTES + 8 + 8 + 8 + 4;
/// Most pairs a DEVICE record carries (a chunk of more pieces is staged).
pub(crate) const MAX_DEVICE_PAIRS: usize = 1024;
/// Written into the cell by a receiver that declines a DEVICE record this time (its
/// destination is host memory): the bytes follow as ordinary records.
pub(crate) const DECLINED: u64 = 1 << 40;
/// Written by a receiver that cannot take DEVICE records from this sender at all (it cannot
/// open its handles): the bytes follow, and the sender offers none again on this connection.
pub(crate) const DECLINED_FOR_GOOD: u64 = (1 << 40) + 1;
/// Bytes of an INLINE record's head.
pub(crate) const INLINE_HEAD: usize = 1 + 4;
/// Bytes of a PULL record.
pub(crate) const PULL_HEAD: usize = 1 + 8 + 8 + 8 + 8 + 4;
/// Parts of at least this many bytes are pulled by the receiver; smaller ones travel in the
/// socket (a cross-memory copy costs a syscall and an acknowledgement; below this the
/// socket's own copy is as cheap, and the frame reader takes such payloads into its buffer
/// anyway).
pub(crate) const PULL_MIN_BYTES: usize = 64 << 10;
/// Most bytes one INLINE record carries (a longer run of small parts takes several).
pub(crate) const MAX_INLINE: usize = 1 << 30;

/// A part the receiver copies out of the sender's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pull {
    /// Where the bytes are, in the sender.
    pub(crate) addr: u64,
    /// How many.
    pub(crate) len: u64,
    /// The sender's cell: `token` while the bytes are valid, then the last index acknowledged.
    pub(crate) cell: u64,
    /// The value the cell's first word holds while the sender waits for this send.
    pub(crate) token: u64,
    /// This part's position among the pulled parts of its send, from 1.
    pub(crate) index: u32,
}

/// Which device records a connection carries, by its version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum DeviceRecords {
    /// None (version 7): GPU memory is staged.
    None,
    /// DEVICE records only (versions 8 and 9): one legacy allocation per offer.
    Single,
    /// DEVICE and DEVICES records (version 10).
    Sets,
}

impl DeviceRecords {
    /// What a connection speaking `version` carries.
    pub(crate) fn of_version(version: u32) -> Self {
        use crate::proto::limits::{DEVICE_PARTS_VERSION, DEVICE_SETS_VERSION};
        if version >= DEVICE_SETS_VERSION {
            Self::Sets
        } else if version >= DEVICE_PARTS_VERSION {
            Self::Single
        } else {
            Self::None
        }
    }
}

/// One part of a device offer: `len` bytes at `off` of allocation `alloc` (an index into
/// [`Device::allocs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DevicePart {
    /// Which of the offer's allocations.
    pub(crate) alloc: u16,
    /// Offset in that allocation.
    pub(crate) off: u64,
    /// Bytes.
    pub(crate) len: u64,
}

/// Parts of the sender's GPU memory the receiver may copy through IPC handles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Device {
    /// The sender's allocations: kind, handle, base, size (a DEVICE record sends no size:
    /// 0, the receiver learns it from its runtime when it opens the handle).
    pub(crate) allocs: Vec<IpcExport>,
    /// The sender's cell, as for [`Pull`].
    pub(crate) cell: u64,
    /// The cell's value while the sender waits.
    pub(crate) token: u64,
    /// The parts, in payload order.
    pub(crate) parts: Vec<DevicePart>,
}

impl Device {
    /// Payload bytes it stands for.
    pub(crate) fn len(&self) -> u64 {
        self.parts.iter().map(|p| p.len).sum()
    }

    /// Whether a version-8 DEVICE record can carry it (one legacy allocation).
    pub(crate) fn fits_device_record(&self) -> bool {
        matches!(&self.allocs[..], [a] if a.kind == IpcKind::Legacy)
    }
}

/// A record's head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// This many bytes follow in the stream.
    Inline(u32),
    /// A part to pull.
    Pull(Pull),
    /// Parts of GPU memory offered.
    Device(Device),
    /// The rest of the stream is in the receiver's ring.
    Ring,
}

/// A record head that cannot be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BadRecord(pub(crate) u8);

impl fmt::Display for BadRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad same-host record (tag {})", self.0)
    }
}

/// The record head at the start of `buf` and its size; `Ok(None)` while it is incomplete.
pub(crate) fn parse(buf: &[u8]) -> Result<Option<(Record, usize)>, BadRecord> {
    let Some(&tag) = buf.first() else {
        return Ok(None);
    };
    let u64_at = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().unwrap_or_default());
    match tag {
        INLINE if buf.len() < INLINE_HEAD => Ok(None),
        INLINE => {
            let len = u32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]);
            if len == 0 || len as usize > MAX_INLINE {
                return Err(BadRecord(tag));
            }
            Ok(Some((Record::Inline(len), INLINE_HEAD)))
        }
        PULL if buf.len() < PULL_HEAD => Ok(None),
        PULL => {
            let p = Pull {
                addr: u64_at(1),
                len: u64_at(9),
                cell: u64_at(17),
                token: u64_at(25),
                index: u32::from_le_bytes([buf[33], buf[34], buf[35], buf[36]]),
            };
            if p.len == 0 || p.token == 0 || p.index == 0 || p.addr.checked_add(p.len).is_none() {
                return Err(BadRecord(tag));
            }
            Ok(Some((Record::Pull(p), PULL_HEAD)))
        }
        DEVICE if buf.len() < DEVICE_HEAD => Ok(None),
        DEVICE => {
            let mut handle = [0u8; IPC_HANDLE_BYTES];
            handle.copy_from_slice(&buf[1..1 + IPC_HANDLE_BYTES]);
            let at = 1 + IPC_HANDLE_BYTES;
            let (base, cell, token) = (u64_at(at), u64_at(at + 8), u64_at(at + 16));
            let n = u32::from_le_bytes(buf[at + 24..at + 28].try_into().unwrap_or_default());
            let n = n as usize;
            if n == 0 || n > MAX_DEVICE_PAIRS || token == 0 {
                return Err(BadRecord(tag));
            }
            let used = DEVICE_HEAD + 16 * n;
            if buf.len() < used {
                return Ok(None);
            }
            let parts: Vec<DevicePart> = (0..n)
                .map(|i| DevicePart {
                    alloc: 0,
                    off: u64_at(DEVICE_HEAD + 16 * i),
                    len: u64_at(DEVICE_HEAD + 16 * i + 8),
                })
                .collect();
            check_parts(&parts, &[u64::MAX]).ok_or(BadRecord(tag))?;
            let d = Device {
                allocs: vec![IpcExport::legacy(handle, base, 0)],
                cell,
                token,
                parts,
            };
            Ok(Some((Record::Device(d), used)))
        }
        DEVICES if buf.len() < DEVICES_HEAD => Ok(None),
        DEVICES => {
            let (cell, token) = (u64_at(1), u64_at(9));
            let k = u16::from_le_bytes([buf[17], buf[18]]) as usize;
            let n = u32::from_le_bytes([buf[19], buf[20], buf[21], buf[22]]) as usize;
            if k == 0 || k > MAX_DEVICE_ALLOCS || n == 0 || n > MAX_DEVICE_PAIRS || token == 0 {
                return Err(BadRecord(tag));
            }
            let at_parts = DEVICES_HEAD + DEVICES_ALLOC * k;
            let used = at_parts + DEVICES_PART * n;
            if buf.len() < used {
                return Ok(None);
            }
            let mut allocs = Vec::with_capacity(k);
            for i in 0..k {
                let at = DEVICES_HEAD + DEVICES_ALLOC * i;
                let kind = IpcKind::from_wire(buf[at]).ok_or(BadRecord(tag))?;
                let mut handle = [0u8; IPC_HANDLE_BYTES];
                handle.copy_from_slice(&buf[at + 1..at + 1 + IPC_HANDLE_BYTES]);
                let (base, size) = (u64_at(at + 65), u64_at(at + 73));
                if size == 0 || base.checked_add(size).is_none() {
                    return Err(BadRecord(tag));
                }
                allocs.push(IpcExport {
                    kind,
                    handle,
                    base,
                    size,
                });
            }
            let parts: Vec<DevicePart> = (0..n)
                .map(|i| {
                    let at = at_parts + DEVICES_PART * i;
                    DevicePart {
                        alloc: u16::from_le_bytes([buf[at], buf[at + 1]]),
                        off: u64_at(at + 2),
                        len: u64_at(at + 10),
                    }
                })
                .collect();
            let sizes: Vec<u64> = allocs.iter().map(|a| a.size).collect();
            check_parts(&parts, &sizes).ok_or(BadRecord(tag))?;
            let d = Device {
                allocs,
                cell,
                token,
                parts,
            };
            Ok(Some((Record::Device(d), used)))
        }
        RING => Ok(Some((Record::Ring, 1))),
        t => Err(BadRecord(t)),
    }
}

/// Whether every part is non-empty, inside its allocation (of `sizes`) and the whole adds
/// up without overflow.
fn check_parts(parts: &[DevicePart], sizes: &[u64]) -> Option<()> {
    let mut total = 0u64;
    for p in parts {
        let size = *sizes.get(p.alloc as usize)?;
        if p.len == 0 || p.off.checked_add(p.len)? > size {
            return None;
        }
        total = total.checked_add(p.len)?;
    }
    Some(())
}

/// Append `d` as a DEVICE record (version 8: one legacy allocation, see
/// [`Device::fits_device_record`]) or, with `sets`, a DEVICES record (version 10). Its
/// sender keeps to the limits ([`MAX_DEVICE_PAIRS`] parts, none empty, [`MAX_DEVICE_ALLOCS`]
/// allocations): a receiver refuses any other.
pub(crate) fn put_device(d: &Device, sets: bool, out: &mut Vec<u8>) {
    if !sets {
        debug_assert!(d.fits_device_record());
        let a = &d.allocs[0];
        out.push(DEVICE);
        out.extend_from_slice(&a.handle);
        for v in [a.base, d.cell, d.token] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(d.parts.len() as u32).to_le_bytes());
        for p in &d.parts {
            out.extend_from_slice(&p.off.to_le_bytes());
            out.extend_from_slice(&p.len.to_le_bytes());
        }
        return;
    }
    out.push(DEVICES);
    for v in [d.cell, d.token] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(d.allocs.len() as u16).to_le_bytes());
    out.extend_from_slice(&(d.parts.len() as u32).to_le_bytes());
    for a in &d.allocs {
        out.push(a.kind as u8);
        out.extend_from_slice(&a.handle);
        out.extend_from_slice(&a.base.to_le_bytes());
        out.extend_from_slice(&a.size.to_le_bytes());
    }
    for p in &d.parts {
        out.extend_from_slice(&p.alloc.to_le_bytes());
        out.extend_from_slice(&p.off.to_le_bytes());
        out.extend_from_slice(&p.len.to_le_bytes());
    }
}

/// Append an INLINE head for `len` bytes.
pub(crate) fn put_inline(len: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&inline_head(len));
}

/// The head of an INLINE record of `len` bytes.
pub(crate) fn inline_head(len: usize) -> [u8; 5] {
    debug_assert!(len > 0 && len <= MAX_INLINE);
    let l = (len as u32).to_le_bytes();
    [INLINE, l[0], l[1], l[2], l[3]]
}

/// Append a PULL record.
pub(crate) fn put_pull(p: &Pull, out: &mut Vec<u8>) {
    out.push(PULL);
    for v in [p.addr, p.len, p.cell, p.token] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&p.index.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_wait_for_their_whole_head() {
        let p = Pull {
            addr: 0x7f00_0000_1000,
            len: 1 << 20,
            cell: 0x5555_0000,
            token: 42,
            index: 3,
        };
        let mut b = Vec::new();
        put_inline(7, &mut b);
        put_pull(&p, &mut b);
        assert_eq!(parse(&b), Ok(Some((Record::Inline(7), INLINE_HEAD))));
        let rest = &b[INLINE_HEAD..];
        assert_eq!(parse(rest), Ok(Some((Record::Pull(p), PULL_HEAD))));
        for n in 0..PULL_HEAD {
            assert_eq!(parse(&rest[..n]), Ok(None), "{n} bytes");
        }
        let d = Device {
            allocs: vec![IpcExport::legacy([9; IPC_HANDLE_BYTES], 0x7000_0000, 0)],
            cell: 0x5555_0000,
            token: 7,
            parts: parts(&[(0, 0, 1 << 20), (0, 4 << 20, 4096)]),
        };
        let mut b = Vec::new();
        put_device(&d, false, &mut b);
        assert_eq!(b.len(), DEVICE_HEAD + 32);
        assert_eq!(d.len(), (1 << 20) + 4096);
        assert_eq!(parse(&b), Ok(Some((Record::Device(d), b.len()))));
        for n in 0..b.len() {
            assert_eq!(parse(&b[..n]), Ok(None), "{n} bytes");
        }
        // Several allocations of both kinds (VMM chunks side by side, a legacy one).
        let d = Device {
            allocs: vec![
                IpcExport::posix_fd(17, 0xfeed, 0x8000_0000, 20 << 20),
                IpcExport::posix_fd(18, 0xbeef, 0x8140_0000, 20 << 20),
                IpcExport::legacy([3; IPC_HANDLE_BYTES], 0x9000_0000, 4096),
                IpcExport::fabric([4; IPC_HANDLE_BYTES], 0xa000_0000, 2 << 20),
            ],
            cell: 0x5555_0000,
            token: 9,
            parts: parts(&[
                (0, (20 << 20) - 8, 8),
                (1, 0, 8),
                (2, 0, 4096),
                (1, 64, 1),
                (3, 1 << 20, 1 << 20),
            ]),
        };
        let mut b = Vec::new();
        put_device(&d, true, &mut b);
        assert_eq!(b.len(), DEVICES_HEAD + 4 * DEVICES_ALLOC + 5 * DEVICES_PART);
        assert_eq!(parse(&b), Ok(Some((Record::Device(d.clone()), b.len()))));
        assert_eq!(d.allocs[1].fd(), Some(18));
        assert!(!d.fits_device_record());
        for n in 0..b.len() {
            assert_eq!(parse(&b[..n]), Ok(None), "{n} bytes");
        }
    }

    fn parts(p: &[(u16, u64, u64)]) -> Vec<DevicePart> {
        p.iter()
            .map(|&(alloc, off, len)| DevicePart { alloc, off, len })
            .collect()
    }

    #[test]
    fn impossible_records_are_refused() {
        let ok = Pull {
            addr: 8,
            len: 8,
            cell: 8,
            token: 1,
            index: 1,
        };
        for bad in [
            Pull { len: 0, ..ok },
            Pull { token: 0, ..ok },
            Pull { index: 0, ..ok },
            Pull {
                addr: u64::MAX,
                ..ok
            },
        ] {
            let mut b = Vec::new();
            put_pull(&bad, &mut b);
            assert_eq!(parse(&b), Err(BadRecord(PULL)), "{bad:?}");
        }
        assert_eq!(parse(&[INLINE, 0, 0, 0, 0]), Err(BadRecord(INLINE)));
        let dev = |p: &[(u16, u64, u64)], token| Device {
            allocs: vec![IpcExport::legacy([1; IPC_HANDLE_BYTES], 4096, 0)],
            cell: 8,
            token,
            parts: parts(p),
        };
        for bad in [
            dev(&[(0, 0, 0)], 1),
            dev(&[(0, u64::MAX, 2)], 1),
            dev(&[(0, 0, u64::MAX), (0, 0, 2)], 1),
            dev(&[(0, 0, 1)], 0),
            dev(&[(0, 0, 1); MAX_DEVICE_PAIRS + 1], 1),
        ] {
            let mut b = Vec::new();
            put_device(&bad, false, &mut b);
            assert_eq!(parse(&b), Err(BadRecord(DEVICE)), "{:?}", &bad.parts[..1]);
        }
        // DEVICES: parts outside their allocation or naming none, empty or too many
        // allocations, an unknown kind, an allocation of no bytes or past the address space.
        let two = |p: &[(u16, u64, u64)]| Device {
            allocs: vec![
                IpcExport::posix_fd(3, 1, 0x1000, 4096),
                IpcExport::legacy([2; IPC_HANDLE_BYTES], 0x4000, 8192),
            ],
            cell: 8,
            token: 1,
            parts: parts(p),
        };
        let mut many = two(&[(0, 0, 1)]);
        many.allocs = vec![many.allocs[0]; MAX_DEVICE_ALLOCS + 1];
        let mut none = two(&[(0, 0, 1)]);
        none.allocs.clear();
        let mut empty = two(&[(0, 0, 1)]);
        empty.allocs[1].size = 0;
        let mut wraps = two(&[(0, 0, 1)]);
        wraps.allocs[1].base = u64::MAX - 10;
        for bad in [
            two(&[(0, 4090, 7)]),
            two(&[(1, 8192, 1)]),
            two(&[(2, 0, 1)]),
            two(&[(1, 0, 0)]),
            many,
            none,
            empty,
            wraps,
        ] {
            let mut b = Vec::new();
            put_device(&bad, true, &mut b);
            assert_eq!(parse(&b), Err(BadRecord(DEVICES)), "{bad:?}");
        }
        let mut b = Vec::new();
        put_device(&two(&[(0, 4095, 1), (1, 0, 8192)]), true, &mut b);
        assert!(parse(&b).unwrap().is_some());
        b[DEVICES_HEAD] = 9;
        assert_eq!(parse(&b), Err(BadRecord(DEVICES)), "unknown kind");
        assert_eq!(parse(&[9]), Err(BadRecord(9)));
        assert_eq!(parse(&[6]), Err(BadRecord(6)));
        assert_eq!(parse(&[RING, 1]), Ok(Some((Record::Ring, 1))));
    }
}
