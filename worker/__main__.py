"""``python -m sklearn_gpu_bridge.worker``: the same as ``sklearn-gpu-bridge worker``."""

from sklearn_gpu_bridge.cli import worker

if __name__ == "__main__":
    worker(prog_name="python -m sklearn_gpu_bridge.worker", auto_envvar_prefix="SKLEARN_GPU_BRIDGE")
