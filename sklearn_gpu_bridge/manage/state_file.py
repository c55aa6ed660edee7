"""What ``start`` and ``doctor`` know about a worker, kept beside its connection file.

``worker.json`` -> ``worker.service.json``: how the worker was started, its
log file, the pool folders set up for it, the transport measured against it.
Written atomically and owner-only.
"""

import json
from pathlib import Path

from ..runtime.private_files import write_private_file


def state_path(connection_file):
    """``worker.json`` -> ``worker.service.json``."""
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
    write_private_file(path, json.dumps(state, indent=1))


def update_state(connection_file, **changes):
    state = read_state(connection_file)
    state.update(changes)
    write_state(connection_file, state)
    return state


def remove_state(connection_file):
    state_path(connection_file).unlink(missing_ok=True)


def worker_identity(connection_file):
    """(address, pid) in the connection file, or None (no secret is read: it only names the worker)."""
    try:
        with open(connection_file) as f:
            data = json.load(f)
        return data["address"], data["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
