"""What the tests share: the repository's paths, run and checkpoint factories, the hostile-input
runner, the scripted SSE server, fake Slurm commands, and the host requirements of the ``host`` marker."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
