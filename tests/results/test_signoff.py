"""Sign-off: key files, signature round trip with several signers, and tamper detection —
every edited byte of a signed report must make verify fail, with a reason."""

from __future__ import annotations

import argparse
import base64
import json
import os
import stat
from functools import lru_cache
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from day0.core.record import Check
from day0.results.report import add_cli, render
from day0.results.signoff import (
    Signatory,
    SignoffError,
    decode_run,
    encode_run,
    keygen,
    load_private_key,
    load_public_key,
    parse_report,
    sign_report,
    verify_report,
)
from tests.support import run_factory as rf

ADA = Signatory("Ada Lovelace", "Infra lead")
GRACE = Signatory("Grace Hopper", "SRE")


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="day0")
    add_cli(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture()
def keys(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    return {"ada": keygen(tmp_path / "keys", "ada"), "grace": keygen(tmp_path / "keys", "grace")}


@pytest.fixture()
def report(tmp_path: Path) -> Path:
    return render(rf.write(rf.rejected(), tmp_path / "run"), tmp_path / "report.html")


def replace_once(path: Path, old: str, new: str) -> None:
    html = path.read_text(encoding="utf-8")
    assert html.count(old) >= 1, old
    path.write_text(html.replace(old, new, 1), encoding="utf-8")


# --------------------------------------------------------------------------- keys


def test_keygen_writes_pem_pair_with_private_mode_0600(tmp_path: Path) -> None:
    priv, pub = keygen(tmp_path / "k")
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert priv.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert pub.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    with pytest.raises(SignoffError, match="refusing to overwrite"):
        keygen(tmp_path / "k")


def test_private_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    priv, _ = keygen(tmp_path / "k")
    os.chmod(priv, 0o644)
    with pytest.raises(SignoffError, match=r"readable by others \(mode 0644\)"):
        load_private_key(priv)


# A valid PEM pair on a curve the cryptography package does not support (secp112r1, made by openssl)
UNSUPPORTED_PRIVATE = (b"-----BEGIN PRIVATE KEY-----\nME4CAQAwEAYHKoZIzj0CAQYFK4EEAAYENzA1AgEBBA44+b37YHRo2jeABzFglqEg\n"
                       b"Ax4ABK7a5/MOpe5e1DzSWpnFQSErvvD8gKpUzCu5lJ4=\n-----END PRIVATE KEY-----\n")
UNSUPPORTED_PUBLIC = (b"-----BEGIN PUBLIC KEY-----\nMDIwEAYHKoZIzj0CAQYFK4EEAAYDHgAERUodIQrlXUJ1bkknRjYf02B4Gii2Supw\n"
                      b"LVqFwg==\n-----END PUBLIC KEY-----\n")


def test_a_key_on_an_unsupported_curve_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """cryptography raises UnsupportedAlgorithm (not a ValueError) for it: a traceback and exit 1 before."""
    priv, pub = tmp_path / "k.pem", tmp_path / "k.pub.pem"
    priv.write_bytes(UNSUPPORTED_PRIVATE)
    priv.chmod(0o600)
    pub.write_bytes(UNSUPPORTED_PUBLIC)
    with pytest.raises(SignoffError, match=f"{priv}: not a usable PEM private key"):
        load_private_key(priv)
    with pytest.raises(SignoffError, match=f"{pub}: not a PEM public key"):
        load_public_key(pub)


# day0.core.names.is_component's rule, as for any name that becomes one file: a backslash, a control
# or bidi character too (the hand-written check let them through), and a name too long for a file
@pytest.mark.parametrize("name", ["../escaped", "sub/k", "", "..", "a\\b", "k\x1b[2J", "k\u202eexe", "k" * 300])
def test_keygen_takes_a_file_name_not_a_path(tmp_path: Path, name: str) -> None:
    with pytest.raises(SignoffError, match="a file name, not a path"):
        keygen(tmp_path / "keys", name)
    assert not list(tmp_path.rglob("*.pem"))


def test_cli_keygen(tmp_path: Path, capsys) -> None:
    assert _cli(["keygen", str(tmp_path / "k"), "--name", "me"]) == 0
    assert (tmp_path / "k" / "me.pem").exists() and (tmp_path / "k" / "me.pub.pem").exists()
    assert _cli(["keygen", str(tmp_path / "k"), "--name", "me"]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err


# --------------------------------------------------------------------------- round trip


def test_two_signers_round_trip(report: Path, keys, capsys) -> None:
    (ada_key, ada_pub), (grace_key, grace_pub) = keys["ada"], keys["grace"]
    assert _cli(["sign", str(report), "--key", str(ada_key), "--signer", str(ADA), "--allow-rejected"]) == 0
    result = verify_report(report, [ada_pub])
    assert result.ok, result.problems
    assert any("awaiting signature: Grace Hopper, SRE" in line for line in result.lines)
    assert _cli(["sign", str(report), "--key", str(grace_key), "--signer", str(GRACE), "--allow-rejected"]) == 0
    capsys.readouterr()
    assert _cli(["verify", str(report), "--pubkey", str(ada_pub), "--pubkey", str(grace_pub)]) == 0
    out = capsys.readouterr().out
    assert "verdict REJECTED" in out and out.count(": ok, key ") == 2 and "verified" in out
    entries = parse_report(report).entries
    assert [(e["signer"], e["role"]) for e in entries] == [(ADA.name, ADA.role), (GRACE.name, GRACE.role)]


def test_private_key_never_lands_in_report(report: Path, keys) -> None:
    ada_key, _ = keys["ada"]
    sign_report(report, ada_key, ADA, allow_rejected=True)
    key = load_private_key(ada_key)
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    data = report.read_bytes()
    pem_body = b"".join(ada_key.read_bytes().splitlines()[1:-1])
    for secret in (raw, raw.hex().encode(), base64.b64encode(raw), pem_body, pem_body[:20]):
        assert secret not in data


def test_verify_needs_every_signature_and_every_key(report: Path, keys, capsys) -> None:
    (ada_key, ada_pub), (_, grace_pub) = keys["ada"], keys["grace"]
    assert _cli(["verify", str(report), "--pubkey", str(ada_pub)]) == 1
    assert "the report is not signed" in capsys.readouterr().err
    sign_report(report, ada_key, ADA, allow_rejected=True)
    res = verify_report(report, [ada_pub, grace_pub])
    assert not res.ok and any("no signature by the key in" in p and "grace.pub.pem" in p for p in res.problems)
    res = verify_report(report, [grace_pub])
    assert not res.ok and any("not one of the given public keys" in p for p in res.problems)


def test_sign_refuses_duplicates_and_tampered_reports(report: Path, keys) -> None:
    ada_key, _ = keys["ada"]
    sign_report(report, ada_key, ADA, allow_rejected=True)
    with pytest.raises(SignoffError, match="already signed by Ada Lovelace"):
        sign_report(report, ada_key, ADA, allow_rejected=True)
    replace_once(report, "Prefill/decode latency", "Prefill/decode latenci")
    with pytest.raises(SignoffError, match="refusing to sign a report that changed"):
        sign_report(report, keys["grace"][0], GRACE, allow_rejected=True)


def test_cli_sign_bad_signer_and_missing_key(report: Path, keys, capsys) -> None:
    assert _cli(["sign", str(report), "--key", str(keys["ada"][0]), "--signer", "Ada"]) == 2
    assert 'expected "Name, Role"' in capsys.readouterr().err
    assert _cli(["sign", str(report), "--key", str(report.parent / "none.pem"), "--signer", str(ADA)]) == 2
    assert "private key not found" in capsys.readouterr().err


# --------------------------------------------------------------------------- tampering


@pytest.fixture()
def signed(report: Path, keys) -> tuple[Path, list[Path]]:
    sign_report(report, keys["ada"][0], ADA, allow_rejected=True)
    sign_report(report, keys["grace"][0], GRACE, allow_rejected=True)
    pubs = [keys["ada"][1], keys["grace"][1]]
    assert verify_report(report, pubs).ok
    return report, pubs


def _problems(path: Path, pubs: list[Path]) -> str:
    res = verify_report(path, pubs)
    assert not res.ok
    return " | ".join(res.problems)


def test_tamper_number_in_embedded_record(signed) -> None:
    report, pubs = signed
    rep = parse_report(report)
    value = json.loads(rep.run_bytes)["stages"][2]["checks"][0]["value"]
    replace_once(report, f'"value": {value},', f'"value": {value / 2},')
    assert "embedded run record does not match its digest" in _problems(report, pubs)


def test_tamper_number_in_visible_table(signed) -> None:
    report, pubs = signed
    replace_once(report, "812.5", "912.5")
    assert "the report changed after it was signed, outside the embedded run record" in _problems(report, pubs)


def test_tamper_verdict_visible_and_embedded(signed) -> None:
    report, pubs = signed
    replace_once(report, ">REJECTED</div>", ">ACCEPTED</div>")
    assert "the report changed after it was signed" in _problems(report, pubs)
    html = report.read_text(encoding="utf-8").replace(">ACCEPTED</div>", ">REJECTED</div>", 1)
    assert html.count('"verdict": "rejected",') == 1  # the run record's (the sign-off block's ends its object)
    report.write_text(html.replace('"verdict": "rejected",', '"verdict": "accepted",'), encoding="utf-8")
    assert "embedded run record does not match its digest" in _problems(report, pubs)
    report.write_text(html.replace('"verdict": "rejected"\n', '"verdict": "accepted"\n'), encoding="utf-8")
    assert "sign-off block says verdict 'accepted' but the run record says 'rejected'" in _problems(report, pubs)


def test_tamper_signer_name(signed) -> None:
    report, pubs = signed
    # Visible table only: the region no longer matches its entries.
    html = report.read_text(encoding="utf-8")
    at = html.rindex("<td>Grace Hopper</td>")  # the last one is in the signatures table
    assert at > html.index("<!--day0-signatures:begin-->")
    report.write_text(html[:at] + "<td>Mallory</td>" + html[at + len("<td>Grace Hopper</td>"):], encoding="utf-8")
    assert "signatures region was edited" in _problems(report, pubs)
    # Entries and table edited together, consistently: the signature itself fails.
    rep = parse_report(report)
    entries = rep.entries
    entries[1]["signer"] = "Mallory"
    report.write_text(rep.with_entries(entries), encoding="utf-8")
    assert "signature 2 (Mallory, SRE): signature does not verify" in _problems(report, pubs)


def test_tamper_signatories_in_signoff_block(signed) -> None:
    report, pubs = signed
    replace_once(report, '"name": "Grace Hopper"', '"name": "Grace Hoper"')
    assert "the report changed after it was signed" in _problems(report, pubs)


@lru_cache(maxsize=1)
def _signed_bytes(root: str) -> tuple[bytes, tuple[str, ...]]:
    base = Path(root)
    html = render(rf.write(rf.blocked_stages(), base / "run"), base / "report.html")
    (k1, p1), (k2, p2) = keygen(base / "k", "a"), keygen(base / "k", "b")
    sign_report(html, k1, ADA, allow_rejected=True)
    sign_report(html, k2, GRACE, allow_rejected=True)
    return html.read_bytes(), (str(p1), str(p2))


@given(data=st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_edited_byte_fails_verify(tmp_path_factory, data) -> None:
    root = tmp_path_factory.getbasetemp() / "signed-once"
    root.mkdir(exist_ok=True)
    original, pubs = _signed_bytes(str(root))
    pos = data.draw(st.integers(min_value=0, max_value=len(original) - 1), label="position")
    new = data.draw(st.integers(min_value=0, max_value=255).filter(lambda b: b != original[pos]), label="byte")
    edited = original[:pos] + bytes([new]) + original[pos + 1:]
    path = root / "edited.html"
    path.write_bytes(edited)
    argv = ["verify", str(path)] + [x for p in pubs for x in ("--pubkey", p)]
    assert _cli(argv) != 0


# --------------------------------------------------------------------------- embedding and parsing


@given(st.binary(max_size=400) | st.text(max_size=400).map(lambda t: t.encode("utf-8")))
def test_embedding_round_trips_and_cannot_close_the_script(data: bytes) -> None:
    for limit in (1 << 20, 16):  # as JSON text, and gzip-compressed
        enc, payload = encode_run(data, text_max=limit)
        assert decode_run(enc, payload) == data
        assert "<" not in payload


def test_embedding_of_literal_escape_falls_back_to_base64() -> None:
    data = b'{"msg": "already \\u003c escaped </script>"}'
    enc, payload = encode_run(data)
    assert enc == "base64" and decode_run(enc, payload) == data


def test_gzip_bomb_is_bounded(monkeypatch) -> None:
    import gzip

    import day0.results.signoff as so

    monkeypatch.setattr(so, "DECODE_MAX", 1000)
    payload = base64.b64encode(gzip.compress(b"0" * 100_000)).decode()
    with pytest.raises(SignoffError, match="inflates beyond 1000 bytes"):
        decode_run("gzip+base64", payload)


# Control and format characters (bidi overrides among them) are refused in a name: see below.
names = st.text(st.characters(blacklist_characters=",", blacklist_categories=("Cs", "Cc", "Cf")), min_size=1,
                max_size=30)


@given(names.filter(lambda s: s.strip()), names.filter(lambda s: s.strip()))
def test_signer_parsing(name: str, role: str) -> None:
    s = Signatory.parse(f"{name}, {role}")
    assert s.name == " ".join(name.split()) and s.role == " ".join(role.split())


def test_not_a_report(tmp_path: Path) -> None:
    p = tmp_path / "x.html"
    p.write_text("<html><body>hello</body></html>", encoding="utf-8")
    with pytest.raises(SignoffError, match="expected one signatures region, found 0"):
        parse_report(p)


def test_verify_says_what_an_accepted_run_did_not_verify(tmp_path: Path, keys, capsys) -> None:
    record = rf.accepted()
    record.stages[0].checks.append(Check(id="weights.manifest", title="manifest", status="skip", message="no manifest"))
    record.stages[1].checks.append(Check(id="collectives.transport.inter_node", title="t", status="skip", message="one node"))
    page = render(rf.write(record, tmp_path / "acc"), tmp_path / "acc.html")
    assert "ACCEPTED, 2 checks not verified" in page.read_text(encoding="utf-8")
    ada_key, ada_pub = keys["ada"]
    assert _cli(["sign", str(page), "--key", str(ada_key), "--signer", str(ADA)]) == 0
    capsys.readouterr()
    assert _cli(["verify", str(page), "--pubkey", str(ada_pub)]) == 0
    assert "verdict ACCEPTED, 2 checks not verified (every stage ran and passed)" in capsys.readouterr().out
    # a run with nothing left unverified keeps the bare verdict
    plain = render(rf.write(rf.accepted(), tmp_path / "plain"), tmp_path / "plain.html")
    assert _cli(["sign", str(plain), "--key", str(ada_key), "--signer", str(ADA)]) == 0
    capsys.readouterr()
    assert _cli(["verify", str(plain), "--pubkey", str(ada_pub)]) == 0
    assert "verdict ACCEPTED (every stage ran and passed)" in capsys.readouterr().out
