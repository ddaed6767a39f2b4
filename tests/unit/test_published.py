"""`build --published`: an entry current where the results live (a published dist/, the registry)
is not built, pulled or pushed again, so a CI runner that starts empty builds only what is new.

The engine is the fake one (its calls are counted, its registry is a dict); the index is a real
HTTP server on 127.0.0.1 serving a real dist/. The real registry's side is in
tests/engine/test_build_engine.py.
"""

from __future__ import annotations

import functools
import http.server
import io
import json
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import fakes
import pytest
from test_up_to_date import FakeEngine, OnePerPython, _wheels_accepted, builds, holding_the_bases  # noqa: F401 (autouse)

from fa_images.builder import dist as dist_dir
from fa_images.cli import main
from fa_images.errors import SourceError, UsageError
from fa_images.run import current, plan
from fa_images.run.executor import Options
from fa_images.run.logger import Console


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _Failing(_Quiet):
    def do_GET(self) -> None:
        self.send_error(503, "down for maintenance")


@pytest.fixture
def serve() -> Iterator:
    servers = []

    def start(directory: Path, handler: type = _Quiet) -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=directory))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def run(matrix, engine, tmp_path: Path, dist: str, *, push: bool = True, published=None):
    """As `build` plans and runs it: an entry whose wheel ``published`` serves is made around it."""
    out = io.StringIO()
    opts = Options(dist=tmp_path / dist, log_dir=tmp_path / "logs", published=published)
    final = {e.id: w for e in matrix.entries if published and (w := current.final(published, e.id))}
    _, results = fakes.execute(
        matrix, engine, opts, Console(out), builder=Remembering(engine), push=push, published=final
    )
    return results, out.getvalue()


class Runner(FakeEngine):
    """The fake engine, remembering the wheels each build's context carried (inputs/prebuilt/)."""

    def __init__(self) -> None:
        super().__init__()
        self.around: dict[str, dict[str, bytes]] = {}


class Remembering(OnePerPython):
    """Builds on a ``Runner``, recording in it the wheels each build's context carried."""

    def build(self, request, **kwargs):
        carried = request.context / "inputs" / "prebuilt"
        if isinstance(self.engine, Runner):
            self.engine.around[request.tag] = {p.name: p.read_bytes() for p in carried.glob("*.whl")}
        return super().build(request, **kwargs)


def a_runner(first: FakeEngine, matrix, *, bases: str = "1") -> Runner:
    """An engine that starts empty but for the bases (``bases``: their ids' generation), pointed at
    the first one's registry."""
    runner = Runner()
    for entry in matrix.entries:
        runner.held |= {entry.devel_image: f"sha256:devel-{bases}", entry.runtime_image: f"sha256:runtime-{bases}"}
    runner.registry = first.registry
    return runner


@pytest.fixture
def published_once(tiny_matrix, tmp_path: Path):
    """A first run that built, checked and pushed both entries into dist/."""
    first = holding_the_bases(tiny_matrix)
    results, _ = run(tiny_matrix, first, tmp_path, "dist")
    assert [r.status for r in results] == ["ok", "ok"]
    return first, results


def test_the_pushed_digest_is_recorded_with_the_inputs(published_once, tmp_path: Path) -> None:
    first, results = published_once
    records = dist_dir.read_manifest(tmp_path / "dist").wheels.values()
    assert sorted(r.pushed or "" for r in records) == sorted(first.registry[r.image] for r in results)
    assert all(r.inputs and len(r.inputs) == 64 for r in records)


def test_an_empty_runner_finds_both_in_the_index_and_the_registry(
    published_once, tiny_matrix, tmp_path: Path, serve
) -> None:
    first, results = published_once
    url = serve(tmp_path / "dist")
    runner = a_runner(first, tiny_matrix)
    index, notes = current.published(url)
    again, out = run(tiny_matrix, runner, tmp_path, "runner-dist", published=index)
    assert notes == [] and [r.status for r in again] == ["ok", "ok"] and all(r.up_to_date for r in again)
    assert builds(runner) == [] and not [c for c in runner.calls if c[0] in ("pull", "push")]
    assert [r.pushed for r in again] == [r.pushed for r in results]
    assert [r.wheel for r in again] == [url + quote(Path(r.wheel).name) for r in results]  # served there
    assert f"the wheel in {url}, the image in the registry at sha256:" in out
    assert out.count("(already in the registry)") == 2
    assert not (tmp_path / "runner-dist" / "manifest.json").exists()  # nothing fetched, nothing written


def test_a_published_directory_counts_as_an_index(published_once, tiny_matrix, tmp_path: Path) -> None:
    first, _ = published_once
    shutil.copytree(tmp_path / "dist", tmp_path / "shared")
    index, _ = current.published(str(tmp_path / "shared"))
    again, _ = run(tiny_matrix, a_runner(first, tiny_matrix), tmp_path, "runner-dist", published=index)
    assert all(r.up_to_date for r in again)


def test_an_image_pushed_over_in_the_registry_is_built_again(published_once, tiny_matrix, tmp_path: Path) -> None:
    first, _ = published_once
    runner = a_runner(first, tiny_matrix)
    runner.registry = dict(first.registry)
    moved = tiny_matrix.entries[0].image
    runner.registry[moved] = "sha256:" + "0" * 64  # another image under the same tag
    again, _ = run(tiny_matrix, runner, tmp_path, "runner-dist", published=current.DistDir(tmp_path / "dist"))
    assert [r.up_to_date for r in again] == [False, True]
    assert [c[2] for c in builds(runner) if c[0] == "build"] == [moved]


def test_a_registry_that_cannot_be_asked_costs_a_build_and_says_so(published_once, tiny_matrix, tmp_path: Path) -> None:
    first, _ = published_once
    runner = a_runner(first, tiny_matrix)
    runner.registry_down = True
    again, out = run(tiny_matrix, runner, tmp_path, "runner-dist", published=current.DistDir(tmp_path / "dist"))
    assert [r.status for r in again] == ["ok", "ok"] and not any(r.up_to_date for r in again)
    assert out.count("cannot ask the registry for reg.local/fa:") == 2


def test_without_push_the_image_must_be_in_the_engine(published_once, tiny_matrix, tmp_path: Path, serve) -> None:
    first, _ = published_once
    index, _ = current.published(serve(tmp_path / "dist"))
    runner = a_runner(first, tiny_matrix)
    again, _ = run(tiny_matrix, runner, tmp_path, "runner-dist", push=False, published=index)
    assert not any(r.up_to_date for r in again) and not [c for c in runner.calls if c[0] == "registry_digest"]
    # The engine that built them holds them with their inputs: current without any push.
    third, _ = run(tiny_matrix, first, tmp_path, "third-dist", push=False, published=index)
    assert all(r.up_to_date for r in third)


def test_a_wheel_the_page_serves_with_another_sha256_is_not_current(
    published_once, tiny_matrix, tmp_path: Path, serve
) -> None:
    first, _ = published_once
    page = tmp_path / "dist" / "simple" / "flash-attn" / "index.html"
    page.write_text(page.read_text().replace("#sha256=", "#sha256=0"), encoding="utf-8")
    index, _ = current.published(serve(tmp_path / "dist"))
    again, _ = run(tiny_matrix, a_runner(first, tiny_matrix), tmp_path, "runner-dist", published=index)
    assert not any(r.up_to_date for r in again)


def test_an_index_with_nothing_yet_builds_everything_and_says_so(tmp_path: Path, serve) -> None:
    (tmp_path / "empty").mkdir()
    url = serve(tmp_path / "empty")
    index, notes = current.published(url)
    assert notes == [f"published: {url} has no manifest.json yet: nothing there is current"]
    assert index.wheel("any", "0" * 64) is None


def test_an_index_that_cannot_be_read_stops_the_run(tmp_path: Path, serve) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(SourceError, match=r"manifest.json answered HTTP 503") as down:
        current.published(serve(tmp_path / "d", _Failing))
    assert down.value.exit_code == 4
    (tmp_path / "d" / "manifest.json").write_text("<html>not a manifest</html>")
    with pytest.raises(SourceError, match="not a JSON manifest"):
        current.published(serve(tmp_path / "d"))
    (tmp_path / "d" / "manifest.json").write_text(json.dumps({"schema_version": 1, "wheels": {"../x.whl": {}}}))
    with pytest.raises(SourceError, match="is not a wheel file name"):
        current.published(serve(tmp_path / "d"))
    with pytest.raises(SourceError, match=re.escape("cannot read http://127.0.0.1:9/manifest.json")):
        current.published("http://127.0.0.1:9/")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("https://user:tok3n@example.org/dist/", "holds a login"),
        ("ftp://example.org/dist/", "not an http(s)"),
        ("https://example.org/dist/?x=$(id)", "characters an index URL does not need"),
        ("no/such/dir", "not an http(s) URL or a directory"),
    ],
)
def test_a_bad_published_value_is_one_line(value: str, said: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^--published") as refused:
        current.published(value)
    assert said in str(refused.value) and "tok3n" not in str(refused.value)


def test_the_cli_refuses_a_bad_published_value_before_any_engine(
    tiny_matrix, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    code = main(["build", "--matrix", "matrix.yaml", "--published", "https://u:tok3n@example.org/"])
    err = capsys.readouterr().err
    assert code == 2 and [line for line in err.splitlines() if line.startswith("error:")] != []
    assert "tok3n" not in err and "holds a login" in err


def test_a_manifest_record_with_a_bad_pushed_digest_is_refused(tmp_path: Path) -> None:
    record = {"sha256": "a" * 64, "size": 1, "flash_attn": "2.8.3", "python": "3.11", "pushed": "sha256:xyz"}
    with pytest.raises(UsageError, match="pushed 'sha256:xyz' is not an image digest"):
        dist_dir.WheelRecord.from_dict(record, where="manifest")


def test_a_link_that_is_not_printable_is_not_served(published_once, tiny_matrix, tmp_path: Path, serve) -> None:
    """A page's href reaches the console and the report; one with ESC in it names no wheel."""
    first, _ = published_once
    page = tmp_path / "dist" / "simple" / "flash-attn" / "index.html"
    page.write_text(page.read_text().replace('href="../../', 'href="../../\x1b[31m'), encoding="utf-8")
    index, _ = current.published(serve(tmp_path / "dist"))
    again, out = run(tiny_matrix, a_runner(first, tiny_matrix), tmp_path, "runner-dist", published=index)
    assert not any(r.up_to_date for r in again) and "\x1b" not in out


def test_a_merged_record_never_pairs_one_run_s_image_with_another_s_inputs() -> None:
    base = {"sha256": "a" * 64, "size": 1, "flash_attn": "2.8.3", "python": "3.11"}
    old = dist_dir.WheelRecord.from_dict({**base, "inputs": "1" * 64, "pushed": "sha256:" + "2" * 64}, where="old")
    new = dist_dir.WheelRecord.from_dict({**base, "inputs": "3" * 64}, where="new")
    assert new.with_facts(old).pushed is None  # another run's image: not current for these inputs
    same = dist_dir.WheelRecord.from_dict({**base, "inputs": "1" * 64}, where="same")
    assert same.with_facts(old).pushed == "sha256:" + "2" * 64


# --- a published wheel is final: an entry not current has its image made around it ---------------


def test_a_published_wheel_is_never_compiled_again_its_image_is_made_around_it(
    published_once, tiny_matrix, tmp_path: Path, serve, capsys
) -> None:
    """Bases pulled anew (a new input, as a new fa-images is): no entry is current, and none
    compiles. Each image is made around the wheel the index serves, fetched and verified; the
    site then has nothing new to upload, and the next runner finds everything current."""
    first, results = published_once
    url = serve(tmp_path / "dist")
    index, _ = current.published(url)
    runner = a_runner(first, tiny_matrix, bases="2")
    again, out = run(tiny_matrix, runner, tmp_path, "runner-dist", published=index)
    assert [r.status for r in again] == ["ok", "ok"] and not any(r.up_to_date for r in again)
    assert all(r.prebuilt for r in again) and [r.wheel_sha256 for r in again] == [r.wheel_sha256 for r in results]
    for result in results:  # each build carried the published wheel, byte for byte, and compiled nothing
        name = Path(result.wheel or "").name
        assert runner.around[result.image] == {name: (tmp_path / "dist" / name).read_bytes()}
        assert f"{url}{quote(name)} (verified, sha256 {result.wheel_sha256[:12]}" in out
    dockerfiles = [c for c in runner.calls if c[0] == "build"]
    assert len(dockerfiles) == 2
    assert not [p for p in (tmp_path / "runner-dist").iterdir() if p.name.startswith(".")]  # the fetch is gone
    published = dist_dir.read_manifest(tmp_path / "dist").wheels
    records = dist_dir.read_manifest(tmp_path / "runner-dist").wheels
    assert records.keys() == published.keys()
    assert all(records[n].inputs != published[n].inputs and records[n].pushed for n in records)

    # The site takes the new records (the same bytes) and uploads nothing. It is served beside the
    # wheels: an index's links over http stay on its host.
    site = tmp_path / "dist" / "site"
    args = ["dist", "site", "--dist", str(tmp_path / "runner-dist"), "--out", str(site)]
    assert main([*args, "--wheel-url", url, "--published", url]) == 0
    assert capsys.readouterr().out == ""
    assert dist_dir.read_manifest(site).wheels == records

    third = a_runner(first, tiny_matrix, bases="2")
    done, _ = run(tiny_matrix, third, tmp_path, "third-dist", published=current.published(url + "site/")[0])
    assert all(r.up_to_date for r in done) and builds(third) == []


def test_a_published_wheel_that_is_not_the_recorded_one_fails_its_entry(
    published_once, tiny_matrix, tmp_path: Path, serve
) -> None:
    first, results = published_once
    url = serve(tmp_path / "dist")
    index, _ = current.published(url)
    swapped = tmp_path / "dist" / Path(results[0].wheel or "").name
    swapped.write_bytes(b"another wheel under the published name")
    runner = a_runner(first, tiny_matrix, bases="2")
    again, _ = run(tiny_matrix, runner, tmp_path, "runner-dist", published=index)
    assert [r.status for r in again] == ["failed", "ok"]
    assert again[0].failed_step == "source" and "sha256 mismatch" in (again[0].error or "")
    assert [c[2] for c in runner.calls if c[0] == "build"] == [results[1].image]
    assert sorted(p.name for p in (tmp_path / "runner-dist").glob("*.whl")) == [Path(results[1].wheel or "").name]
    assert not [p for p in (tmp_path / "runner-dist").iterdir() if p.name.startswith(".")]


def test_the_plan_names_the_published_wheel_it_makes_the_image_around(published_once, tiny_matrix, tmp_path) -> None:
    index = current.DistDir(tmp_path / "dist")
    final = {e.id: w for e in tiny_matrix.entries if (w := current.final(index, e.id))}
    (made,) = plan.make_plan(
        tiny_matrix.entries[:1], form="buildkit", compiler_cache=True, push=True, python_from="system", published=final
    )
    assert made.stages == plan.PREBUILT_STAGES and made.bases == (tiny_matrix.entries[0].runtime_image,)
    assert made.to_dict()["published"] == final[tiny_matrix.entries[0].id].location
    assert "(published: made around it, no compile)" in "\n".join(made.describe())


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("/srv/wheels", "'/srv/wheels' is not an http(s):// URL without a login"),
        ("file:///srv/wheels", "'file:///srv/wheels' is not an http(s):// URL without a login"),
        ("ftp://h/x", "'ftp://h/x' is not an http(s):// URL without a login"),
        ("https://u:t@h/x", "'https://***@h/x' holds a login; it must be an http(s):// URL without a login"),
    ],
)
@pytest.mark.parametrize("flag", ["--wheel-url", "--published"])
def test_dist_site_says_its_one_rule_for_urls_the_same_way_in_help_and_errors(flag, value, said, tmp_path, capsys):
    """Issue 43: a folder was refused as "not an http(s):// or file:// URL", then file:// as "not http(s)"."""
    from fa_images import cli
    from fa_images.config import grammar

    urls = {"--wheel-url": "https://h/w/", flag: value}
    args = ["dist", "site", "--out", str(tmp_path / "site")] + [part for item in urls.items() for part in item]
    assert cli.main(args) == 2
    assert capsys.readouterr().err.splitlines()[0] == f"error: {flag}: {said}"
    assert not (tmp_path / "site").exists()
    with pytest.raises(SystemExit):
        cli.main(["dist", "site", "--help"])
    assert " ".join(capsys.readouterr().out.split()).count(grammar.PUBLIC_URL_RULE) == 2
