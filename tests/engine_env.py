"""A real Docker Engine, base images and registries for the test suite.

The machines that run the tests cannot reach any container registry, so
everything an image test needs is made locally:

* ``docker_engine()`` uses the engine that ``docker.from_env()`` finds, or
  starts a private ``dockerd`` (root only) whose data-root lives in the test
  cache. The base images survive between runs; every other image a test
  tags (all are named ``fa-images-test/...``) is removed when the last user of
  the engine is done, and what a killed run left behind (servers, builds,
  registry data, images) is removed when the next run starts.
* ``base_images()`` makes Debian bookworm base images with ``debootstrap``
  from the machine's Debian mirror and ``docker import``s them;
  ``debian_rootfs()`` makes and keeps a rootfs of another suite, for a chroot.
* ``cuda_devel_standin()`` dresses a base image up as a CUDA devel image.
* ``local_registry()``, ``unreachable_registry()`` and ``serve_directory()``
  give push targets and a local wheel index.

Environment variables:

* ``FA_IMAGES_TEST_CACHE``: cache directory (default ``~/.cache/fa-images-tests``).
* ``FA_IMAGES_TEST_DEBIAN_MIRROR``: Debian mirror URL for ``debootstrap``
  (default: the bookworm entry of the apt sources, else deb.debian.org).
* ``FA_IMAGES_TEST_STORAGE_DRIVER``: storage driver of a private ``dockerd``
  (default ``overlay2``, falling back to ``vfs`` if the daemon refuses it).
* ``FA_IMAGES_TEST_KEEP_IMAGES=1``: keep the images the tests built (their
  layers then make the next run faster, at several GB each).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import http.client
import http.server
import io
import json
import logging
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import docker
import docker.errors
import requests

log = logging.getLogger(__name__)

SUITE = "bookworm"
RUNTIME_PACKAGES: tuple[str, ...] = (
    "python3",
    "python3-venv",
    "python3-pip",
    "ca-certificates",
)
# g++ and python3-dev: a C++ compiler and Python.h, to compile torch extensions.
DEVEL_PACKAGES: tuple[str, ...] = (*RUNTIME_PACKAGES, "g++", "python3-dev")
RUNTIME_TAG = f"fa-images-test/debian:{SUITE}-runtime"
DEVEL_TAG = f"fa-images-test/debian:{SUITE}-devel"
CUDA_STANDIN_TAG = "fa-images-test/cuda:12.8-devel"
# The one base, devel and runtime alike, that every Docker module's matrix builds on
# (tests/engine/conftest.py): the CUDA stand-in with a second CPython (3.13, compiled from Debian's
# source: tests/toolchain.py), and uid 1000 taken as on Ubuntu 24.04's CUDA images.
STOCK_PYTHON_TAG = f"{CUDA_STANDIN_TAG}-py3.13"
STOCK_TAG = f"{CUDA_STANDIN_TAG}-stock"
# A runtime base without a compiler, with that second CPython: for the one two-base build.
STOCK_RUNTIME_TAG = f"{RUNTIME_TAG}-py3.13"

# Every image a test makes is named in this namespace, behind a registry host or not.
TEST_NAMESPACE = "fa-images-test/"
# Marks the processes the tests start (servers, `fa-images build`), so that what a killed run
# left running can be told apart from everything else on the machine.
CHILD_MARKER = "FA_IMAGES_TEST_CHILD"
REGISTRY_DIR_PREFIX = "fa-images-registry-"
# The engine tier's package index, a directory of its own per run under the cache.
INDEX_DIR_PREFIX = "index-torch-"
# Names the run a process, a registry's data or an index belongs to, so that what a killed run
# left is told apart from what this run's other pytest-xdist worker uses at the same time.
RUN_ID_VARIABLE = "FA_IMAGES_TEST_RUN"
_PROCESS_RUN_ID = uuid.uuid4().hex
_RUN_NAME = re.compile(r"[A-Za-z0-9]{1,64}")
_held_run_locks: dict[str, BinaryIO] = {}

# Images made here carry this label; its value is a hash of their recipe, so a
# stale image (changed package list, changed CUDA tree) is rebuilt, not reused.
KEY_LABEL = "org.fa-images-test.key"

# Unix socket paths are limited to 108 bytes, so the private engine's socket,
# exec-root (containerd puts its socket there) and pidfile live in a short
# fixed directory rather than under the (arbitrarily long) cache directory.
RUN_DIR = Path("/run/fa-images-test")
# A run is alive while one of its processes holds a shared lock on its file here (each worker
# does, none of their children): what a run whose lock is free left behind is a leftover.
RUN_LOCKS = RUN_DIR / "runs"
ENGINE_START_TIMEOUT = 60.0
# Per-request read timeout of the clients handed out: a build step may print
# nothing for minutes (compiling), and the SDK's 60 s default would abort it.
CLIENT_TIMEOUT = 1800
_DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"
# Image config every imported rootfs gets; an imported image has no ENV at all,
# so without PATH a later ``ENV PATH=/x:$PATH`` would drop the system dirs.
_IMPORT_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    'CMD ["bash"]',
)
# Left out of the rootfs tarballs, as in Debian's official images: downloaded
# .debs and apt lists (about 100 MB), and the build host's resolv.conf (the
# engine bind-mounts its own).
_ROOTFS_EXCLUDES = (
    "./var/cache/apt/archives/*.deb",
    "./var/lib/apt/lists/*_*",
    "./etc/resolv.conf",
)


def cache_dir() -> Path:
    """Directory for everything the tests cache between runs."""
    env = os.environ.get("FA_IMAGES_TEST_CACHE")
    path = Path(env).expanduser() if env else Path.home() / ".cache" / "fa-images-tests"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --------------------------------------------------------------------------
# Docker Engine


@dataclasses.dataclass
class EngineHandle:
    """A live engine: an SDK client and the address other clients can use."""

    client: docker.DockerClient
    base_url: str
    # True when this module runs the daemon (started it, or adopted one that
    # an earlier, killed run left behind) and stops it when the last user ends.
    managed: bool
    log_path: Path | None = None
    # The same private engine reached over TCP, from a mount namespace whose /tmp is empty.
    tcp_url: str | None = None

    def env(self, *, tcp: bool = False, **extra: str) -> dict[str, str]:
        """The environment for a `fa-images` command the tests run against this engine."""
        # An engine of the user's own has no TCP address of ours: its own address then.
        return child_env(DOCKER_HOST=(tcp and self.tcp_url) or self.base_url, **extra)


@contextlib.contextmanager
def docker_engine() -> Iterator[EngineHandle]:
    """Yield a running engine: ``docker.from_env()``'s, else a private ``dockerd``.

    An engine found through the environment is never stopped, and only the
    test images are removed from it. A private one is shared by concurrent
    users (e.g. pytest-xdist workers): the first one clears what a killed run
    left, the last one removes the test images and stops the daemon.
    """
    found = _connect(_env_base_url(), from_env=True)
    if found is not None:
        try:
            yield EngineHandle(found, _env_base_url(), managed=False)
        finally:
            remove_test_images(found, prune=False)
            found.close()
        return

    if os.geteuid() != 0:
        raise RuntimeError(
            f"no Docker Engine answers at {_env_base_url()} (set DOCKER_HOST to "
            "one that does), and starting a private dockerd needs root"
        )
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    base_url = f"unix://{RUN_DIR / 'docker.sock'}"
    # start.lock serialises starting and stopping; every user holds a shared
    # lock on users.lock, so whoever can take it exclusively is the only user.
    with (
        open(RUN_DIR / "start.lock", "a+b") as start_lock,
        open(RUN_DIR / "users.lock", "a+b") as users_lock,
    ):
        with _flocked(start_lock, fcntl.LOCK_EX):
            client = _connect(base_url)
            if client is not None:
                log.info("using the private dockerd already running at %s", base_url)
            else:
                client = _start_dockerd(base_url)
            if _only_user(users_lock):
                reap_leftovers(client)
            fcntl.flock(users_lock, fcntl.LOCK_SH)
        try:
            tcp_url = _tcp_host(_read_pid(RUN_DIR / "docker.pid"))
            yield EngineHandle(client, base_url, managed=True, log_path=RUN_DIR / "dockerd.log", tcp_url=tcp_url)
        finally:
            fcntl.flock(users_lock, fcntl.LOCK_UN)
            with _flocked(start_lock, fcntl.LOCK_EX):
                if _only_user(users_lock):
                    remove_test_images(client, prune=True)
                    _stop_dockerd()
                else:
                    log.info("private dockerd still in use elsewhere; leaving it running")
            client.close()


# Podman's settings for the tests (the machine's own /etc/containers is left alone): runc and
# cgroupfs, open-file and process limits it may set in a container here, host networking.
# Its scratch files in its own root, which the tests empty: a commit's copy of each new layer
# (image_copy_tmp_dir, /var/tmp by default) is 7 GB for the torch stage, and the API's loads leave
# their uploads behind (TMPDIR; Podman 4.3 never removes them).
_PODMAN_CONF = """\
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
image_copy_tmp_dir = "{scratch}"

[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
netns = "host"
"""


@contextlib.contextmanager
def podman_engine() -> Iterator[EngineHandle]:
    """Podman's Docker-compatible API service, private to the tests: its own config, storage and socket.

    The storage is scratch: emptied before and after, so a run never inherits a killed run's images.
    """
    if os.geteuid() != 0:
        raise RuntimeError("the Podman engine tests run podman as root")
    podman = _which("podman", "podman")
    root = cache_dir() / "podman"
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    socket_path = RUN_DIR / "podman.sock"
    config = {
        "CONTAINERS_CONF": root / "containers.conf",
        "CONTAINERS_STORAGE_CONF": root / "storage.conf",
        "CONTAINERS_REGISTRIES_CONF": root / "registries.conf",
    }
    scratch = root / "tmp"
    env = child_env(TMPDIR=str(scratch), **{k: str(v) for k, v in config.items()})

    def reset() -> None:
        if config["CONTAINERS_STORAGE_CONF"].exists():
            subprocess.run([podman, "system", "reset", "--force"], env=env, capture_output=True, check=False)
        _unmount_under(root, include_self=False)
        shutil.rmtree(root, ignore_errors=True)

    with _file_lock(cache_dir() / "podman.lock"):
        reset()
        scratch.mkdir(parents=True)
        config["CONTAINERS_CONF"].write_text(_PODMAN_CONF.format(scratch=scratch))
        config["CONTAINERS_STORAGE_CONF"].write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/storage"\nrunroot = "{RUN_DIR}/podman-run"\n'
        )
        # The tests' registries listen on loopback, over plain HTTP.
        config["CONTAINERS_REGISTRIES_CONF"].write_text('[[registry]]\nlocation = "127.0.0.1"\ninsecure = true\n')
        socket_path.unlink(missing_ok=True)
        base_url = f"unix://{socket_path}"
        log_path = RUN_DIR / "podman.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                [podman, "system", "service", "--time=0", base_url],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        _CHILDREN[proc.pid] = proc
        try:
            client = _wait_for_dockerd(proc, base_url)
            if client is None:
                raise RuntimeError(f"podman system service did not answer at {base_url}; log:\n{_tail(log_path)}")
            try:
                yield EngineHandle(client, base_url, managed=True, log_path=log_path)
            finally:
                client.close()
        finally:
            _terminate(proc.pid, grace=10)
            reset()


# The bridged engine's network: in a namespace of its own, so no address of the host can clash.
BRIDGE_CIDR = "10.203.0.1/24"
BRIDGE_GATEWAY = BRIDGE_CIDR.partition("/")[0]


@dataclasses.dataclass(frozen=True)
class BridgedEngine:
    """A running ``bridged_docker_engine``: the engine, and the network namespace its builds'
    gateway lives in (a server started there with ``in_netns`` is at ``BRIDGE_GATEWAY`` for them)."""

    engine: EngineHandle
    netns: Path


@contextlib.contextmanager
def bridged_docker_engine() -> Iterator[BridgedEngine]:
    """A dockerd with a bridge network, in network and mount namespaces of its own.

    The tier's shared engine has no bridge (the tests must not touch the host's network), so each
    of its builds names the host's network. A build that cannot name one, as ``docker buildx
    bake`` 0.13's cannot (bake has no network key), needs the default bridge: here it has one,
    which only the daemon's own namespace sees. Storage is scratch, emptied before and after.
    """
    with _scratch_dockerd("bridged", bridged=True) as (handle, pid):
        yield BridgedEngine(handle, Path(f"/proc/{pid}/ns/net"))


@contextlib.contextmanager
def empty_docker_engine() -> Iterator[EngineHandle]:
    """A second dockerd on an empty data root, on the host's network as the shared engine is (no
    bridge; builds name the host's network): a new build host, or a CI runner's first job, which
    reaches the tests' registry and indexes on loopback. Storage is scratch, emptied before and
    after."""
    with _scratch_dockerd("empty", bridged=False) as (handle, _):
        yield handle


@contextlib.contextmanager
def _scratch_dockerd(name: str, *, bridged: bool) -> Iterator[tuple[EngineHandle, int]]:
    """A dockerd of its own (its data root under the test cache, named ``name``), and its pid."""
    if os.geteuid() != 0:
        raise RuntimeError(f"the {name} dockerd needs root")
    dockerd = _which("dockerd", "docker.io")
    root, exec_root, pidfile = cache_dir() / f"docker-{name}", RUN_DIR / f"{name}-exec", RUN_DIR / f"{name}.pid"
    socket_path = RUN_DIR / f"{name}.sock"
    RUN_DIR.mkdir(parents=True, exist_ok=True)

    def reset() -> None:
        pid = _read_pid(pidfile)
        if pid is not None and _is_dockerd_of(pid, exec_root):  # a killed run's
            _terminate(pid)
        for path in (pidfile, socket_path):
            path.unlink(missing_ok=True)
        # A bridged daemon's mounts live and die in its own namespace; a lazy unmount covers one
        # left on ours.
        _unmount_under(root, include_self=False)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(exec_root, ignore_errors=True)

    with _file_lock(cache_dir() / f"docker-{name}.lock"):
        reset()
        root.mkdir(parents=True)
        (root / "daemon.json").write_text("{}\n")  # not the host's /etc/docker/daemon.json
        base_url = f"unix://{socket_path}"
        log_path = RUN_DIR / f"{name}-dockerd.log"
        command = [
            *(dockerd, "--data-root", str(root / "data"), "--exec-root", str(exec_root)),
            *("--pidfile", str(pidfile), "--host", base_url, "--config-file", str(root / "daemon.json")),
            *("--storage-driver", "overlay2", "--iptables=false", "--ip-masq=false"),
        ]
        if bridged:
            unshare, ip = _which("unshare", "util-linux"), _which("ip", "iproute2")
            command = [
                *(unshare, "--net", "--mount", "--propagation", "private", "--fork"),
                # Loopback up: the namespace's own address (the gateway) is reached through it.
                *("sh", "-c", f'{shlex.quote(ip)} link set lo up && exec "$@"', "sh"),
                *command,
                *("--bip", BRIDGE_CIDR),
            ]
        else:
            command.append("--bridge=none")  # as the shared engine: the host's network untouched
        with open(log_path, "wb") as log_file:
            # Marked: a killed run's daemon is reaped by the next run.
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=child_env(),
                start_new_session=True,
            )
        _CHILDREN[proc.pid] = proc
        try:
            client = _wait_for_dockerd(proc, base_url)
            pid = _read_pid(pidfile)
            if client is None or pid is None:
                raise RuntimeError(f"the {name} dockerd did not answer at {base_url}; log:\n{_tail(log_path)}")
            try:
                yield EngineHandle(client, base_url, managed=True, log_path=log_path), pid
            finally:
                client.close()
        finally:
            pid = _read_pid(pidfile)
            if pid is not None and _is_dockerd_of(pid, exec_root):
                _terminate(pid)
            _terminate(proc.pid, grace=10)
            reset()


def in_netns(netns: Path | None) -> list[str]:
    """The prefix that runs a command in ``netns`` (none for the host's)."""
    return [_which("nsenter", "util-linux"), f"--net={netns}"] if netns else []


def _is_dockerd_of(pid: int, exec_root: Path) -> bool:
    """Only ever signal a dockerd whose exec-root is the one given: never a recycled pid's process."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return _alive(pid) and bool(argv) and argv[0].endswith(b"dockerd") and os.fsencode(exec_root) in argv


def _only_user(users_lock: BinaryIO) -> bool:
    """True when no other process holds the engine (call with start.lock held)."""
    return _held_by_none(users_lock)


def _held_by_none(lock: BinaryIO) -> bool:
    """No other process holds ``lock`` (a file's flock), shared or not."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(lock, fcntl.LOCK_UN)
    return True


def _env_base_url() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def _connect(base_url: str, *, from_env: bool = False, timeout: int = 10) -> docker.DockerClient | None:
    """A client whose engine answers a ping, or None."""
    client = None
    try:
        # version="auto": dockerd 20.10 speaks API 1.41, below the SDK's default.
        client = (
            docker.from_env(timeout=timeout)
            if from_env
            else docker.DockerClient(base_url=base_url, version="auto", timeout=timeout)
        )
        client.ping()
    except (docker.errors.DockerException, requests.RequestException, OSError):
        if client is not None:
            client.close()
        return None
    client.close()
    # A fresh client with a long timeout: builds may stay silent for minutes.
    if from_env:
        return docker.from_env(timeout=CLIENT_TIMEOUT)
    return docker.DockerClient(base_url=base_url, version="auto", timeout=CLIENT_TIMEOUT)


def _sbin_path() -> str:
    # dockerd, debootstrap, mount live in sbin dirs, which a root shell
    # reached through plain `su` or a CI runner may not have on PATH.
    parts = os.environ.get("PATH", "").split(os.pathsep)
    extra = [d for d in ("/usr/local/sbin", "/usr/sbin", "/sbin") if d not in parts]
    return os.pathsep.join([p for p in parts if p] + extra)


def _which(name: str, package: str) -> str:
    found = shutil.which(name, path=_sbin_path())
    if found is None:
        raise RuntimeError(f"{name} not found; install it with: apt-get install -y {package}")
    return found


def run_id() -> str:
    """This test run's name: shared by its pytest-xdist workers, new for every run. Asking for it
    marks the run alive for as long as this process lives."""
    run = os.environ.get(RUN_ID_VARIABLE) or os.environ.get("PYTEST_XDIST_TESTRUNUID") or _PROCESS_RUN_ID
    if run not in _held_run_locks:
        if not _RUN_NAME.fullmatch(run):
            raise RuntimeError(f"{RUN_ID_VARIABLE}={run!r}: a run's name is 1 to 64 letters and digits")
        RUN_LOCKS.mkdir(parents=True, exist_ok=True)
        lock = open(RUN_LOCKS / f"{run}.lock", "a+b")  # noqa: SIM115 (held until the process ends)
        fcntl.flock(lock, fcntl.LOCK_SH)
        _held_run_locks[run] = lock
    return run


def _run_is_over(run: str) -> bool:
    """No process of ``run`` holds its lock: it ended, or was killed. Names that are no run's
    (what older runs wrote) are over."""
    if run in _held_run_locks:
        return False
    if not _RUN_NAME.fullmatch(run):
        return True
    try:
        lock = open(RUN_LOCKS / f"{run}.lock", "rb")  # noqa: SIM115
    except FileNotFoundError:
        return True
    with lock:
        return _held_by_none(lock)


def run_prefix(prefix: str) -> str:
    """The name prefix of this run's directories of a kind (registry data, index)."""
    return f"{prefix}{run_id()}-"


def _left_by_a_run_that_is_over(path: Path, prefix: str) -> bool:
    """``path``, named ``prefix`` + run + ``-`` + a random part, belongs to a run that is over."""
    return _run_is_over(path.name.removeprefix(prefix).split("-", 1)[0])


def child_env(marked: bool = True, /, **extra: str) -> dict[str, str]:
    """The environment of a process the tests start; ``marked`` ones are reaped if a run is killed."""
    env = {**os.environ, "PATH": _sbin_path(), **extra}
    if marked:
        env[CHILD_MARKER] = run_id()
    # Keep loopback traffic (local registry, wheel server) off any proxy.
    if any(env.get(k) for k in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY")):
        for key in ("no_proxy", "NO_PROXY"):
            env[key] = ",".join(filter(None, [env.get(key), "127.0.0.1", "localhost"]))
    return env


def _start_dockerd(base_url: str) -> docker.DockerClient:
    """Start a private dockerd and wait until it answers."""
    dockerd = _which("dockerd", "docker.io")
    _clear_stale_dockerd()
    data_root = _fresh_unless_stopped_cleanly(cache_dir() / "docker")
    # An empty config file, so a host /etc/docker/daemon.json cannot clash
    # with the flags below (e.g. "hosts").
    config = RUN_DIR / "daemon.json"
    config.write_text("{}\n")
    forced = os.environ.get("FA_IMAGES_TEST_STORAGE_DRIVER")
    drivers = [forced] if forced else ["overlay2", "vfs"]
    log_path = RUN_DIR / "dockerd.log"
    mounted_before = set(_mount_points_under(str(data_root)))
    for driver in drivers:
        command = [
            dockerd,
            "--data-root",
            str(data_root),
            "--exec-root",
            str(RUN_DIR / "exec"),
            "--pidfile",
            str(RUN_DIR / "docker.pid"),
            "--host",
            base_url,
            # Also on TCP, for the tests that reach the engine as a remote one. Loopback only,
            # and only while the tests run: plain TCP gives root to whoever can connect.
            "--host",
            f"tcp://127.0.0.1:{_free_port()}",
            "--config-file",
            str(config),
            "--storage-driver",
            driver,
            # No bridge and no iptables: the engine must not touch the host's
            # network setup. Builds that need the network use network_mode="host".
            "--bridge=none",
            "--iptables=false",
            "--ip-masq=false",
        ]
        started = time.monotonic()
        with open(log_path, "wb") as log_file:
            # A session of its own: a Ctrl-C meant for pytest must not kill
            # the daemon before the context manager stops it cleanly.
            proc = subprocess.Popen(
                [*_own_tmp(), *command],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                # Unmarked: a dockerd left running is adopted by the next run, not reaped.
                env=child_env(False),
                start_new_session=True,
            )
        _CHILDREN[proc.pid] = proc
        client = _wait_for_dockerd(proc, base_url)
        if client is not None:
            log.info(
                "started dockerd (%s, data-root %s) in %.1f s",
                driver,
                data_root,
                time.monotonic() - started,
            )
            return client
        # A daemon that dies while starting can leave its data-root
        # bind-mounted onto itself and its network namespace mounted.
        _unmount(set(_mount_points_under(str(data_root))) - mounted_before)
        _unmount_under(RUN_DIR / "exec", include_self=False)
        errors = _tail(log_path, lines=5, grep="error|fatal|failed")
        # overlay2 is refused on some filesystems (overlayfs, some network
        # file systems); vfs works everywhere, only slower and larger.
        if driver == drivers[-1] or "driver" not in errors.lower():
            break
        log.warning("dockerd refused storage driver %s; retrying with vfs:\n%s", driver, errors)
    raise RuntimeError(
        f"dockerd did not come up at {base_url} within {ENGINE_START_TIMEOUT:.0f} s "
        f"(command: {' '.join(command)}); log tail:\n{_tail(log_path)}"
    )


def _own_tmp() -> list[str]:
    """A prefix that runs the daemon in a mount namespace of its own, with an empty /tmp.

    The tests' projects live under /tmp, so whatever the tool wrongly asks the engine to read
    from the host's file system (a bind mount, a context path) fails in every engine test, as it
    would against a remote engine.
    """
    unshare = shutil.which("unshare", path=_sbin_path())
    if unshare is None:
        raise RuntimeError("unshare not found; install it with: apt-get install -y util-linux")
    script = 'mount -t tmpfs -o size=256m,mode=1777 fa-images-test-tmp /tmp && exec "$@"'
    return [unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


def _tcp_host(pid: int | None) -> str | None:
    """The ``tcp://`` address a private dockerd listens on, read from its command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except (OSError, ValueError):
        return None
    return next((a for a in argv if a.startswith("tcp://")), None)


def _wait_for_dockerd(proc: subprocess.Popen[bytes], base_url: str) -> docker.DockerClient | None:
    socket_path = Path(base_url.removeprefix("unix://"))
    deadline = time.monotonic() + ENGINE_START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _CHILDREN.pop(proc.pid, None)
            return None
        if socket_path.exists():
            client = _connect(base_url, timeout=5)
            if client is not None:
                return client
        time.sleep(0.1)
    _terminate(proc.pid)
    return None


def _clean_stop_mark() -> Path:
    return cache_dir() / "docker.stopped-cleanly"


def _fresh_unless_stopped_cleanly(data_root: Path) -> Path:
    """The data-root, kept from the last run only if its daemon was stopped cleanly.

    A daemon killed while it commits a layer leaves layer directories that it no longer lists
    (25 GB of them, once), so no reaper through the API finds them: only a fresh data-root
    does. What it costs is the base images, imported again from the cached rootfs tarballs.
    """
    mark = _clean_stop_mark()
    if data_root.exists() and not mark.exists():
        log.warning("discarding %s: the daemon that used it was not stopped cleanly", data_root)
        _unmount_under(data_root, include_self=True)
        shutil.rmtree(data_root)
    mark.unlink(missing_ok=True)  # until this daemon, in turn, is stopped cleanly
    data_root.mkdir(parents=True, exist_ok=True)
    return data_root


def _clear_stale_dockerd() -> None:
    """Remove what a killed run left: an unresponsive daemon, pidfile and socket."""
    pid = _read_pid(RUN_DIR / "docker.pid")
    if pid is not None and _is_private_dockerd(pid):
        log.warning("stopping unresponsive dockerd %d left by an earlier run", pid)
        _terminate(pid)
    for leftover in ("docker.pid", "docker.sock"):
        (RUN_DIR / leftover).unlink(missing_ok=True)


def _stop_dockerd() -> None:
    pid = _read_pid(RUN_DIR / "docker.pid")
    if pid is None or not _is_private_dockerd(pid):
        return
    started = time.monotonic()
    if _terminate(pid):
        _clean_stop_mark().touch()
    # dockerd leaves its default network namespace bind-mounted in exec-root.
    _unmount_under(RUN_DIR / "exec", include_self=False)
    log.info("stopped dockerd %d in %.1f s", pid, time.monotonic() - started)


# Daemons started by this process, so that their exit status is reaped
# (a zombie would still look alive to _alive()).
_CHILDREN: dict[int, subprocess.Popen[Any]] = {}


def _terminate(pid: int, grace: float = 30.0) -> bool:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL. True when SIGTERM was enough."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            child = _CHILDREN.get(pid)
            if child is not None and child.poll() is not None:
                _CHILDREN.pop(pid, None)
                return sig == signal.SIGTERM
            if child is None and not _alive(pid):
                return sig == signal.SIGTERM
            time.sleep(0.1)
    log.warning("process %d did not exit after SIGKILL", pid)
    return False


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _is_private_dockerd(pid: int) -> bool:
    # The host's own daemon must be left alone.
    return _is_dockerd_of(pid, RUN_DIR / "exec")


# --------------------------------------------------------------------------
# Leftovers: the images the tests make, and what a killed run leaves behind


def _is_test_tag(tag: str) -> bool:
    """True for ``fa-images-test/x:y`` and ``host:port/fa-images-test/x:y``."""
    first, _, rest = tag.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        tag = rest
    return tag.startswith(TEST_NAMESPACE)


def remove_test_images(client: docker.DockerClient, *, prune: bool) -> list[str]:
    """Untag every test image but the reused bases, so that the engine frees their layers.

    ``prune`` also deletes the dangling images: right for a private engine, where all are ours.
    """
    if os.environ.get("FA_IMAGES_TEST_KEEP_IMAGES") == "1":
        return []
    kept = {RUNTIME_TAG, DEVEL_TAG, CUDA_STANDIN_TAG, STOCK_PYTHON_TAG, STOCK_TAG, STOCK_RUNTIME_TAG}
    removed = []
    try:
        for image in client.images.list():
            for tag in image.tags:
                if tag in kept or not _is_test_tag(tag):
                    continue
                try:
                    client.images.remove(tag)
                except docker.errors.APIError as exc:  # e.g. a container still uses it
                    log.warning("could not remove test image %s: %s", tag, exc.explanation or exc)
                else:
                    removed.append(tag)
        if prune:
            client.images.prune(filters={"dangling": True})
    except (docker.errors.DockerException, requests.RequestException) as exc:
        log.warning("could not clean up the test images: %s", exc)
    if removed:
        log.info("removed %d test images: %s", len(removed), ", ".join(sorted(removed)))
    return removed


class Ran(NamedTuple):
    code: int
    out: str  # stdout alone: a value read from it is never interleaved with a warning on stderr
    err: str


def run_in(client: docker.DockerClient, image: str, command: str, **kwargs: Any) -> Ran:
    """Runs ``sh -c command`` in a fresh container of ``image``, which is then removed."""
    container = client.containers.create(image, ["sh", "-c", command], **kwargs)
    try:
        container.start()
        code = container.wait()["StatusCode"]
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
        err = container.logs(stdout=False, stderr=True).decode(errors="replace")
        return Ran(code, out, err)
    finally:
        container.remove(force=True)


def remove_images(client: docker.DockerClient, repository: str) -> None:
    """Untags every image of ``repository`` and deletes the dangling images left: the layers that
    no other image uses are freed (a shared torch stage stays with the images still using it)."""
    for image in client.images.list(name=repository):
        for tag in image.tags:
            client.images.remove(tag)
    client.images.prune(filters={"dangling": True})


def reap_leftovers(client: docker.DockerClient) -> None:
    """Stop and delete what a killed run left: its processes, containers, registry data and images.

    Call only as the private engine's sole user: then every marked process, every container and
    every test registry directory belongs to a run that is over.
    """
    for pid in marked_processes():
        log.warning("stopping pid %d (%s), left running by an earlier test run", pid, _cmdline(pid))
        _terminate(pid, grace=10)
    for container in client.containers.list(all=True, ignore_removed=True):
        log.warning("removing container %s, left by an earlier test run", container.name)
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)
    for kind, parent, prefix in (
        ("registry data", Path(tempfile.gettempdir()), REGISTRY_DIR_PREFIX),
        ("a package index", cache_dir(), INDEX_DIR_PREFIX),
    ):
        for path in parent.glob(prefix + "*"):
            if _left_by_a_run_that_is_over(path, prefix):
                log.warning("removing %s left by an earlier test run: %s", kind, path)
                shutil.rmtree(path, ignore_errors=True)
    remove_test_images(client, prune=True)


def marked_processes() -> list[int]:
    """Live processes started by a test run that is over (they carry CHILD_MARKER with its name):
    never a live run's, on whichever worker, nor this process's parents."""
    spared = set(_ancestors(os.getpid()))
    marker = f"{CHILD_MARKER}=".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        runs = [v.removeprefix(marker).decode(errors="replace") for v in environ if v.startswith(marker)]
        if runs and _run_is_over(runs[0]) and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _ancestors(pid: int) -> Iterator[int]:
    while pid > 1:
        yield pid
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def _tail(path: Path, lines: int = 30, grep: str | None = None) -> str:
    """The last ``lines`` lines of a log, only those matching ``grep`` if given."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path} unreadable)"
    kept = [line for line in text.splitlines() if grep is None or re.search(grep, line, re.IGNORECASE)]
    return "\n".join(kept[-lines:])


@contextlib.contextmanager
def _flocked(file: BinaryIO, operation: int) -> Iterator[None]:
    fcntl.flock(file, operation)
    try:
        yield
    finally:
        fcntl.flock(file, fcntl.LOCK_UN)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive lock between processes sharing the cache (e.g. xdist workers)."""
    with open(path, "a+b") as file, _flocked(file, fcntl.LOCK_EX):
        yield


# --------------------------------------------------------------------------
# Base images


@dataclasses.dataclass(frozen=True)
class BaseImages:
    """Tags of the two imported Debian base images."""

    runtime: str
    devel: str


def base_images(client: docker.DockerClient) -> BaseImages:
    """Make sure the runtime and devel Debian base images exist in the engine.

    Each image comes from a debootstrap rootfs cached as a tarball in
    ``cache_dir()/"rootfs"``. Both are made at once, and each is imported as
    soon as its tarball is ready, so the smaller one's import overlaps the
    larger one's debootstrap.
    """
    wanted = {
        RUNTIME_TAG: ("runtime", RUNTIME_PACKAGES),
        DEVEL_TAG: ("devel", DEVEL_PACKAGES),
    }
    rootfs_dir = cache_dir() / "rootfs"
    rootfs_dir.mkdir(exist_ok=True)
    with _file_lock(cache_dir() / "rootfs.lock"), contextlib.ExitStack() as stack:
        jobs = []
        for tag, (variant, packages) in wanted.items():
            key = _rootfs_key(packages)
            if _image_key(client, tag) != key:
                tarball = rootfs_dir / f"debian-{SUITE}-{variant}-{key}.tar"
                jobs.append((tag, key, tarball, packages))
        make_rootfs = None
        if any(not tarball.exists() for _, _, tarball, _ in jobs):
            make_rootfs = stack.enter_context(_rootfs_maker())

        def ensure(tag: str, key: str, tarball: Path, packages: tuple[str, ...]) -> None:
            if not tarball.exists():
                assert make_rootfs is not None
                make_rootfs(packages, tarball)
            _import_rootfs(client, tarball, tag, key)

        with ThreadPoolExecutor(max_workers=max(len(jobs), 1)) as pool:
            for future in [pool.submit(ensure, *job) for job in jobs]:
                future.result()
    return BaseImages(runtime=RUNTIME_TAG, devel=DEVEL_TAG)


def debian_base(client: docker.DockerClient, tag: str, packages: tuple[str, ...]) -> str:
    """``tag``: Debian with ``packages``, imported from ``debian_rootfs``'s cached tarball, and not
    imported again while its recipe is the same."""
    key = _rootfs_key(packages)
    if _image_key(client, tag) != key:
        _import_rootfs(client, debian_rootfs(SUITE, packages), tag, key)
    return tag


def debian_rootfs(suite: str, packages: tuple[str, ...]) -> Path:
    """A gzipped tarball of Debian ``suite`` with ``packages``, debootstrapped once and cached.

    For tests that enter a rootfs with chroot rather than import it into an engine. Gzipped,
    since it is kept between runs: bullseye with python3 and git is 270 MB, about 100 MB so.
    """
    key = _rootfs_key(packages, suite)
    tarball = cache_dir() / "rootfs" / f"debian-{suite}-{key}.tar.gz"
    with _file_lock(cache_dir() / "rootfs.lock"):
        if tarball.exists():
            return tarball
        tarball.parent.mkdir(exist_ok=True)
        with _rootfs_maker() as make, tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
            plain = Path(tmp) / f"debian-{suite}.tar"
            make(packages, plain, suite)
            partial = Path(tmp) / "partial.tar.gz"
            with open(partial, "wb") as out:  # the fastest level: a third of the default's CPU
                subprocess.run(["gzip", "-1", "-c", str(plain)], stdout=out, check=True)
            partial.rename(tarball)
    return tarball


def _rootfs_key(packages: Iterable[str], suite: str = SUITE) -> str:
    recipe = {
        "suite": suite,
        "variant": "minbase",
        "packages": sorted(packages),
        "excludes": _ROOTFS_EXCLUDES,
        "changes": _IMPORT_CHANGES,
    }
    return _hash_json(recipe)


def _hash_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _image_key(client: docker.DockerClient, tag: str) -> str | None:
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return (image.labels or {}).get(KEY_LABEL)


def _import_rootfs(client: docker.DockerClient, tarball: Path, tag: str, key: str) -> None:
    started = time.monotonic()
    repository, _, version = tag.rpartition(":")
    changes = [*_IMPORT_CHANGES, f"LABEL {KEY_LABEL}={key}"]
    answer = client.api.import_image(src=str(tarball), repository=repository, tag=version, changes=changes)
    # Podman's API imports under "latest" whatever the tag asked: tag the imported id by hand.
    imported = re.findall(r"sha256:[0-9a-f]{64}", str(answer))
    if imported:
        client.images.get(imported[-1]).tag(repository, version)
    if _image_key(client, tag) != key:
        raise RuntimeError(f"docker import of {tarball} did not produce {tag} with label {key}")
    log.info("imported %s as %s in %.1f s", tarball.name, tag, time.monotonic() - started)


@contextlib.contextmanager
def _rootfs_maker() -> Iterator[Callable[..., None]]:
    """Yield ``make(packages, tarball, suite=SUITE)``: debootstrap a rootfs and tar it.

    Safe to call from several threads at once; the rootfs trees live in one
    scratch directory and share one package proxy.
    """
    debootstrap = _which("debootstrap", "debootstrap")
    mirror = debian_mirror()
    with _scratch_dir() as scratch, _apt_proxy(mirror) as proxy_env:

        def make(packages: tuple[str, ...], tarball: Path, suite: str = SUITE) -> None:
            rootfs = scratch / tarball.stem
            _debootstrap(debootstrap, mirror, packages, rootfs, proxy_env, suite)
            _tar_rootfs(rootfs, tarball)

        yield make


def _debootstrap(
    debootstrap: str,
    mirror: str,
    packages: tuple[str, ...],
    rootfs: Path,
    env: Mapping[str, str],
    suite: str = SUITE,
) -> None:
    started = time.monotonic()
    log_path = rootfs.with_suffix(".log")
    command = [
        debootstrap,
        "--variant=minbase",
        f"--include={','.join(packages)}",
        suite,
        str(rootfs),
        mirror,
    ]
    with open(log_path, "wb") as log_file:
        result = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_env(DEBIAN_FRONTEND="noninteractive", LC_ALL="C", **env),
            check=False,
        )
    if result.returncode != 0:
        inner = rootfs / "debootstrap" / "debootstrap.log"
        raise RuntimeError(
            f"{' '.join(command)} failed ({result.returncode}):\n{_tail(log_path)}\n--- {inner}:\n{_tail(inner)}"
        )
    log.info(
        "debootstrap %s (%s) from %s took %.1f s",
        rootfs.name,
        ",".join(packages),
        mirror,
        time.monotonic() - started,
    )


def _tar_rootfs(rootfs: Path, tarball: Path) -> None:
    started = time.monotonic()
    partial = tarball.with_name(tarball.name + ".partial")
    # debootstrap copies the host's /etc/hostname in; the engine sets its own.
    (rootfs / "etc" / "hostname").write_text("localhost\n")
    command = [
        "tar",
        "--numeric-owner",
        "--xattrs",
        "--xattrs-include=*",
        "-C",
        str(rootfs),
        "-cf",
        str(partial),
    ]
    command += [f"--exclude={pattern}" for pattern in _ROOTFS_EXCLUDES]
    result = subprocess.run([*command, "."], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"{' '.join(command)} . failed: {result.stderr}")
    partial.rename(tarball)
    log.info(
        "tarred %s (%.0f MB) in %.1f s",
        tarball.name,
        tarball.stat().st_size / 1e6,
        time.monotonic() - started,
    )


def debian_mirror() -> str:
    """The Debian mirror to bootstrap from: env override, else apt's bookworm entry."""
    override = os.environ.get("FA_IMAGES_TEST_DEBIAN_MIRROR")
    if override:
        return override.rstrip("/")
    entries = list(_apt_source_entries(Path("/etc/apt")))
    for uri, suites, components in entries:
        if SUITE in suites and "main" in components:
            return uri
    # A host of another Debian release still names a usable Debian archive.
    for uri, _, _ in entries:
        if uri.endswith("/debian"):
            return uri
    return _DEFAULT_DEBIAN_MIRROR


def _apt_source_entries(apt_dir: Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """(uri, suites, components) of each enabled ``deb`` entry, in apt's order."""
    files = [apt_dir / "sources.list"]
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if path.suffix == ".sources":
            yield from _deb822_entries(text)
        else:
            yield from _one_line_entries(text)


def _one_line_entries(text: str) -> Iterator[tuple[str, list[str], list[str]]]:
    for line in text.splitlines():
        # Drop comments and "[arch=... signed-by=...]" options.
        words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb" and words[1].startswith("http"):
            yield words[1].rstrip("/"), [words[2]], words[3:]


def _deb822_entries(text: str) -> Iterator[tuple[str, list[str], list[str]]]:
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        name = None
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1].isspace() and name:
                fields[name] += " " + line.strip()
            elif ":" in line:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                fields[name] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            if uri.startswith(("http://", "https://")):
                yield (
                    uri.rstrip("/"),
                    fields.get("suites", "").split(),
                    fields.get("components", "").split(),
                )


@contextlib.contextmanager
def _scratch_dir() -> Iterator[Path]:
    """A temporary directory for the rootfs trees, on tmpfs where possible.

    dpkg fsyncs every file it unpacks; on tmpfs that costs nothing, which
    roughly halves debootstrap's time on a VM disk.
    """
    path = Path(tempfile.mkdtemp(prefix="fa-images-rootfs-"))
    mount = ["mount", "-t", "tmpfs", "-o", "mode=0755,size=50%", "fa-images-rootfs"]
    result = subprocess.run([*mount, str(path)], capture_output=True, env=child_env(), check=False)
    mounted = result.returncode == 0
    if not mounted:
        log.info("no tmpfs for debootstrap; working on disk in %s", path)
    try:
        yield path
    finally:
        # A failed debootstrap can leave proc/sys (or even a bind-mounted
        # /dev) mounted inside the rootfs: detach every mount below the
        # directory before deleting anything, so no host file is touched.
        _unmount_under(path, include_self=mounted)
        if mounted:
            path.rmdir()
        else:
            shutil.rmtree(path)


def _mount_points_under(path: str) -> list[str]:
    """Mount points at or below ``path``."""
    root = os.path.realpath(path)
    with open("/proc/self/mountinfo") as mountinfo:
        points = [
            # mountinfo writes spaces and such as octal escapes.
            re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            for line in mountinfo
        ]
    return [p for p in points if p == root or p.startswith(root + "/")]


def _unmount(points: Iterable[str]) -> None:
    # Deepest first; lazily, so a busy mount is detached all the same.
    for point in sorted(set(points), key=len, reverse=True):
        subprocess.run(
            ["umount", "--lazy", point],
            env=child_env(),
            check=False,
            capture_output=True,
        )


def _unmount_under(path: Path, *, include_self: bool) -> None:
    """Unmount everything below ``path`` (and ``path`` itself if asked)."""
    root = os.path.realpath(path)
    _unmount(p for p in _mount_points_under(root) if p != root or include_self)
    left = [p for p in _mount_points_under(root) if p != root or include_self]
    if left:
        raise RuntimeError(f"could not unmount {left}; not deleting {root}")


@contextlib.contextmanager
def _apt_proxy(mirror: str) -> Iterator[dict[str, str]]:
    """Yield the environment that points debootstrap's wget at a caching proxy.

    debootstrap fetches each package with a new wget, i.e. a new DNS lookup
    and connection, and two concurrent runs fetch the shared packages twice.
    The proxy reuses upstream connections, serves each index and package once
    to both runs (so both see the same archive snapshot), and keeps the .debs
    in ``cache_dir()/"debs"`` so a rootfs can be remade without downloading.
    Not used when the mirror is https or the host already needs a proxy.
    """
    parts = urllib.parse.urlsplit(mirror)
    if parts.scheme != "http" or os.environ.get("http_proxy") or os.environ.get("HTTP_PROXY"):
        yield {}
        return
    server = _AptProxy(cache_dir() / "debs")
    thread = threading.Thread(target=server.serve_forever, name="apt-proxy", daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        yield {"http_proxy": url, "no_proxy": "", "NO_PROXY": ""}
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _AptProxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, deb_dir: Path) -> None:
        super().__init__(("127.0.0.1", 0), _AptProxyHandler)
        self.deb_dir = deb_dir
        # Idle upstream connections per host, reused across requests.
        self._pools: collections.defaultdict[str, queue.SimpleQueue[http.client.HTTPConnection]] = (
            collections.defaultdict(queue.SimpleQueue)
        )
        self._memo: dict[str, tuple[int, list[tuple[str, str]], bytes]] = {}
        self._locks: collections.defaultdict[str, threading.Lock] = collections.defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()

    def fetch(self, url: str) -> tuple[int, list[tuple[str, str]], bytes]:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.netloc:
            return 400, [], b"only absolute http URLs\n"
        segments = parts.path.split("/")
        cached = None
        if parts.path.endswith(".deb") and ".." not in segments and not parts.query:
            cached = self.deb_dir / parts.netloc / parts.path.lstrip("/")
        with self._locks_guard:
            lock = self._locks[url]
        # One fetch per URL even when both debootstraps ask at once.
        with lock:
            if cached is not None and cached.is_file():
                return 200, [], cached.read_bytes()
            if url in self._memo:
                return self._memo[url]
            with self._locks_guard:
                pool = self._pools[parts.netloc]
            response = self._upstream(parts, pool)
            if response[0] == 200:
                if cached is not None:
                    cached.parent.mkdir(parents=True, exist_ok=True)
                    partial = cached.with_name(f"{cached.name}.{os.getpid()}.partial")
                    partial.write_bytes(response[2])
                    partial.rename(cached)
                else:
                    self._memo[url] = response
            return response

    @staticmethod
    def _upstream(
        parts: urllib.parse.SplitResult,
        pool: queue.SimpleQueue[http.client.HTTPConnection],
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        for attempt in range(3):
            try:
                conn = pool.get_nowait()
            except queue.Empty:
                conn = http.client.HTTPConnection(parts.netloc, timeout=60)
            try:
                conn.request("GET", target, headers={"User-Agent": "fa-images-tests"})
                response = conn.getresponse()
                body = response.read()
            except (http.client.HTTPException, OSError):
                # Usually a kept-alive connection the server has closed.
                conn.close()
                if attempt == 2:
                    raise
                continue
            headers = [(k, v) for k, v in response.getheaders() if k.lower() in ("location", "last-modified")]
            if response.will_close:
                conn.close()
            else:
                pool.put(conn)
            return response.status, headers, body
        raise AssertionError("unreachable")


class _AptProxyHandler(http.server.BaseHTTPRequestHandler):
    server: _AptProxy

    def do_GET(self) -> None:
        try:
            status, headers, body = self.server.fetch(self.path)
        except (http.client.HTTPException, OSError) as exc:
            self.send_error(502, explain=str(exc))
            return
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


# --------------------------------------------------------------------------
# CUDA devel stand-in


_STANDIN_DOCKERFILE = """\
FROM {base}
COPY cuda/ /usr/local/cuda/
# As in nvidia/cuda images: the toolkit's libraries are found through ld.so.conf.d.
RUN printf '%s\\n' /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib64 \\
        > /etc/ld.so.conf.d/988_cuda.conf \\
    && ldconfig
ENV CUDA_HOME=/usr/local/cuda \\
    PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:$PATH \\
    LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64 \\
    LIBRARY_PATH=/usr/local/cuda/lib64/stubs \\
    NVIDIA_VISIBLE_DEVICES=all \\
    NVIDIA_DRIVER_CAPABILITIES=compute,utility{extra_env}
"""


def cuda_devel_standin(
    client: docker.DockerClient,
    base: str,
    cuda_home: Path,
    tag: str = CUDA_STANDIN_TAG,
) -> str:
    """Build ``tag``: ``base`` plus ``cuda_home`` as /usr/local/cuda, like nvidia/cuda.

    It stands in for ``nvidia/cuda:12.8.x-devel``: CUDA_HOME, PATH,
    LD_LIBRARY_PATH, LIBRARY_PATH and the ld.so.conf.d entry are set as there.

    Symlinks inside ``cuda_home`` stay symlinks; those pointing outside it are
    copied as what they point to. The image is labelled with a hash of base,
    Dockerfile and tree, and not rebuilt while that hash matches.
    """
    cuda_home = Path(cuda_home)
    if not cuda_home.is_dir():
        raise FileNotFoundError(f"CUDA tree {cuda_home} is not a directory")
    version = _cuda_version(cuda_home)
    dockerfile = _STANDIN_DOCKERFILE.format(base=base, extra_env=f" \\\n    CUDA_VERSION={version}" if version else "")
    key = _hash_json(
        {
            "base": client.images.get(base).id,
            "dockerfile": dockerfile,
            "tree": _tree_fingerprint(cuda_home),
        }
    )
    if _image_key(client, tag) == key:
        return tag
    started = time.monotonic()
    size = _build_from_tar(client, tag, key, dockerfile, lambda tar: _add_tree(tar, cuda_home, "cuda"))
    log.info(
        "built %s from %s (context %.0f MB) in %.1f s",
        tag,
        cuda_home,
        size / 1e6,
        time.monotonic() - started,
    )
    return tag


def _build_from_tar(
    client: docker.DockerClient, tag: str, key: str, dockerfile: str, add: Callable[[tarfile.TarFile], None]
) -> int:
    """Builds ``tag`` from a context of ``dockerfile`` and what ``add`` puts beside it, labelled
    with ``key``; returns the context's bytes."""
    with tempfile.TemporaryFile() as context:
        with tarfile.open(fileobj=context, mode="w") as tar:
            data = dockerfile.encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(data)
            tar.addfile(info, fileobj=io.BytesIO(data))
            add(tar)
        size = context.tell()
        context.seek(0)
        # Nothing in these images needs the network, and "none" works on any engine.
        run_build(client, fileobj=context, custom_context=True, tag=tag, labels={KEY_LABEL: key}, network_mode="none")
    return size


def run_build(client: docker.DockerClient, **build_kwargs: Any) -> str:
    """``client.api.build(**build_kwargs)``, streamed; returns the image id.

    Raises ``docker.errors.BuildError`` on an error entry in the stream.
    Intermediate containers are always removed.
    """
    build_kwargs = {
        "rm": True,
        "forcerm": True,
        "pull": False,
        **build_kwargs,
        "decode": True,
    }
    output: collections.deque[dict[str, Any]] = collections.deque(maxlen=200)
    image_id = None
    for chunk in client.api.build(**build_kwargs):
        output.append(chunk)
        if "error" in chunk:
            raise docker.errors.BuildError(chunk["error"], list(output))
        aux = chunk.get("aux")
        if isinstance(aux, dict) and "ID" in aux:
            image_id = aux["ID"]
        stream = chunk.get("stream", "")
        match = re.match(r"Successfully built ([0-9a-f]+)", stream)
        if match and image_id is None:
            image_id = match.group(1)
    if image_id is None:
        raise docker.errors.BuildError("build stream ended without an image id", list(output))
    return image_id


def _cuda_version(cuda_home: Path) -> str | None:
    # Real toolkits carry version.json ({"cuda": {"version": "12.8.1"}, ...}).
    try:
        return str(json.loads((cuda_home / "version.json").read_text())["cuda"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _tree_entries(root: Path, arc_root: str) -> Iterator[tuple[str, Path, str | None]]:
    """(archive name, source path, symlink text or None) for ``root`` and below.

    A relative symlink that will point at the same thing inside the image
    (its target is in the tree) is kept; any other one is followed, because
    its target will not exist in the image.
    """

    def walk(src: Path, arc: str, seen: frozenset[str]) -> Iterator[tuple[str, Path, str | None]]:
        for entry in sorted(os.scandir(src), key=lambda e: e.name):
            path, name = Path(entry.path), f"{arc}/{entry.name}"
            if entry.is_symlink():
                link = os.readlink(path)
                in_tree = os.path.relpath(os.path.join(arc, link), arc_root)
                if (
                    not os.path.isabs(link)
                    and not in_tree.startswith("..")
                    and (root / in_tree).resolve() == (src / link).resolve()
                ):
                    yield name, path, link
                    continue
                if not path.exists():
                    yield name, path, link  # dangling either way; keep it as it is
                    continue
                path = path.resolve()
            if path.is_dir():
                real = os.path.realpath(path)
                if real in seen:
                    raise ValueError(f"symlink loop at {entry.path}")
                yield name, path, None
                yield from walk(path, name, seen | {real})
            else:
                yield name, path, None

    yield arc_root, root, None
    yield from walk(root, arc_root, frozenset({os.path.realpath(root)}))


def _tree_fingerprint(root: Path) -> str:
    digest = hashlib.sha256()
    for name, path, link in _tree_entries(root, "cuda"):
        if link is not None:
            digest.update(f"{name} -> {link}\n".encode())
        else:
            st = path.stat()
            digest.update(f"{name} {st.st_mode:o} {st.st_size} {st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _add_tree(tar: tarfile.TarFile, root: Path, arc_root: str) -> None:
    for name, path, link in _tree_entries(root, arc_root):
        if link is not None:
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = link
            info.mode = 0o777
            info.mtime = int(path.lstat().st_mtime)
            tar.addfile(info)
        else:
            tar.add(path, arcname=name, recursive=False)


# --------------------------------------------------------------------------
# A second Python in an image


_PYTHON_DOCKERFILE = """\
FROM {base}
COPY local/ /usr/local/
# libpython is found through ld.so.cache, wherever the interpreter was built to look.
RUN ldconfig && python{version} -c "import ctypes, ensurepip, ssl, venv"
"""


def python_standin(client: docker.DockerClient, base: str, prefix: Path, version: str, tag: str) -> str:
    """Build ``tag``: ``base`` with the CPython at ``prefix`` (``toolchain.cpython``: ``bin/pythonX.Y``,
    ``lib/pythonX.Y/``, ``include/pythonX.Y/``) under /usr/local, as a base image that ships Python
    ``version`` beside its own would (bases.python: system).

    Its test suite and site-packages stay behind. Labelled with a hash of base, Dockerfile and
    interpreter, and not rebuilt while that hash matches.
    """
    dockerfile = _PYTHON_DOCKERFILE.format(base=base, version=version)
    binary = prefix / "bin" / f"python{version}"
    key = _hash_json(
        {
            "base": client.images.get(base).id,
            "dockerfile": dockerfile,
            "python": [str(prefix), binary.stat().st_mtime_ns],
        }
    )
    if _image_key(client, tag) == key:
        return tag
    left_out = {f"lib/python{version}/test", f"lib/python{version}/site-packages"}

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        inside = info.name.removeprefix("local/")
        if "__pycache__" in info.name or any(inside == d or inside.startswith(d + "/") for d in left_out):
            return None
        info.uid = info.gid = 0
        return info

    def add(tar: tarfile.TarFile) -> None:
        tar.add(binary, arcname=f"local/bin/python{version}")
        for lib in sorted((prefix / "lib").glob(f"libpython{version}*.so*")):
            tar.add(lib, arcname=f"local/lib/{lib.name}")
        for tree in (f"lib/python{version}", f"include/python{version}"):
            tar.add(prefix / tree, arcname=f"local/{tree}", filter=keep)

    _build_from_tar(client, tag, key, dockerfile, add)
    log.info("built %s: %s with Python %s from %s", tag, base, version, prefix)
    return tag


def index_packages(index: str, /, **overrides: object) -> dict[str, object]:
    """A matrix's `packages`: everything from the tests' index, the sdists from sdists/."""
    return {"index": index, "torch_index": index, "sdists": "sdists", **overrides}


@dataclasses.dataclass(frozen=True)
class Stock:
    """The shared engine and what every module's matrix builds on.

    One base serves as devel and runtime: the compile then runs on the torch stage itself, and no
    module copies a 7 GB venv into a devel base (a copy and its commit took two to three minutes
    here). The two-base shape, as on NVIDIA's images, is built once, for the second Python, whose
    torch stage is its own anyway: on ``runtime``, a base without a compiler.
    """

    engine: EngineHandle
    base: str  # the CUDA stand-in: Python 3.11 and the second Python, uid 1000 taken
    index: str  # the simple index with torch and everything the builds install
    second_python: str  # toolchain.SECOND_PYTHON
    runtime: str  # Debian's runtime base with that Python: no compiler, no CUDA toolkit

    def packages(self, **overrides: object) -> dict[str, object]:
        return index_packages(self.index, **overrides)

    def bases(self, **overrides: object) -> dict[str, object]:
        return {"devel": self.base, "runtime": self.base, "python": "system", **overrides}


_UID_TAKEN_DOCKERFILE = """\
FROM {base}
RUN useradd --create-home --uid 1000 ubuntu
"""


def uid_taken(client: docker.DockerClient, base: str, tag: str) -> str:
    """Build ``tag``: ``base`` with uid 1000 taken by a user ``ubuntu``, as on Ubuntu 24.04's CUDA
    images. Labelled with a hash of base and Dockerfile, and not rebuilt while that hash matches."""
    dockerfile = _UID_TAKEN_DOCKERFILE.format(base=base)
    key = _hash_json({"base": client.images.get(base).id, "dockerfile": dockerfile})
    if _image_key(client, tag) != key:
        _build_from_tar(client, tag, key, dockerfile, lambda tar: None)
    return tag


# --------------------------------------------------------------------------
# Registries, package indexes and a local file server


@contextlib.contextmanager
def pypi_server(
    packages: Iterable[Path], *, htpasswd: Path | None = None, netns: Path | None = None, host: str = "127.0.0.1"
) -> Iterator[str]:
    """A pypiserver on ``host`` over the wheels in ``packages``; yield its simple index URL.
    With ``htpasswd`` every download and listing needs a login; with ``netns`` it serves in that
    network namespace (``bridged_docker_engine``'s)."""
    port = _free_port()
    auth = ["-P", str(htpasswd), "-a", "download,list,update"] if htpasswd else ["-P", ".", "-a", "."]
    cmd = [*in_netns(netns), sys.executable, "-m", "pypiserver", "run", "-i", host, "-p", str(port), *auth]
    proc = subprocess.Popen(
        # simple-dir: the directories are listed on every request, so a file added is served.
        [*cmd, "--disable-fallback", "--backend", "simple-dir", *map(str, packages)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),  # marked: a killed run's server is stopped by the next run
    )
    _CHILDREN[proc.pid] = proc
    url = f"http://{host}:{port}/simple/"
    try:
        deadline = time.monotonic() + 30
        while True:
            # Ours answers, not a stranger on the port: our process is alive and the answer is its kind.
            if proc.poll() is not None:
                assert proc.stderr is not None
                raise RuntimeError(f"pypiserver exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            if _index_answers(url, netns):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("pypiserver did not answer within 30 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _index_answers(url: str, netns: Path | None) -> bool:
    """An HTTP answer at ``url`` (a 401 counts), asked from ``netns`` where one is given."""
    probe = (
        "import sys, urllib.error, urllib.request\n"
        "try:\n    urllib.request.urlopen(sys.argv[1], timeout=2)\n"
        "except urllib.error.HTTPError as e:\n    sys.exit(e.code != 401)\n"
        "except OSError:\n    sys.exit(1)\n"
    )
    return subprocess.run([*in_netns(netns), sys.executable, "-c", probe, url], check=False).returncode == 0


# The logins of the engine tier's registry (tests/engine/conftest.py): the first build pushes as
# one, and the pull module's stand-in for Docker Hub serves the base to the other.
PUSH_USER, PULL_USER = "fa-push", "fa-pull"


CREDENTIAL_HELPER = "fa-test"


@dataclasses.dataclass(frozen=True)
class Registry:
    """A running ``local_registry``: its ``host:port`` and the password of each of its users."""

    address: str
    passwords: Mapping[str, str]

    def login_env(self, root: Path, user: str) -> dict[str, str]:
        """``DOCKER_CONFIG`` and ``PATH`` for a client logged in as ``user`` the way `docker login`
        leaves a credential helper: ``root/docker-config`` names the helper for this registry, and
        the helper, in ``root/bin``, notes each server it is asked for in ``root/helper-calls``."""
        bin_dir, config = root / "bin", root / "docker-config"
        bin_dir.mkdir()
        config.mkdir()
        helper = bin_dir / f"docker-credential-{CREDENTIAL_HELPER}"
        helper.write_text(
            f"#!{sys.executable}\n"
            "import json, sys\n"
            "if sys.argv[1:] != ['get']:\n"
            "    sys.exit(f'unsupported: {sys.argv[1:]}')\n"
            "server = sys.stdin.read().strip()\n"
            f"with open({str(root / 'helper-calls')!r}, 'a') as calls:\n"
            "    calls.write(server + '\\n')\n"
            f"print(json.dumps({{'ServerURL': server, 'Username': {user!r}, 'Secret': {self.passwords[user]!r}}}))\n"
        )
        helper.chmod(0o755)
        (config / "config.json").write_text(json.dumps({"credHelpers": {self.address: CREDENTIAL_HELPER}}))
        return {"DOCKER_CONFIG": str(config), "PATH": os.pathsep.join([str(bin_dir), os.environ["PATH"]])}


@contextlib.contextmanager
def local_registry(port: int = 0, *, users: Mapping[str, str] | None = None) -> Iterator[str]:
    """Run Debian's ``docker-registry`` on 127.0.0.1; yield ``"127.0.0.1:PORT"``.

    With ``users`` (name -> password), every request needs one of those logins (htpasswd).

    Storage is a temporary directory, deleted afterwards (or, after a killed run, by the
    next one). Each registry answers with a header of its own, so a stranger already
    listening on the port is never taken for it.

    Engines treat 127.0.0.0/8 registries as insecure by default, so plain
    HTTP works without daemon configuration.
    """
    binary, env = _registry_command()
    with tempfile.TemporaryDirectory(prefix=run_prefix(REGISTRY_DIR_PREFIX)) as tmp:
        log_path = Path(tmp) / "registry.log"
        auth = {}
        if users:
            import bcrypt  # the registry reads bcrypt entries only

            # The registry checks the login of every request and keeps no verdict: at bcrypt's
            # default cost that is a quarter of a second of CPU a request, and a run makes hundreds.
            # The passwords are random tokens of one run; a wrong one is refused at any cost.
            htpasswd = Path(tmp) / "htpasswd"
            htpasswd.write_text(
                "".join(
                    f"{name}:{bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=BCRYPT_ROUNDS)).decode()}\n"
                    for name, pw in users.items()
                )
            )
            auth = {"auth": {"htpasswd": {"realm": "fa-images-test", "path": str(htpasswd)}}}
        wanted = port
        for attempt in range(3):  # a free port can be taken before the registry binds it
            started = time.monotonic()
            port = wanted if wanted and attempt == 0 else _free_port()
            identity = f"{os.getpid()}-{attempt}-{os.urandom(8).hex()}"
            config = {
                "version": 0.1,
                "log": {"level": "warn", "accesslog": {"disabled": True}},
                "storage": {
                    "filesystem": {"rootdirectory": f"{tmp}/data"},
                    "delete": {"enabled": True},
                },
                "http": {"addr": f"127.0.0.1:{port}", "headers": {IDENTITY_HEADER: [identity]}},
                **auth,
            }
            config_path = Path(tmp) / "config.yml"
            config_path.write_text(json.dumps(config))  # JSON is YAML
            with open(log_path, "wb") as log_file:
                proc = subprocess.Popen(
                    [binary, "serve", str(config_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            _CHILDREN[proc.pid] = proc
            try:
                if wait_for_own_server(f"http://127.0.0.1:{port}/v2/", proc, identity, timeout=30):
                    log.info("registry on 127.0.0.1:%d up in %.1f s", port, time.monotonic() - started)
                    address = f"127.0.0.1:{port}"
                    _REGISTRY_CONFIGS[address] = config_path
                    try:
                        yield address
                    finally:
                        _REGISTRY_CONFIGS.pop(address, None)
                    return
                log.warning("registry on port %d did not come up:\n%s", port, _tail(log_path, lines=5))
            finally:
                _terminate(proc.pid, grace=10)
        raise RuntimeError(f"docker-registry did not answer; log tail:\n{_tail(log_path)}")


def _registry_command() -> tuple[str, dict[str, str]]:
    """Debian's registry binary, and the environment it runs in: the registry reads REGISTRY_*
    variables as config overrides, so none of the caller's reaches it."""
    binary = shutil.which("docker-registry") or shutil.which("registry")
    if binary is None:
        raise RuntimeError("docker-registry not found; install it with: apt-get install -y docker-registry")
    return binary, {k: v for k, v in child_env().items() if not k.startswith("REGISTRY_")}


# The config file of each running local_registry, by address: its garbage collection reads it.
_REGISTRY_CONFIGS: dict[str, Path] = {}


def keep_only(address: str, refs: Iterable[str]) -> int:
    """Drops every tag of the local registry at ``address`` but ``refs`` (``address/repo:tag``),
    then runs the registry's own garbage collection, which deletes each manifest no tag names and
    each blob no manifest names. What a finished story pushed stops holding the disk (the first
    build's image is 4.4 GB compressed). Returns the bytes it freed.

    For images of one manifest, as the engines push them here: the registry's 2.8 collection,
    with --delete-untagged, also deletes what a kept manifest list names (distribution#3178)."""
    config = _REGISTRY_CONFIGS[address]
    kept = set()
    for ref in refs:  # a ref of another spelling would keep nothing, silently
        repository, colon, name = ref.removeprefix(f"{address}/").rpartition(":")
        if not ref.startswith(f"{address}/") or not colon or "/" in name:
            raise ValueError(f"keep_only: {ref!r} is not {address}/REPOSITORY:TAG")
        kept.add((repository, name))
    repositories = config.parent / "data" / "docker" / "registry" / "v2" / "repositories"
    for tags in repositories.glob("**/_manifests/tags"):
        repository = tags.parent.parent.relative_to(repositories).as_posix()
        for tag in tags.iterdir():
            if (repository, tag.name) not in kept:
                shutil.rmtree(tag)
    binary, env = _registry_command()
    before = _tree_bytes(config.parent / "data")
    # Safe on a running registry while nothing pushes to it; the call waits for nothing else.
    subprocess.run(
        [binary, "garbage-collect", "--delete-untagged", str(config)], env=env, capture_output=True, check=True
    )
    return before - _tree_bytes(config.parent / "data")


def _tree_bytes(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file() and not path.is_symlink())


# bcrypt's lowest cost (4): about 1 ms a check where the default (12) takes about 250 ms.
BCRYPT_ROUNDS = 4


# The header a test server answers with, carrying a value only it knows.
IDENTITY_HEADER = "X-Fa-Images-Test"


def wait_for_own_server(url: str, proc: subprocess.Popen[Any], identity: str | None, timeout: float) -> bool:
    """Wait until ``proc`` answers ``url``: it is alive and, if ``identity`` is given, the answer carries it.

    Any HTTP answer counts (401 from a server that wants a login), but only from our process:
    one that died on "address already in use" while a stranger holds the port is not ready.
    """
    # No proxies: the target is on loopback.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        headers = None
        try:
            with opener.open(url, timeout=2) as response:
                headers = response.headers
        except urllib.error.HTTPError as exc:
            headers = exc.headers
        except (urllib.error.URLError, OSError):
            pass
        if headers is not None:
            if identity is None or headers.get(IDENTITY_HEADER) == identity:
                return proc.poll() is None
            if proc.poll() is not None:
                return False
        time.sleep(0.05)
    return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Sockets bound but never listening: a connection to them is refused, and
# nothing else can bind their ports while this process lives.
_RESERVED: list[socket.socket] = []


def unreachable_registry() -> str:
    """An ``"127.0.0.1:PORT"`` registry address where connections are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    _RESERVED.append(sock)
    return f"127.0.0.1:{sock.getsockname()[1]}"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve_directory(path: Path, port: int = 0) -> Iterator[str]:
    """Serve ``path`` over HTTP on 127.0.0.1; yield ``"http://127.0.0.1:PORT/"``.

    Reachable from builds and containers that use ``network_mode="host"`` on
    a local engine, e.g. for ``pip install --no-index --find-links URL``.
    A fixed ``port`` keeps the URL, and so the RUN lines that name it and the
    engine's layer cache, the same from run to run; if it is taken, any port.
    """
    handler = functools.partial(_QuietHandler, directory=str(path))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name=f"serve {path}", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


__all__ = [
    "CUDA_STANDIN_TAG",
    "DEVEL_PACKAGES",
    "DEVEL_TAG",
    "KEY_LABEL",
    "PULL_USER",
    "PUSH_USER",
    "RUNTIME_PACKAGES",
    "RUNTIME_TAG",
    "BaseImages",
    "EngineHandle",
    "Ran",
    "Registry",
    "Stock",
    "base_images",
    "cache_dir",
    "cuda_devel_standin",
    "debian_mirror",
    "debian_rootfs",
    "docker_engine",
    "local_registry",
    "marked_processes",
    "podman_engine",
    "pypi_server",
    "python_standin",
    "reap_leftovers",
    "remove_images",
    "remove_test_images",
    "run_build",
    "run_in",
    "serve_directory",
    "uid_taken",
    "unreachable_registry",
]
