#!/bin/bash
# The GPU check (run by the device tool from the repository root; see bench/README.md):
# 1. ampify's executable tests with CUDA visible (the fixtures then train on the GPU, under CUDA
#    autocast and GradScaler("cuda")), and `ampify verify` of a CUDA-autocast script;
# 2. FSDP1 converted to ShardedGradScaler, one rank on NCCL, an inf gradient at one step;
# 3. speed and memory of a float32 script against its ampify conversion (float16 and bfloat16).
# Needs PyTorch with CUDA; libcst comes as a wheel in .whl/ (the device has no package index).
set -u
OUTDIR=${OUT:-/tmp/gpu_out}
mkdir -p "$OUTDIR" /tmp/work
REPO=$(pwd)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
fi
# ampify as installed: transforms/ is the package ampify.transforms
rm -rf /tmp/pkg && mkdir -p /tmp/pkg && cp -r ampify /tmp/pkg/ && rm -rf /tmp/pkg/ampify/transforms && cp -r transforms /tmp/pkg/ampify/transforms
export PYTHONPATH=/tmp/pkg:/tmp/site PYTHONUNBUFFERED=1
python3 -c "import torch, importlib.metadata as m; print('torch', torch.__version__, torch.cuda.get_device_name(), 'libcst', m.version('libcst'))"

echo "== 1. executable tests on CUDA"
(cd /tmp/work && timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
   "$REPO/tests/test_torch_native_exec.py" "$REPO/tests/test_verify_torch.py" 2>&1 | tail -40) | tee "$OUTDIR/exec.log"
(cd /tmp/work && timeout 120 python3 -m ampify verify "$REPO/fixtures/verify/torch_cuda_autocast.py" 2>&1 | tail -8) | tee -a "$OUTDIR/exec.log"

echo "== 2. FSDP1 with ShardedGradScaler"
cd /tmp/work
cp "$REPO/bench/gpu/fsdp1_one_rank.py" fsdp1_converted.py && python3 -m ampify fsdp1_converted.py | tail -1
grep -n "ShardedGradScaler\|autocast\|scaler\." fsdp1_converted.py | tee "$OUTDIR/fsdp1.log"
for script in "$REPO/bench/gpu/fsdp1_one_rank.py" fsdp1_converted.py; do
  echo "-- $script" | tee -a "$OUTDIR/fsdp1.log"
  timeout 120 torchrun --standalone --nproc_per_node 1 "$script" 2>&1 | grep -v "^W\|warn" | tail -3 | tee -a "$OUTDIR/fsdp1.log"
done

echo "== 3. speed and memory: float32 against the ampify conversion"
cp "$REPO/bench/gpu/amp_gain.py" fp32.py
for dtype in float16 bfloat16; do
  cp fp32.py "amp_$dtype.py" && python3 -m ampify --dtype $dtype "amp_$dtype.py" | tail -1
done
for model in transformer resnet50; do
  for script in fp32.py amp_float16.py amp_bfloat16.py; do
    echo -n "$script " | tee -a "$OUTDIR/gain.log"
    MODEL=$model timeout 150 python3 "$script" 2>&1 | tail -1 | tee -a "$OUTDIR/gain.log"
  done
done
