#!/bin/bash
# ember webgpu on the lent GPU machine (one NVIDIA H200 or H100, wgpu-py over Vulkan): every figure of
# issue 20 / issue 18's GPU goals in one run, logs under $OUT. Needs, carried: .gl (the Vulkan
# loader's Debian packages, recipe in the device tool's README) and .whl (wgpu-py 0.32 and its
# needs, gguf and its needs, for Python 3.12). Run from the repository root:
#   bash tests/bench/webgpu_h200.sh [sections...]   (default: all)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
# ember as an import package without building the wheel (pyproject's package-dir, by links)
mkdir -p /tmp/emb && ln -sfn "$PWD/core" /tmp/emb/ember
for d in webgpu wasm web; do ln -sfn "$PWD/$d" "core/$d"; done
export PYTHONPATH=/tmp/emb:/tmp/site PYTHONUNBUFFERED=1 EMBER_AUTOTUNE=on
# ember.native (C compiled here: the replayed streams' encoder, core/native/encode.c); without a
# compiler the cffi loop runs
python3 -m ember.native --if-stale 2>&1 | tail -1
S=${*:-"info floor smol smol4 torch profile replay qlinear qdecode qprompt matmul f16 train"}
# HBM peak for the GB/s checks: H100 (HBM3) 3.35 TB/s, H200 (HBM3e) 4.8 TB/s
PEAK=4800; nvidia-smi -L 2>/dev/null | grep -q H100 && PEAK=3350
run() { local name=$1 t=$2; shift 2; echo "=== $name: $*"; local a=$(date +%s.%N)
  timeout "$t" "$@" 2>&1 | tee "$OUT/$name.log"; echo "=== $name: rc ${PIPESTATUS[0]}, $(python3 -c "print(round($(date +%s.%N)-$a,1))") s"; }
for s in $S; do case $s in
  info) nvidia-smi -L; run info 60 python3 -c "import ember.webgpu as wg, json; print(json.dumps(wg.info(), default=str))" ;;
  smol) run smol 200 python3 tests/bench/llm/h200_smol_shape.py --device webgpu --out /tmp/smol --torch-job --compare-steps --feedback ;;
  # the same decode with a layer as four dispatches (the residual stream in parts after attention), for an A/B
  smol4) EMBER_LLM_PARTS=1 run smol4 200 python3 tests/bench/llm/h200_smol_shape.py --device webgpu --out /tmp/smol --feedback ;;
  # the default decode alone (no PyTorch job, no step comparison): for A/Bs of kernel settings
  smolf) run smolf 200 python3 tests/bench/llm/h200_smol_shape.py --device webgpu --out /tmp/smol --feedback ;;
  # smolf with the decode attention unsplit (EMBER_ATTN_SPLIT=0): the A/B of the split in one call
  smolf0) EMBER_ATTN_SPLIT=0 run smolf0 200 python3 tests/bench/llm/h200_smol_shape.py --device webgpu --out /tmp/smol --feedback ;;
  profile) run profile 150 python3 tests/bench/llm/h200_profile.py --out /tmp/smol ;;
  profile0) EMBER_ATTN_SPLIT=0 run profile0 150 python3 tests/bench/llm/h200_profile.py --out /tmp/smol ;;
  # decode attention alone by position and split count (attention_cached, then with the projection)
  attnsplit) run attnsplit 200 python3 tests/bench/bench_attn_split.py --rounds 3
             run attnsplit_proj 200 python3 tests/bench/bench_attn_split.py --proj --rounds 3 ;;
  # the float gemv's layouts at the decode's own small products (SmolLM2: o-proj 576x576, down
  # 576x1536, qkv 960x576, gate/up 3072x576; n*k <= 4M: 64 lanes of one item, workgroups of 256,
  # not gemv8); the chained figures are the decode's case
  qsmall) run qsmall 300 python3 tests/bench/bench_webgpu.py --qlinear --qtypes ${QL_TYPES:-q4_1} --qshapes ${QL_SHAPES:-576x576,576x1536,960x576,3072x576} --peak-gbs $PEAK --no-qprompt --qlayouts ${QL_LAYOUTS:-64x1u1,32x1u1,128x1u1,32x2u1,64x1u2,64x1u1w128,64x1u1w64} ;;
  torch) run torch 150 python3 tests/bench/llm/torch_peer.py /tmp/smol/job.json "$OUT/torch_peer.json" ;;
  bert) run bert 240 python3 tests/bench/bench_bert_gpu.py --profile ;;
  replay) run replay 90 python3 tests/bench/bench_webgpu.py --replay ;;
  # (decode only, a short layout sweep; every timed pass starts after ~30 ms of other GPU work)
  # (QL_LAYOUTS / QL_LAYOUTS_576: other layouts, e.g. gemv8's lanes per block "32x4u4iw256t4")
  qlinear) L=${QL_LAYOUTS:-32x4u4iw64,32x4u4iw256,16x4u4iw64,8x2u4iw64,4x4u4iw64,4x8u4iw64,8x8u4iw128}
           run qlinear 200 python3 tests/bench/bench_webgpu.py --qlinear --qtypes ${QL_TYPES:-q8_0,q4_1,q6_k,q4_k} --qshapes ${QL_SHAPES:-4096x4096} --peak-gbs $PEAK --no-qprompt --qlayouts $L
           run qlinear_576 150 python3 tests/bench/bench_webgpu.py --qlinear --qtypes q8_0,q4_1 --qshapes 49152x576 --peak-gbs $PEAK --no-qprompt --qlayouts ${QL_LAYOUTS_576:-$L} ;;
  # the decode-sized products at their default layouts and the fp32 batch-1 linear next to them
  qdecode) run qdecode 200 python3 tests/bench/bench_webgpu.py --qlinear --qtypes q8_0,q4_1 --qshapes 4096x4096,11008x4096 --peak-gbs $PEAK --no-qprompt --qlayouts none ;;
  # what a chained dispatch costs, and what a decode kernel's body adds to it
  floor) run floor 120 python3 tests/bench/webgpu_floor.py --n 400 --body ;;
  qprompt) run qprompt 200 python3 tests/bench/bench_webgpu.py --qlinear --qtypes q8_0,q4_1 --qshapes 4096x4096 --peak-gbs $PEAK --qlayouts none ;;
  matmul) run matmul 240 python3 tests/bench/bench_webgpu.py --sizes 1024,2048,4096 --no-cpu-peers ;;
  # float16 matmul in half storage (shader-f16) / the 4-byte form / float32, next to PyTorch fp16 (issue 20)
  f16) run f16 240 python3 tests/bench/bench_webgpu.py --f16 --sizes 1024,2048,4096 ;;
  # generated GEMM variants (tile, thread tile, k depth, buffering, split-K) next to PyTorch's fp32
  gemmlab) run gemmlab 420 python3 tests/bench/webgpu_gemm_lab.py ${GEMMLAB_ARGS:-} ;;
  # every dispatch of one compiled MNIST CNN / encoder training step: GPU us per kernel and op, grids, shapes
  trainprof) run trainprof 240 python3 tests/bench/bench_train.py --kernels ;;
  train) run train 180 python3 tests/bench/bench_train.py --devices webgpu --torch-device cuda --modes compiled ;;
esac; done
