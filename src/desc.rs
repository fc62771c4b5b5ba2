//! Engine and memory descriptors (`EngineDesc`, `MemoryDesc`) and their msgpack wire form, byte-compatible with MORI-IO's `MSGPACK_DEFINE` packing.
//!
//! MORI-IO never exchanges descriptors itself: applications move `pack()` bytes over their
//! own channel and hand them to `unpack()` on the other side. The packed form is what
//! msgpack-c produces for MORI's structs (reference §1.3):
//!
//! * each struct is a msgpack **array** of its fields in declaration order
//!   (`EngineDesc` → 6 elements, `MemoryDesc` → 15 elements);
//! * enums are packed as unsigned integers;
//! * the 64-byte IPC / fabric handles are packed as `bin 8` of length 64 (`0xc4 0x40 ..`),
//!   like msgpack-c's `std::array<char, N>` adaptor.
//!
//! morio appends one field to `MemoryDesc`, so MORI's array stays a prefix:
//!
//! * element 15 (the 16th), `access_key`: the region's [`AccessKey`], 16 random bytes packed
//!   as `bin 8` of length 16 (`0xc4 0x10 ..`); the array header is then `array 16`
//!   (`0xdc 0x00 0x10`) instead of `fixarray 15` (`0x9f`). A descriptor without a key
//!   ([`AccessKey::NONE`]: a local-only region, or one built by hand) packs as MORI's 15
//!   elements exactly.
//! * Unpacking takes 15 elements (MORI's form: the key is [`AccessKey::NONE`], which a morio
//!   target refuses for remote access) or 16 (the 16th exactly 16 bytes, `bin` or `str`).
//!   msgpack-c's `MSGPACK_DEFINE` ignores array elements past its fields, so a MORI peer
//!   unpacks morio's 16-element form too.
//!
//! Unpacking is strict: wrong arity, unknown enum values, handles that are not exactly
//! 64 bytes, keys that are not exactly 16, and trailing bytes are all errors. Unpacking never
//! panics and never allocates more than the input size on behalf of a length prefix.

use std::fmt;
use std::io::Cursor;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_bytes::{ByteBuf, Bytes};

use crate::proto::limits::ACCESS_KEY_BYTES;

pub use crate::proto::access::AccessKey;

/// User-chosen name of an engine.
pub type EngineKey = String;
/// Engine-local memory region id: drawn at random per registration (MORI counts from 0;
/// random ids cannot be guessed), unique among the engine's live registrations.
pub type MemoryUniqueId = u32;
/// Transfer id, unique per initiator engine only.
pub type TransferUniqueId = u64;

/// Size of the opaque IPC and fabric handles carried in a [`MemoryDesc`].
pub const HANDLE_LEN: usize = 64;

/// Environment variable that overrides [`EngineDesc::node_id`].
pub const NODE_ID_ENV: &str = "MORI_NODE_ID";

const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Errors from [`EngineDesc::unpack`] and [`MemoryDesc::unpack`].
#[derive(Debug, thiserror::Error)]
pub enum DescError {
    /// The bytes are not a msgpack array of the expected shape (truncated input, wrong
    /// arity, wrong field type, unknown enum value, invalid UTF-8, ...).
    #[error("descriptor decode error: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    /// A valid descriptor was followed by extra bytes.
    #[error("{trailing} trailing bytes after a {len}-byte descriptor")]
    TrailingBytes {
        /// Bytes consumed by the descriptor.
        len: usize,
        /// Bytes left over.
        trailing: usize,
    },
    /// An IPC or fabric handle was not exactly [`HANDLE_LEN`] bytes, or an access key not
    /// exactly 16.
    #[error("{field} must be {} bytes, got {got}", if *.field == "access_key" { ACCESS_KEY_BYTES } else { HANDLE_LEN })]
    HandleLength {
        /// Name of the offending field.
        field: &'static str,
        /// Length found in the input.
        got: usize,
    },
}

/// Transport kind. The numeric values are part of the serialised form.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendType {
    /// Not a real backend.
    Unknown = 0,
    /// Intra-node GPU peer-to-peer.
    Xgmi = 1,
    /// RDMA verbs.
    Rdma = 2,
    /// Plain TCP (this crate).
    Tcp = 3,
    /// Fabric memory.
    Fabric = 4,
}

impl BackendType {
    /// Maps a serialised value back to the enum; `None` for unknown values.
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Unknown,
            1 => Self::Xgmi,
            2 => Self::Rdma,
            3 => Self::Tcp,
            4 => Self::Fabric,
            _ => return None,
        })
    }

    /// The serialised value.
    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// MORI's upper-case name (`"XGMI"`, `"TCP"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Unknown => "UNKNOWN",
            Self::Xgmi => "XGMI",
            Self::Rdma => "RDMA",
            Self::Tcp => "TCP",
            Self::Fabric => "FABRIC",
        }
    }
}

impl fmt::Display for BackendType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for BackendType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.as_u32())
    }
}

impl<'de> Deserialize<'de> for BackendType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u32::deserialize(d)?;
        Self::from_u32(v).ok_or_else(|| D::Error::custom(format!("unknown BackendType value {v}")))
    }
}

/// Where a memory region lives. The numeric values are part of the serialised form.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryLocationType {
    /// Not set.
    Unknown = 0,
    /// Host memory.
    Cpu = 1,
    /// Device memory.
    Gpu = 2,
}

impl MemoryLocationType {
    /// Maps a serialised value back to the enum; `None` for unknown values.
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Unknown,
            1 => Self::Cpu,
            2 => Self::Gpu,
            _ => return None,
        })
    }

    /// The serialised value.
    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// MORI's upper-case name (`"CPU"`, `"GPU"`, `"UNKNOWN"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Unknown => "UNKNOWN",
            Self::Cpu => "CPU",
            Self::Gpu => "GPU",
        }
    }
}

impl fmt::Display for MemoryLocationType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for MemoryLocationType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.as_u32())
    }
}

impl<'de> Deserialize<'de> for MemoryLocationType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u32::deserialize(d)?;
        Self::from_u32(v)
            .ok_or_else(|| D::Error::custom(format!("unknown MemoryLocationType value {v}")))
    }
}

/// Serialisable identity of an engine, exchanged out of band and passed to
/// `register_remote_engine` on the peer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EngineDesc {
    /// Engine key.
    pub key: EngineKey,
    /// Physical node identity (see [`EngineDesc::local`]).
    pub node_id: String,
    /// `gethostname()` of the owning process.
    pub hostname: String,
    /// Control address the engine listens on and advertises.
    pub host: String,
    /// Configured port, or the bound ephemeral port.
    pub port: u16,
    /// Process id of the owner.
    pub pid: i32,
}

type EngineTuple = (String, String, String, String, u16, i32);

impl EngineDesc {
    /// Describes an engine of this process. `node_id` is env `MORI_NODE_ID` if set and
    /// non-empty, else the trimmed `/proc/sys/kernel/random/boot_id`, else the hostname.
    pub fn local(key: &str, host: &str, port: u16) -> EngineDesc {
        let hostname = hostname();
        let env = std::env::var(NODE_ID_ENV).ok();
        let boot_id = std::fs::read_to_string(BOOT_ID_PATH).ok();
        EngineDesc {
            key: key.to_owned(),
            node_id: resolve_node_id(env, boot_id, &hostname),
            hostname,
            host: host.to_owned(),
            port,
            // Linux pids fit in i32 (pid_max <= 2^22); saturate rather than wrap just in case.
            pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
        }
    }

    /// msgpack array of the 6 fields in MORI order.
    pub fn pack(&self) -> Vec<u8> {
        let fields = (
            &self.key,
            &self.node_id,
            &self.hostname,
            &self.host,
            self.port,
            self.pid,
        );
        encode(&fields)
    }

    /// Inverse of [`EngineDesc::pack`]; accepts any msgpack integer/str encoding of the fields.
    pub fn unpack(bytes: &[u8]) -> Result<EngineDesc, DescError> {
        let (key, node_id, hostname, host, port, pid): EngineTuple = decode(bytes)?;
        Ok(EngineDesc {
            key,
            node_id,
            hostname,
            host,
            port,
            pid,
        })
    }
}

/// Descriptor of one registered memory region. Equality compares fields 0–6, 8 and 9
/// (key, id, device, bus id, address, size, location, NUMA node, IPC offset), as MORI.
/// Field 15, the access key, is morio's (see the module documentation); its `Debug` form
/// never shows the key.
#[derive(Clone, Debug)]
pub struct MemoryDesc {
    /// 0: owning engine.
    pub engine_key: EngineKey,
    /// 1: engine-local memory id.
    pub id: MemoryUniqueId,
    /// 2: GPU index, -1 for CPU memory.
    pub device_id: i32,
    /// 3: lower-case PCI bus id for GPU memory, `""` for CPU.
    pub device_bus_id: String,
    /// 4: virtual address in the owner's process.
    pub data: u64,
    /// 5: length in bytes.
    pub size: u64,
    /// 6: memory location.
    pub loc: MemoryLocationType,
    /// 7: IPC handle (XGMI); zeros otherwise.
    pub ipc_handle: [u8; HANDLE_LEN],
    /// 8: NUMA node of CPU memory, -1 if unknown.
    pub numa_node: i32,
    /// 9: offset of `data` within its allocation.
    pub ipc_offset: u64,
    /// 10: FABRIC backend token.
    pub fabric_handle: [u8; HANDLE_LEN],
    /// 11: FABRIC vpod id, -1 if unused.
    pub vpod_id: i32,
    /// 12: FABRIC ppod id.
    pub vpod_ppod_id: String,
    /// 13: FABRIC offset.
    pub fabric_offset: u64,
    /// 14: FABRIC allocation size.
    pub fabric_alloc_size: u64,
    /// 15 (morio's, appended): the key a peer's chunks must carry to read or write the
    /// region; [`AccessKey::NONE`] for a local-only region or a descriptor of MORI's form,
    /// which a target refuses for remote access.
    pub access_key: AccessKey,
}

type MemoryTuple = (
    String,
    u32,
    i32,
    String,
    u64,
    u64,
    MemoryLocationType,
    ByteBuf,
    i32,
    u64,
    ByteBuf,
    i32,
    String,
    u64,
    u64,
);

/// MORI's fifteen fields and morio's access key.
type KeyedMemoryTuple = (
    String,
    u32,
    i32,
    String,
    u64,
    u64,
    MemoryLocationType,
    ByteBuf,
    i32,
    u64,
    ByteBuf,
    i32,
    String,
    u64,
    u64,
    ByteBuf,
);

/// The element count of the msgpack array `bytes` starts with, if it starts with one.
fn array_len(bytes: &[u8]) -> Option<u32> {
    match *bytes.first()? {
        m @ 0x90..=0x9f => Some(u32::from(m & 0x0f)),
        0xdc => Some(u32::from(u16::from_be_bytes(
            bytes.get(1..3)?.try_into().ok()?,
        ))),
        0xdd => Some(u32::from_be_bytes(bytes.get(1..5)?.try_into().ok()?)),
        _ => None,
    }
}

impl MemoryDesc {
    /// A CPU region with MORI's defaults for everything else (device -1, empty bus id,
    /// zero handles, NUMA node -1, vpod -1, zero offsets).
    pub fn cpu(engine_key: &str, id: MemoryUniqueId, data: u64, size: u64) -> MemoryDesc {
        MemoryDesc {
            engine_key: engine_key.to_owned(),
            id,
            device_id: -1,
            device_bus_id: String::new(),
            data,
            size,
            loc: MemoryLocationType::Cpu,
            ipc_handle: [0; HANDLE_LEN],
            numa_node: -1,
            ipc_offset: 0,
            fabric_handle: [0; HANDLE_LEN],
            vpod_id: -1,
            vpod_ppod_id: String::new(),
            fabric_offset: 0,
            fabric_alloc_size: 0,
            access_key: AccessKey::NONE,
        }
    }

    /// msgpack array of the 15 fields in MORI order, then the access key unless it is
    /// [`AccessKey::NONE`]; handles as `bin 8` of length 64, the key as `bin 8` of length 16.
    pub fn pack(&self) -> Vec<u8> {
        if !self.access_key.is_none() {
            let fields = (
                &self.engine_key,
                self.id,
                self.device_id,
                &self.device_bus_id,
                self.data,
                self.size,
                self.loc,
                Bytes::new(&self.ipc_handle),
                self.numa_node,
                self.ipc_offset,
                Bytes::new(&self.fabric_handle),
                self.vpod_id,
                &self.vpod_ppod_id,
                self.fabric_offset,
                self.fabric_alloc_size,
                Bytes::new(self.access_key.as_bytes()),
            );
            return encode(&fields);
        }
        let fields = (
            &self.engine_key,
            self.id,
            self.device_id,
            &self.device_bus_id,
            self.data,
            self.size,
            self.loc,
            Bytes::new(&self.ipc_handle),
            self.numa_node,
            self.ipc_offset,
            Bytes::new(&self.fabric_handle),
            self.vpod_id,
            &self.vpod_ppod_id,
            self.fabric_offset,
            self.fabric_alloc_size,
        );
        encode(&fields)
    }

    /// Inverse of [`MemoryDesc::pack`]: MORI's 15 elements (no key) or 16. Handles must be
    /// exactly 64 bytes, the key exactly 16 (bin or str).
    pub fn unpack(bytes: &[u8]) -> Result<MemoryDesc, DescError> {
        let (t, key) = if array_len(bytes) == Some(16) {
            let t: KeyedMemoryTuple = decode(bytes)?;
            let key = <[u8; ACCESS_KEY_BYTES]>::try_from(t.15.as_slice()).map_err(|_| {
                DescError::HandleLength {
                    field: "access_key",
                    got: t.15.len(),
                }
            })?;
            let t15 = (
                t.0, t.1, t.2, t.3, t.4, t.5, t.6, t.7, t.8, t.9, t.10, t.11, t.12, t.13, t.14,
            );
            (t15, AccessKey::from_bytes(key))
        } else {
            (decode::<MemoryTuple>(bytes)?, AccessKey::NONE)
        };
        Ok(MemoryDesc {
            engine_key: t.0,
            id: t.1,
            device_id: t.2,
            device_bus_id: t.3,
            data: t.4,
            size: t.5,
            loc: t.6,
            ipc_handle: handle("ipc_handle", &t.7)?,
            numa_node: t.8,
            ipc_offset: t.9,
            fabric_handle: handle("fabric_handle", &t.10)?,
            vpod_id: t.11,
            vpod_ppod_id: t.12,
            fabric_offset: t.13,
            fabric_alloc_size: t.14,
            access_key: key,
        })
    }
}

impl PartialEq for MemoryDesc {
    fn eq(&self, o: &Self) -> bool {
        self.engine_key == o.engine_key
            && self.id == o.id
            && self.device_id == o.device_id
            && self.device_bus_id == o.device_bus_id
            && self.data == o.data
            && self.size == o.size
            && self.loc == o.loc
            && self.numa_node == o.numa_node
            && self.ipc_offset == o.ipc_offset
    }
}

impl Eq for MemoryDesc {}

fn handle(field: &'static str, b: &ByteBuf) -> Result<[u8; HANDLE_LEN], DescError> {
    <[u8; HANDLE_LEN]>::try_from(b.as_slice()).map_err(|_| DescError::HandleLength {
        field,
        got: b.len(),
    })
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Cannot fail: writing to a Vec is infallible, every field has a known length and the
    // nesting depth is 1. An empty result would in any case be rejected by `unpack`.
    rmp_serde::to_vec(v).unwrap_or_default()
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DescError> {
    // The `Read`-based deserializer copies str/bin payloads only as far as the input goes,
    // so a forged length prefix cannot trigger a large allocation.
    let mut de = rmp_serde::Deserializer::new(Cursor::new(bytes));
    let v = T::deserialize(&mut de)?;
    let len = usize::try_from(de.position()).unwrap_or(usize::MAX);
    if len < bytes.len() {
        return Err(DescError::TrailingBytes {
            len,
            trailing: bytes.len() - len,
        });
    }
    Ok(v)
}

fn resolve_node_id(env: Option<String>, boot_id: Option<String>, hostname: &str) -> String {
    if let Some(v) = env.filter(|v| !v.is_empty()) {
        return v;
    }
    if let Some(b) = boot_id
        .map(|b| b.trim().to_owned())
        .filter(|b| !b.is_empty())
    {
        return b;
    }
    hostname.to_owned()
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the duration of the call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    // POSIX does not promise NUL termination on truncation; stop at the buffer end then.
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> EngineDesc {
        EngineDesc {
            key: "INITIATOR-0".into(),
            node_id: "5f0c2a6e-node".into(),
            hostname: "mia1-p01-g03".into(),
            host: "10.0.0.1".into(),
            port: 50000,
            pid: 44761,
        }
    }

    fn gpu_mem() -> MemoryDesc {
        let mut m = MemoryDesc::cpu("TARGET-0", 3, 0x7f00_dead_beef, 1 << 30);
        m.device_id = 5;
        m.device_bus_id = "0000:1b:00.0".into();
        m.loc = MemoryLocationType::Gpu;
        m.numa_node = 1;
        m.ipc_offset = 4096;
        for (i, b) in m.ipc_handle.iter_mut().enumerate() {
            *b = i as u8;
        }
        for (i, b) in m.fabric_handle.iter_mut().enumerate() {
            *b = 255 - i as u8;
        }
        m.vpod_id = 9;
        m.vpod_ppod_id = "ppod".into();
        m.fabric_offset = 77;
        m.fabric_alloc_size = 1 << 40;
        m
    }

    /// Field-by-field equality, including the fields `PartialEq` ignores.
    fn assert_mem_identical(a: &MemoryDesc, b: &MemoryDesc) {
        assert_eq!(a, b);
        assert_eq!(a.ipc_handle, b.ipc_handle);
        assert_eq!(a.fabric_handle, b.fabric_handle);
        assert_eq!(a.vpod_id, b.vpod_id);
        assert_eq!(a.vpod_ppod_id, b.vpod_ppod_id);
        assert_eq!(a.fabric_offset, b.fabric_offset);
        assert_eq!(a.fabric_alloc_size, b.fabric_alloc_size);
        assert_eq!(a.access_key.to_bytes(), b.access_key.to_bytes());
    }

    /// A GPU region with an access key (what a registration hands out).
    fn keyed() -> MemoryDesc {
        let mut m = gpu_mem();
        m.access_key = AccessKey::from_bytes(std::array::from_fn(|i| 0x80 | i as u8));
        m
    }

    /// Small deterministic generator so the fuzz-ish tests need no `rand`.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        fn byte(&mut self) -> u8 {
            self.next() as u8
        }
    }

    #[test]
    fn engine_round_trip() {
        let e = engine();
        assert_eq!(EngineDesc::unpack(&e.pack()).unwrap(), e);
    }

    #[test]
    fn engine_round_trip_weird_strings_and_extremes() {
        let long = "x".repeat(70_000); // needs str32
        let cases = [
            ("", "", "", "", 0u16, 0i32),
            ("ключ\0с нулём", "🦀", "\u{fffd}", "::1", u16::MAX, i32::MAX),
            (long.as_str(), "n", "h", "[fe80::1%eth0]", 1, i32::MIN),
            ("a\"b\\c\n", " ", "\t", "0.0.0.0", 255, -1),
        ];
        for (key, node, hn, host, port, pid) in cases {
            let e = EngineDesc {
                key: key.into(),
                node_id: node.into(),
                hostname: hn.into(),
                host: host.into(),
                port,
                pid,
            };
            assert_eq!(EngineDesc::unpack(&e.pack()).unwrap(), e);
        }
    }

    #[test]
    fn engine_pack_exact_bytes() {
        let e = EngineDesc {
            key: "a".into(),
            node_id: "b".into(),
            hostname: String::new(),
            host: "h".into(),
            port: 0x1234,
            pid: -1,
        };
        let expect = [
            0x96, 0xa1, b'a', 0xa1, b'b', 0xa0, 0xa1, b'h', 0xcd, 0x12, 0x34, 0xff,
        ];
        assert_eq!(e.pack(), expect);
        assert_eq!(engine().pack()[0], 0x96);
        // A pid that msgpack-c packs as an unsigned int still decodes into i32.
        let mut e2 = e.clone();
        e2.pid = 200;
        let p = e2.pack();
        assert_eq!(&p[p.len() - 2..], &[0xcc, 200]);
        assert_eq!(EngineDesc::unpack(&p).unwrap(), e2);
    }

    #[test]
    fn memory_round_trip() {
        let m = gpu_mem();
        assert_mem_identical(&MemoryDesc::unpack(&m.pack()).unwrap(), &m);
        let c = MemoryDesc::cpu("k", 0, 0, 0);
        assert_mem_identical(&MemoryDesc::unpack(&c.pack()).unwrap(), &c);
    }

    #[test]
    fn memory_round_trip_extremes() {
        let mut m = gpu_mem();
        m.engine_key = "é\0\u{10ffff}".repeat(1000);
        m.id = u32::MAX;
        m.device_id = i32::MIN;
        m.data = u64::MAX;
        m.size = u64::MAX;
        m.numa_node = i32::MAX;
        m.ipc_offset = u64::MAX;
        m.ipc_handle = [0xff; HANDLE_LEN];
        m.vpod_id = i32::MIN;
        m.vpod_ppod_id = "\u{7f}".into();
        m.fabric_offset = u64::MAX;
        m.fabric_alloc_size = u64::MAX;
        m.loc = MemoryLocationType::Unknown;
        assert_mem_identical(&MemoryDesc::unpack(&m.pack()).unwrap(), &m);
    }

    #[test]
    fn memory_pack_exact_bytes_cpu() {
        let m = MemoryDesc::cpu("k", 7, 0x1000, 4096);
        let mut expect = vec![
            0x9f, 0xa1, b'k', // engine_key
            0x07, // id
            0xff, // device_id -1
            0xa0, // bus id ""
            0xcd, 0x10, 0x00, // data
            0xcd, 0x10, 0x00, // size
            0x01, // loc CPU
            0xc4, 0x40, // ipc_handle bin8(64)
        ];
        expect.extend([0u8; 64]);
        expect.extend([0xff, 0x00, 0xc4, 0x40]); // numa -1, ipc_offset 0, fabric bin8(64)
        expect.extend([0u8; 64]);
        expect.extend([0xff, 0xa0, 0x00, 0x00]); // vpod -1, ppod "", offsets
        assert_eq!(m.pack(), expect);
    }

    #[test]
    fn memory_pack_handle_and_loc_encoding() {
        let m = gpu_mem();
        let p = m.pack();
        assert_eq!(p[0], 0x9f);
        // key "TARGET-0" (fixstr 8), id 3, device 5, bus fixstr 12, data u64, size u32, loc.
        let loc_at = 1 + 9 + 1 + 1 + 13 + 9 + 5;
        assert_eq!(p[loc_at], 0x02, "loc is a positive fixint");
        assert_eq!(&p[loc_at + 1..loc_at + 3], &[0xc4, 0x40]);
        assert_eq!(&p[loc_at + 3..loc_at + 3 + 64], &m.ipc_handle[..]);
        let cpu = MemoryDesc::cpu("k", 0, 0, 0).pack();
        assert_eq!(cpu[8], 0x01);
    }

    #[test]
    fn keyed_round_trip_appends_the_key_as_a_sixteenth_element() {
        let m = keyed();
        let p = m.pack();
        assert_mem_identical(&MemoryDesc::unpack(&p).unwrap(), &m);
        // array 16, MORI's fifteen fields as they pack without a key, then bin 8 of 16.
        let mut plain = m.clone();
        plain.access_key = AccessKey::NONE;
        let mori = plain.pack();
        assert_eq!(mori[0], 0x9f);
        assert_eq!(&p[..3], &[0xdc, 0x00, 0x10]);
        assert_eq!(&p[3..p.len() - 18], &mori[1..]);
        assert_eq!(&p[p.len() - 18..p.len() - 16], &[0xc4, 0x10]);
        assert_eq!(&p[p.len() - 16..], m.access_key.as_bytes());
        // Equality stays MORI's: the key is not compared.
        assert_eq!(plain, m);
    }

    #[test]
    fn memory_pack_exact_bytes_keyed() {
        let mut m = MemoryDesc::cpu("k", 7, 0x1000, 4096);
        m.access_key = AccessKey::from_bytes([0x5a; ACCESS_KEY_BYTES]);
        let mut expect = vec![0xdc, 0x00, 0x10, 0xa1, b'k', 0x07, 0xff, 0xa0];
        expect.extend([0xcd, 0x10, 0x00, 0xcd, 0x10, 0x00, 0x01, 0xc4, 0x40]);
        expect.extend([0u8; 64]);
        expect.extend([0xff, 0x00, 0xc4, 0x40]);
        expect.extend([0u8; 64]);
        expect.extend([0xff, 0xa0, 0x00, 0x00]);
        expect.extend([0xc4, 0x10]); // access_key bin8(16)
        expect.extend([0x5a; 16]);
        assert_eq!(m.pack(), expect);
        assert_mem_identical(&MemoryDesc::unpack(&expect).unwrap(), &m);
    }

    /// A MORI peer's descriptor (15 elements) unpacks, with no key; so does the key dropped
    /// from a keyed packing; a 16th element must be exactly 16 bytes, and 17 are refused.
    #[test]
    fn mori_form_unpacks_without_a_key_and_the_key_is_strict() {
        let m = keyed();
        let p = m.pack();
        let mut mori = vec![0x9f];
        mori.extend_from_slice(&p[3..p.len() - 18]);
        let back = MemoryDesc::unpack(&mori).unwrap();
        assert!(back.access_key.is_none());
        let mut want = m.clone();
        want.access_key = AccessKey::NONE;
        assert_mem_identical(&back, &want);
        // Also MORI's form with an array16 header (msgpack-c never writes it, but it is valid).
        let mut wide = vec![0xdc, 0x00, 0x0f];
        wide.extend_from_slice(&mori[1..]);
        assert_mem_identical(&MemoryDesc::unpack(&wide).unwrap(), &want);
        // An explicit zero key is no key.
        let mut zero = p[..p.len() - 16].to_vec();
        zero.extend([0u8; 16]);
        assert!(MemoryDesc::unpack(&zero).unwrap().access_key.is_none());
        // The key as str 16 (like the handles, str is accepted).
        let mut as_str = p[..p.len() - 18].to_vec();
        as_str.push(0xb0);
        as_str.extend([b'k'; 16]);
        let k = MemoryDesc::unpack(&as_str).unwrap().access_key;
        assert_eq!(k.to_bytes(), [b'k'; 16]);
        // Keys of another length, a key that is not bytes, and a 17th element.
        for n in [0usize, 1, 15, 17, 64] {
            let mut bad = p[..p.len() - 18].to_vec();
            bad.extend([0xc4, n as u8]);
            bad.extend(vec![1u8; n]);
            assert!(
                matches!(
                    MemoryDesc::unpack(&bad),
                    Err(DescError::HandleLength { field: "access_key", got }) if got == n
                ),
                "{n}-byte key"
            );
        }
        let mut int_key = p[..p.len() - 18].to_vec();
        int_key.push(0x07);
        assert!(matches!(
            MemoryDesc::unpack(&int_key),
            Err(DescError::Decode(_))
        ));
        let mut seventeen = p.clone();
        seventeen[2] = 0x11;
        seventeen.push(0xc0);
        assert!(MemoryDesc::unpack(&seventeen).is_err());
        let e = MemoryDesc::unpack(
            &p[..p.len() - 18]
                .iter()
                .copied()
                .chain([0xc4, 3, 1, 2, 3])
                .collect::<Vec<_>>(),
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "access_key must be 16 bytes, got 3");
    }

    #[test]
    fn the_key_never_shows_in_debug() {
        let m = keyed();
        let shown = format!("{m:?}");
        assert!(shown.contains("AccessKey(<redacted>)"), "{shown}");
        assert!(!shown.contains("128, 129"), "{shown}");
    }

    #[test]
    fn memory_equality_ignores_handles_and_fabric_fields() {
        let a = gpu_mem();
        let mut b = a.clone();
        b.ipc_handle = [7; HANDLE_LEN];
        b.fabric_handle = [9; HANDLE_LEN];
        b.vpod_id = -5;
        b.vpod_ppod_id = "other".into();
        b.fabric_offset = 1;
        b.fabric_alloc_size = 2;
        assert_eq!(a, b);

        let muts: [fn(&mut MemoryDesc); 9] = [
            |m| m.engine_key.push('x'),
            |m| m.id += 1,
            |m| m.device_id += 1,
            |m| m.device_bus_id.push('x'),
            |m| m.data += 1,
            |m| m.size += 1,
            |m| m.loc = MemoryLocationType::Cpu,
            |m| m.numa_node += 1,
            |m| m.ipc_offset += 1,
        ];
        for f in muts {
            let mut c = a.clone();
            f(&mut c);
            assert_ne!(a, c);
        }
    }

    #[test]
    fn enums_numeric_and_display() {
        for v in 0..5 {
            let b = BackendType::from_u32(v).unwrap();
            assert_eq!(b.as_u32(), v);
            assert_eq!(rmp_serde::to_vec(&b).unwrap(), vec![v as u8]);
            assert_eq!(rmp_serde::from_slice::<BackendType>(&[v as u8]).unwrap(), b);
        }
        assert_eq!(BackendType::from_u32(5), None);
        assert!(rmp_serde::from_slice::<BackendType>(&[5]).is_err());
        for v in 0..3 {
            let l = MemoryLocationType::from_u32(v).unwrap();
            assert_eq!(l.as_u32(), v);
        }
        assert_eq!(MemoryLocationType::from_u32(3), None);
        assert_eq!(BackendType::Tcp.to_string(), "TCP");
        assert_eq!(BackendType::Xgmi.to_string(), "XGMI");
        assert_eq!(MemoryLocationType::Gpu.to_string(), "GPU");
        assert_eq!(MemoryLocationType::Cpu.to_string(), "CPU");
    }

    #[test]
    fn unknown_loc_is_an_error() {
        // [0x9f, "k", id 0, device -1, bus "", data 0, size 0, loc]: loc is byte 8.
        let mut p = MemoryDesc::cpu("k", 0, 0, 0).pack();
        assert_eq!(p[8], 0x01);
        for bad in [0x03u8, 0x7f, 0xff /* -1 */] {
            p[8] = bad;
            assert!(matches!(MemoryDesc::unpack(&p), Err(DescError::Decode(_))));
        }
    }

    type Handles = (
        String,
        u32,
        i32,
        String,
        u64,
        u64,
        u32,
        ByteBuf,
        i32,
        u64,
        ByteBuf,
        i32,
        String,
        u64,
        u64,
    );

    fn mem_with_handles(ipc: Vec<u8>, fabric: Vec<u8>) -> Vec<u8> {
        let t: Handles = (
            "k".into(),
            0,
            -1,
            String::new(),
            0,
            0,
            1,
            ByteBuf::from(ipc),
            -1,
            0,
            ByteBuf::from(fabric),
            -1,
            String::new(),
            0,
            0,
        );
        rmp_serde::to_vec(&t).unwrap()
    }

    #[test]
    fn wrong_handle_length_is_an_error() {
        let ok = mem_with_handles(vec![1; 64], vec![2; 64]);
        let m = MemoryDesc::unpack(&ok).unwrap();
        assert_eq!(m.ipc_handle, [1; 64]);
        assert_eq!(m.fabric_handle, [2; 64]);
        for n in [0usize, 1, 63, 65, 300] {
            assert!(matches!(
                MemoryDesc::unpack(&mem_with_handles(vec![1; n], vec![2; 64])),
                Err(DescError::HandleLength { field: "ipc_handle", got }) if got == n
            ));
            assert!(matches!(
                MemoryDesc::unpack(&mem_with_handles(vec![1; 64], vec![2; n])),
                Err(DescError::HandleLength { field: "fabric_handle", got }) if got == n
            ));
        }
    }

    #[test]
    fn wrong_arity_is_an_error() {
        let five = rmp_serde::to_vec(&("k", "n", "h", "host", 1u16)).unwrap();
        let seven = rmp_serde::to_vec(&("k", "n", "h", "host", 1u16, 2i32, 3i32)).unwrap();
        assert!(EngineDesc::unpack(&five).is_err());
        assert!(EngineDesc::unpack(&seven).is_err());
        // Same bytes with the array header patched to claim 15 or 16 elements.
        let mut p = MemoryDesc::cpu("k", 0, 0, 0).pack();
        p[0] = 0x9e;
        assert!(MemoryDesc::unpack(&p).is_err());
        p[0] = 0xdc; // array16 with 16 elements, one extra at the end
        p.splice(1..1, [0x00, 0x10]);
        p.push(0x00);
        assert!(MemoryDesc::unpack(&p).is_err());
        // A map, an empty array, nil: all rejected.
        for bad in [&[0x80u8][..], &[0x90], &[0xc0], &[]] {
            assert!(EngineDesc::unpack(bad).is_err());
            assert!(MemoryDesc::unpack(bad).is_err());
        }
        // Each packing is not the other.
        assert!(EngineDesc::unpack(&gpu_mem().pack()).is_err());
        assert!(MemoryDesc::unpack(&engine().pack()).is_err());
    }

    #[test]
    fn every_prefix_and_trailing_bytes_rejected() {
        for p in [engine().pack(), gpu_mem().pack(), keyed().pack()] {
            for n in 0..p.len() {
                assert!(EngineDesc::unpack(&p[..n]).is_err());
                assert!(MemoryDesc::unpack(&p[..n]).is_err());
            }
            let mut extra = p.clone();
            extra.push(0xc0);
            assert!(EngineDesc::unpack(&extra).is_err());
            assert!(MemoryDesc::unpack(&extra).is_err());
        }
        let mut extra = engine().pack();
        extra.extend([1, 2, 3]);
        assert!(matches!(
            EngineDesc::unpack(&extra),
            Err(DescError::TrailingBytes { trailing: 3, .. })
        ));
    }

    #[test]
    fn huge_length_prefixes_rejected() {
        let cases: [&[u8]; 6] = [
            &[0xdd, 0xff, 0xff, 0xff, 0xff],             // array32 of 2^32-1
            &[0x96, 0xdb, 0xff, 0xff, 0xff, 0xff, b'a'], // str32 of 4 GiB
            &[0x96, 0xda, 0xff, 0xff],                   // str16 truncated
            &[
                0x9f, 0xa1, b'k', 0x00, 0xff, 0xa0, 0x00, 0x00, 0x01, 0xc6, 0xff, 0xff, 0xff, 0xff,
            ],
            &[
                0x9f, 0xa1, b'k', 0x00, 0xff, 0xa0, 0x00, 0x00, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff,
            ],
            &[0xdf, 0xff, 0xff, 0xff, 0xff], // map32
        ];
        for c in cases {
            assert!(EngineDesc::unpack(c).is_err());
            assert!(MemoryDesc::unpack(c).is_err());
        }
    }

    #[test]
    fn random_garbage_never_panics() {
        let mut rng = Lcg(0x5eed_1234);
        for _ in 0..20_000 {
            let len = (rng.next() % 200) as usize;
            let mut buf: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
            // Bias half the inputs towards the right array headers to get deeper.
            if len > 0 && rng.next() & 1 == 0 {
                buf[0] = if rng.next() & 1 == 0 { 0x96 } else { 0x9f };
            }
            let _ = EngineDesc::unpack(&buf);
            let _ = MemoryDesc::unpack(&buf);
        }
    }

    #[test]
    fn mutated_valid_packings_never_panic() {
        let mut rng = Lcg(42);
        let seeds = [engine().pack(), gpu_mem().pack(), keyed().pack()];
        for _ in 0..30_000 {
            let mut p = seeds[(rng.next() % 3) as usize].clone();
            for _ in 0..1 + rng.next() % 4 {
                let i = (rng.next() as usize) % p.len();
                p[i] = rng.byte();
            }
            if let Ok(e) = EngineDesc::unpack(&p) {
                assert_eq!(EngineDesc::unpack(&e.pack()).unwrap(), e);
            }
            if let Ok(m) = MemoryDesc::unpack(&p) {
                assert_mem_identical(&MemoryDesc::unpack(&m.pack()).unwrap(), &m);
            }
        }
    }

    #[test]
    fn node_id_resolution_order() {
        let boot = Some("  abc-123\n".to_owned());
        assert_eq!(resolve_node_id(Some("n1".into()), boot.clone(), "h"), "n1");
        assert_eq!(
            resolve_node_id(Some(String::new()), boot.clone(), "h"),
            "abc-123"
        );
        assert_eq!(resolve_node_id(None, boot, "h"), "abc-123");
        assert_eq!(resolve_node_id(None, Some(" \n".into()), "h"), "h");
        assert_eq!(resolve_node_id(None, None, "h"), "h");
    }

    #[test]
    fn local_desc_and_env_override() {
        // The only test that touches the environment or calls `local`, so parallel tests
        // cannot observe the override.
        let unique = format!("morio-test-node-{}-{:p}", std::process::id(), &NODE_ID_ENV);
        std::env::set_var(NODE_ID_ENV, &unique);
        let e = EngineDesc::local("E", "127.0.0.1", 4242);
        std::env::remove_var(NODE_ID_ENV);
        assert_eq!(e.node_id, unique);
        assert_eq!(e.key, "E");
        assert_eq!(e.host, "127.0.0.1");
        assert_eq!(e.port, 4242);
        assert_eq!(i64::from(e.pid), i64::from(std::process::id()));
        assert!(e.pid > 0);
        assert!(!e.hostname.is_empty());
        assert_eq!(EngineDesc::unpack(&e.pack()).unwrap(), e);

        let d = EngineDesc::local("E", "", 0);
        assert!(!d.node_id.is_empty());
        assert_ne!(d.node_id, unique);
    }
}
