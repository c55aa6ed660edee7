"""The connection file: where a worker listens and the key that signs messages.

Written by the worker once it is ready, owner-only (0600), atomically, so a
client that can read it can talk to a worker that is warm.
"""

import json
import os
import secrets
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class ConnectionInfo:
    address: str
    key: str  # hex
    protocol_version: int
    pid: int
    backend: str
    curve_server_key: str | None = None  # Z85 public key when the worker encrypts (CurveZMQ)

    @property
    def key_bytes(self):
        return bytes.fromhex(self.key)


def new_key():
    """A fresh 256-bit signing key, hex encoded."""
    return secrets.token_hex(32)


def default_connection_file():
    """Where ``sklearn-gpu-bridge start`` leaves the file and clients look by default."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".local" / "share")
    return base / "sklearn-gpu-bridge" / "worker.json"


def write_connection_file(path, info):
    """Write ``info`` to ``path`` readable by its owner only, replacing atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".worker-", dir=path.parent)  # created 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(info), f, indent=1)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_connection_file(path):
    with open(path) as f:
        data = json.load(f)
    return ConnectionInfo(**{k: data[k] for k in ConnectionInfo.__dataclass_fields__ if k in data})
