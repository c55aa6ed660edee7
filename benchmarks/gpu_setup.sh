#!/usr/bin/env bash
# On the GPU machine, from the checkout, after `bash .gpu-wheels/install.sh install` (../shared/gpu/README.md).
# Installs this project beside cuML in /tmp/gpu-site, with the wheels carried in .gpu-wheels/extra (blake3,
# msgpack, pytest-timeout, Dask's); a client site without cuML in /tmp/client-site (pyzmq, blake3, msgpack and
# this project), for accel; and copies tests/, benchmarks/ and setup.cfg to /tmp/run. Run on_gpu.sh from
# /tmp/run, so that the checkout's own package folder does not shadow the installed one.
set -euo pipefail
SITE=/tmp/gpu-site
PIP=(python3 -m pip install -q --no-deps --no-build-isolation --no-index)
if [ -d .gpu-wheels/extra ]; then
  "${PIP[@]}" --target "$SITE" .gpu-wheels/extra/*.whl
fi
"${PIP[@]}" --target "$SITE" .
rm -rf /tmp/client-site && mkdir -p /tmp/client-site
cp -r "$SITE"/zmq "$SITE"/pyzmq* "$SITE"/blake3* "$SITE"/msgpack* /tmp/client-site/
"${PIP[@]}" --target /tmp/client-site .
rm -rf /tmp/run && mkdir -p /tmp/run && cp -r tests benchmarks setup.cfg /tmp/run/
PYTHONPATH=$SITE python3 -c "import cuml, sklearn_gpu_bridge; print('cuml', cuml.__version__)"
PYTHONPATH=$SITE python3 -c "import dask_cuda; print('dask-cuda', dask_cuda.__version__)" || echo "no dask-cuda"
nvidia-smi -L
