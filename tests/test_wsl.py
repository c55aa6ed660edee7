"""The Windows-only pieces as plain functions, with Windows simulated (no Windows machine here).

The whole ``start --wsl`` path runs for real in tests/test_service.py, through
a stand-in ``wsl.exe`` that parses the command line the way WSL documents it.
"""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sklearn_gpu_bridge.manage import wsl
from sklearn_gpu_bridge.manage.service import worker_argv
from sklearn_gpu_bridge.runtime.private_files import make_private_folder, windows_user


@pytest.mark.parametrize("windows, linux", [
    (r"C:\Users\Ada Lovelace\AppData\Local\sklearn-gpu-bridge\pool",
     "/mnt/c/Users/Ada Lovelace/AppData/Local/sklearn-gpu-bridge/pool"),
    ("D:/data/x.npy", "/mnt/d/data/x.npy"),
    ("c:\\", "/mnt/c"),
    ("E:", "/mnt/e"),
    (r"\\wsl.localhost\Ubuntu-24.04\home\ada\.cache\sklearn-gpu-bridge\pool",
     "/home/ada/.cache/sklearn-gpu-bridge/pool"),
    (r"\\wsl$\Ubuntu\tmp", "/tmp"),
    ("//wsl.localhost/Ubuntu/home/ada", "/home/ada"),
    ("/home/ada/already/linux", "/home/ada/already/linux"),
])
def test_windows_to_wsl(windows, linux):
    assert wsl.windows_to_wsl(windows) == linux


def test_windows_to_wsl_with_a_moved_automount_root():
    assert wsl.windows_to_wsl(r"C:\Users\ada", mount_root="/") == "/c/Users/ada"
    assert wsl.windows_to_wsl(r"C:\Users\ada", mount_root="/win/") == "/win/c/Users/ada"


@pytest.mark.parametrize("bad", ["relative\\path", r"\\server\share\x", "1:\\x", ""])
def test_windows_to_wsl_refuses_what_it_cannot_translate(bad):
    with pytest.raises(ValueError):
        wsl.windows_to_wsl(bad)


@pytest.mark.parametrize("linux, distro, windows", [
    ("/mnt/c/Users/ada/AppData/Local/sklearn-gpu-bridge", "Ubuntu", r"C:\Users\ada\AppData\Local\sklearn-gpu-bridge"),
    ("/mnt/d", "Ubuntu", "D:\\"),
    ("/home/ada/.cache/sklearn-gpu-bridge/pool", "Ubuntu-24.04",
     r"\\wsl.localhost\Ubuntu-24.04\home\ada\.cache\sklearn-gpu-bridge\pool"),
    ("/mnt/wsl/shared", "Debian", r"\\wsl.localhost\Debian\mnt\wsl\shared"),  # not a drive letter
])
def test_wsl_to_windows(linux, distro, windows):
    assert wsl.wsl_to_windows(linux, distro) == windows


def test_paths_round_trip_both_ways():
    for linux in ("/mnt/c/Users/ada/x", "/home/ada/.cache/pool", "/tmp"):
        assert wsl.windows_to_wsl(wsl.wsl_to_windows(linux, "Ubuntu")) == linux
    assert wsl.unc_distro(wsl.wsl_to_windows("/home/ada", "Ubuntu-24.04")) == "Ubuntu-24.04"
    assert wsl.is_unc_wsl_path(r"\\wsl.localhost\Ubuntu\home") and not wsl.is_unc_wsl_path(r"C:\x")


def test_wsl_to_windows_needs_the_distro_for_the_wsl_disk():
    with pytest.raises(ValueError, match="distribution"):
        wsl.wsl_to_windows("/home/ada", None)
    with pytest.raises(ValueError):
        wsl.wsl_to_windows("relative/path", "Ubuntu")


def test_wsl_command_line_runs_the_worker_without_a_shell():
    argv = worker_argv("/home/ada/venv/bin/python", backend="cuml",
                       connection_file="/mnt/c/Users/Ada Lovelace/AppData/Local/sklearn-gpu-bridge/worker.json",
                       pool_dirs=["/dev/shm", "/mnt/c/Users/Ada Lovelace/AppData/Local/sklearn-gpu-bridge/pool"])
    command = wsl.wsl_command(argv, distro="Ubuntu-24.04", wsl_exe=r"C:\Windows\System32\wsl.exe")
    assert command[:6] == [r"C:\Windows\System32\wsl.exe", "-d", "Ubuntu-24.04", "--cd", "~", "--exec"]
    assert command[6:9] == ["/home/ada/venv/bin/python", "-m", "sklearn_gpu_bridge.worker"]
    connection_file = command[command.index("--connection-file") + 1]
    assert connection_file.endswith("Ada Lovelace/AppData/Local/sklearn-gpu-bridge/worker.json")
    assert command.count("--pool-dir") == 2
    # what CreateProcess receives: paths with spaces quoted, nothing for a shell to expand
    line = subprocess.list2cmdline(command)
    assert '"/mnt/c/Users/Ada Lovelace/AppData/Local/sklearn-gpu-bridge/worker.json"' in line
    assert wsl.wsl_command(["true"])[:3] == ["wsl.exe", "--cd", "~"]  # WSL's default distribution
    # no shell expands "~" under --exec: a home-relative program runs relative to the home it starts in
    assert wsl.wsl_command(["~/venv/bin/python", "-V"])[-3:] == ["--exec", "venv/bin/python", "-V"]
    assert wsl.wsl_command(["~/venv/bin/python"], cd=None)[-1] == "~/venv/bin/python"


def test_probe_argument_survives_any_quoting(tmp_path):
    source = 'import sys\nprint("it\'s \\"quoted\\" %PATH% $HOME `x` ^&|<>")\n'
    argv = wsl.python_code_argv(sys.executable, source)
    assert set(argv[2]) <= set("exc(bytes.fromhx'0123456789abcdef)")
    assert subprocess.list2cmdline(argv[1:]) == " ".join(argv[1:])  # nothing to quote on Windows
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert out == 'it\'s "quoted" %PATH% $HOME `x` ^&|<>\n'


def test_probe_reports_the_environment_and_makes_folders(tmp_path):
    source = wsl.probe_source(Path(wsl.__file__).with_name("probe_script.py").read_text(),
                              {"cuml": True, "gpu": True, "mkdirs": [str(tmp_path / "a" / "b")],
                               "wslpath": ["C:\\Users"]})
    hostile_umask = "import os; os.umask(0); "  # the folders it makes, parents included, are private anyway
    argv = wsl.python_code_argv(sys.executable, hostile_umask + source)
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700 and (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700
    assert report["versions"]["sklearn_gpu_bridge"] and report["versions"]["numpy"]
    assert "cuml" in report["versions"] or "cuml" in report["errors"]
    assert (tmp_path / "a" / "b").is_dir() and report["mkdirs"] == {str(tmp_path / "a" / "b"): None}
    assert "C:\\Users" in report["wslpath"]  # None here: no wslpath outside WSL
    assert "gpus" in report


def test_decode_output_of_wsl_exe():
    assert wsl.decode_output("Ubuntu\r\n".encode("utf-16-le")) == "Ubuntu\r\n"
    assert wsl.decode_output(b"\xff\xfe" + "Debian".encode("utf-16-le")) == "Debian"
    assert wsl.decode_output("caf\u00e9 {}".encode()) == "caf\u00e9 {}"
    assert wsl.decode_output(b"") == ""


def test_parse_list_verbose():
    text = ("  NAME                   STATE           VERSION\r\n"
            "* Ubuntu-24.04           Running         2\r\n"
            "  docker-desktop         Stopped         2\r\n"
            "  Legacy                 Stopped         1\r\n")
    rows = wsl.parse_list_verbose(wsl.decode_output(text.encode("utf-16-le")))
    assert rows == [
        {"name": "Ubuntu-24.04", "state": "Running", "version": 2, "default": True},
        {"name": "docker-desktop", "state": "Stopped", "version": 2, "default": False},
        {"name": "Legacy", "state": "Stopped", "version": 1, "default": False},
    ]
    german = "  NAME      STATUS       VERSION\n* Ubuntu    Wird ausgeführt   2\n"
    assert wsl.parse_list_verbose(german)[0]["name"] == "Ubuntu"
    assert wsl.parse_list_verbose("Windows Subsystem for Linux has no installed distributions.\n") == []


def test_autostart_command_uses_pythonw_and_quotes():
    command = wsl.autostart_command(r"C:\Program Files\Python312\python.exe",
                                    ["--wsl", "--distro", "Ubuntu-24.04", "--python", "/home/ada/venv/bin/python"])
    assert command == (r'"C:\Program Files\Python312\pythonw.exe" -m sklearn_gpu_bridge start --wsl '
                       r"--distro Ubuntu-24.04 --python /home/ada/venv/bin/python")
    assert wsl.pythonw_for(r"C:\venv\Scripts\pythonw.exe") == r"C:\venv\Scripts\pythonw.exe"


class FakeWinreg:
    """The few winreg calls the autostart uses, over a dict: HKCU only."""

    HKEY_CURRENT_USER = "HKCU"
    REG_SZ = 1
    KEY_SET_VALUE = 2

    def __init__(self):
        self.keys = {}

    class _Key:
        def __init__(self, values):
            self.values = values

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def CreateKey(self, root, path):  # noqa: N802 - winreg's names
        assert root == self.HKEY_CURRENT_USER  # never HKEY_LOCAL_MACHINE: no admin rights needed
        return self._Key(self.keys.setdefault(path, {}))

    def OpenKey(self, root, path, reserved=0, access=0):  # noqa: N802
        assert root == self.HKEY_CURRENT_USER
        if path not in self.keys:
            raise FileNotFoundError(path)
        return self._Key(self.keys[path])

    def SetValueEx(self, key, name, reserved, kind, value):  # noqa: N802
        assert kind == self.REG_SZ
        key.values[name] = value

    def QueryValueEx(self, key, name):  # noqa: N802
        if name not in key.values:
            raise FileNotFoundError(name)
        return key.values[name], self.REG_SZ

    def DeleteValue(self, key, name):  # noqa: N802
        if name not in key.values:
            raise FileNotFoundError(name)
        del key.values[name]


def test_autostart_install_read_remove():
    registry = FakeWinreg()
    assert wsl.read_autostart(registry) is None
    where = wsl.install_autostart('"C:\\py\\pythonw.exe" -m sklearn_gpu_bridge start --wsl', registry)
    assert where == r"HKEY_CURRENT_USER\Software\Microsoft\Windows\CurrentVersion\Run\sklearn-gpu-bridge"
    assert registry.keys[wsl.RUN_KEY] == {
        "sklearn-gpu-bridge": '"C:\\py\\pythonw.exe" -m sklearn_gpu_bridge start --wsl'}
    wsl.install_autostart("again", registry)  # replaces, never duplicates
    assert wsl.read_autostart(registry) == "again"
    assert wsl.remove_autostart(registry) is True
    assert wsl.remove_autostart(registry) is False
    assert wsl.read_autostart(registry) is None


@pytest.mark.skipif(sys.platform == "win32", reason="checks the message off Windows")
def test_autostart_off_windows_says_what_it_is_for():
    with pytest.raises(OSError, match="for Windows"):
        wsl.install_autostart("x")


def test_autostart_cli_writes_the_run_key(monkeypatch):
    from click.testing import CliRunner

    from sklearn_gpu_bridge import cli

    registry = FakeWinreg()
    monkeypatch.setattr(wsl, "_winreg", lambda: registry)
    monkeypatch.setattr(sys, "executable", r"C:\Users\ada\AppData\Local\Programs\Python\Python312\python.exe")
    runner = CliRunner()
    result = runner.invoke(cli.main,
                           ["autostart", "install", "--distro", "Ubuntu", "--python", "/home/ada/v/bin/python"],
                           env={"SKLEARN_GPU_BRIDGE_AUTOSTART_INSTALL_BACKEND": "cuml"})
    assert result.exit_code == 0, result.output
    command = registry.keys[wsl.RUN_KEY]["sklearn-gpu-bridge"]
    pythonw = r"C:\Users\ada\AppData\Local\Programs\Python\Python312\pythonw.exe"
    assert command.startswith(pythonw + " -m sklearn_gpu_bridge start --wsl")
    assert "--backend cuml" in command and "--distro Ubuntu" in command and "--python /home/ada/v/bin/python" in command
    result = runner.invoke(cli.main, ["autostart", "remove"])
    assert result.exit_code == 0 and "removed" in result.output
    assert registry.keys[wsl.RUN_KEY] == {}


# ---------------------------------------------------------------- owner-only folders on Windows


@pytest.fixture
def stand_in_icacls(tmp_path, monkeypatch):
    """An ``icacls`` first on PATH that records its arguments and exits with $ICACLS_EXIT."""
    bin_dir, log = tmp_path / "bin", tmp_path / "icacls.log"
    bin_dir.mkdir()
    script = bin_dir / "icacls"
    script.write_text(f"#!{sys.executable}\n"
                      "import json, os, sys\n"
                      f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                      "if os.environ.get('ICACLS_EXIT', '0') != '0':\n"
                      "    sys.stderr.write('Access is denied.')\n"
                      "sys.exit(int(os.environ.get('ICACLS_EXIT', '0')))\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("USERNAME", "ada")
    monkeypatch.setenv("USERDOMAIN", "LAPTOP")
    return log


def test_windows_user_is_named_as_icacls_names_accounts():
    assert windows_user({"USERNAME": "ada", "USERDOMAIN": "LAPTOP"}) == "LAPTOP\\ada"
    assert windows_user({"USERNAME": "ada"}) == "ada"


def test_a_private_folder_on_windows_is_left_to_its_user_alone(tmp_path, stand_in_icacls):
    folder = make_private_folder(tmp_path / "sklearn-gpu-bridge", windows=True)
    assert folder.is_dir()
    calls = [json.loads(line) for line in stand_in_icacls.read_text().splitlines()]
    assert calls == [[str(folder), "/inheritance:r", "/grant:r", "LAPTOP\\ada:(OI)(CI)F"]]


def test_a_folder_that_cannot_be_made_private_is_an_error_naming_the_command(tmp_path, stand_in_icacls, monkeypatch):
    monkeypatch.setenv("ICACLS_EXIT", "5")
    with pytest.raises(OSError, match=r"icacls .*/inheritance:r.*Access is denied"):
        make_private_folder(tmp_path / "x", windows=True)


def test_a_private_folder_elsewhere_is_mode_0700_and_runs_no_icacls(tmp_path, stand_in_icacls):
    folder = make_private_folder(tmp_path / "a" / "b", windows=False)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert not stand_in_icacls.exists()
