"""
Stage 2: train the latent dynamics consistency model on a frozen encoder (Wang et al. 2026,
arXiv 2603.08546). The dataset is encoded once and cached; stage 2 never touches pixels again
(except to draw sample images with the stage-1 decoder).

    python train_dynamics.py config/dyn_pusht_cpu.py --data_dir=data/pusht64 --ae_ckpt=out/ae/ckpt.pt \
        --out_dir=out/dyn --max_iters=2000

Each window of W frames trains W-1 predictions in one pass (all_frames, see model.dynamics_loss): frame
j+1 from noise, seeing the (noised) context frames <= j, exactly as a rollout would show it to the net.

Action alignment (kept everywhere): frame k+1 is predicted from frames <= k and actions <= k,
where action k is the command issued after seeing frame k. In a window, the action attached to a
frame is the one that produced it.

Several GPUs (or CPU processes, gloo): torchrun --standalone --nproc_per_node=N train_dynamics.py ...
Global batch per optimizer step = batch_size * grad_accum * N (batch_size is per micro-batch and rank).
"""
from copy import deepcopy
import json
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import data as D
import model as M
from common import (autocast, choose_bf16, all_gather, check_compatible, check_finite_weights, check_out_dir, checkpoint_bytes,
                    config_from_globals, ddp_cleanup, ddp_setup, ddp_sync, keep_copy, load_autoencoder,
                    load_checkpoint, rng_state, save_checkpoint, save_grid, seed_streams, set_rng_state)

# ---------------------------------------------------------------------------- defaults
data_dir = 'data/pusht64'
ae_ckpt = 'out/ae/ckpt.pt'
out_dir = 'out/dyn'
init_from = 'scratch'  # 'scratch', 'resume' (from out_dir/ckpt.pt), or a dynamics checkpoint's path: a warm start
                       # (its weights and action statistics; this run's data, split, optimizer and schedule)
val_frac = 0.1  # the split must match stage 1's so held-out episodes stay held out
split_seed = 0  # as stage 1's
# model (model.Dynamics)
window = 10  # frames per training window: window-1 context + 1 new
dyn_ch = 64  # width of every block; the latent grid is never downsampled (S/4 throughout)
dyn_depth = 2  # blocks on each side of the middle one (UNet-style skips at the same resolution)
dyn_emb = 128  # width of the noise-level and action embeddings that FiLM each block
dyn_heads = 4  # heads of the spatial and the causal temporal attention
dyn_spatial_attn = 'all'  # spatial attention in every block ('all') or only the middle one ('mid')
dyn_action_map = False  # draw the action as a spot on the latent grid (model.Dynamics); only for data whose meta.json
                        # declares image_point_dims (the action is a point in the image, as in Push-T)
all_frames = True  # every frame of a window is a prediction target in one pass (model.dynamics_loss); False: only the last
ctx_noise = True  # noise the context latents at U{1..ctx_noise_max} in training (the paper's robustness trick)
ctx_noise_max = 99  # the paper's 99 (noise std ~0.2 of the unit-norm latent); larger asks the net to clean up a
                    # context further from the data, as its own drifting rollout is; 300 did not pay at 1600
                    # iterations, two seeds (README: "A wider context-noise range")
# options that target the T block (not in the paper; README lever tables): dyn_residual did not pay; own_ctx did
# not pay from scratch at 7 minutes, but did as a warm start from the long recipe's model; motion_sampling and
# ema_decay did not pay at 1600 iterations (two seeds each)
dyn_residual = False  # predict the change of the latent since the previous frame (model.Dynamics)
dyn_steps = 1  # jumps of the new frame 999 -> 0: 1 is the paper's one jump (trained on (999, 0) only); K > 1 trains
               # the K-jump path's segments with consistency targets (model.new_frame_levels) and rolls out in K
               # dynamics passes per frame (K x the dynamics cost). Not in any recipe; README lever table
own_ctx = 0.0  # fraction of windows whose context is the model's own open-loop rollout (model.own_context), ~+30% per iter at 0.5
ema_decay = 0.0  # 0 = off; else keep an exponential moving average of the weights (decay per iter, warmed up as
                 # min(decay, (1+it)/(10+it))), used for validation and saved as 'model_ema', which rollouts then load
change_weight = 0.0  # weight each latent position of the loss by 1 + this x (the context's last change there / the mean):
                     # where the T and agent were moving counts more (model.change_weighted_mse); 0 = the paper's uniform MSE.
                     # Did not pay at 1600 iterations, two seeds: the rollouts drift (README "Weighting the loss...")
motion_sampling = 0.0  # draw windows with p ~ 1 + this x (their latent change / the mean): more of the steps where things move (data.motion_probs)
# optimisation
batch_size = 16  # per micro-batch and rank: global batch = batch_size * grad_accum * world_size
grad_accum = 1  # micro-batches per rank per optimizer step
max_iters = 2000
lr = 1e-3  # peak learning rate: linear warm-up, then cosine decay to min_lr at max_iters
min_lr = 1e-4
warmup_iters = 100
weight_decay = 0.0
grad_clip = 1.0  # clip the global gradient norm
# logging / eval
log_interval = 50
eval_interval = 500  # open-loop validation, sample strip and checkpoint every this many iters
val_episodes = 8  # held-out episodes in that validation
val_horizon = 30  # short open-loop latent rollout in validation
ctx_level = 15  # the context label at inference
decode_steps = 3  # decoder jumps for the sample strip (a deterministic decoder makes one pass)
ckpt_interval = 0  # write the latest checkpoint every this many iters (0 = eval_interval); evals write it too
seed = 0
# 'stream': each rank draws its windows and noise from its own RNG streams (saved in the checkpoint, so
# a resume is exact); 'micro': every micro-batch reseeds from (seed, iter, global micro-batch index), so
# a step's global batch is the same however it is split (2 ranks x grad_accum 1 == 1 rank x grad_accum 2)
sample_seed = 'stream'
debug_nan_at_iter = -1  # test hook: a NaN in rank 0's loss at the step logged as this iter
device = 'auto'
compile = False
amp = 'fp32'  # 'fp32' (the reference, every recipe's numbers), 'bf16' (autocast around the loss), or 'auto': bf16 on
              # CUDA, and on a CPU only if a start-up probe of this model's step says it pays (common.choose_bf16)
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
            return torch.from_numpy(np.array(c))  # a writable copy in memory (torch refuses to share a read-only map)
    out = []
    for i in range(0, len(frames), bs):
        out.append(enc(M.frames_to_tensor(np.asarray(frames[i:i + bs]), dev)).cpu())
    # contiguous like the cached copy: randn_like follows the memory layout, so a fresh run and a resumed
    # one (which reads the cache) would otherwise draw different noise for the same seed
    z = torch.cat(out).contiguous()  # (N, C, h, w)
    np.save(cache_path + '.tmp.npy', z.numpy())
    os.replace(cache_path + '.tmp.npy', cache_path)
    json.dump({'encoder': fp, 'n': len(frames)}, open(cache_path + '.json', 'w'))
    return z


@torch.no_grad()
def latent_rollout(dyn, z_true, a_norm, abar, W, level, gen=None, steps=1):
    """Open-loop from the first latent of each sequence with recorded actions.
    z_true (B, H+1, C, h, w), a_norm (B, H, A) -> predicted latents (B, H, C, h, w)."""
    ctx, act = M.init_window(z_true[:, 0], W, a_norm.shape[-1])
    preds = []
    for k in range(a_norm.shape[1]):
        z, ctx, act = M.window_step(dyn, ctx, act, a_norm[:, k], abar, level, gen, steps)
        preds.append(z)
    return torch.stack(preds, 1)


ARCH_KEYS = ('window', 'dyn_ch', 'dyn_depth', 'dyn_emb', 'dyn_heads', 'dyn_spatial_attn', 'dyn_action_map', 'dyn_residual')


def main():
    ddp, rank, local_rank, world, dev = ddp_setup(device)
    master = rank == 0  # only rank 0 logs, evaluates and writes checkpoints
    if not motion_sampling >= 0:
        raise SystemExit(f"motion_sampling must be >= 0 (0 draws windows uniformly), got {motion_sampling}")
    if not change_weight >= 0 or (change_weight > 0 and dyn_steps > 1):
        raise SystemExit(f"change_weight must be >= 0 (0 is the uniform loss) and needs dyn_steps=1, got {change_weight} "
                         f"with dyn_steps={dyn_steps}")
    if not 1 <= ctx_noise_max < M.T_STEPS - 1:
        raise SystemExit(f"ctx_noise_max must be in 1..{M.T_STEPS - 2} (context levels are drawn from U{{1..ctx_noise_max}}), got {ctx_noise_max}")
    if not (isinstance(dyn_steps, int) and 1 <= dyn_steps <= 50) or (dyn_steps > 1 and dyn_residual):
        raise SystemExit(f"dyn_steps must be an int in 1..50 (jumps of the new frame), and 1 for a residual model "
                         f"(dyn_residual); got dyn_steps={dyn_steps!r}, dyn_residual={dyn_residual}")
    if not 0 <= ema_decay < 1:
        raise SystemExit(f"ema_decay must be in [0, 1) (0 = no moving average), got {ema_decay}")
    if sample_seed not in ('stream', 'micro') or grad_accum < 1:
        raise SystemExit(f"sample_seed must be 'stream' or 'micro' (got {sample_seed!r}), grad_accum >= 1 (got {grad_accum})")
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    best_path = os.path.join(out_dir, 'ckpt_best.pt')

    resume = load_checkpoint(ckpt_path, expect_kind='dynamics') if init_from == 'resume' else None
    warm = None
    if init_from not in ('scratch', 'resume'):  # a warm start (a typo is not taken for a path)
        if not os.path.isfile(init_from):
            raise SystemExit(f"init_from must be 'scratch', 'resume' or a dynamics checkpoint's path; {init_from!r} does not exist")
        warm = load_checkpoint(init_from, expect_kind='dynamics')
    src = resume or warm  # the latents must come from the encoder the weights were trained on
    enc, dec, ae, fp = load_autoencoder(ae_ckpt, dev, src['encoder_fingerprint'] if src else None)
    # room for the latest, the best and one being written; checked before any data is read. The size
    # hardly depends on the action dim, so a weightless (meta) model with 2 stands in for it.
    with torch.device('meta'):
        probe = M.Dynamics(ae['config']['latent_ch'], dyn_ch, dyn_depth, 2, dyn_emb, dyn_heads, dyn_spatial_attn,
                           {'dims': [0, 1], 'scale': [1, 1], 'offset': [0, 0]} if dyn_action_map else None)
    est = checkpoint_bytes([probe])
    check_out_dir(out_dir, 3 * est, rank)

    ds = D.load_dataset(data_dir)
    S = int(ds['frames'].shape[1])
    if S != ae['data']['image_size']:
        raise SystemExit(f"data {data_dir!r} has {S}x{S} frames but the autoencoder {ae_ckpt!r} was trained on {ae['data']['image_size']}")
    # whether an action is a point in the image is a fact about the data: meta.json says so (checked before any work)
    dims = ds['meta'].get('image_point_dims')
    if dyn_action_map and not (isinstance(dims, list) and len(dims) == 2):
        raise SystemExit(f"dyn_action_map=True draws the action as a point in the image, but {data_dir}/meta.json does "
                         f"not declare which action dims are one (image_point_dims, e.g. [0, 1] for Push-T's (x, y) "
                         f"target); its {ds['actions'].shape[1]}-d actions are not drawn. Train with --dyn_action_map=False, or "
                         f"add image_point_dims to meta.json if two action dims really are an (x, y) image position.")
    ends = ds['episode_ends']
    ranges = D.episode_ranges(ends)
    train_ids, val_ids = D.split_episodes(len(ends), val_frac, split_seed)
    train_ids, val_ids = [int(i) for i in train_ids], [int(i) for i in val_ids]
    # a warm start or a resume keeps the normalisation its weights learned (new data may span another range)
    stats = src['data']['action_stats'] if src else D.action_stats(ds['actions'], ends, train_ids)
    A = ds['actions'].shape[1]
    if warm is not None:  # same network and action size; data, split and schedule are this run's own
        check_compatible(init_from, warm['config'], config, ARCH_KEYS, [('action_dim', warm['action_dim'], A)])
    a_norm_np = D.normalize_actions(np.asarray(ds['actions'], dtype=np.float32), stats)  # (N, A) in [-1, 1]
    a_norm = torch.from_numpy(a_norm_np).float()
    if resume is not None:  # a resume must continue the same run: same architecture, data and split
        d = resume['data']
        check_compatible(ckpt_path, resume['config'], config, ARCH_KEYS, [
            ('data_dir', d['data_dir'], os.path.abspath(data_dir)), ('image_size', d['image_size'], S),
            ('action_dim', resume['action_dim'], A), ('train_ids', d['train_ids'], train_ids),
            ('val_ids', d['val_ids'], val_ids)])
    # the latent cache (float32, latent_ch x S/4 x S/4 per frame), unless already there, must fit too
    cache = os.path.join(out_dir, 'latents.npy')
    lat_bytes = 0 if os.path.isfile(cache) else len(ds['frames']) * ae['config']['latent_ch'] * (S // 4) ** 2 * 4
    check_out_dir(out_dir, 3 * est + lat_bytes, rank)

    t0 = time.time()
    if master:  # rank 0 encodes and writes the cache, the others then read it
        z_all = encode_dataset(enc, ds['frames'], dev, cache, fp)
    if ddp:
        dist.barrier()
    if not master:  # (a rank that cannot see rank 0's out_dir encodes for itself)
        z_all = encode_dataset(enc, ds['frames'], dev, cache, fp)
    if master:
        print(f"latents {tuple(z_all.shape)} for {len(ends)} episodes ({len(train_ids)} train / {len(val_ids)} val), "
              f"encoded or loaded in {time.time()-t0:.1f} s")
    # every frame that is not its episode's first can be a training target
    tgt, tgt_start = D.window_targets(ranges, train_ids)
    probs = None
    if motion_sampling > 0:  # how much each frame's latent differs from the previous one (0 at an episode's start)
        step = torch.zeros(len(z_all))
        step[1:] = ((z_all[1:] - z_all[:-1]) ** 2).mean((1, 2, 3))  # (N-1,)
        step[[r[0] for r in ranges]] = 0
        probs = D.motion_probs(step.numpy(), tgt, tgt_start, window, motion_sampling)

    torch.manual_seed(seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    amap = None
    if dyn_action_map:
        amap = M.point_map(dims, stats, ds['meta']['action_low'], ds['meta']['action_high'], S, z_all.shape[-1])
    dyn = M.Dynamics(z_all.shape[1], dyn_ch, dyn_depth, A, dyn_emb, dyn_heads, dyn_spatial_attn, amap,
                     dyn_residual).to(dev)
    abar = M.sigmoid_alpha_bar().to(dev)
    opt = torch.optim.AdamW(dyn.parameters(), lr=lr, weight_decay=weight_decay)
    it, best, last_val = 0, float('inf'), None
    run_cfg = dict(config)
    np_rng, _ = seed_streams(seed, 0, rank)  # this rank's streams: windows (numpy), levels and noise (torch)
    if resume is not None:
        dyn.load_state_dict(resume['model'])
        opt.load_state_dict(resume['optimizer'])
        it, best, last_val = resume['iter'], resume['best_val'], resume.get('val_latent_mse')
        states = resume.get('rng')
        if states is not None and len(states) == world:
            set_rng_state(states[rank], np_rng)
        else:  # another world size: there is no stream to continue, start fresh ones (not bit-exact)
            np_rng, _ = seed_streams(seed, 0, rank, it)
            if master:
                print(f"warning: checkpoint has RNG states for {len(states) if states else 0} ranks, this run has "
                      f"{world}; new random streams from iter {it} (the resume is not bit-exact)")
    if warm is not None:
        dyn.load_state_dict(warm['model'])
        if master:
            print(f"warm start from {init_from} (iteration {warm['iter']} of its run)")
    # the moving average of the weights (not trained; a plain copy, so it is never compiled or wrapped)
    ema = None
    if ema_decay > 0:
        ema = deepcopy(dyn).requires_grad_(False).eval()
        src_ema = resume.get('model_ema') if resume is not None else None
        if src_ema is not None:
            ema.load_state_dict(src_ema)
    dyn_run = torch.compile(dyn) if compile else dyn
    if ddp:  # wrap the (compiled) module; checkpoints always take the raw dyn
        dyn_run = DDP(dyn_run, device_ids=[local_rank] if dev.startswith('cuda') else None)
        print(f"rank {rank}/{world}: device {dev}, {grad_accum} micro-batch(es) of {batch_size} per step", flush=True)
    n_micro = grad_accum * world

    def probe_step(on):  # one forward + backward of a real batch (fixed windows; gradients cleared after)
        pick = np.random.default_rng(0).integers(0, len(tgt), batch_size)
        fidx, act = D.make_windows(tgt[pick], tgt_start[pick], window, a_norm_np)
        with autocast(dev, on):
            loss = M.dynamics_loss(dyn, z_all[torch.from_numpy(fidx)].to(dev), torch.from_numpy(act).to(dev), abar,
                                   ctx_noise, all_frames, dyn_residual, None, ctx_noise_max, dyn_steps, change_weight)
        loss.backward()
        dyn.zero_grad(set_to_none=True)
    use_bf16, amp_msg = choose_bf16(amp, dev, probe_step)
    if master:
        print(amp_msg)
        print(f"dynamics {sum(p.numel() for p in dyn.parameters())/1e6:.3f}M params, window {window}, device {dev}, "
              f"world {world}, global batch {batch_size * n_micro} ({batch_size} x {grad_accum} accum x {world} ranks)")

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

    def save(val, rng_states, improved):
        check_finite_weights([dyn], it, ckpt_path)
        save_checkpoint({
            'kind': 'dynamics', 'model': dyn.state_dict(), 'optimizer': opt.state_dict(), 'iter': it,
            'best_val': best, 'val_latent_mse': val, 'config': run_cfg, 'amp': 'bf16' if use_bf16 else 'fp32',
            **({'model_ema': ema.state_dict()} if ema is not None else {}),
            'ae_ckpt': os.path.abspath(ae_ckpt), 'encoder_fingerprint': fp,
            'latent_shape': list(z_all.shape[1:]), 'action_dim': A, 'action_map': amap,
            'data': {'data_dir': os.path.abspath(data_dir), 'meta': ds['meta'], 'image_size': S,
                     'train_ids': train_ids, 'val_ids': val_ids, 'action_stats': stats},
            'rng': rng_states, 'world_size': world,  # rng: one dict of plain data per rank, for an exact resume
        }, ckpt_path)
        if improved:
            keep_copy(ckpt_path, best_path)

    ckpt_every = ckpt_interval or eval_interval
    t0 = time.time()
    while it < max_iters:
        for g in opt.param_groups:
            g['lr'] = get_lr(it)
        opt.zero_grad(set_to_none=True)
        tot = torch.zeros(2, device=dev)  # (sum of micro-batch losses, how many were not finite)
        for micro in range(grad_accum):
            if sample_seed == 'micro':  # keyed by the global micro-batch index, not by rank
                np_rng, _ = seed_streams(seed, 1, it, rank * grad_accum + micro)
            pick = np_rng.integers(0, len(tgt), batch_size) if probs is None else np_rng.choice(len(tgt), batch_size, p=probs)
            fidx, act = D.make_windows(tgt[pick], tgt_start[pick], window, a_norm_np)
            z = z_all[torch.from_numpy(fidx)].to(dev)  # (B, W, C, h, w)
            act = torch.from_numpy(act).to(dev)  # (B, W, A+1)
            ctx = z
            if own_ctx > 0:  # some windows see the model's own rollout as context (no gradient through it)
                own = torch.from_numpy(np_rng.random(batch_size) < own_ctx).to(dev)  # (B,)
                if own.any():
                    ctx = z.clone()
                    ctx[own] = M.own_context(dyn, z[own], act[own], abar, ctx_level, dyn_steps)
            # DDP reduces gradients only on the last micro-step; forward and backward both inside
            with ddp_sync([dyn_run], micro == grad_accum - 1):
                with autocast(dev, use_bf16):  # (amp: fp32 unless asked; the loss itself is computed in fp32)
                    loss = M.dynamics_loss(dyn_run, z, act, abar, ctx_noise, all_frames, dyn_residual, ctx, ctx_noise_max, dyn_steps,
                                           change_weight)
                if it + 1 == debug_nan_at_iter and rank == 0 and micro == 0:
                    loss = loss * float('nan')
                # a NaN still runs backward: every rank must join the all-reduce; the step is refused below
                (loss / grad_accum).backward()
            l = loss.detach()
            ok = torch.isfinite(l)
            tot += torch.stack([torch.where(ok, l, torch.zeros_like(l)), (~ok).float()])
        if ddp:
            dist.all_reduce(tot)  # every rank sees the same numbers, so every rank stops together
        gnorm = torch.nn.utils.clip_grad_norm_(dyn.parameters(), grad_clip if grad_clip > 0 else float('inf'))
        loss_sum, n_bad, gn = torch.cat([tot, gnorm.reshape(1).to(tot)]).tolist()
        if n_bad:
            raise SystemExit(f"iter {it + 1}: dynamics loss is not finite (NaN/Inf) on {int(n_bad)} of {n_micro} "
                             f"micro-batches; stopped before the optimizer step, the last good checkpoint "
                             f"{ckpt_path!r} is untouched")
        if not math.isfinite(gn):
            raise SystemExit(f"iter {it + 1}: gradient norm is {gn} (dynamics loss {loss_sum / n_micro:.6g}); stopped "
                             f"before the optimizer step, the last good checkpoint {ckpt_path!r} is untouched")
        opt.step()
        if ema is not None:  # w_ema <- d w_ema + (1 - d) w, with d warmed up so early weights do not linger
            d = min(ema_decay, (1 + it) / (10 + it))
            with torch.no_grad():
                for pe, p in zip(ema.parameters(), dyn.parameters()):
                    pe.lerp_(p, 1 - d)
        it += 1
        if master and (it % log_interval == 0 or it == 1):
            dt = (time.time() - t0) / (log_interval if it > 1 else 1)
            t0 = time.time()
            print(f"iter {it}: loss {loss_sum / n_micro:.7f}, grad norm {gn:.4f}, lr {get_lr(it):.2e}, {dt*1000:.0f} ms/iter", flush=True)
        evaluated = it % eval_interval == 0 or it == max_iters
        improved = False
        if evaluated and master:
            dyn.eval()
            net = ema if ema is not None else dyn  # validate the weights a rollout will load
            g = torch.Generator().manual_seed(0)
            pred = latent_rollout(net, vz, va, abar, window, ctx_level, g, dyn_steps)
            err = ((pred - vz[:, 1:]) ** 2).mean().item()
            copy = ((vz[:, :1] - vz[:, 1:]) ** 2).mean().item()
            improved, best, last_val = err < best, min(best, err), err
            print(f"iter {it}: val {H}-step open-loop latent MSE {err:.5f} (copy-first-latent baseline {copy:.5f})", flush=True)
            with torch.no_grad():  # sample strip: truth row, prediction row, every 3rd step
                ks = list(range(0, H, 3))[:10]
                gd = torch.Generator().manual_seed(0)
                rows = [M.tensor_to_frames(M.decode(dec, vz[0, [k + 1 for k in ks]], decode_steps, abar, S, gd)),
                        M.tensor_to_frames(M.decode(dec, pred[0, ks], decode_steps, abar, S, gd))]
            save_grid(os.path.join(out_dir, f'samples_{it:06d}.png'), rows)
            dyn.train()
        if evaluated or it % ckpt_every == 0:
            states = all_gather(rng_state(np_rng), ddp)  # a collective: every rank takes part
            if master:
                save(last_val, states, improved)
            t0 = time.time()


if __name__ == '__main__':
    try:
        main()
        ddp_cleanup(wait=True)
    finally:
        ddp_cleanup()  # after an error: no waiting (a rank that failed alone would hang the others)
