"""``fa-images build --gpus``: what is asked of the engine, and the errors, without a GPU.

The real run (a GPU check passing inside the runtime image with ``--gpus devices``) needs a
GPU machine; it is recorded in bench/gpu_container.md. Here: discovery against a fake /dev
and a fake driver folder, the exact ``containers.create`` arguments through a fake low-level
client, the executor's outcomes, and the one-line error with exit code 3.
"""

from __future__ import annotations

import os
from pathlib import Path

import fakes
import pytest
import test_executor as tex
from docker.types import DeviceRequest
from fakes import FakeEngine, accept_every_wheel

from fa_images import cli
from fa_images.run import gpus
from fa_images.run.engine import DockerEngine
from fa_images.run.gpus import GpuAccess, HostGpus, NoHostGpus

NODES = ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


@pytest.fixture
def fake_dev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A /dev whose regular files stand in for character devices (mknod needs privileges)."""
    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in (*NODES, "nvidia-caps/nvidia-cap1", "null"):
        (dev / name).touch()
    monkeypatch.setattr(gpus, "_is_char_device", lambda p: p.is_file() and p.name != "null")
    return dev


@pytest.fixture
def driver_dir(tmp_path: Path) -> Path:
    lib = tmp_path / "lib64"
    lib.mkdir()
    for name in ("libcuda.so.580.1", "libnvidia-ml.so.580.1", "libnvidia-ptxjitcompiler.so.580.1", "libfoo.so.1"):
        (lib / name).write_text(name)
    for link, target in (("libcuda.so.1", "libcuda.so.580.1"), ("libnvidia-ml.so.1", "libnvidia-ml.so.580.1")):
        os.symlink(target, lib / link)
    return lib


def test_discover_finds_device_nodes_and_driver_libraries(fake_dev: Path, driver_dir: Path) -> None:
    host = gpus.discover(fake_dev, [str(fake_dev / "nowhere"), str(driver_dir)])
    assert host.devices == tuple(sorted(str(fake_dev / n) for n in (*NODES, "nvidia-caps/nvidia-cap1")))
    assert [Path(p).name for p in host.libraries] == [
        "libcuda.so.1",
        "libcuda.so.580.1",
        "libnvidia-ml.so.1",
        "libnvidia-ml.so.580.1",
        "libnvidia-ptxjitcompiler.so.580.1",
    ]
    assert host.describe() == "2 GPU(s) through 6 device nodes and 5 driver libraries"


@pytest.mark.parametrize("present", [(), ("nvidiactl",), ("nvidia0", "nvidia-uvm")])
def test_no_device_nodes_is_one_clear_error(tmp_path: Path, driver_dir: Path, present: tuple[str, ...]) -> None:
    dev = tmp_path / "emptydev"
    dev.mkdir()
    for name in present:
        (dev / name).mkdir()  # not a character device: does not count
    with pytest.raises(NoHostGpus) as caught:
        gpus.discover(dev, [str(driver_dir)])
    message = str(caught.value)
    assert caught.value.exit_code == 3 and "\n" not in message
    assert f"no NVIDIA device nodes in {dev}" in message and "--gpus none" in message


def test_no_driver_library_is_one_clear_error(fake_dev: Path, tmp_path: Path) -> None:
    with pytest.raises(NoHostGpus, match=r"no NVIDIA driver library libcuda\.so\.1 in .*empty"):
        gpus.discover(fake_dev, [str(tmp_path / "empty")])


class _Container:
    name = "fa-images-test"

    def start(self) -> None: ...

    def logs(self, **_kw):
        return [b"PASS: 17 comparisons\n"]

    def wait(self) -> dict:
        return {"StatusCode": 0}

    def remove(self, force: bool = False) -> None:
        self.removed = force


class _Client:
    """The few low-level calls DockerEngine.run makes, recorded."""

    def __init__(self, env: list[str]) -> None:
        self.created: list[dict] = []
        self.api = self
        self.containers = self
        self.env = env

    def inspect_image(self, image: str) -> dict:
        return {"Config": {"Env": self.env}}

    def create(self, image: str, **kwargs) -> _Container:
        self.created.append({"image": image, **kwargs})
        return _Container()


def _run(gpu, env: list[str] | None = None) -> dict:
    client = _Client(env or ["PATH=/usr/bin"])
    result = DockerEngine(client).run("img:tag", ["python", "-m", "x"], gpu=gpu, keep=False, on_line=lambda _: None)
    assert result.exit_code == 0
    (created,) = client.created
    return created


def test_devices_mode_asks_for_nodes_read_only_driver_mounts_and_the_loader_path(driver_dir: Path) -> None:
    libs = (str(driver_dir / "libcuda.so.1"), str(driver_dir / "libnvidia-ml.so.580.1"))
    host = HostGpus(devices=("/dev/nvidia0", "/dev/nvidiactl"), libraries=libs)
    created = _run(host, ["PATH=/usr/bin", "LD_LIBRARY_PATH=/usr/local/cuda/lib64"])
    assert created["devices"] == ["/dev/nvidia0:/dev/nvidia0:rwm", "/dev/nvidiactl:/dev/nvidiactl:rwm"]
    mounts = [(m["Target"], m["Source"], m["Type"], m["ReadOnly"]) for m in created["mounts"]]
    assert mounts == [
        # A link is mounted as its target, under the link's own name: the loader asks for libcuda.so.1.
        ("/usr/local/nvidia/lib64/libcuda.so.1", str(driver_dir / "libcuda.so.580.1"), "bind", True),
        ("/usr/local/nvidia/lib64/libnvidia-ml.so.580.1", str(driver_dir / "libnvidia-ml.so.580.1"), "bind", True),
    ]
    # The image's own LD_LIBRARY_PATH is kept, after the driver's folder.
    assert created["environment"] == {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64:/usr/local/cuda/lib64"}
    assert "device_requests" not in created


def test_runtime_mode_asks_for_a_device_request_and_no_gpu_asks_for_nothing() -> None:
    created = _run(True)
    (request,) = created["device_requests"]
    assert isinstance(request, DeviceRequest) and request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    assert not {"devices", "mounts", "environment"} & set(created)
    plain = _run(False)
    assert not {"devices", "mounts", "environment", "device_requests"} & set(plain)


HOST = HostGpus(devices=("/dev/nvidia0", "/dev/nvidiactl"), libraries=("/lib/libcuda.so.1",))


def test_devices_mode_runs_the_check_without_a_gpu_runtime(tiny_matrix, tmp_path, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    engine = FakeEngine(gpu=False)  # no NVIDIA runtime: devices mode must not care
    results = tex.execute(tiny_matrix, engine, tmp_path, gpus=GpuAccess("devices", HOST))
    assert all(r.gpu_check == "passed" for r in results)
    assert ("run", results[0].image, ("python", "-m", "fa_images.builder", "check"), HOST) in engine.calls
    assert "GPU passthrough (--gpus devices): 1 GPU(s)" in Path(results[0].log).read_text()


def test_devices_passed_but_unseen_is_a_failure_not_a_skip(tiny_matrix, tmp_path, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    results = tex.execute(tiny_matrix, FakeEngine(gpu_exit=3), tmp_path, gpus=GpuAccess("devices", HOST))
    assert results[0].status == "failed" and results[0].failed_step == "gpu-check"
    assert results[0].gpu_check == "not run" and "GPU check exited with 3" in results[0].error


def test_devices_passed_to_a_gpu_of_the_wrong_arch_is_a_skip_not_a_failure(tiny_matrix, tmp_path, monkeypatch) -> None:
    """The GPUs were seen (unlike exit 3 above): the image is for other GPUs, so the check is skipped with why."""
    accept_every_wheel(monkeypatch)
    engine = FakeEngine(gpu_exit=8, gpu_output=["WRONG ARCH: this GPU is sm_90; the extension carries sm_80"])
    results = tex.execute(tiny_matrix, engine, tmp_path, gpus=GpuAccess("devices", HOST))
    assert [r.status for r in results] == ["ok", "ok"]
    assert results[0].gpu_check == "skipped: this GPU cannot run the image's GPU code"
    assert results[0].gpu_check_reason.startswith("this GPU is sm_90; the extension carries sm_80; GPUs that run it")


def test_gpus_none_skips_the_check_even_with_a_gpu_runtime(tiny_matrix, tmp_path, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    engine = FakeEngine(gpu=True)
    results = tex.execute(tiny_matrix, engine, tmp_path, gpus=GpuAccess("none"))
    assert all(r.status == "ok" and r.gpu_check == "skipped: --gpus none" for r in results)
    assert not [c for c in engine.calls if c[0] == "run" and c[3]]


def test_build_gpus_devices_without_nodes_exits_3_before_building(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "matrix.yaml").write_text(
        'image: reg.local/fa\nentries:\n  - {python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: ["80"]}\n'
    )
    engine = FakeEngine()
    fakes.use_engine(monkeypatch, engine)
    monkeypatch.setattr(gpus, "DEV", tmp_path)  # no /dev/nvidia* here
    monkeypatch.chdir(tmp_path)
    code = cli.main(["build", "--gpus", "devices", "--dist", "dist"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and engine.calls == []
    assert err == [
        f"error: --gpus devices: no NVIDIA device nodes in {tmp_path} (need {tmp_path}/nvidiactl and "
        f"{tmp_path}/nvidia0 or another {tmp_path}/nvidia<N>; found none); load the NVIDIA driver, "
        "or use --gpus runtime (NVIDIA Container Toolkit) or --gpus none"
    ]
    assert not (tmp_path / "dist").exists()


def test_gpus_is_a_closed_choice(capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.build_parser().parse_args(["build", "--gpus", "all"])
    assert caught.value.code == 2 and "invalid choice: 'all'" in capsys.readouterr().err
