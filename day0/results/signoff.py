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

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from day0.core.inputs import InputError, open_regular, read_regular, strict_json, term_safe
from day0.core.names import is_component
from day0.core.outputs import write_file, write_new
from day0.core.record import MAX_RECORD_BYTES, RecordError, RunRecord, parse_record, utcnow
from day0.results.summary import verdict_line

FORMAT = "day0-signoff/1"
SIG_CONTEXT = b"day0-signoff/1\n"  # domain separation: these bytes are never a valid signed message elsewhere
BEGIN = "<!--day0-signatures:begin-->"
END = "<!--day0-signatures:end-->"
RUN_ID = "day0-run"
SIGNOFF_ID = "day0-signoff"
SIGS_ID = "day0-signatures-data"
PASSPHRASE_ENV = "DAY0_SIGNING_KEY_PASSPHRASE"
EMBED_TEXT_MAX = 1 << 20  # larger records are embedded gzip+base64 (run.json's indentation compresses ~5x)
DECODE_MAX = MAX_RECORD_BYTES  # a forged report cannot make verify inflate more than a record may hold
INFLATE_PIECE = 4 << 20  # inflated per step, so a bomb is stopped at the cap, not after it
MAX_REPORT_BYTES = MAX_RECORD_BYTES  # a record over 1 MiB is embedded gzip'd (~1/5), plus the page
MAX_KEY_BYTES = 64 << 10  # an Ed25519 PEM is ~120 bytes; an encrypted one a few hundred

_RUN_RE = re.compile(
    r'<script type="application/json" id="day0-run" data-encoding="([a-z0-9+]+)">(.*?)</script>', re.S
)
_SIGNOFF_RE = re.compile(r'<script type="application/json" id="day0-signoff">(.*?)</script>', re.S)
_SIGS_RE = re.compile(r'<script type="application/json" id="day0-signatures-data">(.*?)</script>', re.S)
ENTRY_FIELDS = ("algorithm", "document_sha256", "key_id", "role", "run_sha256", "signed_at", "signer", "signature")
# Signed when present: the verdict a signer signed despite (day0 sign --allow-rejected).
OPTIONAL_FIELDS = ("despite_verdict",)
_OPENINGS = {  # the fixed start of each embedded element, counted (linear) before any regex runs
    RUN_ID: f'<script type="application/json" id="{RUN_ID}"',
    SIGNOFF_ID: f'<script type="application/json" id="{SIGNOFF_ID}"',
    SIGS_ID: f'<script type="application/json" id="{SIGS_ID}"',
}


class SignoffError(InputError):
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
        return cls._printable(name, role, text)

    @classmethod
    def _printable(cls, name: str, role: str, text: Any) -> Signatory:
        """A name shown on a signed page and a terminal holds no control or bidi character."""
        if term_safe(name) != name or term_safe(role) != role:
            raise SignoffError(f"signer {text!r}: control or bidi-override characters are not allowed in a name")
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
                try:
                    return cls._printable(" ".join(item["name"].split()), " ".join(item["role"].split()), item)
                except SignoffError as exc:
                    raise SignoffError(f"{where}: {exc}") from None
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
        return raw if encoding == "base64" else _inflate(raw, DECODE_MAX)
    raise SignoffError(f"embedded run record: unknown encoding {encoding!r}")


def _inflate(raw: bytes, cap: int) -> bytes:
    """gzip data inflated a piece at a time, to at most ``cap`` bytes. Why in pieces: a forged
    report of under a megabyte can claim a gigabyte, and asking zlib for it at once fails (or the
    machine does) before the cap is ever compared; here the cap, or the memory running out, is
    one line."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out, data = bytearray(), raw
    try:
        while not inflater.eof:
            piece = inflater.decompress(data, min(INFLATE_PIECE, cap + 1 - len(out)))
            data = inflater.unconsumed_tail
            if not piece and not data:
                break  # the input ran out before the gzip stream ended
            out += piece
            if len(out) > cap:
                raise SignoffError(f"embedded run record: inflates beyond {cap} bytes")
        if not inflater.eof:
            raise SignoffError("embedded run record: gzip data is truncated")
        return bytes(out)
    except zlib.error as exc:
        raise SignoffError(f"embedded run record: bad gzip data ({exc})") from None
    except MemoryError:
        raise SignoffError(f"embedded run record: inflates beyond the memory available "
                           f"({len(out) >> 20} MiB inflated when it ran out)") from None


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
        ) + "".join(  # only entries that carry it: a page signed by an older day0 re-creates byte for byte
            '<p class="signed-despite"><strong>'
            f"{escape(str(e.get('signer', '')))}, {escape(str(e.get('role', '')))} signed despite verdict "
            f"{escape(str(e['despite_verdict']).upper())}</strong> (day0 sign --allow-rejected): this signature "
            "attests the page as it is, not an acceptance.</p>"
            for e in entries if "despite_verdict" in e
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


def _one(pattern: re.Pattern[str], html: str, element: str, what: str, path: Path) -> re.Match[str]:
    """The one element of its kind. Openings are counted first (str.count is linear), so a
    forged page of a million unclosed openings cannot make the lazy regex quadratic."""
    opened = html.count(_OPENINGS[element])
    found = list(pattern.finditer(html)) if opened == 1 else []
    if opened != 1 or len(found) != 1:
        raise SignoffError(f"{path}: expected one {what}, found {opened}; not an intact day0 report")
    return found[0]


def parse_report(path: Path, html: str | None = None) -> ParsedReport:
    """Find the run record, sign-off block and signatures in a report; bad structure is an error."""
    path = Path(path)
    if html is None:
        try:
            html = read_regular(path, "report", MAX_REPORT_BYTES, SignoffError).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SignoffError(f"{path}: not UTF-8 at byte {exc.start}; not an intact day0 report") from None
    if html.count(BEGIN) != 1 or html.count(END) != 1:
        raise SignoffError(f"{path}: expected one signatures region, found {html.count(BEGIN)}; not an intact day0 report")
    a = html.index(BEGIN)
    b = html.index(END) + len(END)
    if b < a:
        raise SignoffError(f"{path}: signatures region markers out of order")
    run_m = _one(_RUN_RE, html, RUN_ID, "embedded run record (id=day0-run)", path)
    so_m = _one(_SIGNOFF_RE, html, SIGNOFF_ID, "sign-off block (id=day0-signoff)", path)
    for m, what in ((run_m, "run record"), (so_m, "sign-off block")):
        if a <= m.start() < b:
            raise SignoffError(f"{path}: the {what} sits inside the signatures region")
    region = html[a:b]
    sigs_m = _one(_SIGS_RE, region, SIGS_ID, "signature list (id=day0-signatures-data)", path)
    signoff = strict_json(so_m.group(1), f"{path}: sign-off block (id={SIGNOFF_ID})", SignoffError)
    entries = strict_json(sigs_m.group(1), f"{path}: signature list (id={SIGS_ID})", SignoffError)
    if not isinstance(signoff, dict) or signoff.get("format") != FORMAT:
        raise SignoffError(f"{path}: sign-off block: format: expected {FORMAT!r}")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SignoffError(f"{path}: signature list: expected a list of objects")
    try:
        run_bytes = decode_run(run_m.group(1), run_m.group(2))
    except SignoffError as exc:  # name the report: a bad record inside it is the report's problem
        raise SignoffError(f"{path}: {exc}") from None
    return ParsedReport(path, html, run_bytes, run_m.group(1), signoff, entries, (a, b))


# --------------------------------------------------------------------------- keys


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + sha256_hex(raw)[:16]


def keygen(directory: Path, name: str = "day0_ed25519") -> tuple[Path, Path]:
    """Write ``name.pem`` (private, PKCS#8, mode 0600, created that way) and ``name.pub.pem``."""
    if not (is_component(name) and is_component(f"{name}.pub.pem")):  # the one rule for a name that is one file
        raise SignoffError(f"key name {name!r}: a file name, not a path (the keys go into {directory})")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    priv_path, pub_path = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    for p in (priv_path, pub_path):
        if os.path.lexists(p):  # a dangling link too: neither key is written when either name is taken
            raise SignoffError(f"{p}: already exists; refusing to overwrite a key")
    key = Ed25519PrivateKey.generate()
    priv_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pub_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # Claimed whole (mode 0600 from its first byte) or not at all: an existing key is never replaced.
    if write_new(directory, [priv_path.name], priv_pem, mode=0o600, error=SignoffError) is None:
        raise SignoffError(f"{priv_path}: already exists; refusing to overwrite a key")
    if write_new(directory, [pub_path.name], pub_pem, error=SignoffError) is None:
        raise SignoffError(f"{pub_path}: already exists; refusing to overwrite a key")
    return priv_path, pub_path


def _short(exc: Exception) -> str:
    """cryptography's reason, first sentence only (its messages run to links and paragraphs)."""
    text = " ".join(str(exc).split())
    return text.split(". ")[0][:160] or type(exc).__name__


def load_private_key(path: Path) -> Ed25519PrivateKey:
    path = Path(path)
    fh, st = open_regular(path, "private key", SignoffError)
    with fh:
        if os.name == "posix" and st.st_mode & 0o077:
            raise SignoffError(
                f"{path}: private key is readable by others (mode {stat.S_IMODE(st.st_mode):04o}); run chmod 600 on it"
            )
        data = fh.read(MAX_KEY_BYTES + 1)
    if len(data) > MAX_KEY_BYTES:
        raise SignoffError(f"{path}: over {MAX_KEY_BYTES >> 10} KiB; not a PEM private key")
    passphrase = os.environ.get(PASSPHRASE_ENV)
    try:
        key = serialization.load_pem_private_key(data, password=passphrase.encode() if passphrase else None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:  # a curve or algorithm cryptography lacks
        raise SignoffError(f"{path}: not a usable PEM private key ({_short(exc)})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SignoffError(f"{path}: not an Ed25519 private key ({type(key).__name__})")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    path = Path(path)
    data = read_regular(path, "public key", MAX_KEY_BYTES, SignoffError)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise SignoffError(f"{path}: not a PEM public key ({_short(exc)})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SignoffError(f"{path}: not an Ed25519 public key ({type(key).__name__})")
    return key


# --------------------------------------------------------------------------- sign / verify


def signed_message(entry: dict[str, Any]) -> bytes:
    body = {k: entry[k] for k in ENTRY_FIELDS if k != "signature"}
    body.update({k: entry[k] for k in OPTIONAL_FIELDS if k in entry})
    return SIG_CONTEXT + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def embedded_record(rep: ParsedReport) -> RunRecord:
    """The embedded run.json as a validated record (the same checks ``day0 report`` made)."""
    return parse_record(rep.run_bytes, f"{rep.path}: embedded run record")


def _verdict_line(rep: ParsedReport, verdict: str) -> str:
    """The attested verdict with what it did not verify ("ACCEPTED, 7 checks not verified"), read
    from the embedded record; a record that does not parse shows the bare verdict (its problem is
    reported by the integrity check)."""
    try:
        rec = embedded_record(rep)
    except (RecordError, InputError):
        return verdict
    return verdict_line(rec) if rec.verdict.upper() == verdict else verdict


def integrity_problems(rep: ParsedReport) -> list[str]:
    """Problems with the record/sign-off/region that no signature check is needed to see,
    each naming the part that changed."""
    problems: list[str] = []
    digest = sha256_hex(rep.run_bytes)
    if digest != rep.signoff.get("run_sha256"):
        problems.append(
            f"embedded run record does not match its digest (sha256 {digest[:16]}…, sign-off says "
            f"{str(rep.signoff.get('run_sha256'))[:16]}…): the record was edited"
        )
    else:
        try:
            run: RunRecord | None = embedded_record(rep)
        except RecordError as exc:
            run = None
            problems.append(f"embedded run record is not a usable run record ({exc})")
        if run is not None:
            for key in ("run_id", "verdict", "reason"):
                if getattr(run, key) != rep.signoff.get(key):
                    problems.append(f"sign-off block says {key} {rep.signoff.get(key)!r} but the run record "
                                    f"says {getattr(run, key)!r}: the sign-off block was edited")
        if rep.signoff.get("run_bytes") != len(rep.run_bytes):
            problems.append(f"sign-off block says {rep.signoff.get('run_bytes')!r} bytes but the run record has "
                            f"{len(rep.run_bytes)}: the sign-off block was edited")
    a, b = rep.region
    if rep.html[a:b] != signatures_region(rep.entries):
        problems.append("signatures region was edited outside its signature entries")
    return problems


def sign_report(report: Path, key_path: Path, signer: Signatory, *, allow_rejected: bool = False) -> dict[str, Any]:
    """Append one signature to the report in place (atomic replace); returns the entry.

    A run that was not accepted is signed only with ``allow_rejected``; the signature then
    carries (and signs) ``despite_verdict``, and the page shows it beside the signature."""
    key = load_private_key(key_path)
    rep = parse_report(report)
    problems = integrity_problems(rep)
    doc = rep.document_sha256
    for i, e in enumerate(rep.entries, 1):
        if e.get("document_sha256") != doc:
            problems.append(f"signature {i} ({e.get('signer')}) no longer matches the report")
    if problems:
        raise SignoffError(f"{report}: refusing to sign a report that changed: " + "; ".join(problems))
    verdict = embedded_record(rep).verdict
    if verdict != "accepted" and not allow_rejected:
        raise SignoffError(f"{report}: verdict: {verdict.upper()}; signing a run that was not accepted needs "
                           f"--allow-rejected (the page and the signature then say 'signed despite verdict "
                           f"{verdict.upper()}')")
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
    if verdict != "accepted":
        entry["despite_verdict"] = verdict
    entry["signature"] = base64.b64encode(key.sign(signed_message(entry))).decode("ascii")
    html = rep.with_entries([*rep.entries, entry])
    write_file(report, html, error=SignoffError)  # keeps the report's mode
    return entry


@dataclass
class Verification:
    """Outcome of ``verify``: ok only with no problems; ``lines`` say what was checked."""

    ok: bool
    problems: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def _entry_problem(e: dict[str, Any], so: dict[str, Any], doc: str, keys: dict, page_intact: bool) -> str | None:
    """Why one signature entry does not verify, or None when it does."""
    missing = [f for f in ENTRY_FIELDS if not isinstance(e.get(f), str)]
    if missing:
        return f"missing fields {', '.join(missing)}"
    if "despite_verdict" in e and e["despite_verdict"] != so.get("verdict"):
        return f"signed despite verdict {e['despite_verdict']!r}, but the report's verdict is {so.get('verdict')!r}"
    if e["document_sha256"] != doc:
        if page_intact:
            return ("the report changed after it was signed, outside the embedded run record (which still "
                    "matches its digest): the visible page or the sign-off block was edited")
        return "the report changed after it was signed (document sha256 differs)"
    if e["run_sha256"] != so.get("run_sha256"):
        return "signed a different run record digest"
    if e["key_id"] not in keys:
        return f"signed with key {e['key_id']}, which is not one of the given public keys"
    if e["algorithm"] != "Ed25519":
        return f"algorithm {e['algorithm']!r} is not Ed25519"
    key, kpath = keys[e["key_id"]]
    try:
        sig = base64.b64decode(e["signature"], validate=True)
        if base64.b64encode(sig).decode("ascii") != e["signature"]:
            raise ValueError("non-canonical base64")  # the signatures region is not in the document digest
        key.verify(sig, signed_message(e))
    except (InvalidSignature, binascii.Error, ValueError):
        return f"signature does not verify with {kpath} (signer, role, time or signature edited)"
    return None


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
    verdict = str(so.get("verdict", "")).upper()
    lines = [
        f"run {so.get('run_id')}: verdict {_verdict_line(rep, verdict)} ({so.get('reason', '')})",
        f"run.json sha256 {so.get('run_sha256')} ({so.get('run_bytes')} bytes)",
    ]
    if not rep.entries:
        problems.append("the report is not signed")
    doc = rep.document_sha256
    page_intact = not problems
    used: set[str] = set()
    for i, e in enumerate(rep.entries, 1):
        who = f"signature {i} ({e.get('signer')}, {e.get('role')})"
        problem = _entry_problem(e, so, doc, keys, page_intact)
        if problem:
            problems.append(f"{who}: {problem}")
            continue
        used.add(e["key_id"])
        despite = f"; signed despite verdict {verdict}" if verdict != "ACCEPTED" else ""
        lines.append(f"{who}: ok, key {e['key_id']} ({keys[e['key_id']][1]}), signed at {e['signed_at']}{despite}")
    for kid, (_, kpath) in keys.items():
        if kid not in used and not any(e.get("key_id") == kid for e in rep.entries):
            problems.append(f"no signature by the key in {kpath} ({kid})")
    signed_names = {(str(e.get("signer")), str(e.get("role"))) for e in rep.entries}
    awaited = so.get("signatories") if isinstance(so.get("signatories"), list) else []
    for s in awaited:
        if isinstance(s, dict) and (str(s.get("name")), str(s.get("role"))) not in signed_names:
            lines.append(f"awaiting signature: {s.get('name')}, {s.get('role')}")
    return Verification(ok=not problems, problems=problems, lines=lines)
