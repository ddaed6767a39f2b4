"""Fakes for the fast tests of error paths. Every real path has its own test on a real engine."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from fa_images.builder import contract, verify
from fa_images.builder.verify import WheelReport
from fa_images.config.grammar import BuilderForm
from fa_images.errors import StepFailed
from fa_images.run.engine import ImageInfo, PullProgress, RunResult
from fa_images.run.image_builder import (
    BuildProgress,
    BuildRequest,
    BuildResult,
    noting_a_miss,
    refuse_unsupported,
)

WHEEL = "flash_attn-2.8.3+cu128torch2.9cxx11abitrue-cp312-cp312-linux_x86_64.whl"


class FakeEngine:
    def __init__(
        self,
        *,
        fail_build: frozenset[str] | set[str] = frozenset(),
        fail_push: bool = False,
        gpu: bool = False,
        gpu_exit: int = 0,
        interrupt_on: str | None = None,
        missing: frozenset[str] = frozenset(),
        unpullable: frozenset[str] = frozenset(),
        lacking: dict[str, set[str]] | None = None,
        gpu_output: list[str] | None = None,
        gpuless_exit: int = 0,
    ) -> None:
        self.fail_build, self.fail_push, self.gpu, self.gpu_exit = fail_build, fail_push, gpu, gpu_exit
        # What the GPU check prints with a GPU, and how it exits in a container without one.
        self.gpu_output, self.gpuless_exit = gpu_output, gpuless_exit
        self.interrupt_on, self.missing = interrupt_on, set(missing)
        # Bases a pull cannot get (no registry, no login, no such tag), and what a base lacks
        # when the preflight looks into it: ref -> {"python3.11", "nvcc"}.
        self.unpullable, self.lacking = unpullable, lacking or {}
        self.nvcc = "12.8"  # the release every devel base's nvcc reports
        self.calls: list[tuple] = []
        self.memory_limits: list[int | None] = []  # what each build call was limited to
        self.labels: dict[str, dict[str, str]] = {}  # the labels each tag was built with
        # Per build of a runtime image: the files of the compiler cache its context carried.
        self.cache_in_context: dict[str, dict[str, str]] = {}
        self.fail_cache_export = False
        self.fail_cache_in = False  # BuildKit's form: the build of compiler-cache-in fails
        # Images the engine holds that no build made (the bases): ref -> image id.
        self.held: dict[str, str] = {}
        # What the registry serves (ref -> digest), as pushes left it; asking it can fail.
        self.registry: dict[str, str] = {}
        self.registry_down = False
        self.product_name = "Docker Engine"  # what the engine says it is (Podman names itself)
        self.tagged: dict[str, str] = {}  # ref -> the image id a tag() gave it

    def describe(self) -> str:
        return "fake engine"

    def product(self) -> str:
        return self.product_name

    def has_gpu_runtime(self) -> bool:
        return self.gpu

    def tag(self, image: str, ref: str) -> None:
        self.calls.append(("tag", image, ref))
        self.labels[ref] = {}
        self.tagged[ref] = image
        self.missing.discard(ref)

    def forget(self, ref: str) -> None:
        """What removing an image does: the engine no longer holds it."""
        self.labels.pop(ref, None)
        self.held.pop(ref, None)
        self.tagged.pop(ref, None)
        self.missing.add(ref)

    def run(self, image, command, *, gpu, keep, on_line) -> RunResult:
        if command and command[:2] == ["sh", "-c"] and "command -v" in command[2]:  # the base preflight's probe
            return self._probe(image, command[2])
        if command and command[:2] == ["sh", "-c"]:  # a script of echo and exit, as sh runs it
            return self._script(command[2], keep=keep, on_line=on_line)
        self.calls.append(("run", image, tuple(command or ()), gpu))
        gpu_check = tuple(command or ()) == contract.GPU_CHECK_COMMAND
        code = self.gpu_exit if gpu else (self.gpuless_exit if gpu_check else 0)
        lines = ["flash_attn imports"] + (self.gpu_output or [] if gpu and gpu_check else [])
        for line in lines:
            on_line(line)
        return RunResult(code, lines, kept_container="fa-images-kept" if keep and code else None)

    def push(self, ref, on_line) -> str:
        self.calls.append(("push", ref))
        if self.fail_push:
            raise StepFailed(f"push of {ref} failed: connection refused")
        self.registry[ref] = "sha256:" + hashlib.sha256(f"{ref} {self.labels.get(ref)}".encode()).hexdigest()
        return self.registry[ref]

    def registry_digest(self, ref: str) -> str | None:
        self.calls.append(("registry_digest", ref))
        if self.registry_down:
            raise StepFailed(f"asking the registry for {ref}: the engine refused: connection refused")
        return self.registry.get(ref)

    def image_info(self, ref: str) -> ImageInfo | None:
        self.calls.append(("image_info", ref))
        if ref in self.labels:
            return ImageInfo(
                labels=self.labels[ref], size=7_000_000_000, id=self.tagged.get(ref, f"sha256:id-of-{ref}")
            )
        return ImageInfo(labels={}, size=1, id=self.held[ref]) if ref in self.held else None

    def missing_images(self, refs: list[str]) -> list[str]:
        self.calls.append(("missing_images", tuple(refs)))
        return [r for r in refs if r in self.missing]

    def pull(self, ref: str, on_progress) -> ImageInfo:
        self.calls.append(("pull", ref))
        if ref in self.unpullable:
            raise StepFailed(f"pull of {ref} failed: manifest unknown")
        for status in ("Pulling fs layer", "Downloading", "Pull complete"):
            on_progress(PullProgress("0123456789ab", status, 10_000_000, 20_000_000))
        self.missing.discard(ref)
        self.held[ref] = f"sha256:pulled-{ref}"
        return ImageInfo(labels={}, size=1_000_000, id=self.held[ref])

    def _script(self, script: str, *, keep: bool, on_line) -> RunResult:
        lines, code = [], 0
        for step in (s.strip() for s in script.split(";")):
            if step.startswith("echo "):
                lines.append(step.removeprefix("echo "))
                on_line(lines[-1])
            elif step.startswith("exit "):
                code = int(step.removeprefix("exit "))
                break
        return RunResult(code, lines, kept_container="fa-images-kept" if keep and code else None)

    def _probe(self, image: str, script: str) -> RunResult:
        """What a base holds, as the preflight's script prints it."""
        self.calls.append(("probe", image))
        lacking = self.lacking.get(image, set())
        lines = [
            f"fa-images-probe {name}=/usr/bin/{name}"
            for name in re.findall(r"command -v '?(python3\.\d+)", script)
            if name not in lacking
        ]
        if "nvcc" in script and "nvcc" not in lacking:
            lines.append(f"fa-images-probe nvcc=Cuda compilation tools, release {self.nvcc}, V{self.nvcc}.1")
        return RunResult(0, lines)

    def debug_command(self, container: str) -> str:
        return f"fake-engine enter {container}"


class FakeBuilder:
    """The image builder's side of a fake run, held to ``ImageBuilder``'s contract: the contract
    suite (tests/builder_contract.py) runs over it and, on the tests' engine, over both real
    builders. It refuses what a builder of its form cannot do (``image_builder.unsupported``),
    builds the stages of ``before`` first (a best-effort one's failure noted, not raised), tags,
    and writes files. What it did goes into its engine's ``calls``; the faults it plays are the
    engine's knobs (``fail_build``, ``interrupt_on``, ``fail_cache_export``)."""

    def __init__(self, engine: FakeEngine, form: BuilderForm = "buildkit") -> None:
        self.engine, self._form = engine, form
        self.requests: list[BuildRequest] = []

    @property
    def form(self) -> BuilderForm:
        return self._form

    def describe(self) -> str:
        return f"a fake builder of the {self._form} form"

    def build(self, request: BuildRequest, *, on_line, on_progress) -> BuildResult:
        """One request: its first stages, the target, its stages tagged and its files written."""
        engine, context, target, tag = self.engine, request.context, request.target, request.tag
        refuse_unsupported(self, request)
        assert (context / "Dockerfile").is_file() and (context / "fa_images" / "builder" / "build.py").is_file()
        self.requests.append(request)
        entry = (tag or "").rsplit(":", 1)[-1] or "wheel"
        names = [line.split()[3] for line in (context / "Dockerfile").read_text().splitlines() if " AS " in line]
        missed: dict[str, str] = {}
        for stage in request.before:
            assert stage in names, f"no stage {stage} in the Dockerfile"
            engine.calls.append(("before", stage, "anew" if stage in request.anew else "cached"))
            with noting_a_miss(request, stage, missed):
                if stage == contract.CACHE_IN_STAGE and engine.fail_cache_in:
                    raise StepFailed(f"building {stage} failed: connection reset")
        engine.calls.append(("build", target, tag))
        engine.memory_limits.append(request.memory)
        engine.labels[tag] = dict(request.labels)
        on_progress(BuildProgress(9, 21, "RUN python -m fa_images.builder wheel", "builder"))
        on_line("compiling")
        if target == contract.RUNTIME_STAGE:
            # A compile of 4 kernels: as many from the cache as the context's cache holds objects.
            cache = context / contract.CACHE_CONTEXT_DIR
            seen = {p.relative_to(cache).as_posix(): p.read_text() for p in cache.rglob("*") if p.is_file()}
            engine.cache_in_context[tag or ""] = seen
            on_line(contract.cache_stats_line(min(len(seen), 4), 4))
        if engine.interrupt_on and engine.interrupt_on in (tag or ""):
            raise KeyboardInterrupt
        if any(f in (tag or "") for f in engine.fail_build):
            raise StepFailed(
                "step 9/21 (RUN python -m fa_images.builder …) exited with 5: error: boom",
                lines=["x.cu:1:2: error: boom"],
            )
        # The one build makes every stage of the Dockerfile; the legacy builder's stream names each one's image.
        stages = {stage: f"sha256:{entry}-{stage}" for stage in names}
        for stage, ref in request.stage_tags.items():
            engine.tag(stages[stage], ref)
        for stage, dest in request.files.items():
            with noting_a_miss(request, stage, missed):
                self._files(stages[stage], stage, dest)
        known = stages if self._form == "sdk" else {}  # BuildKit names no stage's image
        return BuildResult(f"sha256:{entry}-{target}", known, missed=missed)

    def _files(self, image: str, stage: str, dest: Path) -> None:
        engine = self.engine
        if stage == contract.WHEEL_STAGE:
            engine.calls.append(("export", image))
            (dest / WHEEL).write_bytes(b"not really a wheel")
            (dest / "manifest.json").write_text("{}")
            return
        engine.calls.append(("export_dir", image, contract.CACHE_EXPORT_DIR))
        if engine.fail_cache_export:
            (dest / "half-written").write_text("")
            raise StepFailed(f"exporting the files of {image} failed: connection reset")
        cache = dest / contract.CACHE_EXPORT_DIR.lstrip("/")
        (cache / "0").mkdir(parents=True)
        (cache / "0" / "object").write_text(f"compiled in {image}")


def accept_every_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_inspect(path: Path, **_kw) -> WheelReport:
        report = WheelReport(wheel=path.name, sha256="ab" * 32)
        report.add("fake", "pass", "accepted by the test")
        return report

    monkeypatch.setattr(verify, "inspect_wheel", fake_inspect)


def use_engine(monkeypatch: pytest.MonkeyPatch, engine: FakeEngine, builder: type[FakeBuilder] = FakeBuilder) -> None:
    """Every engine the CLI connects to is ``engine``, and its image builder a ``builder`` of the form
    the run decided (the real decision, from the unit tier's docker CLI stub and ``engine.product``)."""
    from fa_images.run import connect
    from fa_images.run.engine import DockerEngine

    monkeypatch.setattr(DockerEngine, "from_env", classmethod(lambda cls: engine))
    monkeypatch.setattr(connect, "builder_for", lambda decision, docker, cli: builder(docker, decision.form))


def execute(matrix, engine: FakeEngine, options, console, *, entries=None, builder=None, **plan_kw):
    """Plans ``entries`` (default: every entry) as `build` does, for the builder's form (a
    ``FakeBuilder`` of BuildKit's, the default builder's, unless given) and with the compiler cache
    where ``options`` keeps one; then runs that plan on the fake. (plans, results)."""
    from fa_images.run import plan
    from fa_images.run.executor import Executor

    builder = builder or FakeBuilder(engine)
    plans = plan.make_plan(
        matrix.entries if entries is None else entries,
        form=builder.form,
        compiler_cache=options.compiler_cache is not None,
        **{"python_from": matrix.bases.python, **plan_kw},
    )
    return plans, Executor(engine, builder, matrix, options, console).run(plans)
