"""What fa-images attests of a wheel: in-toto Statements (v1) with three predicates.

- **SBOM**: CycloneDX 1.6 (``https://cyclonedx.org/bom``). CycloneDX rather than SPDX because a
  wheel's SBOM is mostly its dependency graph and the hashes of its files, which CycloneDX models
  directly (components, ``dependencies``, ``hashes``), and its library is the one PyPI's tools use.
- **Provenance**: SLSA v1 (``https://slsa.dev/provenance/v1``): the matrix entry, every input digest
  (the sdist or archive, the base images, fa-images itself), the builder and its form, the times.
- **GPU verdict**: fa-images' own predicate (``VERDICT_TYPE``; its JSON schema is
  docs/gpu-verdict.schema.json): the in-toto test-result predicate has no place for the GPU, its
  arch and driver, or each comparison's error and bound, which are what a node decides on.

Each is plain data here; ``signing`` wraps them in DSSE envelopes.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from ..builder import untrusted, wheelfile
from ..builder.verdict import Verdict

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SBOM_TYPE = "https://cyclonedx.org/bom"
PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"
VERDICT_TYPE = "https://fa-images.invalid/gpu-verdict/v1"  # names it; nothing is fetched from there
BUILD_TYPE = "https://fa-images.invalid/build/v1"
PREDICATES = {SBOM_TYPE: "SBOM", PROVENANCE_TYPE: "provenance", VERDICT_TYPE: "GPU verdict"}
# `build --statements DIR`: each predicate a file (as `cosign attest --predicate` takes it) in
# DIR/ENTRY/{wheel,image}/, beside SUBJECT_FILE, what they are about (repository@digest, or the
# wheel's path).
STATEMENT_FILES = {SBOM_TYPE: "sbom.json", PROVENANCE_TYPE: "provenance.json", VERDICT_TYPE: "gpu-verdict.json"}
SUBJECT_FILE = "subject"
MAX_RECORD = 16 << 20  # RECORD of a wheel of 100,000 members


@dataclass(frozen=True)
class Subject:
    """What a statement is about: a wheel's file name and its sha256."""

    name: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "digest": {"sha256": self.sha256}}


@dataclass(frozen=True)
class Input:
    """One input of a build, as SLSA's resolvedDependencies names it."""

    uri: str
    sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"uri": self.uri} | ({"digest": {"sha256": self.sha256}} if self.sha256 else {})


@dataclass(frozen=True)
class BuildFacts:
    """What the provenance says of one entry's build."""

    entry: Mapping[str, Any]  # the entry as the plan prints it: its parameters
    builder: str  # the builder's form: "buildkit" or "legacy"
    fa_images: str  # its version
    inputs: Sequence[Input]
    inputs_digest: str | None  # the digest of everything the build was made of (its image's label)
    started: float  # epoch seconds
    finished: float


def statement(subject: Subject, predicate_type: str, predicate: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [subject.to_dict()],
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }


def _time(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def provenance(subject: Subject, facts: BuildFacts) -> dict[str, Any]:
    internal: dict[str, Any] = {"builder": facts.builder}
    if facts.inputs_digest:
        internal["inputsDigest"] = facts.inputs_digest
    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"entry": dict(facts.entry)},
            "internalParameters": internal,
            "resolvedDependencies": [i.to_dict() for i in facts.inputs],
        },
        "runDetails": {
            "builder": {"id": f"pkg:pypi/fa-images@{facts.fa_images}", "version": {"fa-images": facts.fa_images}},
            "metadata": {"startedOn": _time(facts.started), "finishedOn": _time(facts.finished)},
        },
    }
    return statement(subject, PROVENANCE_TYPE, predicate)


def gpu_verdict(subject: Subject, verdict: Verdict, *, checked_on: str, at: float) -> dict[str, Any]:
    """``checked_on``: where the check ran ("the build host", or the node's name)."""
    predicate = verdict.to_dict() | {"checkedOn": checked_on, "checkedAt": _time(at)}
    return statement(subject, VERDICT_TYPE, predicate)


def _hex(record_hash: str) -> str | None:
    """RECORD's ``sha256=<urlsafe base64>`` as hex; None for another algorithm or a malformed one."""
    algorithm, _, value = record_hash.partition("=")
    if algorithm != "sha256":
        return None
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def wheel_sbom(subject: Subject, wheel: wheelfile.Wheel, *, built_against: Mapping[str, str]) -> dict[str, Any]:
    """The wheel as CycloneDX: flash-attn's component with the wheel's sha256, each file it
    installs with the sha256 its RECORD gives, and what it was built against (``built_against``:
    project -> exact version, e.g. torch), on which it depends."""
    project = str(wheel.name)
    version = str(wheel.version)
    main = Component(
        name=project,
        version=version,
        type=ComponentType.LIBRARY,
        purl=PackageURL("pypi", None, project, version, qualifiers={"file_name": subject.name}),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=subject.sha256)],
        bom_ref=f"pkg:pypi/{project}@{version}",
    )
    bom = Bom()
    bom.metadata.component = main
    record = wheel.read(f"{wheel.dist_info}/RECORD", MAX_RECORD) or b""
    for line in untrusted.decode_text(record, what="RECORD").splitlines():
        path, _, rest = line.partition(",")
        digest = _hex(rest.partition(",")[0])
        if path and digest:
            bom.components.add(
                Component(
                    name=path,
                    type=ComponentType.FILE,
                    hashes=[HashType(alg=HashAlgorithm.SHA_256, content=digest)],
                    bom_ref=f"file:{path}",
                )
            )
    against = []
    for name, exact in sorted(built_against.items()):
        component = Component(
            name=name, version=exact, type=ComponentType.FRAMEWORK, purl=PackageURL("pypi", None, name, exact),
            bom_ref=f"pkg:pypi/{name}@{exact}",
        )  # fmt: skip
        bom.components.add(component)
        against.append(component)
    bom.register_dependency(main, against)
    return statement(subject, SBOM_TYPE, _document(bom))


def _document(bom: Bom) -> dict[str, Any]:
    """The BOM as CycloneDX 1.6 JSON, less its serial number and time, which make each document
    new: the statement is about the artifact, and the same artifact gives the same SBOM."""
    document = json.loads(JsonV1Dot6(bom).output_as_string(indent=None))
    document.pop("serialNumber", None)
    document.get("metadata", {}).pop("timestamp", None)
    return document


def image_sbom(subject: Subject, inventory: Mapping[str, Any], bases: Sequence[Input]) -> dict[str, Any]:
    """An image as CycloneDX: the container (its repository and manifest digest), every Python
    distribution installed in it (version; the sha256 of its RECORD, which lists each file's hash, as
    a property), the CUDA libraries torch loads (runtime, cuDNN, NCCL) and the base images it stands on."""
    main = Component(
        name=subject.name,
        version=f"sha256:{subject.sha256}",
        type=ComponentType.CONTAINER,
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=subject.sha256)],
        bom_ref=f"{subject.name}@sha256:{subject.sha256}",
    )
    bom = Bom()
    bom.metadata.component = main
    parts = []
    for package in inventory.get("packages", []):
        name, version = package["name"], package["version"]
        component = Component(
            name=name, version=version, type=ComponentType.LIBRARY,
            purl=PackageURL("pypi", None, name.lower(), version), bom_ref=f"pkg:pypi/{name.lower()}@{version}",
        )  # fmt: skip
        if package.get("record_sha256"):
            component.properties.add(Property(name="fa-images:record-sha256", value=package["record_sha256"]))
        parts.append(component)
    for library, version in sorted(inventory.get("libraries", {}).items()):
        label = {"cuda": "CUDA runtime", "cudnn": "cuDNN", "nccl": "NCCL"}[library]
        parts.append(
            Component(name=label, version=version, type=ComponentType.LIBRARY, bom_ref=f"lib:{library}@{version}")
        )
    if inventory.get("python"):
        parts.append(
            Component(name="CPython", version=inventory["python"], type=ComponentType.PLATFORM, bom_ref="python")
        )
    for base in bases:
        hashes = [HashType(alg=HashAlgorithm.SHA_256, content=base.sha256)] if base.sha256 else []
        parts.append(Component(name=base.uri.removeprefix("docker-image:"), type=ComponentType.CONTAINER,
                               hashes=hashes, bom_ref=base.uri))  # fmt: skip
    for part in parts:
        bom.components.add(part)
    bom.register_dependency(main, parts)
    return statement(subject, SBOM_TYPE, _document(bom))
