"""The engine's ranks read beside it (day0/engine/ranks.py): real processes with vLLM's process
titles, real memory, a real listening socket; nvidia-smi through a scripted output (no GPU here)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from day0.engine import ranks as rk

# A labelled fake engine: a parent titled like vLLM's engine core, two children titled like its TP
# workers, each touching a known amount of private memory, then taking its title and waiting to be
# measured (titled earlier, a busy box measured TP1 at 57 of its 64 MiB).
FAKE_ENGINE = textwrap.dedent("""
    import os, subprocess, sys, time, setproctitle
    role, mib = sys.argv[1], int(sys.argv[2])
    held = bytearray(mib * 2**20)
    for i in range(0, len(held), 4096):
        held[i] = 1  # resident, not just reserved
    setproctitle.setproctitle(role)  # titled once its memory is all touched: the title says "measure me"
    kids = []
    if role == "VLLM::EngineCore" and len(sys.argv) > 3:
        kids = [subprocess.Popen([sys.executable, __file__, f"VLLM::Worker_TP{r}", str(mib * (r + 1))])
                for r in (1, 0)]
    print("ready", flush=True)
    time.sleep(120)
""")


def start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    script = tmp_path / "fake_engine.py"
    script.write_text(FAKE_ENGINE)
    proc = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, 9)
    proc.wait(10)


def wait_for_ranks(root: int, n: int, timeout_s: float = 30) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = rk.rank_pids(root)
        if len(found) == n and all(t.startswith(rk.WORKER_TITLE) for _, t in found):
            return found  # each took its title after touching its memory
        time.sleep(0.2)
    raise AssertionError(f"the fake workers of {root} did not come up: {rk.rank_pids(root)}")


def test_the_workers_are_the_ranks_in_rank_order_with_their_own_memory(tmp_path: Path) -> None:
    proc = start(tmp_path, "VLLM::EngineCore", "32", "workers")
    try:
        found = wait_for_ranks(proc.pid, 2)
        assert [t for _, t in found] == ["VLLM::Worker_TP0", "VLLM::Worker_TP1"]
        held = rk.ranks(proc.pid, "cpu")
        tp0, tp1 = held[0].resident_bytes, held[1].resident_bytes
        assert tp0 >= 32 * 2**20 and tp1 >= 64 * 2**20  # each its own pages: TP1 touched twice TP0's
        assert 20 * 2**20 < tp1 - tp0 < 44 * 2**20
    finally:
        stop(proc)


def test_one_rank_is_the_engine_core_and_a_plain_process_is_its_own_rank(tmp_path: Path) -> None:
    proc = start(tmp_path, "VLLM::EngineCore", "8")
    try:
        assert rk.rank_pids(proc.pid) == [(proc.pid, "VLLM::EngineCore")]
    finally:
        stop(proc)
    with pytest.raises(rk.RanksUnavailable, match=f"engine process {proc.pid} is gone"):
        rk.rank_pids(proc.pid)


def test_the_listener_of_a_port_is_found() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert rk.listener_pid(f"http://127.0.0.1:{port}/v1") == os.getpid()
    with pytest.raises(rk.RanksUnavailable, match=f"no process of this host listens on port {port}"):
        rk.listener_pid(f"http://127.0.0.1:{port}")


@pytest.mark.parametrize("url, here", [
    ("http://127.0.0.1:8000", True), ("http://localhost:8000", True), ("http://[::1]:8000", True),
    ("http://192.0.2.7:8000", False),  # TEST-NET-1: never this host
])
def test_beside_knows_this_host(url: str, here: bool) -> None:
    assert (rk.beside(url) is None) == here


def test_an_address_of_this_host_is_beside() -> None:
    ours = sorted(a for a in rk.local_addresses() if a.count(".") == 3 and not a.startswith("127."))
    if not ours:
        pytest.skip("no non-loopback IPv4 address on this host")
    assert rk.beside(f"http://{ours[0]}:8000") is None


def test_nvidia_smi_lines_become_bytes_per_pid() -> None:
    text = "4242, 81234\n4243, 81000\n4242, 10\n[N/A], [N/A]\ngarbage\n"
    assert rk.parse_compute_apps(text) == {4242: 81244 * 2**20, 4243: 81000 * 2**20}
    assert rk.device_resident([4243], run=lambda cmd: text) == {4243: 81000 * 2**20}
    with pytest.raises(rk.RanksUnavailable, match="no GPU memory for rank process 7"):
        rk.device_resident([4242, 7], run=lambda cmd: text)

    def no_driver(cmd):
        raise FileNotFoundError(2, "No such file or directory", cmd[0])
    with pytest.raises(rk.RanksUnavailable, match="nvidia-smi could not list"):
        rk.device_resident([1], run=no_driver)
