#!/usr/bin/env bash
# On the GPU machine, from the checkout, after `bash .gpu-wheels/install.sh install`
# (../shared/gpu/README.md): this project installed beside cuML in /tmp/gpu-site
# (with Dask's wheels where .gpu-wheels/extra was carried), the tree before a change
# in /tmp/before-site (where .gpu-wheels/before.tar, a `git archive`, was carried), a
# client environment without cuML in /tmp/client-site (pyzmq and this project only),
# and /tmp/run holding tests/, benchmarks/ and setup.cfg (run from there, so that the
# checkout's own package folders do not shadow the installed ones).
set -euo pipefail
SITE=/tmp/gpu-site
PIP=(python3 -m pip install -q --no-deps --no-build-isolation --no-index)
if [ -d .gpu-wheels/extra ]; then
  "${PIP[@]}" --target "$SITE" .gpu-wheels/extra/*.whl
  PYTHONPATH=$SITE python3 -c "import cuda.core" 2>/dev/null || "${PIP[@]}" --target "$SITE" .gpu-wheels/extra/cuda/*.whl
fi
"${PIP[@]}" --target "$SITE" .
if [ -f .gpu-wheels/before.tar ]; then
  rm -rf /tmp/before-src /tmp/before-site && mkdir -p /tmp/before-src
  tar xf .gpu-wheels/before.tar -C /tmp/before-src && "${PIP[@]}" --target /tmp/before-site /tmp/before-src
fi
rm -rf /tmp/client-site && mkdir -p /tmp/client-site
cp -r "$SITE"/zmq "$SITE"/pyzmq* /tmp/client-site/ && "${PIP[@]}" --target /tmp/client-site .
rm -rf /tmp/run && mkdir -p /tmp/run && cp -r tests benchmarks setup.cfg /tmp/run/
PYTHONPATH=$SITE python3 -c "import cuml, sklearn_gpu_bridge; print('cuml', cuml.__version__)"
PYTHONPATH=$SITE python3 -c "import dask_cuda, distributed; print('dask-cuda', dask_cuda.__version__, 'distributed', distributed.__version__)" || true
nvidia-smi -L
