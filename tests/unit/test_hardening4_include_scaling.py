"""Class 2: work that grows no faster than the input. A matrix's ``include`` rules are matched
through an index of the combinations by the axis values each rule names, and merged once per
combination, not each rule against each combination: 20,000 rules over a rule-chosen axis
expand in well under a second, where they took over a minute.

The results are GitHub Actions' rules, as before: a reference written the obvious way (every
rule against every combination) is compared on a table of cases, values, key order and origins.
"""

from __future__ import annotations

from typing import Any

import pytest

from fa_images.config import expand, yamlfile

TORCH = tuple(f"2.{minor}.{patch}" for minor in range(4, 14) for patch in range(2))  # 20 versions, as a rule chose


def _doc(rules: int, combinations: int | None = None) -> tuple[yamlfile.YamlDoc, dict[str, tuple[str, ...]]]:
    """A matrix of about ``combinations`` combinations (default: as many as rules; a list axis
    times the ruled torch axis) and ``rules`` include rules of every kind: one combination, one
    torch release, every combination, and none (added as its own)."""
    archs = [[80 + i] for i in range(max(1, (combinations or rules) // len(TORCH)))]
    include: list[Any] = []
    for i in range(rules):
        torch, arch = TORCH[i % len(TORCH)], archs[i % len(archs)]
        include.append(
            [
                {"torch": torch, "archs": arch, "cuda": "12.8"},  # one combination
                {"torch": torch, "ptx": i % 2 == 0},  # every combination of a release
                {"cuda": "13.0", "target": f"t{i % 7}"},  # every combination
                {"torch": "9.9.9", "python": "3.12"},  # none: a combination of its own
            ][i % 4]
        )
    data = {"matrix": {"python": ["3.12"], "torch": ">=2.4", "archs": archs, "include": include}}
    return yamlfile.YamlDoc(data=data, file="m.yaml"), {"torch": TORCH}


def _expand_work(rules: int, combinations: int | None, monkeypatch: pytest.MonkeyPatch) -> int:
    """The values the expansion hashes and the bucket writes it combines: its work, counted, so
    the bound holds however loaded the machine is (a clock would not)."""
    doc, ruled = _doc(rules, combinations)
    calls = 0

    def counted(real):
        def call(*args):
            nonlocal calls
            calls += 1
            return real(*args)

        return call

    with monkeypatch.context() as patch:
        patch.setattr(expand, "_hashable", counted(expand._hashable))
        patch.setattr(expand, "_combine", counted(expand._combine))
        problems: list = []
        combos = expand.expand(doc, problems, ruled)
    assert problems == [] and len(combos) > (combinations or rules) // 2
    return calls


def test_twenty_thousand_include_rules_take_work_linear_in_rules_and_combinations(monkeypatch) -> None:
    rules, combinations = 20_000, 1_000
    work = _expand_work(rules, combinations, monkeypatch)
    # Each rule hashes the few axes it names, each combination is hashed once per set of names
    # and merged once per bucket: a few operations each, never rules x combinations (20 million).
    assert work < 10 * (rules + combinations), (
        f"{work:,} operations for {rules:,} rules and {combinations:,} combinations"
    )


@pytest.mark.parametrize("rules", [1_000, 2_000])
def test_twice_the_rules_and_combinations_take_about_twice_the_work(rules: int, monkeypatch) -> None:
    """Rules and combinations both doubled: linear work doubles, the product of them quadruples."""
    once, twice = _expand_work(rules, None, monkeypatch), _expand_work(2 * rules, None, monkeypatch)
    assert twice < 2.5 * once, f"{rules} rules: {once:,} operations; {2 * rules}: {twice:,}"


# --- the same results as every rule against every combination -------------------------------


def _reference(doc: yamlfile.YamlDoc, ruled: dict) -> list[tuple[dict, tuple, str, dict]]:
    """GitHub Actions' include, the obvious way: each rule against each combination in turn."""
    problems: list = []
    product_doc = yamlfile.YamlDoc(data={**doc.data, "matrix": {**doc.data["matrix"], "include": []}}, file="m.yaml")
    product = expand.expand(product_doc, problems, ruled)
    axes = [k for k in doc.data["matrix"] if k in expand.AXES]
    out = list(product)
    for i, rule in enumerate(doc.data["matrix"].get("include") or []):
        merged = False
        for combo in product:
            if all(combo.values.get(k) == v for k, v in rule.items() if k in axes):
                for k, v in rule.items():
                    if k not in axes:
                        combo.values[k] = v
                        combo.key_origin[k] = ("matrix", "include", i, k)
                merged = True
        if not merged:
            out.append(expand.Combo(dict(rule), ("matrix", "include", i), f"matrix.include[{i}]"))
    return [(c.values, c.origin, c.label, c.key_origin) for c in out]


NAN = float("nan")
CASES: dict[str, dict[str, Any]] = {
    "later rules overwrite, keys in first-written order": {
        "python": ["3.11", "3.12"],
        "torch": ["2.6.0", "2.9.1"],
        "include": [{"ptx": True, "cuda": "12.6"}, {"torch": "2.9.1", "cuda": "12.8", "archs": [90]}, {"ptx": False}],
    },
    "a rule naming two axes, in another order": {
        "python": ["3.11", "3.12"],
        "torch": ["2.6.0", "2.9.1"],
        "include": [{"cuda": "12.4", "torch": "2.6.0", "python": "3.12"}, {"python": "3.11", "cuda": "12.6"}],
    },
    "numbers, booleans and strings compare as YAML values do": {
        "archs": [1, 1.0, True, "1", [80], [80.0], {"a": [1]}],
        "include": [{"archs": True, "ptx": 1}, {"archs": [80], "cuda": "x"}, {"archs": {"a": [1.0]}, "target": "y"}],
    },
    "YAML's ordered pairs (tuples) holding lists": {
        "archs": [[("x", [1]), ("y", 2)], [("x", [1])]],
        "include": [{"archs": [("x", [1]), ("y", 2)], "ptx": True}, {"archs": [["x", [1]]], "cuda": "1"}],
    },
    "NaN equals nothing, not even itself": {"archs": [NAN, [NAN]], "include": [{"archs": NAN, "ptx": True}]},
    "the same NaN inside a list equals itself": {"archs": [[NAN]], "include": [{"archs": [NAN], "ptx": True}]},
    "a rule that fits none is its own, merged into nothing later": {
        "python": ["3.12"],
        "include": [{"python": "3.11", "torch": "2.6.0"}, {"python": "3.11", "cuda": "12.4"}, {"cuda": "12.8"}],
    },
    "no axes: every rule its own": {"include": [{"python": "3.12"}, {"cuda": "12.8"}]},
}
# The same NaN object on the axis and in the rule, as a YAML alias would make it.
CASES["the same NaN inside a list equals itself"]["include"][0]["archs"] = CASES[
    "the same NaN inside a list equals itself"
]["archs"][0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_include_gives_what_every_rule_against_every_combination_gives(case: str) -> None:
    def doc() -> yamlfile.YamlDoc:  # expand writes into its combinations: one document each
        matrix = {k: list(v) if isinstance(v, list) else v for k, v in CASES[case].items()}
        matrix["include"] = [dict(rule) for rule in CASES[case]["include"]]
        return yamlfile.YamlDoc(data={"matrix": matrix}, file="m.yaml")

    problems: list = []
    got = [(c.values, c.origin, c.label, c.key_origin) for c in expand.expand(doc(), problems, {})]
    want = _reference(doc(), {})
    assert [(list(v.items()), o, label, list(k.items())) for v, o, label, k in got] == [
        (list(v.items()), o, label, list(k.items())) for v, o, label, k in want
    ]


def test_a_large_ruled_matrix_gives_what_the_reference_gives() -> None:
    doc, ruled = _doc(400)
    got = [(list(c.values.items()), c.label, list(c.key_origin.items())) for c in expand.expand(doc, [], ruled)]
    want = [(list(v.items()), label, list(k.items())) for v, _, label, k in _reference(_doc(400)[0], ruled)]
    assert got == want
