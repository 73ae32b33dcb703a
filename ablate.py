"""
The ablation table: does each design choice of the method pay for itself on Push-T?

    python ablate.py --ckpt=out/dyn/ckpt.pt --out_dir=out/ablation --num_episodes=16 --horizon=192

Starting from a trained world model (the README's main command makes out/dyn/ckpt.pt), every row is an
open-loop evaluation (same held-out episodes, same seed) of the model with one thing changed: pusht.py's
(rollout.py's plus the agent and T-block scores read from the frames) when the model's data is
gym-pusht's (pusht.is_pusht: meta.json declares image_point_dims and its source names gym_pusht),
else rollout.py's generic image metrics alone (the table then has those columns only). Some rows need
their own training, done here when their checkpoint is missing (and reused when it is there), with the
full model's own config, so only the ablated thing differs:

  full model              context noise in training, context level 15 at inference, 3 decoder jumps
  1 decoder jump          the same networks, K = 1
  context level 0         the same networks, context labelled clean at inference
  no context noise        dynamics retrained with clean context (ctx_noise=False), rolled out at level 0
  deterministic decoder   the same encoder (frozen), the same UNet trained from scratch as a plain
                          MSE decoder (one pass from a zero image), the full dynamics model; for a full
                          model that already runs on it (the Push-T CPU recipe), the consistency decoder
                          of its stage-1 checkpoint instead (and no K = 1 row)
  no own rollouts         retrained with own_ctx off, when the full model has it on
  window w                the full model rolled out with a shorter window (w-1 context latents)
  copy first frame        the baseline

Writes OUT/ablation.json and OUT/ablation.md (a markdown table) and prints the table.
"""
import json
import os
import subprocess
import sys

import pusht
import rollout
from common import config_from_globals, load_checkpoint

# ---------------------------------------------------------------------------- defaults
ckpt = 'out/dyn/ckpt.pt'  # the full world model
out_dir = 'out/ablation'
num_episodes = 16
horizon = 192
windows = (2, 4)  # shorter rollout windows to try (each < the trained window)
dyn_iters = 0  # iterations for each retrained dynamics variant; 0 = as many as the full model had
ae_iters = 0  # iterations for the deterministic decoder; 0 = as many as stage 1 had
train = True  # train missing variants; False: skip rows whose checkpoint is missing
batch_size = 8
seed = 0
device = 'auto'
# ------------------------------------------------------------------------------------
PUSHT_COLUMNS = ('agent_err_px', 'block_iou', 'block_centroid_err_px')  # of pusht.EVAL_KEYS, the table's
FORMATS = {'mse': '{:.4f}', 'psnr': '{:.2f}', 'ssim': '{:.3f}', 'uiqi': '{:.3f}', 'lpips': '{:.3f}', 'agent_err_px': '{:.1f}',
           'block_iou': '{:.3f}', 'block_centroid_err_px': '{:.1f}', 'fps': '{:.1f}'}
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
    """Train (or find) the retrained variants. Returns {name: checkpoint path or None}: 'decoder', the other
    decoder on the same frozen encoder (the deterministic one for a consistency-decoder model; the stage-1
    consistency decoder for a model that runs on the deterministic one), and one dynamics model per
    training switch the full model has on, retrained with it off ('no_ctx_noise', 'no_own_ctx')."""
    os.makedirs(cfg['out_dir'], exist_ok=True)
    out = {}
    ae_path = ck['ae_ckpt']
    ae = load_checkpoint(ae_path, expect_kind='ae')
    if ae['config'].get('decoder_type') == 'deterministic':  # the stage-1 checkpoint whose encoder it was trained on
        cons = ae['config']['init_ckpt'] or os.path.join(os.path.dirname(ae_path), 'ckpt.pt')
        out['decoder'] = cons if os.path.isfile(cons) else None
    else:
        det_dir = os.path.join(cfg['out_dir'], 'det_decoder')
        det = os.path.join(det_dir, 'ckpt_deterministic.pt')
        if not os.path.isfile(det) and cfg['train']:
            os.makedirs(det_dir, exist_ok=True)
            print(f"training the deterministic decoder on the frozen encoder of {ae_path} -> {det}", flush=True)
            args = _overrides(ae['config'], ('out_dir', 'init_from', 'decoder_type', 'max_iters', 'device', 'init_ckpt'))
            args += [f'--out_dir={det_dir}', f'--init_ckpt={ae_path}', "--decoder_type='deterministic'",
                     f"--max_iters={cfg['ae_iters'] or ae['config']['max_iters']}", f"--device={cfg['device']!r}"]
            _train('train_ae.py', args, os.path.join(cfg['out_dir'], 'det_decoder.log'))
        out['decoder'] = det if os.path.isfile(det) else None
    c = ck['config']
    switches = [('no_ctx_noise', 'ctx_noise', False)]  # (variant, config key, value that switches it off)
    if c.get('own_ctx', 0) > 0:
        switches.append(('no_own_ctx', 'own_ctx', 0.0))
    for name, key, off in switches:
        vdir = os.path.join(cfg['out_dir'], 'dyn_' + name)
        path = os.path.join(vdir, 'ckpt.pt')
        if not os.path.isfile(path) and cfg['train']:
            print(f"training the dynamics with {key}={off} -> {path}", flush=True)
            args = _overrides(c, ('out_dir', 'init_from', key, 'max_iters', 'device', 'ae_ckpt', 'data_dir'))
            args += [f'--out_dir={vdir}', f"--ae_ckpt={ae_path!r}", f"--data_dir={ck['data']['data_dir']!r}", f'--{key}={off}',
                     f"--max_iters={cfg['dyn_iters'] or c['max_iters']}", f"--device={cfg['device']!r}"]
            _train('train_dynamics.py', args, os.path.join(cfg['out_dir'], f'dyn_{name}.log'))
        out[name] = path if os.path.isfile(path) else None
    return out


def scorer(meta):
    """The evaluation every row runs and the metric columns it fills, for a model trained on data with
    this meta.json: pusht.evaluate and the Push-T columns for gym-pusht data, else rollout.main."""
    if pusht.is_pusht(meta):
        return pusht.evaluate, rollout.METRICS + PUSHT_COLUMNS
    return rollout.main, rollout.METRICS


def main(cfg):
    """Train the missing variants, evaluate every row, write and print the table."""
    ck = load_checkpoint(cfg['ckpt'], expect_kind='dynamics')
    evaluate, columns = scorer(ck['data']['meta'])
    W = ck['config']['window']
    extra = variants(cfg, ck)
    base = config_from_globals({**vars(rollout), **vars(pusht)}, [])  # the evaluation's defaults (pusht.py's include rollout.py's)
    base.update(ckpt=cfg['ckpt'], num_episodes=cfg['num_episodes'], horizon=cfg['horizon'], batch_size=cfg['batch_size'],
                seed=cfg['seed'], device=cfg['device'], video_episodes=2)
    det_full = load_checkpoint(ck['ae_ckpt'], expect_kind='ae')['config'].get('decoder_type') == 'deterministic'
    rows = [('full model (window %d, context level 15, %s)' % (W, 'deterministic decoder' if det_full else 'K=3'), {})]
    if not det_full:  # the deterministic decoder makes one pass whatever K is
        rows.append(('1 decoder jump (K=1)', {'decode_steps': 1}))
    rows.append(('context labelled clean at inference (level 0)', {'ctx_level': 0}))
    if extra['no_ctx_noise']:
        rows.append(('no context noise in training (level 0)', {'ckpt': extra['no_ctx_noise'], 'ctx_level': 0}))
    if extra.get('no_own_ctx'):
        rows.append(('no training on own rollouts (own_ctx 0)', {'ckpt': extra['no_own_ctx']}))
    if extra['decoder']:
        rows.append(('consistency decoder (same encoder; the paper)' if det_full else 'deterministic MSE decoder (same encoder)',
                     {'ae_ckpt': extra['decoder']}))
    rows += [(f'rollout window {w}', {'window': w}) for w in cfg['windows'] if w < W]
    results = []
    for i, (name, change) in enumerate(rows):
        print(f"\n== {name}", flush=True)
        r = evaluate(dict(base, out_dir=os.path.join(cfg['out_dir'], f'row{i}'), **change))
        results.append({'row': name, 'change': change, **{k: r['model'][k] for k in columns}, 'fps': r['fps']})
        if i == 0:
            copy = {'row': 'copy first frame (baseline)', 'change': {}, **{k: r['copy_baseline'][k] for k in columns}, 'fps': None}
    results.append(copy)
    table = ablation_table(results, columns)
    meta = {'ckpt': os.path.abspath(cfg['ckpt']), 'num_episodes': cfg['num_episodes'], 'horizon': cfg['horizon'], 'seed': cfg['seed']}
    with open(os.path.join(cfg['out_dir'], 'ablation.json'), 'w') as f:
        json.dump({'meta': meta, 'rows': results}, f, indent=1)
    with open(os.path.join(cfg['out_dir'], 'ablation.md'), 'w') as f:
        f.write(table)
    print('\n' + table)
    return results


def ablation_table(results, columns):
    """Markdown table: one row per variant, the metric means over episodes and steps, then FPS."""
    cols = tuple(columns) + ('fps',)
    lines = ['| variant | ' + ' | '.join(cols) + ' |', '|---' * (len(cols) + 1) + '|']
    for r in results:
        cells = ['n/a' if r[k] is None else FORMATS[k].format(r[k]) for k in cols]
        lines.append(f"| {r['row']} | " + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


if __name__ == '__main__':
    main(config_from_globals(globals()))
