"""A build that needs a private index's credential, and leaks it nowhere.

A real pypiserver with an htpasswd file serves the build tools only to ``fa:<token>``;
an open one serves torch. `fa-images build` must still build the entry, and the token
must appear in no rendered Dockerfile, log, report, image history or image layer.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import engine_env
import pytest
import toolchain
import yaml
from fixtures.tiny import make_tiny_sdist
from packaging.requirements import Requirement

from fa_images.builder.source import sha256_of
from fa_images.config import compat

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
VERSION = "2.8.3.dev5"
# Every build tool the compat table pins (a wheel's name starts with the distribution's name).
BUILD_TOOLS = {Requirement(pin).name.replace("-", "_") for pin in compat.load().build_tools}


@contextlib.contextmanager
def pypiserver(packages: Path, *, htpasswd: Path | None) -> Iterator[str]:
    """A pypiserver on 127.0.0.1; with ``htpasswd`` every download and listing needs a login."""
    port = engine_env._free_port()
    auth = ["-P", str(htpasswd), "-a", "download,list,update"] if htpasswd else ["-P", ".", "-a", "."]
    cmd = [sys.executable, "-m", "pypiserver", "run", "-i", "127.0.0.1", "-p", str(port), *auth]
    proc = subprocess.Popen(
        [*cmd, "--disable-fallback", str(packages)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=engine_env.child_env(),  # marked: a killed run's server is stopped by the next run
    )
    url = f"http://127.0.0.1:{port}/simple/"
    try:
        deadline = time.monotonic() + 30
        while True:
            # Ours answers, not a stranger on the port: our process is alive and the answer is its kind.
            if proc.poll() is not None:
                raise RuntimeError(f"pypiserver exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("pypiserver did not answer within 30 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _contains(chunks: Iterator[bytes], needle: bytes) -> bool:
    tail = b""
    for chunk in chunks:
        if needle in tail + chunk:
            return True
        tail = chunk[-len(needle) :]
    return False


def test_a_private_index_authenticates_and_its_token_leaks_nowhere(tmp_path: Path) -> None:
    from passlib.apache import HtpasswdFile

    token = "tok-" + secrets.token_hex(12)
    wheelhouse = toolchain.torch_wheelhouse()
    private = tmp_path / "private"
    private.mkdir()
    for wheel in wheelhouse.glob("*.whl"):
        if wheel.name.split("-")[0] in BUILD_TOOLS:
            os.link(wheel, private / wheel.name)
    htpasswd = HtpasswdFile(str(tmp_path / "htpasswd"), new=True)
    htpasswd.set_password("fa", token)
    htpasswd.save()

    sdists = tmp_path / "sdists"
    sha = sha256_of(make_tiny_sdist(sdists, version=VERSION))
    (tmp_path / "compat.yaml").write_text(yaml.safe_dump({"flash_attn": {VERSION: {"sha256": sha}}}))
    image = "fa-images-test/private-index"
    entry_id = f"fa{VERSION}-py3.11-torch2.9.1-cu128"

    with (
        engine_env.docker_engine() as engine,
        pypiserver(private, htpasswd=tmp_path / "htpasswd") as private_url,
        pypiserver(wheelhouse, htpasswd=None) as open_url,
    ):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(private_url + "ninja/", timeout=10)
        assert refused.value.code == 401, "the private index must refuse a request without the credential"

        bases = engine_env.base_images(engine.client)
        engine_env.cuda_devel_standin(engine.client, bases.devel, toolchain.cuda_home())
        matrix = {
            "image": image,
            "bases": {"devel": engine_env.CUDA_STANDIN_TAG, "runtime": engine_env.RUNTIME_TAG, "python": "system"},
            "packages": {
                "index": private_url.replace("http://", f"http://fa:{token}@"),
                "torch_index": open_url,
                "sdists": "sdists",
            },
            "build": {"network": "host"},
            "compat": "compat.yaml",
            "entries": [{"python": "3.11", "torch": "2.9.1", "cuda": "12.8", "flash_attn": VERSION, "archs": ["80"]}],
        }
        (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
        env = engine.env(PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"))

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "fa_images", *args], cwd=tmp_path, env=env, capture_output=True, text=True
            )

        rendered = run("render", "--out", "dockerfiles")
        assert rendered.returncode == 0, rendered.stderr
        built = run("build", "--report", "report.json", "--no-check")
        try:
            assert built.returncode == 0, built.stderr[-4000:]
            report = json.loads((tmp_path / "report.json").read_text())
            assert report["entries"][0]["status"] == "ok"

            dockerfile = (tmp_path / "dockerfiles" / f"{entry_id}.Dockerfile").read_text()
            assert "--no-index --find-links /opt/fa-images/wheels ninja==" in dockerfile
            assert "fa:" not in dockerfile

            files = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent.name in ("dockerfiles", "logs")]
            files.append(tmp_path / "report.json")
            for path in files:
                assert token not in path.read_text(errors="replace"), f"the token leaked into {path}"
            assert token not in built.stdout + built.stderr + rendered.stdout + rendered.stderr

            for tag in (f"{image}:{entry_id}", f"{image}:{entry_id}-builder"):
                history = engine.client.api.history(tag)
                assert not any(token in (layer.get("CreatedBy") or "") for layer in history), tag
                assert not _contains(engine.client.images.get(tag).save(chunk_size=1 << 22), token.encode()), tag
        finally:
            for tag in (f"{image}:{entry_id}", f"{image}:{entry_id}-builder"):
                with contextlib.suppress(Exception):
                    engine.client.images.remove(tag, force=True)
            shutil.rmtree(tmp_path / "cache", ignore_errors=True)
