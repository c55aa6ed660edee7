"""``python -m sklearn_gpu_bridge.accel [-v] (script.py | -m module | -c code) [args]``: cuml.accel's command."""

import os
import runpy
import sys

import click


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]})
@click.option("-m", "module", metavar="MODULE", help="Run a library module as a script (as python -m).")
@click.option("-c", "code", metavar="CODE", help="Run a program passed as a string (as python -c).")
@click.option("-v", "--verbose", count=True,
              help="-v: a table at exit of the calls per class, on the worker or the CPU, and why; "
                   "-vv: also each CPU call as it happens.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def main(module, code, verbose, args):
    """Run a script with scikit-learn's estimators served by the bridge's worker, unmodified.

    Where the worker cannot serve a call, scikit-learn runs it on this CPU.
    `import cuml` works too, where no real cuML is installed.
    """
    from . import install

    if sum(x is not None for x in (module, code)) + (bool(args) and module is None and code is None) == 0:
        raise click.UsageError("give a script, -m MODULE or -c CODE")
    install(log_level=verbose or None)
    if code is not None:
        sys.argv = ["-c", *args]
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 - the user's own code
    elif module is not None:
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))  # as python does for a script
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main(prog_name="python -m sklearn_gpu_bridge.accel")
