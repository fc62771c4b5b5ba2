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

    /// Its address as `HOST:PORT`, the form `--connect` and logs use: an IPv6 literal in
    /// brackets (`[::1]:7070`), an IPv4 address or a name as it is (`10.0.0.5:7070`).
    pub fn address(&self) -> String {
        host_port(&self.host, self.port)
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

/// `host` as a numeric IP address: IPv4, IPv6, or IPv6 in brackets as in a URL (`[::1]`).
pub(crate) fn parse_ip(host: &str) -> Option<std::net::IpAddr> {
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().ok().map(Into::into),
        None => host.parse().ok(),
    }
}

/// `host` and `port` as `HOST:PORT`: an IPv6 literal (with or without a zone) in brackets,
/// anything else as it is. [`std::net::ToSocketAddrs`] parses what this writes.
pub fn host_port(host: &str, port: u16) -> String {
    let bare = host.split('%').next().unwrap_or(host);
    if bare.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
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
mod tests;
