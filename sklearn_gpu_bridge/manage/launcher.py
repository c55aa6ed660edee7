"""Starting a worker process: its command line, its log, the wait until it is ready, its stop.

The one place that builds ``python -m sklearn_gpu_bridge.worker ...``: the
embedded local worker, ``sklearn-gpu-bridge start`` (here or inside WSL2),
the tests and the benchmarks all start workers through it.

A worker is ready when it has written its connection file (it does so once
warm). It runs in a private working folder, with ``-P`` where Python has it,
so that nothing in the folder it starts from is imported as a module.
"""

import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from ..config import ENV_ACCEL, WORKER_DEFAULTS
from ..errors import ConfigurationError, WorkerUnavailable
from ..runtime.connection_file import NotAConnectionFile, read_connection_file
from ..runtime.private_files import open_append_private, prepare_folder

READY_POLL = 0.05


def worker_argv(python=None, *, connection_file, safe_path=None, parent_pid=None, **options):
    """The worker's command line; ``options`` are :data:`config.WORKER_DEFAULTS` names.

    ``safe_path``: pass ``-P`` (Python >= 3.11: the working folder is not put
    on ``sys.path``); default: when ``python`` is this interpreter and has it.
    """
    unknown = set(options) - set(WORKER_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown worker option(s): {sorted(unknown)}")
    if safe_path is None:
        safe_path = python is None and sys.version_info >= (3, 11)
    argv = [str(python or sys.executable)] + (["-P"] if safe_path else [])
    argv += ["-m", "sklearn_gpu_bridge.worker", "--connection-file", str(connection_file)]
    if parent_pid is not None:
        argv += ["--parent-pid", str(parent_pid)]
    for name, value in options.items():
        if value is None:
            continue
        if name == "pool_dirs":
            for folder in value:
                argv += ["--pool-dir", str(folder)]
        elif isinstance(value, bool):  # a flag: --name or --no-name
            argv.append(("--" if value else "--no-") + name.replace("_", "-"))
        else:
            argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


def spawn(argv, log_file, *, cwd, detached=False, windows=False, creationflags=0):
    """Start ``argv`` with its output appended to ``log_file`` (owner-only, never through a link)."""
    log_file = Path(log_file)
    prepare_folder(log_file.parent)
    with open_append_private(log_file) as log:
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        log.write(f"---- {stamp} starting: {shlex.join(map(str, argv))}\n".encode())
        log.flush()
        # never accel in a worker: its scikit-learn must be scikit-learn itself, not served by a worker
        env = {k: v for k, v in os.environ.items() if k != ENV_ACCEL}
        kwargs = {"stdin": subprocess.DEVNULL, "stdout": log, "stderr": subprocess.STDOUT, "cwd": str(cwd),
                  "env": env}
        if windows:
            kwargs["creationflags"] = creationflags
        elif detached:
            kwargs["start_new_session"] = True  # no SIGHUP/SIGINT from the terminal that started it
        return subprocess.Popen(argv, **kwargs)


def log_tail(log_file, lines=25):
    try:
        text = Path(log_file).read_text(errors="replace")
    except OSError:
        return ""
    return "".join(text.splitlines(True)[-lines:])


def wait_ready(process, connection_file, timeout, *, log_file, accept=None):
    """The worker's ConnectionInfo once its file is there; WorkerUnavailable if it exits or times out, or at once
    if the file is refused (a client would refuse it too: waiting would not change that).

    ``accept(info)`` may refuse a file that is not this worker's (an older
    one's); by default the file must name ``process``'s pid.
    """
    accept = accept or (lambda info: info.pid == process.pid)
    deadline = time.monotonic() + timeout
    while True:
        if Path(connection_file).exists():
            try:
                info = read_connection_file(connection_file)
            except (OSError, NotAConnectionFile):
                info = None  # being replaced right now: look again
            except ConfigurationError as exc:
                process.kill()
                raise WorkerUnavailable(f"the worker wrote {connection_file}, but it cannot be used: {exc}") from None
            if info is not None and accept(info):
                return info
        if process.poll() is not None:
            raise WorkerUnavailable(f"the worker exited with code {process.returncode} before it was ready; "
                                    f"the end of {log_file}:\n{log_tail(log_file)}")
        if time.monotonic() > deadline:
            process.kill()
            raise WorkerUnavailable(f"the worker was not ready within {timeout:.0f} s; see {log_file}")
        time.sleep(READY_POLL)


class LaunchedWorker:
    """A worker subprocess of this process: started, waited for, and stopped here.

    Its connection file and log lie in ``folder`` (a private folder), which is
    also its working folder.
    """

    def __init__(self, folder, *, name="worker", timeout=300.0, python=None, parent_pid=None, **options):
        self.folder = Path(folder)
        self.connection_file = self.folder / f"{name}.json"
        self.log_file = self.folder / f"{name}.log"
        self.argv = worker_argv(python, connection_file=self.connection_file, parent_pid=parent_pid, **options)
        self.started = time.monotonic()
        self.process = spawn(self.argv, self.log_file, cwd=self.folder)
        try:
            self.info = wait_ready(self.process, self.connection_file, timeout, log_file=self.log_file)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - self.started

    @property
    def pid(self):
        return self.process.pid

    def log(self):
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def stop(self, wait=10.0):
        """SIGINT first (a clean stop: the worker removes its file), SIGKILL after ``wait`` s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(wait)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode
