"""The shape of the house: imports run one way, importing the package is cheap, every op is in the catalogue.

Read from the source (every import, at module level and inside functions, with ``ast``) and from
fresh interpreters; nothing here needs a worker.
"""

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sklearn_gpu_bridge
from sklearn_gpu_bridge import protocol
from sklearn_gpu_bridge.catalogue import ESTIMATORS

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "sklearn_gpu_bridge"
# repository folder -> import name (pyproject's package-dir)
FOLDERS = {"sklearn_gpu_bridge": PACKAGE, "worker": f"{PACKAGE}.worker", "shm": f"{PACKAGE}.shm"}

#: read by both sides: may import nothing of the client or the worker
SHARED_CORE = {
    "sklearn_gpu_bridge.version", "sklearn_gpu_bridge.errors", "sklearn_gpu_bridge.config", "sklearn_gpu_bridge.catalogue",
    "sklearn_gpu_bridge.translate", "sklearn_gpu_bridge.runtime.private_files", "sklearn_gpu_bridge.runtime.connection_file",
    "sklearn_gpu_bridge.runtime.keys", "sklearn_gpu_bridge.parallel", "sklearn_gpu_bridge.protocol",
    "sklearn_gpu_bridge.protocol.arrays", "sklearn_gpu_bridge.protocol.ops", "sklearn_gpu_bridge.protocol.session",
    "sklearn_gpu_bridge.transport.reply_slot", "sklearn_gpu_bridge.transport.rehearsal",
    "sklearn_gpu_bridge.shm", "sklearn_gpu_bridge.shm.pool", "sklearn_gpu_bridge.portable",
}
#: command-line entry points: may import both sides
ENTRY_POINTS = {"sklearn_gpu_bridge.cli", "sklearn_gpu_bridge.__main__", "sklearn_gpu_bridge.worker.__main__",
                "sklearn_gpu_bridge.accel.__main__"}
#: the one edge from the client side into the worker's: cuML in this process runs the worker's operations
IN_PROCESS = "sklearn_gpu_bridge.transport.inprocess"
ALLOWED_INTO_WORKER = {f"{PACKAGE}.worker.backends", f"{PACKAGE}.worker.dispatch", f"{PACKAGE}.worker.handles"}


def _modules():
    """{module name: path} of every module of the package, as installed."""
    found = {}
    for folder, name in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([name, *parts])] = path
    return found


MODULES = _modules()


def _imports(name, path):
    """The package's modules that ``name`` imports, at module level or inside its functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for stmt in ast.walk(ast.parse(path.read_text())):
        if isinstance(stmt, ast.Import):
            found.update(a.name for a in stmt.names)
        elif isinstance(stmt, ast.ImportFrom):
            base = stmt.module or ""
            if stmt.level:
                anchor = package.split(".")[: len(package.split(".")) - stmt.level + 1]
                base = ".".join(anchor + ([stmt.module] if stmt.module else []))
            submodules = {f"{base}.{a.name}" for a in stmt.names} & set(MODULES)
            found.update(submodules or {base})
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _side(name):
    if name in ENTRY_POINTS:
        return "entry"
    if name in SHARED_CORE:
        return "core"
    return "worker" if name.startswith(f"{PACKAGE}.worker") else "client"


def test_every_module_has_a_side():
    """A new module must be placed: shared core, client side, worker side, or an entry point."""
    assert {_side(name) for name in MODULES} <= {"core", "client", "worker", "entry"}
    assert SHARED_CORE <= set(MODULES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_run_one_way(name):
    side = _side(name)
    for imported in GRAPH[name]:
        other = _side(imported)
        if side == "core":
            assert other == "core", f"{name} (shared core) imports {imported} ({other} side)"
        elif side == "worker":
            assert other in ("core", "worker"), f"{name} (worker side) imports {imported} ({other} side)"
        elif side == "client":
            allowed = name == IN_PROCESS and imported in ALLOWED_INTO_WORKER
            assert other in ("core", "client") or allowed, f"{name} (client side) imports {imported} ({other} side)"


def test_the_in_process_path_is_the_one_edge_into_the_worker():
    """The client side reaches the worker's code only where cuML runs in this process, and only its operations."""
    edges = {(name, imported) for name in MODULES if _side(name) == "client"
             for imported in GRAPH[name] if _side(imported) == "worker"}
    assert edges == {(IN_PROCESS, m) for m in ALLOWED_INTO_WORKER}, edges


def test_no_import_loop():
    """No module reaches itself through its imports (a package's own submodules aside)."""
    def reach(start):
        seen, stack = set(), [start]
        while stack:
            for nxt in GRAPH[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    loops = []
    for name in MODULES:
        back = [m for m in reach(name) if name in reach(m) and not (m.startswith(name + ".") or name.startswith(m + "."))]
        if back:
            loops.append((name, sorted(back)))
    assert not loops, loops


def _fresh(code):
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT / "tests")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_importing_the_package_loads_no_worker_no_zmq_no_wrappers():
    loaded = _fresh(f"import json, sys, {PACKAGE}; print(json.dumps(sorted(sys.modules)))")
    ours = [m for m in loaded if m.startswith(PACKAGE)]
    assert not [m for m in ours if m.startswith(f"{PACKAGE}.worker")], ours
    assert "zmq" not in loaded and "sklearn" not in loaded and "cloudpickle" not in loaded
    assert not [m for m in ours if m.startswith(f"{PACKAGE}.estimators.")], ours  # no wrapper module yet


def test_a_wrapper_loads_on_first_use_and_still_no_worker():
    loaded = _fresh(f"import json, sys, {PACKAGE}; {PACKAGE}.GPUSVC; print(json.dumps(sorted(sys.modules)))")
    assert f"{PACKAGE}.estimators.svm" in loaded and f"{PACKAGE}.estimators.cluster" not in loaded
    assert not [m for m in loaded if m.startswith(f"{PACKAGE}.worker")]


def test_the_package_names_every_wrapper():
    assert {f"GPU{name}" for name in ESTIMATORS} <= set(sklearn_gpu_bridge.__all__)
    assert {f"GPU{name}" for name in ESTIMATORS} <= set(dir(sklearn_gpu_bridge))
    with pytest.raises(AttributeError):
        sklearn_gpu_bridge.GPUNoSuchThing  # noqa: B018


def test_every_op_the_worker_answers_is_in_the_catalogue():
    """The worker's two tables, its quick ops and the work ops (worker/dispatch.py), are the catalogue exactly."""
    from sklearn_gpu_bridge.worker.dispatch import WORK
    from sklearn_gpu_bridge.worker.server import Worker

    assert not set(Worker.QUICK) & set(WORK)
    assert set(Worker.QUICK) | set(WORK) == set(protocol.OPS)
    assert set(Worker.QUICK) == protocol.QUICK_OPS and set(WORK) == protocol.WORK_OPS
    assert protocol.QUICK_OPS | protocol.WORK_OPS == set(protocol.OPS)
    for name, op in protocol.OPS.items():
        assert op.kind in ("quick", "work") and op.request and op.reply, name


def test_every_op_the_client_sends_is_in_the_catalogue():
    source = "\n".join(MODULES[m].read_text() for m in MODULES if _side(m) in ("client", "entry"))
    sent = {node.values[i + 1].value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Dict)
            for i, key in enumerate(node.keys[:-1]) if isinstance(key, ast.Constant) and key.value == "op"
            if isinstance(node.values[i + 1], ast.Constant)}
    sent |= {node.args[1].value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "quick_request"
             and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)}
    assert sent and sent <= set(protocol.OPS), sent - set(protocol.OPS)


def test_docs_list_every_op():
    text = (ROOT / "docs" / "protocol.md").read_text()
    assert all(f"`{name}`" in text for name in protocol.OPS)


def test_the_worker_reads_the_same_environment_variables_from_both_entry_points(tmp_path):
    """``sklearn-gpu-bridge worker`` and ``python -m sklearn_gpu_bridge.worker``: SKLEARN_GPU_BRIDGE_WORKER_<OPTION>."""
    env = {"SKLEARN_GPU_BRIDGE_WORKER_BIND": "192.0.2.1", "PATH": "/usr/bin:/bin"}
    for argv in ([sys.executable, "-m", f"{PACKAGE}.worker"], [sys.executable, "-m", PACKAGE, "worker"]):
        run = subprocess.run([*argv, "--backend", "sklearn", "--connection-file", str(tmp_path / "w.json")],
                             capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert run.returncode != 0 and "binding 192.0.2.1 (not loopback) needs CurveZMQ" in run.stderr, run.stderr


def test_one_table_of_defaults():
    from sklearn_gpu_bridge.config import DEFAULTS, WORKER_DEFAULTS
    from sklearn_gpu_bridge.transport.remote import RemoteTransport
    from sklearn_gpu_bridge.worker.server import Worker

    connection = inspect.signature(RemoteTransport).parameters
    for name in ("heartbeat_timeout", "array_cache", "cache_min_bytes", "pool"):
        assert connection[name].default == DEFAULTS[name], name
    worker = inspect.signature(Worker).parameters
    # the backend's, the log's, and the command's choice of a process per GPU
    for name in set(WORKER_DEFAULTS) - {"backend", "device_memory", "log_level", "gpu_processes"}:
        assert worker[name].default == WORKER_DEFAULTS[name], name


def test_a_checkout_imports_in_place_worker_and_shm_included():
    """``python -m sklearn_gpu_bridge.accel script.py`` in the repository's root imports the checkout itself (the
    current folder comes first on sys.path), whose worker/ and shm/ sit beside the package's folder. Run without
    site (``-S``), so that no installed or editable copy of the package answers instead."""
    import numpy

    libraries = str(Path(numpy.__file__).parent.parent)  # numpy, msgpack ...: the test environment's own
    code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {libraries!r}]; "
            "import json, sklearn_gpu_bridge.shm.pool as pool, sklearn_gpu_bridge.worker.dispatch as dispatch; "
            "print(json.dumps([pool.__file__, dispatch.__file__]))")
    run = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [str(ROOT / "shm" / "pool.py"), str(ROOT / "worker" / "dispatch.py")]
