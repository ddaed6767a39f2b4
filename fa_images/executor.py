"""Carries out a build plan through an ``Engine``: for each entry, fetch the source,
build and tag the image, export and verify the wheel, check the image, push.

One entry's failure does not stop the others (unless fail-fast). Wheels reach ``dist/``
only after verification, by an atomic rename, so an interrupted or failed run never leaves
a partial wheel, and a later ``--only`` run adds to what is there.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import context
from .builder import contract, scratch, verify
from .builder import dist as dist_dir
from .engine import BuildProgress, Engine, RunResult, StepFailed
from .errors import FatalError
from .gpus import GpuAccess, HostGpus
from .logger import Console, EntryLog, duration
from .matrix import Entry, Matrix
from .plan import EntryPlan

GPU_CHECK = ["python", "-m", "fa_images.builder", "check"]
NO_GPU_EXIT = 3


@dataclass(frozen=True, kw_only=True)
class Options:
    dist: Path = Path("dist")
    log_dir: Path = Path("logs")
    fail_fast: bool = False
    keep_container: bool = False
    keep_work: bool = False  # keep each build context (a scratch dir) for debugging
    gpus: GpuAccess = field(default_factory=GpuAccess)  # how the GPU check's container gets the GPUs (--gpus)


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


@dataclass
class _EntryRun:
    """What the steps of one entry hand to each other."""

    entry: Entry
    result: EntryResult
    log: EntryLog
    label: str
    sdist: Path | None = None
    wheel_image: str | None = None


class Executor:
    def __init__(self, engine: Engine, matrix: Matrix, options: Options, console: Console) -> None:
        self.engine, self.matrix, self.options, self.console = engine, matrix, options, console
        self.results: list[EntryResult] = []

    def run(self, plans: list[EntryPlan]) -> list[EntryResult]:
        self.results = results = [EntryResult(id=p.entry.id, image=p.entry.image) for p in plans]
        for index, (plan, result) in enumerate(zip(plans, results), start=1):
            self.console.line(f"[{index}/{len(plans)}] {plan.entry.id}  ({', '.join(plan.steps)})")
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
        log = EntryLog((self.options.log_dir / f"{plan.entry.id}.log").resolve())
        result.log = str(log.path)
        run = _EntryRun(entry=plan.entry, result=result, log=log, label=label)
        try:
            for name in plan.steps:
                result.failed_step = name
                started = time.monotonic()
                with self.console.step(name) as info:
                    getattr(self, "_" + name.replace("-", "_"))(run, info)
                result.seconds[name] = round(time.monotonic() - started, 1)
            result.status, result.failed_step = "ok", None
        except FatalError as exc:
            result.status, result.error = "failed", str(exc)
            self.console.line(f"    {exc}")
            for line in getattr(exc, "lines", [])[-8:]:
                self.console.line(f"    | {line}")
            self.console.line(f"    full log: {log.path}")
            log.write(f"fa-images: {result.failed_step} failed: {exc}")
        finally:
            log.close()

    # Each step below is named after its plan step ("gpu-check" -> _gpu_check).

    def _source(self, run: _EntryRun, info: dict) -> None:
        run.sdist = context.fetch_sdist(self.matrix, run.entry)
        info["note"] = run.sdist.name

    def _build(self, run: _EntryRun, info: dict) -> None:
        started = time.monotonic()
        progress: BuildProgress | None = None

        def on_progress(update: BuildProgress) -> None:
            nonlocal progress
            progress = update

        def on_line(line: str) -> None:
            run.log.write(line)
            if line.startswith(contract.MILESTONE):  # compiling, wheel built: shown as they come
                self.console.line(f"    {run.label} · {line.strip()}")
                return
            where = f"{progress.stage or '?'} · step {progress.step}/{progress.total}" if progress else "starting"
            self.console.progress(
                f"    {run.label} · {where} · {duration(time.monotonic() - started)} · {line.strip()[:100]}",
                key=(progress.step if progress else 0,),
            )

        assert run.sdist is not None
        network = self.matrix.build.network

        def kept(line: str) -> None:
            run.log.write(line)
            self.console.line(f"    {line}")

        with scratch.scratch_dir("context", keep=self.options.keep_work, log=kept) as tmp:
            ctx = context.assemble(self.matrix, run.entry, run.sdist, tmp)
            run.result.image_id = self.engine.build(
                context=ctx,
                target="runtime",
                tag=run.entry.image,
                network=network,
                memory=self.matrix.build.memory_bytes,
                on_line=on_line,
                on_progress=on_progress,
            )
            # These reuse the cached layers: seconds, not another compile.
            self.engine.build(
                context=ctx,
                target="builder",
                tag=run.entry.builder_image,
                network=network,
                memory=self.matrix.build.memory_bytes,
                on_line=run.log.write,
                on_progress=lambda _: None,
            )
            run.wheel_image = self.engine.build(
                context=ctx,
                target="wheel",
                tag=None,
                network=network,
                memory=self.matrix.build.memory_bytes,
                on_line=run.log.write,
                on_progress=lambda _: None,
            )
        info["note"] = f"{run.entry.image} ({run.result.image_id[:19]})"

    def _export(self, run: _EntryRun, info: dict) -> None:
        entry, dist = run.entry, self.options.dist
        assert run.wheel_image is not None
        dist.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.id}-", dir=dist))
        try:
            files = self.engine.export(run.wheel_image, staging)
            wheels = [f for f in files if f.suffix == ".whl"]
            report = verify.accept_wheel(
                wheels,
                expect_python=entry.python,
                expect_cxx11_abi=entry.cxx11_abi,
                expect_archs=entry.archs,
                log=run.log.write,
                import_check=False,  # no torch for it here: the image's own check imports it
            )
            record = manifest_record(staging, wheels[0], report.sha256, entry)
            (final,) = dist_dir.add_wheels(dist, [dist_dir.Incoming(wheels[0], record, entry.id)], move=True)
            run.result.wheel, run.result.wheel_sha256 = str(final.resolve()), report.sha256
            info["note"] = f"{final} ({final.stat().st_size / 1e6:.1f} MB, sha256 {report.sha256[:12]}…)"
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _check(self, run: _EntryRun, info: dict) -> None:
        outcome = self._run_container(run, None, gpu=False, what="import check")
        run.result.check = "passed"
        info["note"] = outcome.output[-1] if outcome.output else ""

    def _gpu_check(self, run: _EntryRun, info: dict) -> None:
        access = self.options.gpus
        gpu: bool | HostGpus = True
        if access.mode == "none":
            run.result.gpu_check = info["note"] = "skipped: --gpus none"
            info["skipped"] = True
            return
        if access.host is not None:
            gpu = access.host
            run.log.write(f"GPU passthrough (--gpus devices): {access.host.describe()}")
            run.log.write(f"  devices: {' '.join(access.host.devices)}")
            run.log.write(f"  driver libraries: {' '.join(access.host.libraries)}")
        elif not self.engine.has_gpu_runtime():
            run.result.gpu_check = info["note"] = (
                "skipped: the engine has no GPU runtime (NVIDIA Container Toolkit); --gpus devices needs none"
            )
            info["skipped"] = True
            return
        # Devices passed explicitly that torch cannot see are a failure, not a GPU-less host.
        tolerate = () if access.host is not None else (NO_GPU_EXIT,)
        outcome = self._run_container(run, GPU_CHECK, gpu=gpu, what="GPU check", tolerate=tolerate)
        if outcome.exit_code == NO_GPU_EXIT:
            run.result.gpu_check = info["note"] = "skipped: no GPU visible in the container"
            info["skipped"] = True
            return
        run.result.gpu_check = "passed"
        info["note"] = outcome.output[-1] if outcome.output else ""

    def _run_container(
        self,
        run: _EntryRun,
        command: list[str] | None,
        *,
        gpu: bool | HostGpus,
        what: str,
        tolerate: tuple[int, ...] = (),
    ) -> RunResult:
        outcome = self.engine.run(
            run.entry.image, command, gpu=gpu, keep=self.options.keep_container, on_line=run.log.write
        )
        if outcome.exit_code == 0 or outcome.exit_code in tolerate:
            return outcome
        run.result.kept_container = outcome.kept_container
        hint = f"; kept for debugging: docker start -ai {outcome.kept_container}" if outcome.kept_container else ""
        raise StepFailed(f"{what} exited with {outcome.exit_code}{hint}", lines=outcome.output[-20:])

    def _push(self, run: _EntryRun, info: dict) -> None:
        run.result.pushed = self.engine.push(run.entry.image, on_line=run.log.write)
        info["note"] = f"{run.entry.image}@{run.result.pushed}"


def manifest_record(exported: Path, wheel: Path, sha256: str, entry: Entry) -> dist_dir.WheelRecord:
    """The entry's facts, completed by the record the builder wrote beside the wheel in the image
    (exact torch, sdist sha256, compile time) when it has one for this very wheel."""
    record = dist_dir.WheelRecord(
        sha256=sha256,
        size=wheel.stat().st_size,
        flash_attn=entry.flash_attn,
        python=entry.python,
        torch=entry.torch,
        cuda=entry.cuda,
        cxx11_abi=entry.cxx11_abi,
        archs=tuple(entry.archs),
        ptx=entry.ptx,
        entry=entry.id,
        image=entry.image,
    )
    built = dist_dir.read_manifest(exported).wheels.get(wheel.name)
    if built is not None and built.sha256 == sha256:
        record = record.with_facts(built)
    return record
