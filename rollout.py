"""
Open-loop evaluation of the world model against recorded held-out episodes, and the world model as
an environment (Simulator) for the tools built on it (play.py, pusht.py, bench.py):

    python rollout.py --ckpt=out/dyn/ckpt.pt --num_episodes=8 --horizon=192 --out_dir=out/eval

From the first frame of each held-out episode, the model predicts `horizon` frames from the recorded
actions alone (the noisy-context sliding-window sampler: window-1 context latents labelled with a
small noise level, the new latent jumped 999 -> 0, decoded in K jumps), and every predicted frame is
compared with the recorded one. The copy-the-first-frame baseline is scored in the same run.
Writes OUT/metrics.json, OUT/curves.csv/.png, OUT/rollout.gif (truth | prediction | error), OUT/rollout.png and prints
a table. All image metrics are on [0, 1] images (data range 1). Nothing here knows what is in the
frames: a task module adds its own per-frame scores through main(cfg, extra_score) (pusht.py does,
for the agent and the T block read from pixels).
"""
import json
import os
import time

import numpy as np
import torch

import data as D
import metrics as Mx
import model as M
from common import config_from_globals, load_autoencoder, load_checkpoint, pick_device

# ---------------------------------------------------------------------------- defaults
ckpt = 'out/dyn/ckpt.pt'
ae_ckpt = ''  # '' = the autoencoder the dynamics checkpoint names
data_dir = ''  # '' = the dataset the dynamics checkpoint was trained on (its held-out episodes); another folder is
              # a test set the model never saw: all of its episodes are used
out_dir = 'out/eval'
num_episodes = 8  # held-out episodes rolled out (the first ones of the checkpoint's val split longer than horizon)
horizon = 192  # predicted steps per episode, open loop from its first frame (19.2 s at 10 Hz)
window = 0  # 0 = the training window stored in the checkpoint
ctx_level = 15  # noise level the context latents are labelled with
decode_steps = 3  # decoder jumps per frame
batch_size = 8  # episodes rolled out in parallel
seed = 0  # noise seed of the sampler: the same seed gives the same rollout
lpips_dir = ''  # folder holding alexnet-owt-7be5be79.pth; '' = the torch hub cache
fid_weights = ''  # Inception weights file for FID ('' = $WM_FID_WEIGHTS); missing -> reported unavailable
fvd_weights = ''  # StyleGAN-V's i3d_torchscript.pt for FVD ('' = $WM_FVD_WEIGHTS); missing -> unavailable
fps_steps = 20  # timed steps for the batch-1 FPS (after 3 warm-up steps)
video_episodes = 4  # rows of rollout.gif
device = 'auto'  # cuda, then mps, then cpu; or name one
# ------------------------------------------------------------------------------------
METRICS = ('mse', 'psnr', 'ssim', 'uiqi', 'lpips')


def load_world_model(ckpt_path, dev, ae_path=''):
    """Dynamics + the autoencoder it was trained on (encoder fingerprint checked)."""
    ck = load_checkpoint(ckpt_path, expect_kind='dynamics')
    c = ck['config']
    gone = [k for k, off in (('dyn_residual', False), ('dyn_steps', 1), ('ema_decay', 0.0)) if c.get(k, off) != off]
    if 'action_map' not in ck or gone:  # (EXPERIMENTS.md says which commit had the options that are gone)
        raise SystemExit(f"checkpoint {ckpt_path!r} was written by an older train_dynamics.py {gone or ''}; train stage 2 again")
    ck['ae_ckpt'] = ae_path or os.path.join(os.path.dirname(ckpt_path), ck['ae_ckpt'])  # exported: a file beside it
    enc, dec, ae, _ = load_autoencoder(ck['ae_ckpt'], dev, ck['encoder_fingerprint'])
    dyn = M.Dynamics(ck['latent_shape'][0], c['dyn_ch'], c['dyn_depth'], ck['action_dim'], c['dyn_emb'], c['dyn_heads'],
                     c['dyn_spatial_attn'], ck['action_map'])
    dyn.load_state_dict(ck['model'])
    return dyn.to(dev).eval(), enc, dec, ck


class Simulator:
    """The world model as an environment, batched over N environments:

        sim = Simulator(dyn, enc, dec, ckpt)
        frame = sim.reset(frames)          # uint8 (N, S, S, 3), or a history (N, T, S, S, 3) + actions (N, T-1, A)
        frame = sim.step(action)           # action (N, A) in the dataset's units -> uint8 (N, S, S, 3)

    step() is the noisy-context sliding-window sampler: constant cost per frame, for as long as
    actions keep coming. Actions are normalised with the training statistics in the checkpoint."""

    def __init__(self, dyn, enc, dec, ck, window=0, ctx_level=15, decode_steps=3, seed=0):
        self.dyn, self.enc, self.dec, self.stats = dyn, enc, dec, ck['data']['action_stats']
        self.W, self.level, self.ksteps = window or ck['config']['window'], ctx_level, decode_steps
        self.dev = next(dyn.parameters()).device
        self.abar = M.sigmoid_alpha_bar().to(self.dev)
        self.A, self.S = ck['action_dim'], ck['data']['image_size']
        self.gen = torch.Generator().manual_seed(seed)

    def _norm(self, a):
        a = np.asarray(a, dtype=np.float32)
        if a.shape[-1] != self.A or not np.isfinite(a).all():
            raise ValueError(f"actions must be finite with {self.A} numbers each, got shape {a.shape}")
        return torch.from_numpy(D.normalize_actions(a, self.stats)).float().to(self.dev)

    @torch.no_grad()
    def reset(self, frames, actions=None):
        frames = np.asarray(frames)
        if frames.ndim == 4:
            frames = frames[:, None]  # (N, 1, S, S, 3)
        if frames.ndim != 5 or frames.shape[2:] != (self.S, self.S, 3) or frames.dtype != np.uint8:
            raise ValueError(f"frames must be uint8 (N, {self.S}, {self.S}, 3) or (N, T, ...), got {frames.dtype} {frames.shape}")
        N, T = frames.shape[:2]
        z = self.enc(M.frames_to_tensor(frames.reshape(N * T, self.S, self.S, 3), self.dev))
        z = z.reshape(N, T, *z.shape[1:])  # (N, T, C, h, w)
        self.ctx, self.act = M.init_window(z[:, 0], self.W, self.A)
        if T > 1:  # a recorded history: slide the real latents in with the actions that produced them
            a = self._norm(actions).reshape(N, T - 1, self.A)
            for k in range(1, T):
                self.ctx = torch.cat([self.ctx[:, 1:], z[:, k:k + 1]], 1)
                self.act = torch.cat([self.act[:, 1:], M.action_input(a[:, k - 1], 1)[:, None]], 1)
        return frames[:, -1]

    @torch.no_grad()
    def step(self, action):
        z, self.ctx, self.act = M.window_step(self.dyn, self.ctx, self.act, self._norm(action), self.abar,
                                              self.level, self.gen)
        return M.tensor_to_frames(M.decode(self.dec, z, self.ksteps, self.abar, self.S, self.gen))  # (N, S, S, 3)


def unseen_episodes(ck, data_dir, ranges):
    """Episodes of data_dir the checkpoint never trained on: its held-out ones, or all of a test set. -> (ids, own data?)"""
    own = os.path.abspath(data_dir) == os.path.abspath(ck['data']['data_dir'])
    return [i for i in (ck['data']['val_ids'] if own else range(len(ranges))) if i < len(ranges)], own


def load_data(ck, data_dir=''):
    """-> (dataset, its folder): data_dir, else the checkpoint's training data (shipped weights travel without it)."""
    path = data_dir or ck['data']['data_dir']
    try:
        return D.load_dataset(path), path
    except D.DatasetError as e:  # say what is missing and what to pass instead of a traceback
        raise SystemExit(f"error: {e}{'' if data_dir else ' (the checkpoint training data, not on this machine)'}; pass "
                         f"--data_dir=DIR, a dataset of the same kind (image size, actions), e.g. a test set collected for it")


def held_out_starts(ds, ck, n, rng, data_dir):
    """n real frames from episodes of ds (loaded from data_dir) that the checkpoint never trained on
    (random episode, random frame)."""
    ranges = D.episode_ranges(ds['episode_ends'])
    ids = unseen_episodes(ck, data_dir, ranges)[0] or list(range(len(ranges)))  # (val_frac 0: no held-out episode)
    pick = [ranges[ids[j]] for j in rng.integers(0, len(ids), n)]
    return np.stack([np.asarray(ds['frames'][rng.integers(s, e)]) for s, e in pick])


def main(cfg, extra_score=None, extra_keys=(), panels=('psnr', 'ssim')):
    """Open-loop evaluation (see the top of the file). extra_score / extra_keys: a task's per-frame
    scores and their names (score()); panels: the metrics drawn in curves.png."""
    torch.manual_seed(cfg['seed'])
    dev = pick_device(cfg['device'])
    dyn, enc, dec, ck = load_world_model(cfg['ckpt'], dev, cfg['ae_ckpt'])
    W = cfg['window'] or ck['config']['window']
    ds, data_dir = load_data(ck, cfg['data_dir'])
    S = ds['frames'].shape[1]
    if S != ck['data']['image_size'] or ds['actions'].shape[1] != ck['action_dim']:
        raise SystemExit(f"dataset has {S}x{S} frames and {ds['actions'].shape[1]}-d actions; the checkpoint wants "
                         f"{ck['data']['image_size']} and {ck['action_dim']}")
    ranges = D.episode_ranges(ds['episode_ends'])
    H = cfg['horizon']
    ids, own_data = unseen_episodes(ck, data_dir, ranges)
    val_ids = [i for i in ids if ranges[i][1] - ranges[i][0] > H]
    if not val_ids:
        raise SystemExit(f"no {'held-out ' if own_data else ''}episode of {data_dir!r} is longer than horizon {H}")
    eps = val_ids[:cfg['num_episodes']]
    print(f"rolling out {len(eps)} {'held-out' if own_data else 'test-set'} episodes x {H} steps: window {W}, context level {cfg['ctx_level']}, "
          f"decoder {'deterministic (one pass)' if dec.deterministic else 'steps ' + str(cfg['decode_steps'])}, seed {cfg['seed']}")

    sim = Simulator(dyn, enc, dec, ck, W, cfg['ctx_level'], cfg['decode_steps'], cfg['seed'])
    true = np.stack([np.asarray(ds['frames'][ranges[i][0]:ranges[i][0] + H + 1]) for i in eps])  # (E, H+1, S, S, 3)
    acts = np.stack([np.asarray(ds['actions'][ranges[i][0]:ranges[i][0] + H]) for i in eps])  # (E, H, A)
    t0 = time.time()
    pred = []
    for b in range(0, len(eps), cfg['batch_size']):  # episodes in parallel, open loop from the first frame
        sim.reset(true[b:b + cfg['batch_size'], 0])
        pred.append(np.stack([sim.step(acts[b:b + cfg['batch_size'], k]) for k in range(H)], 1))
    pred = np.concatenate(pred)  # (E, H, S, S, 3)
    print(f"rollout took {time.time()-t0:.1f} s")

    lp, lp_msg = Mx.load_lpips(cfg['lpips_dir'] or None)
    print(f"LPIPS: {'AlexNet weights loaded' if lp is not None else lp_msg}")
    E, keys = len(eps), METRICS + tuple(extra_keys)
    tgt = true[:, 1:].reshape(E * H, S, S, 3)  # (E*H, S, S, 3)
    copy = np.repeat(true[:, :1], H, axis=1).reshape(E * H, S, S, 3)  # the first frame, held
    res = {}
    for name, frames in (('model', pred.reshape(E * H, S, S, 3)), ('copy_baseline', copy)):
        mean, curves = Mx.summarise(Mx.score_frames(frames, tgt, lp, extra_score), E, H)
        res[name] = {k: mean.get(k) for k in keys} | {'curves': {k: curves.get(k) for k in keys}}

    # live-loop speed: batch 1, dynamics + decoder, after warm-up
    sim.reset(true[:1, 0])
    for k in range(3 + cfg['fps_steps']):
        if k == 3:
            t0 = time.time()
        sim.step(acts[:1, k % H])
    if dev == 'cuda':
        torch.cuda.synchronize()
    fps = cfg['fps_steps'] / (time.time() - t0)

    out = {'model': res['model'], 'copy_baseline': res['copy_baseline'], 'fps': fps, 'horizon': H,
           'num_episodes': E, 'data_dir': os.path.abspath(data_dir), 'episodes': [int(i) for i in eps], 'lpips_status': lp_msg if lp is None else 'ok',
           'knobs': {k: cfg[k] for k in ('window', 'ctx_level', 'decode_steps', 'seed')} | {'window': W},
           'ckpt': os.path.abspath(cfg['ckpt']), 'device': dev}
    out.update(Mx.fid_fvd(pred, true[:, 1:], cfg['fid_weights'] or None, cfg['fvd_weights'] or None, device=dev))
    print(f"FID: {out['fid_status'] if out['fid'] is None else round(out['fid'], 2)}; "
          f"FVD: {out['fvd_status'] if out['fvd'] is None else round(out['fvd'], 2)}")
    os.makedirs(cfg['out_dir'], exist_ok=True)
    with open(os.path.join(cfg['out_dir'], 'metrics.json'), 'w') as f:
        json.dump(out, f, indent=1)
    Mx.write_curves(cfg['out_dir'], {n: res[n]['curves'] for n in ('model', 'copy_baseline')}, panels)  # curves.csv/.png
    Mx.write_video(os.path.join(cfg['out_dir'], 'rollout.gif'), true[:cfg['video_episodes'], 1:], pred[:cfg['video_episodes']])
    Mx.write_strip(os.path.join(cfg['out_dir'], 'rollout.png'), true[:cfg['video_episodes'], 1:], pred[:cfg['video_episodes']])

    f = lambda v: 'unavailable' if v is None else f'{v:10.4f}'
    print(f"\n{'metric':>14} {'model':>10} {'copy-first':>10}\n" + '\n'.join(f"{k:>14} {f(res['model'][k]):>10} {f(res['copy_baseline'][k]):>10}" for k in keys))
    print(f"{'fps (batch 1)':>14} {fps:10.2f}\nwrote {cfg['out_dir']}/metrics.json and rollout.gif")
    return out


if __name__ == '__main__':
    main(config_from_globals(globals()))
