"""A private one-node Slurm cluster on 127.0.0.1 for the tests: munged, slurmctld and slurmd
from Debian's packages (``.ci/setup`` installs them), with their own key, sockets, ports,
state and logs under one directory, so nothing of a system Slurm or munge is used or touched.

The node has the machine's CPUs and most of its memory; processes are tracked by
``proctrack/linuxproc`` (no cgroup setup needed). ``Cluster.sbatch`` and friends run the
real client commands against it through ``SLURM_CONF``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

NODE = "fanode"
PARTITION = "test"
DAEMONS = ("munged", "slurmctld", "slurmd")
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"})


def missing_tools() -> list[str]:
    found = {name: shutil.which(name) or _sbin(name) for name in (*DAEMONS, "sbatch", "scontrol", "squeue")}
    return [name for name, path in found.items() if path is None]


def _sbin(name: str) -> str | None:
    path = Path("/usr/sbin") / name
    return str(path) if path.exists() else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(root: Path, cpus: int, memory_mb: int) -> str:
    return f"""\
ClusterName=fatest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=3600
KillWait=10
NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]

    def run(self, *args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(args), env=self.env, cwd=cwd, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {proc.stderr.strip()}\n{self.logs()}")
        return proc

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as key=value pairs (one job, or an array's first line's fields)."""
        text = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text.splitlines()[0]))

    def jobs(self, job_id: str) -> list[dict[str, str]]:
        text = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in text.splitlines() if line.strip()]

    def wait(self, job_id: str, timeout: float) -> dict[str, str]:
        """Waits until the job (or array) ended; returns its state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = [j.get("JobState") for j in self.jobs(job_id)]
            if states and all(s in ENDED for s in states):
                return self.job(job_id)
            time.sleep(2)
        raise TimeoutError(f"job {job_id} still runs after {timeout} s\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.root / name
            if path.exists():
                out.append(f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)


def _start(cmd: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} did not start: {proc.stderr.strip() or proc.stdout.strip()}")


def _stop(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextmanager
def cluster(root: Path, *, cpus: int, memory_mb: int) -> Iterator[Cluster]:
    """Starts munged, slurmctld and slurmd under ``root``; stops each by its pid file at the end."""
    for sub in ("state", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    conf = root / "slurm.conf"
    conf.write_text(_config(root, cpus, memory_mb))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    sbin = {name: shutil.which(name) or _sbin(name) or name for name in DAEMONS}
    pid_files = [root / "munged.pid", root / "slurmctld.pid", root / "slurmd.pid"]
    try:
        _start(
            [
                sbin["munged"],
                "--force",
                f"--socket={root}/munge.sock",
                f"--key-file={key}",
                f"--pid-file={root}/munged.pid",
                f"--log-file={root}/munged.log",
                f"--seed-file={root}/munged.seed",
            ],
            env,
        )
        _start([sbin["slurmctld"], "-f", str(conf)], env)
        _start([sbin["slurmd"], "-f", str(conf), "-N", NODE], env)
        handle = Cluster(root, env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = handle.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
            if state in ("idle", "mixed", "allocated"):
                break
            time.sleep(1)
        else:
            raise RuntimeError(f"the node did not come up (state {state!r})\n{handle.logs()}")
        yield handle
    finally:
        for pid_file in reversed(pid_files):
            _stop(pid_file)
