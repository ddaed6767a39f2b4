"""Decides whether a flash-attn wheel is sound before anyone installs it.

Each check answers one question a user of the field's recipes had to answer by hand:
is this a compiled wheel for my Python (not ``py3-none-any``), does it hold the
extension, does its C++ ABI match torch (read from the symbols it imports), does it
carry kernels for my GPUs, and does it import next to torch. Works without a GPU and
without nvcc; uses cuobjdump when one is around and reads the ELF otherwise.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import elf, generations, gpuarch, untrusted, wheelfile
from .errors import UsageError, VerificationFailed
from .source import sha256_of

# One arch of flash-attn is ~212 MB of .so; all of them with PTX stay well below this.
MAX_EXTENSION = 4 << 30
# A Linux platform tag's architecture: linux_x86_64, manylinux2014_aarch64, manylinux_2_28_x86_64, musllinux_1_2_i686
_LINUX_PLATFORM = re.compile(r"(?:linux|manylinux\d+|(?:many|musl)linux_\d+_\d+)_(?P<arch>.+)")
# Old-ABI std::string mangles as the substitution "Ss" (e.g. RKSs), new-ABI as std::__cxx11::.
OLD_ABI_STRING = re.compile(r"(?:RK|K|R|E|I|P|_)Ss|^_ZNSs|^_ZNKSs")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "pass", "fail" or "skip"
    detail: str


@dataclass
class WheelReport:
    wheel: str
    sha256: str = ""
    version: str | None = None
    tags: list[str] = field(default_factory=list)
    extension: str | None = None
    cxx11_abi: bool | None = None
    cubin_archs: list[str] = field(default_factory=list)
    ptx_archs: list[str] = field(default_factory=list)
    torch_requirement: str | None = None  # "torch==2.9.*": what the wheel's METADATA asks for
    torch_series: str | None = None  # "2.9", where that is one torch series
    glibc_floor: str | None = None  # "GLIBC_2.34": the newest glibc symbol version the extension imports
    glibcxx_floor: str | None = None  # "GLIBCXX_3.4.30": the same for libstdc++
    manylinux: str | None = None  # "manylinux_2_34": the oldest policy the extension's imports allow
    generation: int | None = None  # 2 or 3: the flash-attn generation, from the wheel's project
    built_with: str | None = None  # what its generation records in the wheel of how it was built
    gpus_here: list[dict] = field(default_factory=list)  # this host's GPUs: name, arch, runs, detail
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def problems(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if c.status == "fail"]

    def add(self, name: str, status: str, detail: str) -> None:
        self.checks.append(Check(name, status, detail))

    def lines(self) -> list[str]:
        """For a terminal: names, METADATA and symbols come from the wheel, so each is escaped."""
        marks = {"pass": "✓", "fail": "✕", "skip": "-"}
        head = f"{self.wheel}: {'sound' if self.ok else 'NOT sound'}"
        return [
            untrusted.shown(line)
            for line in [head] + [f"  {marks[c.status]} {c.name}: {c.detail}" for c in self.checks]
        ]

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok}, indent=2)


def abi_from_symbols(symbols: list[str]) -> tuple[bool | None, str]:
    new = [s for s in symbols if "__cxx11" in s or "B5cxx11" in s]
    old = [s for s in symbols if OLD_ABI_STRING.search(s)]
    if new and old:
        return None, f"mixed: {len(new)} new-ABI and {len(old)} old-ABI imports, e.g. {old[0]}"
    if new:
        return True, f"imports std::__cxx11 symbols, e.g. {new[0]}"
    if old:
        return False, f"imports old-ABI std::string symbols, e.g. {old[0]}"
    return None, "imports no std::string symbols, so the ABI cannot be read"


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    for home in filter(None, [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]):
        candidate = Path(home) / "bin" / "cuobjdump"
        if candidate.exists():
            return str(candidate)
    return None


def gpu_archs(so: Path) -> tuple[set[str], set[str], str]:
    """(cubin archs, PTX archs, how they were read): '80', and with cuobjdump the arch-specific
    '90a' and family '100f' variants too (the ELF reader sees the number only)."""
    tool = _cuobjdump()
    if tool:
        elfs = subprocess.run([tool, "--list-elf", str(so)], capture_output=True, text=True)
        ptxs = subprocess.run([tool, "--list-ptx", str(so)], capture_output=True, text=True)
        if elfs.returncode == 0:
            cubins = set(re.findall(r"\.sm_(\d+[af]?)\.cubin", elfs.stdout))
            ptx = set(re.findall(r"\.sm_(\d+[af]?)\.ptx", ptxs.stdout))
            return cubins, ptx, "cuobjdump"
    cubins, ptx = elf.fatbin_archs(so)
    return cubins, ptx, "ELF .nv_fatbin"


# torch's facts are printed before the extension is imported, so they are known even
# when the import fails (which is when the ABI comparison matters most).
_IMPORT_PROBE = (
    "import json, sys, torch; "
    "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
    "'cxx11_abi': bool(torch._C._GLIBCXX_USE_CXX11_ABI)}), flush=True); "
    "sys.path.insert(0, sys.argv[1]); import importlib; importlib.import_module(sys.argv[2])"
)


def run_python(python: str, args: list[str], *, timeout: float = 600) -> subprocess.CompletedProcess[str] | None:
    """Runs another interpreter; None when it cannot be started or does not finish. What it
    prints is its own word, read with ``torch_facts``: a broken or lying Python is not a crash."""
    try:
        return subprocess.run(
            [python, *args], capture_output=True, text=True, errors="replace", timeout=timeout, check=False
        )
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def torch_facts(line: str) -> dict | None:
    """{'torch': str, 'cuda': str | None, 'cxx11_abi': bool} from the probe's first line, or None
    if it says anything else."""
    try:
        info = json.loads(line) if line.startswith("{") and len(line) < 4096 else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("torch"), str):
        return None
    if not isinstance(info.get("cxx11_abi"), bool) or not isinstance(info.get("cuda"), (str, type(None))):
        return None
    return info


def _import_check(unpacked: Path, python: str, module: str) -> tuple[str, str, dict]:
    proc = run_python(python, ["-c", _IMPORT_PROBE, str(unpacked), module])
    if proc is None:
        return "fail", f"{python} could not be run", {}
    out = proc.stdout.strip().splitlines()
    info = (torch_facts(out[0]) if out else None) or {}
    if proc.returncode == 0 and info:
        return "pass", f"imports next to torch {info['torch']}", info
    if proc.returncode == 0:
        return "fail", f"{python} exited without saying which torch it imported", {}
    err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    if "No module named 'torch'" in err:
        return "skip", f"{python} has no torch to import against", {}
    return "fail", err, info


def inspect_wheel(
    path: Path,
    *,
    expect_python: str | None = None,
    expect_cxx11_abi: bool | None = None,
    expect_archs: tuple[str, ...] | list[str] | None = None,
    python: str = sys.executable,
    import_check: bool = True,
    gpus: list[tuple[str, tuple[int, int]]] | None = None,
) -> WheelReport:
    """``gpus``: (name, compute capability) of the GPUs to judge the GPU code for; None asks nvidia-smi."""
    if not path.is_file():
        raise UsageError(f"{path} is not a file")
    try:
        report = WheelReport(wheel=path.name, sha256=sha256_of(path))
    except untrusted.UntrustedInput as exc:
        raise UsageError(str(exc)) from None
    try:
        _name, version, _build, tags = parse_wheel_filename(path.name)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise UsageError(f"{path.name} is not a wheel file name: {exc}") from None
    report.version = str(version)
    report.tags = sorted(str(t) for t in tags)
    gen = generations.of_project(str(_name))
    report.generation = gen.number if gen else None
    _check_tags(report, tags, expect_python, gen or generations.FA2)

    label = (gen or generations.FA2).steps().label(version.local or "")
    try:
        with wheelfile.open_wheel(path) as wheel, tempfile.TemporaryDirectory(prefix="fa-inspect-") as tmp:
            _inspect_members(
                report, wheel, Path(tmp), label, expect_cxx11_abi, expect_archs, python, import_check, gpus, gen
            )
    except wheelfile.BadWheel as exc:
        raise UsageError(str(exc)) from None
    return report


def _inspect_members(
    report: WheelReport,
    wheel: wheelfile.Wheel,
    tmp: Path,
    label: re.Match[str] | None,
    expect_cxx11_abi: bool | None,
    expect_archs,
    python: str,
    import_check: bool,
    gpus: list[tuple[str, tuple[int, int]]] | None,
    gen: generations.Generation | None,
) -> None:
    """The checks of what is inside the wheel, read as pip reads it."""
    tags = wheel.tags
    metadata = _check_metadata(report, wheel, gen)
    if gen is None:
        return
    steps = gen.steps()
    steps.check_wheel(report, wheel)  # what it records of its build
    if not gen.abi3:  # a wheel on torch's own ABI pins the torch series it was built against
        _check_torch_pin(report, metadata, label["torch"] if label else None)
    so_names = [n for n in wheel.members if gen.owns(n)]
    if not so_names:
        report.add("extension", "fail", f"no {gen.extension_member}*.so in the wheel: it holds no compiled kernels")
        return
    report.extension = so_names[0]
    report.add("extension", "pass", so_names[0])
    _check_machine(report, wheel)
    so = _extract_bounded(wheel.zf, so_names[0], tmp, wheel.shown)
    # The torch it is next to, first: the ABI and the label are compared with that torch.
    imported = _import_next_to_torch(tmp, python, tags, gen) if import_check else None
    torch_here = imported[2] if imported else {}
    try:
        if gen.abi3:
            report.add("C++ ABI", "pass", "none to match: built on torch's stable C ABI")
        else:
            _check_abi(report, so, *_expected_abi(expect_cxx11_abi, torch_here, label))
        steps.check_label(report, label, torch_here)
        _check_archs(report, so, expect_archs, gpuarch.visible_gpus() if gpus is None else gpus)
        _check_gpu_class(report, label)
        _check_glibc_floor(report, so, on_this_host=import_check)
        _check_manylinux(report, so, tags)
    except (elf.ElfError, ValueError, struct.error, IndexError, OverflowError) as exc:
        report.add("ELF", "fail", f"{so_names[0]} is not a readable shared library: {exc}")
        return
    if imported:
        _report_import(report, python, *imported)


def _extract_bounded(zf: zipfile.ZipFile, name: str, dest: Path, shown: str) -> Path:
    """Extracts one member, refusing more than MAX_EXTENSION bytes declared or actually inflated."""
    info = zf.getinfo(name)
    if info.file_size > MAX_EXTENSION:
        raise UsageError(f"{shown}: {name} declares {info.file_size >> 20} MiB, more than {MAX_EXTENSION >> 20} MiB")
    target = dest / name  # wheelfile has refused a member that would land outside
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    try:
        with zf.open(info) as src, target.open("wb") as out:
            while chunk := src.read(1 << 20):
                written += len(chunk)
                if written > min(info.file_size, MAX_EXTENSION):
                    raise UsageError(f"{shown}: {name} inflates past its declared size; refusing a zip bomb")
                out.write(chunk)
    except wheelfile.DAMAGED as exc:
        raise UsageError(f"{shown} is a damaged wheel: {exc}") from None
    return target


def _check_tags(report: WheelReport, tags, expect_python: str | None, gen: generations.Generation) -> None:
    tag = sorted(tags, key=str)[0]
    if gen.abi3:
        _check_abi3_tag(report, tag, expect_python)
        return
    if tag.interpreter.startswith("py") or tag.abi == "none" or tag.platform == "any":
        report.add(
            "platform tag",
            "fail",
            f"{tag} is a pure-Python tag: a prebuilt-download placeholder that holds no kernels "
            "built for this torch; build from source instead",
        )
        return
    if (
        not re.fullmatch(r"cp3\d+", tag.interpreter)
        or tag.abi != tag.interpreter
        or not tag.platform.endswith("x86_64")
    ):
        report.add("platform tag", "fail", f"{tag} is not cpXY-cpXY-linux_x86_64")
        return
    if expect_python and tag.interpreter != "cp" + expect_python.replace(".", ""):
        report.add("platform tag", "fail", f"{tag} is for {tag.interpreter}, expected Python {expect_python}")
        return
    report.add("platform tag", "pass", str(tag))


def _check_abi3_tag(report: WheelReport, tag, expect_python: str | None) -> None:
    """cp3X-abi3-linux_x86_64: one wheel for Python 3.X and every later one."""
    oldest = re.fullmatch(r"cp3(\d+)", tag.interpreter)
    if not oldest or tag.abi != "abi3" or not tag.platform.endswith("x86_64"):
        report.add("platform tag", "fail", f"{tag} is not cp3X-abi3-linux_x86_64")
        return
    if expect_python and int(expect_python.split(".")[1]) < int(oldest.group(1)):
        report.add("platform tag", "fail", f"{tag} is for Python >= 3.{oldest.group(1)}, expected {expect_python}")
        return
    report.add("platform tag", "pass", f"{tag}: every Python >= 3.{oldest.group(1)}")


def _check_metadata(report: WheelReport, wheel: wheelfile.Wheel, gen: generations.Generation | None) -> str | None:
    """The wheel's METADATA (the one pip reads, in its own dist-info) against its file name;
    returns the METADATA's text, or None where it has none."""
    data = wheel.metadata()
    if data is None:
        report.add("metadata", "fail", f"no {wheel.dist_info}/METADATA")
        return None
    text = data.decode(errors="replace")
    headers = email.parser.Parser().parsestr(text, headersonly=True)
    meta_name, meta_version = (str(headers[h]).strip() if headers[h] is not None else None for h in ("Name", "Version"))
    project, version = wheel.name, str(wheel.version)
    if meta_version != version:
        report.add("metadata", "fail", f"file name says {version}, METADATA says {meta_version}")
    elif meta_name is not None and canonicalize_name(meta_name) != project:
        report.add("metadata", "fail", f"file name says {project}, METADATA says {meta_name}")
    elif gen is None:
        known = ", ".join(g.project for g in generations.GENERATIONS)
        report.add("metadata", "fail", f"a wheel of {project}, not of flash-attn ({known})")
    else:
        report.add("metadata", "pass", f"version {version} in file name and METADATA")
    return text


def _platform_machines(tags) -> dict[str, elf.Machine | None]:
    """{platform tag: the ELF machine it stands for (None: an architecture not known here)}."""
    found: dict[str, elf.Machine | None] = {}
    for tag in tags:
        match = _LINUX_PLATFORM.fullmatch(tag.platform)
        if match:
            found[tag.platform] = elf.ARCH_MACHINES.get(match["arch"])
    return found


def _check_machine(report: WheelReport, wheel: wheelfile.Wheel) -> None:
    """Every shared library in the wheel is for the CPU its platform tag names: e_machine, and
    the 32/64-bit class and byte order that architecture implies."""
    platforms = _platform_machines(wheel.tags)
    if not platforms or None in platforms.values():
        unknown = ", ".join(sorted(p for p, m in platforms.items() if m is None)) or "no Linux platform tag"
        report.add("machine", "skip", f"{unknown}: no ELF machine known to compare with")
        return
    wrong = []
    for member in wheel.shared_objects():
        try:
            have = elf.machine_of(wheel.head(member, elf.ELF_HEADER))
        except elf.ElfError:
            wrong.append(f"{member} is not an ELF file")
            continue
        wrong += [f"{member} is {have}, but its tag {p} needs {need}" for p, need in platforms.items() if have != need]
    if wrong:
        report.add("machine", "fail", "; ".join(wrong[:3]) + (f"; and {len(wrong) - 3} more" if len(wrong) > 3 else ""))
    else:
        needs = ", ".join(sorted({str(m) for m in platforms.values()}))
        report.add("machine", "pass", f"{len(wheel.shared_objects())} shared libraries for {needs}")


def torch_requirements(metadata: str) -> list[Requirement]:
    """The ``Requires-Dist`` entries of a METADATA text that name torch (headers only: the
    description after the first blank line is free text)."""
    headers = re.split(r"\r?\n\r?\n", metadata, maxsplit=1)[0]
    found = []
    for match in re.finditer(r"^Requires-Dist:[ \t]*(.+)$", headers, re.MULTILINE):
        try:
            requirement = Requirement(match.group(1).strip())
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) == "torch":
            found.append(requirement)
    return found


def _check_torch_pin(report: WheelReport, text: str | None, label_torch: str | None) -> None:
    """The wheel must pin the torch series it was built against (``torch==X.Y.*``), or pip
    and uv install it next to any torch, where it fails to import or crashes."""
    if text is None:
        return  # _check_metadata has said so
    requirements = torch_requirements(text)
    if not requirements:
        report.add("torch pin", "skip", "METADATA requires no torch: nothing to pair the wheel with")
        return
    report.torch_requirement = ", ".join(str(r) for r in requirements)
    # torch==2.9.* (the GPU indexes' convention, and what fa-images writes) or an exact torch==2.9.1
    pins = [
        ".".join(spec.version.removesuffix(".*").split(".")[:2])
        for r in requirements
        for spec in r.specifier
        if spec.operator == "=="
    ]
    if len(requirements) != 1 or len(pins) != 1 or not re.fullmatch(r"\d+\.\d+", pins[0]):
        report.add(
            "torch pin",
            "fail",
            f"requires {report.torch_requirement}, not one torch series (torch==X.Y.*): pip and uv would "
            "install it next to a torch it was not built for",
        )
        return
    if label_torch is not None and label_torch != pins[0]:
        report.add("torch pin", "fail", f"requires {report.torch_requirement} but its label says torch {label_torch}")
        return
    report.torch_series = pins[0]
    report.add("torch pin", "pass", f"requires {report.torch_requirement}" + (", as its label" if label_torch else ""))


def _pin_excludes(report: WheelReport, torch_version: str) -> bool:
    """Whether the wheel's torch pin refuses ``torch_version`` (e.g. a 2.9 wheel next to torch 2.11)."""
    if report.torch_series is None:
        return False
    try:
        return ".".join(map(str, Version(torch_version).release[:2])) != report.torch_series
    except InvalidVersion:
        return False


def glibc_floor(so: Path) -> tuple[str | None, str | None]:
    """(highest GLIBC_x.y, highest GLIBCXX_x.y.z) that ``so`` imports: the oldest glibc and
    libstdc++ it loads with. Read from its ``.gnu.version_r``, any library it names."""
    needed = elf.needed_versions(so)
    every = {v for versions in needed.values() for v in versions}
    return elf.highest(every, "GLIBC"), elf.highest(every, "GLIBCXX")


def host_glibc() -> str | None:
    """'GLIBC_2.36' for the glibc this process runs on; None where it is not glibc."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        found = ""
    match = re.fullmatch(r"glibc (\d+\.\d+)", found.strip())
    return f"GLIBC_{match.group(1)}" if match else None


def host_glibcxx() -> str | None:
    """The newest GLIBCXX_ version the libstdc++ this process loads defines, or None."""
    import ctypes

    try:
        ctypes.CDLL("libstdc++.so.6")
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = sorted(
        {
            line.split()[-1]
            for line in maps.splitlines()
            if line.rstrip().endswith("libstdc++.so.6") or "/libstdc++.so.6." in line
        }
    )
    for path in paths:
        try:
            return elf.highest(elf.defined_versions(Path(path)), "GLIBCXX")
        except (OSError, elf.ElfError, ValueError, struct.error):
            continue
    return None


def floor_findings(glibc: str | None, glibcxx: str | None, host: tuple[str | None, str | None]) -> tuple[str, str]:
    """(status, detail) of a floor against a host's (glibc, GLIBCXX): fail where the host is older."""
    needs = ", ".join(v for v in (glibc, glibcxx) if v) or "no versioned glibc or libstdc++ symbols"
    older = [
        f"{have} < {need}"
        for need, have in ((glibc, host[0]), (glibcxx, host[1]))
        if need and have and elf.version_key(have) < elf.version_key(need)
    ]
    shown = ", ".join(f"{h}" for h in host if h) or "unknown"
    if older:
        return "fail", f"needs {needs}; this host has {shown}: it cannot load here ({'; '.join(older)})"
    return "pass", f"needs {needs}; this host has {shown}"


def _check_glibc_floor(report: WheelReport, so: Path, *, on_this_host: bool) -> None:
    """The floor against this host's glibc and libstdc++: a failure where the wheel is meant to
    run here (the import check runs), only a note where it is not (``--no-import``, ``dist merge``
    of wheels built for other machines)."""
    report.glibc_floor, report.glibcxx_floor = glibc_floor(so)
    status, detail = floor_findings(report.glibc_floor, report.glibcxx_floor, (host_glibc(), host_glibcxx()))
    report.add("glibc floor", status if on_this_host or status == "pass" else "skip", detail)


def _check_manylinux(report: WheelReport, so: Path, tags) -> None:
    """The manylinux tag the extension allows (as auditwheel decides it); a wheel whose own
    manylinux tag claims an older policy than that is refused: it would install where it cannot load."""
    from . import manylinux

    policy, why = manylinux.policy_of(so)
    report.manylinux = policy
    claimed = sorted({t.platform for t in tags if t.platform.startswith("manylinux")})
    allowed = manylinux.allowed_names(policy)
    wrong = [c for c in claimed if c.removesuffix("_x86_64") not in allowed]
    if wrong:
        report.add(
            "manylinux", "fail", f"tagged {', '.join(wrong)}, but the extension {why}: it needs {policy or 'linux'}"
        )
    else:
        report.add("manylinux", "pass", f"{policy or 'no manylinux policy'} ({why})")


def _expected_abi(given: bool | None, torch_here: dict, label: re.Match[str] | None) -> tuple[bool | None, str]:
    """The ABI the extension must use, and whose it is: what the caller expects, else the torch it
    is next to (read from that torch), else what the wheel's own label says."""
    if given is not None:
        return given, "torch"
    if torch_here:
        return torch_here["cxx11_abi"], f"torch {torch_here['torch']}"
    if label:
        return label["abi"].lower() == "true", "its label"
    return None, ""


def _check_abi(report: WheelReport, so: Path, expected: bool | None, against: str = "torch") -> None:
    abi, why = abi_from_symbols(elf.undefined_dynamic_symbols(so))
    report.cxx11_abi = abi
    if abi is None:
        report.add("C++ ABI", "fail" if why.startswith("mixed") else "skip", why)
    elif expected is None:
        report.add("C++ ABI", "pass", f"cxx11_abi={abi} ({why}); nothing to compare against")
    elif abi != expected:
        report.add(
            "C++ ABI",
            "fail",
            f"cxx11_abi={abi} but {against} uses {expected}: it would fail to import with 'undefined symbol' ({why})",
        )
    else:
        report.add("C++ ABI", "pass", f"cxx11_abi={abi}, as {against} ({why})")


def _check_archs(report: WheelReport, so: Path, expected, gpus: list[tuple[str, tuple[int, int]]]) -> None:
    cubins, ptx, how = gpu_archs(so)
    report.cubin_archs = gpuarch.sorted_archs(cubins)
    report.ptx_archs = gpuarch.sorted_archs(ptx)
    found = f"sm_{', sm_'.join(report.cubin_archs) or '-'}" + (f" + PTX {', '.join(report.ptx_archs)}" if ptx else "")
    built = {a.rstrip("af") for a in cubins}
    missing = gpuarch.sorted_archs({a.rstrip("af") for a in expected or ()} - built)
    if not cubins and not ptx:
        report.add("GPU code", "fail", f"no GPU code found ({how})")
    elif missing:
        report.add("GPU code", "fail", f"missing sm_{', sm_'.join(missing)}; has {found} ({how})")
    else:
        report.add("GPU code", "pass", f"{found} ({how})" + "".join(_gpu_here(report, name, cc) for name, cc in gpus))


def _check_gpu_class(report: WheelReport, label: re.Match[str] | None) -> None:
    """A +label that names a GPU class ('.sm120') names the archs the extension carries: a node
    asks for its class by that label, and must get kernels it runs."""
    if label is None or not label.groupdict().get("gpu_class"):
        return
    said = gpuarch.sorted_archs(label["gpu_class"].split("."))
    if said != report.cubin_archs:
        carries = ", ".join(f"sm_{a}" for a in report.cubin_archs) or "none"
        report.add("GPU class", "fail", f"its label names sm{label['gpu_class']}, its extension carries {carries}")
    else:
        report.add("GPU class", "pass", f"sm{label['gpu_class']}, as its label says")


def _gpu_here(report: WheelReport, name: str, capability: tuple[int, int]) -> str:
    """'; NVIDIA H100 (sm_90) cannot run it: ...' for a GPU this host has: sound is the wheel, this
    is the place. The wheel's archs are kept in the report, with what this GPU makes of them."""
    arch = gpuarch.verdict(report.cubin_archs, report.ptx_archs, capability)
    report.gpus_here.append({"name": name, "arch": arch.device, "runs": arch.runs, "detail": arch.line()})
    if arch.runs:
        how = f"sm_{arch.cubin}" if arch.cubin else f"PTX compute_{arch.jit_ptx}, JIT-compiled"
        return f"; {name} ({arch.device}) here runs it ({how})"
    return (
        f"; {name} ({arch.device}) here CANNOT run it: it runs on compute capability "
        f"{gpuarch.where_it_runs(report.cubin_archs, report.ptx_archs)}"
    )


def _import_next_to_torch(unpacked: Path, python: str, tags, gen: generations.Generation) -> tuple[str, str, dict]:
    """(status, detail, torch's facts) of importing the extension with ``python``; skipped when
    ``python`` is not an interpreter the wheel is for."""
    proc = run_python(python, ["-c", "import sys; print('cp%d%d' % sys.version_info[:2])"], timeout=120)
    here = proc.stdout.strip() if proc is not None and proc.returncode == 0 else ""
    interpreter = sorted(tags, key=str)[0].interpreter
    fits = here == interpreter or (
        gen.abi3 and here.startswith("cp3") and interpreter.startswith("cp3") and int(here[3:]) >= int(interpreter[3:])
    )
    if not fits:
        return "skip", f"wheel is {interpreter}{'-abi3' if gen.abi3 else ''}, {python} is {here or 'not runnable'}", {}
    return _import_check(unpacked, python, gen.extension_module)


def _report_import(report: WheelReport, python: str, status: str, detail: str, info: dict) -> None:
    report.add("import", status, detail)
    if info and info.get("torch") and _pin_excludes(report, info["torch"]):
        report.add("torch pin", "fail", f"requires {report.torch_requirement}, but {python} has torch {info['torch']}")


def _check_import(report: WheelReport, unpacked: Path, python: str, tags, gen: generations.Generation) -> None:
    _report_import(report, python, *_import_next_to_torch(unpacked, python, tags, gen))


def accept_wheel(
    wheels: list[Path],
    *,
    expect_python: str,
    expect_cxx11_abi: bool | None,
    expect_archs: tuple[str, ...],
    log: Callable[[str], None],
    python: str = sys.executable,
    import_check: bool = True,
) -> WheelReport:
    """The one gate every wheel passes before it is kept: exactly one wheel, and sound."""
    if len(wheels) != 1:
        raise VerificationFailed(f"expected one wheel, found {len(wheels)}: {[w.name for w in wheels]}")
    try:
        report = inspect_wheel(
            wheels[0],
            expect_python=expect_python,
            expect_cxx11_abi=expect_cxx11_abi,
            expect_archs=expect_archs,
            python=python,
            import_check=import_check,
        )
    except UsageError as exc:  # here the wheel is the build's output, not the user's input
        raise VerificationFailed(str(exc)) from None
    for line in report.lines():
        log(line)
    if not report.ok:
        raise VerificationFailed(f"{wheels[0].name} failed verification: " + "; ".join(report.problems()))
    return report
