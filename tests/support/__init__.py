"""What the tests share: the repository's paths, run and checkpoint factories, the hostile-input
runner, the scripted SSE server, the raw socket server, fakes of vLLM's server and of ssh, fake Slurm
commands, vLLM bench results of any size, the host requirements of the ``host`` marker, and the
processes a test's stop left."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"


def processes_naming(text: str) -> list[int]:
    """The live (not zombie) processes whose command line holds ``text``: what a test's stop left."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
                if text in (proc / "cmdline").read_bytes().decode(errors="replace") and ") Z" not in stat:
                    out.append(int(proc.name))
            except OSError:
                continue
    return out
