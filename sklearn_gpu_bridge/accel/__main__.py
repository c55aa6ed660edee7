"""``python -m sklearn_gpu_bridge.accel [-v] (script.py | -m module | -c code) [args]``: cuml.accel's command.

What the user's code does is shown as ``python`` shows it: a script that
cannot be opened is one line and exit code 2, a module that cannot be found
one line and exit code 1, and an error of the code itself its own traceback
(from its first frame, none of this command's or runpy's) and exit code 1.
"""

import importlib.util
import os
import runpy
import sys
from importlib.machinery import ModuleSpec
from types import TracebackType

import click

PROG = "python -m sklearn_gpu_bridge.accel"


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]})
@click.option("-m", "module", metavar="MODULE", help="Run a library module as a script (as python -m).")
@click.option("-c", "code", metavar="CODE", help="Run a program passed as a string (as python -c).")
@click.option("-v", "--verbose", count=True,
              help="-v: a table at exit of every scikit-learn class the code used, the calls per method on the "
                   "worker and on the CPU, and why; -vv: also each CPU call as it happens.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def main(module: str | None, code: str | None, verbose: int, args: tuple[str, ...]) -> None:
    """Run a script with scikit-learn's estimators served by the bridge's worker, unmodified.

    Where the worker cannot serve a call, scikit-learn runs it on this CPU.
    `import cuml` works too, where no real cuML is installed.
    """
    from . import install

    if module is None and code is None and not args:
        raise click.UsageError("give a script, -m MODULE or -c CODE")
    if module is None and code is None:
        _exit_unless_readable(args[0])
    elif module is not None and _find_module(module) is None:
        _exit(f"{PROG}: No module named {module}", 1)  # python -m's words and exit code
    install(log_level=verbose or None)
    try:
        if code is not None:
            sys.argv = ["-c", *args]
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 - the user's own code
        elif module is not None:
            sys.argv = [module, *args]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            path = os.path.abspath(args[0])  # as python does for a script: its __file__, its folder first
            sys.path.insert(0, os.path.dirname(path))
            runpy.run_path(path, run_name="__main__")
    except (SystemExit, click.exceptions.Exit):
        raise
    except BaseException as exc:  # noqa: BLE001 - the code's own error, shown as python shows it
        exc = exc.with_traceback(_from_the_code(exc.__traceback__))  # what sys.excepthook prints
        sys.excepthook(type(exc), exc, exc.__traceback__)
        _exit(None, 130 if isinstance(exc, KeyboardInterrupt) else 1)


def _exit_unless_readable(path: str) -> None:
    """As ``python missing.py``: one line naming the file and the system's reason, exit code 2."""
    if os.path.isdir(path):
        return  # a folder with a __main__.py: runpy runs it, or says what is missing
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        _exit(f"{PROG}: can't open file {os.path.abspath(path)!r}: [Errno {exc.errno}] {exc.strerror}", 2)


def _find_module(name: str) -> ModuleSpec | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package that is missing, or a relative name
        return None


def _from_the_code(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its first frames of this module and of runpy: the code's own frames, as python shows them."""
    while tb is not None and (tb.tb_frame.f_globals is globals() or tb.tb_frame.f_globals.get("__name__") == "runpy"):
        tb = tb.tb_next
    return tb


def _exit(message: str | None, code: int) -> None:
    if message:
        click.echo(message, err=True)
    sys.exit(code)


if __name__ == "__main__":
    main(prog_name=PROG)
