"""What ``start`` and ``doctor`` know about a worker, kept beside its connection file.

``worker.json`` -> ``worker.service.json``: how the worker was started, its
log file, the pool folders set up for it, the transport measured against it.
Written atomically and owner-only, and read only under the connection file's
own checks: the command it names is run (``doctor``), the ``wsl.exe`` it names
too and the pid it names signalled (``stop``), so a state file another user
planted beside a connection file in a shared folder (/tmp) is never read.
"""

import json
import logging
from pathlib import Path

from ..errors import ConfigurationError
from ..runtime.private_files import prepare_folder, read_private_file, write_private_file

log = logging.getLogger(__name__)


def state_path(connection_file):
    """``worker.json`` -> ``worker.service.json``."""
    path = Path(connection_file)
    return path.with_name(path.stem + ".service.json")


def read_state(connection_file):
    """The state file's dict; {} where there is none, or where it is not this user's alone (it is not read,
    and a warning says why: another user may have put it there)."""
    path = state_path(connection_file)
    try:
        state = json.loads(read_private_file(path, "state file"))
    except ConfigurationError as exc:
        log.warning("%s", exc)
        return {}
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(connection_file, state):
    """Replace the state file atomically, owner-only."""
    path = state_path(connection_file)
    prepare_folder(path.parent)
    write_private_file(path, json.dumps(state, indent=1))


def update_state(connection_file, **changes):
    state = read_state(connection_file)
    state.update(changes)
    write_state(connection_file, state)
    return state


def remove_state(connection_file):
    state_path(connection_file).unlink(missing_ok=True)


def worker_identity(connection_file):
    """(address, pid) in the connection file, or None; read under the connection file's checks."""
    try:
        data = json.loads(read_private_file(connection_file, "connection file"))
        return data["address"], data["pid"]
    except (OSError, ValueError, KeyError, TypeError):  # ConfigurationError is a ValueError
        return None
