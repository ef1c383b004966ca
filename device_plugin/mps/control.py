"""Talks to the host driver's `nvidia-cuda-mps-control`: `-d` starts the control daemon, a plain run sends the
commands it reads on stdin and exits 0 only if it reached the daemon.

Facts (NVIDIA's nvidia-cuda-mps-control(1) man page, driver 470+; NVIDIA k8s-device-plugin
cmd/mps-control-daemon/mps/daemon.go at commit 05d317d5): the daemon and every client find each other through
CUDA_MPS_PIPE_DIRECTORY and log under CUDA_MPS_LOG_DIRECTORY; the front end reads newline-separated commands
until EOF; `quit` stops the daemon; `get_default_active_thread_percentage` is the cheap liveness query NVIDIA's
plugin uses; `set_default_active_thread_percentage <p>` and `set_default_device_pinned_mem_limit <dev> <n>M`
set what clients that bring no limit of their own get.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

PROBE = "get_default_active_thread_percentage"


class MpsError(Exception):
    """nvidia-cuda-mps-control failed, could not be run, or did not reach the daemon."""


@dataclass(frozen=True, slots=True)
class MpsPaths:
    """Where the daemon is and what it shares with its clients (host paths; the DaemonSet mounts them at the
    same paths in the plugin's container)."""

    binary: str = "nvidia-cuda-mps-control"
    pipe_dir: str = "/var/run/vgpu/mps/pipe"
    log_dir: str = "/var/run/vgpu/mps/log"
    shm_dir: str = "/var/run/vgpu/mps/shm"

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        return {**base, "CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}


def _tail(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "..." + text[-limit:]


class MpsControl:
    """Runs the binary; every failure is an MpsError whose message says what ran and what it answered."""

    def __init__(self, paths: MpsPaths, *, timeout_s: float = 10.0, env: Mapping[str, str] | None = None) -> None:
        self.paths = paths
        self.timeout_s = timeout_s
        self._env = paths.env(os.environ if env is None else env)

    def _run(self, args: list[str], stdin: str | None) -> str:
        shown = " ".join(args)
        try:
            done = subprocess.run(
                args,
                input=stdin,
                env=self._env,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise MpsError(
                f"{self.paths.binary} not found: set mps_control_binary to the host driver's nvidia-cuda-mps-control "
                "(the NVIDIA container toolkit puts it on PATH with NVIDIA_DRIVER_CAPABILITIES=compute)"
            ) from None
        except PermissionError as exc:
            raise MpsError(f"{shown}: cannot run it: {exc}") from None
        except subprocess.TimeoutExpired:
            raise MpsError(f"{shown}: no answer within {self.timeout_s:g} s") from None
        if done.returncode != 0:
            raise MpsError(
                f"{shown} exited with {done.returncode}: {_tail(done.stdout + ' ' + done.stderr) or 'no output'}"
            )
        return done.stdout

    def start_daemon(self) -> None:
        """`nvidia-cuda-mps-control -d`: returns once the daemon has forked into the background."""
        self._run([self.paths.binary, "-d"], None)

    def send(self, *commands: str) -> str:
        """Send commands to the running daemon; its answers (one line per query) are returned."""
        return self._run([self.paths.binary], "".join(c + "\n" for c in commands))

    def probe(self) -> None:
        """Raises MpsError unless the daemon answers."""
        self.send(PROBE)
