"""Access keys: a descriptor carries its region's key (MORI's fifteen fields plus one), a peer
without it is refused like one naming an unknown region, and memory registered local_only is
no peer's target."""

import ctypes
import pickle

import numpy as np
import pytest

from morio import MemoryDesc, MemoryLocationType, StatusCode

from _util import pattern, wait_done, wait_inbound, wait_ok

NOT_REGISTERED = "remote memory region not registered"


def _mori_form(packed: bytes) -> bytes:
    """A keyed descriptor's bytes in MORI's form: fixarray 15, the key dropped."""
    assert packed[:3] == b"\xdc\x00\x10", "array 16"
    assert packed[-18:-16] == b"\xc4\x10", "bin 8 of 16 bytes"
    return b"\x9f" + packed[3:-18]


def _refused(a, b, op, local_md, remote_md, size):
    """`op` (a.read or a.write) of remote_md fails as an unknown region would, both sides."""
    uid = a.allocate_transfer_uid()
    st = op(local_md, 0, remote_md, 0, size, uid)
    assert wait_done(st) == StatusCode.ERR_NOT_FOUND, st.Message()
    assert NOT_REGISTERED in st.Message()
    assert wait_inbound(b, a.get_engine_desc().key, uid).Code() == StatusCode.ERR_NOT_FOUND


def test_descriptors_pack_and_unpack_with_their_key(engines):
    a = engines.engine("keys")
    buf = np.zeros(64, np.uint8)
    md = a.register_array(buf)
    assert md.remote_access
    packed = md.pack()
    back = MemoryDesc.unpack(packed)
    assert back == md and back.remote_access and back.pack() == packed
    assert pickle.loads(pickle.dumps(md)).pack() == packed
    # MORI's form unpacks (its equality ignores the key), without a key.
    mori = MemoryDesc.unpack(_mori_form(packed))
    assert mori == md and not mori.remote_access
    assert mori.pack() == _mori_form(packed)
    assert not MemoryDesc().remote_access and MemoryDesc().pack()[0] == 0x9F
    # A key of another length is no descriptor.
    with pytest.raises(ValueError, match="access_key"):
        MemoryDesc.unpack(packed[:-18] + b"\xc4\x03abc")
    # Registered again, the same memory gets a new id and key.
    a.deregister_memory(md)
    again = a.register_array(buf)
    assert again.id != md.id
    assert again.pack()[-16:] != packed[-16:]


def test_a_descriptor_without_its_key_is_refused(engines):
    a, b = engines.pair("nokey")
    n = 64 << 10
    secret = pattern(n, 1)
    dst = secret.copy()
    dmd = b.register_array(dst)
    src = pattern(n, 2)
    smd = a.register_array(src)
    keyless = MemoryDesc.unpack(_mori_form(dmd.pack()))
    for op in (a.write, a.read):
        for size in (4096, n):
            _refused(a, b, op, smd, keyless, size)
    assert np.array_equal(dst, secret) and np.array_equal(src, pattern(n, 2))
    # A stale descriptor: the memory deregistered and registered again.
    b.deregister_memory(dmd)
    fresh = b.register_array(dst)
    for op in (a.write, a.read):
        _refused(a, b, op, smd, dmd, n)
    assert np.array_equal(dst, secret)
    # The descriptor that travelled with its key works.
    wait_ok(a.write(smd, 0, MemoryDesc.unpack(fresh.pack()), 0, n, a.allocate_transfer_uid()))
    assert np.array_equal(dst, src)


def test_local_only_memory_refuses_remote_access(engines):
    a, b = engines.pair("local_only")
    n = 256 << 10
    secret = pattern(n, 3)
    private = secret.copy()
    pmd = b.register_array(private, local_only=True)
    assert not pmd.remote_access and pmd.pack()[0] == 0x9F
    src = pattern(n, 4)
    smd = a.register_array(src)
    remote = MemoryDesc.unpack(pmd.pack())
    for op in (a.write, a.read):
        for size in (4096, n):
            _refused(a, b, op, smd, remote, size)
    assert np.array_equal(private, secret) and np.array_equal(src, pattern(n, 4))
    # Raw memory registered local_only too.
    raw = bytearray(secret.tobytes())
    addr = ctypes.addressof((ctypes.c_char * n).from_buffer(raw))
    rmd = b.register_memory(addr, n, -1, MemoryLocationType.CPU, local_only=True)
    assert not rmd.remote_access
    _refused(a, b, a.write, smd, MemoryDesc.unpack(rmd.pack()), n)
    assert raw == secret.tobytes()
    b.deregister_memory(rmd)
    # Its own engine still uses it as the local side.
    dst = np.zeros(n, np.uint8)
    dmd = a.register_array(dst)
    wait_ok(b.write(pmd, 0, dmd, 0, n, b.allocate_transfer_uid()))
    assert np.array_equal(dst, secret)
    wait_ok(b.read(pmd, 0, smd, 0, n, b.allocate_transfer_uid()))
    assert np.array_equal(private, src)
    # The option is keyword-only (MORI's positional forms are unchanged).
    with pytest.raises(TypeError):
        b.register_array(np.zeros(8, np.uint8), True)


def test_local_only_torch_tensor(engines):
    torch = pytest.importorskip("torch")
    a, b = engines.pair("local_torch")
    t = torch.arange(1024, dtype=torch.uint8)
    tmd = b.register_torch_tensor(t, local_only=True)
    assert not tmd.remote_access
    smd = a.register_array(np.zeros(1024, np.uint8))
    _refused(a, b, a.read, smd, MemoryDesc.unpack(tmd.pack()), 1024)
