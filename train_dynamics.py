"""
Stage 2: train the latent dynamics consistency model on a frozen encoder (Wang et al. 2026,
arXiv 2603.08546). The dataset is encoded once and cached; stage 2 never touches pixels again
(except to draw sample images with the stage-1 decoder).

    python train_dynamics.py config/dyn_pusht_cpu.py --data_dir=data/pusht64 --ae_ckpt=out/ae/ckpt.pt \
        --out_dir=out/dyn --max_iters=2000

Action alignment (kept everywhere): frame k+1 is predicted from frames <= k and actions <= k,
where action k is the command issued after seeing frame k. In a window, the action attached to a
frame is the one that produced it.
"""
import json
import math
import os
import time

import numpy as np
import torch

import data as D
import model as M
from common import config_from_globals, load_autoencoder, load_checkpoint, pick_device, save_checkpoint, save_grid

# ---------------------------------------------------------------------------- defaults
data_dir = 'data/pusht64'
ae_ckpt = 'out/ae/ckpt.pt'
out_dir = 'out/dyn'
init_from = 'scratch'  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
val_frac = 0.1  # the split must match stage 1's so held-out episodes stay held out
split_seed = 0
# model
window = 10  # frames per training window: window-1 context + 1 new
dyn_ch = 64
dyn_depth = 2
dyn_emb = 128
dyn_heads = 4
dyn_spatial_attn = 'all'  # spatial attention in every block ('all') or only the middle one ('mid')
motion_weight = 0.0  # > 0: extra loss weight on latent pixels that change (see model.dynamics_loss)
ctx_noise = True  # noise the context latents at U{1..99} in training (the paper's robustness trick)
# optimisation
batch_size = 16
max_iters = 2000
lr = 1e-3
min_lr = 1e-4
warmup_iters = 100
weight_decay = 0.0
grad_clip = 1.0
# logging / eval
log_interval = 50
eval_interval = 500
val_episodes = 8
val_horizon = 30  # short open-loop latent rollout in validation
ctx_level = 15  # the context label at inference
decode_steps = 3
seed = 0
device = 'auto'
compile = False
# ------------------------------------------------------------------------------------
config = config_from_globals(globals())
globals().update(config)


@torch.no_grad()
def encode_dataset(enc, frames, dev, cache_path, fp, bs=256):
    """All frames -> latents (N, C, h, w) float32, once; cached next to the checkpoint, keyed by the
    encoder fingerprint and the frame count, so a resume or a second run does not re-encode."""
    if os.path.isfile(cache_path):
        c = np.load(cache_path, mmap_mode='r')
        meta_path = cache_path + '.json'
        if os.path.isfile(meta_path) and json.load(open(meta_path)) == {'encoder': fp, 'n': len(frames)} and len(c) == len(frames):
            return torch.from_numpy(np.ascontiguousarray(c))
    out = []
    for i in range(0, len(frames), bs):
        out.append(enc(M.frames_to_tensor(np.asarray(frames[i:i + bs]), dev)).cpu())
    z = torch.cat(out)  # (N, C, h, w)
    np.save(cache_path + '.tmp.npy', z.numpy())
    os.replace(cache_path + '.tmp.npy', cache_path)
    json.dump({'encoder': fp, 'n': len(frames)}, open(cache_path + '.json', 'w'))
    return z


def make_windows(ends_idx, starts, W, action_dim, actions_norm):
    """Index tables for training windows. For a target frame e (not an episode's first frame) the
    window holds frames e-W+1..e, clamped at the episode start (the first frame repeated), and the
    action attached to frame p is a_{p-1} when p-1 is inside the episode, else 'no action'."""
    e = torch.as_tensor(ends_idx)[:, None]  # (B, 1) target frame index
    st = torch.as_tensor(starts)[:, None]  # (B, 1) its episode's first frame
    p = e - W + 1 + torch.arange(W)[None]  # (B, W) raw positions
    frame_idx = torch.maximum(p, st)  # (B, W)
    valid = (p - 1 >= st)  # (B, W) an action produced this frame
    a = actions_norm[(p - 1).clamp(min=0)]  # (B, W, A)
    act = torch.cat([a * valid[..., None], valid[..., None].float()], -1)  # (B, W, A+1), as M.action_input
    return frame_idx, act


@torch.no_grad()
def latent_rollout(dyn, z_true, a_norm, abar, W, level, steps, gen=None):
    """Open-loop from the first latent of each sequence with recorded actions.
    z_true (B, H+1, C, h, w), a_norm (B, H, A) -> predicted latents (B, H, C, h, w)."""
    ctx, act = M.init_window(z_true[:, 0], W, a_norm.shape[-1])
    preds = []
    for k in range(a_norm.shape[1]):
        z, ctx, act = M.window_step(dyn, ctx, act, a_norm[:, k], abar, level, steps, gen)
        preds.append(z)
    return torch.stack(preds, 1)


def main():
    torch.manual_seed(seed)
    dev = pick_device(device)
    os.makedirs(out_dir, exist_ok=True)
    if not os.access(out_dir, os.W_OK):
        raise SystemExit(f"out_dir {out_dir!r} is not writable")
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')

    resume = load_checkpoint(ckpt_path, expect_kind='dynamics') if init_from == 'resume' else None
    enc, dec, ae, fp = load_autoencoder(ae_ckpt, dev, resume['encoder_fingerprint'] if resume else None)
    ds = D.load_dataset(data_dir)
    S = int(ds['frames'].shape[1])
    if S != ae['data']['image_size']:
        raise SystemExit(f"data {data_dir!r} has {S}x{S} frames but the autoencoder {ae_ckpt!r} was trained on {ae['data']['image_size']}")
    ends = ds['episode_ends']
    ranges = D.episode_ranges(ends)
    train_ids, val_ids = D.split_episodes(len(ends), val_frac, split_seed)
    stats = D.action_stats(ds['actions'], ends, train_ids)
    A = ds['actions'].shape[1]
    a_norm = torch.from_numpy(D.normalize_actions(np.asarray(ds['actions'], dtype=np.float32), stats)).float()

    t0 = time.time()
    z_all = encode_dataset(enc, ds['frames'], dev, os.path.join(out_dir, 'latents.npy'), fp)
    print(f"latents {tuple(z_all.shape)} for {len(ends)} episodes ({len(train_ids)} train / {len(val_ids)} val), "
          f"encoded or loaded in {time.time()-t0:.1f} s")
    # every frame that is not its episode's first can be a training target
    tgt = np.concatenate([np.arange(ranges[i][0] + 1, ranges[i][1]) for i in train_ids])
    tgt_start = np.concatenate([np.full(ranges[i][1] - ranges[i][0] - 1, ranges[i][0]) for i in train_ids])

    dyn = M.Dynamics(z_all.shape[1], dyn_ch, dyn_depth, A, dyn_emb, dyn_heads, dyn_spatial_attn).to(dev)
    abar = M.sigmoid_alpha_bar().to(dev)
    opt = torch.optim.AdamW(dyn.parameters(), lr=lr, weight_decay=weight_decay)
    it, best = 0, float('inf')
    run_cfg = dict(config)
    if resume is not None:
        for k in ('window', 'dyn_ch', 'dyn_depth', 'dyn_emb', 'dyn_heads', 'dyn_spatial_attn'):
            if resume['config'][k] != config[k]:
                raise SystemExit(f"{ckpt_path}: checkpoint has {k}={resume['config'][k]!r}, this run has {config[k]!r}")
        dyn.load_state_dict(resume['model'])
        opt.load_state_dict(resume['optimizer'])
        it, best = resume['iter'], resume['best_val']
    dyn_run = torch.compile(dyn) if compile else dyn
    print(f"dynamics {sum(p.numel() for p in dyn.parameters())/1e6:.3f}M params, window {window}, device {dev}")

    # validation set: the first val_horizon+1 frames of some held-out episodes
    vids = list(val_ids)[:val_episodes]
    H = min([val_horizon] + [ranges[i][1] - ranges[i][0] - 1 for i in vids])
    vz = torch.stack([z_all[ranges[i][0]:ranges[i][0] + H + 1] for i in vids]).to(dev)  # (V, H+1, C, h, w)
    va = torch.stack([a_norm[ranges[i][0]:ranges[i][0] + H] for i in vids]).to(dev)  # (V, H, A)

    def get_lr(i):
        if i < warmup_iters:
            return lr * (i + 1) / warmup_iters
        r = min(1.0, (i - warmup_iters) / max(1, max_iters - warmup_iters))
        return min_lr + 0.5 * (1 + math.cos(math.pi * r)) * (lr - min_lr)

    def save(val):
        save_checkpoint({
            'kind': 'dynamics', 'model': dyn.state_dict(), 'optimizer': opt.state_dict(), 'iter': it,
            'best_val': best, 'val_latent_mse': val, 'config': run_cfg,
            'ae_ckpt': os.path.abspath(ae_ckpt), 'encoder_fingerprint': fp,
            'latent_shape': list(z_all.shape[1:]), 'action_dim': A,
            'data': {'data_dir': os.path.abspath(data_dir), 'meta': ds['meta'], 'image_size': S,
                     'train_ids': [int(i) for i in train_ids], 'val_ids': [int(i) for i in val_ids],
                     'action_stats': stats},
        }, ckpt_path)

    rng = np.random.default_rng(seed + it)
    t0 = time.time()
    while it < max_iters:
        for g in opt.param_groups:
            g['lr'] = get_lr(it)
        pick = rng.integers(0, len(tgt), batch_size)
        fidx, act = make_windows(tgt[pick], tgt_start[pick], window, A, a_norm)
        z = z_all[fidx].to(dev)  # (B, W, C, h, w)
        loss = M.dynamics_loss(dyn_run, z, act.to(dev), abar, ctx_noise, motion_weight)
        if not torch.isfinite(loss):
            raise SystemExit(f"iter {it}: loss is {loss.item()}; stopping, last good checkpoint left untouched")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dyn.parameters(), grad_clip)
        opt.step()
        it += 1
        if it % log_interval == 0 or it == 1:
            dt = (time.time() - t0) / (log_interval if it > 1 else 1)
            t0 = time.time()
            print(f"iter {it}: loss {loss.item():.5f}, lr {get_lr(it):.2e}, {dt*1000:.0f} ms/iter", flush=True)
        if it % eval_interval == 0 or it == max_iters:
            dyn.eval()
            g = torch.Generator().manual_seed(0)
            pred = latent_rollout(dyn, vz, va, abar, window, ctx_level, 1, g)
            err = ((pred - vz[:, 1:]) ** 2).mean().item()
            copy = ((vz[:, :1] - vz[:, 1:]) ** 2).mean().item()
            best = min(best, err)
            print(f"iter {it}: val {H}-step open-loop latent MSE {err:.5f} (copy-first-latent baseline {copy:.5f})", flush=True)
            with torch.no_grad():  # sample strip: truth row, prediction row, every 3rd step
                ks = list(range(0, H, 3))[:10]
                gd = torch.Generator().manual_seed(0)
                rows = [M.tensor_to_frames(M.decode(dec, vz[0, [k + 1 for k in ks]], decode_steps, abar, S, gd)),
                        M.tensor_to_frames(M.decode(dec, pred[0, ks], decode_steps, abar, S, gd))]
            save_grid(os.path.join(out_dir, f'samples_{it:06d}.png'), rows)
            dyn.train()
            save(err)
            t0 = time.time()


if __name__ == '__main__':
    main()
