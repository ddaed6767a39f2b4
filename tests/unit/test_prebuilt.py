"""`build --wheels`: which existing wheel is for which entry, and the build that makes no compile.

The real build around a wheel from dist/ is in tests/engine/test_build_engine.py.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import fakes
import pytest
from fakes import FakeEngine, accept_every_wheel
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from fa_images import cli
from fa_images.errors import UsageError
from fa_images.run import prebuilt
from fa_images.run.executor import Options
from fa_images.run.logger import Console

LABEL = "cu128torch2.9cxx11abitrue"


def wheel(directory: Path, name: str, members: dict[str, bytes] | None = None) -> Path:
    """A wheel pip would read (its dist-info, WHEEL and METADATA), or ``members`` in its place;
    a name that is no wheel name gets bytes that are no zip."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    try:
        project, version, _build, _tags = parse_wheel_filename(name)
    except InvalidWheelFilename:
        path.write_bytes(b"PK")
        return path
    info = f"{name.split('-')[0]}-{version}.dist-info"
    if members is None:
        members = {
            f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n",
            f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode(),
        }
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in members.items():
            zf.writestr(member, data)
    return path


@pytest.mark.parametrize(
    ("names", "found"),
    [
        ([f"flash_attn-2.8.3+{LABEL}-cp311-cp311-linux_x86_64.whl"], 0),
        # Another Python, another torch, another CUDA, another ABI, another version, another project.
        (
            [
                f"flash_attn-2.8.3+{LABEL}-cp312-cp312-linux_x86_64.whl",
                "flash_attn-2.8.3+cu128torch2.8cxx11abitrue-cp311-cp311-linux_x86_64.whl",
                "flash_attn-2.8.3+cu126torch2.9cxx11abitrue-cp311-cp311-linux_x86_64.whl",
                "flash_attn-2.8.3+cu128torch2.9cxx11abifalse-cp311-cp311-linux_x86_64.whl",
                f"flash_attn-2.8.2+{LABEL}-cp311-cp311-linux_x86_64.whl",
                f"other-2.8.3+{LABEL}-cp311-cp311-linux_x86_64.whl",
                "not a wheel.whl",
                f"flash_attn-2.8.3+{LABEL}-cp311-cp311-linux_x86_64.whl",
            ],
            7,
        ),
    ],
    ids=["the one", "only the one that fits"],
)
def test_an_entry_takes_the_wheel_for_its_version_python_and_label(tiny_matrix, tmp_path, names, found) -> None:
    entry = tiny_matrix.entries[0]  # 3.11, torch 2.9.1, CUDA 12.8, new ABI
    paths = [wheel(tmp_path / "w", name) for name in names]
    assert prebuilt.find((entry,), [tmp_path / "w"]) == {entry.id: paths[found].resolve()}
    assert prebuilt.find((entry,), [paths[found]]) == {entry.id: paths[found].resolve()}


def test_an_entry_of_a_gpu_class_takes_the_wheel_of_its_class(tiny_matrix, tmp_path) -> None:
    """Two GPU classes of one torch: each entry takes the wheel whose +label names its archs."""
    import dataclasses

    entry = tiny_matrix.entries[0]
    sm80 = dataclasses.replace(entry, id=f"{entry.id}-sm80", archs=("80",), gpu_class="sm80")
    sm90 = dataclasses.replace(entry, id=f"{entry.id}-sm90", archs=("90",), gpu_class="sm90")
    paths = {
        label: wheel(tmp_path / "w", f"flash_attn-2.8.3+{label}-cp311-cp311-linux_x86_64.whl")
        for label in (LABEL, f"{LABEL}.sm80", f"{LABEL}.sm90", f"{LABEL}.sm80.90")
    }
    found = prebuilt.find((sm80, sm90, entry), [tmp_path / "w"])
    assert found == {
        sm80.id: paths[f"{LABEL}.sm80"].resolve(),
        sm90.id: paths[f"{LABEL}.sm90"].resolve(),
        entry.id: paths[LABEL].resolve(),
    }


def test_a_manifest_beside_the_wheel_names_its_entry(tiny_matrix, tmp_path) -> None:
    entry = tiny_matrix.entries[0]
    unlabelled = wheel(tmp_path / "dist", "flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl")
    with pytest.raises(UsageError, match=f"no wheel for {entry.id}"):
        prebuilt.find((entry,), [tmp_path / "dist"])
    record = {"sha256": "ab" * 32, "size": 2, "flash_attn": "2.8.3", "python": "3.11", "entry": entry.id}
    (tmp_path / "dist" / "manifest.json").write_text(
        json.dumps({"schema_version": 1, "wheels": {unlabelled.name: record}})
    )
    assert prebuilt.find((entry,), [tmp_path / "dist"]) == {entry.id: unlabelled.resolve()}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: None, "no wheel for fa2.8.3-py3.11-torch2.9.1-cu128; no wheel for fa2.8.3-py3.12"),
        (
            lambda d: [wheel(d / sub, f"flash_attn-2.8.3+{LABEL}-cp311-cp311-linux_x86_64.whl") for sub in "ab"],
            "2 wheels for fa2.8.3-py3.11-torch2.9.1-cu128",
        ),
    ],
    ids=["none", "two"],
)
def test_every_entry_needs_exactly_one_wheel(tiny_matrix, tmp_path, make, message) -> None:
    (tmp_path / "w").mkdir()
    make(tmp_path / "w")
    places = [tmp_path / "w", *sorted(p for p in (tmp_path / "w").iterdir() if p.is_dir())]
    with pytest.raises(UsageError, match=message) as refused:
        prebuilt.find(tiny_matrix.entries, places)
    assert refused.value.exit_code == 2


@pytest.mark.parametrize("kind", ["fifo", "link to a device", "missing", "not a wheel"])
def test_a_path_that_is_no_wheel_and_no_directory_is_refused(tiny_matrix, tmp_path, kind) -> None:
    path = tmp_path / "x.whl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to a device":
        path.symlink_to("/dev/zero")
    elif kind == "not a wheel":
        path = tmp_path / "x.tar.gz"
        path.write_bytes(b"")
    with pytest.raises(UsageError, match="not a wheel file or a directory of wheels"):
        prebuilt.find(tiny_matrix.entries, [path])


def test_the_build_around_a_wheel_compiles_nothing(tiny_matrix, tmp_path, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    entry = tiny_matrix.entries[0]
    given = wheel(tmp_path / "elsewhere", f"flash_attn-2.8.3+{LABEL}-cp311-cp311-linux_x86_64.whl")
    engine = FakeEngine()
    dockerfiles: list[str] = []

    class Builder(fakes.FakeBuilder):
        def build(self, request, **kwargs):
            dockerfiles.append((request.context / "Dockerfile").read_text())
            assert sorted(p.name for p in (request.context / "inputs" / "prebuilt").iterdir()) == [given.name]
            return super().build(request, **kwargs)

    options = Options(dist=tmp_path / "dist", log_dir=tmp_path / "logs")
    _, (result,) = fakes.execute(
        tiny_matrix,
        engine,
        options,
        Console(io.StringIO()),
        entries=(entry,),
        builder=Builder(engine),
        prebuilt={entry.id: given.resolve()},
    )
    assert (result.status, result.prebuilt, result.check) == ("ok", True, "passed")
    (dockerfile,) = dockerfiles
    assert " AS builder" not in dockerfile and "COPY inputs/prebuilt/ /" in dockerfile
    assert [c[1] for c in engine.calls if c[0] == "build"] == ["runtime"]
    assert not any(c[0] in ("tag", "export_dir") for c in engine.calls)  # no builder, no compiler cache


def test_wheels_are_found_before_any_engine_is_asked(tiny_matrix, tmp_path, capsys) -> None:
    assert cli.main(["build", "--wheels", str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --wheels {tmp_path}: no wheel for fa2.8.3-py3.11-torch2.9.1-cu128")
    wheel(tmp_path, f"flash_attn-2.8.3+{LABEL}-cp311-cp311-linux_x86_64.whl")
    only = tiny_matrix.entries[0].id
    assert cli.main(["build", "--wheels", str(tmp_path), "--dry-run", "--only", only]) == 0
    assert "(made around it: no compile)" in capsys.readouterr().out
