"""Which path bulk arrays take to the worker: a shared pool folder, or ZeroMQ frames.

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
  candidate is only ever chosen after :func:`measure` has sent changing data
  through the same slots both ways and got every byte back.

The setting ``transport`` (``set_config`` / ``SKLEARN_GPU_BRIDGE_TRANSPORT``)
picks: ``frames``; ``pool`` (the pool, in ``pool_directory`` or in the
fastest pool folder measured for this worker); ``auto`` (the default: what
``doctor`` or ``start`` measured as fastest for the worker now running, and
otherwise the pool where the worker can map it, frames where it cannot).
:func:`resolve` turns that into the client's ``pool`` and
``pool_directory``; ``get_config`` applies it.

Measurements are kept in the worker's state file, next to its connection
file (``worker.json`` -> ``worker.service.json``), with the address and pid
of the worker they were made against: a new worker gets measured anew.
"""

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

TRANSPORTS = ("auto", "pool", "frames")
MB = 1_000_000
PREFER_FRAMES_WITHIN = 1.10  # a pool must be >10% faster than frames to be chosen


# ---------------------------------------------------------------- the state file


def state_path(connection_file):
    """``worker.json`` -> ``worker.service.json``: what ``start`` and ``doctor`` know about that worker."""
    path = Path(connection_file)
    return path.with_name(path.stem + ".service.json")


def read_state(connection_file):
    try:
        with open(state_path(connection_file)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(connection_file, state):
    """Replace the state file atomically, owner-only."""
    path = state_path(connection_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, path)


def update_state(connection_file, **changes):
    state = read_state(connection_file)
    state.update(changes)
    write_state(connection_file, state)
    return state


def _worker_identity(connection_file):
    """(address, pid) in the connection file, or None."""
    try:
        with open(connection_file) as f:
            data = json.load(f)
        return data["address"], data["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def current_record(connection_file):
    """The transport measured for the worker that runs now at ``connection_file``, or None."""
    record = read_state(connection_file).get("transport")
    if not isinstance(record, dict):
        return None
    worker = record.get("worker") or {}
    if _worker_identity(connection_file) != (worker.get("address"), worker.get("pid")):
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


# ---------------------------------------------------------------- measurement


def candidates_for(connection_file, extra_pool_directory=None):
    """[(name, client pool folder or None)]: frames, the folders ``start`` set up, the platform's default."""
    from .shm.pool import default_directory

    found = [("frames", None)]
    for candidate in read_state(connection_file).get("pool_candidates", ()):
        found.append((candidate["name"], candidate["client"]))
    if len(found) == 1:
        found.append(("default", default_directory()))
    if extra_pool_directory and all(extra_pool_directory != d for _, d in found):
        found.append(("configured", extra_pool_directory))
    return found


def measure(info, connection_file, candidates, *, quick=False, on_result=None):
    """Latency and throughput of ``Connection.echo`` per candidate, each byte checked.

    Returns a list of dicts: name, pool_directory, available, coherent,
    latency_ms (a 1 MB round trip), mb_per_s (2 x bytes / median seconds,
    the largest size measured), path (what the client's counters saw), why.
    """
    import numpy as np

    from .progress import waiting

    rng = np.random.default_rng()
    results = []
    for name, directory in candidates:
        with waiting(f"measuring {name}" + (f" ({directory})" if directory else "")):
            results.append(_measure_candidate(info, connection_file, name, directory, rng, quick))
        if on_result is not None:
            on_result(results[-1])
    return results


def _measure_candidate(info, connection_file, name, directory, rng, quick):
    """One candidate's figures; every failure becomes the result's ``why``."""
    from .client import Connection

    result = {"name": name, "pool_directory": directory, "available": False, "coherent": None}
    try:
        conn = Connection(info, connection_file=str(connection_file), pool="off" if directory is None else "auto",
                          pool_directory=directory, heartbeat_timeout=5.0)
    except Exception as exc:  # noqa: BLE001 - reported: a folder that cannot be created, a dead worker
        result["why"] = f"{type(exc).__name__}: {exc}"
        return result
    try:
        if directory is not None and conn.pool is None:
            result["why"] = f"the worker does not see {directory} (not in its --pool-dir folders)"
        else:
            result.update(_measure_one(conn, rng, quick))
    except Exception as exc:  # noqa: BLE001 - a broken path is a result, not a crash
        result["why"] = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return result


def _echo_checked(conn, arr):
    """Whether ``arr`` comes back from the worker unchanged."""
    (back,) = conn.echo(arr)
    same = back.shape == arr.shape and back.dtype == arr.dtype and bool((back == arr).all())
    del back  # its pool slots go back as soon as it dies
    return same


def _measure_one(conn, rng, quick):
    import numpy as np

    out = {"available": True}
    before = dict(conn.stats)
    # coherence: fresh data through the same slots, again and again; a stale cache shows at once
    for size in (1 * MB, 8 * MB):
        for _ in range(3):
            arr = rng.integers(0, 2**31, size // 4, dtype=np.int32)
            if not _echo_checked(conn, arr):
                out.update(coherent=False, why="data came back changed (the two sides do not see the same bytes)")
                return out
    out["coherent"] = True
    small = rng.standard_normal(MB // 4).astype(np.float32)
    times = []
    for _ in range(5 if quick else 15):
        start = time.perf_counter()
        conn.echo(small)
        times.append(time.perf_counter() - start)
    out["latency_ms"] = float(np.median(times)) * 1e3
    sizes = (16 * MB,) if quick else (16 * MB, 64 * MB)
    for size in sizes:
        arr = rng.standard_normal(size // 4).astype(np.float32)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            conn.echo(arr)
            times.append(time.perf_counter() - start)
            if times[-1] > 2.0:
                break  # a slow path: one figure is enough, and kinder to the user
        out["mb_per_s"] = 2 * size / float(np.median(times)) / MB
        out["mb"] = size / MB
        if times[-1] > 2.0:
            break
    delta = {k: v - before.get(k, 0) for k, v in conn.stats.items() if v - before.get(k, 0)}
    out["path"] = "+".join(sorted({k.split("_", 1)[1] for k in delta})) or "none"
    return out


def choose(results):
    """The candidate to use: the fastest that works, frames unless a pool is clearly faster."""
    usable = [r for r in results if r.get("available") and r.get("coherent") and r.get("mb_per_s")]
    if not usable:
        return None
    frames = next((r for r in usable if r["pool_directory"] is None), None)
    best = max(usable, key=lambda r: r["mb_per_s"])
    if frames is not None and best is not frames and best["mb_per_s"] < PREFER_FRAMES_WITHIN * frames["mb_per_s"]:
        return frames
    return best


def record(connection_file, results, chosen):
    """Keep the measurement in the state file, tied to the worker measured."""
    identity = _worker_identity(connection_file)
    entry = {
        "choice": chosen["name"] if chosen else "frames",
        "pool_directory": chosen["pool_directory"] if chosen else None,
        "worker": {"address": identity[0], "pid": identity[1]} if identity else {},
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "results": results,
    }
    update_state(connection_file, transport=entry)
    return entry
