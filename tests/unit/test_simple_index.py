"""One reader for a simple index's project page, whichever format the index answers in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fa_images.builder import simple_index

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "index"
SHA = "ab" * 32

HTML = f"""<!DOCTYPE html><html><head><title>Links for flash-attn</title></head><body>
<a href="https://files.example/p/flash_attn-2.8.2.tar.gz#sha256={SHA}" data-requires-python="&gt;=3.9">
flash_attn-2.8.2.tar.gz</a><br/>
<a href="../../p/flash_attn-2.8.3.tar.gz#sha256={"cd" * 32}" data-yanked="">flash_attn-2.8.3.tar.gz</a><br/>
<a href="../../p/flash_attn-2.8.4.tar.gz">flash_attn-2.8.4.tar.gz</a>
<a href="../../p/flash_attn%2Bx-1.0.tar.gz#md5=00"></a>
</body></html>""".encode()


def test_pep_503_html_gives_names_urls_hashes_and_yanks() -> None:
    page = simple_index.parse(HTML, "text/html; charset=utf-8")
    assert [(f.filename, f.sha256, f.yanked) for f in page.files] == [
        ("flash_attn-2.8.2.tar.gz", SHA, False),
        ("flash_attn-2.8.3.tar.gz", "cd" * 32, True),
        ("flash_attn-2.8.4.tar.gz", None, False),  # no hash published: the caller refuses it
        ("flash_attn+x-1.0.tar.gz", None, False),  # no text: the name from the URL; md5 is no sha256
    ]
    assert page.files[0].url == "https://files.example/p/flash_attn-2.8.2.tar.gz"
    assert page.versions == []
    assert page.sdist_versions("flash-attn") == ["2.8.2", "2.8.3", "2.8.4"]


def test_pep_691_json_gives_the_same_fields_and_its_versions() -> None:
    body = json.dumps(
        {
            "meta": {"api-version": "1.1"},
            "versions": ["2.8.2", "2.8.3"],
            "files": [
                {"filename": "flash_attn-2.8.2.tar.gz", "url": "../x.tar.gz", "hashes": {"sha256": SHA}},
                {"filename": "flash_attn-2.8.3.tar.gz", "url": "../y.tar.gz", "hashes": {}, "yanked": "broken"},
            ],
        }
    ).encode()
    page = simple_index.parse(body, "application/vnd.pypi.simple.v1+json")
    assert [(f.filename, f.url, f.sha256, f.yanked) for f in page.files] == [
        ("flash_attn-2.8.2.tar.gz", "../x.tar.gz", SHA, False),
        ("flash_attn-2.8.3.tar.gz", "../y.tar.gz", None, True),
    ]
    assert page.versions == ["2.8.2", "2.8.3"]


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("pypi-*.json")))
def test_recorded_pypi_pages_read_the_same_with_no_content_type(name: str) -> None:
    """Without a Content-Type (compat refresh's fetch gives none) the first byte decides."""
    body = (FIXTURES / name).read_bytes()
    assert simple_index.parse(body) == simple_index.parse(body, "application/vnd.pypi.simple.v1+json")
    assert simple_index.parse(body).files


def test_neither_format_is_one_value_error() -> None:
    with pytest.raises(ValueError, match="neither a PEP 691 JSON nor a PEP 503 HTML page"):
        simple_index.parse(b"plain words", "text/plain")
    with pytest.raises(ValueError, match="is not valid JSON"):  # untrusted.UntrustedInput
        simple_index.parse(b"{not json", "application/json")
    with pytest.raises(ValueError, match="an object with a list of files"):
        simple_index.parse(b'["flash_attn-2.8.3.tar.gz"]', "application/vnd.pypi.simple.v1+json")
    with pytest.raises(ValueError, match="an object with a list of files"):
        simple_index.parse(b'{"files": {"a": 1}}', "application/vnd.pypi.simple.v1+json")


def test_json_entries_that_name_no_file_are_left_out() -> None:
    body = json.dumps({"files": [{"url": "../x"}, "text", {"filename": "a.tar.gz", "url": "../a", "hashes": None}]})
    page = simple_index.parse(body.encode(), "application/json")
    assert page.files == [simple_index.File("a.tar.gz", "../a", None)]


# PEP 658/714: what a page announces about a wheel's ``.metadata`` is kept, hash included.
WHL = "torch-2.9.1-cp313-cp313-manylinux_2_28_x86_64.whl"


def _html_with(attrs: str) -> bytes:
    return f'<html><body><a href="../../p/{WHL}#sha256={SHA}" {attrs}>{WHL}</a></body></html>'.encode()


def _json_with(extra: dict) -> bytes:
    entry = {"filename": WHL, "url": f"https://files.example/p/{WHL}", "hashes": {"sha256": SHA}, **extra}
    return json.dumps({"meta": {"api-version": "1.1"}, "files": [entry]}).encode()


@pytest.mark.parametrize(
    ("body", "announced"),
    [
        (_html_with(f'data-core-metadata="sha256={"CD" * 32}"'), (("sha256", "cd" * 32),)),
        (_html_with(f'data-dist-info-metadata="sha256={"cd" * 32}"'), (("sha256", "cd" * 32),)),
        (  # PEP 714: the new attribute wins over the old one
            _html_with(f'data-dist-info-metadata="sha256={"ef" * 32}" data-core-metadata="sha256={"cd" * 32}"'),
            (("sha256", "cd" * 32),),
        ),
        (_html_with('data-core-metadata="true"'), ()),
        (_html_with("data-core-metadata"), ()),  # as pip reads it: announced, no hash
        (_html_with('data-core-metadata="md5=00ff"'), (("md5", "00ff"),)),
        (_html_with(""), None),
        (_json_with({"core-metadata": {"sha256": "CD" * 32}}), (("sha256", "cd" * 32),)),
        (_json_with({"dist-info-metadata": {"sha256": "cd" * 32}}), (("sha256", "cd" * 32),)),
        (_json_with({"dist-info-metadata": True, "core-metadata": {"sha256": "cd" * 32}}), (("sha256", "cd" * 32),)),
        (_json_with({"core-metadata": True}), ()),
        (_json_with({"core-metadata": False}), None),
        (_json_with({"core-metadata": {"sha256": 7, "md5": "00"}}), (("md5", "00"),)),
        (_json_with({"core-metadata": "sha256=cd"}), None),  # not PEP 691's shape: nothing announced
        (_json_with({}), None),
    ],
    ids=[
        "html",
        "html-old-name",
        "html-both-names",
        "html-true",
        "html-no-value",
        "html-md5",
        "html-none",
        "json",
        "json-old-name",
        "json-both-names",
        "json-true",
        "json-false",
        "json-wrong-types",
        "json-string",
        "json-none",
    ],
)
def test_the_announced_metadata_and_its_hash_are_kept(body: bytes, announced: object) -> None:
    (wheel,) = simple_index.parse(body, url="https://files.example/simple/torch/").files
    assert wheel.metadata == announced
    assert wheel.metadata_sha256 == (dict(announced).get("sha256") if announced else None)
    assert wheel.url == f"https://files.example/p/{WHL}"
