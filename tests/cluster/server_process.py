"""A real server as a child process for tests: started in its own process group on a free loopback port, waited
for until its health URL answers, and stopped as a group (servers such as ``mlflow server`` spawn workers)."""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A loopback TCP port free now, below the OS's ephemeral range: a port from that range (bind to port 0) may
    be handed to some process's outgoing connection meanwhile, which for a rendezvous port means a node connecting
    to itself. The test cluster's own (it imports nothing of kfloop, so that none of its behaviour comes from
    the code it tests); kfloop's launcher has the same rule in ``training.launch.local.free_port``.

    Raises:
        RuntimeError: no free port was found.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.SystemRandom().sample(range(low // 2, low), 100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port found in {low // 2}..{low - 1}")


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports, each free now and below the ephemeral range (:func:`free_port`): for a server that
    listens on several."""
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def start_server(argv: list[str], *, health_url: str, log_path: Path, env: dict[str, str],
                 timeout_s: float) -> subprocess.Popen:
    """Start ``argv`` with stdout and stderr in ``log_path`` and wait until ``health_url`` answers 200.

    Raises:
        RuntimeError: it exited or did not answer within ``timeout_s`` (the end of its log is in the message).
    """
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(health_url, timeout=2) as r:
                if r.status == 200:
                    return process
        except OSError:
            time.sleep(0.2)  # polling interval of a deadline-bounded wait, not synchronisation
    stop_group(process)
    raise RuntimeError(f"{Path(argv[0]).name} did not answer {health_url} within {timeout_s} s:\n"
                       + log_path.read_text()[-3000:])


def stop_group(process: subprocess.Popen | None) -> None:
    """Stop ``process``'s whole process group (SIGTERM, then SIGKILL after 15 s)."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
