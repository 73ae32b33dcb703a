"""
The scaling curve of the long Push-T run: every exported model in a folder (config/pusht_long_run.sh's cool-down
branches, out/long/curve/itM_dyn.pt, M = the stage-2 iterations) scored on one test set, then tabulated and
plotted against M (the points are doublings, so evenly spaced points are a log axis).

    python curve.py --curve_dir=out/long/curve --data_dir=data/pusht64_test --out_dir=out/long/curve_eval

Per point, in out_dir/itM/: pusht.py --mode=eval (num_episodes x horizon open loop), --mode=policy_eval
(6 policies x num_states x policy_steps) and bench.py --mode=stability (stability_steps); a score already on disk
is not computed again, so the command can be stopped and rerun. With --prior=runs/pusht_long/curve.json the points
scored in earlier sessions (whose exports are gone) keep their committed rows. Writes out_dir/curve.md (a markdown table,
the copy-first-frame baseline of the same episodes in its last row), curve.json and curve.png.
"""
import glob
import json
import os
import re
import subprocess
import sys

import numpy as np

from common import config_from_globals
from metrics import draw_curves

# ---------------------------------------------------------------------------- defaults
curve_dir = 'out/long/curve'
data_dir = 'data/pusht64_test'  # the test set (pusht.py --mode=collect --seed=1000000)
out_dir = 'out/long/curve_eval'
num_episodes = 16
horizon = 192
num_states = 20
policy_steps = 60
stability_steps = 9000
skip = ''  # comma-separated parts not to run: eval, policy_eval, stability
prior = ''  # an earlier curve.json (runs/pusht_long/curve.json): its rows for points not exported here are kept
# ------------------------------------------------------------------------------------
COLS = [('MSE', 'mse', '.5f'), ('PSNR', 'psnr', '.2f'), ('SSIM', 'ssim', '.3f'), ('agent px', 'agent_err_px', '.2f'),
        ('block IoU', 'block_iou', '.3f'), ('IoU 1-32', 'iou32', '.3f'), ('centroid px', 'block_centroid_err_px', '.2f'),
        ('angle deg', 'block_angle_err_deg', '.1f'), ('9000-step shape IoU (min row)', 'shape_min', '.3f'),
        ('Pearson', 'pearson', '.2f'), ('Spearman', 'spearman', '.2f'), ('max policy gap', 'gap', '.3f')]


def run(args, done):
    """Run a tool unless its output file `done` is there."""
    if not os.path.isfile(done):
        print('+', ' '.join(args), flush=True)
        subprocess.run([sys.executable] + args, check=True)
    return json.load(open(done))


def score(ckpt, od, cfg):
    """-> {column key: value} for the model at ckpt, and the copy baseline's eval scores."""
    r, copy, parts = {}, {}, set(cfg['skip'].split(','))
    if 'eval' not in parts:
        m = run(['pusht.py', '--mode=eval', f'--ckpt={ckpt}', f"--data_dir={cfg['data_dir']}", f"--num_episodes={cfg['num_episodes']}",
                 f"--horizon={cfg['horizon']}", f'--out_dir={od}/eval'], f'{od}/eval/metrics.json')
        for name, dst in (('model', r), ('copy_baseline', copy)):
            dst.update({k: m[name][k] for _, k, _ in COLS[:8] if k != 'iou32'})
            dst['iou32'] = float(np.mean(m[name]['curves']['block_iou'][:32]))  # steps 1-32
    if 'policy_eval' not in parts:
        p = run(['pusht.py', '--mode=policy_eval', f'--ckpt={ckpt}', f"--num_states={cfg['num_states']}",
                 f"--steps={cfg['policy_steps']}", f'--out_dir={od}/policy_eval'], f'{od}/policy_eval/policy_eval.json')
        c = p['correlation']['coverage']
        r |= {'pearson': c['pearson'], 'spearman': c['spearman'],
              'gap': max(abs(q['real_coverage'] - q['model_coverage']) for q in p['policies'])}
    if 'stability' not in parts:
        s = run(['bench.py', '--mode=stability', f'--ckpt={ckpt}', f"--data_dir={cfg['data_dir']}",
                 f"--steps={cfg['stability_steps']}", f'--out_dir={od}/stability'], f'{od}/stability/stability.json')
        r['shape_min'] = min(row['block_shape_iou'] for row in s['rows'])
    return r, copy


SAME = ('num_episodes', 'horizon', 'num_states', 'policy_steps', 'stability_steps')  # what a prior row must share


def prior_rows(cfg, have):
    """Rows of an earlier session's curve.json for the points not in `have`, if it scored them the same way."""
    if not cfg.get('prior'):
        return []
    if not os.path.isfile(cfg['prior']):
        raise SystemExit(f"--prior={cfg['prior']!r}: no such file")
    p = json.load(open(cfg['prior']))
    if any(p['config'].get(k) != cfg.get(k) for k in SAME):
        raise SystemExit(f"--prior={cfg['prior']!r} was scored with other settings: "
                         + ', '.join(f"{k} {p['config'].get(k)} vs {cfg.get(k)}" for k in SAME if p['config'].get(k) != cfg.get(k)))
    return [r for r in p['rows'] if r['iters'] not in have]


def main(cfg):
    pts = sorted((int(re.search(r'it(\d+)_dyn\.pt$', f).group(1)), f) for f in glob.glob(os.path.join(cfg['curve_dir'], 'it*_dyn.pt')))
    if not pts:
        raise SystemExit(f"no itM_dyn.pt in {cfg['curve_dir']!r} (config/pusht_long_run.sh branch P writes them)")
    old = prior_rows(cfg, {it for it, _ in pts})
    if not os.path.isdir(cfg['data_dir']):
        raise SystemExit(f"no test set at {cfg['data_dir']!r}: python pusht.py --mode=collect --data_dir={cfg['data_dir']} "
                         f"--num_episodes=16 --episode_len=200 --image_size=64 --seed=1000000")
    rows, copy = [], {}
    for it, f in reversed(pts):  # the newest point first
        r, copy = score(f, os.path.join(cfg['out_dir'], f'it{it}'), cfg)
        rows.insert(0, {'iters': it, **r})
    rows = sorted(rows + old, key=lambda r: r['iters'])
    fmt = lambda v, f: '' if v is None else format(v, f)
    lines = ['| stage-2 iterations | ' + ' | '.join(c for c, _, _ in COLS) + ' |', '|---' * (len(COLS) + 1) + '|']
    lines += [f"| {r['iters']} | " + ' | '.join(fmt(r.get(k), f) for _, k, f in COLS) + ' |' for r in rows]
    lines += ['| copying the first frame | ' + ' | '.join(fmt(copy.get(k), f) for _, k, f in COLS) + ' |']
    os.makedirs(cfg['out_dir'], exist_ok=True)
    open(os.path.join(cfg['out_dir'], 'curve.md'), 'w').write('\n'.join(lines) + '\n')
    json.dump({'rows': rows, 'copy_baseline': copy, 'config': cfg}, open(os.path.join(cfg['out_dir'], 'curve.json'), 'w'), indent=1)
    panels = [(c, [('model', [r.get(k, np.nan) for r in rows])] + ([('copy', [copy[k]] * len(rows))] if k in copy else []))
              for c, k, _ in COLS if any(k in r for r in rows) and k not in ('psnr', 'spearman')]
    draw_curves(os.path.join(cfg['out_dir'], 'curve.png'), panels, xticks=[f'{r["iters"] // 1000}k' for r in rows],
                 xname='stage-2 iterations')
    print('\n'.join(lines))
    return rows


if __name__ == '__main__':
    main(config_from_globals(globals()))
