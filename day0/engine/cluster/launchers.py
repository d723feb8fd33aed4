"""How a process starts on a node: one launcher per way of reaching a node, and nothing else does it.

Stages and engines that start processes on nodes (engine ranks, collective ranks) ask a
:class:`Launcher` for the command line and call :func:`spawn`; none of them names ``ip netns``,
``srun`` or ``ssh``. A launcher only wraps a command: the node-specific environment
(:meth:`Node.env`) travels the way that launcher carries environment (the process's own for
local/netns/srun, the ssh channel's stdin for ssh).
"""

from __future__ import annotations

import base64
import contextlib
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

from day0.config.section import ENV_NAME
from day0.engine.process import die_with_parent


@dataclass(frozen=True)
class Node:
    """One node as the processes on it see it. ``address`` is what the other nodes reach it at
    (node0's is the rendezvous address); ``ifname`` is the interface gloo/NCCL sockets bind to."""

    name: str  # node0, node1, ...
    index: int
    address: str
    host: str = ""  # srun -w / ssh target
    netns: str = ""  # emulated node: its network namespace
    ifname: str = ""

    def env(self) -> dict[str, str]:
        """What a process on this node must know about it: torch.distributed and vLLM bind their
        sockets to ``ifname``/``address``; ``DAY0_NODE`` names the node in step files and results
        (emulated nodes share one hostname)."""
        env = {"DAY0_NODE": self.name, "DAY0_NODE_ADDR": self.address}
        if self.ifname:
            env.update(GLOO_SOCKET_IFNAME=self.ifname, NCCL_SOCKET_IFNAME=self.ifname, TP_SOCKET_IFNAME=self.ifname)
        if self.address and self.netns:
            env["VLLM_HOST_IP"] = self.address
        return env

    def describe(self) -> dict[str, str | int]:
        out: dict[str, str | int] = {"name": self.name, "index": self.index, "address": self.address}
        out.update({k: v for k, v in (("host", self.host), ("netns", self.netns), ("ifname", self.ifname)) if v})
        return out


class Launcher(Protocol):
    kind: str

    def argv(self, node: Node, cmd: Sequence[str], env: Mapping[str, str]) -> list[str]:
        """The command line that runs ``cmd`` on ``node`` with ``env`` added to its environment."""
        ...

    def env_input(self, env: Mapping[str, str]) -> bytes | None:
        """What the started process reads on its stdin to get ``env``; None: it inherits the local
        environment, ``env`` added, and its stdin is empty."""
        ...


class LocalLauncher:
    kind = "local"

    def argv(self, node: Node, cmd: Sequence[str], env: Mapping[str, str]) -> list[str]:
        return list(cmd)

    def env_input(self, env: Mapping[str, str]) -> bytes | None:
        return None


class NetnsLauncher:
    """An emulated node: the same host, the node's network namespace (``ip netns exec`` keeps the
    environment and execs the command, so it stays the direct child and dies with the harness)."""

    kind = "netns"

    def argv(self, node: Node, cmd: Sequence[str], env: Mapping[str, str]) -> list[str]:
        if not node.netns:
            raise ValueError(f"{node.name}: no network namespace (is the emulated cluster up?)")
        return ["ip", "netns", "exec", node.netns, *cmd]

    def env_input(self, env: Mapping[str, str]) -> bytes | None:
        return None


class SrunLauncher:
    """Inside a Slurm allocation: one task on the named host. ``--overlap`` because the engine's step
    already holds the node when the collectives' step starts; ``--export=ALL`` carries the environment.
    ``conf``: the slurm.conf of a Slurm day0 runs itself (an emulated cluster's), named on the command
    line so the log shows which scheduler started the process."""

    kind = "srun"

    def __init__(self, conf: str = "") -> None:
        self.conf = conf

    def argv(self, node: Node, cmd: Sequence[str], env: Mapping[str, str]) -> list[str]:
        prefix = ["env", f"SLURM_CONF={self.conf}"] if self.conf else []
        return [*prefix, "srun", "--nodes=1", "--ntasks=1", "-w", node.host or node.address, "--overlap",
                "--export=ALL", "--kill-on-bad-exit=1", *cmd]

    def env_input(self, env: Mapping[str, str]) -> bytes | None:
        return None


# The remote side of an ssh launch, run by sh whatever the login shell is. The environment arrives
# first on stdin (base64 of `export` lines): on a command line `ps` on either host would show an
# API key. Then stdin stays open as the harness's lifeline: without a tty sshd signals nothing when
# its client goes, so a stopped (or SIGKILLed) harness left the remote ranks running. At EOF the
# whole session gets SIGTERM, as a local group does at a stop, and SIGKILL once the command is gone
# or 30 s have passed.
# A background list's stdin is /dev/null in a shell without job control: hence fd 3.
_REMOTE = """cd "$1" || exit 1
shift
IFS= read -r env64 || exit 1
eval "$(printf '%s' "$env64" | base64 -d)" || exit 1
exec 3<&0
"$@" </dev/null 3<&- &
child=$!
(trap '' TERM; cat <&3; kill -TERM 0; i=0
 while kill -0 "$child" && [ $i -lt 30 ]; do sleep 1; i=$((i + 1)); done; kill -KILL 0) >/dev/null 2>&1 &
watch=$!
wait "$child"
status=$?
kill -KILL "$watch" 2>/dev/null
exit "$status"
"""


class SshLauncher:
    """Another host over ssh: non-interactive (BatchMode), in the same directory; the node's
    environment goes through the channel (ssh does not forward the local one), and the remote
    process lives as long as the channel does (``_REMOTE``)."""

    kind = "ssh"

    def __init__(self, cwd: Path | str | None = None, options: Sequence[str] = ("-o", "BatchMode=yes")) -> None:
        self.cwd = str(cwd or Path.cwd())
        self.options = list(options)

    def argv(self, node: Node, cmd: Sequence[str], env: Mapping[str, str]) -> list[str]:
        remote = shlex.join(["exec", "sh", "-c", _REMOTE, "day0-node", self.cwd, *cmd])
        return ["ssh", *self.options, "--", node.host or node.address, remote]  # a host is never an option

    def env_input(self, env: Mapping[str, str]) -> bytes | None:
        """The ``export`` lines the remote ``eval`` runs: a name is spliced in as it is, so a name
        that is not one (the profile refuses them too) is refused here rather than run."""
        for name in env:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"engine.env: {name!r} is not an environment variable name")
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        return base64.b64encode(exports.encode()) + b"\n"


def launcher_for(kind: str) -> Launcher:
    kinds: dict[str, type] = {"local": LocalLauncher, "netns": NetnsLauncher, "srun": SrunLauncher, "ssh": SshLauncher}
    if kind not in kinds:
        raise ValueError(f"topology.launcher: {kind!r} is not one of {', '.join(kinds)}")
    return kinds[kind]()


def spawn(launcher: Launcher, node: Node, cmd: Sequence[str], env: Mapping[str, str], log_path: Path,
          base_env: Mapping[str, str], header: str | Callable[[list[str]], str] = "") -> subprocess.Popen[bytes]:
    """Start ``cmd`` on ``node``: its own session (so the group is stopped whole), dying with the
    harness (PDEATHSIG), stdout and stderr into ``log_path``. ``env`` is the node's and the
    command's environment; ``base_env`` is this process's, inherited where the launcher can.
    ``header``, the log's first line, may be made from the command line the launcher built."""
    node_env = {**node.env(), **env}
    argv = launcher.argv(node, cmd, node_env)
    env_input = launcher.env_input(node_env)
    full_env = {**base_env, **node_env} if env_input is None else dict(base_env)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    text = header(argv) if callable(header) else header
    with log_path.open("wb") as fh:
        if text:
            fh.write(text.encode() + b"\n")
            fh.flush()
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=full_env, preexec_fn=die_with_parent,
                                stdin=subprocess.DEVNULL if env_input is None else subprocess.PIPE)
    if env_input is not None and proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError):  # a launch that died at once: its log says why
            proc.stdin.write(env_input)
            proc.stdin.flush()
        # left open: the process lives while it is (the Popen holds it, and this process's death closes it)
    return proc
