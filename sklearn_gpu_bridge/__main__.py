"""``python -m sklearn_gpu_bridge``: the same as the ``sklearn-gpu-bridge`` command.

The autostart entry on Windows runs this with ``pythonw.exe``, which opens no window.
"""

from sklearn_gpu_bridge.cli import ENVVAR_PREFIX, main

if __name__ == "__main__":
    main(prog_name="sklearn-gpu-bridge", auto_envvar_prefix=ENVVAR_PREFIX)
