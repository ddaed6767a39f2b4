"""`inspect` compares a wheel's +label (torch X.Y, CUDA, ABI) with the torch it is next to, and
takes the ABI the extension must use from that torch, not from the label."""

from __future__ import annotations

import pytest

from fa_images.builder import verify
from fa_images.builder.generations import fa2

CU130 = {"torch": "2.11.0+cu130", "cuda": "13.0", "cxx11_abi": True}
CU124_OLD = {"torch": "2.6.0+cu124", "cuda": "12.4", "cxx11_abi": False}
CPU = {"torch": "2.13.0+cpu", "cuda": None, "cxx11_abi": True}

# (the wheel's local label, the torch next to it, status, words in the detail)
LABELS = [
    ("cu130torch2.11cxx11abitrue", CU130, "pass", "fits torch 2.11.0+cu130 (CUDA 13.0, cxx11_abi=True)"),
    ("cu13torch2.11cxx11abiTRUE", CU130, "pass", "fits torch"),  # flash-attn's own labels: CUDA major only
    ("cu128torch2.9cxx11abitrue", CU130, "fail", "torch 2.9, not 2.11; CUDA 128, not 13.0: built for another"),
    ("cu130torch2.11cxx11abifalse", CU130, "fail", "cxx11_abi=False, not True"),
    ("cu124torch2.6cxx11abifalse", CU124_OLD, "pass", "fits torch 2.6.0+cu124"),
    ("cu126torch2.6cxx11abifalse", CU124_OLD, "pass", "(CUDA 12.4"),  # the same major loads
    ("cu130torch2.13cxx11abitrue", CPU, "fail", "CUDA 130, but torch 2.13.0+cpu is a CPU build"),
]


@pytest.mark.parametrize(("label", "torch", "status", "says"), LABELS)
def test_the_label_against_the_torch_next_to_it(label: str, torch: dict, status: str, says: str) -> None:
    report = verify.WheelReport(wheel="w.whl")
    fa2.check_label(report, fa2.LABEL.search(label), torch)
    (check,) = report.checks
    assert (check.name, check.status) == ("label", status), check
    assert says in check.detail, check.detail


def test_no_label_or_no_torch() -> None:
    report = verify.WheelReport(wheel="w.whl")
    fa2.check_label(report, None, CU130)
    assert [(c.name, c.status) for c in report.checks] == [("label", "skip")]
    fa2.check_label(report, fa2.LABEL.search("cu130torch2.11cxx11abitrue"), {})
    assert len(report.checks) == 1  # no torch to compare with: nothing to say


def test_the_abi_comes_from_the_torch_next_to_the_wheel_not_its_label() -> None:
    label = fa2.LABEL.search("cu124torch2.6cxx11abifalse")
    assert verify._expected_abi(None, CU130, label) == (True, "torch 2.11.0+cu130")
    assert verify._expected_abi(None, {}, label) == (False, "its label")
    assert verify._expected_abi(False, CU130, label) == (False, "torch")  # what the build expects wins
    assert verify._expected_abi(None, {}, None) == (None, "")


def test_the_probe_says_which_cuda_torch_has() -> None:
    assert verify.torch_facts('{"torch": "2.11.0+cu130", "cuda": "13.0", "cxx11_abi": true}') == CU130
    assert verify.torch_facts('{"torch": "2.13.0+cpu", "cuda": null, "cxx11_abi": true}') == CPU
    assert verify.torch_facts('{"torch": "2.11.0", "cuda": 13, "cxx11_abi": true}') is None
