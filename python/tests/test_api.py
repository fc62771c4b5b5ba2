"""The names and signatures a MORI-IO user relies on (mori.io + mori.cpp.TransferStatus)."""

import inspect

import pytest

import morio
from morio import BackendType, IOEngine, IOEngineConfig, MemoryLocationType, PollCqMode, TcpBackendConfig

MORI_IO_NAMES = [
    "IOEngine", "IOEngineSession", "IOEngineConfig", "StatusCode", "BackendType", "EngineDesc",
    "MemoryDesc", "MemoryLocationType", "PollCqMode", "RdmaBackendConfig", "TcpBackendConfig",
    "XgmiBackendConfig", "FabricBackendConfig", "set_log_level", "TransferStatus",
]


def test_mori_names_exported():
    missing = [n for n in MORI_IO_NAMES if not hasattr(morio, n)]
    assert not missing
    assert set(MORI_IO_NAMES) <= set(morio.__all__)
    ns = {}
    exec("from morio import *", ns)
    assert set(MORI_IO_NAMES) <= set(ns)


def test_enum_values():
    assert {m.name: int(m) for m in BackendType} == {"Unknown": 0, "XGMI": 1, "RDMA": 2, "TCP": 3, "FABRIC": 4}
    assert {m.name: int(m) for m in MemoryLocationType} == {"Unknown": 0, "CPU": 1, "GPU": 2}
    assert {m.name: int(m) for m in PollCqMode} == {"POLLING": 0, "EVENT": 1}


def test_mori_keyword_call_forms():
    cfg = IOEngineConfig(host="127.0.0.1", port=0)
    assert (cfg.host, cfg.port) == ("127.0.0.1", 0)
    e = IOEngine(key="kw_engine", config=cfg)
    try:
        e.create_backend(BackendType.TCP)  # config=None: the defaults
        assert e.get_engine_desc().port > 0
        e.register_remote_engine(engine_desc=e.get_engine_desc())  # loopback to itself
        md = e.register_array(bytearray(64))
        sess = e.create_session(local_mem_desc=md, remote_mem_desc=md)
        assert sess is not None
        st = e.write(local_src_mem_desc=md, local_offset=0, remote_dest_mem_desc=md, remote_offset=0,
                     size=0, transfer_uid=e.allocate_transfer_uid())
        assert st.Wait() == morio.StatusCode.SUCCESS
        assert e.wait_all(statuses=[st], timeout_ms=0) == morio.StatusCode.SUCCESS
    finally:
        e.close()


def test_tcp_config_keywords_are_moris():
    params = list(inspect.signature(TcpBackendConfig).parameters)
    assert params[:10] == [
        "sock_sndbuf_bytes", "sock_rcvbuf_bytes", "op_timeout_ms", "enable_keepalive",
        "keepalive_idle_sec", "keepalive_intvl_sec", "keepalive_cnt", "enable_ctrl_nodelay",
        "num_data_conns", "striping_threshold_bytes"]
    # Positional, in MORI's order.
    c = TcpBackendConfig(1 << 20, 2 << 20, 500, False, 5, 6, 7, False, 3, 1024)
    assert (c.sock_sndbuf_bytes, c.sock_rcvbuf_bytes, c.op_timeout_ms, c.enable_keepalive, c.keepalive_idle_sec,
            c.keepalive_intvl_sec, c.keepalive_cnt, c.enable_ctrl_nodelay, c.num_data_conns,
            c.striping_threshold_bytes) == (1 << 20, 2 << 20, 500, False, 5, 6, 7, False, 3, 1024)


def test_gpu_staging_keywords_default_and_round_trip():
    c = TcpBackendConfig()
    assert (c.gpu_chunk_bytes, c.gpu_slot_bytes, c.chunk_bytes) == (2 << 20, 2 << 20, 1 << 20)
    c = TcpBackendConfig(gpu_chunk_bytes=4 << 20, gpu_slot_bytes=1 << 20)
    assert (c.gpu_chunk_bytes, c.gpu_slot_bytes) == (4 << 20, 1 << 20)
    c.gpu_chunk_bytes = 1 << 20
    assert c.gpu_chunk_bytes == 1 << 20
    assert TcpBackendConfig().gpu_data_conns is None
    assert TcpBackendConfig(gpu_data_conns=16).gpu_data_conns == 16
    for bad in (0, 17):
        with pytest.raises(ValueError, match="gpu_data_conns"):
            TcpBackendConfig(gpu_data_conns=bad)
    with pytest.raises(ValueError, match="gpu_data_conns"):
        c.gpu_data_conns = 17
    assert c.gpu_data_conns is None
    c.gpu_data_conns = 12
    assert c.gpu_data_conns == 12
    c.gpu_data_conns = None
    assert c.gpu_data_conns is None


def test_transfer_uids_are_unique_across_threads_and_start_at_zero(engines):
    """`allocate_transfer_uid` from several threads at once: no uid twice, each thread's
    increasing (they come in per-thread blocks, so not consecutive across threads)."""
    import threading

    e = engines.engine("uids")
    assert e.allocate_transfer_uid() == 0
    got = {}

    def take(t):
        got[t] = [e.allocate_transfer_uid() for _ in range(2000)]

    ts = [threading.Thread(target=take, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    every = [u for v in got.values() for u in v]
    assert len(set(every)) == len(every) and 0 not in every
    assert all(v == sorted(v) for v in got.values())
