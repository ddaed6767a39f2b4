"""An engine that refuses or goes away is one error line for the entry, never a traceback."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import docker.errors
import pytest
import requests

from fa_images.run.engine import DockerEngine, StepFailed
from fa_images.run.sdk_builder import SdkBuilder

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
        (lambda e: SdkBuilder(e)._export_tree("sha256:abc", Path("x")), "exporting the files of sha256:abc"),
        (lambda e: e.push("reg/fa:x", on_line=print), "pushing reg/fa:x"),
        (
            lambda e: SdkBuilder(e)._build_stage(
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


class _Pushing:
    """Stands in for the SDK client's push stream, as Docker and Podman each write it."""

    def __init__(self, chunks: list[dict]) -> None:
        self.chunks = chunks
        self.api = self

    def push(self, repository, tag, stream, decode):
        return iter(self.chunks)


DIGEST = "sha256:" + "85" * 32


@pytest.mark.parametrize(
    "chunks",
    [
        # Docker: the digest in an aux record (and in the status line too).
        [{"status": "Pushed", "id": "abc"}, {"status": f"x: digest: {DIGEST} size: 902"}, {"aux": {"Digest": DIGEST}}],
        # Podman: only in the status line the docker CLI prints.
        [{"status": "The push refers to repository [reg/fa:x]"}, {"status": f"x: digest: {DIGEST} size: 902\n"}],
    ],
    ids=["docker", "podman"],
)
def test_the_pushed_digest_is_read_from_either_engine(chunks) -> None:
    assert DockerEngine(_Pushing(chunks)).push("reg/fa:x", on_line=lambda _: None) == DIGEST


def test_a_push_with_no_digest_is_a_failure() -> None:
    with pytest.raises(StepFailed, match="ended without a digest"):
        DockerEngine(_Pushing([{"status": "Preparing", "id": "abc"}])).push("reg/fa:x", on_line=lambda _: None)


class _HangingLog:
    """A followed log that gives its first frame, then stays open until closed, as Podman 4's can
    after its container exited; the container's full log holds a second frame."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def __iter__(self):
        yield b"first\n"
        self.closed.wait(60)
        raise ConnectionError("the stream was closed")  # what a read of a shut socket raises

    def close(self) -> None:
        self.closed.set()


class _ExitedContainer:
    name = "c"

    def __init__(self) -> None:
        self.followed = _HangingLog()

    def start(self) -> None: ...

    def logs(self, *, stream: bool, follow: bool):
        return self.followed if follow else iter([b"first\n", b"second\n"])

    def wait(self) -> dict:
        return {"StatusCode": 3}

    def remove(self, force: bool) -> None: ...


class _Runs:
    def __init__(self) -> None:
        self.api = self
        self.containers = self

    def create(self, *args, **kwargs) -> _ExitedContainer:
        return _ExitedContainer()


def test_a_log_left_open_after_its_container_exited_ends_with_the_whole_output(monkeypatch) -> None:
    monkeypatch.setattr("fa_images.run.engine.LOG_GRACE", 0.2)
    said: list[str] = []
    started = time.monotonic()
    result = DockerEngine(_Runs()).run("reg/fa:x", ["true"], gpu=False, keep=False, on_line=said.append)
    assert time.monotonic() - started < 30  # not the minutes a hung stream would take
    assert (result.exit_code, result.output, said) == (3, ["first", "second"], ["first", "second"])


class _SshLog(_HangingLog):
    """Over ssh:// docker-py refuses to cancel a stream; the engine ends it later."""

    def close(self) -> None:
        self.closed.set()  # the engine's own end of the stream, a moment later
        raise docker.errors.DockerException("Cancellable streams not supported for the SSH protocol")


def test_a_stream_that_cannot_be_cancelled_still_ends_the_run(monkeypatch) -> None:
    monkeypatch.setattr("fa_images.run.engine.LOG_GRACE", 0.2)
    thread_errors: list[object] = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    runs = _Runs()
    container = _ExitedContainer()
    container.followed = _SshLog()
    monkeypatch.setattr(runs, "create", lambda *args, **kwargs: container)
    result = DockerEngine(runs).run("reg/fa:x", ["true"], gpu=False, keep=False, on_line=lambda _: None)
    assert (result.exit_code, result.output, thread_errors) == (3, ["first", "second"], [])
