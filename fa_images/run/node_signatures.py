"""``check --verify`` and ``check --attest``: an image's signature and verdicts, before and after its check.

``--verify KEY.pub`` asks each image's registry for the digest its tag names, refuses an image
that is not signed by that key for that digest (``image_signatures.verify``: exit 13, 14, 15), and
pins the reference to the digest, so what is pulled and run is what was verified. ``--attest``
then signs the verdict the check printed on this node (its GPU, arch, driver and comparisons) and
adds it beside the image: an image checked on a G5 and on a P5 carries both verdicts.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path

from ..builder import untrusted
from ..builder.verdict import Verdict
from ..outputs import signing, statements
from . import image_signatures
from .registry import RegistryError, Repository, Session


@dataclass(frozen=True)
class Verified:
    ref: str  # as given
    pinned: str  # repository@digest: what is pulled and checked
    repository: Repository
    digest: str
    attestations: tuple[signing.Attestation, ...]

    def verdicts(self) -> list[dict]:
        return signing.verdicts(self.attestations)

    def lines(self) -> list[str]:
        lines = [f"✓ signed: {self.ref} ({self.digest[:19]}…), {len(self.attestations)} attestations by this key"]
        for v in self.verdicts():
            said = "passed" if v.get("passed") else "FAILED"
            gpu = f"{v.get('gpu', '?')} (sm_{str(v.get('capability', '?')).replace('.', '')})"
            driver = f", driver {v['driver']}" if v.get("driver") else ""
            lines.append(f"  verdict: {said} on {gpu}{driver}, {v.get('checkedOn', '?')}, {v.get('checkedAt', '?')}")
        if not self.verdicts():
            lines.append("  verdict: none yet (no GPU check was attested)")
        return [untrusted.shown(line) for line in lines]


def digest_of(session: Session, reference: str) -> str:
    if reference.startswith("sha256:"):
        return reference
    manifest = session.manifest(reference)
    if manifest is None:
        raise RegistryError(f"{session.repository.identity} has no tag {reference}")
    return manifest.digest


def verify(refs: list[str], key_path: Path) -> list[Verified]:
    """Every image verified, or the first refusal raised (nothing is pulled or run before)."""
    key = signing.load_public(key_path)
    found = []
    for ref in refs:
        repository, reference = Repository.of(ref)
        session = Session(repository)
        digest = digest_of(session, reference)
        attestations = image_signatures.verify(session, digest, key)
        pinned = f"{ref.partition('@')[0]}@{digest}"
        found.append(Verified(ref, pinned, repository, digest, tuple(attestations)))
    return found


def attest(ref: str, verdict: Verdict, signer: signing.Signer) -> list[str]:
    """This node's verdict on the image ``ref`` names (by digest once verified), signed and added."""
    repository, reference = Repository.of(ref)
    session = Session(repository, push=True)
    digest = digest_of(session, reference)
    subject = image_signatures.subject_of(repository, digest)
    statement = statements.gpu_verdict(subject, verdict, checked_on=f"node {platform.node()}", at=time.time())
    return image_signatures.sign(session, digest, signer, [statement], signature=False)
