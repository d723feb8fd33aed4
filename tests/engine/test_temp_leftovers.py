"""What a vLLM server leaves in the temp folder is gone once the engine stops.

vLLM 0.32's SIGTERM shutdown force-kills the engine core, so what only a clean exit removes stays:
its ZMQ IPC sockets (under ``VLLM_RPC_BASE_PATH``, default /tmp; 3 per server, counted on this box)
and its rendezvous file (``/tmp/vllm_dist_<hex>``, named in its log). The server process is the
labelled fake of tests/support/fake_vllm.py, doing what vLLM does with its sockets: it binds one
under the path and dies on SIGTERM without unlinking it. The live half (vLLM binds where day0
points it, and names its rendezvous file in the log) is in tests/stages/latency/test_prefix_cache_live.py.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from day0.config.profile import load_profile
from day0.engine.cluster.launchers import LocalLauncher, NetnsLauncher, Node, SrunLauncher, SshLauncher
from day0.engine.cluster.nodes import Cluster
from day0.engine.server import ServerEngine, remove_file_stores
from tests.support.fake_vllm import FAKE_SERVER


def _sockets(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.is_socket()]


def _engine(tmp_path: Path, monkeypatch, env: dict[str, str] | None = None, cluster: Cluster | None = None) -> ServerEngine:
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    monkeypatch.setattr(ServerEngine, "command", lambda self, model, port: [sys.executable, "-c", FAKE_SERVER, str(port), "0", "rpc"])
    profile = load_profile("cpu-tiny", overrides={"engine": {"startup_timeout_s": 30, "env": env or {}}})
    return ServerEngine(profile, tmp_path / "run", lambda _: None, cluster=cluster)


def test_the_servers_sockets_are_in_its_own_folder_and_the_stop_removes_what_the_server_left(tmp_path, monkeypatch):
    engine = _engine(tmp_path, monkeypatch)
    engine.start()
    folder = engine.rpc_dir
    try:
        assert folder is not None and folder.is_dir()
        deadline = time.monotonic() + 10
        while not _sockets(folder) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_sockets(folder)) == 1  # the server bound where day0 pointed it
    finally:
        engine.stop()
    assert not folder.exists() and engine.rpc_dir is None


def test_a_path_the_user_set_is_kept(tmp_path, monkeypatch):
    own = Path(tempfile.mkdtemp(prefix="d0-"))  # short: tmp_path under xdist is too long for a socket's path
    engine = _engine(tmp_path, monkeypatch, env={"VLLM_RPC_BASE_PATH": str(own)})
    engine.start()
    try:
        assert engine.rpc_dir is None
        assert engine.environment()["VLLM_RPC_BASE_PATH"] == str(own)
    finally:
        engine.stop()
    assert own.is_dir()  # never day0's to remove
    shutil.rmtree(own)


def test_a_temp_folder_too_long_for_a_sockets_path_is_left_to_vllm(tmp_path, monkeypatch):
    usual = tempfile.gettempdir()
    deep = tmp_path / ("t" * 60)  # + day0-rpc-XXXXXXXX/ + a uuid: past the 107 bytes of a socket's path
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    engine = _engine(tmp_path, monkeypatch)
    assert engine._own_rpc_dir() is None
    assert list(deep.iterdir()) == []
    monkeypatch.setattr(tempfile, "tempdir", usual)
    folder = engine._own_rpc_dir()
    assert folder is not None
    folder.rmdir()


def test_only_nodes_on_this_host_get_a_folder_made_here(tmp_path, monkeypatch):
    nodes = [Node("node0", 0, "10.0.0.1", host="a", netns="n0"), Node("node1", 1, "10.0.0.2", host="b", netns="n1")]
    made = {}
    launchers = {"local": LocalLauncher(), "netns": NetnsLauncher(), "srun": SrunLauncher(),
                 "srun of an emulated cluster": SrunLauncher(conf="/run/day0-emu/slurm.conf"), "ssh": SshLauncher()}
    for name, launcher in launchers.items():
        engine = _engine(tmp_path, monkeypatch, cluster=Cluster(nodes, launcher))
        folder = engine._own_rpc_dir()
        made[name] = folder is not None
        if folder is not None:
            folder.rmdir()
    assert made == {"local": True, "netns": True, "srun": False, "srun of an emulated cluster": True, "ssh": False}


def test_the_rendezvous_files_a_log_names_are_removed_and_nothing_else(tmp_path):
    named = tmp_path / "vllm_dist_0123456789abcdef0123456789abcdef"
    other = tmp_path / "vllm_dist_fedcba9876543210fedcba9876543210"  # another engine's, running
    near = tmp_path / "vllm_dist_0123456789abcdef0123456789abcdef0"  # not vLLM's name: one digit more
    for f in (named, other, near):
        f.write_bytes(b"store")
    log = tmp_path / "engine-server.log"
    log.write_text(f"(EngineCore pid=1) INFO [worker.py:80] world_size=1 rank=0 local_rank=0 "
                   f"distributed_init_method=file://{named} backend=gloo\n"
                   f"distributed_init_method=file://{near} backend=gloo\n")
    assert remove_file_stores(log) == [named]
    assert not named.exists() and other.exists() and near.exists()
    assert remove_file_stores(log) == []  # again: nothing left, no error
    assert remove_file_stores(tmp_path / "no-such.log") == []


def test_the_stop_removes_the_rendezvous_file_its_server_named(tmp_path, monkeypatch):
    engine = _engine(tmp_path, monkeypatch)
    store = tmp_path / "vllm_dist_00000000000000000000000000000001"
    store.write_bytes(b"store")
    engine.start()
    with engine.log_path.open("a") as fh:
        fh.write(f"distributed_init_method=file://{store} backend=gloo\n")
    engine.stop()
    assert not store.exists()


def test_a_launch_that_fails_leaves_no_folder(tmp_path, monkeypatch):
    engine = _engine(tmp_path, monkeypatch)
    monkeypatch.setattr(ServerEngine, "command", lambda self, model, port: [str(tmp_path / "no-such-python")])
    made: list[Path] = []
    own = ServerEngine._own_rpc_dir
    monkeypatch.setattr(ServerEngine, "_own_rpc_dir", lambda self: made.append(own(self)) or made[-1])
    with pytest.raises(OSError):
        engine.launch()
    assert len(made) == 1 and made[0] is not None and not made[0].exists() and engine.rpc_dir is None
