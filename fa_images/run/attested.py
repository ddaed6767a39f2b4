"""What a node checks before it installs a wheel: its signed attestations, and the verdicts they carry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        return [a.predicate for a in self.attestations if a.predicate_type == statements.VERDICT_TYPE]

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


def verify_wheel(wheel: Path, key_path: Path) -> Verified:
    """The wheel's bundle, verified with the public key at ``key_path``: NotSigned, BadSignature or
    OtherSubject (each its exit code) for the first thing that is not so."""
    key = signing.load_public(key_path)
    try:
        sha256 = source.sha256_of(wheel)
    except OSError as exc:
        raise UsageError(f"{untrusted.shown(str(wheel))}: {exc.strerror}") from None
    data = signing.read_bundle(wheel)
    subject = statements.Subject(wheel.name, sha256)
    found = signing.verify(data, subject=subject, key=key, where=untrusted.shown(signing.bundle_name(wheel.name)))
    return Verified(wheel.name, sha256, tuple(found))
