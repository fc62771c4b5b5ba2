"""Registering Python memory: numpy arrays, buffers, raw pointers; keep-alive; batch offsets."""

import array
import ctypes
import gc
import mmap
import weakref

import numpy as np
import pytest

from morio import MemoryLocationType, StatusCode

from _util import pattern, wait_done, wait_inbound, wait_ok


def _addr(buf) -> int:
    """Address of a writable buffer (the export is released before returning)."""
    c = (ctypes.c_char * 1).from_buffer(buf)
    try:
        return ctypes.addressof(c)
    finally:
        del c


def _roundtrip(a, b, src_md, dst_md, nbytes):
    """a writes src -> dst, then reads dst back into src; both must succeed."""
    uid = a.allocate_transfer_uid()
    wait_ok(a.write(src_md, 0, dst_md, 0, nbytes, uid))
    assert wait_inbound(b, a.get_engine_desc().key, uid).Succeeded()


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.float32, np.float64, np.complex64, np.bool_])
def test_numpy_dtypes(engines, dtype):
    a, b = engines.pair("dtype")
    rng = np.random.default_rng(0)
    src = (rng.integers(0, 2, 333) if dtype is np.bool_ else rng.integers(-100, 100, 333)).astype(dtype)
    dst = np.zeros_like(src)
    smd, dmd = a.register_array(src), b.register_array(dst)
    assert smd.size == src.nbytes and dmd.size == dst.nbytes
    assert smd.data == src.ctypes.data and dmd.data == dst.ctypes.data
    assert smd.loc == MemoryLocationType.CPU and smd.device_id == -1
    _roundtrip(a, b, smd, dmd, src.nbytes)
    assert np.array_equal(dst, src)


def test_two_d_array_and_views(engines):
    a, b = engines.pair("twod")
    src = np.arange(16 * 32, dtype=np.float32).reshape(16, 32)
    dst = np.zeros((16, 32), np.float32)
    smd, dmd = a.register_array(src), b.register_array(dst)
    assert smd.size == src.nbytes == 16 * 32 * 4
    _roundtrip(a, b, smd, dmd, src.nbytes)
    assert np.array_equal(dst, src)
    # A contiguous view (rows 4..8) registers at its own address.
    rows = dst[4:8]
    vmd = b.register_array(rows)
    assert vmd.data == dst.ctypes.data + 4 * 32 * 4 and vmd.size == rows.nbytes


@pytest.mark.parametrize("kind", ["bytearray", "array", "mmap"])
def test_buffer_objects(engines, kind):
    a, b = engines.pair("buf")
    n = 4096
    if kind == "bytearray":
        src, dst = bytearray(pattern(n, 1).tobytes()), bytearray(n)
    elif kind == "array":
        src, dst = array.array("B", pattern(n, 1).tobytes()), array.array("B", bytes(n))
    else:
        src, dst = mmap.mmap(-1, n), mmap.mmap(-1, n)
        src[:] = pattern(n, 1).tobytes()
    smd, dmd = a.register_array(src), b.register_array(dst)
    assert (smd.size, dmd.size) == (n, n)
    assert smd.data == _addr(src) and dmd.data == _addr(dst)
    if kind == "array":
        assert dmd.data == dst.buffer_info()[0]
    _roundtrip(a, b, smd, dmd, n)
    assert bytes(dst) == pattern(n, 1).tobytes()
    # A read: change the target's bytes, read them back over the source.
    memoryview(dst)[:] = pattern(n, 2).tobytes()
    wait_ok(a.read(smd, 0, dmd, 0, n, a.allocate_transfer_uid()))
    assert bytes(src) == pattern(n, 2).tobytes()


def test_array_array_wider_items(engines):
    e = engines.engine("arr", backend=False)
    arr = array.array("i", range(100))
    md = e.register_array(arr)
    assert md.size == arr.itemsize * len(arr) and md.data == arr.buffer_info()[0]


def test_zero_size(engines):
    a, b = engines.pair("zero")
    for obj in (np.zeros(0, np.uint8), np.zeros((3, 0), np.float32), bytearray()):
        md = a.register_array(obj)
        assert md.size == 0
    dmd = b.register_array(np.zeros(0, np.uint8))
    src = np.zeros(0, np.uint8)
    smd = a.register_array(src)
    st = a.write(smd, 0, dmd, 0, 0, a.allocate_transfer_uid())
    assert wait_done(st) == StatusCode.SUCCESS, st.Message()
    st = a.write(smd, 0, dmd, 0, 1, a.allocate_transfer_uid())
    assert st.Code() == StatusCode.ERR_INVALID_ARGS


def test_registration_keeps_numpy_alive(engines):
    a, b = engines.pair("keep")
    src = pattern(256, 3)
    smd = a.register_array(src.copy())
    tgt = np.zeros(256, np.uint8)
    tgt_ref = weakref.ref(tgt)
    tmd = b.register_array(tgt)
    del tgt
    gc.collect()
    assert tgt_ref() is not None  # held by the registration
    # The orphaned target memory still takes a write and gives it back on a read.
    wait_ok(a.write(smd, 0, tmd, 0, 256, a.allocate_transfer_uid()))
    back = np.zeros(256, np.uint8)
    bmd = a.register_array(back)
    wait_ok(a.read(bmd, 0, tmd, 0, 256, a.allocate_transfer_uid()))
    assert np.array_equal(back, src)
    b.deregister_memory(tmd)
    gc.collect()
    assert tgt_ref() is None  # released by deregister_memory


@pytest.mark.parametrize("make", [lambda: np.zeros(64, np.uint8), lambda: array.array("B", bytes(64)),
                                  lambda: mmap.mmap(-1, 4096)], ids=["numpy", "array", "mmap"])
def test_close_releases_registrations(engines, make):
    e = engines.engine("rel", backend=False)
    obj = make()
    ref = weakref.ref(obj)
    e.register_array(obj)
    del obj
    gc.collect()
    assert ref() is not None
    e.close()
    gc.collect()
    assert ref() is None


def test_registration_holds_buffer_export(engines):
    e = engines.engine("export", backend=False)
    ba = bytearray(16)
    md = e.register_array(ba)
    with pytest.raises(BufferError):
        ba.extend(b"x")  # cannot move while registered
    e.deregister_memory(md)
    ba.extend(b"x")
    mm = mmap.mmap(-1, 4096)
    md = e.register_array(mm)
    with pytest.raises(BufferError):
        mm.close()
    e.deregister_memory(md)
    mm.close()


def test_register_memory_raw_pointer(engines):
    a, b = engines.pair("raw")
    src = pattern(1000, 5)
    dst = np.zeros(1000, np.uint8)
    smd = a.register_memory(src.ctypes.data, src.nbytes, -1, MemoryLocationType.CPU)
    dmd = b.register_memory(dst.ctypes.data, dst.nbytes, -1, int(MemoryLocationType.CPU))
    assert (smd.data, smd.size, smd.loc, smd.device_id) == (src.ctypes.data, 1000, MemoryLocationType.CPU, -1)
    _roundtrip(a, b, smd, dmd, 1000)
    assert np.array_equal(dst, src)
    b.deregister_memory(dmd)
    a.deregister_memory(smd)


# --------------------------------------------------------------------------- batch offsets

SRC_OFFS, DST_OFFS, SIZES = [0, 100, 300, 900], [50, 400, 700, 0], [10, 37, 64, 50]

CONVERTERS = {
    "list": list,
    "tuple": tuple,
    "int64": lambda v: np.array(v, np.int64),
    "uint64": lambda v: np.array(v, np.uint64),
    "int32": lambda v: np.array(v, np.int32),
    "uint32": lambda v: np.array(v, np.uint32),
    "strided_int64": lambda v: np.repeat(np.array(v, np.int64), 2)[::2],
    "numpy_scalars": lambda v: [np.int64(x) for x in v],
}


def _expected(src, n):
    want = np.zeros(n, np.uint8)
    for s, d, z in zip(SRC_OFFS, DST_OFFS, SIZES):
        want[d : d + z] = src[s : s + z]
    return want


@pytest.mark.parametrize("conv", ["list", "tuple", "int64", "uint64", "int32", "uint32", "strided_int64", "numpy_scalars"])
@pytest.mark.parametrize("api", ["session", "engine"])
def test_batch_offset_types(engines, conv, api):
    a, b = engines.pair("offs")
    n = 1024
    src, dst = pattern(n, 6), np.zeros(n, np.uint8)
    smd, dmd = a.register_array(src), b.register_array(dst)
    c = CONVERTERS[conv]
    uid = a.allocate_transfer_uid()
    if api == "session":
        st = a.create_session(smd, dmd).batch_write(c(SRC_OFFS), c(DST_OFFS), c(SIZES), uid)
    else:
        st = a.batch_write([smd], [c(SRC_OFFS)], [dmd], [c(DST_OFFS)], [c(SIZES)], c([uid]))[0]
    wait_ok(st)
    assert np.array_equal(dst, _expected(src, n))


def test_batch_mixed_offset_types(engines):
    a, b = engines.pair("mixed")
    n = 1024
    src, dst = pattern(n, 7), np.zeros(n, np.uint8)
    smd, dmd = a.register_array(src), b.register_array(dst)
    back = np.zeros(n, np.uint8)
    bmd = a.register_array(back)
    uids = np.array([a.allocate_transfer_uid(), a.allocate_transfer_uid()], np.uint64)
    # Two transfers in one call: a write (tuple / int32 / list) and a read (uint64 / list / int64).
    sts = a.batch_write([smd], [tuple(SRC_OFFS)], [dmd], [np.array(DST_OFFS, np.int32)], [SIZES], uids[:1])
    wait_ok(sts[0])
    sts = a.batch_read([bmd, bmd], [np.array(DST_OFFS, np.uint64), [0]], [dmd, dmd], [DST_OFFS, (0,)],
                       [np.array(SIZES, np.int64), [1]], [int(uids[1]), int(uids[1]) + 1000])
    assert a.wait_all(sts, timeout_ms=10_000) == StatusCode.SUCCESS
    assert np.array_equal(dst, _expected(src, n))
    assert np.array_equal(back[np.array(DST_OFFS)], src[np.array(SRC_OFFS)])
    assert back[0] == dst[0]


def test_batch_big_endian_offsets(engines):
    a, b = engines.pair("bigend")
    src, dst = pattern(1024, 8), np.zeros(1024, np.uint8)
    smd, dmd = a.register_array(src), b.register_array(dst)
    sess = a.create_session(smd, dmd)
    # Offsets whose byte-swapped value stays positive (low byte < 0x80), so a misread is
    # not caught by the negative-value check by accident.
    src_offs = [0, 100, 300, 520]
    try:
        st = sess.batch_write(np.array(src_offs, ">i8"), DST_OFFS, SIZES, 1)
    except (TypeError, ValueError):
        return  # refusing a non-native byte order is fine too
    wait_ok(st)
    want = np.zeros(1024, np.uint8)
    for s, d, z in zip(src_offs, DST_OFFS, SIZES):
        want[d : d + z] = src[s : s + z]
    assert np.array_equal(dst, want)


def test_session_batch_65536_tiny_segments(engines):
    a, b = engines.pair("big_batch")
    n_seg, stride = 65536, 4
    rng = np.random.default_rng(42)
    src = rng.integers(0, 256, n_seg * stride, dtype=np.uint8)
    dst = np.zeros(n_seg * stride, np.uint8)
    smd, dmd = a.register_array(src), b.register_array(dst)
    src_offs = np.arange(n_seg, dtype=np.int64) * stride
    dst_offs = rng.permutation(n_seg).astype(np.int64) * stride  # scattered destinations
    sizes = rng.integers(1, stride + 1, n_seg).astype(np.int64)
    uid = a.allocate_transfer_uid()
    st = a.create_session(smd, dmd).batch_write(src_offs, dst_offs, sizes, uid)
    wait_ok(st, timeout_s=30)
    assert wait_inbound(b, a.get_engine_desc().key, uid).Succeeded()
    want = np.zeros_like(dst)
    for k in range(stride):  # segment j moves bytes [0, sizes[j]) of its 4-byte slot
        m = sizes > k
        want[dst_offs[m] + k] = src[src_offs[m] + k]
    assert np.array_equal(dst, want)
    # And back with a read into a fresh buffer.
    back = np.zeros_like(src)
    bmd = a.register_array(back)
    st = a.batch_read([bmd], [src_offs], [dmd], [dst_offs], [sizes], [a.allocate_transfer_uid()])[0]
    wait_ok(st, timeout_s=30)
    assert np.array_equal(back, np.where(np.repeat(np.arange(stride)[None, :], n_seg, 0).ravel()
                                         < np.repeat(sizes, stride), src, 0))


def test_dtypes_dlpack_cannot_describe_register_through_the_buffer_protocol(engines):
    a, b = engines.pair("void")
    src = np.frombuffer(bytes(pattern(21, 5)), dtype="V3").copy()
    dst = np.zeros(7, "V3")
    smd, dmd = a.register_array(src), b.register_array(dst)
    assert smd.size == 21 and smd.data == src.ctypes.data
    st = a.write(smd, 0, dmd, 0, 21, a.allocate_transfer_uid())
    assert st.WaitFor(10000) == StatusCode.SUCCESS, st.Message()
    assert dst.tobytes() == src.tobytes()
