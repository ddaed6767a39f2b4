"""The test harness leaves the machine as it found it, and trusts only its own servers.

A run killed with SIGKILL leaves a registry (and its data), a build and other servers running,
and images tagged; the next run must stop and delete them, and nothing of its own (its other
pytest-xdist worker may run a server or a registry at the same time). An engine data-root whose
daemon did not stop cleanly is not reused. A run that ends normally removes the images it
tagged. A server of ours is ready only when it is the one answering.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import engine_env
import pytest

pytestmark = pytest.mark.engine

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("tag", "ours"),
    [
        ("fa-images-test/flash-attn:fa2.8.3-py3.11", True),
        ("127.0.0.1:38918/fa-images-test/flash-attn:x-builder", True),
        ("localhost:5000/fa-images-test/interrupt:x", True),
        ("registry.example.com/fa-images-test/x:1", True),
        ("fa-images/flash-attn:1", False),
        ("someone/fa-images-test:1", False),
        ("nvidia/cuda:12.8.1-devel-ubuntu24.04", False),
    ],
)
def test_which_tags_are_the_tests(tag: str, ours: bool) -> None:
    assert engine_env._is_test_tag(tag) is ours


# What a run looks like when SIGKILL hits it: an engine in use, a registry with data, an image
# it tagged, a server of its own and a build child, all started the way the tests start them.
_KILLED_RUN = textwrap.dedent(
    """
    import subprocess, sys, time
    sys.path.insert(0, {tests!r})
    import engine_env
    with engine_env.docker_engine() as engine, engine_env.local_registry() as registry:
        bases = engine_env.base_images(engine.client)
        engine.client.images.get(bases.runtime).tag("fa-images-test/leftover", "1")
        engine.client.images.get(bases.runtime).tag(registry + "/fa-images-test/leftover", "1-builder")
        engine.client.images.get(bases.runtime).tag("not-a-test/image", "1")
        server = subprocess.Popen(["sleep", "600"], env=engine_env.child_env(), start_new_session=True)
        print("ready", registry, server.pid, flush=True)
        time.sleep(600)
    """
)


def test_the_next_run_clears_what_a_killed_run_left(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "600"], start_new_session=True)  # unmarked: not ours to stop
    # This run's own server, as the other pytest-xdist worker may have one running: spared.
    sibling = subprocess.Popen(["sleep", "600"], env=engine_env.child_env(), start_new_session=True)
    killed_run = f"killed{os.urandom(6).hex()}"
    killed = subprocess.Popen(
        [sys.executable, "-c", _KILLED_RUN.format(tests=str(TESTS))],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, engine_env.RUN_ID_VARIABLE: killed_run},
    )
    try:
        assert killed.stdout is not None
        line = killed.stdout.readline()
        assert line.startswith("ready"), line
        _, registry, server_pid = line.split()
        killed_prefix = f"{engine_env.REGISTRY_DIR_PREFIX}{killed_run}-"
        registry_dirs = set(Path(tempfile.gettempdir()).glob(killed_prefix + "*"))
        assert registry_dirs
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        # What SIGKILL left: the registry still answers, the server still runs.
        with urllib.request.urlopen(f"http://{registry}/v2/", timeout=5) as answer:
            assert answer.status == 200
        assert engine_env._alive(int(server_pid))
        leftovers = engine_env.marked_processes()
        assert int(server_pid) in leftovers and stranger.pid not in leftovers and sibling.pid not in leftovers

        with engine_env.docker_engine() as engine:
            assert not engine_env._alive(int(server_pid))
            assert engine_env.marked_processes() == []
            assert not any(path.exists() for path in registry_dirs)
            tags = {tag for image in engine.client.images.list() for tag in image.tags}
            assert not any("fa-images-test/leftover" in tag for tag in tags), tags
            assert {engine_env.RUNTIME_TAG, "not-a-test/image:1"} <= tags
            engine.client.images.get(engine_env.RUNTIME_TAG).tag("fa-images-test/made-here", "1")
        assert stranger.poll() is None and sibling.poll() is None

        # A run that ends normally removes what it tagged, and keeps the bases.
        with engine_env.docker_engine() as engine:
            tags = {tag for image in engine.client.images.list() for tag in image.tags}
            assert "fa-images-test/made-here:1" not in tags and engine_env.RUNTIME_TAG in tags
            engine.client.images.remove("not-a-test/image:1")
    finally:
        for proc in (stranger, sibling, killed):
            proc.kill()
            proc.wait()


def test_a_registry_is_ready_only_when_it_is_the_one_answering(tmp_path: Path) -> None:
    # A stranger that answers /v2/ with 200 on the port the registry is asked to use.
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "index.html").write_text("{}")
    with engine_env.serve_directory(tmp_path) as stranger:
        port = int(stranger.rstrip("/").rpartition(":")[2])
        with urllib.request.urlopen(f"{stranger}v2/", timeout=5) as answer:
            assert answer.status == 200
        started = time.monotonic()
        with engine_env.local_registry(port) as registry:
            assert registry != f"127.0.0.1:{port}"
            with urllib.request.urlopen(f"http://{registry}/v2/", timeout=5) as answer:
                assert answer.headers.get(engine_env.IDENTITY_HEADER)
        assert time.monotonic() - started < 60


def test_a_data_root_is_kept_only_after_a_clean_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA_IMAGES_TEST_CACHE", str(tmp_path))
    data_root = tmp_path / "docker"
    (data_root / "overlay2" / "orphan").mkdir(parents=True)  # what a killed daemon leaves
    kept = engine_env._fresh_unless_stopped_cleanly(data_root)
    assert kept == data_root and list(data_root.iterdir()) == []
    (data_root / "image").mkdir()
    assert not engine_env._clean_stop_mark().exists()  # in use: not clean until stopped
    engine_env._clean_stop_mark().touch()  # as _stop_dockerd leaves it
    engine_env._fresh_unless_stopped_cleanly(data_root)
    assert (data_root / "image").is_dir()
