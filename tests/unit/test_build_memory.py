"""`build.memory`: the memory a compile may use, checked when the matrix loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fakes
import pytest

from fa_images.config import grammar
from fa_images.config.matrix import load as load_matrix

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("6g", 6 * GIB),
        ("6G", 6 * GIB),
        ("16GiB", 16 * GIB),
        ("16gb", 16 * GIB),
        ("8192m", 8 * GIB),
        ("1t", 1024 * GIB),
        ("2147483648", 2 * GIB),
    ],
)
def test_memory_sizes_read_as_docker_reads_them(text: str, size: int) -> None:
    assert grammar.memory(text) is None
    assert grammar.memory_bytes(text) == size


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("512m", "less than the 1 GiB"),
        ("0g", "less than the 1 GiB"),
        ("lots", "is not a memory size"),
        ("6 gigabytes", "is not a memory size"),
        ("-6g", "is not a memory size"),
        ("6g; rm -rf /", "is not a memory size"),
    ],
)
def test_bad_memory_sizes_are_refused(text: str, why: str) -> None:
    assert why in (grammar.memory(text) or "")


def test_the_matrix_carries_the_limit(tiny_matrix, tmp_path: Path) -> None:
    assert tiny_matrix.build.memory_bytes is None  # default: the engine's whole memory
    path = tmp_path / "matrix.yaml"
    path.write_text(path.read_text() + "build: {memory: 12g}\n")
    assert load_matrix(path).build.memory_bytes == 12 * GIB


def test_a_bad_limit_is_one_line_naming_the_file_and_line(tiny_matrix, tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(path.read_text() + "build:\n  memory: 512m\n")
    proc = subprocess.run(
        [sys.executable, "-m", "fa_images", "plan", "--matrix", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "matrix.yaml:" in proc.stderr and "'512m' is less than the 1 GiB" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_every_build_call_carries_the_limit(tiny_matrix, tmp_path: Path, monkeypatch) -> None:
    import io
    from dataclasses import replace

    from fakes import FakeEngine, accept_every_wheel

    from fa_images.run.executor import Options
    from fa_images.run.logger import Console

    accept_every_wheel(monkeypatch)
    limited = replace(tiny_matrix, build=replace(tiny_matrix.build, memory="12g"))
    engine = FakeEngine()
    options = Options(dist=tmp_path / "dist", log_dir=tmp_path / "logs")
    # build.memory: only the legacy builder can set it, so the decision gives that one.
    form = limited.build.decide_builder(host=None).form
    fakes.execute(
        limited,
        engine,
        options,
        Console(io.StringIO()),
        entries=limited.entries[:1],
        builder=fakes.FakeBuilder(engine, form),
    )
    assert engine.memory_limits and set(engine.memory_limits) == {12 * GIB}
