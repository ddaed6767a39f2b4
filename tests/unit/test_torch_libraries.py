"""torch's CUDA libraries in layers of their own: read from torch's METADATA (recorded from PyPI,
tests/fixtures/index/), held in the table, checked there, and written before torch in the torch
stage, a RUN each, from the index torch comes from."""

from __future__ import annotations

import dataclasses
import shlex
import textwrap
from pathlib import Path

import pytest

from fa_images.config import compat as compat_mod
from fa_images.config import compatgen
from fa_images.config.matrix import Matrix
from fa_images.errors import ConfigError
from fa_images.outputs import render, wheelhouse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "index"
APART = ("cudnn", "cusparselt", "nccl", "nvshmem")


def metadata(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_the_toolkits_libraries_come_first_then_each_released_apart_in_the_tables_order() -> None:
    layers = compatgen.library_layers(
        metadata("torch-2.9.1-cp314-cp314-manylinux_2_28_x86_64.whl.METADATA"), "3.14", APART
    )
    assert [len(layer) for layer in layers] == [11, 1, 1, 1, 1]
    assert "nvidia-cuda-runtime-cu12==12.8.90" in layers[0] and "nvidia-cublas-cu12==12.8.4.1" in layers[0]
    assert layers[1:] == (
        ("nvidia-cudnn-cu12==9.10.2.21",),
        ("nvidia-cusparselt-cu12==0.7.1",),
        ("nvidia-nccl-cu12==2.27.5",),
        ("nvidia-nvshmem-cu12==3.3.20",),
    )
    # triton and cuda-bindings are torch's own dependencies, not CUDA libraries: torch's layer has them.
    assert not any("triton" in pin or "bindings" in pin for layer in layers for pin in layer)


def test_cuda_toolkit_keeps_its_extras_and_another_order_is_followed() -> None:
    text = metadata("torch-2.11.0-cp314-cp314-manylinux_2_28_x86_64.whl.METADATA")
    layers = compatgen.library_layers(text, "3.14", ("nccl", "cudnn"))
    assert layers[0] == (
        "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.2",
        "nvidia-cusparselt-cu13==0.8.0",  # not named apart here: with the toolkit's
        "nvidia-nvshmem-cu13==3.4.5",
    )
    assert layers[1:] == (("nvidia-nccl-cu13==2.28.9",), ("nvidia-cudnn-cu13==9.19.0.56",))


def test_only_exact_pins_that_linux_x86_64_installs_are_taken() -> None:
    text = textwrap.dedent(
        """\
        Name: torch
        Requires-Dist: nvidia-cudnn-cu12==9.1.0.70; platform_system == "Linux" and platform_machine == "aarch64"
        Requires-Dist: nvidia-nccl-cu12>=2.20; platform_system == "Linux"
        Requires-Dist: nvidia-cublas-cu12==12.4.5.8; platform_system == "Windows"
        Requires-Dist: nvidia-nvtx-cu12==12.4.127; python_version < "3.10"
        Requires-Dist: nvidia-cuda-runtime-cu12 (==12.4.127) ; platform_system == "Linux"
        Requires-Dist: Nvidia_CUFFT_cu12==11.2.1.3
        Requires-Dist: nvidia-x==1.0; extra == "x"
        Requires-Dist: not a requirement at all ==
        Requires-Dist: nvidia-evil-cu12==1.0$(reboot)
        Requires-Dist: sympy==1.13.1
        """
    )
    layers = compatgen.library_layers(text, "3.12", APART)
    assert layers == (("nvidia-cuda-runtime-cu12==12.4.127", "nvidia-cufft-cu12==11.2.1.3"),)


def test_the_shipped_table_has_the_libraries_of_every_default_variant() -> None:
    table = compat_mod.load()
    assert table.libraries_apart == APART
    for release in table.torch.values():
        variant = release.variant(release.default_cuda)
        assert variant is not None and variant.libraries, release.version
        runtime = "cuda-toolkit[" if release.default_cuda.startswith("13") else "nvidia-cuda-runtime-cu12=="
        assert any(pin.startswith(runtime) for pin in variant.libraries[0]), release.version


@pytest.mark.parametrize(
    ("libraries", "message"),
    [
        pytest.param('["nvidia-cudnn-cu12==9.1.0.70"]', "must be a list of layers", id="a layer not a list"),
        pytest.param("[[]]", "must be a list of layers", id="an empty layer"),
        pytest.param('[["nvidia-cudnn-cu12==9.1; reboot"]]', "which is not a version", id="shell in the version"),
        pytest.param('[["nvidia cudnn==9.1.0.70"]]', "is not a pin", id="space in the name"),
        pytest.param('[["cuda-toolkit[cublas,$(id)]==13.0.2"]]', "is not a pin like", id="shell in an extra"),
        pytest.param('[["cuda-toolkit[cublas]x==13.0.2"]]', "is not a pin like", id="text after the extras"),
        pytest.param(
            '[["nvidia-nccl-cu12==2.21.5"], ["nvidia_NCCL-cu12==2.21.5"]]',
            "pins nvidia-nccl-cu12 more than once",
            id="twice",
        ),
        pytest.param(  # pip reads "." as "-" in a project's name; a pin's extras name no other project
            '[["cuda-toolkit[nccl]==12.4.1", "nvidia.nccl-cu12==2.21.5"], ["nvidia-nccl-cu12[x]==2.21.5"]]',
            "pins nvidia-nccl-cu12 more than once",
            id="twice, as pip spells names",
        ),
    ],
)
def test_a_bad_libraries_value_is_one_problem_on_its_line(tmp_path: Path, libraries: str, message: str) -> None:
    path = tmp_path / "compat-extra.yaml"
    path.write_text(
        'torch:\n  "2.5.1":\n    python: ["3.12"]\n    default_cuda: "12.4"\n    cuda:\n'
        f'      "12.4":\n        cxx11_abi: false\n        libraries: {libraries}\n'
    )
    with pytest.raises(ConfigError) as info:
        compat_mod.load(path)
    (problem,) = info.value.problems
    assert message in problem.message and problem.line == 8, problem


def test_the_torch_stage_installs_each_layer_from_torchs_index_before_torch(tiny_matrix: Matrix) -> None:
    entry = tiny_matrix.entries[0]
    libraries = tiny_matrix.compat.torch["2.9.1"].variant(entry.cuda).libraries  # type: ignore[union-attr]
    assert entry.torch_libraries == libraries and len(libraries) == 5
    assert entry.summary()["torch_libraries"] == [list(layer) for layer in libraries]  # in the printed plan
    names = [i.name for i in wheelhouse.installs(tiny_matrix, entry)]
    assert names[1:7] == [*(f"CUDA libraries of torch, layer {i}" for i in range(1, 6)), "torch"]
    text = render.render_stage(tiny_matrix, entry, "torch", builder="sdk")
    index = f"--index-url https://download.pytorch.org/whl/{entry.cuda_tag}"
    runs = [line for line in text.splitlines() if line.startswith("RUN ")]
    assert runs == [
        *(f"RUN pip install {index} {' '.join(map(shlex.quote, layer))}" for layer in libraries),
        f"RUN pip install {index} torch=={entry.torch}",
    ]


def test_from_a_private_index_torch_installs_alone_and_no_pin_is_fetched_twice(tiny_matrix: Matrix) -> None:
    private = "https://user:s3cret@pypi.internal.example/simple"
    entry = dataclasses.replace(tiny_matrix.entries[0], torch_index=private)
    assert wheelhouse.library_installs(tiny_matrix, entry) == ()
    text = render.render_stage(tiny_matrix, entry, "torch", builder="sdk")
    assert "nvidia-" not in text and "s3cret" not in text


def test_a_torch_the_table_has_no_libraries_for_installs_as_one_layer(tiny_matrix: Matrix) -> None:
    entry = dataclasses.replace(tiny_matrix.entries[0], torch_libraries=())
    text = render.render_stage(tiny_matrix, entry, "torch", builder="sdk")
    assert [line for line in text.splitlines() if line.startswith("RUN ")] == [
        f"RUN pip install --index-url https://download.pytorch.org/whl/{entry.cuda_tag} torch=={entry.torch}"
    ]


@pytest.mark.parametrize("apart", ["cudnn", "[cudnn, 3]", '["cudnn; reboot"]'])
def test_a_bad_order_of_the_libraries_apart_is_one_problem(tmp_path: Path, apart: str) -> None:
    path = tmp_path / "compat-extra.yaml"
    path.write_text(f"rules:\n  torch_libraries_apart: {apart}\n")
    with pytest.raises(ConfigError) as info:
        compat_mod.load(path)
    (problem,) = info.value.problems
    assert "rules.torch_libraries_apart must be a list of names like cudnn" in problem.message, problem
