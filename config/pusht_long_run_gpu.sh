#!/usr/bin/env bash
# The long run on a lent GPU for a fixed time (issue #26; ran on an H200, 2026-12-04, LIMIT=530): collect the 1000
# episodes on 14 workers (the same data as on 2 workers: the dataset fingerprint matched), with BENCH=1 time the
# paper-size live loop at 128x128 (done once: 19.0 FPS fp32), then the stage-2 trunk of config/pusht_long_run.sh on
# CUDA (fp32, as on the CPU), resumed from the committed runs/pusht_long/ckpt.pt, with its cool-down branches beside
# it; everything stops at T0 + LIMIT seconds and what is worth keeping is packed into $OUT. Needs runs/pusht_long/ae.pt.
#   OUT=out/gpu LIMIT=530 bash config/pusht_long_run_gpu.sh
# Back here: put $OUT/trunk_ckpt.pt at out/long/dyn/ckpt.pt and `bash config/pusht_long_run.sh save`; a branch the
# call did not finish: `branch P` from the returned trunk_P.pt (at out/long/dyn/trunk_P.pt).
# (The run of 2026-12-04 also trained a width-128 pilot beside the trunk: EXPERIMENTS.md, "The long run".)
# Not `pkill -f` from a one-line shell command: it matches that shell's own command line.
T0=$(date +%s); LIMIT=${LIMIT:-530}; OUT=${OUT:?a folder for the results}; mkdir -p "$OUT"
set -x
if [ -d .whl ] && [ -z "${NOWHL:-}" ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1; fi
nvidia-smi -L; python3 -c "import torch, numpy; print(torch.__version__, numpy.__version__, torch.cuda.is_available())"
export OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1
DEV=${DEV:-cuda}; NW=${NW:-14}; NEP=${NEP:-1000}
mkdir -p logs_dev
D=${D:-data/pusht64_1k} O=${O:-out/long} R=${R:-runs/pusht_long}
( python3 pusht.py --mode=collect --data_dir=$D --num_episodes=$NEP --episode_len=${ELEN:-200} --image_size=64 --num_workers=$NW > logs_dev/collect.log 2>&1 ) &
CP=$!
[ -n "${BENCH:-}" ] && timeout 75 python3 bench.py --mode=speed --recipes=gpu --device=$DEV --batches=1,8 --max_seconds=4 --speed_steps=20 --out_dir=logs_dev/speed_fp32 > logs_dev/speed.log 2>&1
[ -n "${BENCH:-}" ] && timeout 75 python3 bench.py --mode=speed --recipes=gpu --device=$DEV --batches=1,8 --max_seconds=4 --speed_steps=20 --bf16=True --out_dir=logs_dev/speed_bf16 >> logs_dev/speed.log 2>&1
wait $CP; echo "collected at $(( $(date +%s) - T0 )) s"
python3 -c "import data, common; print('fingerprint', common.dataset_fingerprint(data.load_dataset('$D')))" | tee logs_dev/fingerprint.txt
EXTRA="--device=$DEV --bf16=False" BRANCHES=1 bash config/pusht_long_run.sh train 100000000 > logs_dev/trunk.log 2>&1 &
while [ $(( $(date +%s) - T0 )) -lt $LIMIT ]; do sleep 2; done
pkill -f pusht_long_run.sh; pkill -f train_dynamics.py; pkill -f export.py; sleep 4; pkill -9 -f train_dynamics.py; sleep 1
cp $O/branch_*.log logs_dev/ 2>/dev/null; cp $O/dyn/samples_*.png logs_dev/ 2>/dev/null
nvidia-smi > logs_dev/nvidia-smi.txt 2>&1
tar cf $OUT/logs.tar logs_dev
cp $O/dyn/ckpt.pt $OUT/trunk_ckpt.pt
tar cf $OUT/curve.tar -C $O/curve --exclude='*_ae.pt' .
for s in $(ls $O/dyn/trunk_*.pt | sort -V | tail -2); do P=$(basename $s .pt | cut -d_ -f2); M=$((P + P / 4)); [ -f $O/curve/it${M}_dyn.pt ] || cp $s $OUT/; done
ls -la $OUT; echo "done at $(( $(date +%s) - T0 )) s"
