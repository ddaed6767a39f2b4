"""An engine that refuses or goes away is one error line for the entry, never a traceback."""

from __future__ import annotations

from pathlib import Path

import docker.errors
import pytest
import requests

from fa_images.engine import DockerEngine, StepFailed

REFUSED = docker.errors.APIError(
    "500 Server Error",
    explanation="runc create failed: error setting rlimit type 7: operation not permitted",
)


class _Refusing:
    """Stands in for the SDK client: every call fails the way a real engine's does."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.api = self
        self.containers = self
        self.images = self

    def __getattr__(self, name: str):
        def call(*args, **kwargs):
            raise self.error

        return call


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (REFUSED, "the engine refused: runc create failed"),
        (requests.ConnectionError("Connection aborted"), "lost the engine at"),
        (docker.errors.DockerException("Error while fetching server API version"), "lost the engine at"),
    ],
)
@pytest.mark.parametrize(
    ("call", "doing"),
    [
        (
            lambda e: e.run("reg/fa:x", ["true"], gpu=False, keep=False, on_line=print),
            "running a container of reg/fa:x",
        ),
        (lambda e: e.export("sha256:abc", Path(".")), "exporting the files of sha256:abc"),
        (lambda e: e.push("reg/fa:x", on_line=print), "pushing reg/fa:x"),
        (
            lambda e: e.build(
                context=Path("."),
                target="runtime",
                tag="reg/fa:x",
                network=None,
                memory=None,
                labels={},
                on_line=print,
                on_progress=print,
            ),
            "building reg/fa:x",
        ),
    ],
)
def test_engine_failures_become_one_line(error, said, call, doing) -> None:
    with pytest.raises(StepFailed) as caught:
        call(DockerEngine(_Refusing(error)))
    assert str(caught.value).startswith(f"{doing}: {said}")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
