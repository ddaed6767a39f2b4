"""A generation is one module: a stand-in, FlashAttention-9, defined only in the tests
(standin_generation.py), plans, renders in both builder forms and is prepared by the builder,
with no change to fa_images (issue 49: what docs/architecture.md says a new generation writes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import standin_generation as fa9

from fa_images.builder import build, generations
from fa_images.builder.environment import TorchInfo
from fa_images.config import generations as host_generations
from fa_images.config import matrix, schema
from fa_images.config.grammar import BuilderForm
from fa_images.outputs import render

MATRIX = """\
image: reg.local/fa
fa9: {tile: 64}
entries:
  - {python: "3.12", torch: "2.11.0", flash_attn: "9.0.0", target: [H100]}
  - {python: "3.13", torch: "2.11.0", flash_attn: "9.0.0", target: [H100]}
  - {python: "3.12", torch: "2.11.0", flash_attn: "2.8.3", target: [H100]}
"""


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(generations, "GENERATIONS", (*generations.GENERATIONS, fa9.GENERATION))
    monkeypatch.setattr(host_generations, "MODULES", (*host_generations.MODULES, fa9))
    return fa9


def test_it_is_unknown_until_it_is_registered(tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    with pytest.raises(Exception, match="FlashAttention-9, which fa-images does not build"):
        matrix.load(tmp_path / "matrix.yaml")


def test_it_plans_with_its_section_its_recipe_and_its_compile_group(registered, tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    m = matrix.load(tmp_path / "matrix.yaml")
    nine = [e for e in m.entries if e.generation is fa9.GENERATION]
    assert [e.id for e in nine] == ["fa9.0.0-py3.12-torch2.11.0-cu130", "fa9.0.0-py3.13-torch2.11.0-cu130"]
    assert {e.compile_group for e in nine} == {"fa9.0.0-cu13.t64"}  # one wheel for both Pythons
    summary = nine[0].summary()
    assert summary["fa9"] == {"tile": 64} and summary["generation"] == 9
    assert summary["wheel"]["requirement"] == "flash-attn-9==9.0.0+cu13.t64"
    assert summary["wheel"]["file"] == "flash_attn_9-9.0.0+cu13.t64-*-abi3-*.whl"
    assert m.unfound_archives(m.entries) == [  # no index serves its archive: plan warns, as of FA3's
        f"{e.id}: no flash_attn_9-9.0.0.tar.gz (packages.sdists is not set)" for e in nine
    ]
    assert "fa9" in schema.matrix_schema()["properties"]  # its section is in the published schema


def test_a_bad_value_of_its_section_is_one_problem_with_its_line(registered, tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX.replace("tile: 64", "tile: 65"))
    with pytest.raises(Exception, match=r"matrix.yaml:2: FA9 tile 65: of 64, 128, 256"):
        matrix.load(tmp_path / "matrix.yaml")


@pytest.mark.parametrize("form", ["buildkit", "sdk"])
def test_it_renders_with_its_flags_and_labels_and_no_template_change(
    registered, tmp_path: Path, form: BuilderForm
) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    m = matrix.load(tmp_path / "matrix.yaml")
    text = render.render_entry(m, m.entries[0], builder=form)
    wheel = text[text.index("python -m fa_images.builder wheel") :].split("\n\n")[0]
    assert "      --fa9-tile 64 \\\n" in wheel and "--archs" not in wheel and "--index-url" not in wheel
    assert 'fa-images.generation="9"' in text and 'fa-images.fa9-tile="64"' in text
    assert "COPY --from=wheel / /opt/fa-images/dist/" in text  # the install stage of a wheel


def test_the_builder_takes_its_flags_and_prepares_it(registered, tmp_path: Path) -> None:
    from fa_images.builder.cli import build_parser
    from fa_images.builder.commands.wheel import generation_args

    args = build_parser().parse_args(["wheel", "--flash-attn", "9.0.0", "--fa9-tile", "256", "--out", str(tmp_path)])
    knobs, archs = generation_args(args)
    assert knobs == {"tile": 256} and archs == ()
    torch = TorchInfo(version="2.11.0+cu130", cuda="13.0", cxx11_abi=True, python="3.12")
    settings = build.prepare(version="9.0.0", sdist=None, work_dir=tmp_path, archs=(), torch=torch, knobs=knobs)
    assert (settings.generation, settings.knobs, settings.archs) == (9, {"tile": 256}, ("90a",))
    assert settings.local_version == "cu13.t256" and not settings.ptx
    written = json.loads((Path(settings.source_dir) / "fa_images_build.json").read_text())
    assert written["knobs"] == {"tile": 256}
    other = build_parser().parse_args(["wheel", "--flash-attn", "2.8.3", "--fa9-tile", "64", "--out", str(tmp_path)])
    with pytest.raises(Exception, match="--fa9-tile: for a FlashAttention-9 build, not FlashAttention-2"):
        generation_args(other)
