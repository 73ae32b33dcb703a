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
from common import (autocast, all_gather, check_compatible, check_finite_weights, check_out_dir, checkpoint_bytes, dataset_fingerprint,
                    config_from_globals, ddp_cleanup, ddp_setup, ddp_sync, keep_copy, load_autoencoder, lr_at,
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
dyn_action_map = False  # the action also drawn as a spot on the latent grid (model.Dynamics); needs meta.json's image_point_dims
# loss (model.dynamics_loss)
all_frames = True  # every frame of a window is a prediction target in one pass; False: only the last (the paper's)
ctx_noise = True  # noise the context latents at U{1..99} in training (the paper's robustness trick)
own_ctx = 0.0  # fraction of windows whose context is the model's own open-loop rollout (model.own_context; not in the paper)
# optimisation
batch_size = 16  # per micro-batch and rank: global batch = batch_size * grad_accum * world_size
grad_accum = 1  # micro-batches per rank per optimizer step
max_iters = 2000
lr = 1e-3  # peak learning rate: linear warm-up, then cosine decay to min_lr at max_iters
min_lr = 1e-4
warmup_iters = 100
cooldown_iters = -1  # -1: cosine; N >= 0: constant lr, then linear to min_lr over the last N iters (common.lr_at)
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
sample_seed = 'stream'  # 'stream': each rank's own RNG streams (in the checkpoint: exact resume); 'micro': each micro-batch
                        # reseeded from (seed, iter, its global index), so a step is the same however it is split
debug_nan_at_iter = -1  # test hook: a NaN in rank 0's loss at the step logged as this iter
device = 'auto'
compile = False
bf16 = True  # bf16 autocast of the forward pass on CUDA; fp32 on CPU and MPS whatever this says
# ------------------------------------------------------------------------------------
config = config_from_globals(globals())
globals().update(config)
ARCH_KEYS = ('window', 'dyn_ch', 'dyn_depth', 'dyn_emb', 'dyn_heads', 'dyn_spatial_attn', 'dyn_action_map')


@torch.no_grad()
def encode_dataset(enc, frames, dev, cache_path, fp, bs=256):
    """All frames -> latents (N, C, h, w) float32, once; cached beside the checkpoint, keyed by encoder and frame count."""
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
def latent_rollout(dyn, z_true, a_norm, abar, W, level, gen=None):
    """Open-loop from the first latent of each sequence with recorded actions.
    z_true (B, H+1, C, h, w), a_norm (B, H, A) -> predicted latents (B, H, C, h, w)."""
    ctx, act = M.init_window(z_true[:, 0], W, a_norm.shape[-1])
    preds = []
    for k in range(a_norm.shape[1]):
        z, ctx, act = M.window_step(dyn, ctx, act, a_norm[:, k], abar, level, gen)
        preds.append(z)
    return torch.stack(preds, 1)


def load_start():
    """The checkpoint init_from names: (resume, warm), at most one of them not None."""
    if init_from == 'resume':
        return load_checkpoint(os.path.join(out_dir, 'ckpt.pt'), expect_kind='dynamics'), None
    if init_from == 'scratch':
        return None, None
    if not os.path.isfile(init_from):  # a typo is not taken for a path
        raise SystemExit(f"init_from must be 'scratch', 'resume' or a dynamics checkpoint's path; {init_from!r} does not exist")
    return None, load_checkpoint(init_from, expect_kind='dynamics')


def check_start(resume, warm, ds, train_ids, val_ids):
    """A resume: same network, data (fingerprint, not path) and split. A warm start: same network and action size."""
    A = ds['actions'].shape[1]
    if warm is not None:
        check_compatible(init_from, warm['config'], config, ARCH_KEYS, [('action_dim', warm['action_dim'], A)])
    if resume is not None:
        d = resume['data']
        check_compatible(os.path.join(out_dir, 'ckpt.pt'), resume['config'], config, ARCH_KEYS, [
            ('data (episodes and actions)', d.get('fingerprint'), dataset_fingerprint(ds)), ('image_size', d['image_size'], ds['frames'].shape[1]),
            ('action_dim', resume['action_dim'], A), ('train_ids', d['train_ids'], train_ids),
            ('val_ids', d['val_ids'], val_ids)])


def restore(resume, warm, dyn, opt, np_rng, rank, world):
    """Weights (a resume: also optimizer and random streams, if saved) into place. -> (iter, best val, last val, np_rng)"""
    if warm is not None:
        dyn.load_state_dict(warm['model'])
        if rank == 0:
            print(f"warm start from {init_from} (iteration {warm['iter']} of its run)", flush=True)
    if resume is None:
        return 0, float('inf'), None, np_rng
    dyn.load_state_dict(resume['model'])
    if 'optimizer' in resume:  # (weights-only state, an export.py file: fresh Adam moments and random streams)
        opt.load_state_dict(resume['optimizer'])
    it, states = resume['iter'], resume.get('rng')
    if states is not None and len(states) == world:
        set_rng_state(states[rank], np_rng)
    else:  # weights-only state or another world size: no stream to continue, start fresh ones (not bit-exact)
        np_rng, _ = seed_streams(seed, 0, rank, it)
        if rank == 0:  # (rank 0 speaks for all)
            print(f"warning: checkpoint has RNG states for {len(states) if states else 0} ranks, this run has "
                  f"{world}; new random streams from iter {it} (the resume is not bit-exact)", flush=True)
    return it, resume.get('best_val', float('inf')), resume.get('val_latent_mse'), np_rng


def main():
    ddp, rank, local_rank, world, dev = ddp_setup(device)
    master = rank == 0  # only rank 0 logs, evaluates and writes checkpoints
    if sample_seed not in ('stream', 'micro') or grad_accum < 1 or cooldown_iters < -1:
        raise SystemExit(f"sample_seed must be 'stream' or 'micro' (got {sample_seed!r}), grad_accum >= 1 (got {grad_accum}), "
                         f"cooldown_iters -1 (cosine) or >= 0 (got {cooldown_iters})")
    cooldown = None if cooldown_iters < 0 else cooldown_iters
    ckpt_path, best_path = os.path.join(out_dir, 'ckpt.pt'), os.path.join(out_dir, 'ckpt_best.pt')

    # the frozen stage-1 model: a resume or a warm start must use the encoder its weights were trained on
    resume, warm = load_start()
    src = resume or warm
    enc, dec, ae, fp = load_autoencoder(ae_ckpt, dev, src['encoder_fingerprint'] if src else None)
    with torch.device('meta'):  # a weightless model sizes the checkpoints: room for latest, best and one being written
        probe = M.Dynamics(ae['config']['latent_ch'], dyn_ch, dyn_depth, 2, dyn_emb, dyn_heads, dyn_spatial_attn,
                           {'dims': [0, 1], 'scale': [1, 1], 'offset': [0, 0]} if dyn_action_map else None)
    est = checkpoint_bytes([probe])
    check_out_dir(out_dir, 3 * est, rank)

    # the data: episodes, the split stage 1 used, actions normalised with the training statistics
    ds = D.load_dataset(data_dir)
    S, A = int(ds['frames'].shape[1]), ds['actions'].shape[1]
    if S != ae['data']['image_size']:
        raise SystemExit(f"data {data_dir!r} has {S}x{S} frames but the autoencoder {ae_ckpt!r} was trained on {ae['data']['image_size']}")
    dims = ds['meta'].get('image_point_dims')  # whether an action is a point in the image is a fact about the data
    if dyn_action_map and not (isinstance(dims, list) and len(dims) == 2):
        raise SystemExit(f"dyn_action_map=True draws the action as a point in the image, but {data_dir}/meta.json does "
                         f"not declare which action dims are one (image_point_dims, e.g. [0, 1] for Push-T's (x, y) "
                         f"target); its {A}-d actions are not drawn. Train with --dyn_action_map=False, or "
                         f"add image_point_dims to meta.json if two action dims really are an (x, y) image position.")
    ends = ds['episode_ends']
    ranges = D.episode_ranges(ends)
    train_ids, val_ids = [[int(i) for i in ids] for ids in D.split_episodes(len(ends), val_frac, split_seed)]
    check_start(resume, warm, ds, train_ids, val_ids)
    # a warm start or a resume keeps the normalisation its weights learned (new data may span another range)
    stats = src['data']['action_stats'] if src else D.action_stats(ds['actions'], ends, train_ids)
    a_norm_np = D.normalize_actions(np.asarray(ds['actions'], dtype=np.float32), stats)  # (N, A) in [-1, 1]
    a_norm = torch.from_numpy(a_norm_np).float()

    # encode every frame once (rank 0 writes the cache, the others read it); the cache must fit too
    cache = os.path.join(out_dir, 'latents.npy')
    lat_bytes = 0 if os.path.isfile(cache) else len(ds['frames']) * ae['config']['latent_ch'] * (S // 4) ** 2 * 4
    check_out_dir(out_dir, 3 * est + lat_bytes, rank)
    t0 = time.time()
    if master:
        z_all = encode_dataset(enc, ds['frames'], dev, cache, fp)
        print(f"latents {tuple(z_all.shape)} for {len(ends)} episodes ({len(train_ids)} train / {len(val_ids)} val), "
              f"encoded or loaded in {time.time()-t0:.1f} s", flush=True)
    if ddp:
        dist.barrier()
    if not master:  # (a rank that cannot see rank 0's out_dir encodes for itself)
        z_all = encode_dataset(enc, ds['frames'], dev, cache, fp)
    tgt, tgt_start = D.window_targets(ranges, train_ids)  # every frame but an episode's first can be a target

    # the model, its optimizer and this rank's random streams: windows (numpy), levels and noise (torch)
    torch.manual_seed(seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    amap = M.point_map(dims, stats, ds['meta']['action_low'], ds['meta']['action_high'], S, z_all.shape[-1]) if dyn_action_map else None
    dyn = M.Dynamics(z_all.shape[1], dyn_ch, dyn_depth, A, dyn_emb, dyn_heads, dyn_spatial_attn, amap).to(dev)
    abar = M.sigmoid_alpha_bar().to(dev)
    opt = torch.optim.AdamW(dyn.parameters(), lr=lr, weight_decay=weight_decay)
    np_rng, _ = seed_streams(seed, 0, rank)
    it, best, last_val, np_rng = restore(resume, warm, dyn, opt, np_rng, rank, world)
    dyn_run = torch.compile(dyn) if compile else dyn
    if ddp:  # wrap the (compiled) module; checkpoints always take the raw dyn
        dyn_run = DDP(dyn_run, device_ids=[local_rank] if dev.startswith('cuda') else None)
        print(f"rank {rank}/{world}: device {dev}, {grad_accum} micro-batch(es) of {batch_size} per step", flush=True)
    use_bf16 = bf16 and dev.startswith('cuda')
    n_micro = grad_accum * world
    if master:
        print(f"dynamics {sum(p.numel() for p in dyn.parameters())/1e6:.3f}M params, window {window}, device {dev}"
              f"{' (bf16 autocast)' if use_bf16 else ''}, world {world}, global batch {batch_size * n_micro} "
              f"({batch_size} x {grad_accum} accum x {world} ranks)", flush=True)

    # validation: an open loop over the first val_horizon+1 frames of some held-out episodes
    vids = val_ids[:val_episodes]
    H = min([val_horizon] + [ranges[i][1] - ranges[i][0] - 1 for i in vids])
    vz = torch.stack([z_all[ranges[i][0]:ranges[i][0] + H + 1] for i in vids]).to(dev)  # (V, H+1, C, h, w)
    va = torch.stack([a_norm[ranges[i][0]:ranges[i][0] + H] for i in vids]).to(dev)  # (V, H, A)

    def validate():
        dyn.eval()
        pred = latent_rollout(dyn, vz, va, abar, window, ctx_level, torch.Generator().manual_seed(0))
        err, copy = ((pred - vz[:, 1:]) ** 2).mean().item(), ((vz[:, :1] - vz[:, 1:]) ** 2).mean().item()
        print(f"iter {it}: val {H}-step open-loop latent MSE {err:.5f} (copy-first-latent baseline {copy:.5f})", flush=True)
        ks, gd = list(range(0, H, 3))[:10], torch.Generator().manual_seed(0)  # sample strip: truth, prediction
        rows = [M.tensor_to_frames(M.decode(dec, z, decode_steps, abar, S, gd)) for z in (vz[0, [k + 1 for k in ks]], pred[0, ks])]
        save_grid(os.path.join(out_dir, f'samples_{it:06d}.png'), rows)
        dyn.train()
        return err

    def save(val, rng_states, improved):
        check_finite_weights([dyn], it, ckpt_path)
        save_checkpoint({
            'kind': 'dynamics', 'model': dyn.state_dict(), 'optimizer': opt.state_dict(), 'iter': it,
            'best_val': best, 'val_latent_mse': val, 'config': dict(config), 'bf16': use_bf16,
            'ae_ckpt': os.path.abspath(ae_ckpt), 'encoder_fingerprint': fp,
            'latent_shape': list(z_all.shape[1:]), 'action_dim': A, 'action_map': amap,
            'data': {'data_dir': os.path.abspath(data_dir), 'meta': ds['meta'], 'image_size': S, 'fingerprint': dataset_fingerprint(ds),
                     'train_ids': train_ids, 'val_ids': val_ids, 'action_stats': stats},
            'rng': rng_states, 'world_size': world,  # rng: one dict of plain data per rank, for an exact resume
        }, ckpt_path)
        if improved:
            keep_copy(ckpt_path, best_path)

    t0 = time.time()
    while it < max_iters:
        for g in opt.param_groups:
            g['lr'] = lr_at(it, lr, min_lr, warmup_iters, max_iters, cooldown)
        opt.zero_grad(set_to_none=True)
        tot = torch.zeros(2, device=dev)  # (sum of micro-batch losses, how many were not finite)
        for micro in range(grad_accum):
            if sample_seed == 'micro':  # keyed by the global micro-batch index, not by rank
                np_rng, _ = seed_streams(seed, 1, it, rank * grad_accum + micro)
            pick = np_rng.integers(0, len(tgt), batch_size)
            fidx, act = D.make_windows(tgt[pick], tgt_start[pick], window, a_norm_np)
            z = z_all[torch.from_numpy(fidx)].to(dev)  # (B, W, C, h, w)
            act = torch.from_numpy(act).to(dev)  # (B, W, A+1)
            ctx = z
            if own_ctx > 0:  # some windows see the model's own rollout as context (no gradient through it)
                own = torch.from_numpy(np_rng.random(batch_size) < own_ctx).to(dev)  # (B,)
                if own.any():
                    ctx = z.clone()
                    ctx[own] = M.own_context(dyn, z[own], act[own], abar, ctx_level)
            with ddp_sync([dyn_run], micro == grad_accum - 1):  # DDP reduces gradients on the last micro-step only
                with autocast(dev, use_bf16):
                    loss = M.dynamics_loss(dyn_run, z, act, abar, ctx_noise, all_frames, ctx)
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
        if n_bad or not math.isfinite(gn):
            why = f"dynamics loss is not finite (NaN/Inf) on {int(n_bad)} of {n_micro} micro-batches" if n_bad else f"gradient norm is {gn}"
            raise SystemExit(f"iter {it + 1}: {why}; stopped before the optimizer step, the last good checkpoint "
                             f"{ckpt_path!r} is untouched")
        opt.step()
        it += 1
        if master and (it % log_interval == 0 or it == 1):
            dt = (time.time() - t0) / (log_interval if it > 1 else 1)
            t0 = time.time()
            print(f"iter {it}: loss {loss_sum / n_micro:.7f}, grad norm {gn:.4f}, lr {lr_at(it, lr, min_lr, warmup_iters, max_iters, cooldown):.2e}, {dt*1000:.0f} ms/iter", flush=True)
        evaluated = it % eval_interval == 0 or it == max_iters
        improved = False
        if evaluated and master:
            last_val = validate()
            improved, best = last_val < best, min(best, last_val)
        if evaluated or it % (ckpt_interval or eval_interval) == 0:
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
