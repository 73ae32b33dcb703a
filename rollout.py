"""
Open-loop evaluation of the world model against recorded held-out episodes.

    python rollout.py --ckpt=out/dyn/ckpt.pt --num_episodes=8 --horizon=192 --out_dir=out/eval

From the first frame of each held-out episode, the model predicts `horizon` frames from the recorded
actions alone (the noisy-context sliding-window sampler: window-1 context latents labelled with a
small noise level, the new latent jumped 999 -> 0, decoded in K jumps), and every predicted frame is
compared with the recorded one. The copy-the-first-frame baseline is scored in the same run.
Writes OUT/metrics.json, OUT/rollout.gif (truth | prediction | error) and prints a table.
All image metrics are on [0, 1] images (data range 1).
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
data_dir = ''  # '' = the dataset the dynamics checkpoint was trained on (its held-out episodes)
out_dir = 'out/eval'
num_episodes = 8
horizon = 192
window = 0  # 0 = the training window stored in the checkpoint
ctx_level = 15  # noise level the context latents are labelled with
dyn_steps = 1  # dynamics jumps per frame (999 -> 0)
decode_steps = 3  # decoder jumps per frame
batch_size = 8  # episodes rolled out in parallel
seed = 0
lpips_dir = ''  # folder holding alexnet-owt-7be5be79.pth; '' = the torch hub cache
fps_steps = 20  # timed steps for the batch-1 FPS (after 3 warm-up steps)
video_episodes = 4
device = 'auto'
# ------------------------------------------------------------------------------------
METRICS = ('mse', 'psnr', 'ssim', 'uiqi', 'lpips', 'agent_err_px', 'block_iou')


def load_world_model(ckpt_path, dev, ae_path=''):
    """Dynamics + the autoencoder it was trained on (encoder fingerprint checked)."""
    ck = load_checkpoint(ckpt_path, expect_kind='dynamics')
    c = ck['config']
    enc, dec, ae, _ = load_autoencoder(ae_path or ck['ae_ckpt'], dev, ck['encoder_fingerprint'])
    dyn = M.Dynamics(ck['latent_shape'][0], c['dyn_ch'], c['dyn_depth'], ck['action_dim'], c['dyn_emb'], c['dyn_heads'])
    dyn.load_state_dict(ck['model'])
    return dyn.to(dev).eval(), enc, dec, ck


@torch.no_grad()
def imagine(dyn, enc, dec, frame0, a_norm, abar, W, level, dsteps, ksteps, gen):
    """frame0 uint8 (B, S, S, 3), a_norm (B, H, A) -> predicted uint8 frames (B, H, S, S, 3)."""
    dev = next(dyn.parameters()).device
    z0 = enc(M.frames_to_tensor(frame0, dev))
    ctx, act = M.init_window(z0, W, a_norm.shape[-1])
    out = []
    for k in range(a_norm.shape[1]):
        z, ctx, act = M.window_step(dyn, ctx, act, a_norm[:, k].to(dev), abar, level, dsteps, gen)
        out.append(M.tensor_to_frames(M.decode(dec, z, ksteps, abar, frame0.shape[1], gen)))
    return np.stack(out, 1)


def score(pred_u8, true_u8, lp):
    """Per-frame metrics of uint8 frames (N, S, S, 3) -> dict of (N,) numpy arrays."""
    x = torch.from_numpy(pred_u8).permute(0, 3, 1, 2).float() / 255
    y = torch.from_numpy(true_u8).permute(0, 3, 1, 2).float() / 255
    r = {'mse': Mx.mse(x, y).numpy(), 'psnr': Mx.psnr(x, y).numpy(), 'ssim': Mx.ssim(x, y).numpy(),
         'uiqi': Mx.uiqi(x, y).numpy()}
    r['lpips'] = Mx.lpips_distance(lp, x, y).numpy() if lp is not None else None
    r.update(Mx.pusht_physics(pred_u8, true_u8))
    return r


def write_video(path, true_u8, pred_u8, fps=10, scale=3):
    """Animated GIF, one row per episode: truth | prediction | |error| (amplified x2)."""
    from PIL import Image
    err = np.clip(np.abs(true_u8.astype(np.int16) - pred_u8.astype(np.int16)) * 2, 0, 255).astype(np.uint8)
    row = np.concatenate([true_u8, pred_u8, err], axis=3)  # (E, H, S, 3S, 3)
    grid = np.concatenate(list(row), axis=1)  # (H, E*S, 3S, 3)
    frames = [Image.fromarray(g).resize((g.shape[1] * scale, g.shape[0] * scale), Image.NEAREST) for g in grid]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0)


def main(cfg):
    torch.manual_seed(cfg['seed'])
    dev = pick_device(cfg['device'])
    dyn, enc, dec, ck = load_world_model(cfg['ckpt'], dev, cfg['ae_ckpt'])
    W = cfg['window'] or ck['config']['window']
    stats = ck['data']['action_stats']
    ds = D.load_dataset(cfg['data_dir'] or ck['data']['data_dir'])
    S = ds['frames'].shape[1]
    if S != ck['data']['image_size'] or ds['actions'].shape[1] != ck['action_dim']:
        raise SystemExit(f"dataset has {S}x{S} frames and {ds['actions'].shape[1]}-d actions; the checkpoint wants "
                         f"{ck['data']['image_size']} and {ck['action_dim']}")
    ranges = D.episode_ranges(ds['episode_ends'])
    H = cfg['horizon']
    val_ids = [i for i in ck['data']['val_ids'] if i < len(ranges) and ranges[i][1] - ranges[i][0] > H]
    if not val_ids:
        raise SystemExit(f"no held-out episode is longer than horizon {H}")
    eps = val_ids[:cfg['num_episodes']]
    abar = M.sigmoid_alpha_bar().to(dev)
    print(f"rolling out {len(eps)} held-out episodes x {H} steps: window {W}, context level {cfg['ctx_level']}, "
          f"dynamics steps {cfg['dyn_steps']}, decoder steps {cfg['decode_steps']}, seed {cfg['seed']}")

    gen = torch.Generator().manual_seed(cfg['seed'])
    true = np.stack([np.asarray(ds['frames'][ranges[i][0]:ranges[i][0] + H + 1]) for i in eps])  # (E, H+1, S, S, 3)
    acts = np.stack([np.asarray(ds['actions'][ranges[i][0]:ranges[i][0] + H]) for i in eps])  # (E, H, A)
    a_norm = torch.from_numpy(D.normalize_actions(acts.astype(np.float32), stats)).float()
    t0 = time.time()
    pred = np.concatenate([imagine(dyn, enc, dec, true[b:b + cfg['batch_size'], 0], a_norm[b:b + cfg['batch_size']], abar, W,
                                   cfg['ctx_level'], cfg['dyn_steps'], cfg['decode_steps'], gen)
                           for b in range(0, len(eps), cfg['batch_size'])])  # (E, H, S, S, 3)
    print(f"rollout took {time.time()-t0:.1f} s")

    lp, lp_msg = Mx.load_lpips(cfg['lpips_dir'] or None)
    print(f"LPIPS: {'AlexNet weights loaded' if lp is not None else lp_msg}")
    E = len(eps)
    tgt = true[:, 1:].reshape(E * H, S, S, 3)  # (E*H, S, S, 3)
    copy = np.repeat(true[:, :1], H, axis=1).reshape(E * H, S, S, 3)  # the first frame, held
    res = {}
    for name, frames in (('model', pred.reshape(E * H, S, S, 3)), ('copy_baseline', copy)):
        r = score(frames, tgt, lp)
        res[name] = {k: (None if r[k] is None else float(r[k].mean())) for k in METRICS}
        res[name]['curves'] = {k: (None if r[k] is None else r[k].reshape(E, H).mean(0).round(6).tolist()) for k in METRICS}

    # live-loop speed: batch 1, dynamics + decoder, after warm-up
    ctx, act = M.init_window(enc(M.frames_to_tensor(true[:1, 0], dev)), W, a_norm.shape[-1])
    for k in range(3 + cfg['fps_steps']):
        if k == 3:
            t0 = time.time()
        z, ctx, act = M.window_step(dyn, ctx, act, a_norm[:1, k % H].to(dev), abar, cfg['ctx_level'], cfg['dyn_steps'], gen)
        M.decode(dec, z, cfg['decode_steps'], abar, S, gen)
    if dev == 'cuda':
        torch.cuda.synchronize()
    fps = cfg['fps_steps'] / (time.time() - t0)

    out = {'model': res['model'], 'copy_baseline': res['copy_baseline'], 'fps': fps, 'horizon': H,
           'num_episodes': E, 'episodes': [int(i) for i in eps], 'lpips_status': lp_msg if lp is None else 'ok',
           'knobs': {k: cfg[k] for k in ('window', 'ctx_level', 'dyn_steps', 'decode_steps', 'seed')} | {'window': W},
           'ckpt': os.path.abspath(cfg['ckpt']), 'device': dev}
    os.makedirs(cfg['out_dir'], exist_ok=True)
    with open(os.path.join(cfg['out_dir'], 'metrics.json'), 'w') as f:
        json.dump(out, f, indent=1)
    write_video(os.path.join(cfg['out_dir'], 'rollout.gif'), true[:cfg['video_episodes'], 1:], pred[:cfg['video_episodes']])

    print(f"\n{'metric':>14} {'model':>10} {'copy-first':>10}")
    for k in METRICS:
        a, b = res['model'][k], res['copy_baseline'][k]
        print(f"{k:>14} {'unavailable' if a is None else f'{a:10.4f}':>10} {'unavailable' if b is None else f'{b:10.4f}':>10}")
    print(f"{'fps (batch 1)':>14} {fps:10.2f}\nwrote {cfg['out_dir']}/metrics.json and rollout.gif")
    return out


if __name__ == '__main__':
    main(config_from_globals(globals()))
