"""The legacy builder's stream, as Podman 4.3's Docker API sent it (tests/fixtures/legacy_builder:
a real build of two stages whose second RUN fails, decoded as the SDK decodes it), read into steps
and one failure line. The real builds are in tests/engine/test_podman_engine.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fa_images.errors import StepFailed
from fa_images.run import sdk_builder
from fa_images.run.image_builder import BuildProgress

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "legacy_builder"


def test_podmans_steps_and_failure_read_as_dockers() -> None:
    lines: list[str] = []
    steps: list[BuildProgress] = []
    stream = sdk_builder._Stream(lines.append, steps.append)
    chunks = [json.loads(line) for line in (FIXTURES / "podman-failed.jsonl").read_text().splitlines()]
    with pytest.raises(StepFailed) as failed:
        for chunk in chunks:
            stream.chunk(chunk)
    assert [(s.stage, s.step, s.total) for s in steps] == [
        ("python", 1, 2),
        ("python", 2, 2),
        ("torch", 1, 2),
        ("torch", 2, 2),
    ]
    assert str(failed.value).startswith("torch step 2/2 (RUN echo building torch")
    assert str(failed.value).endswith("exited with 3: no torch here"), failed.value
    assert "one" in lines and "building torch" in lines


def test_a_runs_own_output_is_not_a_step_and_an_engines_own_exit_status_is_not_the_runs() -> None:
    steps: list[BuildProgress] = []
    stream = sdk_builder._Stream(lambda line: None, steps.append)
    for line in ("Step 1/2 : FROM base AS torch", "Step 2/2 : RUN pip wheel .", "Step 2/5: Building wheels"):
        stream.chunk({"stream": line + "\n"})
    assert [s.instruction for s in steps] == ["FROM base AS torch", "RUN pip wheel ."]
    with pytest.raises(StepFailed) as failed:
        stream.chunk({"error": "failed to register layer: exit status 1"})
    assert "exited with" not in str(failed.value) and "register layer: exit status 1" in str(failed.value)
