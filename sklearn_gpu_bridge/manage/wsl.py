"""Windows and WSL2, kept thin: paths across the boundary, ``wsl.exe`` command lines, the autostart entry.

Everything here is a plain function of its arguments (no platform check
inside, no process started) except :func:`run`, :func:`install_autostart`
and :func:`remove_autostart`; so the tests run them on Linux with the
platform simulated.

Facts this module relies on (Microsoft's WSL issue tracker):

- a Linux process keeps its distribution alive only while it is parented to
  a ``wsl.exe`` session (microsoft/WSL#9401, #8661): a daemon detached inside
  WSL is stopped some seconds after the last ``wsl.exe`` exits. So the worker
  runs in the foreground of a ``wsl.exe`` that this package starts hidden
  and detached on the Windows side, and that stays alive as long as the
  worker does.
- WSL2 forwards Windows' 127.0.0.1 to a Linux listener bound to 127.0.0.1
  or 0.0.0.0 (microsoft/WSL#10206), so the worker's address in the
  connection file is valid on Windows as written.
- ``wsl.exe`` writes its own messages (``-l``, errors) in UTF-16-LE, while
  a Linux program's output passes through as the bytes it wrote.
"""

import json
import ntpath
import posixpath
import re
import subprocess

DEFAULT_MOUNT_ROOT = "/mnt/"
UNC_HOST = "wsl.localhost"  # \\wsl$ is the older name of the same share
# Windows process creation flags (subprocess defines them only on Windows)
CREATE_NEW_PROCESS_GROUP = 0x00000200
CREATE_NO_WINDOW = 0x08000000
DETACHED_FLAGS = CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW
# HKEY_CURRENT_USER\<RUN_KEY>: programs started at logon of this user; no admin rights needed
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"
RUN_VALUE = "sklearn-gpu-bridge"

_DRIVE = re.compile(r"^([A-Za-z]):(?:[\\/](.*))?$")
_UNC = re.compile(r"^[\\/]{2}(wsl\.localhost|wsl\$)[\\/]([^\\/]+)(?:[\\/](.*))?$", re.IGNORECASE)


# ---------------------------------------------------------------- paths


def windows_to_wsl(path, mount_root=DEFAULT_MOUNT_ROOT):
    r"""The Linux path under which WSL2 sees a Windows path.

    ``C:\Users\me\x`` -> ``/mnt/c/Users/me/x`` (drvfs, the default automount
    root; ``wslpath -u`` inside WSL is exact when ``/etc/wsl.conf`` moves it);
    ``\\wsl.localhost\Ubuntu\home\me`` -> ``/home/me`` (a path on the WSL disk
    itself). A path that is already a Linux one is returned unchanged.
    """
    path = str(path)
    if path.startswith("/") and not path.startswith("//"):
        return path
    unc = _UNC.match(path)
    if unc:
        rest = (unc.group(3) or "").replace("\\", "/").strip("/")
        return "/" + rest
    drive = _DRIVE.match(path)
    if not drive:
        raise ValueError(f"{path!r} is neither an absolute Windows path (C:\\...) nor a \\\\wsl.localhost path")
    rest = (drive.group(2) or "").replace("\\", "/").strip("/")
    root = mount_root.rstrip("/") + "/" + drive.group(1).lower()
    return posixpath.join(root, rest) if rest else root


def wsl_to_windows(path, distro, mount_root=DEFAULT_MOUNT_ROOT, host=UNC_HOST):
    r"""The Windows path of a Linux path of ``distro``.

    ``/mnt/c/Users/me`` -> ``C:\Users\me`` (a Windows disk seen from WSL);
    anything else -> ``\\wsl.localhost\<distro>\home\me`` (the WSL disk, through
    the 9P file server that Windows mounts as a network share).
    """
    path = posixpath.normpath(str(path))
    if not path.startswith("/"):
        raise ValueError(f"{path!r} is not an absolute Linux path")
    root = mount_root.rstrip("/") + "/"
    if path.startswith(root):
        drive, _, rest = path[len(root):].partition("/")
        if len(drive) == 1 and drive.isalpha():
            return ntpath.join(drive.upper() + ":\\", rest.replace("/", "\\"))
    if not distro:
        raise ValueError("a path on the WSL disk needs the distribution's name")
    return f"\\\\{host}\\{distro}" + path.replace("/", "\\")


def is_unc_wsl_path(path):
    return _UNC.match(str(path)) is not None


def unc_distro(path):
    """The distribution named by a ``\\\\wsl.localhost\\<distro>\\...`` path, else None."""
    match = _UNC.match(str(path))
    return match.group(2) if match else None


# ---------------------------------------------------------------- wsl.exe command lines


def wsl_command(argv, *, distro=None, cd="~", wsl_exe="wsl.exe", user=None):
    """``wsl.exe [-d DISTRO] [-u USER] [--cd DIR] --exec ARGV...``: runs ARGV without a Linux shell.

    ``--exec`` hands the arguments to the program as they are (no shell to
    expand or split them); ``--cd ~`` starts in the Linux home, never in the
    Windows folder the command was typed in (a checkout there could shadow
    the installed package).
    """
    argv = [str(a) for a in argv]
    if cd == "~" and argv and argv[0].startswith("~/"):
        argv[0] = argv[0][2:]  # no shell expands "~" under --exec; relative to the home it starts in
    command = [str(wsl_exe)]
    if distro:
        command += ["-d", distro]
    if user:
        command += ["-u", user]
    if cd:
        command += ["--cd", cd]
    return command + ["--exec", *argv]


def python_code_argv(python, source):
    """``python -c exec(bytes.fromhex('...'))``: a script whose one argument holds only [0-9a-f()'.].

    No quoting rule of Windows, of wsl.exe or of a shell can change it.
    """
    return [python, "-c", f"exec(bytes.fromhex('{source.encode().hex()}'))"]


def probe_source(module_source, params):
    """The probe module's source, preceded by its parameters (plain values) as ``SGB_PARAMS``."""
    json.dumps(params)  # plain values only: their repr is a Python literal
    return f"SGB_PARAMS = {params!r}\n{module_source}"


def decode_output(data):
    """Text of wsl.exe's output: its own messages are UTF-16-LE, a Linux program's are UTF-8."""
    if not data:
        return ""
    if data.startswith(b"\xff\xfe"):
        data = data[2:]
        return data.decode("utf-16-le", errors="replace")
    if len(data) >= 2 and data.count(b"\x00") >= len(data) // 3:
        return data.decode("utf-16-le", errors="replace")
    return data.decode("utf-8", errors="replace")


def parse_list_verbose(text):
    """Rows of ``wsl.exe -l -v``: [{"name", "state", "version", "default"}].

    The output looks like this, in the system's language (so read by position)::

          NAME            STATE           VERSION
        * Ubuntu-24.04    Running         2
          docker-desktop  Stopped         2
    """
    rows = []
    lines = [line.rstrip() for line in text.replace("\r", "").split("\n") if line.strip()]
    for line in lines[1:]:  # the first line is the (translated) heading
        default = line.lstrip().startswith("*")
        parts = line.replace("*", " ", 1).split()
        if len(parts) < 3 or not parts[-1].isdigit():
            continue
        # a distribution's name has no spaces; a translated state may ("Wird ausgeführt")
        rows.append({"name": parts[0], "state": " ".join(parts[1:-1]), "version": int(parts[-1]),
                     "default": default})
    return rows


def run(argv, timeout, cwd=None):
    """Run a wsl.exe command line; (returncode, stdout text, stderr text)."""
    done = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)
    return done.returncode, decode_output(done.stdout), decode_output(done.stderr)


# ---------------------------------------------------------------- autostart


def pythonw_for(python):
    r"""The console-less ``pythonw.exe`` next to ``python.exe`` (no window flashes at logon)."""
    folder, name = ntpath.split(str(python))
    if name.lower() == "python.exe":
        return ntpath.join(folder, "pythonw.exe")
    return str(python)


def autostart_command(python, start_args):
    """The command line that the Run key holds: ``"...\\pythonw.exe" -m sklearn_gpu_bridge start ...``."""
    return subprocess.list2cmdline([pythonw_for(python), "-m", "sklearn_gpu_bridge", "start", *start_args])


def install_autostart(command, winreg=None):
    """Write the per-user Run entry (HKEY_CURRENT_USER: no administrator rights)."""
    winreg = winreg or _winreg()
    with winreg.CreateKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
        winreg.SetValueEx(key, RUN_VALUE, 0, winreg.REG_SZ, command)
    return f"HKEY_CURRENT_USER\\{RUN_KEY}\\{RUN_VALUE}"


def read_autostart(winreg=None):
    """The command line of the Run entry, or None."""
    winreg = winreg or _winreg()
    try:
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
            return winreg.QueryValueEx(key, RUN_VALUE)[0]
    except FileNotFoundError:
        return None


def remove_autostart(winreg=None):
    """Delete the Run entry; True if there was one."""
    winreg = winreg or _winreg()
    try:
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key:
            winreg.DeleteValue(key, RUN_VALUE)
    except FileNotFoundError:
        return False
    return True


def _winreg():
    try:
        import winreg
    except ImportError:
        raise OSError("autostart is for Windows (it writes the current user's Run key)") from None
    return winreg
