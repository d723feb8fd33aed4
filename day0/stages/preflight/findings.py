"""The lint's unit of output, apart from the rules so every rule module can build one.

Why its own module: the lint's rules live in several modules (:mod:`.lint`, :mod:`.cpu_kernels`,
:mod:`.experts`); each returns :class:`Finding` objects, and none may import the module that
gathers them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from day0.core.redact import REDACTED, is_secret_key

Severity = Literal["error", "warning", "info"]
SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One lint result: where (key), what (value), why it matters, and the change that fixes it."""

    severity: Severity
    rule: str  # stable short id, becomes preflight.lint.<rule>
    key: str
    value: Any
    why: str
    fix: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"finding {self.rule}: severity {self.severity!r} is not one of {SEVERITIES}")

    @property
    def shown(self) -> Any:
        """The value as a report may show it: never the value of a key that names a secret."""
        return REDACTED if is_secret_key(self.key.rsplit(".", 1)[-1]) else self.value

    def line(self) -> str:
        return f"{self.severity}: {self.key}={self.shown!r}: {self.why}; fix: {self.fix}"
