"""The fa-images an exported workflow installs: the one that wrote it, pinned (PEP 610's install
record, read from real dist-info folders), `.` only in its own source, refused where neither is
known (issue 43, item 1)."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from fa_images import cli
from fa_images.errors import UsageError
from fa_images.outputs.exports import this_install

REPO = Path(__file__).resolve().parents[2]
COMMIT = "4f1e2d3c" * 5


def installed(tmp_path: Path, monkeypatch, version: str = "1.4.0", record: dict | str | None = None) -> None:
    """fa-images as pip leaves it in site-packages: a dist-info with METADATA and, for a direct
    install, direct_url.json; importlib.metadata reads it as it reads any installed project."""
    info = tmp_path / "site" / f"fa_images-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fa-images\nVersion: {version}\n")
    if record is not None:
        (info / "direct_url.json").write_text(record if isinstance(record, str) else json.dumps(record))
    dist = importlib.metadata.PathDistribution(info)
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: dist)


def test_its_own_repository_installs_dot() -> None:
    assert this_install.this_fa_images(REPO) == "."


@pytest.mark.parametrize(
    ("record", "spec"),
    [
        (None, "fa-images==1.4.0"),  # from an index: the same version from it
        (
            {"url": "https://github.com/acme/fa-images", "vcs_info": {"vcs": "git", "commit_id": COMMIT}},
            f"git+https://github.com/acme/fa-images@{COMMIT}",
        ),
        (
            {
                "url": "https://github.com/acme/fa-images",
                "vcs_info": {"vcs": "git", "requested_revision": "main", "commit_id": COMMIT},
            },
            f"git+https://github.com/acme/fa-images@{COMMIT}",  # the commit, never the branch it was then
        ),
    ],
    ids=["index", "git", "git branch"],
)
def test_another_repository_installs_this_fa_images_pinned(tmp_path, monkeypatch, record, spec) -> None:
    installed(tmp_path, monkeypatch, record=record)
    assert this_install.this_fa_images(tmp_path) == spec


@pytest.mark.parametrize(
    ("record", "says"),
    [
        (
            {"url": "file:///home/me/fa-images", "dir_info": {"editable": True}},
            "file:///home/me/fa-images, which a runner cannot reach",
        ),
        ({"url": "file:///tmp/fa_images-1.4.0.tar.gz", "archive_info": {}}, "which a runner cannot reach"),
        (
            {"url": "https://me:tok@git.example/fa-images", "vcs_info": {"vcs": "git", "commit_id": COMMIT}},
            "https://***@git.example/fa-images, which is not a URL a runner can clone without a credential",
        ),
        (
            {"url": "https://git.example/fa-images?access_key=tok", "vcs_info": {"vcs": "git", "commit_id": COMMIT}},
            "access_key=***, which is not a URL a runner can clone",
        ),
        ({"url": "-e", "vcs_info": {"vcs": "git", "commit_id": COMMIT}}, "installed from -e, which is not a URL"),
        ({"url": "", "vcs_info": {"vcs": "git", "commit_id": COMMIT}}, "which is not a URL a runner can clone"),
        ({"url": "file:///srv/fa-images", "vcs_info": {"vcs": "git", "commit_id": COMMIT}}, "which is not a URL"),
        ({"url": "https://github.com/acme/fa-images", "vcs_info": {"vcs": "git", "commit_id": ""}}, "names commit ''"),
        (
            {"url": "https://github.com/acme/fa-images", "vcs_info": {"vcs": "git", "commit_id": "--upgrade"}},
            "names commit '--upgrade', not a full git hash",
        ),
        (
            {"url": "https://github.com/acme/fa-images", "vcs_info": {"vcs": "git", "commit_id": "abc1234"}},
            "not a full",
        ),
        ("{not json", "install record (direct_url.json) cannot be read"),
        ({"vcs_info": {}}, "install record (direct_url.json) cannot be read"),
    ],
    ids=[
        "editable checkout",
        "local archive",
        "login in the URL",
        "token in the query",
        "option as url",
        "empty url",
        "file url",
        "empty commit",
        "option as commit",
        "short commit",
        "damaged record",
        "no url",
    ],
)
def test_an_install_no_runner_can_repeat_is_refused_naming_install(tmp_path, monkeypatch, record, says) -> None:
    installed(tmp_path, monkeypatch, record=record)
    with pytest.raises(UsageError) as caught:
        this_install.this_fa_images(tmp_path)
    assert says in caught.value.message and "tok" not in caught.value.message
    assert "--install" in (caught.value.hint or "")


def test_the_exported_workflow_installs_the_pinned_fa_images(tmp_path, monkeypatch, capsys) -> None:
    installed(tmp_path, monkeypatch, record={"url": "https://github.com/acme/fa-images",
                                             "vcs_info": {"vcs": "git", "commit_id": COMMIT}})  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert cli.main(["export", "github", "--matrix", str(REPO / "matrix.yaml"), "--out", "wf.yml"]) == 0
    text = (tmp_path / "wf.yml").read_text()
    assert f"python -m pip install git+https://github.com/acme/fa-images@{COMMIT}\n" in text
    assert "pip install .\n" not in text
    installed(tmp_path / "local", monkeypatch, record={"url": "file:///x", "dir_info": {}})
    assert cli.main(["export", "github", "--matrix", str(REPO / "matrix.yaml"), "--out", "wf2.yml"]) == 2
    assert "error: this fa-images 1.4.0 was installed from file:///x" in capsys.readouterr().err
    assert not (tmp_path / "wf2.yml").exists()
    assert cli.main(["export", "github", "--matrix", str(REPO / "matrix.yaml"), "--out", "wf2.yml",
                     "--install", "fa-images==1.4.0"]) == 0  # fmt: skip


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_an_install_record_that_is_no_plain_small_file_is_refused_at_once(tmp_path, monkeypatch, kind: str) -> None:
    """A FIFO is never opened for reading (it would wait for a writer forever); a 2 GB record is
    never read whole: one line, bounded time and memory."""
    import os

    installed(tmp_path, monkeypatch)
    record = next((tmp_path / "site").glob("*.dist-info")) / "direct_url.json"
    if kind == "fifo":
        os.mkfifo(record)
    else:
        with open(record, "wb") as f:
            f.truncate(2 << 30)  # sparse: 2 GiB that take no disk
    with pytest.raises(UsageError) as caught:
        this_install.this_fa_images(tmp_path)
    assert ("a FIFO" if kind == "fifo" else "larger than") in caught.value.message


@pytest.mark.parametrize(
    "value", ["", "--", "-e", "--upgrade", "https://host/x?token=SECRETX", "https://h/x.whl?X-Amz-Signature=SECRETX"]
)
def test_an_install_value_that_is_no_install_target_writes_nothing(tmp_path, monkeypatch, capsys, value: str) -> None:
    monkeypatch.chdir(tmp_path)
    code = cli.main(
        ["export", "github", "--matrix", str(REPO / "matrix.yaml"), "--out", "wf.yml", f"--install={value}"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "SECRETX" not in err
    assert not (tmp_path / "wf.yml").exists()
