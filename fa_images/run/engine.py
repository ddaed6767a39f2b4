"""The container runtime, behind the few calls fa-images needs: pull, tag, run, push.

``DockerEngine`` drives the Docker Engine API through the docker SDK's low-level client
with decoded streaming, so a long pull or push shows progress instead of blocking. It turns
errors that the API reports *inside* its streams (a refused pull or push) into
exceptions, because docker-py returns them as data. Every container it creates is removed
on every path out, Ctrl-C included, unless the caller asks to keep it. Builds are an image
builder's (``image_builder``), which talks to the same daemon.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from ..builder import untrusted
from ..builder.dist import IMAGE_DIGEST
from ..errors import EngineUnavailable, StepFailed
from . import gpus
from .gpus import HostGpus

OnLine = Callable[[str], None]
CONTAINER_LABEL = "fa-images"


def short(instruction: str, width: int = 60) -> str:
    text = " ".join(instruction.split())
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass(frozen=True)
class ImageInfo:
    labels: dict[str, str]
    size: int  # bytes, as the engine counts them (all layers, the base's included)
    id: str = ""


@dataclass(frozen=True)
class PullProgress:
    """One status line of a pull: a layer (None for the image as a whole) and what it is doing."""

    layer: str | None
    status: str
    current: int | None = None  # bytes, while a layer downloads or extracts
    total: int | None = None


@dataclass
class RunResult:
    exit_code: int
    output: list[str]
    kept_container: str | None = None


class Engine(Protocol):
    """What the executor needs from a container engine. Small enough to fake in unit tests."""

    def describe(self) -> str: ...

    def has_gpu_runtime(self) -> bool: ...

    def tag(self, image: str, ref: str) -> None:
        """Tags an image the engine holds (an id) as ``ref``."""
        ...

    def image_info(self, ref: str) -> ImageInfo | None:
        """What the engine knows of an image it holds, or None when it holds none by that name."""
        ...

    def missing_images(self, refs: list[str]) -> list[str]: ...

    def pull(self, ref: str, on_progress: Callable[[PullProgress], None]) -> ImageInfo:
        """Pulls ``ref`` with the client's registry logins; what the engine then holds."""
        ...

    def registry_digest(self, ref: str) -> str | None:
        """The digest the registry serves for ``ref``, asked without pulling it (None: it has no
        image by that name). A registry that cannot be asked is a StepFailed."""
        ...

    def run(
        self, image: str, command: list[str] | None, *, gpu: bool | HostGpus, keep: bool, on_line: OnLine
    ) -> RunResult: ...

    def push(self, ref: str, on_line: OnLine) -> str: ...

    def debug_command(self, container: str) -> str:
        """How a person enters a container that ``run`` kept (``keep=True``, a failed command)."""
        ...


def _context() -> Any | None:
    """The docker CLI's active context when it is not the default one (DOCKER_HOST unset): the
    CLI, and so BuildKit's builds, talk to its daemon, and the SDK must talk to the same one."""
    if os.environ.get("DOCKER_HOST"):
        return None
    try:
        from docker.context import ContextAPI

        context = ContextAPI.get_current_context()
    except Exception:  # an unreadable CLI config: the CLI fails on it too, and says why
        return None
    return context if context is not None and context.name != "default" and context.Host else None


def _where() -> str:
    """The daemon both the SDK and the docker CLI use: DOCKER_HOST, else the active context's."""
    context = _context()
    if context is not None:
        return f"{context.Host} (docker context {context.name})"
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


_PUSHED_DIGEST = re.compile(r"\bdigest: (sha256:[0-9a-f]{64})\b")
# How a registry says, through the daemon, that it has no such tag or repository.
_UNKNOWN = re.compile(r"manifest unknown|name unknown|not found", re.IGNORECASE)
_AUTH_REFUSED = re.compile(r"no basic auth credentials|unauthorized|authentication required|denied", re.IGNORECASE)


def registry_of(ref: str) -> str:
    """The registry host of an image reference, as Docker reads it (docker.io without one)."""
    first = ref.split("/", 1)[0]
    return first if "/" in ref and ("." in first or ":" in first or first == "localhost") else "docker.io"


LOG_GRACE = 10.0  # seconds a followed log may stay open after its container exited


def _follow_until_exit(container: Any, said: Callable[[bytes], None]) -> int:
    """The container's output as it comes, then its exit code. Podman 4 can keep a followed log
    open after its container exited: the stream is then closed and the rest read at once."""
    stream = container.logs(stream=True, follow=True)
    exited: dict[str, Any] = {}
    read_all = threading.Event()

    def reap() -> None:
        try:
            exited["status"] = container.wait()
        except Exception as exc:  # raised in the reading thread, below
            exited["error"] = exc
        if not read_all.wait(LOG_GRACE):
            exited["cut"] = True
            import docker.errors

            # docker-py cannot cancel a stream over ssh://: the read then ends when the engine ends it.
            with suppress(docker.errors.DockerException):
                stream.close()

    reaper = threading.Thread(target=reap, name="container-wait", daemon=True)
    reaper.start()
    chunks = 0
    try:
        for raw in stream:
            said(raw)
            chunks += 1
    except Exception:
        if not exited.get("cut"):
            raise
    read_all.set()
    reaper.join()
    if "error" in exited:
        raise exited["error"]
    if exited.get("cut"):  # the rest of the output, past what the stream gave
        for raw in list(container.logs(stream=True, follow=False))[chunks:]:
            said(raw)
    return int(exited["status"].get("StatusCode", 1))


def _login_hint(ref: str, message: str) -> str:
    """How to give the engine a login, when the registry refused it one."""
    if not _AUTH_REFUSED.search(message):
        return ""
    return (
        f"; log in first with `docker login {registry_of(ref)}`: pushes and pulls use the Docker client "
        "config ($DOCKER_CONFIG/config.json, else ~/.docker/config.json), credential helpers included"
    )


_Call = TypeVar("_Call", bound=Callable[..., Any])


def engine_call(what: str) -> Callable[[_Call], _Call]:
    """An engine's refusal (an API error, a dropped connection) becomes one StepFailed line, not
    a traceback: e.g. a runtime that cannot set a container's limits, or a daemon that went away."""

    def decorate(method: _Call) -> _Call:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            import docker.errors
            import requests

            subject = next((a for a in args if isinstance(a, str)), kwargs.get("tag") or "")
            doing = f"{what} {subject}".strip()
            try:
                return method(self, *args, **kwargs)
            except docker.errors.APIError as exc:
                said = untrusted.error_line(str(exc.explanation or exc))
                raise StepFailed(f"{doing}: the engine refused: {said}") from None
            except (docker.errors.DockerException, requests.RequestException) as exc:
                raise StepFailed(f"{doing}: lost the engine at {_where()}: {untrusted.error_line(str(exc))}") from None

        return cast(_Call, wrapper)

    return decorate


class DockerEngine:
    def __init__(self, client: Any) -> None:
        self.client = client
        self.api = client.api

    @classmethod
    def from_env(cls) -> DockerEngine:
        import docker

        where = _where()
        try:
            context = _context()
            if context is None:
                client = docker.from_env(version="auto", timeout=600)
            else:
                client = docker.DockerClient(base_url=context.Host, tls=context.TLSConfig, version="auto", timeout=600)
            client.ping()
        except Exception as exc:  # the SDK raises several unrelated types for "nobody home"
            raise EngineUnavailable(
                f"no Docker Engine answers at {where} ({type(exc).__name__})",
                hint="start one (`sudo systemctl start docker`, or `dockerd &`), or point DOCKER_HOST at it; "
                "`fa-images render` and `fa-images wheel` work without an engine",
            ) from None
        return cls(client)

    def product(self) -> str:
        """ "Docker Engine", or what else answers the API: Podman names itself in Components."""
        info = self.client.version()
        name = next((c.get("Name") for c in info.get("Components") or [] if c.get("Name")), "Docker Engine")
        return "Docker Engine" if name == "Engine" else str(name)

    def describe(self) -> str:
        info = self.client.version()
        return f"{self.product()} {info.get('Version', '?')} (API {info.get('ApiVersion', '?')}) at {_where()}"

    def has_gpu_runtime(self) -> bool:
        """Whether a device request can be answered: the NVIDIA Container Toolkit's runtime is registered."""
        info = self.client.info()
        return "nvidia" in (info.get("Runtimes") or {}) or info.get("DefaultRuntime") == "nvidia"

    @engine_call("tagging")
    def tag(self, image: str, ref: str) -> None:
        repository, tag = ref.rsplit(":", 1)
        if not self.api.tag(image, repository, tag=tag, force=True):
            raise StepFailed(f"tagging {image} as {ref}: the engine refused")

    @engine_call("looking up")
    def image_info(self, ref: str) -> ImageInfo | None:
        import docker.errors

        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        return ImageInfo(labels=dict(image.labels or {}), size=int(image.attrs.get("Size") or 0), id=image.id)

    @engine_call("looking up base images")
    def missing_images(self, refs: list[str]) -> list[str]:
        """The refs the engine does not hold. The legacy builder pulls a missing FROM image even
        with pull=False, so this is asked before any build: nothing is pulled behind the user's back."""
        import docker.errors

        missing = []
        for ref in refs:
            try:
                self.client.images.get(ref)
            except docker.errors.ImageNotFound:
                missing.append(ref)
        return missing

    def pull(self, ref: str, on_progress: Callable[[PullProgress], None]) -> ImageInfo:
        """Pulls ``ref``, streaming each layer's status. The login comes from the client config
        and its credential helpers, as for a push; the engine gets it in a header, nothing else."""
        import docker.errors
        import requests

        try:
            for chunk in self.api.pull(ref, stream=True, decode=True):
                if "error" in chunk or "errorDetail" in chunk:
                    message = str(chunk.get("error") or chunk["errorDetail"].get("message", "pull failed"))
                    raise StepFailed(f"pull of {ref} failed: {message.strip()}{_login_hint(ref, message)}")
                detail = chunk.get("progressDetail") if isinstance(chunk.get("progressDetail"), dict) else {}
                status = str(chunk.get("status") or "").strip()
                if status:
                    layer = chunk.get("id") if isinstance(chunk.get("id"), str) else None
                    on_progress(PullProgress(layer, status, detail.get("current"), detail.get("total")))
        except docker.errors.APIError as exc:
            message = str(exc.explanation or exc)
            raise StepFailed(f"pull of {ref} failed: {message}{_login_hint(ref, message)}") from None
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise StepFailed(f"pull of {ref}: lost the engine at {_where()}: {exc}") from None
        info = self.image_info(ref)
        if info is None:
            raise StepFailed(f"pull of {ref} ended, but the engine holds no image by that name")
        return info

    @engine_call("asking the registry for")
    def registry_digest(self, ref: str) -> str | None:
        import docker.errors

        try:
            # The daemon asks the registry for the manifest's descriptor, with the client's login.
            descriptor = self.api.inspect_distribution(ref).get("Descriptor") or {}
        except docker.errors.NotFound:
            if self.product() != "Docker Engine":  # Podman's API has no such route: its 404 says nothing of the image
                raise StepFailed(f"{self.product()}'s API cannot ask a registry for a digest without a pull") from None
            return None
        except docker.errors.APIError as exc:
            if _UNKNOWN.search(str(exc.explanation or exc)):
                return None
            raise
        digest = descriptor.get("digest")
        return digest if isinstance(digest, str) and IMAGE_DIGEST.fullmatch(digest) else None

    @contextmanager
    def _container(self, image: str, command: list[str] | None, **kwargs: Any) -> Iterator[tuple[Any, dict]]:
        """A uniquely named container, removed however the block ends unless ``state["keep"]`` is set."""
        name = f"fa-images-{uuid.uuid4().hex[:12]}"
        container = self.client.containers.create(
            image, command=command, name=name, labels={CONTAINER_LABEL: "1"}, **kwargs
        )
        state = {"keep": False}
        try:
            yield container, state
        finally:
            if not state["keep"]:
                container.remove(force=True)

    def legacy_build(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """The legacy builder's decoded stream (the SDK's ``APIClient.build``), for ``SdkBuilder``."""
        return cast(Iterator[dict[str, Any]], self.api.build(**kwargs))

    @contextmanager
    def files_of(self, image: str) -> Iterator[Iterator[bytes]]:
        """The tar stream of an image's files, read from a container that is created, never
        started (a FROM-scratch stage has no command), and removed however the block ends."""
        with self._container(image, ["/fa-images-never-started"]) as (container, _):
            chunks, _stat = container.get_archive("/")
            yield chunks

    @engine_call("running a container of")
    def run(
        self, image: str, command: list[str] | None, *, gpu: bool | HostGpus, keep: bool, on_line: OnLine
    ) -> RunResult:
        """``gpu``: True asks the engine's NVIDIA runtime for every GPU (a device request);
        a ``HostGpus`` passes those device nodes and driver libraries explicitly."""
        kwargs: dict[str, Any] = {}
        if isinstance(gpu, HostGpus):
            kwargs = gpus.container_options(gpu, self.api.inspect_image(image)["Config"].get("Env"))
        elif gpu:
            from docker.types import DeviceRequest

            kwargs["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        output: list[str] = []

        def said(raw: bytes) -> None:
            for line in raw.decode(errors="replace").splitlines():
                output.append(line)
                on_line(line)

        with self._container(image, command, **kwargs) as (container, state):
            container.start()
            code = _follow_until_exit(container, said)
            state["keep"] = keep and code != 0  # a failed check, kept for debug_command
        return RunResult(code, output, kept_container=container.name if state["keep"] else None)

    @engine_call("pushing")
    def push(self, ref: str, on_line: OnLine) -> str:
        repository, tag = ref.rsplit(":", 1)
        digest = ""
        for chunk in self.api.push(repository, tag=tag, stream=True, decode=True):
            if "error" in chunk or "errorDetail" in chunk:
                message = chunk.get("error") or chunk["errorDetail"].get("message", "push failed")
                raise StepFailed(f"push of {ref} failed: {message.strip()}{_login_hint(ref, message)}")
            aux = chunk.get("aux")
            if isinstance(aux, dict) and aux.get("Digest"):
                digest = aux["Digest"]
            status = chunk.get("status") or chunk.get("stream")
            if status and chunk.get("id") is None:
                on_line(status.rstrip())
                # Podman reports the digest only in the line the docker CLI prints: "TAG: digest: sha256:…"
                said = _PUSHED_DIGEST.search(status)
                digest = digest or (said.group(1) if said else "")
        if not digest:
            raise StepFailed(f"push of {ref} ended without a digest from the registry")
        return digest

    def debug_command(self, container: str) -> str:
        return f"docker start -ai {container}"
