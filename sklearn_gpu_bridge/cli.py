"""The ``sklearn-gpu-bridge`` command line (only the CLI; the work lives elsewhere).

Every option can also come from an environment variable
``SKLEARN_GPU_BRIDGE_<COMMAND>_<OPTION>`` (click's ``auto_envvar_prefix``).
"""

import logging

import click

from .connect import default_connection_file
from .worker import Worker, make_backend

ENVVAR_PREFIX = "SKLEARN_GPU_BRIDGE"


@click.group(context_settings={"auto_envvar_prefix": ENVVAR_PREFIX, "show_default": True})
@click.version_option(package_name="sklearn-gpu-bridge")
def main():
    """scikit-learn estimators that run on cuML in a worker process."""


@main.command()
@click.option("--bind", default="127.0.0.1",
              help="Address to listen on. Anything but loopback turns CurveZMQ encryption on.")
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="TCP port; 0 picks a free one.")
@click.option("--backend", default="auto", type=click.Choice(["auto", "cuml", "sklearn"]),
              help="auto: cuML when importable, otherwise scikit-learn on CPU.")
@click.option("--connection-file", type=click.Path(dir_okay=False), default=str(default_connection_file()),
              help="Where to write address and key (mode 0600) once ready.")
@click.option("--threads", default=1, type=click.IntRange(1), help="Estimator calls run at once.")
@click.option("--parent-pid", type=int, default=None, hidden=True,
              help="Stop when this process dies (used by the local worker).")
@click.option("--pool-dir", "pool_dirs", multiple=True, type=click.Path(file_okay=False),
              help="Folder where clients' shared-memory pools may be found (repeatable). "
                   "Default: /dev/shm and the temp folder.")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
def worker(bind, port, backend, connection_file, threads, parent_pid, pool_dirs, log_level):
    """Run a worker in this process until SIGINT, SIGTERM or a shutdown request."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    chosen, reason = make_backend(backend)
    if reason:
        logging.getLogger("sklearn_gpu_bridge.worker").warning("falling back to scikit-learn: %s", reason)
    Worker(chosen, host=bind, port=port, connection_file=connection_file, threads=threads,
           parent_pid=parent_pid, fallback_reason=reason, pool_dirs=pool_dirs).start().serve_forever()


@main.command()
@click.option("--repeats", default=3, type=click.IntRange(1), help="Timed repeats per step.")
def demo(repeats):
    """Pipeline + GridSearchCV on a dataset shipped with scikit-learn, timed."""
    from .demo import run_demo

    run_demo(repeats=repeats)
