"""What the worker's environment has: run by ``doctor`` and ``start`` with the worker's Python.

This file is sent as source (``python -c``, through ``wsl.exe`` on Windows),
so it must work where sklearn_gpu_bridge is NOT installed: standard library
only, and every failure reported in the output instead of raised. It prints
one JSON object on stdout.
"""

import importlib
import json
import os
import platform
import shutil
import subprocess
import sys

# import name -> distribution name: found and versioned without importing (seconds saved);
# cuML alone is imported for real, since an installed cuML can still fail to load (CUDA)
DISTRIBUTIONS = {"sklearn_gpu_bridge": "sklearn-gpu-bridge", "numpy": "numpy", "sklearn": "scikit-learn",
                 "zmq": "pyzmq"}


def _version(name):
    try:
        if name in DISTRIBUTIONS:
            from importlib import metadata, util

            if util.find_spec(name) is None:
                return None, f"ModuleNotFoundError: No module named '{name}'"
            try:
                return metadata.version(DISTRIBUTIONS[name]), None
            except metadata.PackageNotFoundError:
                return "?", None
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable"; reported, not raised
        return None, f"{type(exc).__name__}: {exc}"
    return getattr(module, "__version__", "?"), None


def _gpus():
    """(rows of name/memory/driver from nvidia-smi, error)."""
    smi = shutil.which("nvidia-smi") or ("/usr/lib/wsl/lib/nvidia-smi" if os.path.exists("/usr/lib/wsl/lib/nvidia-smi")
                                         else None)
    if smi is None:
        return [], "nvidia-smi not found"
    try:
        done = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], f"{type(exc).__name__}: {exc}"
    if done.returncode != 0:
        return [], (done.stderr or done.stdout).strip() or f"nvidia-smi exited with {done.returncode}"
    rows = []
    for line in done.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            rows.append({"name": parts[0], "memory": parts[1], "driver": parts[2]})
    return rows, None


def _wslpath(path):
    try:
        done = subprocess.run(["wslpath", "-u", path], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def main(params):
    out = {
        "python": platform.python_version(), "executable": sys.executable,
        "home": os.path.expanduser("~"), "distro": os.environ.get("WSL_DISTRO_NAME"),
        "platform": platform.platform(), "versions": {}, "errors": {},
    }
    names = ["sklearn_gpu_bridge", "numpy", "sklearn", "zmq"]
    if params.get("cuml"):
        names.append("cuml")
    for name in names:
        version, error = _version(name)
        if version is not None:
            out["versions"][name] = version
        else:
            out["errors"][name] = error
    if params.get("gpu"):
        out["gpus"], out["gpu_error"] = _gpus()
    out["wslpath"] = {p: _wslpath(p) for p in params.get("wslpath", [])}
    out["mkdirs"] = {}
    os.umask(0o077)  # makedirs gives its mode to the last folder only: the parents it makes are private too
    for path in params.get("mkdirs", []):
        path = os.path.expanduser(path)
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            out["mkdirs"][path] = None
        except OSError as exc:
            out["mkdirs"][path] = str(exc)
    print(json.dumps(out))


if __name__ == "__main__":
    # SGB_PARAMS: set by the line that ``wsl.probe_source`` puts before this source
    if "SGB_PARAMS" in globals():
        main(globals()["SGB_PARAMS"])
    else:
        main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {"cuml": True, "gpu": True})
