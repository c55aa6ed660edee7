"""A worker in the background: ``start``, ``stop`` and ``status``, for the CLI and for Python.

``start`` launches ``python -m sklearn_gpu_bridge.worker`` detached from the
terminal (its own session on Linux; on Windows, inside WSL2 through a hidden
``wsl.exe`` that lives as long as the worker), sends its output to a log
file, waits for the worker's connection file (written once the worker is
warm), and keeps what it knows in a state file next to it
(``worker.json`` -> ``worker.service.json``: how it was started, the log
file, the pool folders set up for it, the transport measured).

``stop`` asks the worker to shut down with a signed ``shutdown`` request (the
same on every platform), waits for it to go, and only then falls back to
signals. ``status`` asks the worker itself.

Each function takes the same keyword arguments as its command, and returns a
plain dict; settings shared with the client (``connection_file``,
``startup_timeout``, ``transport``, ``wsl_distro``, ``wsl_python``) default
to ``get_config()``'s, so ``set_config`` and ``SKLEARN_GPU_BRIDGE_*`` reach
them too.
"""

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..client import connect
from ..config import WORKER_DEFAULTS, get_config
from ..errors import BridgeError, ConfigurationError, ProtocolError, WorkerUnavailable
from ..progress import format_seconds, waiting
from ..protocol import Session, new_id
from ..runtime.connection_file import default_connection_file, read_connection_file, start_lock_path
from ..runtime.private_files import (
    ExclusiveLock,
    doorbell_path,
    exited,
    make_folders,
    make_private_folder,
    prepare_folder,
    terminate,
)
from ..transport.link import dealer
from ..version import __version__
from . import wsl
from .launcher import spawn, wait_ready, worker_argv
from .local_worker import warm_connection_file
from .measure import measure as measure_transports
from .state_file import read_state, state_path, write_state
from .transport_select import candidates_for, choose, client_transport, current_record, record

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
STOP_TIMEOUT = 15.0
PROBE_TIMEOUT = 120.0  # wsl.exe may have to boot the VM first


class ServiceError(BridgeError):
    """A background worker could not be started, stopped or found."""


# ---------------------------------------------------------------- paths and files


def resolve_connection_file(connection_file=None):
    """The option, else the setting (``set_config``/environment), else the default file if a worker
    wrote it, else the warm local worker's (the one this environment's scripts share), if it runs."""
    chosen = connection_file or get_config()["connection_file"]
    if chosen:
        return Path(chosen)
    if not default_connection_file().exists():
        warm = warm_connection_file(get_config()["local_backend"])
        if warm.exists():
            return warm
    return default_connection_file()


def default_log_file(connection_file):
    """``.../worker.json`` -> ``.../worker.log``."""
    return Path(connection_file).with_suffix(".log")


# ---------------------------------------------------------------- talking to a worker without a Connection


def quick_request(info, op, timeout=2.0):
    """A signed quick request (``ping``, ``status``, ``shutdown``) on its own socket; the reply or None.

    No hello and no pool: it works against a worker of another version too
    (``stop`` must be able to stop one).
    """
    session = Session(info.key_bytes, peer=info.worker_id)
    sock = dealer(info)
    try:
        msg_id = new_id()
        sock.send_multipart(session.pack({"op": op, "id": msg_id, "client": "sgb-service-" + new_id()}))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(left * 1000):
                return None
            try:
                reply, _ = session.unpack(sock.recv_multipart())
            except ProtocolError:
                continue
            if reply.get("parent") == msg_id:
                return reply
        return None
    finally:
        sock.close(linger=0)


def reachable(address, timeout=2.0):
    """Whether something accepts connections at ``tcp://host:port`` or ``ipc://path``."""
    if address.startswith("ipc://"):
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(address[len("ipc://"):])
                return True
        except OSError:
            return False
    parts = urlsplit(address)
    host = (parts.hostname or "127.0.0.1").strip("[]")
    if host in ("0.0.0.0", "*", "::"):
        host = "127.0.0.1"
    try:
        with socket.create_connection((host, parts.port), timeout=timeout):
            return True
    except OSError:
        return False


def _read_info(path):
    try:
        return read_connection_file(path)
    except (OSError, ConfigurationError):
        return None


def _answering(path, timeout=2.0):
    """The connection info at ``path`` if a worker answers a signed ping there, else None."""
    info = _read_info(path)
    if info is None:
        return None
    return info if quick_request(info, "ping", timeout) is not None else None


# ---------------------------------------------------------------- start


def start(*, backend: str = "auto", connection_file: str | os.PathLike | None = None,
          log_file: str | os.PathLike | None = None, log_level: str = "INFO", threads: int = 1,
          device_memory: str = WORKER_DEFAULTS["device_memory"], bind: str = WORKER_DEFAULTS["bind"], port: int = 0,
          pool_dirs: Sequence[str | os.PathLike] = (), python: str | None = None, use_wsl: bool = False,
          distro: str | None = None, startup_timeout: float | None = None, measure: bool | None = None,
          wsl_exe: str | None = None, windows: bool | None = None, gpus: str | None = None) -> dict[str, Any]:
    """Start a background worker, wait until it is ready, and return what ``status`` returns.

    ``gpus``: the GPUs it drives (the worker setting ``gpus``: "all", "0,1"; None: the first).

    ``use_wsl``: run it inside WSL2 (``distro``, ``python``: the Python there).
    ``measure``: after start, measure the transport candidates (default: with WSL).
    ``windows``, ``wsl_exe``: the platform and the ``wsl.exe`` to use (tests simulate them).
    """
    config = get_config()
    windows = sys.platform == "win32" if windows is None else windows
    connection_file = resolve_connection_file(connection_file)
    log_file = Path(log_file) if log_file else default_log_file(connection_file)
    startup_timeout = float(startup_timeout or config["startup_timeout"])
    if log_level not in LOG_LEVELS:
        raise ValueError(f"log_level must be one of {LOG_LEVELS}")
    if connection_file.parent == default_connection_file().parent:  # ours: for this user alone
        make_private_folder(connection_file.parent, windows=windows)
    else:  # the user's choice of folder, and of who may read it; refused at once where others may replace files
        prepare_folder(connection_file.parent)
    planted = state_path(connection_file)
    if os.path.lexists(planted) and not _ours(planted):
        raise ServiceError(f"{planted} beside the connection file is another user's (or a link): it is never read; "
                           f"remove it, or choose a folder of your own for --connection-file")
    try:
        with ExclusiveLock(start_lock_path(connection_file), startup_timeout, "another start"):
            if _answering(connection_file) is not None:
                result = status(connection_file=connection_file)
                result["already_running"] = True
                return result
            _clear_stale(connection_file)
            started = time.monotonic()
            _launch(connection_file, config, backend=backend, log_file=log_file, log_level=log_level,
                    threads=threads, device_memory=device_memory, bind=bind, port=port, pool_dirs=pool_dirs,
                    python=python, use_wsl=use_wsl, distro=distro, startup_timeout=startup_timeout,
                    wsl_exe=wsl_exe, windows=windows, gpus=gpus)
    except TimeoutError as exc:
        raise ServiceError(str(exc)) from None
    ready_seconds = time.monotonic() - started
    if use_wsl if measure is None else measure:
        info = read_connection_file(connection_file)
        with waiting("measuring the transport paths"):
            results = measure_transports(info, connection_file, candidates_for(connection_file), quick=True)
        record(connection_file, results, choose(results))
    result = status(connection_file=connection_file)
    result["ready_seconds"] = ready_seconds
    return result


def _launch(connection_file, config, *, backend, log_file, log_level, threads, device_memory, bind, port,
            pool_dirs, python, use_wsl, distro, startup_timeout, wsl_exe, windows, gpus=None):
    """Start the worker (here or inside WSL2), keep what is known of it, and wait until it is ready."""
    if use_wsl:
        distro = distro or config["wsl_distro"]
        python = python or config["wsl_python"]
        argv, state = _wsl_launch(connection_file, backend=backend, log_level=log_level, threads=threads,
                                  device_memory=device_memory, bind=bind, port=port, pool_dirs=pool_dirs,
                                  python=python, distro=distro, wsl_exe=wsl_exe or find_wsl_exe(), windows=windows,
                                  gpus=gpus)
    else:
        argv = worker_argv(None if python in (None, sys.executable) else python, connection_file=connection_file,
                           backend=backend, log_level=log_level, threads=threads, device_memory=device_memory,
                           bind=bind, port=port, pool_dirs=pool_dirs, gpus=gpus)
        state = {"wsl": None, "pool_candidates": [
            {"name": "pool-dir", "client": str(d), "worker": str(d)} for d in pool_dirs]}
    process = spawn(argv, log_file, cwd=connection_file.parent, detached=True, windows=windows,
                    creationflags=wsl.DETACHED_FLAGS)
    state.update(pid=process.pid, log_file=str(log_file), log_level=log_level, backend_requested=backend,
                 argv=list(map(str, argv)), started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 version=__version__)
    write_state(connection_file, state)
    where = "inside WSL" if use_wsl else "in the background"
    with waiting(f"starting the worker {where} (log: {log_file})"):
        try:
            wait_ready(process, connection_file, startup_timeout, log_file=log_file,
                       accept=(lambda info: True) if use_wsl else None)
        except WorkerUnavailable as exc:
            raise ServiceError(str(exc)) from None


def _clear_stale(connection_file):
    """Remove a connection file that no live worker answers for (refuse if its process still lives)."""
    info = _read_info(connection_file)
    if info is None:
        Path(connection_file).unlink(missing_ok=True)
        return
    state = read_state(connection_file)
    if not state.get("wsl") and state.get("pid") == info.pid and info.pid != os.getpid() and not exited(info.pid):
        raise ServiceError(
            f"a worker (pid {info.pid}) holds {connection_file} but does not answer; "
            f"stop it with:  sklearn-gpu-bridge stop --connection-file {connection_file}"
        )
    Path(connection_file).unlink(missing_ok=True)


# ---------------------------------------------------------------- start inside WSL2


def find_wsl_exe():
    """``wsl.exe`` on the PATH, else in System32."""
    import shutil

    found = shutil.which("wsl.exe") or shutil.which("wsl")
    if found:
        return found
    return str(Path(os.environ.get("SystemRoot", r"C:\Windows")) / "System32" / "wsl.exe")


def run_probe(*, python, use_wsl, distro=None, wsl_exe=None, params=None, timeout=PROBE_TIMEOUT):
    """Run ``probe_script.py`` with the worker's Python (inside WSL, or here); its JSON, or raise ServiceError."""
    source = wsl.probe_source((Path(__file__).with_name("probe_script.py")).read_text(), params or {})
    argv = wsl.python_code_argv(python, source)
    if use_wsl:
        argv = wsl.wsl_command(argv, distro=distro, wsl_exe=wsl_exe or find_wsl_exe())
    try:
        # never in the caller's folder, where a checkout's sklearn_gpu_bridge/ would shadow the installed one
        code, out, err = wsl.run(argv, timeout, cwd=None if use_wsl else tempfile.gettempdir())
    except FileNotFoundError as exc:
        raise ServiceError(f"cannot run {argv[0]}: {exc}") from None
    except subprocess.TimeoutExpired:
        raise ServiceError(f"{argv[0]} did not answer within {timeout:.0f} s") from None
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        where = f"WSL ({distro or 'default distribution'})" if use_wsl else "here"
        raise ServiceError(f"the worker's Python {python!r} {where} could not run: {(err or out).strip()[-2000:]}")
    return json.loads(lines[-1])


def _wsl_launch(connection_file, *, backend, log_level, threads, device_memory, bind, port, pool_dirs, python,
                distro, wsl_exe, windows, gpus=None):
    """(wsl.exe command line, state) for a worker in WSL2 writing its file where this side reads it."""
    folder = Path(connection_file).parent
    shared_pool = folder / "pool"  # on the Windows disk: /mnt/<drive>/... inside WSL
    make_folders(shared_pool)
    linux_pool = "~/.cache/sklearn-gpu-bridge/pool"  # on the WSL disk: \\wsl.localhost\<distro>\... here
    probe = run_probe(python=python, use_wsl=True, distro=distro, wsl_exe=wsl_exe,
                      params={"wslpath": [str(folder), str(shared_pool)], "mkdirs": [linux_pool]})
    if "sklearn_gpu_bridge" in probe["errors"]:
        raise ServiceError(
            f"sklearn-gpu-bridge is not installed for {python} in WSL "
            f"({probe['errors']['sklearn_gpu_bridge']}); install it with:\n  "
            + install_command(python, distro=distro, use_wsl=True)
        )

    def inside(path):
        return probe["wslpath"].get(str(path)) or wsl.windows_to_wsl(path)

    home_pool = linux_pool.replace("~", probe["home"], 1)
    candidates = [{"name": "windows-disk", "client": str(shared_pool), "worker": inside(shared_pool)}]
    distro_name = distro or probe.get("distro")
    if windows and distro_name:
        candidates.append({"name": "wsl-disk", "client": wsl.wsl_to_windows(home_pool, distro_name),
                           "worker": home_pool})
    worker_pool_dirs = ["/dev/shm", "/tmp", *(c["worker"] for c in candidates), *pool_dirs]
    bind = "127.0.0.1" if bind == "ipc" else bind  # Windows reaches WSL2 through its localhost forwarding
    argv = wsl.wsl_command(
        worker_argv(probe.get("executable") or python,  # the probe's: an absolute path
                    connection_file=inside(folder) + "/" + Path(connection_file).name, safe_path=False,
                    backend=backend, log_level=log_level, threads=threads, device_memory=device_memory,
                    bind=bind, port=port, gpus=gpus,
                    pool_dirs=list(dict.fromkeys(worker_pool_dirs))),
        distro=distro, wsl_exe=wsl_exe,
    )
    state = {"wsl": {"distro": distro_name, "python": python, "wsl_exe": str(wsl_exe),
                     "worker_python": probe.get("executable"), "versions": probe.get("versions")},
             "pool_candidates": candidates}
    return argv, state


def install_command(python, *, distro=None, use_wsl=False, cuml=True):
    """The command that installs this version of the package for the worker's Python.

    ``cuml``: with the ``worker-cu12`` extra (cuML for CUDA 12), which is only of use
    where an NVIDIA GPU is; without it, the package alone (the scikit-learn backend).
    """
    extra = "[worker-cu12]" if cuml else ""
    pip = f'{python} -m pip install "sklearn-gpu-bridge{extra}=={__version__}"'
    if use_wsl:
        return f"wsl{' -d ' + distro if distro else ''} -- {pip}"
    return pip


# ---------------------------------------------------------------- stop


def stop(*, connection_file: str | os.PathLike | None = None, timeout: float = STOP_TIMEOUT) -> dict[str, Any]:
    """Stop the worker at ``connection_file``: shutdown request, then signals. Returns what was done.

    Once it is gone, the files ``start`` made for it go too (connection file,
    state file with its transport measurements, a socket a killed worker left,
    an empty pool folder); its log stays, for a look at what happened, and the
    result names it (``log_file``). A worker that will not stop keeps its files,
    so that ``stop`` can be run again.
    """
    connection_file = resolve_connection_file(connection_file)
    state = read_state(connection_file)
    info = _read_info(connection_file)
    result = {"connection_file": str(connection_file), "stopped": False, "how": None,
              "pid": info.pid if info else state.get("pid"), "log_file": _log_file(connection_file, state),
              "removed": []}
    if info is None and (not state.get("pid") or state.get("stopped_at")):
        result["how"] = "no worker: nothing to stop"
        result["removed"] = _remove_files(connection_file, state, None, connection=False)  # a stale state file
        return result
    asked = info is not None and quick_request(info, "shutdown", timeout=min(3.0, timeout or 3.0)) is not None
    with waiting("stopping the worker"):
        if asked and _wait_gone(connection_file, state, info, timeout):
            result.update(stopped=True, how="shutdown request")
        else:
            result.update(stopped=_signal_stop(connection_file, state, info, min(5.0, timeout or 5.0)),
                          how="signals")
    if result["stopped"]:
        result["removed"] = _remove_files(connection_file, state, info)
    return result


def _log_file(connection_file, state):
    """The worker's log: as the state file says, else the default log file if there is one."""
    if state.get("log_file"):
        return state["log_file"]
    log_file = default_log_file(connection_file)
    return str(log_file) if log_file.exists() else None


def _remove_files(connection_file, state, info, connection=True):
    """Remove what ``start`` left for a worker that is gone, but its log; the paths removed.

    ``connection``: the connection file too (not when it could not be read:
    it may be no worker's file at all).
    """
    paths = [state_path(connection_file)]
    if connection:
        paths.append(Path(connection_file))
    if info is not None and info.address.startswith("ipc://") and os.name == "posix":
        sock = Path(info.address[len("ipc://"):])  # a clean stop removes it and its doorbell (a datagram
        for path in (sock, doorbell_path(sock)):  # socket beside it); a killed worker leaves them
            try:
                if stat.S_ISSOCK(path.lstat().st_mode) and path.lstat().st_uid == os.getuid():
                    paths.append(path)
            except OSError:
                pass
    removed = []
    for path in paths:
        if not _ours(path):  # another user's file beside ours (a shared folder): not ours to remove
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(str(path))
    if state.get("wsl"):  # the pool folder `start --wsl` made, once no client's pool file is left in it
        try:
            (Path(connection_file).parent / "pool").rmdir()
            removed.append(str(Path(connection_file).parent / "pool"))
        except OSError:
            pass
    return removed


def _ours(path):
    """Whether ``path`` is a file of this user (not a link); True where modes do not say (Windows)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return os.name != "posix" or (info.st_uid == os.getuid() and not stat.S_ISLNK(info.st_mode))


def _local_pid(state, info):
    """The pid to watch on this machine: the worker's own, or (WSL) that of its wsl.exe."""
    if state.get("wsl"):
        return state.get("pid")
    return info.pid if info is not None else state.get("pid")


def _wait_gone(connection_file, state, info, timeout):
    pid = _local_pid(state, info)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(connection_file).exists() and (pid is None or exited(pid)):
            return True
        time.sleep(0.05)
    return False


def _signal_stop(connection_file, state, info, wait=5.0):
    """SIGTERM (the worker stops cleanly), SIGKILL ``wait`` s later; for WSL, kill inside, then end wsl.exe."""
    if state.get("wsl") and info is not None:
        w = state["wsl"]
        try:
            wsl.run(wsl.wsl_command(["kill", "-TERM", str(info.pid)], distro=w.get("distro"),
                                    wsl_exe=w.get("wsl_exe") or find_wsl_exe()), timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass
    pid = _local_pid(state, info)
    return pid is None or terminate(pid, wait)


# ---------------------------------------------------------------- status


def status(*, connection_file: str | os.PathLike | None = None) -> dict[str, Any]:
    """What the worker says about itself, and what this side knows (log file, transport in use)."""
    connection_file = resolve_connection_file(connection_file)
    state = read_state(connection_file)
    result = {"connection_file": str(connection_file), "running": False,
              "log_file": _log_file(connection_file, state), "wsl": state.get("wsl"),
              "default_file": connection_file == default_connection_file(),
              "start_local_worker": get_config()["start_local_worker"]}
    info = _read_info(connection_file)
    if info is None:
        result["problem"] = f"no connection file at {connection_file}"
        return result
    result.update(address=info.address, pid=info.pid, protocol_version=info.protocol_version,
                  encrypted=bool(info.curve_server_key))
    if quick_request(info, "ping", timeout=3.0) is None:
        listening = reachable(info.address)
        result["problem"] = (
            f"something listens at {info.address} but does not accept this file's key" if listening
            else f"no worker answers at {info.address} (the connection file is stale)"
        )
        return result
    result["running"] = True
    result.update(_client_view(info, connection_file))
    return result


def _client_view(info, connection_file):
    """Connect as a client with the settings in force: the worker's status, and the transport used."""
    config = get_config()
    pool, pool_directory, reason = client_transport(connection_file)
    out = {"transport_setting": config["transport"], "transport_reason": reason}
    conn = connect(info, connection_file=str(connection_file), pool=pool, pool_directory=pool_directory,
                   heartbeat_timeout=config["heartbeat_timeout"])
    try:
        reply = conn.status()
        out["transport"] = {"path": "pool", "pool_directory": conn.pool.directory, "kind": conn.pool.kind} \
            if conn.pool is not None else {"path": "frames", "pool_directory": None}
        out["fallback_reason"] = conn.capabilities.fallback_reason
    finally:
        conn.close()
    out.update(backend=reply.get("backend"), versions=reply.get("versions") or {}, uptime=reply.get("uptime"),
               idle_exit=reply.get("idle_exit"), handles=reply.get("handles"), requests=reply.get("requests") or {},
               refused=reply.get("refused") or {}, pools=reply.get("pools"), gpus=reply.get("gpus"))
    measured = current_record(connection_file)
    if measured:
        out["transport_measured"] = measured
    return out


# ---------------------------------------------------------------- text for people


def _duration(seconds):
    return format_seconds(seconds or 0)


def used_by(result: dict[str, Any]) -> str:
    """Which client processes use the worker at ``result["connection_file"]``.

    Said out loud because it is easy to miss: clients read the default
    connection file whenever they have no other setting, so a worker started
    there serves every Python process of this user, in any environment.
    """
    if result.get("default_file"):
        return (f"by default, every Python process of this user, in any environment "
                f"(default connection file {result['connection_file']})")
    return ("processes whose connection_file setting names this file "
            "(set_config(connection_file=...) or SKLEARN_GPU_BRIDGE_CONNECTION_FILE)")


def format_status(result: dict[str, Any]) -> str:
    """``status`` as aligned lines of text."""
    rows = []
    if not result.get("running"):
        rows.append(("worker", f"not running: {result.get('problem', '?')}"))
        wsl_hint = result.get("wsl") or sys.platform == "win32"
        rows.append(("start one", "sklearn-gpu-bridge start" + (" --wsl" if wsl_hint else "")))
        if result.get("default_file") and result.get("start_local_worker"):
            idle = get_config()["local_worker_idle"]
            rows.append(("meanwhile", "the first GPU* call of a script starts a local worker, "
                         + (f"kept warm for the next script until {_duration(idle)} without one" if idle > 0
                            else "which stops when that script exits")))
    else:
        rows.append(("worker", f"running, pid {result['pid']}, up {_duration(result.get('uptime'))}"
                     + (f"; stops after {_duration(result['idle_exit'])} without clients"
                        if result.get("idle_exit") else "")))
        rows.append(("address", f"{result['address']} (protocol {result['protocol_version']}"
                     + (", CurveZMQ encrypted)" if result.get("encrypted") else ")")))
        backend = result.get("backend") or "?"
        if result.get("fallback_reason"):
            backend += f" (fallback: {result['fallback_reason']})"
        rows.append(("backend", backend))
        versions = dict(result.get("versions") or {})
        gpu, memory = versions.pop("gpu", None), versions.pop("gpu_memory_total", None)
        rows.append(("versions", ", ".join(f"{k} {v}" for k, v in versions.items())))
        rows.append(("GPU", f"{gpu}, {memory / 2**30:.1f} GiB" if gpu and memory else gpu or "none reported"))
        rows.append(("handles", f"{result.get('handles', 0)} live"))
        gpus = result.get("gpus") or []
        if len(gpus) > 1 or (gpus and result.get("backend") == "cuml"):  # the CPU backend's one stand-in: no row

            def gib(n):
                return f"{n / 2**30:.1f} GiB"

            for gpu in gpus:
                text = (f"requests {gpu['requests']} (running {gpu['running']}, queued {gpu['queued']}, failed "
                        f"{gpu['failed']}), {gpu['handles']} handles; memory: "
                        + (f"admitted {gib(gpu['in_use'])} of {gib(gpu['budget'])} (peak {gib(gpu['peak_in_use'])})"
                           if gpu["budget"] is not None else "no budget")
                        + (f", in use {gib(gpu['memory_used'])}" if gpu["memory_used"] is not None else ""))
                if gpu.get("unusable"):
                    text += f"; UNUSABLE: {gpu['unusable']}"
                rows.append((f"GPU {gpu['index']}", text))
        requests = result.get("requests") or {}
        if requests:
            rows.append(("requests", ", ".join(f"{k} {v}" for k, v in sorted(requests.items()))))
        used = result.get("transport") or {}
        if used.get("path") != "pool":
            path = "frames (ZeroMQ messages)"
        elif used.get("kind") == "memfd":
            path = "pool in shared memory (sealed memfd)"
        else:
            path = f"pool in {used['pool_directory']}"
        rows.append(("transport", f"{path}  (setting {result.get('transport_setting')}: "
                     f"{result.get('transport_reason')})"))
        measured = result.get("transport_measured")
        if measured:
            parts = []
            for r in measured.get("results", ()):
                if r.get("mb_per_s"):
                    parts.append(f"{r['name']} {r['mb_per_s']:.0f} MB/s")
                else:
                    parts.append(f"{r['name']} unusable")
            rows.append(("measured", ", ".join(parts) + f" -> {measured.get('choice')}"))
        rows.append(("used by", used_by(result)))
    execution = get_config()["execution"]
    rows.append(("execution", {"auto": "auto: through this worker; inside a Dask worker with cuML, cuML in that "
                               "process (client.run(sklearn_gpu_bridge.execution_mode) shows each)",
                               "worker": "worker: always through a bridge worker",
                               "in_process": "in_process: cuML in each client process; no worker is used"}
                 .get(execution, execution)))
    rows.append(("connection", result.get("connection_file")))
    rows.append(("log file", result.get("log_file") or "- (not started by `sklearn-gpu-bridge start`)"))
    if result.get("wsl"):
        w = result["wsl"]
        rows.append(("WSL", f"distribution {w.get('distro') or '(default)'}, python {w.get('python')}"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
