"""A copy of a flash-attn sdist that compiles only some of its kernels, for benchmarks in a time box.

    python bench/trim_sdist.py SDIST --kernels N --out DIR
    python bench/trim_sdist.py SDIST --gpu-check --out DIR

The stock build, fa-images and fa-images with a warm cache can then all build the very same
trimmed sdist, side by side, in a fraction of a full compile (bench/side_by_side.py --kernels N).

Which kernels: the ``.cu`` files setup.py lists for ``flash_attn_2_cuda``, sorted by their
expected compile time (the builder's cost model, fa_images/builder/compile_costs.json; name breaks
ties), then the middle one of each of N equal slices of that order. So long and short kernels keep
the proportions of the full build, and the same sdist and N always give the same kernels. With
``--gpu-check``: the kernels the GPU check calls (``GPU_CHECK_KERNELS``), so the trimmed wheel
passes it, on any GPU its archs cover.

A kernel left out is still called by flash_api.cpp. Its entry point (the template specialization
or explicit instantiation that flash-attn's generated ``.cu`` files hold) goes into one stub file
that throws when called, so the extension still links and imports (the builder's verification
imports it). A kernel whose entry point has another shape is never left out.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import re
import sys
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fa_images.builder.setup_shim import COSTS_FILE, EXTENSION, expected_seconds  # noqa: E402

STUB_NAME = "fa_bench_stubs.cu"
# The entry points of flash-attn's generated kernels (csrc/flash_attn/src/generate_kernels.py):
# `template<> void run_mha_fwd_<T, 128, false>(Flash_fwd_params &params, cudaStream_t stream) {`
SPECIALIZATION = re.compile(r"template\s*<\s*>\s*(void\s+\w+\s*<[^<>]*>\s*\([^()]*\))\s*\{")
# `template void run_mha_fwd_splitkv_dispatch<T, 128, false>(Flash_fwd_params &params, cudaStream_t stream);`
INSTANTIATION = re.compile(r"template\s+(void\s+\w+\s*<[^<>]*>\s*\([^()]*\))\s*;")
NAMESPACE = re.compile(r"^namespace\s+(\w+)\s*\{", re.MULTILINE)
INCLUDE = re.compile(r'^#include\s+"([^"]+)"', re.MULTILINE)
# The header that declares every entry point (a kernel's own launch template defines them).
DECLARATIONS = "flash.h"


@dataclass(frozen=True)
class Trimmed:
    sdist: str  # the trimmed copy
    rule: str
    kernels: int  # .cu files setup.py lists for the extension
    kept: list[str]
    left_out: list[str]  # each as a stub
    never_left_out: list[str]  # entry points of another shape


def _sources_block(setup_py: str) -> tuple[int, int]:
    """(start, end) in setup.py of the ``sources=[...]`` list of the extension's first definition."""
    named = re.search(rf"name\s*=\s*[\"']{EXTENSION}[\"']", setup_py)
    sources = re.compile(r"sources\s*=\s*\[([^\]]*)\]", re.S).search(setup_py, named.end() if named else 0)
    if named is None or sources is None:
        raise ValueError(f"setup.py has no sources=[...] for {EXTENSION}")
    return sources.start(1), sources.end(1)


def kernel_sources(setup_py: str) -> list[str]:
    """The ``.cu`` files setup.py lists for the extension, in its order."""
    start, end = _sources_block(setup_py)
    return re.findall(r"[\"']([^\"']+\.cu)[\"']", setup_py[start:end])


def entry_points(cu: str) -> list[tuple[str, str]]:
    """(namespace, signature) of each entry point a generated kernel file defines; [] for another shape."""
    namespace = NAMESPACE.search(cu)
    found = SPECIALIZATION.findall(cu) + INSTANTIATION.findall(cu)
    return [(namespace.group(1), " ".join(sig.split())) for sig in found] if namespace else []


# What fa_images/builder/gpucheck.py calls: flash_attn_func on (2, 1024, 16, 128), forward and
# backward, fp16 and bf16, causal and not; flash_attn_varlen_func with head dim 64, fp16, causal.
# Neither shape makes flash-attn's split-KV heuristic split (too many blocks already, and varlen
# splits only when decoding), but the split kernel of the varlen case is kept so that a heuristic
# of another version still finds it.
GPU_CHECK_KERNELS = tuple(
    [
        f"flash_{way}_hdim128_{dtype}{causal}_sm80.cu"
        for way in ("fwd", "bwd")
        for dtype in ("fp16", "bf16")
        for causal in ("", "_causal")
    ]
    + ["flash_fwd_hdim64_fp16_causal_sm80.cu", "flash_fwd_split_hdim64_fp16_causal_sm80.cu"]
)


def pick_named(kernels: list[str], names: tuple[str, ...]) -> list[str]:
    """The kernels whose file names are ``names``; every name must be one of them."""
    kept = [k for k in kernels if Path(k).name in names]
    missing = sorted(set(names) - {Path(k).name for k in kept})
    if missing:
        raise ValueError(f"setup.py lists no {', '.join(missing)}")
    return kept


def pick(kernels: list[str], n: int) -> list[str]:
    """``n`` of ``kernels``: the middle of each of n equal slices of the longest-first order."""
    costs = json.loads(COSTS_FILE.read_text())
    ordered = sorted(kernels, key=lambda k: (-expected_seconds(k, costs), k))
    if n >= len(ordered):
        return ordered
    return [ordered[int((i + 0.5) * len(ordered) / n)] for i in range(n)]


def stub_file(left_out: dict[str, str]) -> str:
    """One ``.cu`` defining every left-out entry point as a function that throws."""
    includes: list[str] = []
    for cu in left_out.values():
        for header in INCLUDE.findall(cu):
            header = DECLARATIONS if header.endswith("launch_template.h") else header  # not the kernels themselves
            if header not in includes:
                includes.append(header)
    lines = [
        "// fa-images benchmark: the kernels this trimmed sdist leaves out, as stubs that launch nothing.",
        "#include <stdexcept>",
        "#include <cutlass/numeric_types.h>",
        *(f'#include "{h}"' for h in includes),
    ]
    for path, cu in left_out.items():
        for namespace, signature in entry_points(cu):
            lines += [
                f"namespace {namespace} {{  // {Path(path).name}",
                f"template<> {signature} {{",
                f'    throw std::runtime_error("{Path(path).stem} is left out of this trimmed benchmark build");',
                "}",
                f"}}  // namespace {namespace}",
            ]
    return "\n".join(lines) + "\n"


def trimmed_setup(setup_py: str, left_out: list[str], stub: str) -> str:
    """setup.py with the left-out kernels gone from the extension's sources and the stub file in."""
    start, end = _sources_block(setup_py)
    block = setup_py[start:end]
    for i, path in enumerate(left_out):
        line = re.compile(rf"^[ \t]*[\"']{re.escape(path)}[\"'],?[ \t]*\n", re.MULTILINE)
        if len(line.findall(block)) != 1:
            raise ValueError(f"setup.py does not list {path} on a line of its own")
        block = line.sub(f'                "{stub}",\n' if i == 0 else "", block)
    return setup_py[:start] + block + setup_py[end:]


def _top(names: list[str]) -> str:
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) != 1:
        raise ValueError("the sdist has more than one top-level directory")
    return tops.pop()


def trim(sdist: Path, n: int | None, out_dir: Path) -> Trimmed:
    """Writes ``out_dir/<sdist's name>``, a copy of ``sdist`` that compiles ``n`` of its kernels
    (None: those of ``GPU_CHECK_KERNELS``)."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.isfile() or m.isdir()]
        files = {m.name: tar.extractfile(m).read() for m in members if m.isfile()}  # type: ignore[union-attr]
    top = _top(list(files))
    setup_py = files[f"{top}/setup.py"].decode()
    kernels = kernel_sources(setup_py)
    texts = {k: files.get(f"{top}/{k}", b"").decode(errors="replace") for k in kernels}
    stubbable = [k for k in kernels if entry_points(texts[k])]
    kept = pick(stubbable, n) if n is not None else pick_named(stubbable, GPU_CHECK_KERNELS)
    left_out = [k for k in kernels if k in stubbable and k not in kept]
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / sdist.name
    if left_out:
        stub = f"{Path(left_out[0]).parent.as_posix()}/{STUB_NAME}"
        if f"{top}/{Path(stub).parent.as_posix()}/{DECLARATIONS}" not in files:
            raise ValueError(f"no {DECLARATIONS} beside {left_out[0]}: the stubs would declare nothing")
        files[f"{top}/setup.py"] = trimmed_setup(setup_py, left_out, stub).encode()
        files[f"{top}/{stub}"] = stub_file({k: texts[k] for k in left_out}).encode()
    _write_tar(target, members, files)
    never = [k for k in kernels if k not in stubbable]
    return Trimmed(
        sdist=str(target),
        rule=f"{len(kept)} of {len(stubbable)} kernels: the middle of each of {len(kept)} equal slices of the "
        f"longest-first order ({COSTS_FILE.name})"
        if n is not None
        else f"{len(kept)} of {len(stubbable)} kernels: those the GPU check calls",
        kernels=len(kernels),
        kept=sorted(set(kept) | set(never), key=kernels.index),
        left_out=left_out,
        never_left_out=never,
    )


def _write_tar(target: Path, members: list[tarfile.TarInfo], files: dict[str, bytes]) -> None:
    """The tarball, byte for byte the same for the same input (sorted, gzip header pinned)."""
    buf = io.BytesIO()
    known = {m.name for m in members}
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for member in sorted(members, key=lambda m: m.name):
            data = files.get(member.name)
            if member.isfile() and data is not None:
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
            elif member.isdir():
                tar.addfile(member)
        for name in sorted(set(files) - known):  # the stub file
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, max(m.mtime for m in members)
            tar.addfile(info, io.BytesIO(files[name]))
    target.write_bytes(buf.getvalue())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sdist", type=Path)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--kernels", type=int, help="how many kernels the copy compiles")
    which.add_argument("--gpu-check", action="store_true", help="compile the kernels the GPU check calls")
    parser.add_argument("--out", type=Path, required=True, help="where the copy goes (same file name)")
    args = parser.parse_args()
    print(json.dumps(asdict(trim(args.sdist, args.kernels, args.out)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
