"""Secrets never reach what day0 writes or prints: one redactor, applied on every output channel.

A secret reaches day0 in three ways: as a value under a key that names it (``api_key``,
``hf-token``, ``HF_TOKEN``), as the value of an environment variable (``engine.api_key_env``, or any
variable named like a token, key or password), or inside a value or free text under any key at
all (a proxy URL's password, an error body quoting an Authorization header, a signed query
string, a shell-quoted flag in a command line, a cookie in a check's evidence). Callers cannot be
trusted to remember all three, so the event log, the engine log and the run record run everything
they write through :class:`Redactor`, and so does everything a command prints or exports
(:class:`day0.core.terminal.Terminal`): keys by name, known values wherever they appear in a
string (also escaped, line by line, or wrapped), and secret shapes in text (``_SHAPES``, listed in
docs/profiles.md, "Secrets"), in a table's keys as in its values. Why shapes as well as names: a
value has no name to go by.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, Iterator, Mapping

from day0.core.secret_lists import (
    FLAG_LIST_ITEMS,
    LETTER,
    LIST_ITEMS,
    YAML_BLOCK_ITEM,
    YAML_GAP,
    YAML_ITEM,
    has_secret_item,
)

REDACTED = "<redacted>"

# A key that names a secret, matched on the whole key (or its last ``_``/``-`` separated words), so
# `num_key_value_heads` or `max_num_batched_tokens` are not mistaken for secrets, `hf-token` is.
# Names that end like a secret and are not one: tokenizer words, figures, cache and sort keys, rates
# (`experts_per_token`, `kv_bytes_per_token`: a plan's figures), a figure's `answer_key`.
_NOT_SECRET = (r"(?:eos|bos|pad|unk|sep|cls|mask|decoded|itl|first|last|stop|special|added|profile|cache"
               r"|sort|prefix|metrics_by|by|per|answer|start|end|image|video|audio|think|boi|eoi|sampled)"
               r"[_\-](?:token|key)$")
SECRET_KEY = re.compile(
    r"^(?!(?:.*[_\-.])?" + _NOT_SECRET + ")"
    r"(?:.*[_\-.])?(?:api[_\-]?key|access[_\-]?key|secret[_\-]?key|private[_\-]?key|key|token|secret|password"
    r"|passwd|credentials?|authorization|bearer|cookies?)$",
    re.IGNORECASE,
)
# An environment variable named like a secret: HF_TOKEN, VLLM_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD.
SECRET_ENV_NAME = re.compile(r"(?:^|_)(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?|AUTH)(?:_|$)", re.IGNORECASE)
# Shorter values are not redacted by value: "1" or "true" would blank half a report. Such a value is
# still redacted by its key; a real credential is never this short.
MIN_SECRET_LEN = 6
# Shapes of secrets in free text: each pattern's ``value`` group is the secret; the rest (the flag,
# the header's name, the quotes) stays, so a reader still sees what was there. Why shapes and not
# only names: a secret arrives inside values too (a proxy URL, an error body quoting a header, a
# command line in a message), where no key names it. Every repeat is bounded or possessive, so a
# 100 MB log line is one linear scan (unbounded ``[\w\-]*`` before a word took 70 s on 40 KB).
_FRESH = r"(?!<redacted>)"  # redacting twice changes nothing
# A quote, bare or JSON-escaped up to three deep (an error body quoted in a log line quoted in an event:
# `\\\\\\\"` is a quote escaped three times).
_Q = r"\\{0,7}[\"']"
_QUOTE = f"(?:{_Q})?"  # a name or value in quotes, or in JSON-escaped quotes
# Between a flag or header and its value: blanks, a line break (continued with \ or not), the same
# break JSON- or repr-escaped (``\n``, ``\\\n``), so a value on the next line still goes.
_GAP = r"(?:[ \t]|\\{0,3}\r?\n|\\{1,3}[nrt]|\\{1,2}(?=[ \t\r\n]))"
_NETRC_TOKEN = r"(?:\"[^\"\r\n]{0,256}+\"|\S{1,256}+)"  # a netrc word, quoted (blanks and all) or not
# A name (of a flag, a key) ending in a secret word: the whole name is taken at once (possessive) and
# its end looked at, so a long run of name characters is read once, not once per start. The lookbehinds
# only find candidates; :func:`_text_names_secret` decides (a word, not a tokenizer word).
_ENDS_SECRET = "(?:" + "|".join(f"(?<={w})" for w in ("key", "token", "secret", "password", "passwd")) + ")"
_ENDS_SECRET_FLAG = _ENDS_SECRET[:-1] + "|(?<=credential)|(?<=credentials))"
# A value in quotes, to its closing quote (the same one, JSON-escaped or not; a backslash escapes the
# next character) or the end of the line: `password="correct horse battery staple"` goes whole.
_QUOTED = r"(?:(?!(?P=q))(?:\\[^\r\n]|[^\r\n])){%d,}+"
# The comma between a command's words printed as a list (`['--api-key', 'X']`, `[--api-key, X]`),
# one item a line too (pretty-printed, JSON-escaped or not)
_LISTED = r"[ \t]{0,16}+,(?:\s|\\{1,7}[nrt]){0,64}+"
# A command continued on the next line (its backslash and line break, raw or JSON-escaped once or
# twice) and the next line's indent: between a flag's values, and never one of them.
_CONTINUED = r"(?:\\\r?\n|\\{3}n|\\{7}n)[ \t]{0,64}+"
# A flag's bare value, not a shell operator (`| --api-key | Key |`, a Markdown table's cell): to a
# blank, a quote, a backtick or a continued line's backslash; a comma only
# inside it (`--api-key K1,K2` is one key to vLLM; `,--hf-token` is the next flag); after `=` it may
# start with a dash (`--api-key=-Xy3k`), after a blank that is the next flag.
_BARE_VALUE = r"(?:(?<==)-|[^\s'\",`\-\\\[|;&<>()])(?:[^\s'\",`\\]|,(?=[^\s'\",`\-])|\\(?!\r?\n|\\\\n|\\{6}n))*+"
_MANY_VALUES = frozenset({"--api-key", "--api_key"})  # vLLM's: a list of keys (nargs="+")
_MANY_FLAG = "(?:" + "|".join(map(re.escape, sorted(_MANY_VALUES))) + ")"  # in text, as the argv rule reads them
# The words after the first value of a flag that takes several (vLLM's --api-key): each after blanks,
# a continued line, a list's comma or a YAML list's dash; already gone (a known value), quoted (not
# a flag's) or bare, to a blank, quote, bracket, backslash or shell operator (`K2>/tmp/log`: K2
# goes), and not a redirect's descriptor (`2>&1`) nor a comment (`# ...`).
_WORD_SEP = r"(?:[ \t]{1,16}+(?:" + _CONTINUED + r")?|" + _CONTINUED + "|" + _LISTED + "|" + YAML_ITEM + ")"
_BARE_WORD = r"(?!\d++[<>])[^\s'\",`;|&<>(){}\[\]\\\-#](?:[^\s'\",`;|&<>(){}\[\]\\]|,(?=[^\s'\",`\-]))*+"
_MORE_WORDS = ("(?:" + _WORD_SEP + r"(?:<redacted>|(?:\\{0,7}\"(?![-\s,])[^\"'\r\n\\]++\\{0,7}\"|\\{0,7}'(?![-\s,])[^\"'\r\n\\]++\\{0,7}')(?![ \t]*+:)|"
               + _BARE_WORD + ")){1,64}+")
# One of those words, to replace (``a``: a quoted one's inside, ``c``: a bare one), or what stays:
# a continued line's break, a YAML item's dash, an escaped break, a word already gone.
_WORD = re.compile(r"(?P<sep>" + _CONTINUED + "|" + YAML_ITEM + r"|\\{1,7}[nrt]|<redacted>)"
                   r"|\\{0,7}(?P<q>[\"'])(?P<a>[^\"'\r\n\\]++)\\{0,7}(?P=q)|(?P<c>[^\s'\",`;|&<>(){}\[\]\\]++)")
# A YAML list's further items after a secret flag's value: each item's quoted inside, or the rest of
# its line, goes; its dash and quotes stay.
_YAML_VALUE = re.compile("(?P<sep>" + YAML_GAP + YAML_ITEM + r")(?:\\{0,7}(?P<q>[\"'])(?P<a>[^\"'\r\n\\]*+)\\{0,7}(?P=q)"
                         r"|(?P<c>(?:[^\r\n \t]|[ \t]++(?!#|[ \t]))++))")
# A YAML line's comment after its item (`- K1  # first key`)
_COMMENT = r"(?:[ \t]++#[^\r\n]*+)"


_SHAPES: tuple[re.Pattern[str], ...] = tuple(re.compile(p, re.IGNORECASE) for p in (
    # a private key block, which spans lines: -----BEGIN RSA PRIVATE KEY-----<redacted>-----END ...
    r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----(?P<value>(?:[^-]|-(?!-)){1,1048576}+)",
    # URL userinfo: scheme://user:PASSWORD@host, scheme://TOKEN@host (engine.url, HTTPS_PROXY, a model path)
    r"(?<![a-z0-9+.\-])[a-z][a-z0-9+.\-]{0,31}+://(?:(?P<user>[^\s/?#@:'\"<>\\]{0,256}):)?(?P<value>" + _FRESH
    + r"[^\s/?#'\"<>\\]{1,256})(?=@)",
    # an Authorization header, any scheme (Basic, Bearer, Digest, a bare key), also as a quoted dict key
    r"\b(?:proxy-)?authorization" + _QUOTE + r"\s{0,16}[:=]" + _GAP + "{0,16}+" + _QUOTE
    + r"(?>(?:[a-z][\w\-]{0,31}" + _GAP + r"{1,16}+)?)(?P<value>" + _FRESH + r"[^\s'\",\\]++)",
    # a cookie header, to the end of its line: Cookie: a=1; sid=X / Set-Cookie: sid=X; Path=/
    r"\b(?:set-)?cookie2?" + _QUOTE + r"[ \t]{0,16}[:=][ \t]{0,16}+" + _QUOTE
    + r"(?P<value>" + _FRESH + r"[^\r\n'\"\\]++)",
    # a flag whose name ends in a secret word, then its value: --api-key X, --hf-token=X, --api-key 'X Y',
    # --api-key="X", or the value on the next line of a continued (\) command, or the next item of
    # a command line printed as a list (['vllm', '--api-key', 'X'], a CalledProcessError's message)
    # or as a YAML list (`- --api-key` then `- X`, a Kubernetes manifest's args: every item up to
    # the next flag goes, vLLM's --api-key takes several). A flag starts a word: in `a 4096-token
    # prefix` the dash is a hyphen, not a flag. A value in brackets is a list (`--api-key ["X"]`), whose
    # items go when any would, as a named list's do.
    r"(?<![\w\-])(?:(?<=\[)(?P<inlist>))?(?P<name>--?[\w\-]{1,64}+)" + _ENDS_SECRET_FLAG + _QUOTE
    + r"(?:=|(?P<yaml>" + YAML_ITEM + ")|" + _GAP + r"{1,64}+|" + _LISTED + "(?=" + _Q + ")|(?(inlist)" + _LISTED + "|(?!)))"
    r"(?P<q>" + _Q + r")?(?(q)|`?)(?P<value>" + _FRESH + r"(?(q)" + _QUOTED % 1 + r"|(?:\[(?P<litems>" + _FRESH
    + r"(?:" + FLAG_LIST_ITEMS + r"){1,65536}+)|" + _BARE_VALUE + ")))"
    r"(?(yaml)(?:(?(q)(?P=q))" + _COMMENT + "?(?P<ymore>(?:" + YAML_GAP + YAML_ITEM + r"(?!-|" + _Q + r"-)[^\r\n]++){1,1024}+))?)",
    # vLLM's --api-key takes several keys (nargs="+"), so after its first value (gone by the shape
    # above) every further word of the command goes, up to the next flag, a shell operator, a quote
    # that ends the command or the line's end: `--api-key K1 K2 --port 8000`, `['--api-key', 'K1',
    # 'K2']`. A sentence that goes on after a literal key loses its words too (`pass --api-key K to
    # the server`): no rule tells its words from keys, and a key left in a log is the worse error.
    r"(?<![\w\-])" + _MANY_FLAG + _QUOTE + r"(?:=|" + YAML_ITEM + "|" + _GAP + r"{1,64}+|" + _LISTED + ")"
    r"(?P<q>" + _Q + r")?<redacted>(?(q)(?P=q)|(?:(?<==<redacted>)" + _Q + "(?=" + _LISTED + _Q + "|" + YAML_ITEM
    + "|[ \t]{1,16}+" + _Q + "))?)(?P<words>" + _MORE_WORDS + ")",
    # Bearer X anywhere (a header quoted in an error body, a curl line), the token on the next line too
    r"\bbearer" + _GAP + r"{1,16}+(?P<value>" + _FRESH + r"[^\s'\",\\]++)",
    # a query parameter named like a secret: ?key=X, &X-Amz-Signature=X, &sig=X, &access_token=X
    r"[?&;](?:[\w.\-]{0,64}[_.\-])?(?:api_?key|key|token|sig|signature|secret|password|passwd|pwd|credential"
    r"|auth|session(?:id)?|jwt|code)=(?P<value>" + _FRESH + r"[^\s&#'\"<>\\]++)",
    # name = value, "name": "value" with a secret name (api_key=X, AWS_SECRET_ACCESS_KEY=X, hf_token: X,
    # "password": "X Y"): a value of MIN_SECRET_LEN+ characters, in quotes (blanks and all) or
    # unquoted to a blank; or a list of values, in brackets (`"api_key": ["X", "Y"]`, one level of
    # nested lists, across lines when pretty-printed) or a YAML block (`api_key:` then `- X`, `- Y`),
    # which goes whole when any item would go alone. Unquoted, a value without a letter is a secret
    # only under a credential's name (`password=12345678`, `"api_key": 12345678`); under a token's,
    # it is a count (`token: 142`, `"token": [1, 2]`): see _redact_value.
    r"(?<![\w\-/])(?P<name>[\w\-]{1,128}+)" + _ENDS_SECRET + _QUOTE + r"\s{0,16}[:=]"
    + r"(?:[ \t]{0,16}+\[(?P<litems>" + _FRESH + r"(?:" + LIST_ITEMS + r"){1,65536}+)"
    + r"|[ \t]{0,16}+(?:#[^\r\n]{0,1024}+)?" + YAML_GAP + YAML_BLOCK_ITEM + r"(?P<bitems>" + _FRESH
    + r"[^\r\n]*+(?:" + YAML_GAP + YAML_BLOCK_ITEM + r"[^\r\n]*+){0,1024}+)"
    + r"|\s{0,16}(?!\[)(?P<q>" + _Q + r")?(?(q)|`?)(?P<value>" + _FRESH
    + r"(?(q)" + _QUOTED % MIN_SECRET_LEN + r"|(?P<bare>[^\s'\",}`\\]{%d,}+))))" % MIN_SECRET_LEN,
    # a netrc entry (~/.netrc, quoted in an error): `machine h login "a b" port 443 password X` (any
    # tokens between, quoted or not), or `default login me password "X Y"` (its keywords only:
    # "by default the password is" is prose), on one line or several
    r"\b(?:machine\s{1,64}+" + _NETRC_TOKEN + r"(?:\s{1,64}+(?!password\b)" + _NETRC_TOKEN + r"){0,8}+"
    r"|default(?:\s{1,64}+(?:login|account|macdef)\s{1,64}+" + _NETRC_TOKEN + r"){0,3}+)"
    r"\s{1,64}+password\s{1,64}+(?P<q>[\"'])?(?P<value>" + _FRESH + r"(?(q)[^\"'\r\n]++|[^\s`'\"]++))",
    # a token whose issuer's prefix says what it is, wherever it stands (a prompt, "my token: hf_..."):
    # Hugging Face, GitHub, GitLab, Slack, OpenAI/Anthropic. Case-sensitive prefixes and long bodies
    # of letters and digits only, so an identifier such as hf_hub_download is not one.
    r"(?-i:(?<![\w\-])(?P<value>" + _FRESH + r"(?:hf_[A-Za-z0-9]{30,}+|gh[pousr]_[A-Za-z0-9]{30,}+"
    r"|github_pat_[A-Za-z0-9_]{40,}+|glpat-[A-Za-z0-9_\-]{20,}+|xox[abprs]-[A-Za-z0-9\-]{10,}+"
    r"|sk-(?:proj-|ant-)?[A-Za-z0-9_\-]{32,}+)))",
))
_USERINFO = _SHAPES[1]
# A user's password on a command line: curl -u user:X, -uuser:X, --user=user:X, --proxy-user 'a b:X',
# and ['curl', '-u', 'user:X']; the user stays, or goes itself when the password is empty (a key
# sent as the user: `-u sk_live_X:`). Not a URL (pip install -U git+https://...), not uid:gid
# (docker run --user 1000:1000) and not a container tool's (docker exec -u root:root): see
# _UserFlags, which runs it with what it needs of the whole text.
_USER_FLAG = re.compile(
    r"(?<![\w\-])(?P<uflag>-[uU]|--user|--proxy-user)" + _QUOTE + r"(?:=|" + _GAP + r"{1,64}+|[ \t]{0,16}+,\s{0,16}+(?="
    + _Q + r")|(?<=u|U)(?=[^\s\-]))(?P<q>" + _Q + r")?(?P<user>(?(q)[^:\r\n'\"\\]{0,256}+"
    r"|[^\s:'\"\\`]{0,256}+)):(?(q)|`?)(?P<value>" + _FRESH + r"(?(q)[^\r\n'\"\\`]*+|[^\s'\"\\`]*+))", re.IGNORECASE)
# The commands whose -u/--user is a user (and group), no password (a container tool and its
# subcommand), and curl, whose is one, each where a command stands (not in a URL, a path or a
# word): the nearest of them before a user flag on its line decides (docker exec c curl -u bob:X
# is curl's; curl https://registry.docker.io -u bob:X too).
_CONTAINER_TOOLS = ("docker", "podman", "nerdctl")
_CONTAINER_COMMANDS = ("run", "exec", "create", "container", "compose", "service", "start")
_USER_TOOLS = re.compile(r"(?:(?<![\w./:@=\-])|(?<=\\[nrt]))(?:curl(?![\w./:@=\-])|(?:" + "|".join(_CONTAINER_TOOLS)
                         + r")[\"']?,?[ \t]{1,16}+[\"']?(?:" + "|".join(_CONTAINER_COMMANDS) + r")\b)", re.IGNORECASE)
_LINE_BREAK = re.compile(r"\n|\\n")  # a line's end, or a JSON-escaped one
_UID_GID = re.compile(r"\d+:\d+")
# A shell's variable or substitution ($PASSWORD, ${PW}, $(id -g)): the secret is elsewhere
_SHELL_VALUE = re.compile(r"\$(?:[({]|[A-Z_][A-Z0-9_]*$)")


def _not_a_password(user: str, password: str) -> bool:
    """What follows a user flag's colon that is no password: a path or a URL's // (rsync -u
    bob@host:/path, pip install -U git+https://...), a shell's variable, a uid:gid or a user:group
    of one name (docker --user 1000:1000, gunicorn -u vllm:vllm), date's +%H:%M."""
    return (password.startswith(("/", "~")) or bool(_SHELL_VALUE.match(password)) or password == user
            or bool(_UID_GID.fullmatch(f"{user}:{password}")) or user.startswith(("+", "%")))
_NOT_SECRET_NAME = re.compile(r"(?:^|[_\-.])" + _NOT_SECRET, re.IGNORECASE)  # `--eos-token X` is a tokenizer word
# The secret word a name in text ends in: ``key`` only as a word after another (`MY_KEY`, `apiKey`,
# not `monkey` nor a bare `key`, which names a figure in day0's own text); the others also glued on
# (`PGPASSWORD`, `authtoken`), where nothing ordinary ends in them.
_CREDENTIAL_END = (r"(?:(?:api|access|secret|private|account|storage|client|signing|encryption"
                   r"|master|auth|session|subscription|ssh|license|service|shared)[_\-]?key"
                   r"|secret|password|passwd|credentials?)$")
_SECRET_NAME_END = re.compile(_CREDENTIAL_END + "|token$", re.IGNORECASE)
# A name whose value is a secret even when it is all digits (`password=12345678`); a token's or a
# variable's `_KEY` may be a count or an index (`token: 142`), so those want a letter.
_DIGITS_SECRET_NAME = re.compile(_CREDENTIAL_END, re.IGNORECASE)
_ENV_KEY = re.compile(r"[A-Z0-9]_KEY$")  # MY_KEY, STORAGE_KEY: a variable's name, whatever its first words
# Between the characters of a known value in text: a line break (a wrapped line, a continued command).
_WRAP = r"(?:\\?\r?\n[ \t]{0,64})?"
_MAX_WRAPPED = 256  # longer known values (a key file) are matched whole and line by line, not wrapped
# Keys whose list of strings is a command line: read as one (Redactor.argv), so `--hf-token` then
# `hf_...` as two elements loses the second.
COMMAND_LINE_KEYS = frozenset({"argv", "cmd", "command", "cmdline", "command_line"})


_CAMEL_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def is_secret_key(key: object) -> bool:
    """By its name, snake or camel case: ``accessToken`` and ``clientSecret`` are read as
    ``access_Token`` and ``client_Secret`` (a site stage's settings are free-form), ``eosToken``
    stays a tokenizer word."""
    name = str(key)
    return bool(SECRET_KEY.match(name) or SECRET_KEY.match(_CAMEL_HUMP.sub("_", name)))


def is_secret_env_name(name: str) -> bool:
    return bool(SECRET_ENV_NAME.search(name))


@dataclass(frozen=True)
class Redactor:
    """Everything known to be secret in one run; call it on any JSON-like value or string."""

    values: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        # Every form a known value takes in text: itself, JSON- or repr-escaped, and each line of a
        # multi-line one (an engine log is scrubbed line by line, so the whole never meets one line).
        object.__setattr__(self, "values", frozenset(_forms(self.values)))

    @cached_property
    def _longest_first(self) -> tuple[str, ...]:
        return tuple(sorted(self.values, key=len, reverse=True))

    @cached_property
    def _wrapped(self) -> re.Pattern[str] | None:
        """The known values with a line break allowed between any two characters: a secret that a
        log or a message wrapped still goes. Compiled once per redactor; used only on text with an
        inner line break, so a one-line string costs nothing more."""
        alts = [_WRAP.join(map(re.escape, v)) for v in self._longest_first if len(v) <= _MAX_WRAPPED and "\n" not in v]
        return re.compile("|".join(alts)) if alts else None

    @classmethod
    def from_sources(cls, *, environ: Mapping[str, str] | None = None, env_names: Iterable[str] = (),
                     data: Any = None) -> "Redactor":
        """Secrets named by ``env_names`` (e.g. ``engine.api_key_env``), every variable of ``environ``
        named like a secret, every value under a secret key in ``data`` (the raw profile), and the
        password of every URL in a variable or a profile value (``HTTPS_PROXY``, ``engine.url``), so
        it goes wherever it is quoted, not only inside its URL."""
        environ = os.environ if environ is None else environ
        found: set[str] = set()
        for name in env_names:
            if name and environ.get(name):
                found.add(environ[name])
        found.update(v for k, v in environ.items() if is_secret_env_name(k) and v)
        found.update(_values_under_secret_keys(data))
        found.update(_url_passwords([*environ.values(), *_strings(data)]))
        return cls(frozenset(found))

    def with_values(self, values: Iterable[str]) -> "Redactor":
        return Redactor(self.values | {v for v in values if v})

    def __call__(self, data: Any) -> Any:
        if isinstance(data, dict):
            return self._keyed({k: (REDACTED if is_secret_key(k) and _is_scalar_secret(v, k)
                                    else _blanked(v) if _is_credential_table(k, v)
                                    else self.argv(v) if _is_command_line(k, v) else self(v))
                                for k, v in data.items()})
        if isinstance(data, (list, tuple)):
            return [self(v) for v in data]
        if isinstance(data, str):
            return self.text(data)
        return data

    def strings(self, data: Any) -> Any:
        """Every string through :meth:`text` (known values, secret shapes), no field blanked for
        its name: for day0's own declarations, where ``key`` names a figure, not a credential."""
        if isinstance(data, dict):
            return self._keyed({k: self.strings(v) for k, v in data.items()})
        if isinstance(data, (list, tuple)):
            return [self.strings(v) for v in data]
        return self.text(data) if isinstance(data, str) else data

    def _keyed(self, data: dict[Any, Any]) -> dict[Any, Any]:
        """``data`` with its keys through :meth:`text`: a key is free text too (a table keyed by
        the header lines or the command lines it saw). Two keys that redact alike both stay, the
        later one numbered, so no entry is lost."""
        out: dict[Any, Any] = {}
        last: dict[Any, int] = {}
        for k, v in data.items():
            key = redacted = self.text(k) if isinstance(k, str) else k
            if key in out:
                n = last.get(redacted, 1)
                while key in out:
                    n += 1
                    key = f"{redacted} ({n})"
                last[redacted] = n
            out[key] = v
        return out

    def text(self, text: str) -> str:
        """Known values, then secret shapes, replaced; linear in ``len(text)``."""
        for value in self._longest_first:  # longest first: a secret that contains another goes whole
            if value in text:
                text = text.replace(value, REDACTED)
        if self._wrapped is not None and "\n" in text.rstrip("\r\n"):
            text = self._wrapped.sub(REDACTED, text)
        for pattern in _SHAPES:
            text = pattern.sub(_redact_value, text)
        return _USER_FLAG.sub(_UserFlags(), text) if "-" in text else text

    def argv(self, argv: Iterable[str]) -> list[str]:
        """A command line for a log: the value after a secret flag goes (every word up to the next
        flag after ``--api-key``, which vLLM takes several of), as does any known value, and the
        password of a user flag's ``user:password`` (``curl -u bob:X``, ``-ubob:X``), but a
        container tool's (``docker run -u 1000:1000``)."""
        out: list[str] = []
        hiding: str | None = None  # the flag whose value the next word is
        taken = 0  # of its values so far
        words = list(argv)
        tools = False  # the last command named was a container tool's: its -u is a user, no password
        for i, arg in enumerate(words):
            command = arg.rsplit("/", 1)[-1].lower() if "://" not in arg else ""
            if command == "curl" or (command in _CONTAINER_TOOLS and words[i + 1:i + 2] in (
                    [c] for c in _CONTAINER_COMMANDS)):
                tools = command != "curl"
            # a secret flag's first word is its value whatever it looks like; a user flag's, and
            # --api-key's further ones, only if no flag
            if hiding is not None and (not arg.startswith("-") or (taken == 0 and hiding not in _USER_FLAGS)):
                out.append(self.text(_hidden(hiding, arg)))
                taken += 1
                hiding = hiding if hiding in _MANY_VALUES else None
                continue
            hiding, taken = None, 0
            flag, eq, value = arg.partition("=")
            if flag in _USER_FLAGS and tools:
                out.append(self.text(arg))
            elif flag.startswith("-") and (is_secret_key(flag.lstrip("-")) or flag in _USER_FLAGS):
                out.append(self.text(f"{flag}={_hidden(flag, value)}") if eq else arg)
                hiding, taken = flag, 1 if eq else 0
                if eq and flag not in _MANY_VALUES:
                    hiding = None
            elif arg[:2] in ("-u", "-U") and not arg.startswith("--") and ":" in arg and not tools:
                out.append(self.text(arg[:2] + _hidden("-u", arg[2:])))  # -ubob:X, glued as curl takes it
            else:
                out.append(self.text(arg))
        return out


_USER_FLAGS = frozenset({"-u", "-U", "--user", "--proxy-user"})  # curl's: user:password


def _hidden(flag: str, value: str) -> str:
    """A secret flag's value, gone; a user flag's keeps its user (``bob:<redacted>``), or loses the
    user when the password is empty (a key sent as the user); a URL or a uid:gid is no password."""
    if flag in _USER_FLAGS:
        user, colon, password = value.partition(":")
        if not colon or _not_a_password(user, password):
            return value
        return f"{user}:{REDACTED}" if password else f"{REDACTED}:"
    return REDACTED


class _UserFlags:
    """:data:`_USER_FLAG`'s replacement, for one text: the places of the commands that decide
    (:data:`_USER_TOOLS`) and the line starts are found once, at the text's first user flag, and
    bisected per match, so a line of a million ``-u a:`` costs one scan, not one scan back to its
    start per flag, and a text without a user flag (nearly every one) costs no scan at all."""

    def __init__(self) -> None:
        self.tools: list[int] | None = None
        self.container: list[bool] = []
        self.lines: list[int] = []

    def __call__(self, m: re.Match[str]) -> str:
        user, value = m.group("user"), m.group("value")
        if _not_a_password(user, value) or self._after_tool(m.string, m.start()):
            return m.group()
        if not value:  # -u KEY: (an empty password): the user is the secret
            return _replaced(m, "user") if len(user) >= MIN_SECRET_LEN else m.group()
        return _replaced(m, "value")

    def _after_tool(self, text: str, at: int) -> bool:
        """Whether the nearest deciding command before ``at`` on its line is a container tool."""
        if self.tools is None:
            found = [(t.start(), not t.group().lower().startswith("curl")) for t in _USER_TOOLS.finditer(text)]
            self.tools = [pos for pos, _ in found]
            self.container = [is_container for _, is_container in found]
            self.lines = [b.start() for b in _LINE_BREAK.finditer(text)] if found else []
        i = bisect.bisect_left(self.tools, at) - 1
        if i < 0 or not self.container[i]:
            return False
        line = bisect.bisect_left(self.lines, at) - 1
        return self.tools[i] > (self.lines[line] if line >= 0 else -1)


def _redact_value(m: re.Match[str]) -> str:
    """The match with its secret replaced (its ``value``, or a list's items): the flag, header name
    and quotes stay. The patterns find candidates; what only reads as a secret in context is decided
    here: a name that is no secret's, a bare value without a letter, a list none of whose items is a
    secret."""
    groups = m.groupdict()
    if groups.get("words") is not None:
        return _each_word_hidden(m)
    name = groups.get("name")
    if name is not None and (not _text_names_secret(name) or _prose(m)):
        return m.group()
    if (groups.get("bare") == "expected" and _DIAGNOSIS.match(m.string, m.start("bare"))
            and m.string[m.start():m.start("bare")].rstrip().endswith(":")):  # day0's `KEY: problem`, not `K=v`
        return m.group()
    digits_ok = bool(_DIGITS_SECRET_NAME.search(_CAMEL_HUMP.sub("_", name or "")))
    if groups.get("bare") is not None and not LETTER.search(groups["bare"]) and not digits_ok:
        return m.group()
    for group in ("litems", "bitems"):
        if groups.get(group) is not None:
            flag = name is not None and name.startswith("-")  # a flag's value goes whatever it looks like
            if not flag and not has_secret_item(groups[group], yaml=group == "bitems", digits_ok=digits_ok,
                                                min_len=MIN_SECRET_LEN):
                return m.group()
            return _replaced(m, group)
    if groups.get("ymore") is not None:  # a YAML list of args: the flag's next items go, item by item
        (start, end), (more, last) = m.span("value"), m.span("ymore")
        return (f"{m.string[m.start():start]}{REDACTED}{m.string[end:more]}"
                f"{_YAML_VALUE.sub(_hidden_word, m.string[more:last])}{m.string[last:m.end()]}")
    return _replaced(m, "value")


def _each_word_hidden(m: re.Match[str]) -> str:
    """``--api-key``'s further values, each replaced where it stands (quotes and blanks kept); one
    already gone stays as it is, so a second pass changes nothing."""
    start, end = m.span("words")
    return m.string[m.start():start] + _WORD.sub(_hidden_word, m.string[start:end]) + m.string[end:m.end()]


def _hidden_word(w: re.Match[str]) -> str:
    """One word of :data:`_WORD` or item of :data:`_YAML_VALUE`: its quoted inside or its bare text
    replaced, its separator kept."""
    group = "a" if w.group("a") else "c" if w.group("c") else ""
    return w.group() if not group or w.group(group) == REDACTED else _replaced(w, group)


def _replaced(m: re.Match[str], group: str) -> str:
    start, end = m.span(group)
    return f"{m.string[m.start():start]}{REDACTED}{m.string[end:m.end()]}"


# A bare "token" after a word and a space is prose, not a name: "KV bytes per token: config.json x TP",
# "time per output token: 12 ms". A named one (hf_token, "token": at a line's start) still goes.
_PROSE_TOKEN = re.compile(r"\w[ \t]token$", re.IGNORECASE)
# day0's own checks say `engine.env.HF_TOKEN: expected a string, got 3`: under a secret's name that
# word, followed by more words, is the message, not the value.
_DIAGNOSIS = re.compile(r"expected[ \t]{1,16}+[a-z]")


def _prose(m: re.Match[str]) -> bool:
    start, end = m.span("name")
    return bool(_PROSE_TOKEN.search(m.string, max(0, start - 2), end))


def _text_names_secret(name: str) -> bool:
    """A flag or key name in text that a value follows: is the value a secret? `max_tokens`,
    `tokenizer` or `num_kv_heads` never reach here (the patterns want the name to end in a secret
    word); this tells `api_key` and `hfToken` from `eos_token` and `monkey`."""
    words = _CAMEL_HUMP.sub("_", name.lstrip("-"))  # accessToken -> access_Token, as is_secret_key reads it
    return bool(_SECRET_NAME_END.search(words) or _ENV_KEY.search(name.lstrip('-'))) and not _NOT_SECRET_NAME.search(words)


def _forms(values: Iterable[str]) -> Iterator[str]:
    for v in values:
        if len(v) < MIN_SECRET_LEN:
            continue
        yield v
        yield from {json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=False)[1:-1], repr(v)[1:-1]} - {v}
        if "\n" in v or "\r" in v:
            yield from (line.strip() for line in v.splitlines() if len(line.strip()) >= MIN_SECRET_LEN)


def _url_passwords(texts: Iterable[str]) -> Iterator[str]:
    """``PW`` of every ``scheme://user:PW@host`` (a user alone is not a secret worth blanking everywhere)."""
    for text in texts:
        if "://" in text:
            yield from (m.group("value") for m in _USERINFO.finditer(text) if m.group("user") is not None)


def _strings(data: Any) -> Iterator[str]:
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for v in data.values():
            yield from _strings(v)
    elif isinstance(data, (list, tuple)):
        for v in data:
            yield from _strings(v)


def _is_command_line(key: Any, value: Any) -> bool:
    """A list of strings under a key that names a command line (``environment.argv``, an evidence
    ``cmd``): a secret flag's value is its own element there, where no text shape can see the flag
    beside it, so it goes by position (:meth:`Redactor.argv`)."""
    return (str(key).lower() in COMMAND_LINE_KEYS and isinstance(value, (list, tuple))
            and all(isinstance(a, str) for a in value))


def _names_ids(key: Any) -> bool:
    """A bare ``token`` or ``key``: what it holds is a token id or an index (or a table of them)."""
    return str(key).lower() in ("token", "key")


def _is_scalar_secret(v: Any, key: Any = "") -> bool:
    """A value a credential is: a string, a number, or a list of them (vLLM's ``api_key`` takes
    several; an all-digit key read from TOML is a number, and endpoint.api_key still sends it). Only
    under a bare ``token`` or ``key`` is a number not one: a token id, an index."""
    scalar = (str, int, float)
    numbers_are_ids = _names_ids(key)

    def one(x: Any) -> bool:
        return isinstance(x, str) or (isinstance(x, scalar) and not isinstance(x, bool) and not numbers_are_ids)

    return one(v) or (isinstance(v, list) and bool(v) and all(one(x) for x in v))


def _is_credential_table(key: Any, value: Any) -> bool:
    """A table under a credential's name (``credentials = {user = ..., pass = ...}``): every leaf of
    it is the credential's, whatever the inner keys are called. Not under a bare ``token`` or ``key``,
    where a table is a mapping of ids."""
    return isinstance(value, dict) and is_secret_key(key) and not _names_ids(key)


def _blanked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _blanked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blanked(v) for v in value]
    return REDACTED if isinstance(value, (str, int, float)) and not isinstance(value, bool) else value


def _leaves(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield str(value)


def _values_under_secret_keys(data: Any) -> Iterable[str]:
    if isinstance(data, dict):
        for k, v in data.items():
            if _is_credential_table(k, v):
                yield from _leaves(v)
            elif is_secret_key(k) and _is_scalar_secret(v, k):
                yield from (str(x) for x in ([v] if not isinstance(v, list) else v))
            else:
                yield from _values_under_secret_keys(v)
    elif isinstance(data, list):
        for v in data:
            yield from _values_under_secret_keys(v)
