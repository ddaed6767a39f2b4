"""The contract every ``ImageBuilder`` keeps, written once and run over the fake builder (the unit
tier: tests/unit/test_builder_contract.py) and over both real builders on the tests' engine
(tests/engine/test_builder_contract_engine.py), so the fake the executor's tests run on cannot
drift from what the real ones do:

- the outputs a request names are there: the target and the stages it tags as images, the files
  of the stages it reads in their directories, as regular files and directories only;
- a best-effort output that cannot be made is recorded in ``missed`` and the build succeeds; a
  required one fails the build, as one line;
- what a builder of its form cannot do is refused before anything is built.

A ``World`` is one builder with the engine behind it. Its tiny Dockerfile uses the stage names of
fa-images' own (contract.py), and its files stage holds a link, which no builder may hand over.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from fa_images.builder import contract
from fa_images.errors import StepFailed
from fa_images.run.image_builder import BuildRequest, BuildResult, ImageBuilder, Output

DOCKERFILE = """\
FROM {base} AS {builder}
RUN mkdir -p /out/sub && echo wheel > /out/w.whl && echo f > /out/sub/f && ln -s /etc/passwd /out/link
FROM scratch AS {wheel}
COPY --from={builder} /out/ /
FROM {base} AS {runtime}
COPY --from={wheel} /w.whl /w.whl
FROM {base} AS {cache_in}
ARG {anew}
RUN echo "into the cache: $FA_IMAGES_ANEW"
FROM scratch AS {cache}
COPY cache-ok {cache_dir}/object
"""


@dataclass
class World:
    builder: ImageBuilder
    base: str  # an image with /bin/sh that the engine holds
    holds: Callable[[str], bool]  # whether the engine holds an image by that name
    fail_cache: Callable[[Path], None]  # makes the compiler-cache stage of that context fail
    network: str | None = None  # the builds' network (the tests' engine has no bridge: host)

    def context(self, where: Path) -> Path:
        where.mkdir(parents=True)
        stages = {
            "builder": contract.BUILDER_STAGE,
            "wheel": contract.WHEEL_STAGE,
            "runtime": contract.RUNTIME_STAGE,
            "cache_in": contract.CACHE_IN_STAGE,
            "cache": contract.CACHE_STAGE,
        }
        text = DOCKERFILE.format(base=self.base, anew=contract.ANEW_ARG, cache_dir=contract.CACHE_EXPORT_DIR, **stages)
        (where / "Dockerfile").write_text(text)
        (where / "cache-ok").write_text("an object")
        (where / "fa_images" / "builder").mkdir(parents=True)  # where a context of fa-images' own has it
        (where / "fa_images" / "builder" / "build.py").write_text("")
        return where


def request(world: World, tmp_path: Path, *, cache_best_effort: bool = True, **extra) -> BuildRequest:
    tag = f"fa-images-test/contract:{world.builder.form}-{uuid.uuid4().hex[:8]}"
    (tmp_path / "wheel").mkdir()
    (tmp_path / "cache").mkdir()
    buildkit = world.builder.form == "buildkit"
    return BuildRequest(
        context=world.context(tmp_path / "ctx"),
        target=contract.RUNTIME_STAGE,
        tag=tag,
        outputs=(
            Output(stage=contract.BUILDER_STAGE, tag=f"{tag}-builder"),
            Output(stage=contract.WHEEL_STAGE, dest=tmp_path / "wheel"),
            Output(stage=contract.CACHE_STAGE, dest=tmp_path / "cache", best_effort=cache_best_effort),
        ),
        # BuildKit's form fills the compiler cache's mount first, anew; the legacy form has none.
        before=(contract.CACHE_IN_STAGE,) if buildkit else (),
        best_effort=frozenset({contract.CACHE_IN_STAGE}) if buildkit else frozenset(),
        anew=frozenset({contract.CACHE_IN_STAGE, contract.CACHE_STAGE}) if buildkit else frozenset(),
        network=world.network,
        **extra,
    )


def build(world: World, req: BuildRequest) -> BuildResult:
    return world.builder.build(req, on_line=lambda _: None, on_progress=lambda _: None)


def only_files_and_dirs(dest: Path) -> list[str]:
    """Every name under ``dest``; fails on a link or anything but a regular file or directory."""
    names = []
    for root, dirs, files in os.walk(dest):
        for name in dirs + files:
            path = Path(root) / name
            assert not path.is_symlink() and (path.is_file() or path.is_dir()), path
            names.append(path.relative_to(dest).as_posix())
    return names


def check_outputs_are_there(world: World, tmp_path: Path) -> None:
    req = request(world, tmp_path)
    result = build(world, req)
    assert result.image_id.startswith("sha256:") and result.missed == {}
    assert world.holds(req.tag) and world.holds(f"{req.tag}-builder")
    wheel = only_files_and_dirs(tmp_path / "wheel")
    assert any(name.endswith(".whl") for name in wheel) and "link" not in wheel
    assert only_files_and_dirs(tmp_path / "cache")


def check_a_best_effort_miss_is_recorded(world: World, tmp_path: Path) -> None:
    req = request(world, tmp_path)
    world.fail_cache(req.context)
    result = build(world, req)
    assert set(result.missed) == {contract.CACHE_STAGE} and result.missed[contract.CACHE_STAGE]
    assert world.holds(req.tag) and any(n.endswith(".whl") for n in only_files_and_dirs(tmp_path / "wheel"))


def check_a_required_output_that_fails_fails_the_build(world: World, tmp_path: Path) -> None:
    req = request(world, tmp_path, cache_best_effort=False)
    world.fail_cache(req.context)
    with pytest.raises(StepFailed) as failed:
        build(world, req)
    assert "\n" not in str(failed.value)


def check_what_it_cannot_do_is_refused_before_any_build(world: World, tmp_path: Path) -> None:
    if world.builder.form == "buildkit":
        req = request(world, tmp_path, memory=2**30)
    else:
        req = request(world, tmp_path, cache_from=(f"fa-images-test/contract:{uuid.uuid4().hex[:8]}",))
    with pytest.raises(StepFailed, match="cannot do what this build asks"):
        build(world, req)
    assert not world.holds(req.tag)


CHECKS = [
    check_outputs_are_there,
    check_a_best_effort_miss_is_recorded,
    check_a_required_output_that_fails_fails_the_build,
    check_what_it_cannot_do_is_refused_before_any_build,
]
