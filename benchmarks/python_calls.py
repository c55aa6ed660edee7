"""How much Python a small call runs on the client: Python functions called, and how many distinct ones.

    python benchmarks/python_calls.py [--out results/cpu-HOST/python-calls.json]

After a ``gc.collect()`` (as ``e2e.py``'s table times its calls) every
function a call runs is fetched from memory again, and on the 2-core VM
each costs a few microseconds more than back to back. Counting them is
exact and the same on every machine, where timing a tenth of a millisecond
is not: run it once per tree (``PYTHONPATH=<the other tree's site>``) to
compare two. cProfile counts the calls of functions written in Python
(builtins and C methods apart); the calls made while the client spins for
its reply (``_HeldCopy.settled``, once per look) are left out.
"""

import cProfile
import pstats

import sklearn_gpu_bridge
from client_checks import report
from client_legs import over_small_calls
from e2e import bridge_parser

SPINNING = ("settled",)  # functions called once per look at the reply slot: how often is the worker's time


def python_calls(call, repeats=20):
    """(calls, distinct functions) of Python code per ``call()``, in the mean of ``repeats``."""
    profiler = cProfile.Profile()
    for _ in range(repeats):
        profiler.enable()
        call()
        profiler.disable()
    stats = pstats.Stats(profiler).stats
    python = {key: value for key, value in stats.items() if key[0] != "~" and key[2] not in SPINNING}
    return sum(value[1] for value in python.values()) / repeats, len(python)


def main():
    parser = bridge_parser(__doc__, backend=False, reply_wait="spin")
    args = parser.parse_args()

    def measure(name, call):
        calls, functions = python_calls(call)
        return {"python calls": calls, "python functions": functions}

    per_call = over_small_calls("sklearn", args.reply_wait, measure)
    report({"reply_wait": args.reply_wait, "bridge": sklearn_gpu_bridge.__file__, "per call": per_call}, args.out)


if __name__ == "__main__":
    main()
