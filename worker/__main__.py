"""``python -m sklearn_gpu_bridge.worker``: the same as ``sklearn-gpu-bridge worker``, the same environment variables."""

from sklearn_gpu_bridge.cli import worker
from sklearn_gpu_bridge.config import WORKER_ENV_PREFIX

if __name__ == "__main__":
    worker(prog_name="python -m sklearn_gpu_bridge.worker", auto_envvar_prefix=WORKER_ENV_PREFIX)
