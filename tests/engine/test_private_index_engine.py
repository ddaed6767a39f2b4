"""A build that needs a private index's credential, and leaks it nowhere.

A real pypiserver with an htpasswd file serves the build tools and flash-attn's runtime
dependencies only to ``fa:<token>``; the tests' open index serves torch, so the entry stands on
the torch stage every other module built. `fa-images build` must still build the entry, and the
token must appear in no rendered Dockerfile, build context, log, report, image history, or layer
above that torch stage (the layers below it are the other modules', made without the token).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
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
VERSION = "2.8.3.dev6"
# Every build tool the compat table pins (a wheel's name starts with the distribution's name).
BUILD_TOOLS = {Requirement(pin).name.replace("-", "_") for pin in compat.load().build_tools}


def _contains(chunks: Iterator[bytes], needle: bytes) -> bool:
    tail = b""
    for chunk in chunks:
        if needle in tail + chunk:
            return True
        tail = chunk[-len(needle) :]
    return False


def _layer_dirs(client, image: str, below: str) -> list[Path] | None:
    """The files of each layer of ``image`` above the image ``below`` (its base), where the engine
    keeps them as overlay2 dirs on this host; None where it does not (then the whole image is read)."""
    driver = client.images.get(image).attrs.get("GraphDriver") or {}
    if driver.get("Name") != "overlay2":
        return None
    data = driver["Data"]
    dirs = [Path(data["UpperDir"]), *(Path(p) for p in (data.get("LowerDir") or "").split(":") if p)]
    above = len(client.images.get(image).attrs["RootFS"]["Layers"]) - len(
        client.images.get(below).attrs["RootFS"]["Layers"]
    )
    return dirs[:above] if all(d.is_dir() for d in dirs) else None


def _holds(paths: list[Path], needle: bytes) -> list[Path]:
    return [
        p
        for d in paths
        for p in d.rglob("*")
        if p.is_file() and not p.is_symlink() and _contains(iter([p.read_bytes()]), needle)
    ]


def test_a_private_index_authenticates_and_its_token_leaks_nowhere(tmp_path: Path, stock: engine_env.Stock) -> None:
    from passlib.apache import HtpasswdFile

    token = "tok-" + secrets.token_hex(12)
    wheelhouse = toolchain.torch_wheelhouse()
    private = tmp_path / "private"
    private.mkdir()
    wanted = BUILD_TOOLS | {Requirement(pin).name.replace("-", "_") for pin in compat.load().runtime_deps}
    for wheel in wheelhouse.glob("*.whl"):
        if wheel.name.split("-")[0] in wanted:
            os.link(wheel, private / wheel.name)
    htpasswd = HtpasswdFile(str(tmp_path / "htpasswd"), new=True)
    htpasswd.set_password("fa", token)
    htpasswd.save()

    sdists = tmp_path / "sdists"
    sha = sha256_of(make_tiny_sdist(sdists, version=VERSION))
    (tmp_path / "compat.yaml").write_text(yaml.safe_dump({"flash_attn": {VERSION: {"sha256": sha}}}))
    image = "fa-images-test/private-index"
    entry_id = f"fa{VERSION}-py3.11-torch2.9.1-cu128"
    engine = stock.engine

    with engine_env.pypi_server([private], htpasswd=tmp_path / "htpasswd") as private_url:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(private_url + "ninja/", timeout=10)
        assert refused.value.code == 401, "the private index must refuse a request without the credential"

        matrix = {
            "image": image,
            "bases": stock.bases(),
            "packages": stock.packages(index=private_url.replace("http://", f"http://fa:{token}@")),
            "build": {"network": "host"},
            "compat": "compat.yaml",
            "entries": [{"python": "3.11", "torch": "2.9.1", "cuda": "12.8", "flash_attn": VERSION, "archs": ["80"]}],
        }
        (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
        env = engine.env(PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"), TMPDIR=str(tmp_path))

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "fa_images", *args], cwd=tmp_path, env=env, capture_output=True, text=True
            )

        rendered = run("render", "--out", "dockerfiles")
        assert rendered.returncode == 0, rendered.stderr
        built = run("build", "--report", "report.json", "--no-check", "--keep-work")
        try:
            assert built.returncode == 0, built.stderr[-4000:]
            report = json.loads((tmp_path / "report.json").read_text())
            (entry,) = report["entries"]
            assert entry["status"] == "ok"

            dockerfile = (tmp_path / "dockerfiles" / f"{entry_id}.Dockerfile").read_text()
            assert "--no-index --find-links /opt/fa-images/wheels/tools ninja==" in dockerfile
            assert f"RUN pip install --index-url {stock.index} torch==2.9.1\n" in dockerfile
            assert "fa:" not in dockerfile

            # The kept build context: the wheels fetched with the token, and no token.
            (context,) = tmp_path.glob("fa-images-context-*")
            assert sorted(p.name for p in (context / "inputs" / "wheels").iterdir()) == ["tools"]
            files = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent.name in ("dockerfiles", "logs")]
            files += [p for p in context.rglob("*") if p.is_file()]
            files.append(tmp_path / "report.json")
            for path in files:
                assert token.encode() not in path.read_bytes(), f"the token leaked into {path}"
            assert token not in built.stdout + built.stderr + rendered.stdout + rendered.stderr

            torch_stage = entry["torch_stage"]
            for tag in (f"{image}:{entry_id}", f"{image}:{entry_id}-builder"):
                history = engine.client.api.history(tag)
                assert not any(token in (layer.get("CreatedBy") or "") for layer in history), tag
            # Every layer this build added above the shared torch stage, the runtime's and the
            # builder's (which stands on that stage: one base is devel and runtime here).
            runtime = _layer_dirs(engine.client, f"{image}:{entry_id}", torch_stage)
            builder = _layer_dirs(engine.client, f"{image}:{entry_id}-builder", torch_stage)
            if runtime is None or builder is None:  # not overlay2 on this host: the whole images
                for tag in (f"{image}:{entry_id}", f"{image}:{entry_id}-builder"):
                    assert not _contains(engine.client.images.get(tag).save(chunk_size=1 << 22), token.encode()), tag
            else:
                assert len(runtime) == 1 and len(builder) >= 5
                assert _holds(runtime + builder, token.encode()) == []
                # The search can find what it looks for: the einops it installed is in the runtime layer.
                assert _holds(runtime, b"einops")
        finally:
            for tag in (f"{image}:{entry_id}", f"{image}:{entry_id}-builder"):
                with contextlib.suppress(Exception):
                    engine.client.images.remove(tag, force=True)
            shutil.rmtree(tmp_path / "cache", ignore_errors=True)
