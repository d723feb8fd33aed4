"""What a vLLM server leaves in the temp folder is gone once it stops.

vLLM 0.32's SIGTERM shutdown force-kills the engine core, so what only a clean exit removes stays:
its ZMQ IPC sockets (under ``VLLM_RPC_BASE_PATH``, default /tmp; 3 per server, counted on this box)
and its rendezvous file (``/tmp/vllm_dist_<hex>``, named in its log). ``day0.engine.vllm_cli
serve`` gives the sockets a folder of the process's own; the engine's stop removes the rendezvous
file its log names. The live half (vLLM binds where it is pointed, names its rendezvous file, and
both are gone after a whole run) is in tests/stages/latency/test_prefix_cache_live.py and
tests/harness/test_e2e.py; the server process here is the labelled fake of tests/support/fake_vllm.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from day0.config.profile import load_profile
from day0.engine import server as server_mod
from day0.engine.cluster.launchers import LocalLauncher, Node
from day0.engine.cluster.nodes import Cluster
from day0.engine.rpc_folder import FOLDER_LINE, own_rpc_folder
from day0.engine.server import ServerEngine, remove_file_stores
from tests.support.fake_vllm import FAKE_SERVER


def test_the_folder_holds_the_sockets_for_the_duration_and_goes_with_them():
    environ = {"PATH": "/bin"}
    with pytest.raises(SystemExit):  # a headless rank's SIGTERM, as vLLM raises it
        with own_rpc_folder(environ) as folder:
            assert folder is not None and environ["VLLM_RPC_BASE_PATH"] == str(folder)
            bound = socket.socket(socket.AF_UNIX)
            bound.bind(str(folder / "0b1c9f64-9a8e-4e57-bd3c-7c1f0f6c2a11"))  # a uuid4, as vLLM names them
            raise SystemExit
    bound.close()
    assert not folder.exists() and environ == {"PATH": "/bin"}


def test_a_path_the_user_set_is_kept(tmp_path):
    environ = {"VLLM_RPC_BASE_PATH": str(tmp_path)}
    with own_rpc_folder(environ) as folder:
        assert folder is None and environ == {"VLLM_RPC_BASE_PATH": str(tmp_path)}
    assert tmp_path.is_dir()  # never day0's to remove


def test_a_temp_folder_too_long_for_a_sockets_path_is_left_to_vllm(tmp_path, monkeypatch):
    deep = tmp_path / ("t" * 60)  # + day0-rpc-XXXXXXXX/ + a uuid: past the 107 bytes of a socket's path
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    environ: dict[str, str] = {}
    with own_rpc_folder(environ) as folder:
        assert folder is None and environ == {}
    assert list(deep.iterdir()) == []


def test_serve_runs_vllm_inside_the_folder_and_other_commands_outside_it(tmp_path):
    """The module's own ``main``, with vLLM's CLI replaced by one that reports where it would bind."""
    probe = ("import os, sys, vllm.entrypoints.cli.main as m; "
             "m.main = lambda: print('bind:', os.environ.get('VLLM_RPC_BASE_PATH'), sys.argv[1:]); "
             "from day0.engine.vllm_cli import main; main(sys.argv[1:])")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_RPC_BASE_PATH"}
    served = subprocess.run([sys.executable, "-c", probe, "serve", "m"], capture_output=True, text=True, timeout=120, env=env)
    assert served.returncode == 0, served.stderr
    folder = FOLDER_LINE.search(served.stderr).group(1)  # named in the server's log
    assert f"bind: {folder} ['serve', 'm']" in served.stdout and not Path(folder).exists()
    bench = subprocess.run([sys.executable, "-c", probe, "bench", "serve"], capture_output=True, text=True, timeout=120, env=env)
    assert "bind: None ['bench', 'serve']" in bench.stdout and not FOLDER_LINE.search(bench.stderr)


def test_a_stop_before_vllm_has_a_handler_of_its_own_removes_the_folder_and_dies_of_the_signal():
    """vLLM installs its SIGTERM handler only after its imports: a stop before that must not leave
    the folder, and must end the process as SIGTERM's default does."""
    probe = ("import os, sys, time, vllm.entrypoints.cli.main as m; "
             "m.main = lambda: (print('bind:', os.environ['VLLM_RPC_BASE_PATH'], flush=True), time.sleep(60)); "
             "from day0.engine.vllm_cli import main; main(sys.argv[1:])")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_RPC_BASE_PATH"}
    proc = subprocess.Popen([sys.executable, "-c", probe, "serve", "m"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        folder = Path(line.split()[1])
        assert line.startswith("bind:") and folder.is_dir()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM and not folder.exists()


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


def _engine(tmp_path: Path, monkeypatch, cluster: Cluster | None = None) -> ServerEngine:
    monkeypatch.setattr(ServerEngine, "command", lambda self, model, port: [sys.executable, "-c", FAKE_SERVER, str(port), "0"])
    profile = load_profile("cpu-tiny", overrides={"engine": {"startup_timeout_s": 30}})
    return ServerEngine(profile, tmp_path / "run", lambda _: None, cluster=cluster)


def test_the_stop_removes_the_rendezvous_file_its_server_named(tmp_path, monkeypatch):
    engine = _engine(tmp_path, monkeypatch)
    store = tmp_path / "vllm_dist_00000000000000000000000000000001"
    store.write_bytes(b"store")
    engine.start()
    with engine.log_path.open("a") as fh:
        fh.write(f"distributed_init_method=file://{store} backend=gloo\n")
    engine.stop()
    assert not store.exists()


def test_a_launch_that_fails_on_one_node_stops_the_nodes_it_started(tmp_path, monkeypatch):
    nodes = [Node("node0", 0, "127.0.0.1"), Node("node1", 1, "127.0.0.1")]
    engine = _engine(tmp_path, monkeypatch, cluster=Cluster(nodes, LocalLauncher()))
    started: list[subprocess.Popen[bytes]] = []

    def spawn(launcher, node, argv, env, log_path, base, header=""):
        if node.index == 1:
            raise OSError("node1: no such host")
        started.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
        return started[-1]

    monkeypatch.setattr(server_mod, "spawn", spawn)
    with pytest.raises(OSError, match="node1"):
        engine.launch()
    assert len(started) == 1 and started[0].poll() is not None and engine.procs == []
