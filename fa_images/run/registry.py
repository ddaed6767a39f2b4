"""A registry's OCI distribution API, as much of it as signatures need: manifests by tag or digest,
blobs by digest, and their uploads, with the login the Docker client config gives (credential
helpers included, through the docker SDK's reader of that config).

Written here rather than taken from an OCI client library: every answer a registry gives is bounded
in time from its first byte and in size (``untrusted``), which the libraries leave to their callers,
and a digest asked for is checked against the bytes that came, never taken from a header.
Registries on a loopback address are spoken to over plain HTTP, as Docker Engine does by default.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from ..builder import untrusted
from ..errors import FatalError
from .engine import registry_of

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MANIFEST_TYPES = (
    OCI_MANIFEST,
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
MAX_MANIFEST = 4 << 20  # the distribution spec's own limit for a manifest
MAX_TOKEN = 1 << 20
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
EXIT_REGISTRY = 11  # as `check` says of an image it cannot pull: nothing was checked


class RegistryError(FatalError):
    """The registry could not be asked, refused the login, or answered what it should not."""

    exit_code = EXIT_REGISTRY


@dataclass(frozen=True)
class Repository:
    """One repository of a registry, as an image reference names it."""

    registry: str  # as the reference and the client config name it: "ghcr.io", "127.0.0.1:5000"
    name: str  # "acme/flash-attn"

    @classmethod
    def of(cls, ref: str) -> tuple[Repository, str]:
        """(repository, tag or digest) of a checked image reference (``latest`` where it names neither)."""
        rest, _, digest = ref.partition("@")
        if ":" in rest.rsplit("/", 1)[-1]:
            name, tag = rest.rsplit(":", 1)
        else:
            name, tag = rest, "latest"
        registry = registry_of(name)  # "docker.io/acme/x" names it too
        path = name.removeprefix(f"{registry}/")
        if registry == "docker.io" and "/" not in path:  # Docker Hub's official images live under library/
            path = f"library/{path}"
        return cls(registry, path), digest or tag

    @property
    def identity(self) -> str:
        """The repository as a signature names it (cosign's and containers/image's docker-reference)."""
        return f"{self.registry}/{self.name}"

    @property
    def base_url(self) -> str:
        host = "registry-1.docker.io" if self.registry == "docker.io" else self.registry
        name = urllib.parse.urlsplit(f"//{host}").hostname or host  # without its port
        return f"{'http' if untrusted.is_loopback(name) else 'https'}://{host}/v2/{self.name}"


@dataclass(frozen=True)
class Manifest:
    data: bytes
    media_type: str
    digest: str

    def json(self) -> dict[str, Any]:
        document = untrusted.parse_json(self.data, what=f"manifest {self.digest}")
        if not isinstance(document, dict):
            raise RegistryError(f"manifest {self.digest} is not a JSON object")
        return document


class Session:
    """Requests to one repository, with its login: Basic, or the Bearer token its challenge asks for."""

    def __init__(self, repository: Repository, *, push: bool = False) -> None:
        self.repository, self.push = repository, push
        self._authorization: str | None = None

    def _login(self) -> tuple[str, str] | None:
        import docker.auth

        config = docker.auth.load_config()
        key = "https://index.docker.io/v1/" if self.repository.registry == "docker.io" else self.repository.registry
        found = config.resolve_authconfig(key) or {}
        user, password = found.get("username") or found.get("Username"), found.get("password") or found.get("Password")
        return (user, password) if user and password else None

    def _authenticate(self, challenge: str) -> None:
        scheme, _, params = challenge.partition(" ")
        login = self._login()
        if scheme.lower() == "basic":
            if login is None:
                raise RegistryError(
                    f"{self.repository.registry} wants a login: `docker login {self.repository.registry}`"
                )
            self._authorization = _basic(*login)
            return
        if scheme.lower() != "bearer":
            raise RegistryError(
                f"{self.repository.registry} asks for {untrusted.shown(scheme)[:40]} auth, which fa-images cannot give"
            )
        fields = dict(_CHALLENGE.findall(params))
        realm = fields.get("realm", "")
        if untrusted.split_url(realm).scheme not in ("https", "http"):
            raise RegistryError(f"{self.repository.registry}'s token service is not an http(s) URL")
        scope = f"repository:{self.repository.name}:{'pull,push' if self.push else 'pull'}"
        query = urllib.parse.urlencode({k: v for k, v in (("service", fields.get("service")), ("scope", scope)) if v})
        headers = {"Authorization": _basic(*login)} if login else {}
        try:
            body, _ = untrusted.fetch(f"{realm}{'&' if '?' in realm else '?'}{query}", headers, limit=MAX_TOKEN)
        except (OSError, ValueError) as exc:
            raise RegistryError(
                f"{self.repository.registry}'s token service refused: {untrusted.shown(str(exc))[:200]}"
            ) from None
        answer = untrusted.parse_json(body, what="the registry's token")
        token = answer.get("token") or answer.get("access_token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{self.repository.registry}'s token service gave no token")
        self._authorization = f"Bearer {token}"

    def request(
        self, method: str, url: str, *, body: bytes | None = None, headers: dict[str, str] | None = None,
        limit: int = MAX_MANIFEST, missing_ok: bool = False,
    ) -> tuple[int, dict[str, str], bytes] | None:  # fmt: skip
        """(status, headers, body) of one request, with the login once the registry asks for it;
        None for a 404 where ``missing_ok``; RegistryError for any other failure."""
        for attempt in (1, 2):
            sent = {"User-Agent": "fa-images", **(headers or {})}
            if self._authorization:
                sent["Authorization"] = self._authorization
            request = urllib.request.Request(url, data=body, headers=sent, method=method)
            try:
                with untrusted.open_url(request) as response:
                    data = untrusted.read_response(response, url=url, limit=limit)
                    return response.status, {k.lower(): v for k, v in response.headers.items()}, data
            except urllib.error.HTTPError as exc:
                exc.close()
                if exc.code == 401 and attempt == 1 and exc.headers.get("WWW-Authenticate"):
                    self._authenticate(exc.headers["WWW-Authenticate"])
                    continue
                if exc.code == 404 and missing_ok:
                    return None
                said = "the login was refused" if exc.code in (401, 403) else f"HTTP {exc.code}"
                raise RegistryError(f"{method} {untrusted.shown_url(url)[:200]}: {said}") from None
            except (OSError, ValueError) as exc:  # URLError, a deadline, an answer past its limit
                raise RegistryError(
                    f"{method} {untrusted.shown_url(url)[:200]}: {untrusted.shown(str(exc))[:200]}"
                ) from None
        raise RegistryError(f"{self.repository.registry} refused the login it asked for")

    def manifest(self, reference: str) -> Manifest | None:
        """The manifest of a tag or digest (None: the registry has none); a digest asked for is checked."""
        answer = self.request(
            "GET", f"{self.repository.base_url}/manifests/{reference}",
            headers={"Accept": ", ".join(MANIFEST_TYPES)}, missing_ok=True,
        )  # fmt: skip
        if answer is None:
            return None
        _, headers, data = answer
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if DIGEST.fullmatch(reference) and digest != reference:
            raise RegistryError(f"the registry served manifest {reference} with other bytes ({digest})")
        media_type = headers.get("content-type", "").split(";")[0].strip()
        return Manifest(data, media_type, digest)

    def blob(self, digest: str, *, limit: int) -> bytes:
        answer = self.request("GET", f"{self.repository.base_url}/blobs/{digest}", limit=limit, missing_ok=True)
        if answer is None:
            raise RegistryError(f"{self.repository.identity} has no blob {digest}")
        data = answer[2]
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise RegistryError(f"the registry served blob {digest} with other bytes")
        return data

    def put_blob(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        there = self.request("HEAD", f"{self.repository.base_url}/blobs/{digest}", missing_ok=True)
        if there is not None:
            return digest
        answer = self.request("POST", f"{self.repository.base_url}/blobs/uploads/", body=b"")
        assert answer is not None
        location = answer[1].get("location")
        if not location:
            raise RegistryError(f"{self.repository.registry} started an upload without saying where")
        url = urllib.parse.urljoin(self.repository.base_url + "/", location)
        if untrusted.split_url(url).netloc != untrusted.split_url(self.repository.base_url).netloc:
            raise RegistryError(f"{self.repository.registry} sent the upload to another host")
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})
        self.request("PUT", url, body=data, headers={"Content-Type": "application/octet-stream"})
        return digest

    def put_manifest(self, tag: str, document: dict[str, Any]) -> str:
        data = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
        media_type = document.get("mediaType", OCI_MANIFEST)
        self.request(
            "PUT", f"{self.repository.base_url}/manifests/{tag}", body=data, headers={"Content-Type": media_type}
        )
        return "sha256:" + hashlib.sha256(data).hexdigest()


def _basic(user: str, password: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
