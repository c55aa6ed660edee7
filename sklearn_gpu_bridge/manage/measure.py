"""How fast each path for bulk arrays is to a running worker, each byte checked (``doctor``, ``start``).

Each candidate (frames, or a pool folder) carries changing data through a real client connection
both ways; :mod:`.transport_select` chooses among the results and keeps the choice.
"""

import time

import numpy as np

from ..client import connect
from ..progress import waiting

MB = 1_000_000


def measure(info, connection_file, candidates, *, quick=False, on_result=None):
    """Latency and throughput of ``Connection.echo`` per candidate, each byte checked.

    Returns a list of dicts: name, pool_directory, available, coherent,
    latency_ms (a 1 MB round trip), mb_per_s (2 x bytes / median seconds,
    the largest size measured), path (what the client's counters saw), why.
    """
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
    result = {"name": name, "pool_directory": directory, "available": False, "coherent": None}
    try:
        conn = connect(info, connection_file=str(connection_file), pool="off" if name == "frames" else "auto",
                       pool_directory=directory, heartbeat_timeout=5.0, array_cache="off")  # the path, not the cache
    except Exception as exc:  # noqa: BLE001 - reported: a folder that cannot be created, a dead worker
        result["why"] = f"{type(exc).__name__}: {exc}"
        return result
    try:
        if name != "frames" and conn.pool is None:
            where = directory or "this process's shared memory"
            result["why"] = f"the worker does not see {where} (not in its --pool-dir folders, or another host)"
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
    paths = {k.split("_", 1)[1] for k in delta if k.startswith(("sent_", "received_"))}  # not replies_from_pool
    out["path"] = "+".join(sorted(paths)) or "none"
    return out
