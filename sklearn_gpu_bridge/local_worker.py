"""The local worker: started by the client when no worker is configured.

It runs ``python -m sklearn_gpu_bridge.worker`` with this interpreter, waits
for its connection file (written once the worker is warm), and stops it when
this process exits. The worker also watches this process and stops by itself
if it dies without saying goodbye.
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time

from .errors import WorkerUnavailable


class LocalWorker:
    def __init__(self, backend="auto", startup_timeout=300.0):
        self.backend = backend
        self.startup_timeout = startup_timeout
        self.folder = tempfile.mkdtemp(prefix="sklearn-gpu-bridge-")
        self.connection_file = os.path.join(self.folder, "worker.json")
        self.log_file = os.path.join(self.folder, "worker.log")
        self.process = None

    @property
    def alive(self):
        return self.process is not None and self.process.poll() is None

    def start(self):
        command = [
            sys.executable, "-m", "sklearn_gpu_bridge.worker", "--backend", self.backend,
            "--connection-file", self.connection_file, "--parent-pid", str(os.getpid()),
        ]
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout
        while not os.path.exists(self.connection_file):
            if self.process.poll() is not None:
                raise WorkerUnavailable(
                    f"the local worker exited with code {self.process.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise WorkerUnavailable(f"the local worker was not ready within {self.startup_timeout:.0f} s")
            time.sleep(0.05)
        return self

    def log_tail(self, lines=20):
        try:
            with open(self.log_file, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self):
        """SIGTERM (the worker stops cleanly), then SIGKILL after 5 s."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
