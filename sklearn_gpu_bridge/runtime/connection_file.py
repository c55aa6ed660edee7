"""The connection file: where a worker listens and the key that signs messages.

Written by the worker once it is ready, owner-only (0600), atomically, so a
client that can read it can talk to a worker that is warm. Read only when it
is this user's own and no one else may read or write it (:mod:`.private_files`):
the key in it lets its reader run code as the worker's user.

Shared by both sides: imports nothing of the package but its errors and private_files.
"""

import json
import os
import secrets
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ConfigurationError
from .private_files import make_private_folder, prepare_folder, read_private_file, write_private_file

MIN_KEY_BYTES = 16  # 128 bits


class NotAConnectionFile(ConfigurationError):
    """A file that passed the checks but holds no worker's connection (not JSON, or fields missing)."""


@dataclass(frozen=True)
class ConnectionInfo:
    address: str  # ipc://<private folder>/...sock on one host; tcp://host:port otherwise
    key: str  # hex
    protocol_version: int
    pid: int
    backend: str
    worker_id: str  # this worker run: messages name it, so none is taken by another run
    curve_server_key: str | None = None  # Z85 public key when the worker encrypts (CurveZMQ)

    @property
    def key_bytes(self):
        return signing_key(self.key, "the connection file")


def new_key():
    """A fresh 256-bit signing key, hex encoded."""
    return secrets.token_hex(32)


def signing_key(text, source):
    """The signing key in ``text`` (hex) as bytes: the one check of every key, wherever it comes from.

    An empty key would turn signing off, and a short one is guessable: both are
    refused with a ConfigurationError that names ``source``.
    """
    if isinstance(text, bytes):
        text = text.decode("ascii", errors="replace")
    text = (text or "").strip()
    if not text:
        raise ConfigurationError(f"the signing key in {source} is empty, which would turn message signing off; "
                                 "refusing it (give no key and the worker makes a fresh one)")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ConfigurationError(f"the signing key in {source} must be written in hex digits") from None
    if len(raw) < MIN_KEY_BYTES:
        raise ConfigurationError(f"the signing key in {source} must hold at least {MIN_KEY_BYTES * 8} bits "
                                 f"({MIN_KEY_BYTES * 2} hex digits), not {len(raw) * 8}")
    return raw


def read_key_file(path):
    """The hex key in a key file that is this user's alone."""
    text = read_private_file(path, "key file")
    signing_key(text, f"the key file {path}")
    return text.strip()


def default_connection_file():
    """Where ``sklearn-gpu-bridge start`` leaves the file and clients look by default."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".local" / "share")
    return base / "sklearn-gpu-bridge" / "worker.json"


def start_lock_path(path):
    """The lock beside connection file ``path`` held by whoever starts its worker, and by a worker that stops
    for idleness (``.../worker.json`` -> ``.../worker.lock``)."""
    return Path(path).with_suffix(".lock")


def prepare_folder_of(path):
    """Make the folder of the connection file ``path`` (0700, and its missing parents, whatever the umask); the
    default folder must be this user's alone, another one must not let others replace files in it."""
    path = Path(path)
    if path.parent == default_connection_file().parent:
        return make_private_folder(path.parent)
    return prepare_folder(path.parent)


def write_connection_file(path, info):
    """Write ``info`` to ``path`` readable by its owner only, replacing atomically."""
    prepare_folder_of(path)
    write_private_file(path, json.dumps(asdict(info), indent=1))


def read_connection_file(path):
    """The worker's address and key; refused when the file is not this user's alone."""
    text = read_private_file(path, "connection file")
    try:
        data = json.loads(text)
        return ConnectionInfo(**{k: data[k] for k in ConnectionInfo.__dataclass_fields__ if k in data})
    except (ValueError, TypeError) as exc:
        raise NotAConnectionFile(f"the connection file {path} is not one a worker wrote: {exc}") from None


def start_hint(path="PATH"):
    """The command that starts a worker writing the connection file ``path``, for error messages."""
    return f"start one with:  sklearn-gpu-bridge worker --connection-file {path}"
