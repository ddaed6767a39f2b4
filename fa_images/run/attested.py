"""What a node checks before it installs a wheel: its signed attestations, and the verdicts they carry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from securesystemslib.signer import Key

from ..builder import source, untrusted
from ..errors import UsageError
from ..outputs import signing, statements


@dataclass(frozen=True)
class Verified:
    """The statements of one wheel, each signed by the key and about its sha256."""

    wheel: str
    sha256: str
    attestations: tuple[signing.Attestation, ...]

    def verdicts(self) -> list[dict[str, Any]]:
        return signing.verdicts(self.attestations)

    def lines(self) -> list[str]:
        kinds = ", ".join(a.kind for a in self.attestations)
        lines = [f"✓ signed: {untrusted.shown(self.wheel)} (sha256 {self.sha256[:12]}…): {kinds}"]
        for v in self.verdicts():
            said = "passed" if v.get("passed") else "FAILED"
            where = f"{v.get('checkedOn', '?')}, {v.get('checkedAt', '?')}"
            driver = f", driver {v['driver']}" if v.get("driver") else ""
            cases = v["cases"] if isinstance(v.get("cases"), list) else []
            gpu = f"{v.get('gpu', '?')} (sm_{str(v.get('capability', '?')).replace('.', '')}{driver})"
            lines.append(untrusted.shown(f"  GPU verdict: {said} on {gpu}: {len(cases)} comparisons; {where}"))
        if not self.verdicts():
            lines.append("  GPU verdict: none (the build ran no GPU check)")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "statements": [a.kind for a in self.attestations],
            "verdicts": self.verdicts(),
        }


def verify_wheel(wheel: Path, key: Key) -> Verified:
    """The wheel's bundle, verified with ``key`` (``signing.load_public``): NotSigned, BadSignature
    or OtherSubject (each its exit code) for the first thing that is not so."""
    try:
        sha256 = source.sha256_of(wheel)
    except OSError as exc:
        raise UsageError(f"{untrusted.shown(str(wheel))}: {exc.strerror}") from None
    data = signing.read_bundle(wheel)
    subject = statements.Subject(wheel.name, sha256)
    found = signing.verify(data, subject=subject, key=key, where=untrusted.shown(signing.bundle_name(wheel.name)))
    return Verified(wheel.name, sha256, tuple(found))


@dataclass(frozen=True)
class Standing:
    """What the signed verdicts say of one offer on one node's GPU (``pick --verify``)."""

    verdicts: tuple[dict[str, Any], ...]  # every verified verdict, of its wheel and its image
    problem: str | None = None  # why it could not be verified (unsigned, another key, ...)

    def passed_on(self, capability: str) -> list[dict[str, Any]]:
        return [v for v in self.verdicts if v.get("passed") is True and v.get("capability") == capability]

    def line(self, capability: str) -> str:
        if self.problem:
            return untrusted.shown(f"not verified: {self.problem}")[:300]
        passed = self.passed_on(capability)
        if not passed:
            return f"signed; no passing verdict on compute capability {capability} yet"
        v = passed[-1]
        return untrusted.shown(f"verified: passed on {v.get('gpu')} ({v.get('checkedOn')}, {v.get('checkedAt')})")


def standing(dist: Path, wheel: str | None, image: str | None, pushed: str | None, key: Key) -> Standing:
    """The verdicts signed by the key for an offer's wheel (its bundle in ``dist``) and its image
    (beside it in its registry, at the digest the build pushed)."""
    from . import image_signatures
    from .registry import RegistryError, Repository, Session

    found: list[dict[str, Any]] = []
    try:
        if wheel is not None and (dist / wheel).is_file():
            found += verify_wheel(dist / wheel, key).verdicts()
        if image is not None and pushed is not None:
            repository, _ = Repository.of(image)
            found += signing.verdicts(image_signatures.verify(Session(repository), pushed, key))
    except (signing.Refused, RegistryError) as exc:
        return Standing(tuple(found), problem=str(exc))
    return Standing(tuple(found))
