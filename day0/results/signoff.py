"""Sign-off: embed run.json in the report, sign the report with Ed25519, verify it later.

What a signature covers: the whole HTML document with the signatures region emptied (so the
visible tables, the embedded run record and the sign-off block are all covered, and several
people can append signatures without invalidating each other), plus the run record's SHA-256
and the signer's name, role and time. ``verify`` also re-hashes the embedded run record
against the sign-off block, so an edited record is named as such rather than as "bad
signature". Private keys are only ever read from their PEM file; nothing here writes them
anywhere but ``keygen``'s own file (mode 0600).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import json
import os
import re
import stat
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from day0.core.record import utcnow

FORMAT = "day0-signoff/1"
SIG_CONTEXT = b"day0-signoff/1\n"  # domain separation: these bytes are never a valid signed message elsewhere
BEGIN = "<!--day0-signatures:begin-->"
END = "<!--day0-signatures:end-->"
RUN_ID = "day0-run"
SIGNOFF_ID = "day0-signoff"
SIGS_ID = "day0-signatures-data"
PASSPHRASE_ENV = "DAY0_SIGNING_KEY_PASSPHRASE"
EMBED_TEXT_MAX = 1 << 20  # larger records are embedded gzip+base64 (run.json's indentation compresses ~5x)
DECODE_MAX = 1 << 30  # a forged report cannot make verify inflate more than this

_RUN_RE = re.compile(
    r'<script type="application/json" id="day0-run" data-encoding="([a-z0-9+]+)">(.*?)</script>', re.S
)
_SIGNOFF_RE = re.compile(r'<script type="application/json" id="day0-signoff">(.*?)</script>', re.S)
_SIGS_RE = re.compile(r'<script type="application/json" id="day0-signatures-data">(.*?)</script>', re.S)
ENTRY_FIELDS = ("algorithm", "document_sha256", "key_id", "role", "run_sha256", "signed_at", "signer", "signature")


class SignoffError(ValueError):
    """A report, key or signer that cannot be used; the message names the file and the reason."""


@dataclass(frozen=True)
class Signatory:
    """A person expected to sign (from options or the profile's ``[report] signatories``)."""

    name: str
    role: str

    @classmethod
    def parse(cls, text: str) -> Signatory:
        """``"Name, Role"``: the name is everything before the first comma."""
        name, sep, role = str(text).partition(",")
        name, role = " ".join(name.split()), " ".join(role.split())
        if not sep or not name or not role:
            raise SignoffError(f'signer {text!r}: expected "Name, Role" (a name, a comma, a role)')
        return cls(name, role)

    @classmethod
    def coerce(cls, item: Any, where: str = "signatory") -> Signatory:
        """From a Signatory, a ``"Name, Role"`` string or a ``{name, role}`` table (TOML profile)."""
        if isinstance(item, Signatory):
            return item
        if isinstance(item, str):
            try:
                return cls.parse(item)
            except SignoffError as exc:
                raise SignoffError(f"{where}: {exc}") from None
        if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("role"), str):
            if item["name"].strip() and item["role"].strip():
                return cls(" ".join(item["name"].split()), " ".join(item["role"].split()))
        raise SignoffError(f'{where}: expected "Name, Role" or {{name = "...", role = "..."}}, got {item!r}')

    def __str__(self) -> str:
        return f"{self.name}, {self.role}"


# --------------------------------------------------------------------------- embedding


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_run(data: bytes, text_max: int = EMBED_TEXT_MAX) -> tuple[str, str]:
    """(encoding, payload) to place inside a <script> element, reversible byte for byte.

    JSON text keeps run.json readable in the page source; '<' (only legal inside JSON strings)
    becomes \\u003c so no '</script' can end the element early. Where that would not round-trip
    (the record already holds a literal \\u003c, or is not UTF-8) base64 is used instead, and
    records over ``text_max`` bytes are gzip-compressed first to keep the report small.
    """
    if len(data) > text_max:
        packed = gzip.compress(data, compresslevel=1, mtime=0)  # speed over ~15% size: far under 5 MB
        return "gzip+base64", base64.b64encode(packed).decode("ascii")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\\u003c" not in text:
        payload = text.replace("<", "\\u003c")
        if decode_run("json", payload) == data:
            return "json", payload
    return "base64", base64.b64encode(data).decode("ascii")


def decode_run(encoding: str, payload: str) -> bytes:
    if encoding == "json":
        return payload.replace("\\u003c", "<").encode("utf-8")
    if encoding in ("base64", "gzip+base64"):
        try:
            raw = base64.b64decode(payload.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise SignoffError(f"embedded run record: bad base64 ({exc})") from None
        if encoding == "base64":
            return raw
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(raw, DECODE_MAX)
        except zlib.error as exc:
            raise SignoffError(f"embedded run record: bad gzip data ({exc})") from None
        if inflater.unconsumed_tail:
            raise SignoffError(f"embedded run record: inflates beyond {DECODE_MAX} bytes")
        if not inflater.eof:
            raise SignoffError("embedded run record: gzip data is truncated")
        return out
    raise SignoffError(f"embedded run record: unknown encoding {encoding!r}")


def _script_json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, sort_keys=True, indent=1).replace("<", "\\u003c")


def signoff_block(record: Any, run_bytes: bytes, signatories: Sequence[Signatory]) -> dict[str, Any]:
    """What the signers attest to, besides the document itself."""
    return {
        "format": FORMAT,
        "run_id": record.run_id,
        "run_sha256": sha256_hex(run_bytes),
        "run_bytes": len(run_bytes),
        "verdict": record.verdict,
        "reason": record.reason,
        "signatories": [{"name": s.name, "role": s.role} for s in signatories],
        "rendered_at": utcnow(),
    }


def embedded_blocks(run_bytes: bytes, signoff: dict[str, Any]) -> str:
    """The two machine-readable blocks every report carries (the templates place them once)."""
    enc, payload = encode_run(run_bytes)
    return (
        f'<script type="application/json" id="{SIGNOFF_ID}">{_script_json(signoff)}</script>\n'
        f'<script type="application/json" id="{RUN_ID}" data-encoding="{enc}">{payload}</script>'
    )


def signatures_region(entries: Sequence[dict[str, Any]]) -> str:
    """The only part of a report that signing changes; canonical, so verify can re-create it."""
    if entries:
        rows = "".join(
            "<tr>"
            f"<td>{escape(str(e.get('signer', '')))}</td><td>{escape(str(e.get('role', '')))}</td>"
            f"<td>{escape(str(e.get('signed_at', '')))}</td><td><code>{escape(str(e.get('key_id', '')))}</code></td>"
            f"<td><code>{escape(str(e.get('signature', ''))[:24])}…</code></td>"
            "</tr>"
            for e in entries
        )
        body = (
            '<table class="signatures-table"><thead><tr><th>Signer</th><th>Role</th><th>Signed at (UTC)</th>'
            f"<th>Key</th><th>Ed25519 signature</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    else:
        body = (
            '<p class="unsigned">Not signed yet. Sign with <code>day0 sign report.html --key KEY.pem '
            "--signer &quot;Name, Role&quot;</code>.</p>"
        )
    data = f'<script type="application/json" id="{SIGS_ID}">{_script_json(list(entries))}</script>'
    return f'{BEGIN}<div id="day0-signatures" class="signatures">{body}{data}</div>{END}'


# --------------------------------------------------------------------------- parsing a report


@dataclass
class ParsedReport:
    path: Path
    html: str
    run_bytes: bytes
    run_encoding: str
    signoff: dict[str, Any]
    entries: list[dict[str, Any]]
    region: tuple[int, int]  # [start, end) of the signatures region, markers included

    @property
    def document_sha256(self) -> str:
        """Digest of the document with the signatures region emptied: what each signature covers."""
        a, b = self.region
        body = self.html[:a] + signatures_region([]) + self.html[b:]
        return sha256_hex(body.encode("utf-8"))

    def with_entries(self, entries: Sequence[dict[str, Any]]) -> str:
        a, b = self.region
        return self.html[:a] + signatures_region(entries) + self.html[b:]


def _one(pattern: re.Pattern[str], html: str, what: str, path: Path) -> re.Match[str]:
    found = list(pattern.finditer(html))
    if len(found) != 1:
        raise SignoffError(f"{path}: expected one {what}, found {len(found)}; not an intact day0 report")
    return found[0]


def parse_report(path: Path, html: str | None = None) -> ParsedReport:
    """Find the run record, sign-off block and signatures in a report; bad structure is an error."""
    path = Path(path)
    if html is None:
        try:
            html = path.read_bytes().decode("utf-8")
        except FileNotFoundError:
            raise SignoffError(f"{path}: report not found") from None
        except UnicodeDecodeError as exc:
            raise SignoffError(f"{path}: not UTF-8 at byte {exc.start}; not an intact day0 report") from None
    if html.count(BEGIN) != 1 or html.count(END) != 1:
        raise SignoffError(f"{path}: expected one signatures region, found {html.count(BEGIN)}; not an intact day0 report")
    a = html.index(BEGIN)
    b = html.index(END) + len(END)
    if b < a:
        raise SignoffError(f"{path}: signatures region markers out of order")
    run_m = _one(_RUN_RE, html, "embedded run record (id=day0-run)", path)
    so_m = _one(_SIGNOFF_RE, html, "sign-off block (id=day0-signoff)", path)
    for m, what in ((run_m, "run record"), (so_m, "sign-off block")):
        if a <= m.start() < b:
            raise SignoffError(f"{path}: the {what} sits inside the signatures region")
    region = html[a:b]
    sigs_m = _one(_SIGS_RE, region, "signature list (id=day0-signatures-data)", path)
    try:
        signoff = json.loads(so_m.group(1))
        entries = json.loads(sigs_m.group(1))
    except json.JSONDecodeError as exc:
        raise SignoffError(f"{path}: sign-off or signature block is not JSON ({exc.msg})") from None
    if not isinstance(signoff, dict) or signoff.get("format") != FORMAT:
        raise SignoffError(f"{path}: sign-off block format is not {FORMAT}")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SignoffError(f"{path}: signature list is not a list of objects")
    run_bytes = decode_run(run_m.group(1), run_m.group(2))
    return ParsedReport(path, html, run_bytes, run_m.group(1), signoff, entries, (a, b))


# --------------------------------------------------------------------------- keys


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + sha256_hex(raw)[:16]


def keygen(directory: Path, name: str = "day0_ed25519") -> tuple[Path, Path]:
    """Write ``name.pem`` (private, PKCS#8, mode 0600, created that way) and ``name.pub.pem``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    priv_path, pub_path = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    for p in (priv_path, pub_path):
        if p.exists():
            raise SignoffError(f"{p}: already exists; refusing to overwrite a key")
    key = Ed25519PrivateKey.generate()
    priv_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pub_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    fd = os.open(priv_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, priv_pem)
    finally:
        os.close(fd)
    pub_path.write_bytes(pub_pem)
    return priv_path, pub_path


def load_private_key(path: Path) -> Ed25519PrivateKey:
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise SignoffError(f"{path}: private key not found") from None
    if os.name == "posix" and st.st_mode & 0o077:
        raise SignoffError(
            f"{path}: private key is readable by others (mode {stat.S_IMODE(st.st_mode):04o}); run chmod 600 on it"
        )
    passphrase = os.environ.get(PASSPHRASE_ENV)
    try:
        key = serialization.load_pem_private_key(
            path.read_bytes(), password=passphrase.encode() if passphrase else None
        )
    except (ValueError, TypeError) as exc:
        raise SignoffError(f"{path}: not a usable PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SignoffError(f"{path}: not an Ed25519 private key ({type(key).__name__})")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    path = Path(path)
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except FileNotFoundError:
        raise SignoffError(f"{path}: public key not found") from None
    except ValueError as exc:
        raise SignoffError(f"{path}: not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SignoffError(f"{path}: not an Ed25519 public key ({type(key).__name__})")
    return key


# --------------------------------------------------------------------------- sign / verify


def signed_message(entry: dict[str, Any]) -> bytes:
    body = {k: entry[k] for k in ENTRY_FIELDS if k != "signature"}
    return SIG_CONTEXT + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def integrity_problems(rep: ParsedReport) -> list[str]:
    """Problems with the record/sign-off/region that no signature check is needed to see."""
    problems: list[str] = []
    digest = sha256_hex(rep.run_bytes)
    if digest != rep.signoff.get("run_sha256"):
        problems.append(
            f"embedded run record does not match its digest (sha256 {digest[:16]}…, sign-off says "
            f"{str(rep.signoff.get('run_sha256'))[:16]}…): the record was edited"
        )
    else:
        try:
            run = json.loads(rep.run_bytes)
        except json.JSONDecodeError as exc:
            run = None
            problems.append(f"embedded run record is not JSON ({exc.msg})")
        if isinstance(run, dict):
            for key in ("run_id", "verdict"):
                if run.get(key) != rep.signoff.get(key):
                    problems.append(
                        f"sign-off block says {key} {rep.signoff.get(key)!r} but the run record says {run.get(key)!r}"
                    )
    a, b = rep.region
    if rep.html[a:b] != signatures_region(rep.entries):
        problems.append("signatures region was edited outside its signature entries")
    return problems


def sign_report(report: Path, key_path: Path, signer: Signatory) -> dict[str, Any]:
    """Append one signature to the report in place (atomic replace); returns the entry."""
    key = load_private_key(key_path)
    rep = parse_report(report)
    problems = integrity_problems(rep)
    doc = rep.document_sha256
    for i, e in enumerate(rep.entries, 1):
        if e.get("document_sha256") != doc:
            problems.append(f"signature {i} ({e.get('signer')}) no longer matches the report")
    if problems:
        raise SignoffError(f"{report}: refusing to sign a report that changed: " + "; ".join(problems))
    kid = key_id(key.public_key())
    if any(e.get("key_id") == kid and e.get("signer") == signer.name for e in rep.entries):
        raise SignoffError(f"{report}: already signed by {signer.name} with key {kid}")
    entry: dict[str, Any] = {
        "algorithm": "Ed25519",
        "document_sha256": doc,
        "key_id": kid,
        "role": signer.role,
        "run_sha256": rep.signoff["run_sha256"],
        "signed_at": utcnow(),
        "signer": signer.name,
    }
    entry["signature"] = base64.b64encode(key.sign(signed_message(entry))).decode("ascii")
    html = rep.with_entries([*rep.entries, entry])
    tmp = Path(report).with_name(Path(report).name + ".signing")
    tmp.write_bytes(html.encode("utf-8"))
    os.chmod(tmp, stat.S_IMODE(Path(report).stat().st_mode))
    tmp.replace(report)
    return entry


@dataclass
class Verification:
    """Outcome of ``verify``: ok only with no problems; ``lines`` say what was checked."""

    ok: bool
    problems: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def verify_report(report: Path, pubkeys: Sequence[Path]) -> Verification:
    """Every signature must verify with one of ``pubkeys``, every key must have signed,
    and the embedded run record must match the signed digest."""
    if not pubkeys:
        raise SignoffError("verify needs at least one --pubkey")
    keys = {}
    for p in pubkeys:
        k = load_public_key(p)
        keys[key_id(k)] = (k, Path(p))
    rep = parse_report(report)
    problems = integrity_problems(rep)
    so = rep.signoff
    lines = [
        f"run {so.get('run_id')}: verdict {str(so.get('verdict', '')).upper()} ({so.get('reason', '')})",
        f"run.json sha256 {so.get('run_sha256')} ({so.get('run_bytes')} bytes)",
    ]
    if not rep.entries:
        problems.append("the report is not signed")
    doc = rep.document_sha256
    used: set[str] = set()
    for i, e in enumerate(rep.entries, 1):
        who = f"signature {i} ({e.get('signer')}, {e.get('role')})"
        missing = [f for f in ENTRY_FIELDS if not isinstance(e.get(f), str)]
        if missing:
            problems.append(f"{who}: missing fields {', '.join(missing)}")
            continue
        if e["document_sha256"] != doc:
            problems.append(f"{who}: the report changed after it was signed (document sha256 differs)")
            continue
        if e["run_sha256"] != so.get("run_sha256"):
            problems.append(f"{who}: signed a different run record digest")
            continue
        if e["key_id"] not in keys:
            problems.append(f"{who}: signed with key {e['key_id']}, which is not one of the given public keys")
            continue
        if e["algorithm"] != "Ed25519":
            problems.append(f"{who}: algorithm {e['algorithm']!r} is not Ed25519")
            continue
        key, kpath = keys[e["key_id"]]
        try:
            sig = base64.b64decode(e["signature"], validate=True)
            if base64.b64encode(sig).decode("ascii") != e["signature"]:
                raise ValueError("non-canonical base64")  # the signatures region is not in the document digest
            key.verify(sig, signed_message(e))
        except (InvalidSignature, binascii.Error, ValueError):
            problems.append(
                f"{who}: signature does not verify with {kpath} (signer, role, time or signature edited)"
            )
            continue
        used.add(e["key_id"])
        lines.append(f"{who}: ok, key {e['key_id']} ({kpath}), signed at {e['signed_at']}")
    for kid, (_, kpath) in keys.items():
        if kid not in used and not any(e.get("key_id") == kid for e in rep.entries):
            problems.append(f"no signature by the key in {kpath} ({kid})")
    signed_names = {(e.get("signer"), e.get("role")) for e in rep.entries}
    for s in so.get("signatories") or []:
        if isinstance(s, dict) and (s.get("name"), s.get("role")) not in signed_names:
            lines.append(f"awaiting signature: {s.get('name')}, {s.get('role')}")
    return Verification(ok=not problems, problems=problems, lines=lines)
