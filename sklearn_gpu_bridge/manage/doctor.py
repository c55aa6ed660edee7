"""``sklearn-gpu-bridge doctor``: every link from this process to the GPU, checked in turn.

WSL present, the distribution, the worker's Python, sklearn-gpu-bridge and
cuML importable there, the GPU visible, the connection file and its key, the
worker reachable, protocol versions; then round-trip latency and throughput
per transport path (frames, and each pool folder the worker can map), of
which the fastest that returns every byte unchanged is recorded for the
``transport="auto"`` setting. Each failed check carries the command that
fixes it.

A check's status is ``ok``, ``warn`` (works, but not as it should: no GPU,
a CPU backend), ``fail`` (the bridge cannot work until it is fixed) or
``skip`` (not applicable here, or after a failure it depends on).
"""

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..config import get_config
from ..errors import ConfigurationError
from ..protocol import PROTOCOL_VERSION
from ..runtime.connection_file import read_connection_file
from ..version import __version__
from . import service, wsl
from .measure import measure as measure_transports
from .state_file import read_state
from .transport_select import candidates_for, choose, record


@dataclass
class Check:
    """One check's outcome, and the command that fixes it where it failed."""

    name: str
    status: str  # ok | warn | fail | skip
    detail: str = ""
    fix: str | None = None


def _file_option(connection_file):
    """`` --connection-file PATH`` unless it is the default file (which the commands use anyway)."""
    if Path(connection_file) == Path(service.resolve_connection_file()):
        return ""
    return f" --connection-file {connection_file}"


def _start_command(use_wsl, distro, python, connection_file):
    parts = ["sklearn-gpu-bridge start" + _file_option(connection_file)]
    if use_wsl:
        parts.append("--wsl")
        if distro:
            parts.append(f"--distro {distro}")
        if python and python != "python3":
            parts.append(f"--python {python}")
    return " ".join(parts)


def run(*, connection_file: str | os.PathLike | None = None, use_wsl: bool | None = None, distro: str | None = None,
        python: str | None = None, measure: bool = True, quick: bool = False, windows: bool | None = None,
        wsl_exe: str | None = None, on_check: Callable[[Check], Any] | None = None) -> dict[str, Any]:
    """Run the checks; returns {"checks": [...], "transport": [...], "choice": ..., "ok": bool}.

    ``on_check`` is called with each :class:`Check` as soon as it is known (a person is waiting).
    """
    config = get_config()
    windows = sys.platform == "win32" if windows is None else windows
    connection_file = service.resolve_connection_file(connection_file)
    state = read_state(connection_file)
    if use_wsl is None:
        use_wsl = windows or bool(state.get("wsl"))
    wsl_state = state.get("wsl") or {}
    if use_wsl:
        distro = distro or wsl_state.get("distro") or config["wsl_distro"]
        python = python or wsl_state.get("python") or config["wsl_python"]
    else:
        python = python or (state.get("argv") or [None])[0] or sys.executable
    start_fix = _start_command(use_wsl, distro, python, connection_file)
    stop_command = f"sklearn-gpu-bridge stop{_file_option(connection_file)}"
    restart = f"{stop_command}, then: {start_fix}"
    checks = []

    def add(name, status, detail="", fix=None):
        check = Check(name, status, detail, fix)
        checks.append(check)
        if on_check is not None:
            on_check(check)
        return check

    # ---- the worker's environment
    environment_ok = True
    if use_wsl:
        wsl_exe = wsl_exe or service.find_wsl_exe()
        environment_ok = _check_wsl(add, wsl_exe, distro)
    else:
        add("WSL", "skip", "not used here (the worker runs on this machine)")
    probe = None
    if environment_ok:
        try:
            probe = service.run_probe(python=python, use_wsl=use_wsl, distro=distro, wsl_exe=wsl_exe,
                                      params={"cuml": True, "gpu": True})
        except service.ServiceError as exc:
            fix = (f"wsl{' -d ' + distro if distro else ''} -- sudo apt-get install -y python3 python3-venv"
                   "   (or pass --python /path/to/venv/bin/python)") if use_wsl else "pass --python /path/to/python"
            add("worker Python", "fail", str(exc), fix)
    if probe is not None:
        _check_environment(add, probe, python, distro, use_wsl)
    elif not environment_ok:
        add("worker Python", "skip", "needs WSL and the distribution")

    # ---- the worker itself
    info = _check_connection(add, connection_file, start_fix, restart)
    if info is not None:
        info = _check_worker(add, info, restart, python, distro, use_wsl,
                             cuml_restart=f"{stop_command}, then: {start_fix} --backend cuml")

    # ---- transport paths
    results, chosen = [], None
    if info is not None and measure:
        candidates = candidates_for(connection_file, config["pool_directory"])
        results = measure_transports(info, connection_file, candidates, quick=quick,
                                    on_result=lambda r: _report_transport(add, r))
        chosen = choose(results)
        if chosen is not None:
            record(connection_file, results, chosen)
            add("transport chosen", "ok",
                f"{_candidate_label(chosen)} (used when transport=auto; override: "
                f"set_config(transport='frames'|'pool') or SKLEARN_GPU_BRIDGE_TRANSPORT)")
        else:
            add("transport chosen", "fail", "no path carried arrays intact", start_fix)
    elif info is not None:
        add("transport", "skip", "not measured (--no-measure)")
    failed = [c for c in checks if c.status == "fail"]
    return {"checks": [asdict(c) for c in checks], "transport": results,
            "choice": chosen["name"] if chosen else None, "ok": not failed,
            "connection_file": str(connection_file)}


def _check_wsl(add, wsl_exe, distro):
    """WSL present and the distribution there, on WSL 2."""
    try:
        code, out, err = wsl.run([wsl_exe, "--status"], timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        add("WSL", "fail", f"cannot run {wsl_exe}: {exc}",
            "wsl --install   (PowerShell as administrator, then restart Windows)")
        return False
    if code != 0:
        add("WSL", "fail", (err or out).strip()[-500:],
            "wsl --install   (PowerShell as administrator, then restart Windows); then: wsl --update")
        return False
    add("WSL", "ok", wsl_exe)
    try:
        code, out, err = wsl.run([wsl_exe, "--list", "--verbose"], timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        code, out, err = 1, "", str(exc)
    rows = wsl.parse_list_verbose(out) if code == 0 else []
    if not rows:
        add("distribution", "fail", "no Linux distribution is installed", "wsl --install -d Ubuntu")
        return False
    row = next((r for r in rows if r["name"].lower() == distro.lower()), None) if distro else \
        next((r for r in rows if r["default"]), rows[0])
    if row is None:
        names = ", ".join(r["name"] for r in rows)
        add("distribution", "fail", f"{distro!r} is not installed (installed: {names})",
            f"wsl --install -d {distro}   (or pass --distro with one of: {names})")
        return False
    if row["version"] != 2:
        add("distribution", "fail", f"{row['name']} runs on WSL {row['version']}; the GPU needs WSL 2",
            f"wsl --set-version {row['name']} 2")
        return False
    add("distribution", "ok", f"{row['name']} (WSL 2, {row['state'].lower()}{', default' if row['default'] else ''})")
    return True


def _check_environment(add, probe, python, distro, use_wsl):
    where = f"WSL {probe.get('distro') or distro or ''}".strip() if use_wsl else "here"
    add("worker Python", "ok", f"{python} -> {probe['executable']} (Python {probe['python']}, {where})")
    versions, errors = probe.get("versions", {}), probe.get("errors", {})
    gpus = probe.get("gpus") or []
    install = service.install_command(python, distro=distro, use_wsl=use_wsl, cuml=bool(gpus))
    if "sklearn_gpu_bridge" in errors:
        add("sklearn-gpu-bridge (worker)", "fail", errors["sklearn_gpu_bridge"], install)
    elif versions.get("sklearn_gpu_bridge") != __version__:
        add("sklearn-gpu-bridge (worker)", "warn",
            f"{versions.get('sklearn_gpu_bridge')} there, {__version__} here: install the same version", install)
    else:
        add("sklearn-gpu-bridge (worker)", "ok", versions["sklearn_gpu_bridge"])
    if "cuml" in errors:
        add("cuML", "warn", f"not importable ({errors['cuml']}): the worker would run scikit-learn on the CPU",
            (service.install_command(python, distro=distro, use_wsl=use_wsl) + "   (for CUDA 13: [worker-cu13])")
            if gpus else "needs an NVIDIA GPU first (below); without one the worker runs scikit-learn")
    else:
        add("cuML", "ok", versions.get("cuml", "?"))
    if gpus:
        add("GPU", "ok", "; ".join(f"{g['name']} ({g['memory']}, driver {g['driver']})" for g in gpus))
    else:
        fix = ("update the NVIDIA driver on Windows (WSL 2 uses it; install no Linux driver inside WSL), "
               "then: wsl --shutdown" if use_wsl else "install the NVIDIA driver, then check with: nvidia-smi")
        add("GPU", "warn", probe.get("gpu_error") or "no GPU visible", fix)


def _check_connection(add, connection_file, start_fix, restart):
    """The connection file: there, readable, owner-only; its info or None."""
    path = Path(connection_file)
    if not path.exists():
        if path == service.default_connection_file() and get_config()["start_local_worker"]:
            # Not a fault: with no background worker each process starts a local worker of its own.
            add("connection file", "ok", f"none at {path}: no background worker, so each Python process "
                "starts a local worker of its own on its first GPU* call", f"for one shared worker: {start_fix}")
        else:
            add("connection file", "fail", f"{path} does not exist (no worker started)", start_fix)
        return None
    try:
        info = read_connection_file(path)
        info.key_bytes  # noqa: B018 - the key must decode
    except ConfigurationError as exc:  # another user's, readable by others, not a worker's, a bad key
        add("connection file", "fail", str(exc), exc.fix or restart)
        return None
    except OSError as exc:
        add("connection file", "fail", f"{path} cannot be read: {exc}", restart)
        return None
    add("connection file", "ok", f"{path} (this user's alone; key readable)")
    return info


def _check_worker(add, info, restart, python, distro, use_wsl, cuml_restart):
    if not service.reachable(info.address):
        add("worker reachable", "fail", f"nothing listens at {info.address} (the connection file is stale)", restart)
        return None
    add("worker reachable", "ok", info.address)
    reply = service.quick_request(info, "ping", timeout=3.0)
    if reply is None:
        add("key accepted", "fail", f"the worker at {info.address} ignores this file's key "
            "(the file belongs to another worker run)", restart)
        return None
    add("key accepted", "ok", "signed ping answered")
    if info.protocol_version != PROTOCOL_VERSION:
        add("protocol", "fail", f"the worker speaks protocol {info.protocol_version}, this client {PROTOCOL_VERSION}",
            service.install_command(python, distro=distro, use_wsl=use_wsl))
        return None
    reply = service.quick_request(info, "status", timeout=5.0) or {}
    versions = reply.get("versions") or {}
    theirs = versions.get("sklearn-gpu-bridge")
    if theirs and theirs != __version__:
        add("protocol", "warn", f"protocol {PROTOCOL_VERSION} on both sides; sklearn-gpu-bridge {theirs} there, "
            f"{__version__} here", service.install_command(python, distro=distro, use_wsl=use_wsl))
    else:
        add("protocol", "ok", f"protocol {PROTOCOL_VERSION}, sklearn-gpu-bridge {theirs or '?'} on both sides")
    backend = reply.get("backend")
    gpu = versions.get("gpu")
    if backend == "cuml":
        add("backend", "ok", f"cuml {versions.get('cuml', '?')}" + (f" on {gpu}" if gpu else ""))
    else:
        add("backend", "warn", f"{backend}: the worker runs scikit-learn on the CPU",
            f"{service.install_command(python, distro=distro, use_wsl=use_wsl)}; then: {cuml_restart}")
    return info


def _candidate_label(result):
    if result["name"] == "frames":
        return "frames (ZeroMQ messages)"
    if result["pool_directory"] is None:
        return f"pool {result['name']} (shared memory)"
    return f"pool {result['name']} ({result['pool_directory']})"


def _report_transport(add, result):
    label = "transport " + _candidate_label(result)
    if not result.get("available"):
        add(label, "skip", result.get("why", "not available"))
    elif not result.get("coherent"):
        add(label, "warn", f"{result.get('why', 'data changed')}: never used")
    elif "mb_per_s" not in result:
        add(label, "warn", result.get("why", "not measured"))
    else:
        add(label, "ok", f"round trip 1 MB {result['latency_ms']:.2f} ms, "
            f"{result['mb']:.0f} MB there and back {result['mb_per_s']:.0f} MB/s (path: {result.get('path')})")


SYMBOLS = {"ok": "ok  ", "warn": "warn", "fail": "FAIL", "skip": "-   "}


def format_check(check: Check) -> str:
    """One line (and a ``fix:`` line) for a check."""
    line = f"[{SYMBOLS[check.status]}] {check.name}: {check.detail}"
    if check.fix and check.status in ("fail", "warn"):
        line += f"\n       fix: {check.fix}"
    return line


def summary(result: dict[str, Any]) -> str:
    """The last line of ``doctor``: failures and warnings counted ("all checks passed, 2 warnings")."""
    counts = {status: sum(c["status"] == status for c in result["checks"]) for status in ("fail", "warn")}
    head = (f"{counts['fail']} check{'s' if counts['fail'] != 1 else ''} failed" if counts["fail"]
            else "all checks passed")
    if counts["warn"]:
        head += f", {counts['warn']} warning{'s' if counts['warn'] != 1 else ''}"
    return head
