"""Who may connect at all: the credentials of a connection, before any message.

A worker listens on one of three kinds of address, and each has its gate:

- ``ipc://`` (one host; the default on Linux and macOS): a socket file in a
  private folder of the worker's user; the file system lets no other user
  connect.
- ``tcp://`` on loopback (WSL2 to Windows): ZeroMQ's PLAIN mechanism, whose
  password is derived from the signing key and the worker run's id; the
  worker's ZAP handler refuses any other before a single message is
  accepted. PLAIN sends the password to whoever listens at the address (a
  user who took the port while the worker was down): derived per run, it
  opens no other run of the worker, not even one with the same key file.
- ``tcp://`` beyond loopback: CurveZMQ (encrypted), and the client's public
  key must be on the worker's allow-list: the key derived from the signing
  key, or one made by ``sklearn-gpu-bridge keys`` and listed in ``--curve-allow``.

A key pair is two ZeroMQ certificate files: ``NAME.key`` (the public key
alone, for anyone) and ``NAME.key_secret`` (owner-only, 0600, from the
start). A secret key file is read only when it is this user's alone.
"""

import hashlib
import hmac
import os
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from ..errors import ConfigurationError
from .private_files import check_private_file, prepare_folder

PLAIN_USER = b"sklearn-gpu-bridge"


def _derive(key, purpose):
    return hmac.new(key, b"sklearn-gpu-bridge " + purpose, hashlib.sha256).digest()


def plain_password(key, worker_id):
    """The PLAIN password of the worker run ``worker_id`` with signing key ``key`` (bytes): only key holders know
    it, and a password captured by whoever listened at the address opens no other run."""
    return _derive(key, b"plain password " + str(worker_id).encode()).hex().encode()


def derived_client_pair(key):
    """(public, secret) Z85 CurveZMQ keys that every holder of the signing key can make, and no one else."""
    secret = z85.encode(_derive(key, b"curve client"))
    return zmq.curve_public(secret), secret


def secure(sock, info, client_secret_key=None):
    """Set a client socket's credentials for the worker in ``info`` (before it connects)."""
    if info.address.startswith("ipc://"):
        return sock
    key = info.key_bytes
    if info.curve_server_key:
        public, secret = load_secret(client_secret_key) if client_secret_key else derived_client_pair(key)
        sock.curve_serverkey = info.curve_server_key.encode()
        sock.curve_publickey, sock.curve_secretkey = public, secret
    else:
        sock.plain_username, sock.plain_password = PLAIN_USER, plain_password(key, info.worker_id)
    return sock

_BANNER = "#   ZeroMQ CURVE {} certificate of sklearn-gpu-bridge\n#   {}\n\nmetadata\ncurve\n"


def make_pair(directory, name="worker", force=False):
    """Write a CurveZMQ key pair; returns (public path, secret path)."""
    directory = prepare_folder(directory)
    public, secret = zmq.curve_keypair()
    paths = directory / f"{name}.key", directory / f"{name}.key_secret"
    if not force:
        for path in paths:
            if path.exists():
                raise FileExistsError(0, "exists", str(path))
    texts = (
        _BANNER.format("public", "Give this file to anyone.") + f'    public-key = "{public.decode()}"\n',
        _BANNER.format("SECRET", "Keep this file to yourself (mode 0600).")
        + f'    public-key = "{public.decode()}"\n    secret-key = "{secret.decode()}"\n',
    )
    for path, text, mode in zip(paths, texts, (0o644, 0o600)):
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(path, mode)  # whatever the umask
    return paths


def load_secret(path):
    """(public, secret) Z85 keys from a secret key file that is this user's alone."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ConfigurationError(f"CurveZMQ key file {path}: {exc.strerror}") from None
    try:
        check_private_file(path, fd, "CurveZMQ secret key file")
    finally:
        os.close(fd)
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{path} is not a ZeroMQ certificate: {exc}") from None
    if not secret:
        raise ConfigurationError(
            f"{path} holds no secret key: pass the .key_secret file that `sklearn-gpu-bridge keys` wrote"
        )
    return public, secret


def load_public(path):
    """The Z85 public key in a certificate file (public or secret)."""
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{path} is not a ZeroMQ certificate: {exc}") from None
    return public


def bind_hint(host):
    """What to do to bind ``host`` (not loopback): make keys, pass the secret one."""
    return (
        f"binding {host} (not loopback) needs CurveZMQ encryption keys that you made. Make a pair once:\n"
        "    sklearn-gpu-bridge keys DIR\n"
        "then start the worker with\n"
        f"    sklearn-gpu-bridge worker --bind {host} --curve-secret-key DIR/worker.key_secret\n"
        "The public key goes into the connection file; clients need nothing else."
    )
