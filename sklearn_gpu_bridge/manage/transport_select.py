"""Which path bulk arrays take to the worker: the candidates, the choice, and where it is kept.

The candidates:

- ``frames``: no pool; arrays travel as zero-copy ZeroMQ frames over TCP
  (on Windows, through WSL2's localhost forwarding). Always available.
- a pool folder both sides can map. On one Linux host: ``/dev/shm`` (memory).
  Across Windows and WSL2: a folder on the Windows disk, seen by the worker
  under ``/mnt/<drive>/...`` (``windows-disk``), or a folder on the WSL disk,
  seen by the client as ``\\\\wsl.localhost\\<distro>\\...`` (``wsl-disk``).
  Both of those cross the VM boundary through the 9P file server, and 9P
  does NOT keep two memory maps of one file coherent (microsoft/WSL#10103:
  WSL caches mmap'ed files; changes from Windows are not seen). So a pool
  candidate is only ever chosen after :func:`.measure.measure` has sent changing data
  through the same blocks both ways and got every byte back.

The setting ``transport`` (``set_config`` / ``SKLEARN_GPU_BRIDGE_TRANSPORT``)
picks: ``frames``; ``pool`` (the pool, in ``pool_directory`` or in the
fastest pool folder measured for this worker); ``auto`` (the default: what
``doctor`` or ``start`` measured as fastest for the worker now running, and
otherwise the pool where the worker can map it, frames where it cannot).
:func:`client_transport` turns that into the client's ``pool`` and
``pool_directory``; the client applies it when it connects.

Measurements are kept in the worker's state file (:mod:`.state_file`) with
the address and pid of the worker they were made against: a new worker gets
measured anew.
"""

from datetime import datetime, timezone
from pathlib import Path

from ..config import get_config, is_explicit
from ..runtime.connection_file import default_connection_file
from .state_file import read_state, update_state, worker_identity

TRANSPORTS = ("auto", "pool", "frames")
PREFER_FRAMES_WITHIN = 1.10  # a pool must be >10% faster than frames to be chosen
MB = 1_000_000


def connection_file_in_force(settings=None):
    """The file the client will read: the setting, else the default file if it exists."""
    settings = settings or get_config()
    if settings["connection_file"] is not None:
        return settings["connection_file"]
    path = default_connection_file()
    return path if path.exists() else None


def client_transport(connection_file=None):
    """(pool, pool_directory, reason) that the settings in force imply for the worker at ``connection_file``."""
    settings = get_config()
    explicit = {name for name in ("pool", "pool_directory") if is_explicit(name)}
    if connection_file is None:
        connection_file = connection_file_in_force(settings)
    return resolve(settings["transport"], connection_file, pool=settings["pool"],
                   pool_directory=settings["pool_directory"], explicit=explicit)


def current_record(connection_file):
    """The transport measured for the worker that runs now at ``connection_file``, or None."""
    record = read_state(connection_file).get("transport")
    if not isinstance(record, dict):
        return None
    worker = record.get("worker") or {}
    if worker_identity(connection_file) != (worker.get("address"), worker.get("pid")):
        return None  # measured against another worker (a restart): stale
    return record


# ---------------------------------------------------------------- resolution


def resolve(transport, connection_file, *, pool="auto", pool_directory=None, explicit=()):
    """(pool, pool_directory, reason): what the client does for ``transport``.

    ``explicit`` names the settings the user set (in Python or the
    environment); those are never replaced by a measured choice.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
    if transport == "frames":
        return "off", pool_directory, "transport=frames"
    if connection_file is None or not Path(connection_file).exists():
        return pool, pool_directory, "no worker file: the pool where the worker can map it"
    record = current_record(connection_file)
    if transport == "pool":
        if "pool_directory" not in explicit:
            pool_directory = _best_pool_directory(record, connection_file) or pool_directory
        return "auto", pool_directory, "transport=pool"
    if "pool" in explicit or "pool_directory" in explicit or record is None:
        return pool, pool_directory, "the pool where the worker can map it, else frames"
    measured_at = record.get("measured_at", "?")
    if record.get("choice") == "frames":
        return "off", pool_directory, f"measured {measured_at}: frames fastest"
    return "auto", record.get("pool_directory"), f"measured {measured_at}: pool {record.get('choice')} fastest"


def _best_pool_directory(record, connection_file):
    """The fastest coherent pool folder measured, else the first one ``start`` set up."""
    if record:
        pools = [r for r in record.get("results", ()) if r.get("pool_directory") and r.get("coherent")]
        if pools:
            return max(pools, key=lambda r: r.get("mb_per_s") or 0)["pool_directory"]
    for candidate in read_state(connection_file).get("pool_candidates", ()):
        return candidate.get("client")
    return None


# ---------------------------------------------------------------- measuring the candidates


# ---------------------------------------------------------------- choosing, and keeping the choice


def candidates_for(connection_file, extra_pool_directory=None):
    """[(name, client pool folder)]: frames, the folders ``start`` set up, else the default pool.

    The default pool's folder is None: shared memory (memfd) on Linux, the
    temp folder elsewhere.
    """
    found = [("frames", None)]
    for candidate in read_state(connection_file).get("pool_candidates", ()):
        found.append((candidate["name"], candidate["client"]))
    if len(found) == 1:
        found.append(("default", None))
    if extra_pool_directory and all(extra_pool_directory != d for _, d in found):
        found.append(("configured", extra_pool_directory))
    return found


def choose(results):
    """The candidate to use: the fastest that works, frames unless a pool is clearly faster."""
    usable = [r for r in results if r.get("available") and r.get("coherent") and r.get("mb_per_s")]
    if not usable:
        return None
    frames = next((r for r in usable if r["name"] == "frames"), None)
    best = max(usable, key=lambda r: r["mb_per_s"])
    if frames is not None and best is not frames and best["mb_per_s"] < PREFER_FRAMES_WITHIN * frames["mb_per_s"]:
        return frames
    return best


def record(connection_file, results, chosen):
    """Keep the measurement in the state file, tied to the worker measured."""
    identity = worker_identity(connection_file)
    entry = {
        "choice": chosen["name"] if chosen else "frames",
        "pool_directory": chosen["pool_directory"] if chosen else None,
        "worker": {"address": identity[0], "pid": identity[1]} if identity else {},
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "results": results,
    }
    update_state(connection_file, transport=entry)
    return entry
