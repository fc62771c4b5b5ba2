//! Tests of the descriptors: MORI's packed bytes, strict unpacking, node ids, addresses.

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

/// `HOST:PORT` as `--connect` and `ToSocketAddrs` take it: IPv6 literals in brackets.
#[test]
fn addresses_bracket_ipv6_literals_and_parse_back() {
    use std::net::ToSocketAddrs;
    let at = |host: &str| EngineDesc {
        host: host.into(),
        port: 7070,
        ..engine()
    };
    assert_eq!(at("10.0.0.5").address(), "10.0.0.5:7070");
    assert_eq!(at("::1").address(), "[::1]:7070");
    assert_eq!(at("fd00:1::5").address(), "[fd00:1::5]:7070");
    assert_eq!(at("fe80::1%eth0").address(), "[fe80::1%eth0]:7070");
    assert_eq!(at("node-7.example").address(), "node-7.example:7070");
    for host in ["127.0.0.1", "::1", "fd00:1::5"] {
        let a: Vec<_> = at(host).address().to_socket_addrs().unwrap().collect();
        assert_eq!(a.len(), 1, "{host}");
        assert_eq!(a[0].ip(), host.parse::<std::net::IpAddr>().unwrap());
        assert_eq!(a[0].port(), 7070);
    }
}

#[test]
fn hosts_parse_as_ip_addresses_bare_or_in_brackets() {
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    assert_eq!(parse_ip("127.0.0.1"), Some(ip("127.0.0.1")));
    assert_eq!(parse_ip("::1"), Some(ip("::1")));
    assert_eq!(parse_ip("[::1]"), Some(ip("::1")));
    assert_eq!(parse_ip("[fd00::5]"), Some(ip("fd00::5")));
    for bad in [
        "[127.0.0.1]",
        "[::1",
        "::1]",
        "[]",
        "",
        "localhost",
        "[::1]:80",
        "1.2.3",
    ] {
        assert_eq!(parse_ip(bad), None, "{bad:?}");
    }
}
