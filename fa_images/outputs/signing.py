"""Signed attestations: a key pair, DSSE envelopes of in-toto statements, and the bundle beside a wheel.

The keys are ECDSA P-256, the kind cosign makes: the public key is the PEM ``cosign.pub`` is, so
cosign and containers/image (``sigstoreSigned`` in policy.json) read it as they read their own.
The private key is PKCS#8 PEM, encrypted with ``$FA_IMAGES_SIGNING_PASSWORD`` where that is set.
Envelopes are DSSE (securesystemslib's, the in-toto reference): ``payloadType``
``application/vnd.in-toto+json``, an ASN.1 ECDSA signature over DSSE's pre-authentication encoding.

A wheel's attestations are one file beside it, ``<wheel>.intoto.jsonl``: one envelope a line, as
in-toto's attestation bundles are. ``verify`` refuses, each with its own exit code: no bundle
(13), a signature the key did not make or a payload changed after signing (14), and a statement
about another file (15).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from securesystemslib import dsse
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, Key, SSlibKey

from ..builder import dist, safe_io, untrusted
from ..errors import FatalError, UsageError
from .statements import PREDICATES, STATEMENT_TYPE, VERDICT_TYPE, Subject

PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUNDLE_SUFFIX = dist.ATTESTATIONS_SUFFIX
PASSWORD_ENV = "FA_IMAGES_SIGNING_PASSWORD"
PRIVATE_KEY = "fa-images.key"
PUBLIC_KEY = "fa-images.pub"
MAX_KEY = 16 << 10
MAX_BUNDLE = 64 << 20  # three envelopes; an SBOM of 100,000 files is about 20 MB of base64
MAX_ENVELOPES = 64

Signer = CryptoSigner  # what signs: a private key loaded by ``load_signer``

EXIT_NOT_SIGNED = 13
EXIT_BAD_SIGNATURE = 14
EXIT_OTHER_SUBJECT = 15


class Refused(FatalError):
    """What verification refuses, each kind with its exit code below."""


class NotSigned(Refused):
    """No signed attestation where one should be."""

    exit_code = EXIT_NOT_SIGNED


class BadSignature(Refused):
    """A signature this key did not make, or a payload that changed after it was signed."""

    exit_code = EXIT_BAD_SIGNATURE


class OtherSubject(Refused):
    """A signed statement about another file or image than the one at hand."""

    exit_code = EXIT_OTHER_SUBJECT


def password_set() -> bool:
    return bool(os.environ.get(PASSWORD_ENV))


def _password() -> bytes | None:
    value = os.environ.get(PASSWORD_ENV)
    return value.encode() if value else None


def create_keys(directory: Path) -> tuple[Path, Path]:
    """A new key pair in ``directory``: ``fa-images.key`` (0600; never replaces one) and ``fa-images.pub``."""
    out = safe_io.OutputDir(directory, what="key directory")
    out.check_writable([PRIVATE_KEY, PUBLIC_KEY])
    if out.kind(PRIVATE_KEY) is not None:
        raise UsageError(f"{untrusted.shown(str(directory / PRIVATE_KEY))} exists: a key is never replaced")
    key = ec.generate_private_key(ec.SECP256R1())
    password = _password()
    encryption = (
        serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    )  # fmt: skip
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )  # fmt: skip
    private_path = out.create_text(PRIVATE_KEY, private.decode(), mode=0o600)
    return private_path, out.write_bytes(PUBLIC_KEY, public)


def _read_key(path: Path, what: str) -> bytes:
    try:
        return untrusted.read_file(path, limit=MAX_KEY, what=what)
    except untrusted.UntrustedInput as exc:  # missing, a FIFO, a directory, too large
        raise UsageError(str(exc)) from None


def load_signer(path: Path) -> CryptoSigner:
    """The signer of the private key at ``path`` (ECDSA P-256, PEM; ``$FA_IMAGES_SIGNING_PASSWORD``
    where it is encrypted). UsageError, naming the file and never its bytes, for anything else."""
    data = _read_key(path, "--sign-key")
    shown = untrusted.shown(str(path))
    try:
        key = serialization.load_pem_private_key(data, password=_password())
    except TypeError:  # encrypted without a password, or a password for a key that has none
        raise UsageError(f"--sign-key {shown}: encrypted; set {PASSWORD_ENV} to its password") from None
    except (ValueError, UnsupportedAlgorithm):
        raise UsageError(f"--sign-key {shown} is not a PEM private key (or {PASSWORD_ENV} is wrong)") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise UsageError(f"--sign-key {shown} is not an ECDSA P-256 key (the kind cosign makes)")
    return CryptoSigner(key)


def load_public(path: Path, *, what: str = "--verify") -> Key:
    """The public key at ``path``: PEM, ECDSA P-256 (a ``cosign.pub`` is one)."""
    data = _read_key(path, what)
    shown = untrusted.shown(str(path))
    try:
        public = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise UsageError(f"{what} {shown} is not a PEM public key") from None
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name != "secp256r1":
        raise UsageError(f"{what} {shown} is not an ECDSA P-256 public key (the kind cosign makes)")
    return SSlibKey.from_crypto(public)


def sign(statement: dict[str, Any], signer: CryptoSigner) -> dict[str, Any]:
    """``statement`` as a signed DSSE envelope (its JSON form)."""
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    envelope = dsse.Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(signer)
    return envelope.to_dict()


def bundle_name(wheel: str) -> str:
    return wheel + BUNDLE_SUFFIX


def bundle(envelopes: Sequence[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(e, sort_keys=True, separators=(",", ":")).encode() + b"\n" for e in envelopes)


@dataclass(frozen=True)
class Attestation:
    """One verified statement: its predicate's type and the predicate."""

    predicate_type: str
    predicate: dict[str, Any]

    @property
    def kind(self) -> str:
        return PREDICATES.get(self.predicate_type, self.predicate_type)


def verdicts(attestations: Sequence[Attestation]) -> list[dict[str, Any]]:
    """The GPU verdicts among verified attestations."""
    return [a.predicate for a in attestations if a.predicate_type == VERDICT_TYPE]


def read_bundle(wheel: Path) -> bytes:
    """The bundle beside ``wheel``, read as a regular file of bounded size; NotSigned where there is none."""
    path = wheel.with_name(bundle_name(wheel.name))
    if not os.path.lexists(path):
        raise NotSigned(f"{untrusted.shown(wheel.name)} is not signed: no {untrusted.shown(path.name)} beside it")
    try:
        return untrusted.read_file(path, limit=MAX_BUNDLE, what="attestation bundle")
    except untrusted.UntrustedInput as exc:  # a FIFO, a device, a directory, too large
        raise UsageError(str(exc)) from None


def names_key(envelope: bytes, key: Key) -> bool:
    """Whether a DSSE envelope says ``key`` signed it (its keyid): one that does not is another
    signer's, not a forgery of this one's."""
    try:
        document = untrusted.parse_json(envelope, what="an envelope")
    except ValueError:
        return True  # not an envelope at all: verify() says so
    signatures = document.get("signatures") if isinstance(document, dict) else None
    if not isinstance(signatures, list):
        return True
    return any(isinstance(s, dict) and s.get("keyid") == key.keyid for s in signatures)


def verify(data: bytes, *, subject: Subject, key: Key, where: str) -> list[Attestation]:
    """Every statement of a bundle, each signed by ``key`` and about ``subject``. The first that is
    not ends it: BadSignature (a signature, a payload, or a line that is not an envelope) or
    OtherSubject (a digest or name that is not the subject's)."""
    lines = [line for line in data.splitlines() if line.strip()]
    if not lines:
        raise NotSigned(f"{where}: the attestation bundle is empty")
    if len(lines) > MAX_ENVELOPES:
        raise BadSignature(f"{where}: {len(lines)} envelopes, more than {MAX_ENVELOPES}")
    found = []
    for number, line in enumerate(lines, 1):
        at = f"{where}, envelope {number}"
        try:
            envelope = dsse.Envelope.from_dict(untrusted.parse_json(line, what=at))
            if envelope.payload_type != PAYLOAD_TYPE:
                raise BadSignature(f"{at}: payload type {untrusted.shown(str(envelope.payload_type))[:80]}")
            envelope.verify([key], 1)
        except (VerificationError, KeyError, TypeError, ValueError, AttributeError) as exc:
            # A signature the key did not make, a changed payload, or not an envelope at all.
            raise BadSignature(f"{at}: not signed by this key ({type(exc).__name__})") from None
        statement = untrusted.parse_json(envelope.payload, what=at)
        found.append(_about(statement, subject, at))
    return found


def _about(statement: object, subject: Subject, at: str) -> Attestation:
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise BadSignature(f"{at}: the payload is not an in-toto statement (v1)")
    subjects = statement.get("subject")
    digests = [s.get("digest") for s in subjects if isinstance(s, dict)] if isinstance(subjects, list) else []
    named = [d.get("sha256") for d in digests if isinstance(d, dict)]
    if subject.sha256 not in named:  # the digest is the artifact; a renamed copy is the same one
        shown = ", ".join(untrusted.shown(str(d))[:64] for d in named[:3]) or "nothing"
        raise OtherSubject(
            f"{at}: the statement is about sha256 {shown}, "
            f"not {untrusted.shown(subject.name)} (sha256 {subject.sha256})"
        )
    predicate_type, predicate = statement.get("predicateType"), statement.get("predicate")
    if not isinstance(predicate_type, str) or not isinstance(predicate, dict):
        raise BadSignature(f"{at}: the statement has no predicate")
    return Attestation(predicate_type, predicate)
