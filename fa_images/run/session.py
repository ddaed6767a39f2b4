"""A ``build`` session, from typed arguments: the published lookup, the builder decision, the plan,
and then either the plan printed (``--dry-run``) or the executor, with the report written on every
way out. ``--dry-run`` and the run make the plan in one function, from the same inputs, so what is
printed is what runs. Each setting is resolved here once: flag > matrix > default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.builder_decision import BuilderDecision
from ..config.grammar import BuilderForm
from ..config.matrix import Entry, Matrix
from ..errors import EntriesFailed
from . import connect, current, prebuilt
from .build_args import BuildArgs
from .executor import EntryResult, Executor, Options
from .gpus import resolve as resolve_gpus
from .logger import Console
from .plan import EntryPlan, make_plan
from .report import print_summary, write_report

if TYPE_CHECKING:
    from ..outputs.signing import Signer


@dataclass(frozen=True)
class Found:
    """The wheels that exist for the entries: given (``--wheels``) and published (final: an entry
    that has one is never compiled again)."""

    given: dict[str, Path] | None
    published: current.Results | None  # the --published place, read
    final: dict[str, current.Wheel]
    notes: tuple[str, ...]  # what reading it said
    # Entry id -> (the entry, the file) of its compile group's wheel in --dist, compiled for another
    # entry by an earlier run (an abi3 wheel: one per group, in dist/ once).
    shared: dict[str, tuple[str, Path]]


def find_wheels(args: BuildArgs, m: Matrix, entries: tuple[Entry, ...]) -> Found:
    given = prebuilt.find(entries, list(args.wheels)) if args.wheels else None
    published, notes = current.published(args.published) if args.published else (None, [])
    final = {e.id: w for e in entries if published and (w := current.final(published, e.id))}
    return Found(given, published, final, tuple(notes), current.shared_wheels(args.dist, m.entries, entries))


def make(args: BuildArgs, m: Matrix, entries: tuple[Entry, ...], found: Found, form: BuilderForm) -> list[EntryPlan]:
    """The plan of the run and of its dry run, from the same inputs."""
    return make_plan(
        entries,
        form=form,
        compiler_cache=args.compiler_cache_root() is not None,
        check=args.check,
        push=args.push,
        gpus=args.gpus,
        sign=args.sign_key is not None or args.statements is not None,
        prebuilt=found.given,
        published=found.final,
        shared=found.shared,
        python_from=m.bases.python,
    )


def dry_run(args: BuildArgs, m: Matrix) -> tuple[BuilderDecision, list[EntryPlan]]:
    """What ``build`` would do here, nothing run and nothing written: the builder as this host's
    docker CLI allows (no engine is asked)."""
    entries = m.select(list(args.only) if args.only else None)
    found = find_wheels(args, m, entries)
    decision = connect.planned(m.build, args.builder)
    return decision, make(args, m, entries, found, decision.form)


def build(args: BuildArgs, m: Matrix, console: Console) -> list[EntryResult]:
    """Builds every selected entry. The report (``args.report``) is written on every way out,
    with the failure that ended the run, before the summary (printing can fail: a closed pipe).
    Raises ``EntriesFailed`` when an entry failed."""
    executor: Executor | None = None
    engine: str | None = None
    planned: list[str] = []
    failure: BaseException | None = None
    try:
        entries = m.select(list(args.only) if args.only else None)
        planned = [e.id for e in entries]
        found = find_wheels(args, m, entries)
        gpus = resolve_gpus(args.gpus)  # this machine's GPUs first: no engine call for a local problem
        signer = _signer(args.sign_key)  # a bad key: before any engine
        for note in found.notes:
            console.line(note)
        connection = connect.connect(m.build, args.builder)
        engine = connection.engine.describe()
        console.line(f"engine: {engine}")
        console.line(f"builder: {connection.builder.describe()} ({connection.decision.why})")
        console.line(signing_line(args))
        plans = make(args, m, entries, found, connection.decision.form)
        options = Options(
            dist=args.dist,
            log_dir=args.log_dir,
            fail_fast=args.fail_fast,
            keep_container=args.keep_container,
            keep_work=args.keep_work,
            force=args.force,
            gpus=gpus,
            compiler_cache=args.compiler_cache_root(),
            pull=args.pull or m.build.pull,
            published=found.published,
            signer=signer,
            statements=args.statements,
        )
        executor = Executor(connection.engine, connection.builder, m, options, console)
        try:
            executor.run(plans)
        except KeyboardInterrupt:
            console.line("interrupted: finished wheels are in place; rerun with --only for the rest")
            raise
        if any(r.status != "ok" for r in executor.results):
            raise EntriesFailed("some entries failed; see the summary above")
        return executor.results
    except BaseException as exc:
        failure = exc
        raise
    finally:
        results = executor.results if executor else []
        if args.report:
            done = {r.id for r in results}
            not_run = [i for i in planned if i not in done]
            write_report(args.report, results, engine, failure=failure, not_run=not_run)
        if results:
            print_summary(console, results)


def _signer(key: Path | None) -> Signer | None:
    """The key's signer; signing's libraries load only for a run that signs."""
    if key is None:
        return None
    from ..outputs import signing

    return signing.load_signer(key)


def signing_line(args: BuildArgs) -> str:
    """What the run signs, said once: with a key, statements for another signer, or nothing."""
    said = []
    if args.sign_key:
        said.append(f"with {args.sign_key}: each wheel's and pushed image's SBOM, provenance and GPU verdict")
    if args.statements:
        said.append(f"statements, unsigned, in {args.statements}/ for a signer of your own (cosign attest)")
    if not said:
        return "signing: none: nothing is signed (--sign-key KEY signs; `fa-images keys create` makes one)"
    return "signing: " + "; ".join(said)
