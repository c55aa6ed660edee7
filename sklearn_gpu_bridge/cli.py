"""The ``sklearn-gpu-bridge`` command line (only the CLI; the work lives elsewhere).

Every option can also come from an environment variable
``SKLEARN_GPU_BRIDGE_<COMMAND>_<OPTION>`` (click's ``auto_envvar_prefix``), which ``--help`` names;
the worker's options are read from ``SKLEARN_GPU_BRIDGE_WORKER_<OPTION>``
however it is started. Defaults come from :mod:`.config`.
"""

import logging
import sys
from collections.abc import Callable
from typing import Any

import click

from .config import DEVICE_MEMORY_KINDS, ENV_PREFIX, WORKER_DEFAULTS
from .runtime.connection_file import default_connection_file

ENVVAR_PREFIX = ENV_PREFIX.rstrip("_")
LOG_LEVELS = click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"])
BACKENDS = click.Choice(["auto", "cuml", "sklearn"])


class _EnvCommand(click.Command):
    """A command whose ``--help`` names each option's environment variable (``auto_envvar_prefix``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, click.Option):
                param.show_envvar = True


class _Group(click.Group):
    """The command group: its commands are ``_EnvCommand``."""

    command_class = _EnvCommand
    group_class = type  # subgroups (alias, autostart) are _Group too, and so their commands _EnvCommand


@click.group(cls=_Group, context_settings={"auto_envvar_prefix": ENVVAR_PREFIX, "show_default": True,
                                           "max_content_width": 120})
@click.version_option(package_name="sklearn-gpu-bridge")
def main() -> None:
    """scikit-learn estimators that run on cuML in a worker process."""


W = WORKER_DEFAULTS
_device_memory_option = click.option(
    "--device-memory", default=W["device_memory"], type=click.Choice(DEVICE_MEMORY_KINDS),
    help="How a cuML worker allocates device memory: async-cupy (CUDA's stream-ordered pool, as dask-cuda's "
         "--rmm-async, and CuPy's arrays from CuPy's own stream-ordered allocator), async (the same pool, CuPy's "
         "arrays through RMM) or cuda (cudaMalloc and cudaFree per array, cuML's default).")


@main.command(short_help="Run a worker in this process, in the foreground.")
@click.option("--bind", default=W["bind"],
              help="Where to listen: ipc (a socket in this user's private folder, for clients on this host), "
                   "a loopback address for TCP (WSL2 to Windows: PLAIN, its password derived from the key), or any "
                   "other address (needs --curve-secret-key: CurveZMQ encryption and an allow-list of clients).")
@click.option("--port", default=W["port"], type=click.IntRange(0, 65535), help="TCP port; 0 picks a free one.")
@click.option("--backend", default=W["backend"], type=BACKENDS,
              help="auto: cuML when importable, otherwise scikit-learn on CPU.")
@_device_memory_option
@click.option("--connection-file", type=click.Path(dir_okay=False), default=str(default_connection_file()),
              help="Where to write address and key (mode 0600) once ready.")
@click.option("--threads", default=W["threads"], type=click.IntRange(0),
              help="Estimator calls run at once on each GPU; 0: 4 on one GPU, 8 on each of several.")
@click.option("--gpus", default=W["gpus"],
              help="GPUs to drive: all, or indices such as 0,1 (each runs --threads calls at once; a fit goes to the "
                   "least busy one it fits on, a model's calls to its own). Default: the first GPU.")
@click.option("--gpu-processes/--no-gpu-processes", default=W["gpu_processes"],
              help="With several GPUs: a worker process for each, behind this one's address (default: the GPUs "
                   "never wait on one another's Python), or all of them in this process.")
@click.option("--parent-pid", type=int, default=None, hidden=True,
              help="Stop when this process dies (used by the local worker).")
@click.option("--front", default=None, hidden=True,
              help="RUN_ID:GPU: serve that GPU behind the worker of that run (it starts this process).")
@click.option("--pool-dir", "pool_dirs", multiple=True, type=click.Path(file_okay=False),
              help="Folder where clients' shared-memory pools may be found (repeatable). "
                   "Default: /dev/shm and the temp folder.")
@click.option("--curve-secret-key", type=click.Path(dir_okay=False), default=W["curve_secret_key"],
              help="CurveZMQ secret key file (owner-only) made by `sklearn-gpu-bridge keys`: encrypts "
                   "all traffic. Required to bind anything but loopback.")
@click.option("--curve-allow", type=click.Path(file_okay=False), default=W["curve_allow"],
              help="Folder of client public keys (`sklearn-gpu-bridge keys DIR --name NAME`) let in besides the "
                   "one derived from the signing key (with --curve-secret-key).")
@click.option("--key-file", type=click.Path(dir_okay=False), default=W["key_file"],
              help="File (owner-only) holding the signing key in hex (at least 128 bits). "
                   "Default: a fresh random key.")
@click.option("--client-timeout", default=W["client_timeout"], type=click.FloatRange(0),
              help="Seconds of silence after which a client whose process cannot be watched (another "
                   "host, Windows) is freed; it pings every quarter of it while idle. 0: never.")
@click.option("--max-queued", default=W["max_queued"], type=click.IntRange(1),
              help="Requests one client may have waiting; more are refused at once.")
@click.option("--max-frame-mb", default=W["max_frame_mb"], type=click.FloatRange(1),
              help="MiB in one frame of a message (a longer frame closes the connection; clients split "
                   "longer arrays); on TCP at most 1.")
@click.option("--array-cache-mb", default=W["array_cache_mb"], type=click.FloatRange(0),
              help="MiB of arrays kept for clients (all together), so that an array a client sends again "
                   "(GridSearchCV's folds) does not travel again. 0: keep none.")
@click.option("--watch-ms", default=W["watch_ms"], type=click.FloatRange(0),
              help="Milliseconds a worker thread keeps watching for the next request of a client on this host "
                   "that spins for its replies (one core busy meanwhile, only while the worker has nothing else "
                   "to do); then it sleeps, and the client rings to wake it. 0: sleep at once.")
@click.option("--idle-exit", default=W["idle_exit"], type=click.FloatRange(0),
              help="Seconds without any client after which the worker stops by itself (a local worker kept warm "
                   "between scripts); with a connection file, it takes the start lock beside it first. 0: never.")
@click.option("--log-level", default=W["log_level"], type=LOG_LEVELS)
def worker(backend: str, device_memory: str, connection_file: str, parent_pid: int | None, log_level: str,
           gpu_processes: bool, front: str | None, **settings: Any) -> None:
    """Run a worker in this process until SIGINT, SIGTERM or a shutdown request."""
    import zmq

    from .errors import ConfigurationError, WorkerUnavailable
    from .worker import Worker, check_settings, make_backend
    from .worker.front import Front, processes_for

    gpu = f"[GPU {front.rpartition(':')[2]}]" if front else ""  # a process behind a front shares its log
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(name)s{gpu} %(levelname)s %(message)s")
    accel = sys.modules.get("sklearn_gpu_bridge.accel")  # a sitecustomize of accel's may have installed it here
    if accel is not None and accel.is_installed():
        accel.uninstall()  # a worker's scikit-learn must be scikit-learn itself, not served by a worker
    try:
        # settings are checked before the backend warms up: a refusal comes at once
        check_settings(bind=settings["bind"], key_file=settings["key_file"],
                       curve_secret_key=settings["curve_secret_key"], curve_allow=settings["curve_allow"],
                       watch_ms=settings["watch_ms"], threads=settings["threads"])
        gpus = processes_for(settings["gpus"], backend) if gpu_processes and front is None else None
        if gpus is not None:
            del settings["gpus"]
            server = Front(gpus, connection_file=connection_file, parent_pid=parent_pid, backend=backend,
                           device_memory=device_memory, log_level=log_level, **settings)
        else:
            chosen, reason = make_backend(backend, device_memory=device_memory)
            if reason:
                logging.getLogger("sklearn_gpu_bridge.worker").warning("falling back to scikit-learn: %s", reason)
            server = Worker(chosen, connection_file=connection_file, parent_pid=parent_pid, fallback_reason=reason,
                            front=front, **settings)
        server.start()
    except (ConfigurationError, OSError, WorkerUnavailable, zmq.ZMQError) as exc:  # e.g. a port in use
        raise click.ClickException(str(exc)) from None
    server.serve_forever()


@main.command(short_help="Make a CurveZMQ keypair for a worker beyond loopback, or for a client.")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--name", default="worker", show_default=True,
              help="File names: NAME.key and NAME.key_secret; `worker` for the worker's own pair, another name "
                   "for a client's.")
@click.option("--force", is_flag=True, help="Replace key files that exist.")
def keys(directory: str, name: str, force: bool) -> None:
    """Make a CurveZMQ keypair for a worker that binds beyond loopback (or, with --name, for a client).

    Writes DIRECTORY/NAME.key_secret (owner-only) and DIRECTORY/NAME.key (the public key).
    A worker's: pass the secret to `worker --curve-secret-key`; the worker puts its public key in its
    connection file. A client's: copy NAME.key into the folder the worker's `--curve-allow` names, and
    keep the secret on the client, named by its `curve_secret_key` setting.
    """
    from .runtime.keys import make_pair

    try:
        public, secret = make_pair(directory, name, force=force)
    except FileExistsError as exc:
        raise click.ClickException(f"{exc.filename} exists; pass --force to replace it") from None
    if name == "worker":
        click.echo(f"secret key: {secret}  (mode 0600; give it to: sklearn-gpu-bridge worker --curve-secret-key "
                   f"{secret})")
        click.echo(f"public key: {public}  (the worker also puts it in its connection file)")
    else:  # a client's pair: the worker needs only its public half
        click.echo(f"secret key: {secret}  (mode 0600; keep it on the client, as its curve_secret_key setting: "
                   f"{ENV_PREFIX}CURVE_SECRET_KEY={secret})")
        click.echo(f"public key: {public}  (copy it into the folder the worker's --curve-allow names)")


@main.command(short_help="Pipeline + GridSearchCV on scikit-learn's digits, timed.")
@click.option("--repeats", default=3, type=click.IntRange(1), help="Timed repeats per step.")
def demo(repeats: int) -> None:
    """Pipeline + GridSearchCV on scikit-learn's digits, through the bridge and in process, timed.

    With no worker configured it starts a local worker of its own (cuML where it can be imported,
    otherwise scikit-learn on the CPU), as any Python program does.
    """
    from .demo import run_demo

    run_demo(repeats=repeats)


# ---------------------------------------------------------------- a worker in the background
# start / stop / status / doctor / autostart: the work is in manage/ (service.py, doctor.py, wsl.py);
# settings shared with the client (connection file, transport, WSL distro and Python) default
# to sklearn_gpu_bridge.get_config(), so set_config and SKLEARN_GPU_BRIDGE_<SETTING> reach them.

_CONNECTION_FILE_HELP = ("Connection file of the worker. Default: the setting connection_file "
                         "(SKLEARN_GPU_BRIDGE_CONNECTION_FILE), else the default file that clients read.")


def _connection_file_option(function: Callable) -> Callable:
    return click.option("--connection-file", type=click.Path(dir_okay=False), default=None,
                        help=_CONNECTION_FILE_HELP)(function)


def _wsl_options(function: Callable) -> Callable:
    function = click.option("--python", default=None,
                            help="The worker's Python (inside WSL with --wsl). Default: this Python here; "
                                 "with --wsl the setting wsl_python (python3).")(function)
    function = click.option("--distro", default=None,
                            help="WSL distribution (with --wsl). Default: the setting wsl_distro, "
                                 "else WSL's default.")(function)
    return click.option("--wsl", "use_wsl", is_flag=True, default=False,
                        help="Windows: run the worker inside WSL2 through wsl.exe.")(function)


def _print_status(result: dict[str, Any]) -> None:
    from .manage.service import format_status

    click.echo(format_status(result))


@main.command(short_help="Start a worker in the background, shared by your processes.")
@click.option("--backend", default=W["backend"], type=BACKENDS,
              help="auto: cuML when importable, otherwise scikit-learn on CPU.")
@_connection_file_option
@click.option("--log-file", type=click.Path(dir_okay=False), default=None,
              help="Where the worker's log goes (appended). Default: next to the connection file, .log.")
@click.option("--log-level", default=W["log_level"], type=LOG_LEVELS)
@click.option("--threads", default=W["threads"], type=click.IntRange(0),
              help="Estimator calls run at once on each GPU; 0: 4 on one GPU, 8 on each of several.")
@click.option("--gpus", default=W["gpus"], help="GPUs to drive: all, or indices such as 0,1. Default: the first GPU.")
@_device_memory_option
@click.option("--port", default=W["port"], type=click.IntRange(0, 65535),
              help="TCP port on 127.0.0.1; 0 picks a free one.")
@click.option("--pool-dir", "pool_dirs", multiple=True, type=click.Path(file_okay=False),
              help="Extra folder where the worker finds clients' pools (repeatable).")
@_wsl_options
@click.option("--startup-timeout", type=click.FloatRange(1), default=None,
              help="Seconds to wait for the worker to be ready. Default: the setting startup_timeout.")
@click.option("--measure/--no-measure", default=None,
              help="Measure the transport paths once ready (default: with --wsl) for transport=auto.")
def start(backend: str, connection_file: str | None, log_file: str | None, log_level: str, threads: int,
          gpus: str | None, device_memory: str, port: int, pool_dirs: tuple[str, ...], use_wsl: bool, distro: str | None,
          python: str | None, startup_timeout: float | None, measure: bool | None) -> None:
    """Start a worker in the background and wait until it is ready.

    With the default connection file, every Python process of this user (in any environment) uses
    this worker from then on instead of starting a local worker of its own; `sklearn-gpu-bridge stop`
    undoes that.
    """
    from .manage.service import ServiceError
    from .manage.service import start as start_worker

    try:
        result = start_worker(backend=backend, connection_file=connection_file, log_file=log_file,
                              log_level=log_level, threads=threads, gpus=gpus, device_memory=device_memory, port=port,
                              pool_dirs=pool_dirs,
                              python=python, use_wsl=use_wsl, distro=distro, startup_timeout=startup_timeout,
                              measure=measure)
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from None
    if result.get("already_running"):
        click.echo("already running:")
    else:
        click.echo(f"started in {result['ready_seconds']:.1f} s:")
    _print_status(result)
    click.echo(_users_note(result))


def _users_note(result: dict[str, Any]) -> str:
    """Who will use the worker from now on, and how not to (the default file reaches every process)."""
    if result.get("default_file"):
        return ("note: every Python process of this user, in any environment, now uses this worker instead of\n"
                "      starting a local worker of its own. To opt out: sklearn-gpu-bridge stop; or point a process\n"
                "      at another worker: set_config(connection_file=...) or SKLEARN_GPU_BRIDGE_CONNECTION_FILE.")
    return (f"note: a process uses this worker when its connection_file setting is {result['connection_file']}\n"
            "      (set_config(connection_file=...) or SKLEARN_GPU_BRIDGE_CONNECTION_FILE); others do not.")


@main.command(short_help="Stop the background (or warm local) worker. Exit code 0 also if none ran.")
@_connection_file_option
@click.option("--timeout", default=15.0, type=click.FloatRange(0),
              help="Seconds to wait for a clean stop before signals.")
def stop(connection_file: str | None, timeout: float) -> None:
    """Stop the background worker (a signed shutdown request, then signals).

    Removes the files `start` made for it (connection file, state file); its log stays, and its
    path is printed.

    Exit code 0: stopped, or no worker was running (nothing to stop); 1: it did not stop.
    """
    from .manage.service import stop as stop_worker

    result = stop_worker(connection_file=connection_file, timeout=timeout)
    if result["how"] == "no worker: nothing to stop":
        click.echo(f"no worker running ({result['connection_file']} does not exist): nothing to stop")
    elif result["stopped"]:
        click.echo(f"stopped the worker (pid {result['pid']}) by {result['how']}")
    else:
        raise click.ClickException(f"the worker (pid {result['pid']}) did not stop; its files are left, "
                                   "so that `sklearn-gpu-bridge stop` can try again")
    if result.get("log_file"):
        click.echo(f"its log is kept: {result['log_file']}")


@main.command(short_help="Show the background (or warm local) worker. Exit code 0: running, 1: not.")
@_connection_file_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON (for scripts).")
def status(connection_file: str | None, as_json: bool) -> None:
    """The background worker: backend, versions, GPU, handles, uptime, transport in use, which
    processes use it, log file.

    Exit code 0: a worker runs and answers; 1: none does (so scripts can test it:
    `sklearn-gpu-bridge status >/dev/null || sklearn-gpu-bridge start`).
    """
    import json

    from .manage.service import status as worker_status

    result = worker_status(connection_file=connection_file)
    if as_json:
        click.echo(json.dumps(result, indent=1, default=str))
    else:
        _print_status(result)
    if not result["running"]:
        raise SystemExit(1)


@main.command(short_help="Check each link to the GPU; each failure names its fix.")
@_connection_file_option
@click.option("--wsl/--no-wsl", "use_wsl", default=None,
              help="Check the worker's side inside WSL2. Default: on Windows, or when `start --wsl` started it.")
@click.option("--distro", default=None,
              help="WSL distribution. Default: the one `start` used, else the setting wsl_distro.")
@click.option("--python", default=None,
              help="The worker's Python. Default: the one `start` used, else wsl_python (WSL) or this Python.")
@click.option("--measure/--no-measure", default=True, help="Measure latency and throughput per transport path.")
@click.option("--quick", is_flag=True, help="Fewer and smaller transfers.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (for scripts).")
def doctor(connection_file: str | None, use_wsl: bool | None, distro: str | None, python: str | None, measure: bool,
           quick: bool, as_json: bool) -> None:
    """Check each link from here to the GPU; every failure prints the command that fixes it.

    Exit code 0: no check failed (warnings allowed); 1: a check failed.
    """
    import json

    from .manage.doctor import format_check, run, summary

    result = run(connection_file=connection_file, use_wsl=use_wsl, distro=distro, python=python, measure=measure,
                 quick=quick, on_check=None if as_json else (lambda check: click.echo(format_check(check))))
    if as_json:
        click.echo(json.dumps(result, indent=1, default=str))
    else:
        click.echo(summary(result))
    if not result["ok"]:
        raise SystemExit(1)


@main.group(short_help="Windows: start the worker inside WSL2 at logon.")
def autostart() -> None:
    """Windows: start the worker inside WSL2 at logon of the current user (no administrator rights)."""


@autostart.command("install", short_help="Run `start --wsl ...` at each logon (HKCU Run key).")
@click.option("--distro", default=None, help="WSL distribution. Default: the setting wsl_distro, else WSL's default.")
@click.option("--python", default=None, help="The worker's Python inside WSL. Default: the setting wsl_python.")
@click.option("--backend", default=W["backend"], type=BACKENDS)
@click.option("--log-level", default=W["log_level"], type=LOG_LEVELS)
def autostart_install(distro: str | None, python: str | None, backend: str, log_level: str) -> None:
    """Add `sklearn-gpu-bridge start --wsl ...` to the current user's Run key (HKCU)."""
    from .config import get_config
    from .manage import wsl

    config = get_config()
    args = ["--wsl", "--backend", backend, "--log-level", log_level]
    if distro or config["wsl_distro"]:
        args += ["--distro", distro or config["wsl_distro"]]
    args += ["--python", python or config["wsl_python"]]
    command = wsl.autostart_command(sys.executable, args)
    try:
        where = wsl.install_autostart(command)
    except OSError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"at each logon, Windows will run:\n  {command}\n(registry value {where}; "
               "remove it with: sklearn-gpu-bridge autostart remove)")


@autostart.command("remove", short_help="Remove the Run key entry; a running worker keeps running.")
def autostart_remove() -> None:
    """Remove the Run key entry (a running worker keeps running: `sklearn-gpu-bridge stop`)."""
    from .manage import wsl

    try:
        removed = wsl.remove_autostart()
    except OSError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo("autostart removed" if removed else "no autostart entry was installed")


@main.group(short_help="Make `import cuml` work in this environment, through the bridge.")
def alias() -> None:
    """`import cuml` in this environment (which has no cuML) runs on the bridge's worker.

    A `.pth` file in the environment's site-packages enables it at every start-up; it
    never shadows a real cuML (install refuses where one is importable, and the alias
    stands aside if one appears later).
    """


@alias.command("install", short_help="Write the .pth that enables the alias in this environment.")
def alias_install() -> None:
    """Write the .pth file that makes `import cuml` work in the active environment."""
    from .accel import cuml_alias
    from .errors import ConfigurationError

    try:
        path = cuml_alias.install_pth()
    except (ConfigurationError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"`import cuml` now runs through the bridge in this environment ({path});\n"
               "remove it with: sklearn-gpu-bridge alias uninstall")


@alias.command("uninstall", short_help="Remove the alias's .pth from this environment.")
def alias_uninstall() -> None:
    """Remove the .pth file; `import cuml` fails again here, as it did before."""
    from .accel import cuml_alias

    path = cuml_alias.pth_path()
    click.echo(f"removed {path}" if cuml_alias.uninstall_pth() else f"no alias was installed ({path})")
