"""``fa-images doctor``: what this machine has, what is wrong with its flash-attn, what to build.

For a user whose ``import flash_attn`` fails, or who does not know which entry to write. It
reads the facts (Python, torch and its CUDA and C++ ABI, nvcc and the host compiler, the
driver and the GPUs, the memory a build may use), runs any installed flash-attn through the
same checks as ``inspect`` (ABI from the symbols it imports, GPU archs, an import next to
torch), and prints the matrix entry that fits, validated as ``plan`` would. Each probe runs in
a child process or reads files, so a broken torch or extension cannot take doctor down.
Exit 0 when every finding is fine; 1 when one is marked ✕ (broken) or ! (flash-attn cannot
work so: a CPU torch, no torch), with the reasons and their fixes.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from .builder import contract, elf, environment, gpuarch, untrusted, verify
from .builder.errors import EnvironmentProblem
from .builder.gpucheck import IMPORTED_MODULES
from .builder.wording import counted

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"
_MARKS = {OK: "✓", WARN: "!", FAIL: "✕", INFO: "-"}


@dataclass(frozen=True)
class Finding:
    name: str
    status: str
    detail: str
    fix: str | None = None


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    entry: dict[str, Any] | None = None

    @property
    def problems(self) -> list[str]:
        """What the marks say needs a fix: every ✕ (broken) and every ! (flash-attn cannot work so)."""
        return [f.name for f in self.findings if f.status in (FAIL, WARN)]

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, name: str, status: str, detail: str, fix: str | None = None) -> None:
        self.findings.append(Finding(name, status, detail, fix))

    def lines(self) -> list[str]:
        out = []
        for f in self.findings:
            out.append(f"{_MARKS[f.status]} {f.name}: {f.detail}")
            if f.fix:
                out.append(f"    fix: {f.fix}")
        if self.entry:
            out += ["", "matrix entry for this machine (paste under entries:):", "  - " + entry_line(self.entry)]
        out.append("")
        problems = self.problems
        out.append("all is well" if self.ok else f"{counted(len(problems), 'problem')}: {', '.join(problems)}")
        # Versions, paths and messages come from the Python, torch and driver examined: escaped.
        return [untrusted.shown(line) for line in out]

    def to_json(self) -> str:
        return json.dumps(
            {"ok": self.ok, "facts": self.facts, "findings": [asdict(f) for f in self.findings], "entry": self.entry},
            indent=2,
        )


def entry_line(entry: dict[str, Any]) -> str:
    """One flow-style YAML mapping, versions quoted: ``{python: "3.12", ..., archs: [90]}``."""
    parts = []
    for key, value in entry.items():
        text = "[" + ", ".join(str(v) for v in value) + "]" if isinstance(value, list) else json.dumps(value)
        parts.append(f"{key}: {text}")
    return "{" + ", ".join(parts) + "}"


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=120, **kwargs)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _last_json(proc: subprocess.CompletedProcess[str] | None) -> dict[str, Any] | None:
    """The JSON object a probe printed last, or None: a child can print anything, or nothing."""
    lines = proc.stdout.strip().splitlines() if proc is not None and proc.returncode == 0 else []
    try:
        data = json.loads(lines[-1]) if lines and len(lines[-1]) < (1 << 20) else None
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


_FULL_VERSION = re.compile(r"3\.\d{1,3}\.\d{1,3}")
_GPU_LINE = re.compile(r"(?P<name>.+),\s*(?P<cap>\d{1,2}\.\d{1,2})\s*,\s*(?P<driver>[0-9][0-9.]{0,31})")


# --- probes ---------------------------------------------------------------------------------


def probe_python(report: Report, python: str) -> str | None:
    proc = _run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
    if proc is None or proc.returncode != 0:
        report.add("Python", FAIL, f"{python} does not run")
        return None
    full = proc.stdout.strip()
    if not _FULL_VERSION.fullmatch(full):
        report.add("Python", FAIL, f"{python} runs, but does not say which Python it is (it printed {full[:80]!r})")
        return None
    report.facts["python"] = full
    report.add("Python", OK, f"{full} ({python})")
    return ".".join(full.split(".")[:2])


def probe_torch(report: Report, python: str, table) -> environment.TorchInfo | None:
    try:
        torch = environment.probe_torch(python)
    except EnvironmentProblem as exc:
        report.facts["torch"] = None
        # The message alone: a finding is one line, and the error's hint speaks of building a wheel.
        report.add(
            "torch", WARN, f"not importable: {exc.message}", fix="install the torch you will run, then run doctor again"
        )
        return None
    report.facts["torch"] = {"version": torch.version, "cuda": torch.cuda, "cxx11_abi": torch.cxx11_abi}
    abi = f"{'new' if torch.cxx11_abi else 'old'} C++ ABI (cxx11_abi={torch.cxx11_abi})"
    if torch.cuda is None:
        public = torch.version.split("+")[0]
        release = table.torch.get(public) if table else None
        tag = contract.cuda_tag(release.default_cuda) if release else "cuXYZ"
        report.add(
            "torch",
            WARN,
            f"{torch.version}, a CPU build, {abi}: flash-attn needs a CUDA build of torch",
            fix=environment.cuda_torch_command(public, tag),
        )
    else:
        report.add("torch", OK, f"{torch.version}, CUDA {torch.cuda}, {abi}")
    return torch


def probe_toolchain(report: Report, torch: environment.TorchInfo | None) -> None:
    try:
        nvcc = environment.probe_nvcc()
    except EnvironmentProblem as exc:
        report.facts["nvcc"] = None
        report.add("nvcc", INFO, f"{exc.message}; only needed to build here (fa-images build uses a devel image)")
    else:
        report.facts["nvcc"] = {"path": str(nvcc.path), "version": nvcc.version}
        if torch and torch.cuda and torch.cuda.split(".")[0] != nvcc.version.split(".")[0]:
            report.add(
                "nvcc",
                WARN,
                f"{nvcc.version} at {nvcc.path}, but torch was built with CUDA {torch.cuda}: a build here would fail",
                fix=f"point CUDA_HOME at a CUDA {torch.cuda.split('.')[0]}.x toolkit",
            )
        else:
            report.add("nvcc", OK, f"{nvcc.version} at {nvcc.path}")
    compiler = shutil.which("c++") or shutil.which("g++")
    if not compiler:
        report.facts["compiler"] = None
        report.add("host compiler", INFO, "no c++ or g++ on PATH; only needed to build here")
        return
    version = _run([compiler, "--version"])
    macros = _run([compiler, "-dM", "-E", "-x", "c++", "-include", "cstddef", "/dev/null"])
    first = version.stdout.splitlines()[0] if version and version.stdout else "?"
    match = re.search(r"#define _GLIBCXX_USE_CXX11_ABI (\d)", macros.stdout if macros else "")
    default_abi = None if match is None else match.group(1) == "1"
    report.facts["compiler"] = {"path": compiler, "version": first, "default_cxx11_abi": default_abi}
    note = "" if default_abi is None else f"; its default cxx11_abi={default_abi} (fa-images sets it from torch)"
    report.add("host compiler", OK, f"{first} ({compiler}){note}")


def probe_gpus(report: Report) -> list[dict[str, str]]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        report.facts["driver"], report.facts["gpus"] = None, []
        report.add("GPUs", INFO, "no nvidia-smi: no NVIDIA driver visible here")
        return []
    proc = _run([smi, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"])
    if proc is None or proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] if proc else ["did not run"]
        report.add("GPUs", WARN, f"nvidia-smi failed: {' '.join(last)}", fix="check the NVIDIA driver")
        return []
    gpus = []
    for line in proc.stdout.strip().splitlines():
        match = _GPU_LINE.fullmatch(line.strip())  # the name may hold commas; the last two fields may not
        if match is None:
            report.add("GPUs", WARN, f"nvidia-smi printed a line doctor cannot read: {line[:120]!r}")
            continue
        gpus.append({"name": match["name"].strip(), "compute_capability": match["cap"], "driver": match["driver"]})
    report.facts["gpus"] = gpus
    report.facts["driver"] = gpus[0]["driver"] if gpus else None
    if not gpus:
        report.add("GPUs", WARN, "nvidia-smi lists no GPU")
    for gpu in gpus:
        usable = _version(gpu["compute_capability"]) >= Version("8.0")
        report.add(
            f"GPU {gpu['name']}",
            OK if usable else FAIL,
            f"compute capability {gpu['compute_capability']}, driver {gpu['driver']}"
            + ("" if usable else ": flash-attn 2 needs 8.0 (Ampere) or newer"),
        )
    return gpus


def probe_driver(report: Report, torch: environment.TorchInfo | None, gpus: list[dict[str, str]], table) -> None:
    if not (torch and torch.cuda and gpus and table):
        return
    cuda = table.cuda.get(".".join(torch.cuda.split(".")[:2]))
    driver = gpus[0]["driver"]
    if cuda and cuda.min_driver and _version(driver) < _version(cuda.min_driver):
        report.add(
            "driver",
            FAIL,
            f"{driver} is older than {cuda.min_driver}, the oldest that runs CUDA {cuda.version} "
            f"(torch {torch.version})",
            fix=f"update the driver, or use a torch built for an older CUDA (driver {driver})",
        )
    elif cuda and cuda.min_driver:
        report.add("driver", OK, f"{driver} runs CUDA {cuda.version} (needs >= {cuda.min_driver})")


def probe_build_memory(report: Report, archs: list[str]) -> None:
    memory, cpus = environment.available_memory(), environment.available_cpus()
    sizing = environment.size_parallelism(targets=max(1, len(archs)), memory=memory, cpus=cpus)
    report.facts["build"] = {
        "memory_bytes": memory,
        "cpus": cpus,
        "max_jobs": sizing.max_jobs,
        "nvcc_threads": sizing.nvcc_threads,
    }
    report.add(
        "build resources",
        INFO,
        f"{memory / environment.GIB:.1f} GiB usable, {counted(cpus, 'CPU')}: MAX_JOBS={sizing.max_jobs} "
        f"NVCC_THREADS={sizing.nvcc_threads} ({sizing.reason})",
    )


# An installed flash-attn: where its extension is and what version, without importing it.
_FIND_PROBE = (
    "import importlib.util, importlib.metadata, json\n"
    "spec = importlib.util.find_spec('flash_attn_2_cuda')\n"
    "try:\n    version = importlib.metadata.version('flash_attn')\n"
    "except importlib.metadata.PackageNotFoundError:\n    version = None\n"
    "print(json.dumps({'so': spec.origin if spec else None, 'version': version}))"
)
# Imports in the order a user meets them; each failure is reported by name.
_IMPORT_PROBE = (
    "import importlib, json, sys\n"
    "out = {}\n"
    "for name in ['torch', 'flash_attn_2_cuda', 'flash_attn'] + sys.argv[1:]:\n"
    "    try:\n        importlib.import_module(name)\n        out[name] = None\n"
    "    except Exception as exc:\n"
    "        out[name] = {'type': type(exc).__name__, 'message': str(exc), 'missing': getattr(exc, 'name', None)}\n"
    "        if name in ('torch', 'flash_attn_2_cuda'):\n            break\n"
    "print(json.dumps(out))"
)


def probe_flash_attn(
    report: Report,
    python: str,
    torch: environment.TorchInfo | None,
    gpus: list[dict[str, str]],
    table,
    archs: list[str],
) -> str | None:
    info = _last_json(_run([python, "-c", _FIND_PROBE])) or {}
    so = info.get("so")
    if not so or not isinstance(so, str):
        report.facts["flash_attn"] = None
        report.add("flash-attn", INFO, "not installed for this Python")
        return None
    version = info.get("version") if isinstance(info.get("version"), str) else None
    version = version or "?"
    report.facts["flash_attn"] = {"version": version, "extension": so}
    report.add("flash-attn", INFO, f"{version}, extension {so}")
    # The same checks as `inspect`, on the installed extension.
    try:
        abi, why = verify.abi_from_symbols(elf.undefined_dynamic_symbols(Path(so)))
        cubins, ptx, how = verify.gpu_archs(Path(so))
    except (elf.ElfError, OSError, ValueError) as exc:
        report.add("flash-attn extension", FAIL, f"{so} is not a readable shared library: {exc}")
        return version
    report.facts["flash_attn"].update(
        cxx11_abi=abi, cubin_archs=gpuarch.sorted_archs(cubins), ptx_archs=gpuarch.sorted_archs(ptx)
    )
    if torch is not None and abi is not None and abi != torch.cxx11_abi:
        report.add(
            "flash-attn C++ ABI",
            FAIL,
            f"the extension uses cxx11_abi={abi} but torch {torch.version} uses cxx11_abi={torch.cxx11_abi} ({why})",
        )
    elif abi is not None:
        report.add("flash-attn C++ ABI", OK, f"cxx11_abi={abi}, as torch ({why})")
    _check_glibc_floor(report, Path(so))
    _check_archs(report, cubins, ptx, how, gpus)
    _check_imports(report, python, torch, version, table, archs)
    return version


def _check_glibc_floor(report: Report, so: Path) -> None:
    """The newest glibc and libstdc++ symbol versions the extension imports, against this host's."""
    try:
        glibc, glibcxx = verify.glibc_floor(so)
    except (elf.ElfError, OSError, ValueError, struct.error) as exc:
        report.add("flash-attn glibc floor", FAIL, f"{so}: its symbol versions cannot be read: {exc}")
        return
    report.facts["flash_attn"].update(glibc_floor=glibc, glibcxx_floor=glibcxx)
    status, detail = verify.floor_findings(glibc, glibcxx, (verify.host_glibc(), verify.host_glibcxx()))
    report.add(
        "flash-attn glibc floor",
        OK if status == "pass" else FAIL,
        detail,
        fix=None if status == "pass" else "build the wheel on a base with an older glibc (a manylinux_2_28 devel base)",
    )


def _check_archs(report: Report, cubins: set[str], ptx: set[str], how: str, gpus: list[dict[str, str]]) -> None:
    """Each GPU here against the extension's code, by CUDA's rule (``builder.gpuarch``), as `check` judges it."""
    for gpu in gpus:
        major, _, minor = gpu["compute_capability"].partition(".")
        if not (major.isdigit() and minor.isdigit()):
            continue
        arch = gpuarch.verdict(cubins, ptx, (int(major), int(minor)))
        report.add(
            f"flash-attn kernels for {gpu['name']}",
            OK if arch.runs else FAIL,
            f"{arch.line()} ({how})",
            fix=None if arch.runs else f"rebuild with archs [{major}0], or run this wheel on such a GPU",
        )


def _check_imports(report: Report, python: str, torch, version: str, table, archs: list[str]) -> None:
    proc = _run([python, "-c", _IMPORT_PROBE, *IMPORTED_MODULES])
    results = _last_json(proc)
    if results is None or not all(v is None or isinstance(v, dict) for v in results.values()):
        err = (proc.stderr.strip().splitlines() or ["no output"])[-1] if proc else "did not run"
        report.add("flash-attn import", FAIL, f"the import crashed the interpreter: {err}")
        return
    ext = results.get("flash_attn_2_cuda")
    if ext is not None:
        message = str(ext.get("message"))
        if "undefined symbol" in message:
            symbol = message.rsplit("undefined symbol:", 1)[-1].strip()
            old_abi = bool(verify.OLD_ABI_STRING.search(symbol))
            built = "the old C++ ABI (cxx11_abi=False)" if old_abi else "another torch or C++ ABI"
            torch_text = f"torch {torch.version} (cxx11_abi={torch.cxx11_abi})" if torch else "this torch"
            report.add(
                "flash-attn import",
                FAIL,
                f"undefined symbol {symbol}: flash-attn {version} was built for {built}, not for {torch_text}. "
                "This is the classic mismatch; patching setup.py to -D_GLIBCXX_USE_CXX11_ABI=0 causes it for "
                "every pip torch >= 2.7",
                fix=f"pip uninstall -y flash-attn, then build one for this torch: "
                f"fa-images wheel --flash-attn {version.split('+')[0]} --archs {','.join(archs)} "
                "(reads the ABI from torch), or the matrix entry below",
            )
        else:
            report.add("flash-attn import", FAIL, f"import flash_attn_2_cuda: {ext.get('type')}: {message}")
        return
    report.add("flash-attn import", OK, "flash_attn_2_cuda imports next to torch")
    minor = ".".join(str(report.facts.get("python", "")).split(".")[:2])  # the runtime pins are per Python
    pins = {p.partition("==")[0]: p for p in (table.runtime_deps_for(minor) if table else ())}
    for name in ("flash_attn", *IMPORTED_MODULES):
        failure = results.get(name)
        if failure is None:
            continue
        missing = failure.get("missing") if isinstance(failure.get("missing"), str) else ""
        if missing and not missing.startswith("flash_attn"):
            pin = pins.get(missing.split(".")[0], missing.split(".")[0])
            report.add(f"import {name}", FAIL, f"needs {missing}, which is not installed", fix=f"pip install {pin}")
        else:
            report.add(f"import {name}", WARN, f"{failure.get('type')}: {failure.get('message')}")


# --- the entry to build -----------------------------------------------------------------------


def _version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


def gpu_archs(gpus: list[dict[str, str]], table) -> list[str]:
    """The flash-attn archs for the GPUs seen here that can run it."""
    archs = {
        table.arch_for_capability(g["compute_capability"])
        for g in gpus
        if _version(g["compute_capability"]) >= Version("8.0")
    }
    return sorted((a for a in archs if a), key=int)


def suggest_entry(
    report: Report,
    python: str | None,
    torch: environment.TorchInfo | None,
    gpus: list[dict[str, str]],
    table,
    installed: str | None = None,
) -> None:
    if table is None or python is None:
        return
    notes = []
    if python not in table.pythons:
        report.add("matrix entry", WARN, f"fa-images builds for Python {', '.join(table.pythons)}, not {python}")
        return
    driver = _version(gpus[0]["driver"]) if gpus else None

    def runnable_cuda(release) -> str | None:
        """The newest CUDA variant of ``release`` that this driver runs (any, with no driver seen)."""
        for variant in sorted(release.variants, key=lambda v: Version(v.cuda), reverse=True):
            min_driver = table.cuda[variant.cuda].min_driver
            if driver is None or not min_driver or driver >= _version(min_driver):
                return variant.cuda
        return None

    release = None
    cuda = None
    if torch is not None:
        public = torch.version.split("+")[0]
        release = table.torch.get(public)
        if release is None:
            notes.append(f"torch {public} is not in the compat table")
        elif torch.cuda:  # build for the torch that is here, as it is
            cuda = ".".join(torch.cuda.split(".")[:2])
            if release.variant(cuda) is None:
                notes.append(f"torch {public} has no CUDA {cuda} variant in the table")
                release = None
        else:
            cuda = runnable_cuda(release)
            if cuda is None:
                notes.append(f"no CUDA variant of torch {public} runs on driver {driver}")
                release = None
            else:
                notes.append(f"torch {public} here is a CPU build; the entry names its CUDA {cuda} build")
    if release is None:  # the newest torch for this Python with a variant the driver runs
        for version in sorted(table.torch, key=Version, reverse=True):
            candidate = table.torch[version]
            if python in candidate.pythons and runnable_cuda(candidate):
                release, cuda = candidate, runnable_cuda(candidate)
                runs = f" that driver {driver} runs" if driver else ""  # none seen: a note below says so
                notes.append(f"suggesting torch {version}, the newest for Python {python}{runs}")
                break
    if release is None:
        report.add("matrix entry", WARN, f"no torch in the compat table fits Python {python}")
        return
    archs = gpu_archs(gpus, table)
    if not archs:
        archs = ["80", "90"]
        notes.append("no GPU seen here: archs 80 (A100, A10G, L4) and 90 (H100); change them to your GPUs")
    public = (installed or "").split("+")[0]
    flash_attn = public if public in table.flash_attn else max(table.flash_attn, key=Version)
    entry: dict[str, Any] = {"python": python, "torch": release.version}
    if cuda and cuda != release.default_cuda:
        entry["cuda"] = cuda
    entry.update(flash_attn=flash_attn, archs=[int(a) for a in archs])
    problem = _validate(entry)
    if problem:
        report.add("matrix entry", WARN, f"{entry_line(entry)} does not validate: {problem}")
        return
    report.entry = entry
    report.add("matrix entry", OK, "; ".join(notes) or "fits this machine's torch and GPUs")


def _validate(entry: dict[str, Any]) -> str | None:
    """Loads the entry as ``plan`` would; the problem, or None."""
    from .config import matrix
    from .errors import ConfigError

    with tempfile.TemporaryDirectory(prefix="fa-doctor-") as tmp:
        path = Path(tmp) / "matrix.yaml"
        path.write_text("entries:\n  - " + entry_line(entry) + "\n")
        try:
            matrix.load(path)
        except ConfigError as exc:
            return "; ".join(p.message for p in exc.problems)
    return None


def run(*, python: str = sys.executable) -> Report:
    report = Report()
    try:
        from .config import compat

        table = compat.load()
    except ImportError as exc:  # doctor still reports the machine without the table's extras
        table = None
        report.add("compat table", WARN, f"not loaded ({exc}); no matrix entry suggested")
    py = probe_python(report, python)
    torch = probe_torch(report, python, table) if py else None
    probe_toolchain(report, torch)
    gpus = probe_gpus(report)
    probe_driver(report, torch, gpus, table)
    archs = gpu_archs(gpus, table) if table else []
    probe_build_memory(report, archs)
    installed = probe_flash_attn(report, python, torch, gpus, table, archs or ["80", "90"]) if py else None
    suggest_entry(report, py, torch, gpus, table, installed)
    return report


def main(*, python: str, as_json: bool) -> int:
    report = run(python=python)
    print(report.to_json() if as_json else "\n".join(report.lines()))
    return 0 if report.ok else 1
