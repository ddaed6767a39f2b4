"""The manylinux tag a wheel's extension allows (auditwheel's policies), and the retag itself.

Crafted ELF files (tests/unit/test_elf_versions.py) stand in for extensions; the tag of a real
nvcc-built extension is tested in tests/builder/test_builder_verify.py.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest
from test_elf_versions import make_elf

from fa_images.builder import manylinux, verify

TORCH_AND_CUDA = ["libc10.so", "libtorch.so", "libtorch_cpu.so", "libtorch_python.so", "libc10_cuda.so"]
TORCH_AND_CUDA += ["libtorch_cuda.so", "libcudart.so.13", "libcuda.so.1"]

# (imports by library, DT_NEEDED, the oldest policy that allows them, or None)
POLICY_TABLE = [
    ({"libc.so.6": {"GLIBC_2.2.5", "GLIBC_2.17"}}, ["libc.so.6"], "manylinux_2_17"),
    ({"libc.so.6": {"GLIBC_2.28"}, "libstdc++.so.6": {"GLIBCXX_3.4.24", "CXXABI_1.3.11"}}, [], "manylinux_2_28"),
    # gcc 11 on Ubuntu 22.04 reaches GLIBCXX_3.4.29: glibc 2.28 would do, libstdc++ needs 2_34's
    ({"libc.so.6": {"GLIBC_2.28"}, "libstdc++.so.6": {"GLIBCXX_3.4.29"}}, [], "manylinux_2_34"),
    ({"libc.so.6": {"GLIBC_2.35"}, "libstdc++.so.6": {"GLIBCXX_3.4.30"}}, [], "manylinux_2_35"),
    ({"libgcc_s.so.1": {"GCC_12.0.0"}, "libc.so.6": {"GLIBC_2.17"}}, [], "manylinux_2_35"),
    ({"libstdc++.so.6": {"CXXABI_FLOAT128"}}, [], "manylinux_2_24"),
    ({"libc.so.6": {"GLIBC_ABI_DT_RELR", "GLIBC_2.34"}}, [], "manylinux_2_36"),
    ({"libc.so.6": {"GLIBC_2.99"}}, [], None),  # newer than every known policy
    ({"libc.so.6": {"GLIBC_PRIVATE"}}, [], None),  # auditwheel never allows it
    # torch's and CUDA's libraries are left out, versions and all
    ({"libc.so.6": {"GLIBC_2.17"}, "libcudart.so.13": {"libcudart.so.13"}}, TORCH_AND_CUDA, "manylinux_2_17"),
    ({"libc.so.6": {"GLIBC_2.17"}}, ["libgomp.so.1"], None),  # anything else would have to be vendored
    ({}, [], "manylinux_2_17"),
]


@pytest.mark.parametrize(("needed", "libraries", "policy"), POLICY_TABLE)
def test_policy_for(needed: dict[str, set[str]], libraries: list[str], policy: str | None) -> None:
    got, why = manylinux.policy_for(needed, libraries)
    assert got == policy, why
    assert why


def test_allowed_names() -> None:
    assert manylinux.allowed_names("manylinux_2_34") >= {"manylinux_2_34", "manylinux_2_35", "manylinux_2_41"}
    assert "manylinux_2_28" not in manylinux.allowed_names("manylinux_2_34")
    assert "manylinux2014" in manylinux.allowed_names("manylinux_2_17")
    assert manylinux.allowed_names(None) == set()


def a_wheel(dest: Path, platform: str = "linux_x86_64", so: bytes = b"\x7fELF") -> Path:
    name = f"flash_attn-2.8.3+cu130torch2.11cxx11abitrue-cp312-cp312-{platform}.whl"
    info = "flash_attn-2.8.3+cu130torch2.11cxx11abitrue.dist-info"
    wheel_text = f"Wheel-Version: 1.0\nGenerator: setuptools\nRoot-Is-Purelib: false\nTag: cp312-cp312-{platform}\n"
    files = {
        "flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so": so,
        "flash_attn/__init__.py": b"# x\n",
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3+cu130torch2.11cxx11abitrue\n",
        f"{info}/WHEEL": wheel_text.encode(),
    }
    record = "".join(f"{n},sha256=x,{len(d)}\n" for n, d in files.items()) + f"{info}/RECORD,,\n"
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest / name, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in {**files, f"{info}/RECORD": record.encode()}.items():
            zf.writestr(zipfile.ZipInfo(n, date_time=(2025, 1, 1, 0, 0, 0)), d, zipfile.ZIP_DEFLATED)
    return dest / name


def test_retag_rewrites_the_name_the_wheel_file_and_its_record(tmp_path: Path) -> None:
    original = a_wheel(tmp_path / "a")
    before = {i.filename: (i.date_time, i.compress_type) for i in zipfile.ZipFile(original).infolist()}
    so_bytes = zipfile.ZipFile(original).read("flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so")
    tagged = manylinux.retag(original, "manylinux_2_34_x86_64")
    assert tagged.name.endswith("-cp312-cp312-manylinux_2_34_x86_64.whl") and not original.exists()
    with zipfile.ZipFile(tagged) as zf:
        info = "flash_attn-2.8.3+cu130torch2.11cxx11abitrue.dist-info"
        wheel_file = zf.read(f"{info}/WHEEL")
        assert wheel_file.decode().splitlines()[-1] == "Tag: cp312-cp312-manylinux_2_34_x86_64"
        digest = base64.urlsafe_b64encode(hashlib.sha256(wheel_file).digest()).rstrip(b"=").decode()
        assert f"{info}/WHEEL,sha256={digest},{len(wheel_file)}" in zf.read(f"{info}/RECORD").decode().splitlines()
        assert zf.read("flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so") == so_bytes
        assert {i.filename: (i.date_time, i.compress_type) for i in zf.infolist()} == before


def test_retag_gives_the_same_bytes_for_the_same_wheel(tmp_path: Path) -> None:
    one = manylinux.retag(a_wheel(tmp_path / "1"), "manylinux_2_28_x86_64").read_bytes()
    two = manylinux.retag(a_wheel(tmp_path / "2"), "manylinux_2_28_x86_64").read_bytes()
    assert one == two


def test_retag_refuses_what_is_not_a_wheel(tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-wheel.whl"
    bogus.write_bytes(b"")
    with pytest.raises(ValueError, match="not a wheel file name"):
        manylinux.retag(bogus, "manylinux_2_28_x86_64")


def floor_elf(glibc: str) -> bytes:
    return make_elf({"libc.so.6": [f"GLIBC_{glibc}", "GLIBC_2.2.5"]})


def test_tag_wheel_tags_what_the_extension_allows(tmp_path: Path) -> None:
    lines: list[str] = []
    tagged = manylinux.tag_wheel(a_wheel(tmp_path, so=floor_elf("2.27")), lines.append)
    assert tagged.name.endswith("-manylinux_2_27_x86_64.whl")
    assert lines == [
        "[fa-images] platform tag manylinux_2_27_x86_64: the extension imports GLIBC_2.27 "
        "(torch's and CUDA's libraries left out)"
    ]


def test_tag_wheel_leaves_a_wheel_no_policy_allows(tmp_path: Path) -> None:
    lines: list[str] = []
    wheel = a_wheel(tmp_path, so=floor_elf("2.99"))
    assert manylinux.tag_wheel(wheel, lines.append) == wheel and wheel.exists()
    assert lines[0].startswith("[fa-images] platform tag stays linux_x86_64: the extension imports GLIBC_2.99")


@pytest.mark.parametrize(("platform", "status"), [("manylinux_2_28_x86_64", "pass"), ("manylinux_2_17_x86_64", "fail")])
def test_inspect_refuses_a_tag_older_than_the_extension_allows(tmp_path: Path, platform: str, status: str) -> None:
    report = verify.inspect_wheel(a_wheel(tmp_path, platform, so=floor_elf("2.28")), import_check=False)
    checks = {c.name: (c.status, c.detail) for c in report.checks}
    assert checks["manylinux"][0] == status, checks
    assert report.manylinux == "manylinux_2_28"
    if status == "fail":
        assert "tagged manylinux_2_17_x86_64, but the extension imports GLIBC_2.28" in checks["manylinux"][1]


@pytest.mark.parametrize(("import_check", "status"), [(True, "fail"), (False, "skip")])
def test_a_floor_above_this_host_fails_only_where_the_wheel_is_meant_to_run(
    tmp_path: Path, import_check: bool, status: str
) -> None:
    """GLIBC_2.99 is newer than any host: with the import check (the wheel is for here) that fails;
    without it (`--no-import`, `dist merge` of wheels for other machines) it is only noted."""
    report = verify.inspect_wheel(a_wheel(tmp_path, so=floor_elf("2.99")), import_check=import_check)
    checks = {c.name: (c.status, c.detail) for c in report.checks}
    assert checks["glibc floor"][0] == status
    assert "needs GLIBC_2.99" in checks["glibc floor"][1] and "cannot load here" in checks["glibc floor"][1]
