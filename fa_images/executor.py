"""Carries out a build plan through an ``Engine``: for each entry, fetch the source,
build and tag the image, export and verify the wheel, check the image, push.

One entry's failure does not stop the others (unless fail-fast). Wheels reach ``dist/``
only after verification, by an atomic rename, so an interrupted or failed run never leaves
a partial wheel, and a later ``--only`` run adds to what is there.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import context
from .builder.verify import inspect_wheel
from .engine import BuildProgress, Engine, StepFailed
from .errors import FatalError
from .logger import Console, EntryLog, duration
from .matrix import Entry, Matrix
from .plan import EntryPlan

GPU_CHECK = ["python", "-m", "fa_images.builder", "check"]
NO_GPU_EXIT = 3


@dataclass(frozen=True, kw_only=True)
class Options:
    dist: Path = Path("dist")
    log_dir: Path = Path("logs")
    push: bool = False
    check: bool = True
    fail_fast: bool = False
    keep_container: bool = False


@dataclass
class EntryResult:
    id: str
    image: str
    status: str = "not run"  # ok | failed | interrupted | not run
    failed_step: str | None = None
    error: str | None = None
    image_id: str | None = None
    wheel: str | None = None
    wheel_sha256: str | None = None
    check: str = "not run"
    gpu_check: str = "not run"
    pushed: str | None = None  # the digest
    kept_container: str | None = None
    log: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class Executor:
    def __init__(self, engine: Engine, matrix: Matrix, options: Options, console: Console) -> None:
        self.engine, self.matrix, self.options, self.console = engine, matrix, options, console
        self.results: list[EntryResult] = []

    def run(self, plans: list[EntryPlan]) -> list[EntryResult]:
        self.results = results = [EntryResult(id=p.entry.id, image=p.entry.image) for p in plans]
        for index, (plan, result) in enumerate(zip(plans, results), start=1):
            self.console.line(f"[{index}/{len(plans)}] {plan.entry.id}  ({', '.join(plan.step_names())})")
            try:
                self._run_entry(plan, result, f"[{index}/{len(plans)}] {plan.entry.id}")
            except KeyboardInterrupt:
                result.status, result.error = "interrupted", "interrupted by Ctrl-C"
                raise
            if result.status == "failed" and self.options.fail_fast:
                self.console.line("stopping: --fail-fast")
                break
        return results

    def _run_entry(self, plan: EntryPlan, result: EntryResult, label: str) -> None:
        entry = plan.entry
        log = EntryLog((self.options.log_dir / f"{entry.id}.log").resolve())
        result.log = str(log.path)
        try:
            for name in plan.step_names():
                result.failed_step = name
                started = time.monotonic()
                with self.console.step(name) as info:
                    getattr(self, "_" + name.replace("-", "_"))(entry, result, info, log, label)
                result.seconds[name] = round(time.monotonic() - started, 1)
            result.status, result.failed_step = "ok", None
        except FatalError as exc:
            result.status, result.error = "failed", str(exc)
            lines = getattr(exc, "lines", [])
            self.console.line(f"    {exc}")
            for line in lines[-8:]:
                self.console.line(f"    | {line}")
            self.console.line(f"    full log: {log.path}")
            log.write(f"fa-images: {result.failed_step} failed: {exc}")
        finally:
            log.close()

    # Each step below is named after its plan step ("gpu-check" -> _gpu_check).

    def _source(self, entry: Entry, result: EntryResult, info: dict, log: EntryLog, label: str) -> None:
        self._sdist = context.fetch_sdist(self.matrix, entry)
        info["note"] = self._sdist.name

    def _build(self, entry: Entry, result: EntryResult, info: dict, log: EntryLog, label: str) -> None:
        started = time.monotonic()
        state: dict = {"progress": None, "last": ""}

        def show() -> None:
            p: BuildProgress | None = state["progress"]
            where = f"{p.stage or '?'} · step {p.step}/{p.total}" if p else "starting"
            self.console.progress(
                f"    {label} · {where} · {duration(time.monotonic() - started)} · {state['last'][:100]}",
                key=(p.step if p else 0,),
            )

        def on_line(line: str) -> None:
            log.write(line)
            state["last"] = line.strip()
            show()

        def on_progress(progress: BuildProgress) -> None:
            state["progress"] = progress

        with tempfile.TemporaryDirectory(prefix="fa-images-context-") as tmp:
            ctx = context.assemble(self.matrix, entry, self._sdist, Path(tmp))
            result.image_id = self.engine.build(context=ctx, target="runtime", tag=entry.image,
                                               network=self.matrix.build.network, on_line=on_line, on_progress=on_progress)
            # The export stage reuses the builder's cached layers: seconds, not another compile.
            self._wheel_image = self.engine.build(context=ctx, target="wheel", tag=None, network=self.matrix.build.network,
                                                  on_line=log.write, on_progress=lambda _p: None)
        info["note"] = f"{entry.image} ({result.image_id[:19]})"

    def _export(self, entry: Entry, result: EntryResult, info: dict, log: EntryLog, label: str) -> None:
        dist = self.options.dist
        dist.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.id}-", dir=dist))
        try:
            files = self.engine.export(self._wheel_image, staging)
            wheels = [f for f in files if f.suffix == ".whl"]
            if len(wheels) != 1:
                raise StepFailed(f"the wheel stage holds {len(wheels)} wheels, expected one: {[f.name for f in files]}")
            report = inspect_wheel(wheels[0], expect_python=entry.python, expect_cxx11_abi=entry.cxx11_abi,
                                   expect_archs=entry.archs, import_check=False)
            for line in report.lines():
                log.write(line)
            if not report.ok:
                raise StepFailed(f"{wheels[0].name} failed verification: " + "; ".join(report.problems()))
            final = dist / wheels[0].name
            os.replace(wheels[0], final)  # same filesystem: atomic
            result.wheel, result.wheel_sha256 = str(final.resolve()), report.sha256
            update_manifest(dist, final, report.sha256, entry)
            info["note"] = f"{final} ({final.stat().st_size / 1e6:.1f} MB, sha256 {report.sha256[:12]}…)"
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _check(self, entry: Entry, result: EntryResult, info: dict, log: EntryLog, label: str) -> None:
        run = self.engine.run(entry.image, None, gpu=False, keep=self.options.keep_container, on_line=log.write)
        self._after_run(run, result, "import check")
        result.check = "passed"
        info["note"] = run.output[-1] if run.output else ""

    def _gpu_check(self, entry: Entry, result: EntryResult, info: dict, log: EntryLog, label: str) -> None:
        if not self.engine.has_gpu_runtime():
            result.gpu_check = "skipped: the engine has no GPU runtime"
            info["note"], info["skipped"] = result.gpu_check, True
            return
        run = self.engine.run(entry.image, GPU_CHECK, gpu=True, keep=self.options.keep_container, on_line=log.write)
        if run.exit_code == NO_GPU_EXIT:
            result.gpu_check = "skipped: no GPU visible in the container"
            info["note"], info["skipped"] = result.gpu_check, True
            return
        self._after_run(run, result, "GPU check")
        result.gpu_check = "passed"
        info["note"] = run.output[-1] if run.output else ""

    def _after_run(self, run, result: EntryResult, what: str) -> None:
        if run.exit_code == 0:
            return
        result.kept_container = run.kept_container
        hint = f"; kept container {run.kept_container}: docker start -ai {run.kept_container}" if run.kept_container else ""
        raise StepFailed(f"{what} exited with {run.exit_code}{hint}", lines=run.output[-20:])

    def _push(self, entry: Entry, result: EntryResult, info: dict, log: EntryLog, label: str) -> None:
        result.pushed = self.engine.push(entry.image, on_line=log.write)
        info["note"] = f"{entry.image}@{result.pushed}"


def update_manifest(dist: Path, wheel: Path, sha256: str, entry: Entry) -> None:
    """dist/manifest.json: one record per wheel, merged with earlier runs, written atomically."""
    path = dist / "manifest.json"
    data = json.loads(path.read_text()) if path.is_file() else {"wheels": {}}
    data["wheels"][wheel.name] = {
        "sha256": sha256, "size": wheel.stat().st_size, "entry": entry.id, "image": entry.image,
        "flash_attn": entry.flash_attn, "python": entry.python, "torch": entry.torch, "cuda": entry.cuda,
        "archs": list(entry.archs), "cxx11_abi": entry.cxx11_abi,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)

