"""Secrets never reach a file the run writes: one redactor, applied where files are written.

A secret reaches day0 in three ways: as a value under a key that names it (``api_key``,
``hf-token``, ``HF_TOKEN``), as the value of an environment variable (``engine.api_key_env``, or any
variable named like a token, key or password), or inside free text (a command line, an exception
message quoting a URL or a header). Callers cannot be trusted to remember all three, so the event
log, the engine log and the run record run everything they write through :class:`Redactor`: keys
by name, known values wherever they appear in a string, and ``--api-key X`` / ``Bearer X`` shapes in
text.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

REDACTED = "<redacted>"

# A key that names a secret, matched on the whole key (or its last ``_``/``-`` separated words), so
# `num_key_value_heads` or `max_num_batched_tokens` are not mistaken for secrets, `hf-token` is.
SECRET_KEY = re.compile(
    r"^(?!(?:.*[_\-.])?(?:eos|bos|pad|unk|sep|cls|mask|decoded|itl|first|last|stop|special|added|profile|cache"
    r"|sort|prefix|metrics_by)[_\-](?:token|key)$)"
    r"(?:.*[_\-.])?(?:api[_\-]?key|access[_\-]?key|secret[_\-]?key|private[_\-]?key|key|token|secret|password"
    r"|passwd|credentials?|authorization|bearer)$",
    re.IGNORECASE,
)
# An environment variable named like a secret: HF_TOKEN, VLLM_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD.
SECRET_ENV_NAME = re.compile(r"(?:^|_)(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?|AUTH)(?:_|$)", re.IGNORECASE)
# Shapes of secrets in free text: `--api-key X`, `--hf-token=X`, `Authorization: Bearer X`, `api_key=X`.
# A flag starts a word: in `a 4096-token prefix` the dash is a hyphen, not a flag.
_FLAG_VALUE = re.compile(
    r"(?<![\w\-])(?P<flag>--?[\w\-]*(?:api[_\-]?key|token|secret|password|passwd|credentials?))(?P<sep>=| +)"
    r"(?P<value>(?!<redacted>)[^\s'\",-][^\s'\",]*)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<flag>\bBearer)(?P<sep>\s+)(?P<value>[^\s'\",]+)", re.IGNORECASE)
_ASSIGN = re.compile(
    r"(?P<flag>[\"']?\b[\w\-]*(?:api[_\-]?key|token|secret|password|passwd)[\"']?)(?P<sep>\s*[:=]\s*[\"']?)"
    r"(?P<value>(?!<redacted>)(?=[^\s'\",}]*[A-Za-z])[^\s'\",}]{8,})",
    re.IGNORECASE,
)
# Shorter values are not redacted by value: "1" or "true" would blank half a report. Such a value is
# still redacted by its key; a real credential is never this short.
MIN_SECRET_LEN = 6


def is_secret_key(key: object) -> bool:
    return bool(SECRET_KEY.match(str(key)))


def is_secret_env_name(name: str) -> bool:
    return bool(SECRET_ENV_NAME.search(name))


@dataclass(frozen=True)
class Redactor:
    """Everything known to be secret in one run; call it on any JSON-like value or string."""

    values: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_sources(cls, *, environ: Mapping[str, str] | None = None, env_names: Iterable[str] = (),
                     data: Any = None) -> "Redactor":
        """Secrets named by ``env_names`` (e.g. ``engine.api_key_env``), every variable of ``environ``
        named like a secret, and every value under a secret key in ``data`` (the raw profile)."""
        environ = os.environ if environ is None else environ
        found: set[str] = set()
        for name in env_names:
            if name and environ.get(name):
                found.add(environ[name])
        found.update(v for k, v in environ.items() if is_secret_env_name(k) and v)
        found.update(_values_under_secret_keys(data))
        return cls(frozenset(v for v in found if len(v) >= MIN_SECRET_LEN))

    def with_values(self, values: Iterable[str]) -> "Redactor":
        return Redactor(self.values | {v for v in values if v and len(v) >= MIN_SECRET_LEN})

    def __call__(self, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: (REDACTED if is_secret_key(k) and _is_scalar_secret(v) else self(v)) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            return [self(v) for v in data]
        if isinstance(data, str):
            return self.text(data)
        return data

    def strings(self, data: Any) -> Any:
        """Every string through :meth:`text` (known values, secret shapes), no field blanked for
        its name: for day0's own declarations, where ``key`` names a figure, not a credential."""
        if isinstance(data, dict):
            return {k: self.strings(v) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            return [self.strings(v) for v in data]
        return self.text(data) if isinstance(data, str) else data

    def text(self, text: str) -> str:
        # Longest first, so a secret that contains another is replaced whole.
        for value in sorted(self.values, key=len, reverse=True):
            if value in text:
                text = text.replace(value, REDACTED)
        for pattern in (_FLAG_VALUE, _BEARER, _ASSIGN):
            text = pattern.sub(_keep_flag, text)
        return text

    def argv(self, argv: Iterable[str]) -> list[str]:
        """A command line for a log: the value after a secret flag goes, as does any known value."""
        out: list[str] = []
        hide_next = False
        for arg in argv:
            if hide_next:
                out.append(REDACTED)
                hide_next = False
                continue
            flag = arg.split("=", 1)[0]
            if flag.startswith("-") and is_secret_key(flag.lstrip("-")):
                if "=" in arg:
                    out.append(f"{flag}={REDACTED}")
                else:
                    out.append(arg)
                    hide_next = True
                continue
            out.append(self.text(arg))
        return out


def _keep_flag(m: re.Match[str]) -> str:
    return f"{m.group('flag')}{m.group('sep')}{REDACTED}"


def _is_scalar_secret(v: Any) -> bool:
    """Strings (and lists of them, vLLM's ``api_key`` takes several): a number under a key named
    ``token`` is a token id, not a credential."""
    return isinstance(v, str) or (isinstance(v, list) and bool(v) and all(isinstance(x, str) for x in v))


def _values_under_secret_keys(data: Any) -> Iterable[str]:
    if isinstance(data, dict):
        for k, v in data.items():
            if is_secret_key(k) and _is_scalar_secret(v):
                yield from [v] if isinstance(v, str) else v
            else:
                yield from _values_under_secret_keys(v)
    elif isinstance(data, list):
        for v in data:
            yield from _values_under_secret_keys(v)
