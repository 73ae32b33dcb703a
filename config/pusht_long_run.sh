#!/usr/bin/env bash
# The long Push-T run behind weights/, resumable across sessions, in one command:
#   bash config/pusht_long_run.sh train N   # collect 1000 episodes and train stage 1 (once), then the stage-2 trunk up to
#                                           # iteration N at a constant lr, resuming from runs/pusht_long/ckpt.pt; at each
#                                           # doubling point P = 3200, 6400, 12800, ... it keeps a snapshot of the trunk,
#                                           # and with BRANCHES=1 starts `branch P` beside the trunk
#   bash config/pusht_long_run.sh branch P  # the cool-down branch from the snapshot at P: P/4 more iterations, the lr
#                                           # falling linearly to min_lr; exported to out/long/curve/itM_* (M = P + P/4):
#                                           # one point of the scaling curve
#   bash config/pusht_long_run.sh ship M    # curve point M (or an exported STEM: STEM_dyn.pt ...) -> weights/pusht64_*
#   bash config/pusht_long_run.sh save      # weights-only state -> runs/pusht_long/: the trunk's as ckpt.pt, each branch's
#                                           # as branch_P.pt (to commit at a session's end; `branch P` goes on from it)
# Scoring the curve's points on the test set: curve.py (eval, policy ranking, 9000-step stability per point); in a
# later session `python curve.py --curve_dir=out/long/curve --prior=runs/pusht_long/curve.json` adds the new points to
# the committed table.
# To stop a run mid-way: wait for a checkpoint (every 200 iterations), kill the train_dynamics.py process by its own
# PID (killing the script's PID, or `pkill -P` on it, leaves it running), then `save`.
# Extra train_dynamics.py keys in EXTRA (e.g. EXTRA="--device=cuda --bf16=False"); threads as OMP_NUM_THREADS says.
set -euo pipefail
cd "$(dirname "$0")/.."
D=${D:-data/pusht64_1k} R=${R:-runs/pusht_long} O=${O:-out/long} P0=${P0:-3200} W=${W:-weights}  # (all: for a dry run)
COLLECT=${COLLECT:---num_episodes=1000 --episode_len=200 --image_size=64}  # pusht.py's collection (a dry run's: tiny)
CPU="config/dyn_pusht_cpu.py config/dyn_pusht_long_run.py"
EXTRA=${EXTRA:-}
mkdir -p "$R" "$O/dyn" "$O/curve"
iter_of() {  # a checkpoint's iteration, read without importing torch (2-4 s a call): tensors come back as None, and
  python - "$1" <<'PY'  # anything but torch's classes and OrderedDict is refused, as torch.load(weights_only=True) does
import collections, pickle, sys, zipfile
class Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == 'collections' and name == 'OrderedDict':
            return collections.OrderedDict
        if module.split('.')[0] == 'torch':
            return lambda *a, **k: None
        raise pickle.UnpicklingError(f'{module}.{name} is not allowed in a checkpoint')
    def persistent_load(self, pid):
        return None
try:
    z = zipfile.ZipFile(sys.argv[1])
    print(Unpickler(z.open(next(n for n in z.namelist() if n.endswith('/data.pkl')))).load()['iter'])
except Exception as e:
    sys.exit(f"checkpoint {sys.argv[1]!r} cannot be read ({type(e).__name__}: {e})")
PY
}
collect() {  # the 1000 training episodes (deterministic seeds: a bare checkout collects the same data again)
  [ -d "$D" ] || python pusht.py --mode=collect --data_dir="$D" $COLLECT
}
case "${1:-}" in
train)
  N=${2:?iterations}
  collect
  if [ ! -f "$R/ae.pt" ]; then  # stage 1 and the deterministic decoder, the CPU recipe's, once for the whole run
    python train_ae.py config/ae_pusht_cpu.py --data_dir="$D" --out_dir="$O/ae"
    python train_ae.py config/ae_pusht_cpu.py --data_dir="$D" --out_dir="$O/ae" --decoder_type=deterministic
    python export.py --ae_only="$O/ae/ckpt_deterministic.pt" --out_dir="$R" --name=stage1 && mv "$R/stage1_ae.pt" "$R/ae.pt"
  fi
  if [ ! -f "$O/dyn/ckpt.pt" ] && [ -f "$R/ckpt.pt" ]; then cp "$R/ckpt.pt" "$O/dyn/ckpt.pt"; fi
  it=0; [ -f "$O/dyn/ckpt.pt" ] && it=$(iter_of "$O/dyn/ckpt.pt")
  P=$P0
  while [ "$it" -lt "$N" ]; do  # the trunk in segments that end at the doubling points
    T=$(( P < N ? P : N ))
    if [ "$it" -lt "$T" ]; then
      init=scratch; [ -f "$O/dyn/ckpt.pt" ] && init=resume
      python train_dynamics.py $CPU --data_dir="$D" --ae_ckpt="$R/ae.pt" --out_dir="$O/dyn" --init_from=$init --max_iters=$T $EXTRA
      it=$(iter_of "$O/dyn/ckpt.pt")
    fi
    if [ "$it" -eq "$P" ] && [ ! -f "$O/dyn/trunk_$P.pt" ]; then
      cp "$O/dyn/ckpt.pt" "$O/dyn/trunk_$P.pt"
      if [ "${BRANCHES:-0}" = 1 ]; then bash "$0" branch "$P" > "$O/branch_$P.log" 2>&1 & fi
    fi
    P=$((P * 2))
  done
  wait
  ;;
branch)
  P=${2:?doubling point} B="$O/branch_$2"; C=$((P / 4))
  bit=0; [ -f "$B/ckpt.pt" ] && bit=$(iter_of "$B/ckpt.pt")
  if [ "$bit" -le "$P" ] || [ "$bit" -gt $((P + C)) ]; then  # not begun here: the saved branch state, else the trunk's
    src="$R/branch_$P.pt" last=$((P + C))                       # (a later session goes on where `save` left it)
    [ -f "$src" ] || { src="$O/dyn/trunk_$P.pt" last=$P; [ -f "$src" ] || src="$R/ckpt.pt"; }  # (committed, if at P)
    it=$(iter_of "$src")  # a branch's state may be anywhere in [P, P + C]; the trunk's must be at P
    [ "$it" -ge "$P" ] && [ "$it" -le "$last" ] || { echo "no snapshot of the trunk at iteration $P"; exit 1; }
    mkdir -p "$B"; cp "$src" "$B/ckpt.pt"
  fi
  if [ -f "$O/dyn/latents.npy.json" ]; then  # the trunk's encoded data (a new session has none: the branch encodes)
    ln -sf "$PWD/$O/dyn/latents.npy" "$B/latents.npy"; cp "$O/dyn/latents.npy.json" "$B/"
  fi
  if [ "$(iter_of "$B/ckpt.pt")" -lt $((P + C)) ]; then  # unfinished (a bare checkout has no data yet: collect it)
    collect
    python train_dynamics.py $CPU --data_dir="$D" --ae_ckpt="$R/ae.pt" --out_dir="$B" --init_from=resume \
        --max_iters=$((P + C)) --cooldown_iters=$C $EXTRA
  fi
  python export.py --ckpt="$B/ckpt.pt" --out_dir="$O/curve" --name="it$((P + C))"
  ;;
ship)
  S=${2:?curve point M or an exported stem}; case "$S" in *[!0-9]*) ;; *) S="$O/curve/it$S";; esac
  for f in _ae.pt _dyn.pt .json; do  # all three first: a half-shipped model is worse than the old one
    [ -f "$S$f" ] || { echo "no $S$f: ship takes a curve point M (out/long/curve/itM_*) or export.py's STEM"; exit 1; }
  done
  mkdir -p "$W"
  for f in _ae.pt _dyn.pt .json; do cp "$S$f" "$W/pusht64$f"; done
  python - "$W" <<'PY'
import os, sys, torch  # the dynamics file names its autoencoder by file name: the one beside it now
f = os.path.join(sys.argv[1], 'pusht64_dyn.pt')
d = torch.load(f, weights_only=True); d['ae_ckpt'] = 'pusht64_ae.pt'
torch.save(d, f + '.tmp'); os.replace(f + '.tmp', f)
PY
  ;;
save)  # weights only, no Adam moments or random streams (a third of the size): a resume from it continued the trunk
       # as well as an exact one did (EXPERIMENTS.md, "The long run"); a cool-down branch's too, as branch_P.pt
       # (`git rm` it once its curve point is scored)
  python - "$O" "$R" <<'PY'
import glob, os, sys, torch
O, R = sys.argv[1:]
pairs = [(f'{O}/dyn/ckpt.pt', f'{R}/ckpt.pt')] + [(f, f"{R}/{f.split('/')[-2]}.pt") for f in sorted(glob.glob(f'{O}/branch_*/ckpt.pt'))]
for src, dst in pairs:
    if not os.path.isfile(src):
        continue
    d = torch.load(src, weights_only=True)
    for k in ('optimizer', 'rng'):
        d.pop(k, None)
    torch.save(d, dst + '.tmp'); os.replace(dst + '.tmp', dst)
    print(f"{dst}: iteration {d['iter']}")
PY
  ;;
*) echo "usage: bash config/pusht_long_run.sh train N | branch P | ship M|STEM | save"; exit 2;;
esac
