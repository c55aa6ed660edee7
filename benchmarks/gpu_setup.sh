#!/usr/bin/env bash
# On the GPU machine, from the checkout, after `bash .gpu-wheels/install.sh install`
# (../shared/gpu/README.md): this project installed beside cuML in /tmp/gpu-site
# (with the wheels of .gpu-wheels/extra where it was carried: blake3, msgpack, pytest-timeout; Dask's; py-spy in /tmp/pyspy), the trees before a
# change in /tmp/before-site and /tmp/before-NAME-site (where .gpu-wheels/before.tar and
# before-NAME.tar, `git archive`s, were carried), a client environment without cuML in
# /tmp/client-site (pyzmq, blake3, msgpack and this project only),
# and /tmp/run holding tests/, benchmarks/ and setup.cfg (run from there, so that the
# checkout's own package folders do not shadow the installed ones). Both are copies made once: a
# later call's checkout (an edited stage of on_gpu.sh, a changed module) reaches them only if
# this script runs again in that call.
set -euo pipefail
SITE=/tmp/gpu-site
PIP=(python3 -m pip install -q --no-deps --no-build-isolation --no-index)
if [ -d .gpu-wheels/extra ]; then
  # py-spy is a binary in bin/, which pip --target does not write into an existing bin/ (cuML's wheels make one)
  spy=(.gpu-wheels/extra/py_spy-*.whl)
  [ -f "${spy[0]}" ] && rm -rf /tmp/pyspy && "${PIP[@]}" --target /tmp/pyspy "${spy[@]}"
  "${PIP[@]}" --target "$SITE" $(ls .gpu-wheels/extra/*.whl | grep -v /py_spy-)
  if [ -d .gpu-wheels/extra/cuda ]; then
    PYTHONPATH=$SITE python3 -c "import cuda.core" 2>/dev/null || "${PIP[@]}" --target "$SITE" .gpu-wheels/extra/cuda/*.whl
  fi
fi
"${PIP[@]}" --target "$SITE" .
for tree in .gpu-wheels/before*.tar; do
  [ -f "$tree" ] || continue
  name=$(basename "$tree" .tar)
  rm -rf "/tmp/$name-src" "/tmp/$name-site" && mkdir -p "/tmp/$name-src"
  tar xf "$tree" -C "/tmp/$name-src" && "${PIP[@]}" --target "/tmp/$name-site" "/tmp/$name-src"
done
rm -rf /tmp/client-site && mkdir -p /tmp/client-site
cp -r "$SITE"/zmq "$SITE"/pyzmq* "$SITE"/blake3* "$SITE"/msgpack* /tmp/client-site/ && "${PIP[@]}" --target /tmp/client-site .
rm -rf /tmp/run && mkdir -p /tmp/run && cp -r tests benchmarks setup.cfg /tmp/run/
PYTHONPATH=$SITE python3 -c "import cuml, sklearn_gpu_bridge; print('cuml', cuml.__version__)"
PYTHONPATH=$SITE python3 -c "import dask_cuda, distributed; print('dask-cuda', dask_cuda.__version__, 'distributed', distributed.__version__)" || true
nvidia-smi -L
