"""The words of ``sklearn-gpu-bridge``, as a user running the commands reads them (real processes)."""

import os
import re
import subprocess
import sys

import click
import pytest

from sklearn_gpu_bridge.cli import main
from sklearn_gpu_bridge.config import ENV_PREFIX, WORKER_ENV_PREFIX

from .conftest import BACKEND


def cli(*args, cwd, env=None, timeout=120):
    """``sklearn-gpu-bridge ARGS`` in a terminal 80 columns wide."""
    return subprocess.run([sys.executable, "-m", "sklearn_gpu_bridge", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**os.environ, "COLUMNS": "80", **(env or {})})


# ---------------------------------------------------------------- keys


def test_a_clients_keys_say_that_the_public_half_goes_to_curve_allow_and_the_secret_stays(tmp_path):
    run = cli("keys", str(tmp_path / "keys"), "--name", "laptop", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    secret, public = tmp_path / "keys" / "laptop.key_secret", tmp_path / "keys" / "laptop.key"
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"secret key: {secret} ") and lines[1].startswith(f"public key: {public} ")
    assert "--curve-allow" in lines[1]  # the worker lets the client in by its public key
    assert "curve_secret_key" in lines[0] and f"{ENV_PREFIX}CURVE_SECRET_KEY={secret}" in lines[0]
    assert "worker --curve-secret-key" not in run.stdout  # that is the worker's own secret, not a client's


def test_the_workers_keys_say_to_give_the_secret_to_the_worker(tmp_path):
    run = cli("keys", str(tmp_path / "keys"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    secret = tmp_path / "keys" / "worker.key_secret"
    assert f"sklearn-gpu-bridge worker --curve-secret-key {secret}" in run.stdout
    assert "--curve-allow" not in run.stdout


# ---------------------------------------------------------------- every option's environment variable


@pytest.mark.parametrize("command", [["-m", "sklearn_gpu_bridge", "worker"], ["-m", "sklearn_gpu_bridge.worker"]],
                         ids=["sklearn-gpu-bridge worker", "python -m sklearn_gpu_bridge.worker"])
def test_worker_help_names_the_environment_variable_of_each_option(tmp_path, command):
    run = subprocess.run([sys.executable, *command, "--help"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert run.returncode == 0, run.stderr
    text = " ".join(run.stdout.split())  # as read: lines wrapped at 80 columns
    options = [p for p in main.commands["worker"].params if isinstance(p, click.Option) and not p.hidden]
    assert len(options) >= 15
    for option in options:
        variable = f"{WORKER_ENV_PREFIX}_{option.name.upper()}"
        assert re.search(rf"\[env var: {variable}[;\]]", text), f"{option.opts[0]}: no {variable} in\n{run.stdout}"


def test_every_commands_help_names_its_options_environment_variables(tmp_path):
    run = cli("start", "--help", cwd=tmp_path)
    assert "[env var: SKLEARN_GPU_BRIDGE_START_BACKEND;" in " ".join(run.stdout.split())
    run = cli("alias", "install", "--help", cwd=tmp_path)
    assert run.returncode == 0 and "env var" not in run.stdout  # it takes no option


def test_an_option_read_from_its_environment_variable_is_the_one_help_names(tmp_path):
    env = {f"{WORKER_ENV_PREFIX}_BIND": "0.0.0.0"}  # beyond loopback without keys: refused before anything starts
    run = cli("worker", "--connection-file", str(tmp_path / "w.json"), cwd=tmp_path, env=env)
    assert run.returncode == 1 and "0.0.0.0" in run.stderr, run.stderr
    assert not (tmp_path / "w.json").exists()


# ---------------------------------------------------------------- doctor


def test_doctor_counts_its_warnings_in_its_last_line(tmp_path, worker):
    run = cli("doctor", "--no-measure", "--connection-file", str(worker.connection_file), cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    warnings = sum(line.startswith("[warn]") for line in lines)
    if BACKEND == "sklearn":
        assert warnings >= 1  # at least the CPU backend's
    expected = "all checks passed" + (f", {warnings} warning{'s' if warnings != 1 else ''}" if warnings else "")
    assert lines[-1] == expected, run.stdout
