"""bench/daemon_cpu.py: the daemons' CPU read back against a timeline of the same run (run 62's,
a few of its samples and phases: the shared engine, its registry, and the new runner's engine,
which starts and exits within the runner's test)."""

from __future__ import annotations

from pathlib import Path

from bench import daemon_cpu

SAMPLES = """\
{"t": 1795955381.77, "p": {"2894": ["docker-registry", 35.2], "29436": ["dockerd", 449.67]}}
{"t": 1795956015.57, "p": {"2894": ["docker-registry", 86.7], "29436": ["dockerd", 772.88]}}
{"t": 1795956824.13, "p": {"2894": ["docker-registry", 86.99], "29436": ["dockerd", 774.86]}}
{"t": 1795956829.15, "p": {"2894": ["docker-registry", 86.99], "24796": ["dockerd", 0.26], "29436": ["dockerd", 778.57]}}
{"t": 1795957020.93, "p": {"2894": ["docker-registry", 100.4], "24796": ["dockerd", 154.65], "29436": ["dockerd", 786.42]}}
{"t": 1795957036.0, "p": {"29436": ["dockerd", 786.62]}}
"""  # noqa: E501
TIMELINE = """\
{"worker": "gw0", "id": "tests/engine/test_torch_release_loop.py::test_loop@engine", "when": "call", "start": 1795955382.1272845, "stop": 1795956016.4234655}
{"worker": "gw1", "id": "tests/builder/test_images.py::test_x", "when": "call", "start": 1795955400.0, "stop": 1795955401.0}
{"worker": "gw0", "id": "tests/engine/test_torch_release_loop.py::test_runner@engine", "when": "call", "start": 1795956822.8806808, "stop": 1795957033.5925505}
"""  # noqa: E501


def test_each_daemons_total_and_its_cpu_in_each_phase_of_the_worker(tmp_path: Path) -> None:
    samples, timeline = tmp_path / "daemons.jsonl", tmp_path / "timeline.jsonl"
    samples.write_text(SAMPLES)
    timeline.write_text(TIMELINE)
    lines = daemon_cpu.report(samples, timeline, "gw0", 4).splitlines()
    assert lines[1:4] == [
        "     2894 docker-registry        0    100.4",
        "    29436 dockerd                0    786.6",
        "    24796 dockerd             1447    154.7",
    ]
    # The loop: the shared engine's push and build; the runner: its own engine's pull, whose last
    # sample before it exited counts, and none of the gw1 test's.
    assert lines[-2].split()[2:4] == ["2894:52", "29436:323"]
    assert lines[-1].split()[2:5] == ["2894:14", "29436:14", "24796:155"]
    assert "test_x" not in "\n".join(lines)


def test_a_bad_invocation_prints_the_usage(capsys) -> None:
    assert daemon_cpu.main(["report", "only-one"]) == 2
    assert "python -m bench.daemon_cpu sample LOG" in capsys.readouterr().err


def test_a_log_that_is_not_the_samplers_is_one_error_line(tmp_path: Path, capsys) -> None:
    timeline = tmp_path / "timeline.jsonl"
    timeline.write_text(TIMELINE)
    for log in (Path("/dev/zero"), tmp_path):  # a device, a directory
        assert daemon_cpu.main(["report", str(log), str(timeline)]) == 2
    (tmp_path / "other.jsonl").write_text('{"t": 1}\n')
    assert daemon_cpu.main(["report", str(tmp_path / "other.jsonl"), str(timeline)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(line.startswith("error: report ") for line in lines), lines
