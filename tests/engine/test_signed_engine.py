"""Signed results, for real: the first build pushed its images and wheels signed with the project's
key (build_project.run_first_build); cosign (Debian 13's, tests/toolchain.py) is the verifier
that is not fa-images, and `fa-images check --verify` / `inspect --verify` are the node's.

The refused cases are made in the registry through its own API, beside the real image (its
blobs reused, so nothing large moves): an unsigned copy, a signed copy whose attestation was
changed after signing, and a signed copy that carries another image's attestation.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest
import toolchain
from build_project import GOOD, REGISTRY_USER, Project, entry_id

pytestmark = pytest.mark.engine

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
PROVENANCE = "https://slsa.dev/provenance/v1"
VERDICT = "https://fa-images.invalid/gpu-verdict/v1"


def _api(project: Project, path: str, *, method: str = "GET", body: bytes | None = None, kind: str = MANIFEST):
    login = base64.b64encode(f"{REGISTRY_USER}:{project.password}".encode()).decode()
    headers = {"Authorization": f"Basic {login}", "Accept": f"{MANIFEST}, {DOCKER_MANIFEST}"}
    if body is not None:
        headers["Content-Type"] = kind
    request = urllib.request.Request(f"http://{project.registry}/v2{path}", data=body, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.read(), dict(answer.headers)


def put_blob(project: Project, repository: str, data: bytes) -> str:
    import hashlib

    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _, headers = _api(
        project, f"/{repository}/blobs/uploads/", method="POST", body=b"", kind="application/octet-stream"
    )
    location = headers["Location"]
    url = location if "://" in location else f"http://{project.registry}{location}"
    login = base64.b64encode(f"{REGISTRY_USER}:{project.password}".encode()).decode()
    request = urllib.request.Request(
        f"{url}{'&' if '?' in url else '?'}digest={digest}", data=data, method="PUT",
        headers={"Authorization": f"Basic {login}", "Content-Type": "application/octet-stream"},
    )  # fmt: skip
    urllib.request.urlopen(request, timeout=60).close()
    return digest


def put_manifest(project: Project, repository: str, tag: str, document: dict, kind: str) -> str:
    _, headers = _api(
        project, f"/{repository}/manifests/{tag}", method="PUT", body=json.dumps(document).encode(), kind=kind
    )
    return headers["Docker-Content-Digest"]


def manifest(project: Project, repository: str, reference: str) -> tuple[dict, str]:
    body, headers = _api(project, f"/{repository}/manifests/{reference}")
    return json.loads(body), headers["Content-Type"].split(";")[0]


def cosign(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    """cosign with the project's registry login (its credential helper) and its public key."""
    flags = ["--key", str(project.dir / "keys" / "fa-images.pub"), "--insecure-ignore-tlog=true"]
    flags += ["--allow-http-registry=true", "--allow-insecure-registry=true"]
    command = [str(toolchain.cosign()), args[0], *flags, *args[1:]]
    return subprocess.run(command, env=project.env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def signed(project, first_build):
    """The good entry's image as pushed, and copies beside it in its repository: unsigned, signed
    with a changed attestation, signed with another image's attestation, and one a node attests."""
    _, entries = first_build
    good = entries[entry_id(GOOD)]
    image, digest = good["image"], good["pushed"]
    repository = image.removeprefix(project.registry + "/").rsplit(":", 1)[0]
    document, kind = manifest(project, repository, digest)
    copies = {}
    for name in ("unsigned", "tampered", "other-digest", "attested"):
        copy = dict(document) | {"annotations": {"copy": name}}  # the same blobs, another digest
        copies[name] = put_manifest(project, repository, name, copy, kind)
    return project, image, repository, digest, copies


@contextlib.contextmanager
def logged_in(project: Project) -> Iterator[None]:
    """This process with the project's registry login (its client config and credential helper)."""
    old = {k: os.environ.get(k) for k in ("DOCKER_CONFIG", "PATH")}
    os.environ.update({k: project.env[k] for k in old})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _sign_copy(project: Project, repository: str, digest: str) -> None:
    """The copy signed with the project's key, with a provenance statement about it, by fa-images."""
    from fa_images.outputs import signing, statements
    from fa_images.run import image_signatures
    from fa_images.run.registry import Repository, Session

    with logged_in(project):
        repo = Repository(project.registry, repository)
        signer = signing.load_signer(project.dir / "keys" / signing.PRIVATE_KEY)
        subject = image_signatures.subject_of(repo, digest)
        facts = statements.BuildFacts({"id": "copy"}, "buildkit", "0", [], None, 0, 1)
        image_signatures.sign(Session(repo, push=True), digest, signer, [statements.provenance(subject, facts)])


def test_cosign_accepts_the_signature_and_the_provenance_of_the_pushed_image(signed) -> None:
    project, _, repository, digest, _ = signed
    ref = f"{project.registry}/{repository}@{digest}"
    verified = cosign(project, "verify", ref)
    assert verified.returncode == 0, verified.stderr[-2000:]
    (claim,) = next(json.loads(line) for line in verified.stdout.splitlines() if line.startswith("["))
    assert claim["critical"]["image"]["docker-manifest-digest"] == digest
    assert claim["critical"]["identity"]["docker-reference"] == f"{project.registry}/{repository}"
    attested = cosign(project, "verify-attestation", "--type", PROVENANCE, ref)
    assert attested.returncode == 0, attested.stderr[-2000:]
    statement = json.loads(base64.b64decode(json.loads(attested.stdout.splitlines()[0])["payload"]))
    assert statement["subject"][0]["digest"]["sha256"] == digest.removeprefix("sha256:")
    entry = statement["predicate"]["buildDefinition"]["externalParameters"]["entry"]
    assert entry["id"] == entry_id(GOOD)
    inputs = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert any(i["uri"] == f"pkg:pypi/flash-attn@{GOOD}" and len(i["digest"]["sha256"]) == 64 for i in inputs)
    assert all("digest" in i for i in inputs if i["uri"].startswith("docker-image:")), inputs  # the bases' ids
    sbom = cosign(project, "verify-attestation", "--type", "https://cyclonedx.org/bom", ref)
    assert sbom.returncode == 0, sbom.stderr[-2000:]
    bom = json.loads(base64.b64decode(json.loads(sbom.stdout.splitlines()[0])["payload"]))["predicate"]
    names = {c["name"]: c.get("version") for c in bom["components"]}
    flash = next(v for k, v in names.items() if k.lower().replace("-", "_") == "flash_attn")
    assert names["torch"] == "2.9.1" and flash.startswith(f"{GOOD}+cu128torch2.9"), names  # what the image holds
    assert names["CUDA runtime"] == "12.8" and names.get("NCCL"), names
    # No secret in what was attached.
    assert project.password not in verified.stdout + attested.stdout + sbom.stdout


def test_check_verify_accepts_it_shows_its_verdicts_and_checks_that_digest(signed) -> None:
    project, image, _, digest, _ = signed
    proc = project.run("check", image, "--verify", str(project.dir / "keys" / "fa-images.pub"), "--gpus", "none")
    assert proc.returncode == 3, proc.stdout + proc.stderr  # verified, then checked: no GPU here
    assert f"✓ signed: {image} ({digest[:19]}…), 2 attestations by this key" in proc.stderr  # SBOM, provenance
    assert "verdict: none yet" in proc.stderr  # the build host had no GPU
    assert f"@{digest}: NO GPU" in proc.stdout  # the digest that was verified is the one checked


def test_the_signed_wheel_verifies_on_the_node(signed) -> None:
    project, *_ = signed
    (wheel,) = (project.dir / "dist").glob(f"flash_attn-{GOOD}+*-cp311-*.whl")  # the first build's
    key = str(project.dir / "keys" / "fa-images.pub")
    proc = project.run("inspect", str(wheel), "--no-import", "--verify", key)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SBOM, provenance" in proc.stdout and "GPU verdict: none" in proc.stdout


def test_an_unsigned_image_is_refused_by_both(signed) -> None:
    project, _, repository, _, copies = signed
    key = str(project.dir / "keys" / "fa-images.pub")
    proc = project.run("check", f"{project.registry}/{repository}:unsigned", "--verify", key, "--gpus", "none")
    assert proc.returncode == 13, proc.stderr
    assert "is not signed" in proc.stderr and proc.stdout == ""
    assert cosign(project, "verify", f"{project.registry}/{repository}@{copies['unsigned']}").returncode != 0


def test_a_changed_attestation_is_refused_by_both(signed) -> None:
    project, _, repository, _, copies = signed
    digest = copies["tampered"]
    _sign_copy(project, repository, digest)
    ref = f"{project.registry}/{repository}@{digest}"
    assert cosign(project, "verify-attestation", "--type", PROVENANCE, ref).returncode == 0  # before
    tag = digest.replace(":", "-") + ".att"
    document, kind = manifest(project, repository, tag)
    layer = document["layers"][0]
    envelope = json.loads(_api(project, f"/{repository}/blobs/{layer['digest']}")[0])
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["buildDefinition"]["externalParameters"]["entry"]["id"] = "something else"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    data = json.dumps(envelope).encode()
    layer = layer | {"digest": put_blob(project, repository, data), "size": len(data)}
    put_manifest(project, repository, tag, document | {"layers": [layer]}, kind)
    key = str(project.dir / "keys" / "fa-images.pub")
    proc = project.run("check", ref, "--verify", key, "--gpus", "none")
    assert proc.returncode == 14, proc.stderr
    assert "not signed by this key" in proc.stderr
    assert cosign(project, "verify-attestation", "--type", PROVENANCE, ref).returncode != 0


def test_an_attestation_for_another_digest_is_refused_by_both(signed) -> None:
    project, _, repository, good_digest, copies = signed
    digest = copies["other-digest"]
    _sign_copy(project, repository, digest)
    # The good image's own attestation, moved beside the copy: signed, but about the good image.
    theirs, kind = manifest(project, repository, good_digest.replace(":", "-") + ".att")
    put_manifest(project, repository, digest.replace(":", "-") + ".att", theirs, kind)
    ref = f"{project.registry}/{repository}@{digest}"
    proc = project.run("check", ref, "--verify", str(project.dir / "keys" / "fa-images.pub"), "--gpus", "none")
    assert proc.returncode == 15, proc.stderr
    assert f"not {project.registry}/{repository}" in proc.stderr
    said = cosign(project, "verify-attestation", "--type", PROVENANCE, ref)
    assert said.returncode != 0, said.stdout[-2000:]  # cosign holds the statement to the image's digest too


def test_a_nodes_verdict_is_added_beside_the_builds_and_both_verify(signed) -> None:
    """What `check --attest` does once a GPU ran the comparisons (bench/gpu_container.md's run does
    it on an H200): the node's signed verdict is added; nothing there is dropped."""
    from fa_images.builder.comparison import CaseResult
    from fa_images.builder.verdict import Case, Verdict
    from fa_images.outputs import signing
    from fa_images.run import node_signatures

    project, _, repository, _, copies = signed
    verdict = Verdict(
        "FlashAttention-2", True, "NVIDIA A10G", "8.6", "570.1", "2.9.1+cu128", "12.8", "SDPA", "rule",
        (Case.of(CaseResult("forward", 1e-4, 1e-3)),), 2.0,
    )  # fmt: skip
    with logged_in(project):
        signer = signing.load_signer(project.dir / "keys" / signing.PRIVATE_KEY)
        own = f"{project.registry}/{repository}@{copies['attested']}"
        _sign_copy(project, repository, copies["attested"])
        node_signatures.attest(own, verdict, signer)
        node_signatures.attest(own, verdict, signer)  # a second node of the class: kept once each
    shown = project.run("check", own, "--verify", str(project.dir / "keys" / "fa-images.pub"), "--gpus", "none")
    assert shown.returncode == 3, shown.stderr
    assert "verdict: passed on NVIDIA A10G (sm_86), driver 570.1, node " in shown.stderr
    attested = cosign(project, "verify-attestation", "--type", VERDICT, own)
    assert attested.returncode == 0, attested.stderr[-2000:]
