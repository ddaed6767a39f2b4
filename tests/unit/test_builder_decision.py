"""The one builder decision (config/builder_decision.py): --builder > build.builder > auto, then what the
settings and the host allow. render and the exports decide with no host; build and its dry run
with what the host said."""

from __future__ import annotations

import pytest

from fa_images.config.builder_decision import Host, decide
from fa_images.errors import UsageError

BUILDX = Host(no_buildkit=None, engine="Docker Engine")
NO_BUILDX = Host(no_buildkit="the docker CLI 28.2.2 at /usr/bin/docker has no buildx plugin", engine="Docker Engine")
PODMAN = Host(no_buildkit=None, engine="Podman Engine")
NO_ENGINE_ASKED = Host(no_buildkit=None, engine=None)  # build --dry-run


@pytest.mark.parametrize(
    ("choice", "memory", "host", "form", "why"),
    [
        ("auto", False, BUILDX, "buildkit", "auto"),
        ("auto", False, NO_ENGINE_ASKED, "buildkit", "auto"),
        ("auto", False, None, "buildkit", "auto: the form the settings name"),
        ("auto", False, NO_BUILDX, "sdk", "auto: the docker CLI 28.2.2 at /usr/bin/docker has no buildx plugin"),
        ("auto", False, PODMAN, "sdk", "auto: Podman Engine has no BuildKit behind its Docker API"),
        ("auto", True, BUILDX, "sdk", "auto: build.memory is a limit only the legacy builder can set"),
        ("auto", True, None, "sdk", "auto: build.memory is a limit only the legacy builder can set"),
        ("buildkit", False, BUILDX, "buildkit", "asked for"),
        ("buildkit", False, None, "buildkit", "asked for"),
        ("sdk", False, BUILDX, "sdk", "asked for"),
        ("sdk", True, PODMAN, "sdk", "asked for"),
    ],
)
def test_the_decision(choice, memory, host, form, why) -> None:
    decision = decide(choice, memory_limit=memory, host=host)
    assert (decision.choice, decision.form) == (choice, form)
    assert decision.why.startswith(why)


@pytest.mark.parametrize(
    ("memory", "host", "said"),
    [
        (False, NO_BUILDX, "--builder buildkit: the docker CLI 28.2.2 at /usr/bin/docker has no buildx plugin"),
        (False, PODMAN, "--builder buildkit: Podman Engine has no BuildKit behind its Docker API"),
        (True, None, "--builder buildkit: build.memory is a limit only the legacy builder can set"),
    ],
)
def test_buildkit_where_it_cannot_serve_is_refused_with_why(memory, host, said) -> None:
    with pytest.raises(UsageError) as refused:
        decide("buildkit", memory_limit=memory, host=host)
    assert str(refused.value).startswith(said) and "--builder sdk" in (refused.value.hint or "")


def test_the_flag_goes_over_the_matrix(tiny_matrix) -> None:
    assert tiny_matrix.build.builder == "auto"
    assert tiny_matrix.build.decide_builder(None, host=NO_BUILDX).form == "sdk"
    assert tiny_matrix.build.decide_builder("sdk", host=BUILDX).form == "sdk"
    assert tiny_matrix.build.decide_builder("buildkit", host=BUILDX).form == "buildkit"
