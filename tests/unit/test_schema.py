"""`fa-images schema`: a JSON schema of matrix.yaml made from where its settings are declared, the
same as the file the package ships, and true of every matrix the docs show that `plan` accepts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from fa_images import starter
from fa_images.config import matrix as matrix_mod
from fa_images.config import schema
from fa_images.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "fa_images" / "config" / "matrix.schema.json"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def validator() -> jsonschema.Draft202012Validator:
    document = schema.matrix_schema()
    jsonschema.Draft202012Validator.check_schema(document)
    return jsonschema.Draft202012Validator(document)


def test_the_command_prints_the_schema_the_package_ships() -> None:
    proc = subprocess.run([sys.executable, "-m", "fa_images", "schema"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0
    assert proc.stdout == SHIPPED.read_text() == schema.text()  # regenerate: fa-images schema > that file
    assert json.loads(proc.stdout)["$schema"].endswith("2020-12/schema")


def _documented_matrices() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for block in re.finditer(r"^```yaml\n(.*?)^```", page.read_text(), re.M | re.S):
            text = block.group(1)
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            if isinstance(data, dict) and data.keys() & {"matrix", "entries"}:
                line = page.read_text()[: block.start()].count("\n") + 1
                found.append((f"{page.name}:{line}", text))
    return found


DOCUMENTED = _documented_matrices()


def test_the_docs_show_matrices() -> None:
    assert len(DOCUMENTED) >= 5


@pytest.mark.parametrize("where, text", DOCUMENTED, ids=[w for w, _ in DOCUMENTED])
def test_every_matrix_the_docs_show_that_plan_takes_the_schema_takes(where: str, text: str, tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(text)
    try:
        matrix_mod.load(tmp_path / "matrix.yaml")
    except ConfigError:
        return  # an example of a refusal (or one that needs files beside it): plan is its judge
    errors = [e.message for e in validator().iter_errors(yaml.safe_load(text))]
    assert errors == [], where


def test_the_repository_s_matrix_is_valid() -> None:
    assert list(validator().iter_errors(yaml.safe_load((REPO / "matrix.yaml").read_text()))) == []


@pytest.mark.parametrize(
    "document",
    [
        {"matrix": {"python": [3.12]}},  # a number, where a version must be quoted
        {"matrix": {"pythons": ["3.12"]}},  # no such axis
        {"imagee": "x"},  # no such key
        {"build": {"builder": "kaniko"}},  # not one of the builders
        {"fa4": {"head_dims": 128}},  # a list
        {"bases": {"devel": None, "colour": "red"}},
        {"entries": [{"python": "3.12", "archs": [[80, [90]]]}]},
    ],
)
def test_a_shape_plan_would_refuse_the_schema_refuses(document: dict) -> None:
    assert list(validator().iter_errors(document)) != []


def test_init_writes_the_line_that_names_the_schema_to_editors(tmp_path: Path) -> None:
    text = starter._render([{"python": "3.12", "torch": "2.9.1", "flash_attn": "2.8.3", "target": ["aws"]}], "a test")
    assert text.splitlines()[1] == "# yaml-language-server: $schema=matrix.schema.json"
    assert list(validator().iter_errors(yaml.safe_load(text))) == []
