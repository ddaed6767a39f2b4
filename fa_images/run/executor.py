"""Carries out a build plan through an ``Engine`` (the container runtime) and an ``ImageBuilder``:
first the base images (pulled as the pull policy says, then checked for what the build needs:
``bases.py``); then for each entry, fetch the source (or take and verify a wheel that exists),
build the image with its tagged stages and the files of its wheel stage (one ``BuildRequest``,
whichever builder), verify the wheel, check the image, push.

One entry's failure does not stop the others (unless fail-fast). Wheels reach ``dist/``
only after verification, by an atomic rename, so an interrupted or failed run never leaves
a partial wheel, and a later ``--only`` run adds to what is there.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..builder import contract, gpuarch, scratch, source, untrusted, verify
from ..builder import dist as dist_dir
from ..builder.contract import WRONG_ARCH_PREFIX
from ..builder.verdict import Verdict
from ..builder.verdict import parse as parse_verdict
from ..config.grammar import PullPolicy
from ..config.matrix import Entry, Matrix
from ..errors import FatalError, StepFailed
from ..outputs import context, group_cache
from . import bases
from .current import DistDir, Results, Wheel
from .engine import Engine, RunResult
from .gpus import GpuAccess, HostGpus
from .image_builder import BuildProgress, BuildRequest, BuildResult, ImageBuilder, Output
from .logger import Console, EntryLog, duration
from .plan import CheckCommand, EntryPlan, StepName

if TYPE_CHECKING:  # signing's libraries load only where a build attests (``_attest``)
    from ..outputs import signing

EntryStatus = Literal["ok", "failed", "interrupted", "not run"]
CheckStatus = Literal["passed", "not run"]
# A skipped GPU check says why in its status (as report.json always has): one status per reason.
GpuCheckStatus = Literal[
    "passed",
    "not run",
    "skipped: --gpus none",
    "skipped: the engine has no GPU runtime (NVIDIA Container Toolkit); --gpus devices needs none",
    "skipped: no GPU visible in the container",
    "skipped: this GPU cannot run the image's GPU code",
]


@dataclass(frozen=True, kw_only=True)
class Options:
    dist: Path = Path("dist")
    log_dir: Path = Path("logs")
    fail_fast: bool = False
    keep_container: bool = False
    keep_work: bool = False  # keep each build context (a scratch dir) for debugging
    force: bool = False  # rebuild entries whose image and wheel are up to date
    gpus: GpuAccess = field(default_factory=GpuAccess)  # how the GPU check's container gets the GPUs (--gpus)
    # Where each compile group's compiler cache is kept between builds (group_cache); None: not kept.
    compiler_cache: Path | None = None
    pull: PullPolicy = "missing"  # when the base images are pulled (build --pull, build.pull)
    # Where earlier runs published their results (build --published): what is current there is not built.
    published: Results | None = None
    # The key the "attest" step signs with (build --sign-key); None: nothing is signed here.
    signer: signing.Signer | None = None
    # Where the "attest" step writes its statements unsigned, for a signer of the CI's (build --statements).
    statements: Path | None = None


@dataclass
class EntryResult:
    """What happened to one entry; ``report.json`` holds one of these per entry."""

    id: str
    image: str
    status: EntryStatus = "not run"
    failed_step: StepName | None = None
    error: str | None = None
    image_id: str | None = None
    wheel: str | None = None
    wheel_sha256: str | None = None
    check: CheckStatus = "not run"
    gpu_check: GpuCheckStatus = "not run"
    # Why a skipped GPU check could not say more: the check's WRONG ARCH line (this GPU's arch, the
    # archs the image carries and the capabilities they run on), from the image's own output.
    gpu_check_reason: str | None = None
    pushed: str | None = None  # the digest
    # The torch stage's image: every entry of the same base, Python and torch has this one.
    torch_stage: str | None = None
    prebuilt: bool = False  # the image was made around a wheel that existed: no compile
    kept_container: str | None = None
    log: str | None = None
    seconds: dict[StepName, float] = field(default_factory=dict)
    # Built and checked by an earlier run from the same inputs; this run built nothing.
    up_to_date: bool = False
    image_size: int | None = None  # bytes, as the engine counts them
    # The compile's kernels (.cu files) and how many of them the group's compiler cache answered.
    kernels: int | None = None
    kernels_from_cache: int | None = None
    # Fields this run's builder cannot fill: field -> why. They are left out of the report, not null.
    absent: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        said = asdict(self)
        for name in self.absent:
            said.pop(name, None)
        return said


@dataclass(frozen=True)
class StepOutcome:
    """What a step says about itself on its ✓ line."""

    note: str = ""
    skipped: bool = False  # it ran, decided there was nothing it could do here, and said why


# The runtime image's label with the digest of what it was built from (context.inputs_digest).
INPUTS_LABEL = "fa-images.inputs"
UP_TO_DATE = StepOutcome(note="up to date: built and checked by an earlier run", skipped=True)


@dataclass
class _EntryRun:
    """What the steps of one entry hand to each other."""

    plan: EntryPlan
    result: EntryResult
    log: EntryLog
    label: str
    source: Path | None = None  # the checked sdist, or the verified prebuilt wheel
    build: BuildResult | None = None
    inputs: str | None = None  # context.inputs_digest of this entry
    wheel_dir: Path | None = None  # where the build wrote the wheel stage's files, inside dist/
    fetched: Path | None = None  # where a published wheel was fetched to, inside dist/
    verdict: Verdict | None = None  # the GPU check's, where its comparisons ran
    started: float = field(default_factory=time.time)

    @property
    def entry(self) -> Entry:
        return self.plan.entry


class Executor:
    def __init__(
        self, engine: Engine, builder: ImageBuilder, matrix: Matrix, options: Options, console: Console
    ) -> None:
        self.engine, self.builder, self.matrix, self.options, self.console = engine, builder, matrix, options, console
        self.results: list[EntryResult] = []

    def run(self, plans: list[EntryPlan]) -> list[EntryResult]:
        other = sorted({p.form for p in plans} - {self.builder.form})
        if other:  # one decision makes the plan and the builder: two forms is a bug, not bad input
            raise ValueError(f"a plan for the {other[0]} form, given to a builder of the {self.builder.form} form")
        self.prepare_bases(plans)
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

    def prepare_bases(self, plans: list[EntryPlan]) -> None:
        """Every base image in the engine and fit for the build, before any entry starts: a
        refusal here (exit 3) names the image and its fix, and costs seconds, not a compile."""
        refs = sorted({ref for p in plans for ref in p.bases})
        bases.provide(self.engine, refs, self.options.pull, self.console)
        bases.preflight(self.engine, bases.needs(plans, self.matrix.bases.python), self.console)

    def _run_entry(self, plan: EntryPlan, result: EntryResult, label: str) -> None:
        log = EntryLog(self.options.log_dir.resolve() / f"{plan.entry.id}.log")  # never resolve a planted link
        result.log = str(log.path)
        run = _EntryRun(plan=plan, result=result, log=log, label=label)
        try:
            for name in plan.steps:
                result.failed_step = name
                started = time.monotonic()
                with self.console.step(name) as shown:
                    outcome = STEP_TABLE[name](self, run)
                    shown.update(note=outcome.note, skipped=outcome.skipped)
                result.seconds[name] = round(time.monotonic() - started, 1)
            result.status, result.failed_step = "ok", None
            if run.inputs and not result.up_to_date and "check" in plan.steps:
                # Only an entry that was built, exported and checked is current for a later run.
                dist_dir.set_inputs(self.options.dist, plan.entry.id, run.inputs, pushed=result.pushed)
        except FatalError as exc:
            result.status, result.error = "failed", str(exc)
            self.console.line(f"    {exc}")
            for line in (exc.lines if isinstance(exc, StepFailed) else [])[-8:]:
                self.console.line(f"    | {line}")
            self.console.line(f"    full log: {log.path}")
            log.write(f"fa-images: {result.failed_step} failed: {exc}")
        finally:
            if run.wheel_dir is not None:  # a build or an export that failed: its files go with it
                shutil.rmtree(run.wheel_dir, ignore_errors=True)
            if run.fetched is not None:
                shutil.rmtree(run.fetched, ignore_errors=True)
            log.close()

    # The steps, one method each; STEP_TABLE below maps the plan's step names to them.

    def _source(self, run: _EntryRun) -> StepOutcome:
        entry, prebuilt, published = run.entry, run.plan.prebuilt, run.plan.published
        base_ids = {ref: info.id for ref in run.plan.bases if (info := self.engine.image_info(ref))}

        def digest(sha256: str, *, around_wheel: bool) -> str:
            return context.inputs_digest(self.matrix, entry, sha256, base_ids=base_ids, prebuilt=around_wheel)

        if entry.recipe.source is None:  # Python from the index, pinned in the Dockerfile: no source to fetch
            project = entry.generation.project
            run.inputs = digest(hashlib.sha256(f"{project} from the index".encode()).hexdigest(), around_wheel=False)
            return StepOutcome(note=f"{project} {entry.flash_attn} from the index, pinned; no compile with nvcc")
        if prebuilt is None and run.plan.shares_wheel_of is not None:
            prebuilt = self._group_wheel(run, run.plan.shares_wheel_of)
        if prebuilt is not None:
            run.result.prebuilt = True
            report = self._verify(run, prebuilt)
            run.source, note = prebuilt, f"{prebuilt.name} (verified, sha256 {report.sha256[:12]}…): no compile"
            candidates = [digest(report.sha256, around_wheel=True)]
        else:
            sdist = context.fetch_sdist(self.matrix, entry)
            assert sdist is not None  # a generation without a source went above
            compiled = digest(source.sha256_of(sdist), around_wheel=False)
            run.source, note, candidates = sdist, sdist.name, [compiled]
            if published is not None:
                # A published wheel is final: current as its own compile left it, or as an image
                # made around it; else the image is made around it now.
                run.result.prebuilt = True
                note = f"{published.name} (published): no compile"
                candidates = [digest(published.record.sha256, around_wheel=True), compiled]
        for inputs in [] if self.options.force else candidates:
            if where := self._up_to_date(run, inputs):
                run.inputs = inputs
                return StepOutcome(note=f"{note}; image and wheel up to date: {where} (--force rebuilds)")
        run.inputs = candidates[0]
        if published is not None and self.options.published is not None:
            run.source = self._fetch_published(run, self.options.published, published)
            report = self._verify(run, run.source)
            note = f"{published.location} (verified, sha256 {report.sha256[:12]}…): published, no compile"
        return StepOutcome(note=note)

    def _group_wheel(self, run: _EntryRun, leader: str) -> Path:
        """The wheel of the entry's compile group, which ``leader`` compiled earlier in this run."""
        result = next((r for r in self.results if r.id == leader), None)
        if result is None or result.status != "ok" or result.wheel is None:
            status = result.status if result else "is not in this run"
            raise StepFailed(
                f"{leader} compiles the wheel this entry shares (compile group {run.entry.compile_group}), "
                f"and it {'failed' if status == 'failed' else status}: no wheel to make the image around"
            )
        return Path(result.wheel)

    def _fetch_published(self, run: _EntryRun, place: Results, wheel: Wheel) -> Path:
        """The published wheel, fetched into this run's dist/ apart from its wheels (removed with
        the entry's run), with its record beside it for the export."""
        self.options.dist.mkdir(parents=True, exist_ok=True)
        run.fetched = Path(tempfile.mkdtemp(prefix=f".{run.entry.id}-published-", dir=self.options.dist))
        return place.fetch(wheel, run.fetched / "wheel")

    def _verify(self, run: _EntryRun, wheel: Path) -> verify.WheelReport:
        """The gate of every wheel: a compiled one as it leaves its stage, a prebuilt one before
        the build. The import waits for the image's own check, next to the image's torch."""
        entry = run.entry
        return verify.accept_wheel(
            [wheel],
            expect_python=entry.python,
            expect_cxx11_abi=entry.cxx11_abi,
            expect_archs=entry.archs,
            log=run.log.write,
            import_check=False,
        )

    def _up_to_date(self, run: _EntryRun, inputs: str) -> str | None:
        """Where an earlier run's wheel and image of these inputs are (``current``), or None."""
        places: list[Results] = [DistDir(self.options.dist)]
        places += [self.options.published] if self.options.published else []
        for place in places:
            wheel = place.wheel(run.entry.id, inputs)
            image = self._current_image(run, wheel, inputs) if wheel else None
            if wheel and image:
                run.result.up_to_date = True
                run.result.wheel, run.result.wheel_sha256 = wheel.location, wheel.record.sha256
                return f"the wheel in {place.where}, the image {image}"
        return None

    def _current_image(self, run: _EntryRun, wheel: Wheel, inputs: str) -> str | None:
        """Where the image the wheel's run made is: the registry, asked without a pull, for an
        entry this run pushes; else the engine, with these inputs in its label."""
        entry, pushed = run.entry, wheel.record.pushed
        if "push" in run.plan.steps and pushed:
            try:
                served = self.engine.registry_digest(entry.image)
            except StepFailed as exc:  # asking costs nothing; not knowing costs a build
                run.log.write(f"fa-images: cannot tell whether the registry holds {entry.image}: {exc}")
                self.console.line(f"    cannot ask the registry for {entry.image}: {exc}")
                served = None
            if served == pushed:
                run.result.pushed = pushed
                return f"in the registry at {pushed[:19]}"
        image = self.engine.image_info(entry.image)
        if image is None or image.labels.get(INPUTS_LABEL) != inputs:
            return None
        run.result.image_size = image.size
        return "in the engine"

    def _build(self, run: _EntryRun) -> StepOutcome:
        if run.result.up_to_date:
            return UP_TO_DATE
        # Not current until this run's checks pass: a failure now must not leave an old mark.
        dist_dir.set_inputs(self.options.dist, run.entry.id, None)
        started = time.monotonic()
        progress: BuildProgress | None = None

        def on_progress(update: BuildProgress) -> None:
            nonlocal progress
            progress = update

        def on_line(line: str) -> None:
            run.log.write(line)
            counts = contract.parse_cache_stats(line)
            if counts:
                run.result.kernels_from_cache, run.result.kernels = counts
            if line.startswith(contract.MILESTONE):  # compiling, wheel built: shown as they come
                self.console.line(f"    {run.label} · {line.strip()}")
                return
            where = f"{progress.stage or '?'} · step {progress.step}/{progress.total}" if progress else "starting"
            self.console.progress(
                f"    {run.label} · {where} · {duration(time.monotonic() - started)} · {line.strip()[:100]}",
                key=(progress.step if progress else 0,),
            )

        assert run.source is not None or run.entry.recipe.source is None

        def kept(line: str) -> None:
            run.log.write(line)
            self.console.line(f"    {line}")

        prebuilt = run.plan.around_wheel
        with scratch.scratch_dir("context", keep=self.options.keep_work, log=kept) as tmp:
            ctx = context.assemble(
                self.matrix,
                run.entry,
                run.source,
                tmp,
                compiler_cache=self.options.compiler_cache if contract.CACHE_STAGE in run.plan.files else None,
                prebuilt=prebuilt,
                form=run.plan.form,
            )
            request = self._request(run, ctx)
            try:
                run.build = self.builder.build(request, on_line=on_line, on_progress=on_progress)
            finally:
                cache_in = request.files.get(contract.CACHE_STAGE)
                if cache_in is not None and run.build is None:  # a failed build: what it wrote is no cache
                    shutil.rmtree(cache_in, ignore_errors=True)
        run.result.image_id = run.build.image_id
        run.result.torch_stage = run.build.stage_ids.get(contract.TORCH_STAGE)
        if run.result.torch_stage is None:
            run.result.absent["torch_stage"] = f"{self.builder.describe()} names no image of the torch stage"
        from_build_cache = contract.BUILDER_STAGE in run.build.cached_stages
        if from_build_cache:
            # BuildKit found the compile in its cache (this host's, or one imported): nothing compiled.
            run.result.kernels = run.result.kernels or 0
            run.log.write("fa-images: the compile step came from the build cache: 0 kernels compiled")
        self._save_compiler_cache(run, request.files.get(contract.CACHE_STAGE))
        image = self.engine.image_info(run.entry.image)
        run.result.image_size = image.size if image else None
        size = f", {image.size / 1e9:.2f} GB" if image else ""
        kernels = run.result.kernels
        cached = f"; kernels from the compiler cache: {run.result.kernels_from_cache} of {kernels}" if kernels else ""
        if from_build_cache:
            cached = "; the compile came from the build cache: 0 kernels compiled"
        return StepOutcome(note=f"{run.entry.image} ({run.result.image_id[:19]}{size}){cached}")

    def _request(self, run: _EntryRun, ctx: Path) -> BuildRequest:
        """The plan's build as a request: the image, the stages it tags, the files of the stages it
        reads (the wheel into dist/, the compiler cache beside the host's copy)."""
        plan = run.plan
        self.options.dist.mkdir(parents=True, exist_ok=True)
        run.wheel_dir = Path(tempfile.mkdtemp(prefix=f".{run.entry.id}-", dir=self.options.dist))
        where = {contract.WHEEL_STAGE: run.wheel_dir}
        if contract.CACHE_STAGE in plan.files:
            assert self.options.compiler_cache is not None  # planned only where the host keeps one
            where[contract.CACHE_STAGE] = group_cache.incoming(self.options.compiler_cache, run.entry.compile_group)
        outputs = tuple(
            Output(stage=t.stage, tag=t.tag, dest=None if t.tag else where[t.stage], best_effort=t.best_effort)
            for t in plan.from_stages
        )
        return BuildRequest(
            context=ctx,
            target=plan.build.stage,
            tag=plan.build.tag or run.entry.image,
            outputs=outputs,
            before=tuple(t.stage for t in plan.before),
            best_effort=frozenset(t.stage for t in plan.before if t.best_effort),
            anew=plan.anew,
            cache_from=plan.cache_from,
            inline_cache=bool(plan.cache_from),
            network=self.matrix.build.network,
            memory=self.matrix.build.memory_bytes,
            labels={INPUTS_LABEL: run.inputs} if run.inputs else {},
        )

    def _save_compiler_cache(self, run: _EntryRun, arrived: Path | None) -> None:
        """The group's next Python takes its kernels from this build's cache. A cache that cannot
        be saved costs that Python a full compile, not this entry its result."""
        root, group = self.options.compiler_cache, run.entry.compile_group
        if root is None or arrived is None or run.build is None:
            return
        for stage, why in run.build.missed.items():
            if stage != contract.CACHE_STAGE:  # the way in: this compile went without the host's cache
                self.console.line(f"    compiler cache of {group} not used ({stage}): {why}")
                run.log.write(f"fa-images: compiler cache of {group} not used ({stage}): {why}")
        missed = run.build.missed.get(contract.CACHE_STAGE)
        try:
            if missed is not None:
                raise StepFailed(missed)
            size = group_cache.install(arrived, root, group)
        except (FatalError, OSError) as exc:
            shutil.rmtree(arrived, ignore_errors=True)  # what a failed export left (install removes its own)
            self.console.line(f"    compiler cache of {group} not saved: {exc}")
            run.log.write(f"fa-images: compiler cache of {group} not saved: {exc}")
            return
        run.log.write(f"fa-images: compiler cache of {group} saved: {root / group} ({size / 1e6:.0f} MB)")

    def _export(self, run: _EntryRun) -> StepOutcome:
        if run.result.up_to_date:
            return StepOutcome(note=f"{run.result.wheel} (up to date)", skipped=True)
        entry, dist, staging = run.entry, self.options.dist, run.wheel_dir
        assert staging is not None
        if contract.WHEEL_STAGE not in run.plan.files:  # its generation makes no wheel
            shutil.rmtree(staging, ignore_errors=True)
            run.wheel_dir = None
            return StepOutcome(note=f"no wheel: {entry.generation.project} is Python, from the index", skipped=True)
        try:
            # Regular files at the top of the stage, never a link: what the builder left is untrusted.
            wheels = sorted(f for f in staging.iterdir() if f.suffix == ".whl" and f.is_file() and not f.is_symlink())
            if len(wheels) != 1:
                raise StepFailed(f"the wheel stage holds {len(wheels)} wheels, not one: {[w.name for w in wheels]}")
            report = self._verify(run, wheels[0])
            if run.plan.shares_wheel_of is not None:
                return self._shared_export(run, wheels[0])
            # A prebuilt wheel keeps the record of the dist/ it came from, where it has one.
            origin = run.source.parent if run.plan.around_wheel and run.source else staging
            record = manifest_record(origin, wheels[0], report.sha256, entry)
            (final,) = dist_dir.add_wheels(dist, [dist_dir.Incoming(wheels[0], record, entry.id)], move=True)
            run.result.wheel, run.result.wheel_sha256 = str(final.resolve()), report.sha256
            return StepOutcome(note=f"{final} ({final.stat().st_size / 1e6:.1f} MB, sha256 {report.sha256[:12]}…)")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            run.wheel_dir = None

    def _shared_export(self, run: _EntryRun, wheel: Path) -> StepOutcome:
        """The group's wheel is in dist/ once, recorded for the entry that compiled it: this entry's
        image holds the same bytes, and its result names that file."""
        there, sha256 = self.options.dist / wheel.name, source.sha256_of(wheel)
        if not there.is_file() or there.is_symlink() or source.sha256_of(there) != sha256:
            raise StepFailed(
                f"{wheel.name} is not in {self.options.dist} with sha256 {sha256[:12]}…: the group's wheel moved"
            )
        run.result.wheel, run.result.wheel_sha256 = str(there.resolve()), sha256
        return StepOutcome(note=f"{there} (the group's, compiled for {run.plan.shares_wheel_of}; in dist/ once)")

    def _check(self, run: _EntryRun) -> StepOutcome:
        if run.result.up_to_date:
            return UP_TO_DATE
        check = run.plan.check("check")
        assert check is not None  # a plan with the step has its command
        outcome = self._run_check(run, check, gpu=False)
        run.result.check = "passed"
        return StepOutcome(note=outcome.output[-1] if outcome.output else "")

    def _gpu_check(self, run: _EntryRun) -> StepOutcome:
        if run.result.up_to_date:
            return UP_TO_DATE
        check, access = run.plan.check("gpu-check"), self.options.gpus
        gpu: bool | HostGpus = True
        if access.mode == "none" or check is None:  # a plan for --gpus none runs no GPU check
            return self._gpu_check_skipped(run, "skipped: --gpus none")
        if access.host is not None:
            gpu = access.host
            run.log.write(f"GPU passthrough (--gpus devices): {access.host.describe()}")
            run.log.write(f"  devices: {' '.join(access.host.devices)}")
            run.log.write(f"  driver libraries: {' '.join(access.host.libraries)}")
        elif not self.engine.has_gpu_runtime():
            return self._gpu_check_skipped(
                run, "skipped: the engine has no GPU runtime (NVIDIA Container Toolkit); --gpus devices needs none"
            )
        # Devices passed explicitly that torch cannot see are a failure, not a GPU-less host.
        no_gpu = check.no_gpu_exit if access.host is None else None
        # A GPU that cannot run the image's archs (an archs-80 image on an H100 build host) is the
        # wrong place to check it, not a broken wheel: skipped, with the check's own reason.
        tolerate = (contract.EXIT_WRONG_ARCH,) + (() if no_gpu is None else (no_gpu,))
        outcome = self._run_check(run, check, gpu=gpu, tolerate=tolerate)
        if no_gpu is not None and outcome.exit_code == no_gpu:
            return self._gpu_check_skipped(run, "skipped: no GPU visible in the container")
        if outcome.exit_code == contract.EXIT_WRONG_ARCH:
            said = [line for line in outcome.output if line.startswith(WRONG_ARCH_PREFIX)]
            reason = untrusted.shown(said[-1].removeprefix(WRONG_ARCH_PREFIX).strip()[:500]) if said else ""
            ptx = gpuarch.built_ptx(run.entry.archs, run.entry.ptx)
            where = self.matrix.compat.gpus_that_run(run.entry.archs, ptx)
            if where:  # the builder knows archs; the names of the GPUs that run them are the table's
                reason += f"{'; ' if reason else ''}GPUs that run it: {', '.join(where)}"
            run.result.gpu_check_reason = reason or None
            status = self._gpu_check_skipped(run, "skipped: this GPU cannot run the image's GPU code")
            return StepOutcome(note=f"{status.note}: {run.result.gpu_check_reason or 'no reason given'}", skipped=True)
        try:
            run.verdict = parse_verdict(outcome.output)
        except ValueError as exc:  # the image's own output: a verdict line that is not one is its failure
            raise StepFailed(f"the GPU check's verdict line is not one: {untrusted.shown(str(exc))[:300]}") from None
        run.result.gpu_check = "passed"
        return StepOutcome(note=outcome.output[-1] if outcome.output else "")

    @staticmethod
    def _gpu_check_skipped(run: _EntryRun, status: GpuCheckStatus) -> StepOutcome:
        run.result.gpu_check = status
        return StepOutcome(note=status, skipped=True)

    def _run_check(
        self, run: _EntryRun, check: CheckCommand, *, gpu: bool | HostGpus, tolerate: tuple[int, ...] = ()
    ) -> RunResult:
        outcome = self.engine.run(
            run.entry.image, list(check.command), gpu=gpu, keep=self.options.keep_container, on_line=run.log.write
        )
        if outcome.exit_code == 0 or outcome.exit_code in tolerate:
            return outcome
        run.result.kept_container = kept = outcome.kept_container
        hint = f"; kept for debugging: {self.engine.debug_command(kept)}" if kept else ""
        raise StepFailed(f"{check.what} exited with {outcome.exit_code}{hint}", lines=outcome.output[-20:])

    def _push(self, run: _EntryRun) -> StepOutcome:
        if run.result.up_to_date and run.result.pushed:
            return StepOutcome(note=f"{run.entry.image}@{run.result.pushed} (already in the registry)", skipped=True)
        pushed = []
        for ref in run.plan.push:
            digest = self.engine.push(ref, on_line=run.log.write)
            if ref == run.entry.image:  # the image's digest, not its builder's
                run.result.pushed = digest
            pushed.append(f"{ref}@{digest}")
        return StepOutcome(note=", ".join(pushed))

    def _attest(self, run: _EntryRun) -> StepOutcome:
        """What the entry made, as signed statements or statements for a signer of its own (``attest.py``)."""
        from . import attest

        result, plan = run.result, run.plan
        made = attest.Made(
            entry=run.entry,
            form=plan.form,
            bases=plan.bases,
            source=None if plan.around_wheel else run.source,
            inputs=run.inputs,
            wheel=Path(result.wheel) if result.wheel else None,
            wheel_sha256=result.wheel_sha256,
            shares_wheel_of=plan.shares_wheel_of,
            up_to_date=result.up_to_date,
            pushed=result.pushed,
            verdict=run.verdict,
            started=run.started,
        )
        options = self.options
        notes = attest.Attester(
            self.engine, options.dist, signer=options.signer, statements_dir=options.statements
        ).attest(made)
        if not notes:
            return StepOutcome(note="nothing to attest: no wheel in dist/ and no image pushed", skipped=True)
        verdict = run.verdict
        gpu = f"GPU verdict ({verdict.gpu}, {verdict.sm})" if verdict else f"no GPU verdict ({result.gpu_check})"
        return StepOutcome(note=f"{'; '.join(notes)}; {gpu}")


# Each step of a plan and the method that carries it out (tests/unit/test_plan.py: one for every step).
STEP_TABLE: dict[StepName, Callable[[Executor, _EntryRun], StepOutcome]] = {
    "source": Executor._source,
    "build": Executor._build,
    "export": Executor._export,
    "check": Executor._check,
    "gpu-check": Executor._gpu_check,
    "push": Executor._push,
    "attest": Executor._attest,
}


def manifest_record(exported: Path, wheel: Path, sha256: str, entry: Entry) -> dist_dir.WheelRecord:
    """The entry's facts, completed by the record the builder wrote beside the wheel in the image
    (exact torch, sdist sha256, compile time) when it has one for this very wheel."""
    record = dist_dir.WheelRecord.of(wheel, sha256, entry, entry=entry.id, image=entry.image)
    built = dist_dir.read_manifest(exported).wheels.get(wheel.name)
    if built is not None and built.sha256 == sha256:
        record = record.with_facts(built)
    return record
