"""The peak memory of a build, counting every process that works for it.

With a compiler cache, the compiles are not the build's children: sccache's server, started by
the builder, detaches and runs them, so a sum over the build's process tree misses them. Two ways
to count them, the first that works here is used, and named in the results:

- ``cgroup``: the build runs in a cgroup of its own (v2, else v1's memory controller), which
  holds every process it starts, detached or not. The figure is the peak of the cgroup's
  anonymous memory (sampled each second; what the compiles themselves allocate), and beside it
  the kernel's own peak (``memory.peak``, v1 ``memory.max_usage_in_bytes``), which also counts
  the page cache the build's files fill.
- ``process trees``: the sum of resident memory over the build's process tree and the trees of
  every process whose environment names the build's cache directory (``SCCACHE_DIR``): the
  sccache server and its compilers, found by what they are, not by name. Sampled each 2 s.

The process-tree sum is taken in both cases, as a cross-check.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

GIB = 1 << 30


@dataclass(frozen=True)
class Memory:
    method: str
    peak_gib: float  # the figure the method gives
    kernel_peak_gib: float | None  # the cgroup's own peak, page cache included; None without a cgroup
    tree_peak_gib: float  # the process-tree sum, always
    cache_server_pids: int  # processes found through the cache directory


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name is in parentheses and may hold spaces: split after the last one.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return parents


def _trees(roots: set[int], parents: dict[int, int]) -> set[int]:
    tree, grew = set(roots), True
    while grew:
        grown = tree | {pid for pid, ppid in parents.items() if ppid in tree}
        grew, tree = len(grown) > len(tree), grown
    return tree


def _names_cache(pid: int, entry: bytes) -> bool:
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def tree_sample(root: int, cache_dir: Path | None, seen_servers: set[int]) -> int:
    """Bytes resident in ``root``'s tree and in the trees of processes whose environment names ``cache_dir``."""
    parents = _parents()
    roots = {root}
    if cache_dir is not None:
        entry = f"SCCACHE_DIR={cache_dir}".encode()
        found = {pid for pid in parents if _names_cache(pid, entry)}
        seen_servers |= found - _trees({root}, parents)  # outside the build's own tree: the server
        roots |= found
    return sum(_rss_bytes(pid) for pid in _trees(roots, parents))


def _cgroup_mounts() -> dict[str, tuple[Path, str]]:
    """'v2' and 'v1' (the memory controller's hierarchy): (mount point, the mount's root path)."""
    mounts: dict[str, tuple[Path, str]] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if kind and kind[0] == "cgroup2":
            mounts.setdefault("v2", (Path(fields[4]), fields[3]))
        elif kind and kind[0] == "cgroup" and "memory" in kind[-1].split(","):
            mounts.setdefault("v1", (Path(fields[4]), fields[3]))
    return mounts


def _own_cgroup(version: str) -> str | None:
    """This process's cgroup path in the v2 hierarchy, or in v1's memory hierarchy."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, controllers, path = line.split(":", 2)
        if (version == "v2" and _id == "0" and controllers == "") or (
            version == "v1" and "memory" in controllers.split(",")
        ):
            return path
    return None


def _under(mount: Path, mount_root: str, path: str) -> Path | None:
    relative = os.path.relpath(path, mount_root)
    return None if relative.startswith("..") else (mount / relative).resolve()


def _v2_parent(mount: Path, own: Path) -> Path | None:
    """A cgroup under which a child gets the memory controller: this one if it can enable it for
    its children (the root can), else the nearest ancestor that has."""
    try:
        if "memory" not in (own / "cgroup.controllers").read_text().split():
            return None
        control = own / "cgroup.subtree_control"
        if "memory" not in control.read_text().split():
            control.write_text("+memory")  # refused (EBUSY) where this cgroup holds processes
        return own
    except OSError:
        pass
    for parent in own.parents:
        if not parent.is_relative_to(mount):
            break
        try:
            if "memory" in (parent / "cgroup.subtree_control").read_text().split():
                return parent
        except OSError:
            continue
    return None


@dataclass
class Cgroup:
    """A cgroup of this build's own: join it with ``wrap``; read it with ``anon_bytes``."""

    path: Path
    version: str

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd``, started inside the cgroup: the shell joins it, then becomes ``cmd``."""
        return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path), *cmd]

    def anon_bytes(self) -> int:
        key = "anon" if self.version == "v2" else "total_rss"
        for line in (self.path / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
        return 0

    def kernel_peak_bytes(self) -> int | None:
        name = "memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass  # a process outlived the build: the empty-once cgroup stays, harmless


def make_cgroup(name: str) -> tuple[Cgroup | None, str]:
    """A fresh cgroup with the memory controller, or None; and why not, when not."""
    try:
        mounts = _cgroup_mounts()
    except OSError as exc:
        return None, f"no cgroup: {exc}"
    for version in ("v2", "v1"):
        if version not in mounts:
            continue
        mount, root = mounts[version]
        own_path = _own_cgroup(version)
        own = _under(mount, root, own_path) if own_path else None
        parent = (_v2_parent(mount, own) if version == "v2" else own) if own else None
        if parent is None:
            continue
        try:
            path = parent / name
            path.mkdir()
            group = Cgroup(path, version)
            group.anon_bytes()  # the controller's files are there
            return group, ""
        except OSError:
            continue
    return None, "no cgroup with the memory controller could be made here"


@dataclass
class Meter:
    """Samples a running build's memory until ``stop``."""

    cache_dir: Path | None
    cgroup: Cgroup | None
    _peak_anon: int = 0
    _peak_tree: int = 0
    _servers: set[int] = field(default_factory=set)
    _done: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self, root: int) -> None:
        self._every(2.0, lambda: self._tree(root))
        if self.cgroup is not None:
            self._every(1.0, self._anon)

    def _every(self, seconds: float, sample: Callable[[], None]) -> None:
        def loop() -> None:
            while not self._done.wait(seconds):
                sample()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _tree(self, root: int) -> None:
        self._peak_tree = max(self._peak_tree, tree_sample(root, self.cache_dir, self._servers))

    def _anon(self) -> None:
        assert self.cgroup is not None
        try:
            self._peak_anon = max(self._peak_anon, self.cgroup.anon_bytes())
        except (OSError, ValueError):
            pass

    def stop(self) -> Memory:
        self._done.set()
        for thread in self._threads:
            thread.join()
        tree = round(self._peak_tree / GIB, 1)
        if self.cgroup is None:
            method = "process trees: resident memory summed over the build's tree and the cache server's, every 2 s"
            return Memory(method, tree, None, tree, len(self._servers))
        kernel = self.cgroup.kernel_peak_bytes()
        method = f"cgroup {self.cgroup.version}: peak anonymous memory of the build's own cgroup, every 1 s"
        return Memory(
            method,
            round(self._peak_anon / GIB, 1),
            round(kernel / GIB, 1) if kernel is not None else None,
            tree,
            len(self._servers),
        )
