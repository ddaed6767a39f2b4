"""The contract every ``Engine`` keeps (fa_images/run/engine.py), written once and run over the fake
engine the executor's tests run on (the unit tier: tests/unit/test_engine_contract.py) and over the
real Docker Engine (tests/engine/test_engine_contract_engine.py), so the fake cannot drift from what
the real one does:

- what it holds: an image's id and labels, None and "missing" for one it does not hold;
- a tag names the very image it was given;
- a run streams each line of its command's output as it comes, returns them all with the exit code,
  and keeps a failed container only when asked, with the command that enters it;
- a push returns the digest the registry then serves for the tag, asked without a pull, and none
  before, or says, as one line, that it cannot ask (Podman's API has no route for it): never a
  wrong answer; a pull brings the image back; a pull of what the registry lacks fails as one line.

An ``EngineWorld`` is one engine and what it needs around it: a base with /bin/sh that it holds, a
registry that takes pushes, and how to make it forget an image.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from fa_images.errors import StepFailed
from fa_images.run.engine import Engine


@dataclass
class EngineWorld:
    engine: Engine
    base: str  # an image with /bin/sh that the engine holds
    registry: str  # host:port of a registry that takes pushes with no login
    forget: Callable[[str], None]  # the engine no longer holds that image
    absent: Callable[[str], None] = lambda ref: None  # told: nothing holds or serves that ref
    kept: list[str] = field(default_factory=list)  # containers a check kept, for the world to remove

    def ref(self, what: str) -> str:
        return f"{self.registry}/fa-images-contract/{what}:{uuid.uuid4().hex[:8]}"


def check_what_it_holds(world: EngineWorld) -> None:
    absent = world.ref("absent")
    world.absent(absent)
    info = world.engine.image_info(world.base)
    assert info is not None and info.id.startswith("sha256:") and isinstance(info.labels, dict)
    assert world.engine.image_info(absent) is None
    assert world.engine.missing_images([world.base, absent]) == [absent]


def check_a_tag_names_the_image_it_was_given(world: EngineWorld) -> None:
    base = world.engine.image_info(world.base)
    assert base is not None
    ref = world.ref("tagged")
    world.engine.tag(base.id, ref)
    tagged = world.engine.image_info(ref)
    assert tagged is not None and tagged.id == base.id
    world.forget(ref)


def check_a_run_streams_its_lines_and_returns_its_exit_code(world: EngineWorld) -> None:
    seen: list[str] = []
    result = world.engine.run(world.base, ["sh", "-c", "echo one; echo two; exit 3"], gpu=False, keep=False,
                              on_line=seen.append)  # fmt: skip
    assert (result.exit_code, result.output, seen) == (3, ["one", "two"], ["one", "two"])
    assert result.kept_container is None
    ok = world.engine.run(world.base, ["sh", "-c", "echo fine"], gpu=False, keep=True, on_line=lambda _: None)
    assert (ok.exit_code, ok.output, ok.kept_container) == (0, ["fine"], None)  # kept only when it failed


def check_a_failed_run_is_kept_when_asked(world: EngineWorld) -> None:
    result = world.engine.run(world.base, ["sh", "-c", "echo broken; exit 1"], gpu=False, keep=True,
                              on_line=lambda _: None)  # fmt: skip
    assert result.exit_code == 1 and result.kept_container
    world.kept.append(result.kept_container)
    assert result.kept_container in world.engine.debug_command(result.kept_container)


CANNOT_ASK = "cannot ask"


def asked(world: EngineWorld, ref: str) -> str | None:
    """What the engine says the registry serves for ``ref``, or CANNOT_ASK where it says, as one line,
    that it cannot ask."""
    try:
        return world.engine.registry_digest(ref)
    except StepFailed as exc:
        assert "\n" not in str(exc) and "cannot ask" in str(exc)
        return CANNOT_ASK


def check_a_push_gives_the_digest_the_registry_serves(world: EngineWorld) -> None:
    base = world.engine.image_info(world.base)
    assert base is not None
    ref = world.ref("pushed")
    world.engine.tag(base.id, ref)
    assert asked(world, ref) in (None, CANNOT_ASK)  # nothing by that tag there yet
    digest = world.engine.push(ref, lambda _: None)
    assert digest.startswith("sha256:") and asked(world, ref) in (digest, CANNOT_ASK)
    world.forget(ref)
    assert world.engine.missing_images([ref]) == [ref]
    progress: list[object] = []
    pulled = world.engine.pull(ref, progress.append)
    assert pulled.id.startswith("sha256:") and world.engine.missing_images([ref]) == []
    world.forget(ref)


def check_a_pull_of_what_the_registry_lacks_is_one_line(world: EngineWorld) -> None:
    ref = world.ref("never-pushed")
    world.absent(ref)
    with pytest.raises(StepFailed) as failed:
        world.engine.pull(ref, lambda _: None)
    assert ref in str(failed.value) and "\n" not in str(failed.value)


CHECKS = [
    check_what_it_holds,
    check_a_tag_names_the_image_it_was_given,
    check_a_run_streams_its_lines_and_returns_its_exit_code,
    check_a_failed_run_is_kept_when_asked,
    check_a_push_gives_the_digest_the_registry_serves,
    check_a_pull_of_what_the_registry_lacks_is_one_line,
]
