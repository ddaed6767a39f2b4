"""A second `build` with nothing changed builds nothing; any change to what an entry is made of does.

The engine is the fake one (its build, export and run calls are counted); the real engine's
no-op re-run is in tests/engine/test_build_engine.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
from pathlib import Path

import fakes
import pytest

from fa_images.builder import dist as dist_dir
from fa_images.builder import verify
from fa_images.builder.source import sha256_of
from fa_images.builder.verify import WheelReport
from fa_images.config.grammar import BuilderForm
from fa_images.config.matrix import load as load_matrix
from fa_images.outputs import context
from fa_images.run.executor import INPUTS_LABEL, Options
from fa_images.run.logger import Console

FakeEngine = fakes.FakeEngine


class OnePerPython(fakes.FakeBuilder):
    """The fake builder, exporting one wheel per Python (the shared fake exports one name for all)."""

    python = ""

    def build(self, request, **kwargs):
        if request.target == "runtime":
            self.python = "".join(re.search(r"-py(\d+)\.(\d+)-", request.tag).groups())
        return super().build(request, **kwargs)

    def _files(self, image, stage, dest):
        if stage != "wheel":
            return super()._files(image, stage, dest)
        self.engine.calls.append(("export", image))
        wheel = dest / f"flash_attn-2.8.3+cu128torch2.9cxx11abitrue-cp{self.python}-cp{self.python}-linux_x86_64.whl"
        wheel.write_bytes(f"a wheel for cp{self.python}".encode())


@pytest.fixture(autouse=True)
def _wheels_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every wheel passes verification, with its real sha256 (the up-to-date check hashes it)."""

    def inspect(path: Path, **_kw) -> WheelReport:
        report = WheelReport(wheel=path.name, sha256=sha256_of(path))
        report.add("fake", "pass", "accepted by the test")
        return report

    monkeypatch.setattr(verify, "inspect_wheel", inspect)


def build(matrix, engine: FakeEngine, tmp_path: Path, *, check: bool = True, form: BuilderForm = "buildkit", **options):
    out = io.StringIO()
    opts = Options(dist=tmp_path / "dist", log_dir=tmp_path / "logs", **options)
    _, results = fakes.execute(matrix, engine, opts, Console(out), builder=OnePerPython(engine, form), check=check)
    return results, out.getvalue()


def holding_the_bases(matrix) -> FakeEngine:
    """An engine that holds every base image of the matrix, as a build needs."""
    engine = FakeEngine()
    for entry in matrix.entries:
        engine.held |= {entry.devel_image: "sha256:devel-1", entry.runtime_image: "sha256:runtime-1"}
    return engine


def builds(engine: FakeEngine) -> list[tuple]:
    return [c for c in engine.calls if c[0] in ("build", "export", "run")]


def test_a_second_run_with_nothing_changed_builds_nothing(tiny_matrix, tmp_path: Path) -> None:
    engine = holding_the_bases(tiny_matrix)
    first, _ = build(tiny_matrix, engine, tmp_path)
    assert [r.status for r in first] == ["ok", "ok"] and not any(r.up_to_date for r in first)
    entry = tiny_matrix.entries[0]
    assert engine.labels[entry.image][INPUTS_LABEL] == context.inputs_digest(
        tiny_matrix,
        entry,
        sha256_of(tmp_path / "sdists" / "flash_attn-2.8.3.tar.gz"),
        base_ids={entry.devel_image: "sha256:devel-1", entry.runtime_image: "sha256:runtime-1"},
    )
    engine.calls.clear()

    second, out = build(tiny_matrix, engine, tmp_path)
    assert [r.status for r in second] == ["ok", "ok"] and all(r.up_to_date for r in second)
    assert builds(engine) == []  # no build, no export, no container
    assert [r.wheel for r in second] == [r.wheel for r in first]
    assert out.count("image and wheel up to date") == 2 and "up to date: built and checked by an earlier run" in out
    assert second[0].image_size == first[0].image_size == 7_000_000_000  # the engine's count, both times
    report = second[0].to_dict()
    assert report["up_to_date"] is True and report["wheel_sha256"] == first[0].wheel_sha256


def test_the_compiler_cache_is_no_input(tiny_matrix, tmp_path: Path) -> None:
    """Each build changes the group's compiler cache; a second run is still up to date."""
    engine, cache = FakeEngine(), tmp_path / "compiler-cache"
    build(tiny_matrix, engine, tmp_path, compiler_cache=cache)
    (cache / tiny_matrix.entries[0].compile_group / "another-object").write_text("from elsewhere")
    engine.calls.clear()
    second, _ = build(tiny_matrix, engine, tmp_path, compiler_cache=cache)
    assert all(r.up_to_date for r in second) and builds(engine) == []


def test_force_rebuilds(tiny_matrix, tmp_path: Path) -> None:
    engine = FakeEngine()
    build(tiny_matrix, engine, tmp_path)
    engine.calls.clear()
    results, _ = build(tiny_matrix, engine, tmp_path, force=True)
    assert not any(r.up_to_date for r in results)
    # One build per entry: the builder stage is tagged and the wheel exported by the ids it reported.
    assert [c[1] for c in builds(engine) if c[0] == "build"] == ["runtime"] * 2
    assert [c[2] for c in engine.calls if c[0] == "tag"] == [e.builder_image for e in tiny_matrix.entries]


def _change_setting(matrix, tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(path.read_text() + "build: {ptx: true}\n")
    return load_matrix(path), None


def _change_sdist(matrix, tmp_path):
    (tmp_path / "sdists" / "flash_attn-2.8.3.tar.gz").write_bytes(b"another sdist")
    sha = hashlib.sha256(b"another sdist").hexdigest()
    (tmp_path / "compat.yaml").write_text(f'flash_attn:\n  "2.8.3": {{sha256: {sha}, cuda_archs_env: true}}\n')
    return load_matrix(tmp_path / "matrix.yaml"), None


def _lose_the_wheel(matrix, tmp_path):
    for wheel in (tmp_path / "dist").glob("*.whl"):
        wheel.unlink()
    return matrix, None


def _lose_the_image(matrix, tmp_path):
    return matrix, "forget"


def _change_the_builder(matrix, tmp_path):
    return matrix, "builder"


def _repull_a_base(matrix, tmp_path):
    return matrix, "repull"


@pytest.mark.parametrize(
    "change",
    [_change_setting, _change_sdist, _lose_the_wheel, _lose_the_image, _change_the_builder, _repull_a_base],
    ids=["a setting", "the sdist", "the wheel is gone", "the image is gone", "the builder code", "a re-pulled base"],
)
def test_a_change_rebuilds(change, tiny_matrix, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The builder code comes from a copy of the package, which the "builder code" case edits.
    package = tmp_path / "package" / "fa_images"
    shutil.copytree(context.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(context, "PACKAGE", package)
    engine = holding_the_bases(tiny_matrix)
    build(tiny_matrix, engine, tmp_path)
    engine.calls.clear()
    matrix, what = change(tiny_matrix, tmp_path)
    if what == "forget":
        engine.labels.clear()
    if what == "repull":  # `docker pull` brought a newer nvidia/cuda under the same tag
        engine.held[matrix.entries[0].runtime_image] = "sha256:runtime-2"
    if what == "builder":
        build_py = package / "builder" / "build.py"
        build_py.write_text(build_py.read_text() + "\n# a change to the builder\n")
    results, _ = build(matrix, engine, tmp_path)
    assert [r.status for r in results] == ["ok", "ok"]
    assert not any(r.up_to_date for r in results)
    assert len([c for c in builds(engine) if c[0] == "build"]) == 2


def test_an_entry_whose_check_failed_is_not_current(tiny_matrix, tmp_path: Path) -> None:
    failing = FakeEngine(gpu=True, gpu_exit=1)
    first, _ = build(tiny_matrix, failing, tmp_path)
    assert [r.status for r in first] == ["failed", "failed"] and first[0].failed_step == "gpu-check"
    engine = FakeEngine(gpu=True)
    engine.labels = failing.labels  # the images are there, with their digest
    second, _ = build(tiny_matrix, engine, tmp_path)
    assert [r.status for r in second] == ["ok", "ok"] and not any(r.up_to_date for r in second)


def test_a_run_without_checks_does_not_make_an_entry_current(tiny_matrix, tmp_path: Path) -> None:
    engine = FakeEngine()
    build(tiny_matrix, engine, tmp_path, check=False)
    manifest = dist_dir.read_manifest(tmp_path / "dist")
    assert all(r.inputs is None for r in manifest.wheels.values())
    engine.calls.clear()
    results, _ = build(tiny_matrix, engine, tmp_path)
    assert not any(r.up_to_date for r in results)
    recorded = json.loads((tmp_path / "dist" / "manifest.json").read_text())["wheels"]
    assert all(len(r["inputs"]) == 64 for r in recorded.values())


def test_the_builder_that_built_an_entry_is_no_input(tiny_matrix, tmp_path: Path) -> None:
    """`auto` takes BuildKit where the docker CLI has it and the SDK's builder elsewhere: a host of
    each kind, sharing the registry's images, must agree on what is current, not rebuild each
    other's entries (the two Dockerfile forms differ in how files reach the compile, not in what
    is built)."""
    engine = holding_the_bases(tiny_matrix)
    first, _ = build(tiny_matrix, engine, tmp_path, form="sdk")
    assert [r.status for r in first] == ["ok", "ok"] and not any(r.up_to_date for r in first)
    other = FakeEngine()
    other.held, other.labels = engine.held, engine.labels
    second, out = build(tiny_matrix, other, tmp_path, form="buildkit")
    assert [r.status for r in second] == ["ok", "ok"] and all(r.up_to_date for r in second), out
    assert builds(other) == []


def test_how_the_matrix_file_is_named_is_no_input(tiny_matrix, tmp_path: Path) -> None:
    """The Dockerfile's header names the matrix file as given; comments change no image."""
    sdist = sha256_of(tmp_path / "sdists" / "flash_attn-2.8.3.tar.gz")
    renamed = tmp_path / "other name.yaml"
    shutil.copy(tmp_path / "matrix.yaml", renamed)
    digests = {
        context.inputs_digest(m, m.entries[0], sdist, base_ids={})
        for m in (tiny_matrix, load_matrix(Path("matrix.yaml")), load_matrix(renamed.resolve()))
    }
    assert len(digests) == 1


def test_a_parser_directive_is_an_input(monkeypatch: pytest.MonkeyPatch, tiny_matrix, tmp_path: Path) -> None:
    """`# syntax=` looks like a comment but changes the build."""
    sdist = sha256_of(tmp_path / "sdists" / "flash_attn-2.8.3.tar.gz")
    entry = tiny_matrix.entries[0]
    plain = context.inputs_digest(tiny_matrix, entry, sdist, base_ids={})
    real = context.render_entry
    monkeypatch.setattr(context, "render_entry", lambda m, e, **kw: "# escape=`\n" + real(m, e, **kw))
    assert context.inputs_digest(tiny_matrix, entry, sdist, base_ids={}) != plain
    monkeypatch.setattr(context, "render_entry", lambda m, e, **kw: "# just a remark\n" + real(m, e, **kw))
    assert context.inputs_digest(tiny_matrix, entry, sdist, base_ids={}) == plain
