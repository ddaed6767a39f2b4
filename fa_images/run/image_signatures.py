"""An image's signature and attestations in its registry, where cosign and containers/image look.

cosign's tag convention, beside the image in its own repository: ``sha256-<hex>.sig`` holds the
signature (a "simple signing" payload naming the repository and the manifest digest, signed, in a
layer's annotation) and ``sha256-<hex>.att`` the attestations (one DSSE envelope a layer, each an
in-toto statement about that digest). containers/image reads the first with a ``sigstoreSigned``
policy and ``use-sigstore-attachments``; cosign reads both. A later signer appends its layers
(``check --attest`` adds a node's GPU verdict): nothing already there is dropped.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from securesystemslib.exceptions import UnverifiedSignatureError
from securesystemslib.signer import Key, Signature

from ..builder import untrusted
from ..outputs import signing, statements
from .registry import OCI_MANIFEST, Repository, Session

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE_ENVELOPE = "application/vnd.dsse.envelope.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SIGNATURE_TYPE = "cosign container image signature"
MAX_PAYLOAD = 64 << 10
MAX_LAYERS = 64


def attached(digest: str, kind: str) -> str:
    """The tag cosign gives an image's ``kind`` ("sig", "att") of manifest ``digest``."""
    return f"{digest.replace(':', '-')}.{kind}"


def payload(repository: Repository, digest: str) -> bytes:
    document = {
        "critical": {
            "identity": {"docker-reference": repository.identity},
            "image": {"docker-manifest-digest": digest},
            "type": SIGNATURE_TYPE,
        },
        "optional": None,
    }
    return json.dumps(document, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Layer:
    data: bytes
    media_type: str
    annotations: dict[str, str]


def _append(session: Session, tag: str, layers: list[Layer]) -> str:
    """The manifest at ``tag`` with ``layers`` after the ones it had (a layer already there is kept once)."""
    existing = session.manifest(tag)
    kept: list[dict[str, Any]] = []
    if existing is not None:
        old = existing.json().get("layers")
        kept = [d for d in old if isinstance(d, dict)] if isinstance(old, list) else []
    descriptors = list(kept)
    for layer in layers:
        digest = session.put_blob(layer.data)
        descriptor = {"mediaType": layer.media_type, "digest": digest, "size": len(layer.data)}
        descriptor["annotations"] = dict(layer.annotations)
        if descriptor not in descriptors:
            descriptors.append(descriptor)
    diff_ids = [d["digest"] for d in descriptors if isinstance(d.get("digest"), str)]
    config = json.dumps(
        {"architecture": "", "os": "", "config": {}, "rootfs": {"type": "layers", "diff_ids": diff_ids}},
        separators=(",", ":"),
    ).encode()
    config_digest = session.put_blob(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": len(config),
        },
        "layers": descriptors,
    }
    return session.put_manifest(tag, manifest)


def subject_of(repository: Repository, digest: str) -> statements.Subject:
    return statements.Subject(repository.identity, digest.removeprefix("sha256:"))


def sign(
    session: Session, digest: str, signer: signing.Signer, found: list[dict[str, Any]], *, signature: bool = True
) -> list[str]:
    """Signs the image at ``digest`` (``signature``: its .sig) and attaches ``found``, statements about
    it, each in a signed DSSE envelope (its .att). The tags written."""
    written = []
    if signature:
        body = payload(session.repository, digest)
        signed = base64.b64encode(bytes.fromhex(signer.sign(body).signature)).decode()
        _append(session, attached(digest, "sig"), [Layer(body, SIMPLE_SIGNING, {SIGNATURE_ANNOTATION: signed})])
        written.append(attached(digest, "sig"))
    if found:
        layers = [
            Layer(
                json.dumps(signing.sign(s, signer), sort_keys=True, separators=(",", ":")).encode(),
                DSSE_ENVELOPE,
                # The signature is the envelope's; cosign wants the annotation there all the same.
                {"predicateType": s["predicateType"], SIGNATURE_ANNOTATION: ""},
            )
            for s in found
        ]
        _append(session, attached(digest, "att"), layers)
        written.append(attached(digest, "att"))
    return written


def _layers(session: Session, tag: str) -> list[dict[str, Any]] | None:
    manifest = session.manifest(tag)
    if manifest is None:
        return None
    layers = manifest.json().get("layers")
    if not isinstance(layers, list) or len(layers) > MAX_LAYERS:
        raise signing.BadSignature(f"{tag} is not a manifest of at most {MAX_LAYERS} layers")
    return [d for d in layers if isinstance(d, dict) and isinstance(d.get("digest"), str)]


def verify(session: Session, digest: str, key: Key) -> list[signing.Attestation]:
    """The image at ``digest`` signed by ``key`` for its repository, and its attestations, each
    signed by ``key`` and about that digest. NotSigned (no signature), BadSignature (none by this
    key, or an attestation changed after signing), OtherSubject (a signature or a statement about
    another digest or repository)."""
    where = session.repository.identity
    layers = _layers(session, attached(digest, "sig"))
    if not layers:
        raise signing.NotSigned(f"{where}@{digest} is not signed: no {attached(digest, 'sig')} in its repository")
    other: str | None = None
    for layer in layers:
        if layer.get("mediaType") != SIMPLE_SIGNING:
            continue
        body = session.blob(layer["digest"], limit=MAX_PAYLOAD)
        annotations = layer.get("annotations")
        given = annotations.get(SIGNATURE_ANNOTATION, "") if isinstance(annotations, dict) else ""
        try:
            raw = base64.b64decode(str(given), validate=True)
            key.verify_signature(Signature(key.keyid, raw.hex()), body)
        except (binascii.Error, UnverifiedSignatureError, ValueError):
            continue
        claimed = untrusted.parse_json(body, what=f"{where}'s signature payload")
        critical = claimed.get("critical") if isinstance(claimed, dict) else None
        image = critical.get("image", {}) if isinstance(critical, dict) else {}
        identity = critical.get("identity", {}) if isinstance(critical, dict) else {}
        said = (image.get("docker-manifest-digest"), identity.get("docker-reference"))
        if said == (digest, where):
            return _attestations(session, digest, key)
        other = f"{untrusted.shown(str(said[1]))[:120]}@{untrusted.shown(str(said[0]))[:80]}"
    if other is not None:
        raise signing.OtherSubject(f"{where}@{digest}: its signature by this key is for {other}")
    raise signing.BadSignature(f"{where}@{digest}: no signature in {attached(digest, 'sig')} is by this key")


def _attestations(session: Session, digest: str, key: Key) -> list[signing.Attestation]:
    """The attestations by ``key``; an envelope another key signed (a keyid not this key's) is
    someone else's statement, passed over, while one that names this key must verify."""
    found: list[signing.Attestation] = []
    tag = attached(digest, "att")
    subject = subject_of(session.repository, digest)
    for number, layer in enumerate(_layers(session, tag) or [], 1):
        if layer.get("mediaType") != DSSE_ENVELOPE:
            continue
        envelope = session.blob(layer["digest"], limit=signing.MAX_BUNDLE)
        if not signing.names_key(envelope, key):
            continue
        found += signing.verify(envelope, subject=subject, key=key, where=f"{tag}, layer {number}")
    return found
