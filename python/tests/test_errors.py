"""Bad input gives a Python exception or an error status: never a crash or a hang."""

import time

import numpy as np
import pytest

from morio import (
    BackendType,
    EngineDesc,
    FabricBackendConfig,
    IOEngine,
    IOEngineConfig,
    MemoryDesc,
    MemoryLocationType,
    RdmaBackendConfig,
    StatusCode,
    TcpBackendConfig,
    XgmiBackendConfig,
    fabric_alloc,
    fabric_free,
)

from _util import pattern, small_config, unique_key, wait_done, wait_inbound, wait_ok


# --------------------------------------------------------------------------- descriptors


@pytest.mark.parametrize("data", [b"", b"garbage", b"\x00\x01\x02", b"\x96\xa1", bytes(range(256)), b"\x9f" * 64])
@pytest.mark.parametrize("cls", [EngineDesc, MemoryDesc])
def test_unpack_garbage_raises_value_error(cls, data):
    with pytest.raises(ValueError, match="cannot unpack"):
        cls.unpack(data)


def test_unpack_swapped_descriptor_kinds(engines):
    e = engines.engine("swap")
    md = e.register_array(np.zeros(8, np.uint8))
    with pytest.raises(ValueError):
        EngineDesc.unpack(md.pack())
    with pytest.raises(ValueError):
        MemoryDesc.unpack(e.get_engine_desc().pack())
    with pytest.raises(TypeError):
        EngineDesc.unpack("not bytes")


# --------------------------------------------------------------------------- error statuses


def test_local_desc_of_another_engine(wired):
    a, b, src, dst, src_md, dst_md = wired
    for st in (a.write(dst_md, 0, dst_md, 0, 8, 1), a.read(dst_md, 0, dst_md, 0, 8, 2),
               a.batch_write([dst_md], [[0]], [dst_md], [[0]], [[8]], [3])[0]):
        assert st.Code() == StatusCode.ERR_INVALID_ARGS, st.Message()
    assert not dst.any()


@pytest.mark.parametrize("loff,roff,size", [(60, 0, 8), (0, 60, 8), (0, 0, 65), (64, 0, 1), (2**63, 0, 8), (0, 2**63, 2**63)])
def test_out_of_range(wired, loff, roff, size):
    a, b, src, dst, src_md, dst_md = wired
    for op in (a.write, a.read):
        st = op(src_md, loff, dst_md, roff, size, a.allocate_transfer_uid())
        assert st.Code() == StatusCode.ERR_INVALID_ARGS, st.Message()
    sess = a.create_session(src_md, dst_md)
    st = sess.batch_write([0, loff], [0, roff], [8, size], sess.allocate_transfer_uid())
    assert st.Code() == StatusCode.ERR_INVALID_ARGS
    assert not dst.any() and np.array_equal(src, pattern(64, 1))


def test_batch_inner_length_mismatch(wired):
    a, b, src, dst, src_md, dst_md = wired
    st = a.batch_write([src_md], [[0, 8]], [dst_md], [[0]], [[8]], [1])[0]
    assert st.Code() == StatusCode.ERR_INVALID_ARGS
    st = a.create_session(src_md, dst_md).batch_read([0, 8], [0, 8], [8], 2)
    assert st.Code() == StatusCode.ERR_INVALID_ARGS


def test_unknown_remote_engine(engines, wired):
    a, b, src, dst, src_md, dst_md = wired
    stranger = engines.engine("stranger")
    smd = stranger.register_array(np.zeros(64, np.uint8))
    st = a.write(src_md, 0, smd, 0, 8, 1)
    assert wait_done(st) == StatusCode.ERR_NOT_FOUND, st.Message()
    # Deregistering a known peer makes it unknown.
    a.deregister_remote_engine(b.get_engine_desc())
    st = a.write(src_md, 0, dst_md, 0, 8, 2)
    assert wait_done(st) == StatusCode.ERR_NOT_FOUND, st.Message()
    assert not dst.any()


def test_deregistered_local_memory(wired):
    a, b, src, dst, src_md, dst_md = wired
    other = a.register_array(pattern(64, 2))
    a.deregister_memory(other)
    for op in (a.write, a.read):
        st = op(other, 0, dst_md, 0, 8, a.allocate_transfer_uid())
        assert wait_done(st) == StatusCode.ERR_NOT_FOUND, st.Message()
    with pytest.raises(ValueError):
        a.deregister_memory(other)  # twice
    assert not dst.any()
    wait_ok(a.write(src_md, 0, dst_md, 0, 64, a.allocate_transfer_uid()))  # the rest still works


def test_deregistered_remote_memory(wired):
    a, b, src, dst, src_md, dst_md = wired
    gone_buf = np.zeros(64, np.uint8)
    gone = b.register_array(gone_buf)
    b.deregister_memory(gone)
    a_key = a.get_engine_desc().key
    t0 = time.monotonic()
    for op in (a.write, a.read):
        uid = a.allocate_transfer_uid()
        st = op(src_md, 0, gone, 0, 8, uid)
        code = wait_done(st, timeout_s=10)
        assert st.Failed() and code in (StatusCode.ERR_NOT_FOUND, StatusCode.ERR_INVALID_ARGS,
                                        StatusCode.ERR_BAD_STATE), (code, st.Message())
        inbound = wait_inbound(b, a_key, uid)
        assert inbound.Failed()
    assert time.monotonic() - t0 < 2 * 2.0 + 1  # within the 2 s op timeout (each)
    assert np.array_equal(src, pattern(64, 1)) and not gone_buf.any()
    wait_ok(a.write(src_md, 0, dst_md, 0, 64, a.allocate_transfer_uid()))
    assert np.array_equal(dst, src)


# --------------------------------------------------------------------------- exceptions


def test_wrong_argument_types(wired):
    a, b, src, dst, src_md, dst_md = wired
    with pytest.raises(TypeError):
        a.write("x", 0, dst_md, 0, 8, 1)
    with pytest.raises(TypeError):
        a.read(src_md, 0, None, 0, 8, 1)
    with pytest.raises(TypeError):
        a.write(src_md, "0", dst_md, 0, 8, 1)
    with pytest.raises(TypeError):
        a.write(src_md, 0.5, dst_md, 0, 8, 1)
    with pytest.raises(TypeError):
        a.batch_write([src_md], [[0]], ["x"], [[0]], [[8]], [1])
    with pytest.raises(TypeError):
        a.batch_write(src_md, [[0]], [dst_md], [[0]], [[8]], [1])
    with pytest.raises(TypeError):
        a.batch_write([src_md], [[0.0]], [dst_md], [[0]], [[8]], [1])
    with pytest.raises(TypeError):
        a.create_session(src_md, "x")
    with pytest.raises(TypeError):
        a.register_remote_engine("x")
    with pytest.raises(TypeError):
        a.pop_inbound_transfer_status(1, 1)
    with pytest.raises(TypeError):
        a.wait_all([1])
    with pytest.raises(TypeError):
        a.wait_all("abc")
    with pytest.raises(TypeError):
        a.create_backend(BackendType.TCP, "config")
    with pytest.raises(TypeError):
        a.create_backend(BackendType.TCP, RdmaBackendConfig())
    with pytest.raises(TypeError):
        a.register_torch_tensor(np.zeros(4, np.uint8))
    with pytest.raises(TypeError):
        a.register_array(123)
    with pytest.raises(TypeError):
        IOEngine(unique_key("t"), "127.0.0.1:0")
    assert not dst.any()


def test_negative_values(wired):
    a, b, src, dst, src_md, dst_md = wired
    for args in [(-1, 0, 8, 1), (0, -1, 8, 1), (0, 0, -8, 1), (0, 0, 8, -1)]:
        with pytest.raises((OverflowError, ValueError)):
            a.write(src_md, args[0], dst_md, *args[1:])
    sess = a.create_session(src_md, dst_md)
    with pytest.raises((OverflowError, ValueError)):
        sess.read(-1, 0, 8, 1)
    with pytest.raises((OverflowError, ValueError)):
        sess.batch_write([0, -8], [0, 8], [8, 8], 1)
    with pytest.raises((OverflowError, ValueError)):
        sess.batch_write(np.array([0, -8]), [0, 8], [8, 8], 1)
    with pytest.raises((OverflowError, ValueError)):
        a.batch_write([src_md], [[0]], [dst_md], [[0]], [[8]], [-1])
    with pytest.raises((OverflowError, ValueError)):
        a.register_memory(-1, 8, -1, MemoryLocationType.CPU)
    with pytest.raises((OverflowError, ValueError)):
        a.register_memory(src.ctypes.data, -1, -1, MemoryLocationType.CPU)
    assert not dst.any()


def test_batch_outer_length_mismatch(wired):
    a, b, src, dst, src_md, dst_md = wired
    good = dict(l=[src_md], lo=[[0]], r=[dst_md], ro=[[0]], s=[[8]], u=[1])
    for key in good:
        for bad in ([], good[key] * 2):
            args = dict(good, **{key: bad})
            with pytest.raises(ValueError):
                a.batch_write(args["l"], args["lo"], args["r"], args["ro"], args["s"], args["u"])
            with pytest.raises(ValueError):
                a.batch_read(args["l"], args["lo"], args["r"], args["ro"], args["s"], args["u"])
    with pytest.raises(ValueError):
        a.create_session(src_md, dst_md).batch_write(np.zeros((1, 2), np.int64), [0, 0], [1, 1], 1)
    assert a.batch_write([], [], [], [], [], []) == []
    assert not dst.any()


@pytest.mark.parametrize("kind,cfg", [
    (BackendType.RDMA, None), (BackendType.RDMA, RdmaBackendConfig()),
    (BackendType.XGMI, None), (BackendType.XGMI, XgmiBackendConfig()),
    (BackendType.FABRIC, None), (BackendType.FABRIC, FabricBackendConfig()),
])
def test_other_backends_not_implemented(engines, kind, cfg):
    e = engines.engine("notimpl", backend=False)
    with pytest.raises(NotImplementedError, match="TCP"):
        e.create_backend(kind, cfg)
    e.create_backend(BackendType.TCP, small_config())  # the engine is still usable
    assert e.get_engine_desc().port > 0


@pytest.mark.parametrize("kw", [
    dict(num_data_conns=0), dict(num_data_conns=17), dict(num_data_conns=-1),
    dict(chunk_bytes=100), dict(chunk_bytes=0), dict(same_host_chunk_bytes=100),
    dict(gpu_chunk_bytes=100),
    dict(keepalive_cnt=0), dict(keepalive_cnt=-1),
    dict(keepalive_idle_sec=-1), dict(num_shards=0), dict(cpus=[]), dict(cpus=[0, 0]),
    dict(striping_threshold_bytes=-1),
])
def test_tcp_config_invalid_values(kw):
    with pytest.raises(ValueError):
        TcpBackendConfig(**kw)


def test_tcp_config_invalid_after_construction(engines):
    cfg = small_config()
    cfg.chunk_bytes = 10  # fields stay writable; create_backend validates again
    e = engines.engine("badcfg", backend=False)
    with pytest.raises(ValueError):
        e.create_backend(BackendType.TCP, cfg)
    with pytest.raises(ValueError):
        cfg.keepalive_cnt = -1


@pytest.mark.parametrize("key,host", [("", "127.0.0.1"), ("k", "localhost"), ("k", "not-a-host"), ("k", "127.0.0"), ("x" * 5000, "127.0.0.1")])
def test_engine_bad_key_or_host(key, host):
    with pytest.raises(ValueError):
        IOEngine(key, IOEngineConfig(host=host, port=0))


def test_register_bad_memory(engines):
    e = engines.engine("badmem", backend=False)
    with pytest.raises(ValueError, match="null"):
        e.register_memory(0, 16, -1, MemoryLocationType.CPU)
    with pytest.raises(ValueError):
        e.register_memory(np.zeros(8).ctypes.data, 8, -1, MemoryLocationType.Unknown)
    with pytest.raises(ValueError):
        e.register_memory(np.zeros(8).ctypes.data, 8, -1, 7)
    a = np.zeros((8, 8), np.uint8)
    for view in (a[:, ::2], a.T, a[::-1], np.zeros((4, 4), np.uint8, order="F")):
        with pytest.raises(ValueError, match="contiguous"):
            e.register_array(view)
    ro = np.zeros(8, np.uint8)
    ro.flags.writeable = False
    with pytest.raises((TypeError, BufferError)):
        e.register_array(ro)
    for obj in (b"immutable", memoryview(b"immutable"), "str", None):
        with pytest.raises((TypeError, BufferError)):
            e.register_array(obj)


def test_offset_too_large_for_64_bits_is_overflow(wired):
    a, b, _src, _dst, smd, dmd = wired
    sess = a.create_session(smd, dmd)
    with pytest.raises(OverflowError, match="out of range"):
        sess.batch_write([2**64], [0], [1], a.allocate_transfer_uid())


def test_no_session_for_a_remote_without_engine(wired):
    a, _b, _src, _dst, smd, _dmd = wired
    assert a.create_session(smd, MemoryDesc()) is None


def test_fabric_allocator_says_tcp_only():
    for call in (lambda: fabric_alloc(1 << 20, 0), lambda: fabric_free(0)):
        with pytest.raises(NotImplementedError, match="TCP"):
            call()


def test_transfers_to_a_peer_registered_before_its_backend_fail_then_work(engines):
    a = engines.engine("early_a", config=small_config(op_timeout_ms=5000))
    b = engines.engine("early_b", backend=False)
    a.register_remote_engine(b.get_engine_desc())  # port 0: accepted, as in MORI
    b.create_backend(BackendType.TCP, small_config())
    src, dst = pattern(64, 3), np.zeros(64, np.uint8)
    smd, dmd = a.register_array(src), b.register_array(dst)
    st = a.write(smd, 0, dmd, 0, 64, a.allocate_transfer_uid())
    assert st.WaitFor(5000) == StatusCode.ERR_BAD_STATE
    assert "port 0" in st.Message()
    a.register_remote_engine(b.get_engine_desc())
    st = a.write(smd, 0, dmd, 0, 64, a.allocate_transfer_uid())
    assert st.WaitFor(5000) == StatusCode.SUCCESS, st.Message()
    assert np.array_equal(src, dst)
