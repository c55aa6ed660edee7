"""The connection file: where a worker listens and the key that signs messages.

Written by the worker once it is ready, owner-only (0600), atomically, so a
client that can read it can talk to a worker that is warm.
"""

import json
import os
import secrets
import subprocess
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


def windows_user(environ=os.environ):
    """``DOMAIN\\name`` of the Windows user running this process (as icacls names accounts)."""
    name, domain = environ.get("USERNAME"), environ.get("USERDOMAIN")
    return f"{domain}\\{name}" if domain else name


def private_folder_command(folder, user):
    """icacls arguments that leave ``folder``, and all that is created in it, to ``user`` alone.

    Windows' 0700: inherited entries removed (/inheritance:r), then full
    control for ``user`` only, inherited by files (OI) and folders (CI).
    """
    return ["icacls", str(folder), "/inheritance:r", "/grant:r", f"{user}:(OI)(CI)F"]


def make_private_folder(folder, windows=None):
    """Create ``folder`` (if needed) for this user alone: mode 0700, or on Windows an ACL of this user only.

    Only for folders this package owns: on Windows ``chmod`` cannot keep others
    out, and the files a worker in WSL2 writes there take the folder's ACL.
    """
    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if sys.platform == "win32" if windows is None else windows:
        command = private_folder_command(folder, windows_user())
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise OSError(f"could not make {folder} private ({' '.join(command)}): "
                          f"{(done.stderr or done.stdout).strip()}")
    return folder


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
