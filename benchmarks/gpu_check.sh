#!/usr/bin/env bash
# GPU figures on a lent machine (tested target: one H200, 16 cores, no internet, python3 with a CUDA torch,
# nvidia-ml-py, grpcio and pandas preinstalled; pandera and its pydantic/typeguard stack and botocore (data.storage,
# which training.train imports) are not):
#
#   here, once:      bash benchmarks/gpu_check.sh --fetch-wheels        # the missing wheels into .whl/ (git-ignored)
#   on the machine:  bash benchmarks/gpu_check.sh                       # the `run` tool, carry [".whl"]
#
# Runs training.collectives with NCCL over all local GPUs (1 KiB..256 MiB, every op) and benchmarks/ddp.py with
# bf16 autocast (step time, NVML utilisation, TFLOP/s and MFU, H2D GB/s, data-wait share), and writes JSON and
# logs under $OUT (default benchmarks/results/gpu). Finishes within 8 minutes: each part has its own timeout.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(pandera==0.35.0 typeguard==4.6.1 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0
        typing-inspection==0.4.5 botocore==1.43.117 jmespath==1.1.0)

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "${WHEELS[@]}"
    exit 0
fi

OUT="${OUT:-benchmarks/results/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c 'import pandera' 2>/dev/null; then
    if ! compgen -G '.whl/*.whl' > /dev/null; then
        echo "pandera is missing and there is no .whl/: run 'bash benchmarks/gpu_check.sh --fetch-wheels' here" \
             "first and carry .whl" >&2
        exit 2
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi

python3 - <<'EOF' | tee "$OUT/environment.txt"
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
for i in range(torch.cuda.device_count()):
    print(f"GPU {i}: {torch.cuda.get_device_name(i)}")
EOF
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')

# NCCL collectives; with one GPU all_reduce's bus factor 2(n-1)/n is 0, so read algbw there.
timeout 180 python3 -m torch.distributed.run --standalone --nproc-per-node="$ngpu" -m training.collectives \
    --budget-s 0.5 --json "$OUT/collectives_nccl.json" 2>&1 | tee "$OUT/collectives_nccl.log"

# DDP training step on the GPU(s): a model big enough to keep tensor cores busy, data resident on the device.
timeout 240 python3 benchmarks/ddp.py --ranks "$ngpu" --repeats 2 --batch 8192 --steps 300 --inputs 1024 \
    --hidden 4096 4096 4096 --out "$OUT/ddp_gpu.json" 2>&1 | tee "$OUT/ddp_gpu.log"

echo "wrote under $OUT:"
find "$OUT" -type f -printf '  %P\n'
