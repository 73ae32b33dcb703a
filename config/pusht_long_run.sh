#!/usr/bin/env bash
# The long Push-T run behind weights/, resumable across sessions, in one command:
#   bash config/pusht_long_run.sh train N    # collect 1000 episodes and train stage 1 (once), then stage 2 up to
#                                            # iteration N, resuming from runs/pusht_long/ckpt.pt if it is there
#   bash config/pusht_long_run.sh cool C     # a cool-down branch of C iterations from the trunk's latest checkpoint,
#                                            # exported to weights/ (the shipped model)
#   bash config/pusht_long_run.sh save       # copy the trunk's resumable state into runs/pusht_long/ (to commit)
# Threads: OMP_NUM_THREADS as the caller sets it.
set -euo pipefail
cd "$(dirname "$0")/.."
D=data/pusht64_1k R=runs/pusht_long O=out/long
CPU="config/dyn_pusht_cpu.py config/dyn_pusht_long_run.py"
mkdir -p "$R" "$O/dyn"
case "${1:-}" in
train)
  [ -d "$D" ] || python pusht.py --mode=collect --data_dir="$D" --num_episodes=1000 --episode_len=200 --image_size=64
  if [ ! -f "$R/ae.pt" ]; then  # stage 1 and the deterministic decoder, the CPU recipe's, once for the whole run
    python train_ae.py config/ae_pusht_cpu.py --data_dir="$D" --out_dir="$O/ae"
    python train_ae.py config/ae_pusht_cpu.py --data_dir="$D" --out_dir="$O/ae" --decoder_type=deterministic
    python export.py --ae_only="$O/ae/ckpt_deterministic.pt" --out_dir="$R" --name=stage1 && mv "$R/stage1_ae.pt" "$R/ae.pt"
  fi
  if [ ! -f "$O/dyn/ckpt.pt" ] && [ -f "$R/ckpt.pt" ]; then cp "$R/ckpt.pt" "$O/dyn/ckpt.pt"; fi
  init=scratch; [ -f "$O/dyn/ckpt.pt" ] && init=resume
  python train_dynamics.py $CPU --data_dir="$D" --ae_ckpt="$R/ae.pt" --out_dir="$O/dyn" --init_from=$init --max_iters="${2:?iterations}"
  ;;
cool)
  C=${2:?cool-down iterations}
  it=$(python -c "import common; print(common.load_checkpoint('$O/dyn/ckpt.pt')['iter'])")
  B="$O/cool_$it"; mkdir -p "$B"
  cp "$O/dyn/ckpt.pt" "$B/ckpt.pt"; cp "$O/dyn/latents.npy" "$O/dyn/latents.npy.json" "$B/" 2>/dev/null || true
  python train_dynamics.py $CPU --data_dir="$D" --ae_ckpt="$R/ae.pt" --out_dir="$B" --init_from=resume \
      --max_iters=$((it + C)) --cooldown_iters="$C"
  python export.py --ckpt="$B/ckpt.pt" --out_dir=weights --name=pusht64
  ;;
save)
  cp "$O/dyn/ckpt.pt" "$R/ckpt.pt.tmp" && mv "$R/ckpt.pt.tmp" "$R/ckpt.pt"
  python -c "import common; print('runs/pusht_long/ckpt.pt: iteration', common.load_checkpoint('$R/ckpt.pt')['iter'])"
  ;;
*) echo "usage: bash config/pusht_long_run.sh train N | cool C | save"; exit 2;;
esac
