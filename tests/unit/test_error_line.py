"""An engine's error, as fa-images prints it, keeps its cause: Go wraps an error as "doing: doing:
cause", and Podman prints a whole build step's value inside, so the first 300 characters of its
message say nothing of what went wrong."""

from __future__ import annotations

import pytest

from fa_images.builder import untrusted

# The shape of the message Podman 4.3 sent when a commit ran out of disk: the step's value, printed
# whole by Go's %v, between what it was doing and why it failed.
STEP_VALUE = (
    "{Env:[CUDA_HOME=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64 "
    "LIBRARY_PATH=/usr/local/cuda/lib64/stubs NVIDIA_VISIBLE_DEVICES=all DEBIAN_FRONTEND=noninteractive "
    "PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1] Command:run Args:[pip install torch==2.9.1] "
    "Flags:[] Attrs:map[] Message:RUN pip install torch==2.9.1 Heredocs:[] Original:RUN pip install "
    "torch==2.9.1}"
)
PODMAN_NO_SPACE = (
    f"committing container for step {STEP_VALUE}: copying layers and metadata for container "
    '"8c1f0d2e": writing blob: storing blob to file "/var/tmp/storage1234/1": '
    "write /var/tmp/storage1234/1: no space left on device"
)


def test_a_value_printed_inside_the_error_is_elided_and_the_cause_kept() -> None:
    line = untrusted.error_line(PODMAN_NO_SPACE)
    assert line.startswith("committing container for step {…}: copying layers"), line
    assert line.endswith("no space left on device") and len(line) <= 300, line


def test_a_long_error_keeps_its_head_and_its_cause() -> None:
    said = "building reg/fa:x: " + "step: " * 200 + "exec format error"
    line = untrusted.error_line(said, limit=120)
    assert line.startswith("building reg/fa:x: step") and line.endswith("exec format error"), line
    assert " … " in line and len(line) <= 120


def test_a_short_error_is_one_line_as_it_was_said() -> None:
    assert untrusted.error_line("pull access denied\n  for reg/x") == "pull access denied for reg/x"
    assert untrusted.error_line("short {a: [b]}") == "short {a: [b]}"


def test_control_characters_are_escaped_and_logins_masked() -> None:
    line = untrusted.error_line("GET https://bob:s3cret@reg.example/v2/: \x1b[31mdenied\x07")
    assert "s3cret" not in line and "\x1b" not in line and "\x07" not in line, line
    assert "***@reg.example" in line


@pytest.mark.parametrize("body", ["{" * 1_000_000, "[" + "x" * 1_000_000 + "]", "a: " * 1_000_000])
def test_an_error_of_any_size_is_one_bounded_line(body: str) -> None:
    line = untrusted.error_line(body + ": the cause")
    assert len(line) <= 300 and line.endswith("the cause"), line[-80:]


def test_a_secret_at_the_cut_of_a_huge_error_is_not_shown() -> None:
    """The cut of a huge error can fall inside a URL, before its '@' or its '?token='; elided
    values around it then bring the cut into the line. The cut word is left out."""
    for secret, url in (
        ("SUPERSECRETTOKEN1234", "https://bob:SUPERSECRETTOKEN1234@reg.example/v2/"),
        ("SIGNATUREVALUE9876", "https://reg.example/blob?X-Amz-Signature=SIGNATUREVALUE9876"),
    ):
        said = "{" + "a" * 2370 + "} GET " + url + " [" + "b" * 6000 + "] [" + "c" * 2380 + "] no such host"
        line = untrusted.error_line(said)
        assert not any(secret[:n] in line for n in range(4, len(secret) + 1)), line
        assert line.startswith("{…} GET") and line.endswith("no such host"), line


@pytest.mark.parametrize("limit", [0, 1, 4, 10, 300])
def test_the_line_is_never_longer_than_its_limit_and_a_little(limit: int) -> None:
    assert len(untrusted.error_line("doing: " * 100 + "the cause", limit=limit)) <= max(limit, 3)
