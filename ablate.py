"""
The ablation table: does each design choice of the method pay for itself on Push-T?

    python ablate.py --ckpt=out/dyn/ckpt.pt --out_dir=out/ablation --num_episodes=16 --horizon=192

Starting from a trained world model (the README's main command makes out/dyn/ckpt.pt), every row is an
open-loop evaluation (rollout.py's, same held-out episodes, same seed) of the model with one thing
changed. Two rows need their own training, done here when their checkpoint is missing (and reused
when it is there), with the full model's own config, so only the ablated thing differs:

  full model              context noise in training, context level 15 at inference, 3 decoder jumps
  1 decoder jump          the same networks, K = 1
  context level 0         the same networks, context labelled clean at inference
  no context noise        dynamics retrained with clean context (ctx_noise=False), rolled out at level 0
  deterministic decoder   the same encoder (frozen), the same UNet trained from scratch as a plain
                          MSE decoder (one pass from a zero image), the full dynamics model
  window w                the full model rolled out with a shorter window (w-1 context latents)
  copy first frame        the baseline

Writes OUT/ablation.json and OUT/ablation.md (a markdown table) and prints the table.
"""
import json
import os
import subprocess
import sys

import rollout
from common import config_from_globals, load_checkpoint

# ---------------------------------------------------------------------------- defaults
ckpt = 'out/dyn/ckpt.pt'  # the full world model
out_dir = 'out/ablation'
num_episodes = 16
horizon = 192
windows = (2, 4)  # shorter rollout windows to try (each < the trained window)
dyn_iters = 0  # iterations for the retrained no-context-noise dynamics; 0 = as many as the full model had
ae_iters = 0  # iterations for the deterministic decoder; 0 = as many as stage 1 had
train = True  # train missing variants; False: skip rows whose checkpoint is missing
batch_size = 8
seed = 0
device = 'auto'
# ------------------------------------------------------------------------------------
COLUMNS = ('mse', 'psnr', 'ssim', 'uiqi', 'lpips', 'agent_err_px', 'block_iou', 'block_centroid_err_px')
HERE = os.path.dirname(os.path.abspath(__file__))


def _overrides(cfg, skip):
    """A stored config as --key=value arguments (repr round-trips through the scripts' literal_eval)."""
    return [f'--{k}={v!r}' if isinstance(v, (tuple, str)) else f'--{k}={v}' for k, v in cfg.items() if k not in skip]


def _train(script, args, log_path):
    """Run a trainer as a subprocess, its output in a log file; a failure stops the ablation with the log named."""
    with open(log_path, 'w') as log:
        r = subprocess.run([sys.executable, os.path.join(HERE, script)] + args, stdout=log, stderr=subprocess.STDOUT, cwd=HERE)
    if r.returncode != 0:
        raise SystemExit(f"{script} failed (exit {r.returncode}); see {log_path}")


def variants(cfg, ck):
    """Train (or find) the two retrained variants. Returns {name: checkpoint path or None}."""
    os.makedirs(cfg['out_dir'], exist_ok=True)
    out = {}
    ae_path = ck['ae_ckpt']
    ae = load_checkpoint(ae_path, expect_kind='ae')
    det_dir = os.path.join(cfg['out_dir'], 'det_decoder')
    det = os.path.join(det_dir, 'ckpt_deterministic.pt')
    if not os.path.isfile(det) and cfg['train']:
        os.makedirs(det_dir, exist_ok=True)
        print(f"training the deterministic decoder on the frozen encoder of {ae_path} -> {det}", flush=True)
        args = _overrides(ae['config'], ('out_dir', 'init_from', 'finetune', 'decoder_type', 'max_iters', 'device', 'init_ckpt'))
        args += [f'--out_dir={det_dir}', f'--init_ckpt={ae_path}', '--finetune=True', "--decoder_type='deterministic'",
                 f"--max_iters={cfg['ae_iters'] or ae['config']['max_iters']}", f"--device={cfg['device']!r}"]
        _train('train_ae.py', args, os.path.join(cfg['out_dir'], 'det_decoder.log'))
    out['det_decoder'] = det if os.path.isfile(det) else None
    nc_dir = os.path.join(cfg['out_dir'], 'dyn_no_ctx_noise')
    nc = os.path.join(nc_dir, 'ckpt.pt')
    if not os.path.isfile(nc) and cfg['train']:
        print(f"training the dynamics without context noise -> {nc}", flush=True)
        args = _overrides(ck['config'], ('out_dir', 'init_from', 'ctx_noise', 'max_iters', 'device', 'ae_ckpt', 'data_dir'))
        args += [f'--out_dir={nc_dir}', f"--ae_ckpt={ae_path!r}", f"--data_dir={ck['data']['data_dir']!r}", '--ctx_noise=False',
                 f"--max_iters={cfg['dyn_iters'] or ck['config']['max_iters']}", f"--device={cfg['device']!r}"]
        _train('train_dynamics.py', args, os.path.join(cfg['out_dir'], 'dyn_no_ctx_noise.log'))
    out['no_ctx_noise'] = nc if os.path.isfile(nc) else None
    return out


def main(cfg):
    ck = load_checkpoint(cfg['ckpt'], expect_kind='dynamics')
    W = ck['config']['window']
    extra = variants(cfg, ck)
    base = rollout.config_from_globals(vars(rollout), [])  # rollout.py's defaults
    base.update(ckpt=cfg['ckpt'], num_episodes=cfg['num_episodes'], horizon=cfg['horizon'], batch_size=cfg['batch_size'],
                seed=cfg['seed'], device=cfg['device'], video_episodes=2)
    rows = [('full model (ctx noise, level 15, K=3, window %d)' % W, {}),
            ('1 decoder jump (K=1)', {'decode_steps': 1}),
            ('context labelled clean at inference (level 0)', {'ctx_level': 0})]
    if extra['no_ctx_noise']:
        rows.append(('no context noise in training (level 0)', {'ckpt': extra['no_ctx_noise'], 'ctx_level': 0}))
    if extra['det_decoder']:
        rows.append(('deterministic MSE decoder (same encoder)', {'ae_ckpt': extra['det_decoder']}))
    rows += [(f'rollout window {w}', {'window': w}) for w in cfg['windows'] if w < W]
    results = []
    for i, (name, change) in enumerate(rows):
        print(f"\n== {name}", flush=True)
        r = rollout.main(dict(base, out_dir=os.path.join(cfg['out_dir'], f'row{i}'), **change))
        results.append({'row': name, 'change': change, **{k: r['model'][k] for k in COLUMNS}, 'fps': r['fps']})
        if i == 0:
            copy = {'row': 'copy first frame (baseline)', 'change': {}, **{k: r['copy_baseline'][k] for k in COLUMNS}, 'fps': None}
    results.append(copy)
    table = ablation_table(results)
    meta = {'ckpt': os.path.abspath(cfg['ckpt']), 'num_episodes': cfg['num_episodes'], 'horizon': cfg['horizon'], 'seed': cfg['seed']}
    with open(os.path.join(cfg['out_dir'], 'ablation.json'), 'w') as f:
        json.dump({'meta': meta, 'rows': results}, f, indent=1)
    with open(os.path.join(cfg['out_dir'], 'ablation.md'), 'w') as f:
        f.write(table)
    print('\n' + table)
    return results


def ablation_table(results):
    """Markdown table: one row per variant, the metric means over episodes and steps."""
    fmt = {'mse': '{:.4f}', 'psnr': '{:.2f}', 'ssim': '{:.3f}', 'uiqi': '{:.3f}', 'lpips': '{:.3f}', 'agent_err_px': '{:.1f}',
           'block_iou': '{:.3f}', 'block_centroid_err_px': '{:.1f}', 'fps': '{:.1f}'}
    cols = COLUMNS + ('fps',)
    lines = ['| variant | ' + ' | '.join(cols) + ' |', '|---' * (len(cols) + 1) + '|']
    for r in results:
        cells = ['n/a' if r[k] is None else fmt[k].format(r[k]) for k in cols]
        lines.append(f"| {r['row']} | " + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


if __name__ == '__main__':
    main(config_from_globals(globals()))
