"""morio's logs: MORI's set_log_level names, Rust records in Python's logging, env at import."""

import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest

from morio import BackendType, set_log_level

from _util import small_config

LEVELS = {"trace": 5, "debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50, "off": 60}


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.parametrize("name", list(LEVELS) + ["INFO", "Warning", "warn"])
def test_set_log_level_accepts_mori_names(restore_log_level, name):
    set_log_level(name)
    want = LEVELS.get(name.lower(), 30)
    assert restore_log_level.level == want


@pytest.mark.parametrize("bad", ["", "verbose", "informational", "3", "err"])
def test_set_log_level_rejects_bad_names(restore_log_level, bad):
    before = restore_log_level.level
    with pytest.raises(ValueError):
        set_log_level(bad)
    assert restore_log_level.level == before
    with pytest.raises(TypeError):
        set_log_level(20)


def test_rust_logs_reach_python_logging(engines, restore_log_level):
    h = Collect()
    restore_log_level.addHandler(h)
    set_log_level("info")
    e = engines.engine("logkey", backend=False)
    e.create_backend(BackendType.TCP, small_config())
    key, port = e.get_engine_desc().key, e.get_engine_desc().port
    msgs = [(r.name, r.levelno, r.getMessage()) for r in h.records]
    hit = [m for m in msgs if m[2] == f"engine {key} listening on port {port}"]
    assert hit, msgs
    assert hit[0][0].split(".")[0] == "morio" and hit[0][1] == logging.INFO


def test_caplog_sees_rust_records(engines, restore_log_level, caplog):
    set_log_level("info")
    with caplog.at_level(logging.INFO, logger="morio"):
        e = engines.engine("caplog")
    port = e.get_engine_desc().port
    assert f"listening on port {port}" in caplog.text


def test_level_filters_rust_records(engines, restore_log_level):
    h = Collect()
    restore_log_level.addHandler(h)
    set_log_level("warning")
    engines.engine("quiet")
    assert not [r for r in h.records if "listening on port" in r.getMessage()]
    assert all(r.levelno >= logging.WARNING for r in h.records)


SCRIPT = textwrap.dedent(
    """
    import logging, sys
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s|%(levelname)s|%(message)s")
    import morio
    from morio import BackendType, IOEngine, IOEngineConfig, TcpBackendConfig
    print(logging.getLogger("morio").level, flush=True)
    e = IOEngine("envkey", IOEngineConfig("127.0.0.1", 0))
    e.create_backend(BackendType.TCP, TcpBackendConfig(num_data_conns=1))
    e.close()
    """
)


@pytest.mark.parametrize("env,level,listening", [
    ({"MORIO_LOG_LEVEL": "info"}, 20, True),
    ({"MORIO_LOG_LEVEL": "DEBUG"}, 10, True),
    ({"MORIO_LOG_LEVEL": "error"}, 40, False),
    ({"MORI_IO_LOG_LEVEL": "info"}, 20, True),
    ({"MORIO_LOG_LEVEL": "error", "MORI_IO_LOG_LEVEL": "info"}, 40, False),  # morio's own first
    ({}, 30, False),
])
def test_env_level_read_at_import(env, level, listening):
    clean = {k: v for k, v in os.environ.items() if k not in ("MORIO_LOG_LEVEL", "MORI_IO_LOG_LEVEL", "MORI_GLOBAL_LOG_LEVEL")}
    r = subprocess.run([sys.executable, "-c", SCRIPT], env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[0]) == level
    # The record comes from a logger under `morio.engine` (the Rust module that logs it).
    said = re.search(r"^morio\.engine(\.\w+)*\|INFO\|engine envkey listening on port", r.stderr, re.M)
    assert bool(said) == listening, r.stderr


def test_env_bad_level_warns():
    env = {**os.environ, "MORIO_LOG_LEVEL": "bogus"}
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[0]) == 30
    assert "bogus" in r.stderr
