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
//! All little-endian.

use std::fmt;

use crate::gpu::{IpcExport, IPC_HANDLE_BYTES};

/// Tag of an INLINE record.
pub(crate) const INLINE: u8 = 1;
/// Tag of a PULL record.
pub(crate) const PULL: u8 = 2;
/// Tag of a DEVICE record.
pub(crate) const DEVICE: u8 = 3;
/// Tag of the RING record (version 9): the sender's next bytes are in the ring the receiver
/// offered, and the socket carries only doorbells from here on.
pub(crate) const RING: u8 = 4;
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

/// Parts of the sender's GPU memory the receiver may copy through an IPC handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Device {
    /// The sender's allocation: handle, base (its size is not sent: the receiver learns it
    /// from its own runtime when it opens the handle).
    pub(crate) export: IpcExport,
    /// The sender's cell, as for [`Pull`].
    pub(crate) cell: u64,
    /// The cell's value while the sender waits.
    pub(crate) token: u64,
    /// (offset in the allocation, length) in payload order.
    pub(crate) parts: Vec<(u64, u64)>,
}

impl Device {
    /// Payload bytes it stands for.
    pub(crate) fn len(&self) -> u64 {
        self.parts.iter().map(|p| p.1).sum()
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
            let parts: Vec<(u64, u64)> = (0..n)
                .map(|i| {
                    (
                        u64_at(DEVICE_HEAD + 16 * i),
                        u64_at(DEVICE_HEAD + 16 * i + 8),
                    )
                })
                .collect();
            let mut total = 0u64;
            for &(off, len) in &parts {
                total = match (len, off.checked_add(len), total.checked_add(len)) {
                    (1.., Some(_), Some(t)) => t,
                    _ => return Err(BadRecord(tag)),
                };
            }
            let export = IpcExport {
                handle,
                base,
                size: 0,
            };
            let d = Device {
                export,
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

/// Append a DEVICE record (its sender keeps to at most [`MAX_DEVICE_PAIRS`] parts, none
/// empty: a receiver refuses any other).
pub(crate) fn put_device(d: &Device, out: &mut Vec<u8>) {
    out.push(DEVICE);
    out.extend_from_slice(&d.export.handle);
    for v in [d.export.base, d.cell, d.token] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(d.parts.len() as u32).to_le_bytes());
    for &(off, len) in &d.parts {
        out.extend_from_slice(&off.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
    }
}

/// Append an INLINE head for `len` bytes.
pub(crate) fn put_inline(len: usize, out: &mut Vec<u8>) {
    debug_assert!(len > 0 && len <= MAX_INLINE);
    out.push(INLINE);
    out.extend_from_slice(&(len as u32).to_le_bytes());
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
            export: IpcExport {
                handle: [9; IPC_HANDLE_BYTES],
                base: 0x7000_0000,
                size: 0,
            },
            cell: 0x5555_0000,
            token: 7,
            parts: vec![(0, 1 << 20), (4 << 20, 4096)],
        };
        let mut b = Vec::new();
        put_device(&d, &mut b);
        assert_eq!(b.len(), DEVICE_HEAD + 32);
        assert_eq!(d.len(), (1 << 20) + 4096);
        assert_eq!(parse(&b), Ok(Some((Record::Device(d), b.len()))));
        for n in 0..b.len() {
            assert_eq!(parse(&b[..n]), Ok(None), "{n} bytes");
        }
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
        let dev = |parts: Vec<(u64, u64)>, token| Device {
            export: IpcExport {
                handle: [1; IPC_HANDLE_BYTES],
                base: 4096,
                size: 0,
            },
            cell: 8,
            token,
            parts,
        };
        for bad in [
            dev(vec![(0, 0)], 1),
            dev(vec![(u64::MAX, 2)], 1),
            dev(vec![(0, u64::MAX), (0, 2)], 1),
            dev(vec![(0, 1)], 0),
            dev(vec![(0, 1); MAX_DEVICE_PAIRS + 1], 1),
        ] {
            let mut b = Vec::new();
            put_device(&bad, &mut b);
            assert_eq!(parse(&b), Err(BadRecord(DEVICE)), "{:?}", &bad.parts[..1]);
        }
        assert_eq!(parse(&[9]), Err(BadRecord(9)));
        assert_eq!(parse(&[5]), Err(BadRecord(5)));
        assert_eq!(parse(&[RING, 1]), Ok(Some((Record::Ring, 1))));
    }
}
