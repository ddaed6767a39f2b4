"""The ``attest`` step: what one entry made, as statements (``outputs/statements.py``), and where they go.

Two ways out, either or both: signed here with a key (``--sign-key``: the wheel's bundle beside it
in dist/, the pushed image's signature and attestations beside it in its registry), or written
unsigned for a signer of the CI's own (``--statements DIR``: each a predicate file, as
``cosign attest --predicate`` takes it, with the reference it is about; the exported GitHub
workflow signs them keyless with the job's OIDC identity).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..builder import contract, inventory, safe_io, source, untrusted, wheelfile
from ..builder import dist as dist_dir
from ..builder.verdict import Verdict
from ..config.matrix import Entry
from ..errors import StepFailed
from ..outputs import signing, statements
from . import image_signatures, registry
from .engine import Engine


@dataclass(frozen=True, kw_only=True)
class Made:
    """What one entry made and how, as the steps before ``attest`` left it."""

    entry: Entry
    form: str  # the builder's form
    bases: tuple[str, ...]
    source: Path | None  # the checked sdist (None: made around a wheel)
    inputs: str | None  # the inputs digest
    wheel: Path | None
    wheel_sha256: str | None
    shares_wheel_of: str | None
    up_to_date: bool
    pushed: str | None  # the image's digest in its registry
    verdict: Verdict | None
    started: float


class Attester:
    def __init__(self, engine: Engine, dist: Path, *, signer: signing.Signer | None, statements_dir: Path | None):
        self.engine, self.dist, self.signer, self.statements_dir = engine, dist, signer, statements_dir

    def attest(self, made: Made) -> list[str]:
        """What was attested, a note each (none: nothing to attest)."""
        record = dist_dir.read_manifest(self.dist).wheels.get(made.wheel.name) if made.wheel else None
        facts = self._facts(made, record)
        return [note for note in (self._wheel(made, record, facts), self._image(made, facts)) if note]

    def _verdict(self, made: Made, subject: statements.Subject) -> list[dict[str, Any]]:
        if made.verdict is None:
            return []
        return [statements.gpu_verdict(subject, made.verdict, checked_on="the build host", at=time.time())]

    def _wheel(self, made: Made, record: dist_dir.WheelRecord | None, facts: statements.BuildFacts) -> str | None:
        wheel, sha256 = made.wheel, made.wheel_sha256
        if wheel is None or sha256 is None:
            return None
        if made.shares_wheel_of is not None:  # the group's wheel: its compiling entry's statements
            return f"the group's wheel: attested for {made.shares_wheel_of}"
        out = safe_io.OutputDir(self.dist, create=False, what="dist directory")
        name = signing.bundle_name(wheel.name)
        if made.up_to_date and out.kind(name) == "file":
            return f"{name} (up to date)"
        subject = statements.Subject(wheel.name, sha256)
        against = {"torch": record.torch} if record is not None and record.torch else {}
        try:
            with wheelfile.open_wheel(wheel) as opened:
                found = [statements.wheel_sbom(subject, opened, built_against=against)]
        except wheelfile.BadWheel as exc:
            raise StepFailed(f"the wheel cannot be read for its SBOM: {exc}") from None
        found += [statements.provenance(subject, facts), *self._verdict(made, subject)]
        notes = []
        if self.signer is not None:
            data = signing.bundle([signing.sign(s, self.signer) for s in found])
            out.write_bytes(name, data)
            dist_dir.set_attestations(self.dist, wheel.name, hashlib.sha256(data).hexdigest())
            notes.append(f"{self.dist / name}")
        if self.statements_dir is not None:
            notes.append(self._write(made.entry, "wheel", str(self.dist / wheel.name), found))
        kinds = ", ".join(statements.PREDICATES[s["predicateType"]] for s in found)
        return f"{' and '.join(notes)} ({kinds})"

    def _image(self, made: Made, facts: statements.BuildFacts) -> str | None:
        if made.pushed is None:
            return None
        repository, _ = registry.Repository.of(made.entry.image)
        subject = image_signatures.subject_of(repository, made.pushed)
        found = [self._image_sbom(made, subject, facts), statements.provenance(subject, facts)]
        found += self._verdict(made, subject)
        notes = []
        if self.signer is not None:
            session = registry.Session(repository, push=True)
            notes.append(", ".join(image_signatures.sign(session, made.pushed, self.signer, found)))
        if self.statements_dir is not None:
            notes.append(self._write(made.entry, "image", f"{repository.identity}@{made.pushed}", found))
        kinds = ", ".join(statements.PREDICATES[s["predicateType"]] for s in found)
        signature = "signature; " if self.signer is not None else ""
        return f"{repository.identity}: {' and '.join(notes)} ({signature}{kinds})"

    def _write(self, entry: Entry, what: str, subject: str, found: list[dict[str, Any]]) -> str:
        """The statements' predicates as files, and what they are about, in DIR/ENTRY/WHAT/."""
        assert self.statements_dir is not None
        out = safe_io.OutputDir(self.statements_dir, what="--statements directory")
        folder = f"{entry.id}/{what}"
        files = {f"{folder}/{statements.SUBJECT_FILE}": subject + "\n"}
        for s in found:
            files[f"{folder}/{statements.STATEMENT_FILES[s['predicateType']]}"] = (
                json.dumps(s["predicate"], indent=2) + "\n"
            )
        out.check_writable(list(files))
        for rel, text in files.items():
            out.write_text(rel, text)
        return str(self.statements_dir / folder)

    def _image_sbom(self, made: Made, subject: statements.Subject, facts: statements.BuildFacts) -> dict[str, Any]:
        """What the image holds, as its own ``inventory`` says in a container of it."""
        quiet: Callable[[str], None] = lambda _line: None  # noqa: E731
        said = self.engine.run(made.entry.image, list(contract.INVENTORY_COMMAND), gpu=False, keep=False, on_line=quiet)
        try:
            if said.exit_code != 0:
                raise ValueError(f"it exited with {said.exit_code}")
            held = inventory.parse(said.output)
        except ValueError as exc:
            raise StepFailed(f"the image's inventory, for its SBOM: {untrusted.shown(str(exc))[:300]}") from None
        bases = [i for i in facts.inputs if i.uri.startswith("docker-image:")]
        return statements.image_sbom(subject, held, bases)

    def _facts(self, made: Made, record: dist_dir.WheelRecord | None) -> statements.BuildFacts:
        from .. import __version__

        entry = made.entry
        inputs = []
        sdist = record.sdist_sha256 if record is not None else None
        if sdist is None and made.source is not None:
            sdist = source.sha256_of(made.source)  # the source the source step checked
        if sdist is not None:
            inputs.append(statements.Input(f"pkg:pypi/{entry.generation.project}@{entry.flash_attn}", sdist))
        for ref in made.bases:
            info = self.engine.image_info(ref)
            image_id = info.id.removeprefix("sha256:") if info is not None and info.id else None
            inputs.append(statements.Input(f"docker-image:{ref}", image_id))
        return statements.BuildFacts(
            entry=entry.summary(),
            builder=made.form,
            fa_images=__version__,
            inputs=inputs,
            inputs_digest=made.inputs,
            started=made.started,
            finished=time.time(),
        )
