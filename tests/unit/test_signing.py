"""Signed attestations of wheels: `keys create`, `build --sign-key`, `inspect --verify`.

The build runs on the fake engine with a real wheel in its wheel stage; the envelopes are then
checked by the DSSE specification itself (its pre-authentication encoding and an ECDSA check
written here from the spec, not fa-images' code path), the SBOM by CycloneDX's own schema.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import fakes
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from fakes import FakeEngine

from fa_images import cli
from fa_images.builder import verdict, verify
from fa_images.builder.comparison import CaseResult
from fa_images.builder.verify import WheelReport
from fa_images.outputs import signing, statements

WHEEL = fakes.WHEEL
INSPECT_WHEEL = verify.inspect_wheel
H100 = verdict.Verdict(
    generation="FlashAttention-2",
    passed=True,
    gpu="NVIDIA H100 80GB HBM3",
    capability="9.0",
    driver="580.95.05",
    torch="2.9.1+cu128",
    cuda="12.8",
    reference="SDPA",
    rule="a rule",
    cases=(verdict.Case.of(CaseResult("forward float16 full", 1e-4, 2e-3)),),
    seconds=3.2,
)


def real_wheel(dest: Path) -> None:
    """A wheel pip would install, with a RECORD of its files' sha256, where the fake wheel was."""
    files = {"flash_attn/__init__.py": b"__version__ = '2.8.3'\n", "flash_attn_2_cuda.so": b"\x7fELF not really"}
    info = "flash_attn-2.8.3+cu128torch2.9cxx11abitrue.dist-info"
    files[f"{info}/METADATA"] = b"Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3+cu128torch2.9cxx11abitrue\n"
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp312-cp312-linux_x86_64\n"
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for name, data in files.items()
    ]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(dest / WHEEL, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)


class RealWheelBuilder(fakes.FakeBuilder):
    def _files(self, image: str, stage: str, dest: Path) -> None:
        super()._files(image, stage, dest)
        if (dest / WHEEL).is_file():
            real_wheel(dest)


@pytest.fixture
def fa(run_fa_images):
    """``fa-images ARGS``, as the unit tier runs it."""
    return lambda *args: run_fa_images(list(args))


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return signing.create_keys(tmp_path / "keys")


def accept_with_its_sha256(monkeypatch: pytest.MonkeyPatch) -> None:
    def inspect(path: Path, **_kw) -> WheelReport:
        report = WheelReport(wheel=path.name, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
        report.add("fake", "pass", "accepted by the test")
        return report

    monkeypatch.setattr(verify, "inspect_wheel", inspect)


def signed_build(monkeypatch, keys, engine: FakeEngine, *flags: str) -> int:
    accept_with_its_sha256(monkeypatch)
    fakes.use_engine(monkeypatch, engine, RealWheelBuilder)
    only = ("--only", "fa2.8.3-py3.12-torch2.9.1-cu128")
    return cli.main(["build", "--matrix", "matrix.yaml", *only, "--sign-key", str(keys[0]), *flags])


def envelopes(bundle: Path) -> list[dict]:
    return [json.loads(line) for line in bundle.read_bytes().splitlines()]


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding, from its specification."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def test_keys_are_cosigns_kind_and_never_replaced(tmp_path, capfd, fa) -> None:
    assert fa("keys", "create", str(tmp_path / "k")).returncode == 0
    private, public = tmp_path / "k" / "fa-images.key", tmp_path / "k" / "fa-images.pub"
    assert private.stat().st_mode & 0o777 == 0o600
    key = serialization.load_pem_public_key(public.read_bytes())
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")  # the PEM of a cosign.pub
    before = private.read_bytes()
    again = fa("keys", "create", str(tmp_path / "k"))
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "never replaced" in again.stderr
    assert private.read_bytes() == before


def test_an_encrypted_key_needs_its_password_and_says_so_in_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(signing.PASSWORD_ENV, "correct horse")
    private, _ = signing.create_keys(tmp_path)
    assert b"ENCRYPTED PRIVATE KEY" in private.read_bytes()
    signing.load_signer(private)
    monkeypatch.delenv(signing.PASSWORD_ENV)
    with pytest.raises(signing.UsageError, match=f"encrypted; set {signing.PASSWORD_ENV}"):
        signing.load_signer(private)
    monkeypatch.setenv(signing.PASSWORD_ENV, "hunter2-xyz")
    with pytest.raises(signing.UsageError, match="not a PEM private key") as caught:
        signing.load_signer(private)
    assert "hunter2-xyz" not in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        "not a key",
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        "",  # an empty file
    ],
)
def test_a_key_that_is_not_one_is_refused_before_any_engine(tiny_matrix, tmp_path, monkeypatch, capfd, text) -> None:
    bad = tmp_path / "bad.key"
    bad.write_text(text)
    engine = FakeEngine()
    fakes.use_engine(monkeypatch, engine)
    assert cli.main(["build", "--matrix", "matrix.yaml", "--sign-key", str(bad)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --sign-key") and engine.calls == []


def test_another_curve_is_refused(tmp_path) -> None:
    key = ec.generate_private_key(ec.SECP384R1())
    path = tmp_path / "p384.key"
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    with pytest.raises(signing.UsageError, match="not an ECDSA P-256 key"):
        signing.load_signer(path)


def test_without_a_key_nothing_is_signed_and_the_run_says_so(tiny_matrix, monkeypatch, capfd) -> None:
    fakes.accept_every_wheel(monkeypatch)
    fakes.use_engine(monkeypatch, FakeEngine())
    assert cli.main(["build", "--matrix", "matrix.yaml", "--gpus", "none"]) == 0
    assert "signing: none: nothing is signed" in capfd.readouterr().err
    assert not list(Path("dist").glob("*.intoto.jsonl"))


def test_a_build_that_signs_nothing_loads_no_signing_library(tiny_matrix) -> None:
    """Signing's libraries (securesystemslib, cryptography, CycloneDX; boto3 too, where installed,
    through securesystemslib's signers) cost every command line that loads them a large part of its
    start: `build` loads them only where it attests."""
    probe = (
        "import sys; from fa_images import cli;"
        "code = cli.main(['build', '--matrix', 'matrix.yaml', '--dry-run']);"
        "print(code, *(m for m in ('securesystemslib', 'cyclonedx', 'fa_images.outputs.signing') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines()[-1] == "0", proc.stdout[-2000:]


def test_the_plan_shows_the_attest_step_with_a_key(tiny_matrix, keys, fa) -> None:
    proc = fa("build", "--dry-run", "--sign-key", str(keys[0]))
    assert proc.returncode == 0, proc.stderr
    assert "-> push" not in proc.stdout and "gpu-check -> attest" in proc.stdout
    assert "  attest     the wheel's SBOM, provenance and GPU verdict, signed, beside it in dist/" in proc.stdout
    plain = fa("build", "--dry-run")
    assert "attest" not in plain.stdout
    pushed = fa("build", "--dry-run", "--push", "--sign-key", str(keys[0]))
    assert "push -> attest" in pushed.stdout
    assert (
        "reg.local/fa:fa2.8.3-py3.12-torch2.9.1-cu128: its SBOM, provenance and GPU verdict, fa-images' own"
        in pushed.stdout
    )


def test_a_signed_build_attests_sbom_provenance_and_the_gpu_verdict(tiny_matrix, keys, monkeypatch, capfd, fa) -> None:
    engine = FakeEngine(gpu=True, gpu_output=[H100.line(), "PASS: FlashAttention-2: 1 comparisons"])
    assert signed_build(monkeypatch, keys, engine, "--gpus", "runtime") == 0
    err = capfd.readouterr().err
    assert f"signing: with {keys[0]}" in err
    assert "GPU verdict (NVIDIA H100 80GB HBM3, sm_90)" in err
    wheel = Path("dist") / WHEEL
    bundle = wheel.with_name(WHEEL + ".intoto.jsonl")
    sha256 = hashlib.sha256(wheel.read_bytes()).hexdigest()
    public = serialization.load_pem_public_key(keys[1].read_bytes())
    assert isinstance(public, ec.EllipticCurvePublicKey)
    found = {}
    for envelope in envelopes(bundle):
        assert envelope["payloadType"] == "application/vnd.in-toto+json"
        payload = base64.b64decode(envelope["payload"])
        (sig,) = envelope["signatures"]
        public.verify(base64.b64decode(sig["sig"]), pae(envelope["payloadType"], payload), ec.ECDSA(hashes.SHA256()))
        statement = json.loads(payload)
        assert statement["_type"] == "https://in-toto.io/Statement/v1"
        assert statement["subject"] == [{"name": WHEEL, "digest": {"sha256": sha256}}]
        found[statement["predicateType"]] = statement["predicate"]
    assert set(found) == {statements.SBOM_TYPE, statements.PROVENANCE_TYPE, statements.VERDICT_TYPE}
    sbom = found[statements.SBOM_TYPE]
    assert sbom["metadata"]["component"]["hashes"] == [{"alg": "SHA-256", "content": sha256}]
    files = {c["name"]: c["hashes"][0]["content"] for c in sbom["components"] if c["type"] == "file"}
    assert files["flash_attn/__init__.py"] == hashlib.sha256(b"__version__ = '2.8.3'\n").hexdigest()
    assert any(c.get("purl") == "pkg:pypi/torch@2.9.1" for c in sbom["components"])
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(sbom)) is None
    provenance = found[statements.PROVENANCE_TYPE]
    definition = provenance["buildDefinition"]
    assert definition["externalParameters"]["entry"]["id"] == "fa2.8.3-py3.12-torch2.9.1-cu128"
    sdist = hashlib.sha256(b"sdist").hexdigest()
    assert {"uri": "pkg:pypi/flash-attn@2.8.3", "digest": {"sha256": sdist}} in definition["resolvedDependencies"]
    assert any(d["uri"].startswith("docker-image:") for d in definition["resolvedDependencies"])
    assert provenance["runDetails"]["metadata"]["startedOn"] <= provenance["runDetails"]["metadata"]["finishedOn"]
    gpu = found[statements.VERDICT_TYPE]
    assert (gpu["gpu"], gpu["capability"], gpu["driver"], gpu["passed"]) == (
        "NVIDIA H100 80GB HBM3",
        "9.0",
        "580.95.05",
        True,
    )
    assert gpu["checkedOn"] == "the build host" and gpu["cases"][0]["bound"] == 2e-3

    monkeypatch.setattr(verify, "inspect_wheel", INSPECT_WHEEL)  # the real inspection now, after the signatures
    verified = fa("inspect", str(wheel), "--no-import", "--verify", str(keys[1]))
    # Verified, then inspected: the stand-in's extension is no ELF, which inspect finds (exit 1).
    assert verified.returncode == 1 and "not a readable shared library" in verified.stdout, verified.stderr
    assert "✓ signed: " in verified.stdout and "SBOM, provenance, GPU verdict" in verified.stdout
    assert "GPU verdict: passed on NVIDIA H100 80GB HBM3 (sm_90, driver 580.95.05): 1 comparisons" in verified.stdout
    as_json = json.loads(fa("inspect", str(wheel), "--no-import", "--json", "--verify", str(keys[1])).stdout)
    assert as_json["attestations"]["sha256"] == sha256 and as_json["attestations"]["verdicts"][0]["passed"]


def test_a_build_without_a_gpu_check_attests_no_verdict(tiny_matrix, keys, monkeypatch, capfd, fa) -> None:
    assert signed_build(monkeypatch, keys, FakeEngine(), "--gpus", "none") == 0
    assert "no GPU verdict (skipped: --gpus none)" in capfd.readouterr().err
    kinds = [
        json.loads(base64.b64decode(e["payload"]))["predicateType"]
        for e in envelopes(Path("dist") / (WHEEL + ".intoto.jsonl"))
    ]
    assert kinds == [statements.SBOM_TYPE, statements.PROVENANCE_TYPE]
    verified = fa("inspect", f"dist/{WHEEL}", "--no-import", "--verify", str(keys[1]))
    assert "GPU verdict: none" in verified.stdout


@pytest.mark.parametrize(
    "line",
    [
        "VERDICT: {not json",
        "VERDICT: " + json.dumps(H100.to_dict() | {"passed": False}),  # disagrees with its cases
        "VERDICT: " + json.dumps(H100.to_dict() | {"gpu": "H100\x1b[2J"}),
        "VERDICT: " + json.dumps(H100.to_dict() | {"cases": []}),
        "VERDICT: " + "[" * 100_000,
    ],
)
def test_a_verdict_line_that_is_not_one_fails_the_gpu_check(tiny_matrix, keys, monkeypatch, capfd, line) -> None:
    engine = FakeEngine(gpu=True, gpu_output=[line])
    assert signed_build(monkeypatch, keys, engine, "--gpus", "runtime") == 1
    err = capfd.readouterr().err
    assert "the GPU check's verdict line is not one" in err and "\x1b" not in err
    assert not (Path("dist") / (WHEEL + ".intoto.jsonl")).exists()


def test_the_verdict_survives_its_own_line() -> None:
    assert verdict.parse(["GPU: x", H100.line(), "PASS"]) == H100
    assert verdict.parse(["PASS: import check (no GPU check requested)"]) is None


def test_the_driver_release_is_read_from_the_kernel_modules_line(tmp_path) -> None:
    line = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16)\n"
    (tmp_path / "version").write_text(line + "GCC version:  gcc version 12.3.0\n")
    assert verdict.driver_release(tmp_path / "version") == "580.95.05"
    assert verdict.driver_release(tmp_path / "none") is None


@pytest.fixture
def signed(tiny_matrix, keys, monkeypatch, capfd) -> Path:
    engine = FakeEngine(gpu=True, gpu_output=[H100.line()])
    assert signed_build(monkeypatch, keys, engine, "--gpus", "runtime") == 0
    capfd.readouterr()
    return Path("dist") / WHEEL


def verify_code(fa, wheel: Path, key: Path) -> tuple[int, str]:
    proc = fa("inspect", str(wheel), "--no-import", "--verify", str(key))
    return proc.returncode, proc.stderr


def test_an_unsigned_wheel_is_refused_with_13(signed, keys, fa) -> None:
    signed.with_name(WHEEL + ".intoto.jsonl").unlink()
    code, err = verify_code(fa, signed, keys[1])
    assert code == 13 and err.startswith("error: ") and "is not signed" in err and err.count("\n") == 1


def test_another_key_a_changed_statement_or_a_bad_line_is_refused_with_14(signed, keys, fa, tmp_path) -> None:
    _, other = signing.create_keys(tmp_path / "other")
    assert verify_code(fa, signed, other)[0] == 14
    bundle = signed.with_name(WHEEL + ".intoto.jsonl")
    first, *rest = envelopes(bundle)
    statement = json.loads(base64.b64decode(first["payload"]))
    statement["predicate"]["metadata"] = {"component": {"name": "something else"}}
    changed = first | {"payload": base64.b64encode(json.dumps(statement).encode()).decode()}
    bundle.write_bytes(signing.bundle([changed, *rest]))
    code, err = verify_code(fa, signed, keys[1])
    assert code == 14 and "envelope 1: not signed by this key" in err
    bundle.write_bytes(b"{}\n")
    assert verify_code(fa, signed, keys[1])[0] == 14


def test_a_statement_about_another_wheel_is_refused_with_15(signed, keys, fa) -> None:
    with zipfile.ZipFile(signed, "a") as zf:  # the wheel changed after it was signed
        zf.writestr("flash_attn/extra.py", b"print('hello')\n")
    code, err = verify_code(fa, signed, keys[1])
    assert code == 15 and "the statement is about sha256" in err


def test_a_bundle_that_is_a_fifo_or_too_large_is_refused_in_bounded_time(signed, keys, fa) -> None:
    bundle = signed.with_name(WHEEL + ".intoto.jsonl")
    bundle.unlink()
    os.mkfifo(bundle)
    code, err = verify_code(fa, signed, keys[1])
    assert code == 2 and err.count("\n") == 1, err
    bundle.unlink()
    with bundle.open("wb") as f:
        f.truncate(signing.MAX_BUNDLE + 1)
    code, err = verify_code(fa, signed, keys[1])
    assert code == 2 and "larger than" in err, err


def test_the_verdict_predicate_is_what_its_published_schema_says(tmp_path) -> None:
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "gpu-verdict.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    predicate = statements.gpu_verdict(statements.Subject("x", "a" * 64), H100, checked_on="the build host", at=0)
    jsonschema.validate(predicate["predicate"], schema)
    assert schema["$id"] == statements.VERDICT_TYPE
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(predicate["predicate"] | {"capability": "sm_90"}, schema)


def test_the_bundle_is_recorded_travels_with_dist_merge_and_is_uploaded_by_dist_site(
    signed, keys, fa, tmp_path, monkeypatch
) -> None:
    from fa_images.builder import dist

    # The stand-in wheel has no real extension: merge's verifier has tests of its own.
    monkeypatch.setattr(dist, "verify_incoming", lambda item, log: None)
    bundle = signed.with_name(WHEEL + ".intoto.jsonl")
    record = dist.read_manifest(Path("dist")).wheels[WHEEL]
    assert record.attestations == hashlib.sha256(bundle.read_bytes()).hexdigest()
    merged = fa("dist", "merge", "dist", "--dist", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr
    assert (tmp_path / "merged" / bundle.name).read_bytes() == bundle.read_bytes()
    verified = fa("inspect", str(tmp_path / "merged" / WHEEL), "--no-import", "--verify", str(keys[1]))
    assert "✓ signed: " in verified.stdout, verified.stderr
    site = fa("dist", "site", "--out", str(tmp_path / "site"), "--wheel-url", "https://example.org/release/")
    assert site.returncode == 0, site.stderr
    assert str(Path("dist") / bundle.name) in site.stdout.split()  # uploaded beside its wheel
    published = json.loads((tmp_path / "site" / "manifest.json").read_text())["wheels"][WHEEL]
    assert published["attestations"] == record.attestations
    bundle.write_bytes(bundle.read_bytes() + b"\n")  # no longer the file the record names
    assert fa("dist", "site", "--out", str(tmp_path / "site2"), "--wheel-url", "https://example.org/r/").returncode == 2


def test_an_images_sbom_holds_its_packages_libraries_and_bases() -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    from fa_images.builder import inventory

    held = inventory.parse(["flash_attn imports", inventory.line()])  # this interpreter's, as an image prints it
    assert any(p["name"].lower() == "pyyaml" for p in held["packages"])
    bases = [statements.Input("docker-image:reg.local/cuda:12.8-devel", "c" * 64)]
    sbom = statements.image_sbom(statements.Subject("reg.local/fa", "d" * 64), held, bases)["predicate"]
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(sbom)) is None
    names = {c["name"] for c in sbom["components"]}
    assert {"PyYAML", "reg.local/cuda:12.8-devel", "CPython"} <= names
    assert sbom["metadata"]["component"]["hashes"] == [{"alg": "SHA-256", "content": "d" * 64}]


@pytest.mark.parametrize(
    "line",
    [
        "INVENTORY: " + json.dumps({"packages": [{"name": "x\x1b[2J", "version": "1"}]}),
        "INVENTORY: " + json.dumps({"packages": [{"name": "x", "version": "1", "record_sha256": "nope"}]}),
        "INVENTORY: " + json.dumps({"packages": "all of them"}),
        "INVENTORY: " + "[" * 50_000,
        "no inventory at all",
    ],
)
def test_an_inventory_that_is_not_one_is_refused(line) -> None:
    from fa_images.builder import inventory

    with pytest.raises(ValueError):
        inventory.parse([line])


def test_statements_for_a_signer_of_ones_own_are_written_unsigned(tiny_matrix, monkeypatch, capfd, tmp_path) -> None:
    accept_with_its_sha256(monkeypatch)
    fakes.use_engine(monkeypatch, FakeEngine(gpu=True, gpu_output=[H100.line()]), RealWheelBuilder)
    only = ("--only", "fa2.8.3-py3.12-torch2.9.1-cu128")
    assert cli.main(["build", "--matrix", "matrix.yaml", *only, "--statements", "st", "--gpus", "runtime"]) == 0
    assert "signing: statements, unsigned, in st/" in capfd.readouterr().err
    folder = Path("st") / "fa2.8.3-py3.12-torch2.9.1-cu128" / "wheel"
    assert (folder / "subject").read_text() == f"dist/{WHEEL}\n"
    assert sorted(p.name for p in folder.iterdir()) == ["gpu-verdict.json", "provenance.json", "sbom.json", "subject"]
    assert json.loads((folder / "gpu-verdict.json").read_text())["gpu"] == "NVIDIA H100 80GB HBM3"
    assert not (Path("dist") / (WHEEL + ".intoto.jsonl")).exists()  # nothing signed here


def test_pick_verify_ranks_the_offer_with_a_passing_verdict_on_the_nodes_arch_first(
    tiny_matrix, keys, monkeypatch, fa, tmp_path
) -> None:
    from dataclasses import replace

    a100 = replace(H100, gpu="NVIDIA A100-SXM4-80GB", capability="8.0")
    assert signed_build(monkeypatch, keys, FakeEngine(gpu=True, gpu_output=[a100.line()]), "--gpus", "runtime") == 0
    (node,) = json.loads(fa("pick", "p4d", "--dist", "dist", "--verify", str(keys[1]), "--json").stdout)
    (offer,) = node["offers"]
    assert offer["verdict"].startswith("verified: passed on NVIDIA A100-SXM4-80GB (the build host, ")
    (g5,) = json.loads(fa("pick", "g5", "--dist", "dist", "--verify", str(keys[1]), "--json").stdout)
    assert g5["offers"][0]["verdict"] == "signed; no passing verdict on compute capability 8.6 yet"
    _, other = signing.create_keys(tmp_path / "other")
    (refused,) = json.loads(fa("pick", "p4d", "--dist", "dist", "--verify", str(other), "--json").stdout)
    assert refused["offers"][0]["verdict"].startswith("not verified: ")
    assert fa("pick", "p4d", "--verify", str(keys[1])).returncode == 2  # --verify reads a dist/
    text = fa("pick", "p4d", "--dist", "dist", "--verify", str(keys[1])).stdout
    assert "    verdict     verified: passed on NVIDIA A100-SXM4-80GB" in text


@pytest.mark.parametrize(
    ("ref", "repository", "reference", "url"),
    [
        ("127.0.0.1:5000/x:1", ("127.0.0.1:5000", "x"), "1", "http://127.0.0.1:5000/v2/x"),
        ("[::1]:5000/a/b", ("[::1]:5000", "a/b"), "latest", "http://[::1]:5000/v2/a/b"),
        ("localhost/x", ("localhost", "x"), "latest", "http://localhost/v2/x"),
        ("ubuntu", ("docker.io", "library/ubuntu"), "latest", "https://registry-1.docker.io/v2/library/ubuntu"),
        ("acme/fa:t", ("docker.io", "acme/fa"), "t", "https://registry-1.docker.io/v2/acme/fa"),
        ("docker.io/acme/fa", ("docker.io", "acme/fa"), "latest", "https://registry-1.docker.io/v2/acme/fa"),
        (
            "docker.io/ubuntu:22.04",
            ("docker.io", "library/ubuntu"),
            "22.04",
            "https://registry-1.docker.io/v2/library/ubuntu",
        ),
        ("ghcr.io/a/b:c@sha256:" + "a" * 64, ("ghcr.io", "a/b"), "sha256:" + "a" * 64, "https://ghcr.io/v2/a/b"),
    ],
)
def test_a_reference_names_its_registry_repository_and_scheme_as_docker_reads_it(
    ref, repository, reference, url
) -> None:
    from fa_images.run.registry import Repository

    found, said = Repository.of(ref)
    assert ((found.registry, found.name), said, found.base_url) == (repository, reference, url)
