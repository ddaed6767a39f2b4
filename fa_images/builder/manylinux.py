"""The manylinux tag a wheel's extension allows, decided as auditwheel decides it.

A wheel built on Ubuntu 22.04 is tagged ``linux_x86_64`` by setuptools, which says nothing about
where it runs: PyPI-style indexes and resolvers only trust ``manylinux_2_X`` tags. The tag is
the oldest manylinux policy whose glibc, libstdc++ and libgcc symbol versions cover every one
the extension imports, provided every library it links is one the policy allows or torch's
and CUDA's own, which the wheel's torch dependency brings (auditwheel would vendor or refuse
them; a flash-attn wheel must use torch's).

Stdlib only; the policies are copied from auditwheel.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from . import elf
from .contract import MILESTONE
from .generations import GENERATIONS

# auditwheel 6.8.2, auditwheel/policy/manylinux-policy.json, x86_64 (MIT; pypa/auditwheel): per
# policy the newest version of each symbol-version kind. Each list there holds every version the
# libraries define up to that newest one, so comparing with the newest is the same as auditwheel's
# membership test for versions a real libc, libstdc++ or libgcc_s defines. Non-numeric versions
# are allowed by name. From 2_17 on: CUDA 12 and 13 do not support older glibc.
_TM = frozenset({"CXXABI_TM_1"})
_F128 = _TM | {"CXXABI_FLOAT128"}
_RELR = _F128 | {"GLIBC_ABI_DT_RELR"}
POLICIES: tuple[tuple[str, dict[str, str], frozenset[str]], ...] = tuple(
    (name, dict(zip(("GLIBC", "GLIBCXX", "CXXABI", "GCC"), newest)), literals)
    for name, newest, literals in (
        ("manylinux_2_17", ("2.17", "3.4.19", "1.3.7", "4.8.0"), _TM),
        ("manylinux_2_24", ("2.24", "3.4.22", "1.3.10", "4.8.0"), _F128),
        ("manylinux_2_26", ("2.26", "3.4.22", "1.3.10", "4.8.0"), _F128),
        ("manylinux_2_27", ("2.27", "3.4.24", "1.3.11", "7.0.0"), _F128),
        ("manylinux_2_28", ("2.28", "3.4.24", "1.3.11", "7.0.0"), _F128),
        ("manylinux_2_31", ("2.31", "3.4.28", "1.3.12", "7.0.0"), _F128),
        ("manylinux_2_34", ("2.34", "3.4.29", "1.3.13", "7.0.0"), _F128),
        ("manylinux_2_35", ("2.35", "3.4.30", "1.3.13", "12.0.0"), _F128),
        ("manylinux_2_36", ("2.36", "3.4.30", "1.3.13", "12.0.0"), _RELR),
        ("manylinux_2_38", ("2.38", "3.4.30", "1.3.13", "12.0.0"), _RELR),
        ("manylinux_2_39", ("2.39", "3.4.33", "1.3.15", "14.0.0"), _RELR),
        ("manylinux_2_40", ("2.40", "3.4.33", "1.3.15", "14.0.0"), _RELR),
        ("manylinux_2_41", ("2.41", "3.4.33", "1.3.15", "14.0.0"), _RELR),
    )
)
# The same file's lib_whitelist, identical for every policy from 2_24 on (2_17 lacks libmvec).
SYSTEM_LIBRARIES = frozenset(
    [
        "libGL.so.1",
        "libICE.so.6",
        "libSM.so.6",
        "libX11.so.6",
        "libXext.so.6",
        "libXrender.so.1",
        "libanl.so.1",
        "libatomic.so.1",
        "libc.so.6",
        "libdl.so.2",
        "libexpat.so.1",
        "libgcc_s.so.1",
        "libglib-2.0.so.0",
        "libgobject-2.0.so.0",
        "libgthread-2.0.so.0",
        "libm.so.6",
        "libmvec.so.1",
        "libnsl.so.1",
        "libpthread.so.0",
        "libresolv.so.2",
        "librt.so.1",
        "libstdc++.so.6",
        "libutil.so.1",
        "libz.so.1",
    ]
)
# torch's and CUDA's libraries: the torch wheel the pin installs brings them (or the driver does).
PROVIDED = re.compile(
    r"lib(c10|torch|shm)(_[a-z_]+)?\.so"
    r"|lib(cuda|cudart|cublas|cublasLt|cufft|curand|cusolver|cusparse|cudnn[a-z_]*|nccl|nvrtc|nvrtc-builtins"
    r"|nvToolsExt|nvJitLink|cupti)\.so(\.\d+)*"
    r"|ld-linux-x86-64\.so\.2"
)
KINDS = ("GLIBC", "GLIBCXX", "CXXABI", "GCC")


def _kind(version: str) -> str | None:
    prefix = version.rpartition("_")[0]
    return prefix if prefix in KINDS else None


def policy_for(needed: dict[str, set[str]], libraries: Iterable[str]) -> tuple[str | None, str]:
    """(the oldest manylinux policy that allows these imports, or None; why)."""
    foreign = sorted(lib for lib in libraries if lib not in SYSTEM_LIBRARIES and not PROVIDED.fullmatch(lib))
    if foreign:
        return None, f"links {', '.join(foreign)}, which no manylinux policy allows (auditwheel would vendor it)"
    versions = {v for lib, vs in needed.items() if lib in SYSTEM_LIBRARIES for v in vs}
    numbered = [v for v in versions if _kind(v) and elf.version_key(v)]
    named = sorted(v for v in versions if v not in numbered and v.partition("_")[0] in KINDS)
    newest = {
        kind: max((v for v in numbered if _kind(v) == kind), key=elf.version_key)
        for kind in KINDS
        if any(_kind(v) == kind for v in numbered)
    }
    shown = ", ".join(newest[k] for k in KINDS if k in newest) or "no versioned symbols"
    for name, limits, literals in POLICIES:
        if set(named) <= literals and all(
            elf.version_key(v) <= elf.version_key(f"{k}_{limits[k]}") for k, v in newest.items()
        ):
            return name, f"imports {shown}"
    return (
        None,
        f"imports {shown}{' and ' + ', '.join(named) if named else ''}, newer than every manylinux policy known",
    )


def allowed_names(policy: str | None) -> set[str]:
    """The policy names a wheel needing ``policy`` may carry: it and every newer one, with the
    legacy aliases (manylinux2014 is manylinux_2_17)."""
    names = [name for name, _limits, _literals in POLICIES]
    if policy not in names:
        return set()
    newer = set(names[names.index(policy) :])
    return newer | ({"manylinux2014"} if "manylinux_2_17" in newer else set())


def policy_of(so: Path) -> tuple[str | None, str]:
    return policy_for(elf.needed_versions(so), elf.needed_libraries(so))


def retag(wheel: Path, platform: str) -> Path:
    """A copy of ``wheel`` whose platform tag is ``platform`` (e.g. ``manylinux_2_34_x86_64``),
    in its file name and in its WHEEL file, with RECORD's line for WHEEL updated; every other
    member is copied with its own date, mode and compression, so the same input gives the same
    bytes. The original is removed."""
    import base64
    import hashlib

    parts = wheel.name[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        raise ValueError(f"{wheel.name} is not a wheel file name")
    old_platform = parts[-1]
    if old_platform == platform:
        return wheel
    target = wheel.with_name("-".join([*parts[:-1], platform]) + ".whl")
    with zipfile.ZipFile(wheel) as src:
        infos = src.infolist()
        wheel_file = next(
            (i.filename for i in infos if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/WHEEL")), None
        )
        record_file = next(
            (i.filename for i in infos if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/RECORD")), None
        )
        if wheel_file is None or record_file is None:
            raise ValueError(f"{wheel.name} has no .dist-info/WHEEL or RECORD")
        text = src.read(wheel_file).decode()
        new_wheel = re.sub(
            rf"^(Tag: [^\r\n]*-){re.escape(old_platform)}$", rf"\g<1>{platform}", text, flags=re.MULTILINE
        ).encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(new_wheel).digest()).rstrip(b"=").decode()
        record = "".join(
            f"{wheel_file},sha256={digest},{len(new_wheel)}\n" if line.split(",", 1)[0] == wheel_file else line
            for line in src.read(record_file).decode().splitlines(keepends=True)
        ).encode()
        tmp = target.with_name(f".{target.name}.partial")
        try:
            with zipfile.ZipFile(tmp, "w") as dst:
                for info in infos:
                    if info.filename == wheel_file:
                        dst.writestr(info, new_wheel)
                    elif info.filename == record_file:
                        dst.writestr(info, record)
                    else:
                        with src.open(info) as data, dst.open(info, "w") as out:
                            while chunk := data.read(1 << 20):
                                out.write(chunk)
            tmp.replace(target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    wheel.unlink()
    return target


def tag_wheel(wheel: Path, log: Callable[[str], None]) -> Path:
    """Retags a freshly built ``linux_x86_64`` wheel with the manylinux tag its extension allows;
    returns the wheel's path (unchanged where no policy allows it, with the reason logged)."""
    import tempfile

    if not wheel.name.endswith("-linux_x86_64.whl"):
        return wheel
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(prefix="fa-tag-", dir=wheel.parent) as tmp:
        names = [n for n in zf.namelist() if any(g.owns(n) for g in GENERATIONS)]
        if len(names) != 1:
            return wheel
        so = Path(zf.extract(names[0], tmp))
        policy, why = policy_of(so)
    if policy is None:
        log(f"{MILESTONE}platform tag stays linux_x86_64: the extension {why}")
        return wheel
    tagged = retag(wheel, f"{policy}_x86_64")
    log(f"{MILESTONE}platform tag {policy}_x86_64: the extension {why} (torch's and CUDA's libraries left out)")
    return tagged
