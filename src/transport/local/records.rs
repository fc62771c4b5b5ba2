//! The record stream of a same-host connection: what each direction of its socket carries.
//!
//! Every `send_all` of the connection becomes records. Small parts travel in the socket as
//! `INLINE` records (`u8 1`, `u32 len`, then `len` bytes). A large part stays where it is and
//! travels as a `PULL` record (`u8 2`, `u64 addr`, `u64 len`, `u64 cell`, `u64 token`,
//! `u32 index`): the receiver copies `len` bytes at `addr` out of the sender's memory straight
//! into its destination, checks the sender's `cell` still holds `token` (the bytes were still
//! the sender's to give), then writes `index` into the cell's second word (the sender's send
//! completes once every pulled part of it is acknowledged). All little-endian.

use std::fmt;

/// Tag of an INLINE record.
pub(crate) const INLINE: u8 = 1;
/// Tag of a PULL record.
pub(crate) const PULL: u8 = 2;
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

/// A record's head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// This many bytes follow in the stream.
    Inline(u32),
    /// A part to pull.
    Pull(Pull),
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
        t => Err(BadRecord(t)),
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
        assert_eq!(parse(&[9]), Err(BadRecord(9)));
    }
}
