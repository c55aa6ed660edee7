"""This user's things on this host: private folders and files, lock files, processes.

Another local user must not be able to plant a file the bridge reads, take a
folder the bridge writes to, or pass a process of theirs for one of ours.
So folders the bridge makes are made 0700 whatever the umask (their missing
parents too) and checked after making (``lstat``: a real folder, this
user's, mode 0700); a folder the user chose is refused when others may
replace what is written there; files it reads are opened without following
links and refused when others own them or may read or write them, and files
it writes are replaced atomically, owner-only.

On Windows, where modes keep no one out, the package's own folders get an
ACL of the user alone (``icacls``); the mode checks do not apply there.

Shared by both sides: imports nothing of the package but its errors.
"""

import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import ConfigurationError

POSIX = os.name == "posix"
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)


# ---------------------------------------------------------------- folders


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
    """Create ``folder`` (and parents) for this user alone, and check it; returns its Path.

    On POSIX: made with mode 0700, then :func:`check_private_folder` (a folder
    another user made first, or a link, is refused, never used). On Windows:
    an ACL of this user alone.
    """
    folder = Path(folder)
    make_folders(folder)
    if sys.platform == "win32" if windows is None else windows:
        command = private_folder_command(folder, windows_user())
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise OSError(f"could not make {folder} private ({' '.join(command)}): "
                          f"{(done.stderr or done.stdout).strip()}")
        return folder
    return check_private_folder(folder)


def make_folders(folder):
    """Make ``folder`` and its missing parents, each mode 0700 whatever the umask (``mkdir -p`` would make the
    parents by the umask: 0777 under ``umask 000``). What exists already is left as it is."""
    folder = Path(os.path.abspath(folder))
    missing = []
    while not os.path.lexists(folder) and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # made meanwhile, or a file or a dangling link in its place: checked by the caller
            continue
        if POSIX:  # the umask may have taken bits mkdir's mode asked for; never through a link put in its place
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW | CLOEXEC)
            try:
                os.fchmod(fd, 0o700)
            except OSError:  # a file system without modes (a Windows disk in WSL): the checks of the caller decide
                pass
            finally:
                os.close(fd)


def prepare_folder(folder):
    """Make ``folder`` (a folder the user chose, for files the bridge writes) as :func:`make_folders` does, and
    refuse it (ConfigurationError, with the ``chmod`` that fixes it) when other users may replace what is written
    there: a folder they may write, without the sticky bit of /tmp. The same rule as for reading a file
    (:func:`check_private_file`)."""
    folder = Path(folder)
    make_folders(folder)
    if not POSIX:
        return folder
    try:
        info = os.stat(folder)
    except OSError as exc:
        raise ConfigurationError(f"the folder {folder} cannot be used: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigurationError(f"{folder} is not a folder")
    if stat.S_IMODE(info.st_mode) & 0o022 and not info.st_mode & stat.S_ISVTX and keeps_modes(folder):
        raise ConfigurationError(
            f"refusing to write in {folder}: other users may write there (mode {stat.S_IMODE(info.st_mode):03o}), "
            f"and so replace what the bridge keeps; choose a folder of your own, or run  chmod go-w {folder}",
            fix=f"chmod go-w {folder}")
    return folder


#: file systems whose modes say nothing (a Windows disk seen from WSL: its ACL keeps others out, set by the client)
NO_MODES = frozenset({"9p", "drvfs", "v9fs"})


def keeps_modes(folder):
    """Whether the file system of ``folder`` keeps POSIX modes (from /proc/self/mounts; True where unknown)."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1:3] for line in f]
    except OSError:
        return True
    path = os.path.realpath(folder)
    found = max((m for m in mounts if path == m[0] or path.startswith(m[0].rstrip("/") + "/")),
                key=lambda m: len(m[0]), default=None)
    return found is None or found[1] not in NO_MODES


def check_private_folder(folder):
    """``folder`` if it is a real folder (not a link) of this user with mode 0700; else ConfigurationError."""
    folder = Path(folder)
    if not POSIX:
        return folder
    try:
        info = os.lstat(folder)
    except OSError as exc:
        raise ConfigurationError(f"the folder {folder} cannot be used: {exc.strerror}") from None
    why = None
    if stat.S_ISLNK(info.st_mode):
        why = "it is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        why = "it is not a folder"
    elif info.st_uid != os.getuid():
        why = f"it belongs to another user (uid {info.st_uid})"
    elif stat.S_IMODE(info.st_mode) & 0o077:
        why = f"other users have access to it (mode {stat.S_IMODE(info.st_mode):03o})"
    if why:
        raise ConfigurationError(
            f"refusing the folder {folder}: {why}. It must be this user's own, mode 0700; "
            f"if you did not make it, another user may have: remove it (rm -r {folder}) or choose another folder"
        )
    return folder


def runtime_folder(name="sklearn-gpu-bridge"):
    """A private folder of this user for sockets, local workers' files and logs.

    ``$XDG_RUNTIME_DIR/<name>`` where the system provides one (a 0700 tmpfs
    of the user); otherwise ``<temp>/<name>-<uid>``, made 0700 and checked.
    """
    base = os.environ.get("XDG_RUNTIME_DIR")
    if POSIX and base and os.path.isdir(base):
        return make_private_folder(Path(base) / name)
    suffix = os.getuid() if POSIX else os.environ.get("USERNAME", "user")
    return make_private_folder(Path(tempfile.gettempdir()) / f"{name}-{suffix}")


def socket_path(name):
    """A path for a Unix socket ``name`` in a private folder, short enough for ``sockaddr_un`` (107 bytes)."""
    for folder in (lambda: runtime_folder(), lambda: make_private_folder(Path("/tmp") / f"sgb-{os.getuid()}")):
        path = folder() / name
        if len(str(path)) <= 100:
            return path
    raise ConfigurationError(f"no private folder gives a socket path short enough for {name}; "
                             "set XDG_RUNTIME_DIR to a short folder of your own, or bind TCP (--bind 127.0.0.1)")


def doorbell_path(worker_socket):
    """Where a worker whose ZeroMQ socket is ``worker_socket`` has its doorbell: beside it, the same length."""
    return Path(worker_socket).with_suffix(".bell")


# ---------------------------------------------------------------- files


def _refuse_file(path, what, why, fix, command=None):
    raise ConfigurationError(f"refusing the {what} {path}: {why}; {fix}", fix=command)


def check_private_file(path, fd, what):
    """Refuse an open file that another user owns or may read or write, or that lies in a folder others may change.

    ``fd`` is the file as opened (without following links): the checks are on
    what was opened, not on a name that could be swapped afterwards.
    """
    if not POSIX:
        return
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        _refuse_file(path, what, "it is not a regular file", "give the path of the file itself")
    if info.st_uid != os.getuid():
        _refuse_file(path, what, f"it belongs to another user (uid {info.st_uid})",
                     "use a file of your own (another user could have written it)")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        _refuse_file(path, what, f"other users may read or write it (mode {mode:03o})", f"run  chmod 600 {path}",
                     f"chmod 600 {path}")
    parent = os.stat(Path(path).parent)
    if stat.S_IMODE(parent.st_mode) & 0o022 and not parent.st_mode & stat.S_ISVTX:
        _refuse_file(path, what, f"other users may replace it: its folder {Path(path).parent} is writable by them",
                     f"move it to a folder of your own, or run  chmod go-w {Path(path).parent}",
                     f"chmod go-w {Path(path).parent}")


def read_private_file(path, what):
    """The text of a secret file (a key, a connection file), after :func:`check_private_file`."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | CLOEXEC)
    except OSError as exc:
        if exc.errno is not None and os.path.islink(path):
            _refuse_file(path, what, "it is a symbolic link", "give the path of the file itself")
        raise
    with os.fdopen(fd, "rb") as f:
        check_private_file(path, f.fileno(), what)
        return f.read().decode()


def write_private_file(path, text):
    """Replace ``path`` with ``text``, owner-only (0600), atomically."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # created 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def open_append_private(path):
    """An owner-only log file opened for appending, never through a link (a binary file object)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW | CLOEXEC
                 | getattr(os, "O_BINARY", 0), 0o600)
    f = os.fdopen(fd, "ab")
    try:
        if POSIX and os.fstat(fd).st_uid != os.getuid():
            _refuse_file(path, "log file", "it belongs to another user", "remove it or choose another log file")
    except BaseException:
        f.close()
        raise
    return f


class ExclusiveLock:
    """An exclusive lock file (portable): made with O_EXCL; one left by a dead process is broken."""

    def __init__(self, path, timeout, what="the lock"):
        self.path, self.timeout, self.what = Path(path), timeout, what

    def __enter__(self):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | NOFOLLOW, 0o600)
            except FileExistsError:
                try:
                    holder = int(self.path.read_text() or 0)
                except (OSError, ValueError):
                    holder = 0
                if holder and not pid_alive(holder):
                    self.path.unlink(missing_ok=True)
                elif time.monotonic() > deadline:
                    raise TimeoutError(f"timed out waiting for {self.what} ({self.path}, held by pid {holder})") \
                        from None
                else:
                    time.sleep(0.05)
                continue
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            return self

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)


# ---------------------------------------------------------------- processes


def pid_alive(pid):
    """Whether a process of THIS user with this pid exists (without signalling it).

    A process of another user is not ours: it never keeps a lock, a local
    worker or a pool file of ours alive.
    """
    if type(pid) is not int or pid <= 0:
        return False
    if sys.platform == "win32":  # os.kill(pid, 0) would TERMINATE the process on Windows
        import ctypes

        kernel32 = ctypes.windll.kernel32
        handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return False
        code = ctypes.c_ulong()
        kernel32.GetExitCodeProcess(handle, ctypes.byref(code))
        kernel32.CloseHandle(handle)
        return code.value == 259  # STILL_ACTIVE
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or another user's
        return False
    try:  # root may signal anyone: the owner says whose it is
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # no /proc (macOS): the signal's answer is all there is


def process_start(pid):
    """When process ``pid`` started (from /proc), or None if it does not exist or /proc is absent."""
    if type(pid) is not int or pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        # the command name (field 2) may hold spaces and ")": fields 3.. follow its last ")"
        return data[data.rindex(b")") + 2 :].split()[19]  # field 22: start time
    except (OSError, ValueError, IndexError):
        return None


def exited(pid):
    """A local process has exited (a zombie nobody reaped counts as exited; our own child is reaped)."""
    if not pid_alive(pid):
        return True
    try:
        os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError, AttributeError):
        pass
    if not pid_alive(pid):
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def terminate(pid, wait=5.0, first=signal.SIGTERM):
    """``first`` (SIGTERM), then SIGKILL ``wait`` seconds later; whether the process is gone."""
    for sig in (first, getattr(signal, "SIGKILL", signal.SIGTERM)):
        try:
            os.kill(pid, sig)
        except OSError:  # gone meanwhile, or not ours
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if exited(pid):
                return True
            time.sleep(0.05)
    return exited(pid)
