"""The local rendering of a :class:`~training.launch.jobspec.JobSpec`: one torchrun agent per node on this machine, each in
its own process group and given exactly the environment the Training Operator gives a pod.

The first agent that fails stops the others, and :class:`LaunchError` names the failing rank and its error, read
from torchrun's error files. No process of a launch outlives :func:`launch_local`, whether it returns, raises, or
is interrupted (KeyboardInterrupt, SIGTERM): every process started for a launch carries a tag in its environment,
and whatever still runs at the end is killed. Linux only (``/proc``, pidfds).
"""
from __future__ import annotations

import itertools
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from data.errors import KfloopError
from data.fileio import atomic_write_json
from data.storage import absolute
from training.config import JobShape, TrainingConfig
from training.launch.jobspec import JobSpec, training_run_spec
from training.model_files import MODEL_FILE

TAG_ENV = "KFLOOP_LAUNCH_ID"
"""Environment variable that marks every process of one launch (agents and, through inheritance, workers)."""
STOP_GRACE_SECONDS = 10.0
"""How long agents get after SIGTERM (torchrun then stops its workers) before everything left is SIGKILLed."""
ERROR_TAIL_LINES = 8
"""Traceback or log lines quoted in a LaunchError."""
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?local_rank: (\d+)\).*?exitcode\s*:\s*(-?\d+)",
                         re.DOTALL)


@dataclass(kw_only=True, slots=True)
class LaunchResult:
    """A launch whose agents all exited 0."""

    world_size: int
    """Training processes in all."""
    seconds: float
    """Wall time from starting the first agent to the last one's exit."""
    logs: list[Path]
    """Combined stdout/stderr of each node's agent and workers, in node order."""


@dataclass(kw_only=True, slots=True)
class TrainResult:
    """A finished local training run."""

    model_dir: Path
    """The model dir rank 0 wrote (training/model.py layout)."""
    metrics: dict[str, float]
    """Final validation metrics (``val_loss``, ``val_accuracy``)."""
    world_size: int
    """Training processes that trained it."""
    seconds: float
    """Wall time of the launch."""


class LaunchError(KfloopError, RuntimeError):
    """A node failed; the message names the node, the rank (when known), its error and the node's log;
    ``node_exit_code`` is the node's own exit code (kfloop's is :attr:`exit_code`, the class's)."""

    def __init__(self, *, node: int, rank: int | None, exit_code: int, error: str, log: Path):
        self.node = node
        self.rank = rank
        self.node_exit_code = exit_code
        self.error = error
        self.log = log
        who = f"rank {rank} (node {node})" if rank is not None else f"node {node}"
        first, *rest = error.splitlines() or [""]
        quoted = "".join(f"\n  | {line}" for line in rest)  # quoted, so no log reader takes a line for ours
        super().__init__(f"training failed on {who}, exit code {exit_code}: {first}{quoted}\nfull log: {log}")


def free_port() -> int:
    """A TCP port that is free now, chosen below the OS's ephemeral port range.

    A port from the OS (bind to port 0) lies inside the ephemeral range, from which the agents also take the
    local ports of their own connections: a node connecting to the master before it listens could be given the
    master port itself and connect to itself. Below the range that cannot happen. A process that takes the port
    between this check and the master binding it fails the launch with "address already in use".

    Raises:
        RuntimeError: no free port was found.
    """
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports, each free now and below the ephemeral range (:func:`free_port`): for a server that
    listens on several.

    Raises:
        RuntimeError: fewer than ``n`` free ports were found among ``100 * n`` tried.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    below = range(low // 2, low)
    candidates = random.SystemRandom().sample(below, min(100 * n, len(below)))  # distinct: drawn without replacement
    ports = list(itertools.islice(filter(_bindable, candidates), n))
    if len(ports) < n:
        raise RuntimeError(f"{n} free TCP port(s) not found in {below.start}..{below.stop - 1} ({len(ports)} found)")
    return ports


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


class _Agent:
    """One node: a torchrun agent in its own process group, its output copied to a log file (and stdout)."""

    def __init__(self, spec: JobSpec, node: int, port: int, log_dir: Path, tag: str, echo: bool):
        self.node = node
        self.log = log_dir / f"node-{node}.log"
        self.error_file = log_dir / f"node-{node}.error.json"
        self.torchrun_dir = log_dir / "torchrun" / f"node-{node}"
        shutil.rmtree(self.torchrun_dir, ignore_errors=True)  # error files of an earlier launch would mislead
        self.error_file.unlink(missing_ok=True)
        env = {**os.environ, **spec.env, **spec.pod_env(node, "localhost", port),
               "TORCHELASTIC_ERROR_FILE": str(self.error_file), "PET_LOG_DIR": str(self.torchrun_dir), "PET_TEE": "3",
               TAG_ENV: tag}
        self.proc = subprocess.Popen(spec.command(python=sys.executable), env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.pidfd = os.pidfd_open(self.proc.pid)
        self._pump = threading.Thread(target=_copy_lines, args=(self.proc.stdout, self.log, f"[node{node}] ", echo),
                                      name=f"kfloop-node{node}-log", daemon=True)
        self._pump.start()

    def close(self) -> None:
        """Release the pidfd and wait for the log copy to see the end of the output."""
        os.close(self.pidfd)
        self._pump.join(timeout=STOP_GRACE_SECONDS)
        self.proc.stdout.close()


def _copy_lines(stream: IO[bytes], log: Path, prefix: str, echo: bool) -> None:
    with log.open("wb") as out:
        for line in stream:
            out.write(line)
            out.flush()
            if echo:
                sys.stdout.write(prefix + line.decode(errors="replace"))
                sys.stdout.flush()


def launch_local(spec: JobSpec, *, log_dir: Path, echo: bool = False) -> LaunchResult:
    """Run ``spec`` as ``spec.nnodes`` torchrun agents on localhost and wait for all of them.

    Node ``i`` gets ``os.environ``, then ``spec.env``, then ``spec.pod_env(i, "localhost", <free port>)``, and
    writes ``<log_dir>/node-<i>.log`` (echoed to stdout with a ``[node<i>]`` prefix when ``echo``; torchrun
    prefixes worker lines with ``[default<local rank>]:``), ``node-<i>.error.json`` (torchrun's error file) and,
    under ``torchrun/node-<i>/``, torchrun's per-worker error files and stdout/stderr copies.
    While it waits, SIGTERM (main thread only) raises SystemExit so that the agents are stopped too.

    Raises:
        LaunchError: a node exited non-zero; the other nodes were stopped first.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    port = free_port()
    agents: list[_Agent] = []
    started = time.monotonic()
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, exit_on_sigterm) if in_main_thread else None
    try:
        for node in range(spec.nnodes):
            agents.append(_Agent(spec, node, port, log_dir, tag, echo))
        failed = _first_failure(agents)
        seconds = time.monotonic() - started
    finally:
        _stop(agents, tag)
        for agent in agents:
            agent.close()  # the logs are complete from here on
        if in_main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    if failed is not None:
        raise _launch_error(failed, agents, spec)
    return LaunchResult(world_size=spec.world_size, seconds=seconds, logs=[a.log for a in agents])


def exit_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM handler of a launcher: exit as ``128 + signum`` through the ``finally`` blocks that stop the job."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
    raise SystemExit(128 + signum)


def _first_failure(agents: list[_Agent]) -> _Agent | None:
    """Wait until an agent exits non-zero (returned) or all exit 0 (None)."""
    poller = select.poll()
    waiting = {a.pidfd: a for a in agents}
    for fd in waiting:
        poller.register(fd, select.POLLIN)
    while waiting:
        for fd, _ in poller.poll():
            agent = waiting.pop(fd)
            poller.unregister(fd)
            if agent.proc.wait() != 0:
                return agent
    return None


def _stop(agents: list[_Agent], tag: str) -> None:
    """SIGTERM the running agents' process groups, give them STOP_GRACE_SECONDS to stop their workers, then
    SIGKILL every process still carrying ``tag`` and reap the agents."""
    running = [a for a in agents if a.proc.poll() is None]
    for agent in running:
        _kill_group(agent.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for agent in running:
        try:
            agent.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(agent.proc.pid, signal.SIGKILL)
    for pid in tagged_processes(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for agent in agents:
        agent.proc.wait()


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def tagged_processes(tag: str) -> list[int]:
    """Pids of live processes whose environment holds ``KFLOOP_LAUNCH_ID=<tag>``."""
    needle = f"{TAG_ENV}={tag}".encode()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if needle in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def _launch_error(failed: _Agent, agents: list[_Agent], spec: JobSpec) -> LaunchError:
    """Name the rank that failed first and its error: from the earliest worker error file (written by ``@record``)
    of the last attempt on any node; else from the failed node's root cause and that worker's stderr; else from
    the agent's own error file (e.g. a rendezvous timeout); else from the end of the node's log."""
    worker = _first_worker_error(agents) or _crashed_worker(failed)
    if worker is not None:
        agent, local_rank, error = worker
        return LaunchError(node=agent.node, rank=agent.node * spec.nproc_per_node + local_rank,
                           exit_code=failed.proc.returncode, error=error, log=agent.log)
    if failed.error_file.is_file():
        error = _describe(json.loads(failed.error_file.read_text()))
    else:
        error = _tail(failed.log) or "no output"
    return LaunchError(node=failed.node, rank=None, exit_code=failed.proc.returncode, error=error, log=failed.log)


def _first_worker_error(agents: list[_Agent]) -> tuple[_Agent, int, str] | None:
    found = []
    for agent in agents:
        for path in agent.torchrun_dir.glob("*/attempt_*/*/error.json"):
            attempt = int(path.parent.parent.name.removeprefix("attempt_"))
            found.append((attempt, -path.stat().st_mtime_ns, agent, int(path.parent.name), path))
    if not found:
        return None
    _, _, agent, local_rank, path = max(found, key=lambda f: f[:2])
    return agent, local_rank, _describe(json.loads(path.read_text()))


def _crashed_worker(agent: _Agent) -> tuple[_Agent, int, str] | None:
    """A worker that died without an error file (import error, signal): the root cause torchrun printed in the
    node's log, with the end of that worker's stderr."""
    log = agent.log.read_text(errors="replace") if agent.log.is_file() else ""
    cause = _ROOT_CAUSE.search(log)
    if cause is None:
        return None
    local_rank, exit_code = int(cause.group(1)), cause.group(2)
    attempts = sorted(agent.torchrun_dir.glob("*/attempt_*"), key=lambda p: int(p.name.removeprefix("attempt_")))
    stderr = _tail(attempts[-1] / str(local_rank) / "stderr.log") if attempts else ""
    return agent, local_rank, stderr or f"the process exited with code {exit_code} and wrote nothing to stderr"


def _tail(path: Path) -> str:
    """The last ERROR_TAIL_LINES non-blank lines of a text file ('' when missing)."""
    if not path.is_file():
        return ""
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return "\n".join(lines[-ERROR_TAIL_LINES:])


def _describe(error_json: dict[str, Any]) -> str:
    """Message plus the end of the traceback from a torchelastic error file."""
    message = error_json.get("message")
    if not isinstance(message, dict):
        return str(message)
    callstack = message.get("extraInfo", {}).get("py_callstack", "").rstrip().splitlines()
    tail = "\n".join(callstack[-ERROR_TAIL_LINES:])
    return f"{message.get('message')}\n{tail}" if tail else str(message.get("message"))


def train_local(data: str | Path, schema: str | Path, *, model_dir: str | Path, checkpoint_dir: str | Path,
                config: TrainingConfig, shape: JobShape, log_dir: str | Path, mlflow_run_id: str | None = None,
                mlflow_tracking_uri: str | None = None, echo: bool = False) -> TrainResult:
    """Train ``config`` with ``training.train`` on ``shape.nnodes`` local torchrun agents of ``shape.nproc_per_node``
    processes each, writing ``<log_dir>/config.json`` and the logs of :func:`launch_local`.

    ``mlflow_tracking_uri`` becomes the workers' ``MLFLOW_TRACKING_URI``; without it they inherit this process's.

    Raises:
        LaunchError: training failed on some rank.
    """
    log_dir = Path(log_dir)
    config_file = atomic_write_json(log_dir / "config.json", config.to_dict())
    spec = training_run_spec(config, shape, data=absolute(data), schema=absolute(schema),
                             model_dir=str(Path(model_dir).resolve()),
                             checkpoint_dir=str(Path(checkpoint_dir).resolve()), config_file=str(config_file.resolve()),
                             env={"MLFLOW_TRACKING_URI": mlflow_tracking_uri} if mlflow_tracking_uri else None,
                             mlflow_run_id=mlflow_run_id)
    launched = launch_local(spec, log_dir=log_dir, echo=echo)
    description = json.loads((Path(model_dir) / MODEL_FILE).read_text())
    return TrainResult(model_dir=Path(model_dir), metrics=description["metrics"],
                       world_size=description["world_size"], seconds=launched.seconds)
