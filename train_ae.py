"""
Stage 1: train the encoder and the consistency decoder together, end to end, through the decoder's
loss only (Wang et al. 2026, arXiv 2603.08546, sec. on the autoencoder).

    python train_ae.py config/pusht_cpu.py --data_dir=data/pusht64 --out_dir=out/ae --max_iters=3000

--finetune=True runs the optional decoder fine-tune on an existing checkpoint in out_dir: encoder
frozen, t = 999, s from the interior points of the sampling schedule, small Gaussian noise on z so
the decoder tolerates imperfect predicted latents, lr x 0.1.
"""
import math
import os
import time

import numpy as np
import torch

import data as D
import metrics as Mx
import model as M
from common import config_from_globals, fingerprint, load_checkpoint, pick_device, save_checkpoint, save_grid

# ---------------------------------------------------------------------------- defaults
data_dir = 'data/pusht64'
out_dir = 'out/ae'
init_from = 'scratch'  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
finetune = False  # decoder fine-tune on out_dir/ckpt.pt (stage 3 of the reference)
val_frac = 0.1
split_seed = 0
# model
enc_ch = 16
dec_ch = (16, 32, 64)
dec_attn = (False, False, True)
latent_ch = 4
emb_dim = 64
heads = 2
decode_steps = 3  # K jumps from noise to image at sampling time
# loss
snr_gamma = 5.0
both_terms = False  # True: both loss terms for every sample (2 passes); False: one at random
p_sched = 0.5  # fraction of samples whose (t, s) is a consecutive pair of the K-jump sampling path
ft_z_noise = 0.02  # fine-tune: std of Gaussian noise added to z
# optimisation
batch_size = 16
max_iters = 3000
lr = 2e-3
min_lr = 2e-4
warmup_iters = 100
weight_decay = 0.0
grad_clip = 1.0
# logging / eval
log_interval = 50
eval_interval = 500
eval_frames = 64
seed = 0
device = 'auto'
compile = False
# ------------------------------------------------------------------------------------
config = config_from_globals(globals())
globals().update(config)


def sample_levels(B, rng, K):
    """t ~ U{2..999}, s ~ U{1..t-1}; with probability p_sched a pair (t, s) from the K-jump path
    instead (s = 0 there is handled by the loss's second term, so the last pair uses s = 1)."""
    t = torch.randint(2, M.T_STEPS, (B,), generator=rng)
    s = (torch.rand(B, generator=rng) * (t - 1).float()).long() + 1
    path = M.sample_schedule(K)
    pairs = torch.tensor([(a, max(b, 1)) for a, b in zip(path[:-1], path[1:])])
    use = torch.rand(B, generator=rng) < p_sched
    pick = pairs[torch.randint(len(pairs), (B,), generator=rng)]
    return torch.where(use, pick[:, 0], t), torch.where(use, pick[:, 1], s)


def finetune_levels(B, rng, K):
    """Fine-tune: t = 999 and s from the interior points of the sampling path (s = 1 if K = 1)."""
    interior = M.sample_schedule(K)[1:-1] or [1]
    s = torch.tensor(interior)[torch.randint(len(interior), (B,), generator=rng)]
    return torch.full((B,), M.T_STEPS - 1), s


@torch.no_grad()
def evaluate(enc, dec, frames_u8, abar, dev, K, gen_seed=0):
    """Reconstruction of fixed validation frames: encode, decode in K jumps (fixed noise seed)."""
    enc.eval(), dec.eval()
    x = M.frames_to_tensor(frames_u8, dev)
    g = torch.Generator().manual_seed(gen_seed)
    recon = torch.cat([M.decode(dec, enc(x[i:i + 32]), K, abar, x.shape[-1], g) for i in range(0, len(x), 32)])
    a, b = (recon + 1) / 2, (x + 1) / 2
    enc.train(), dec.train()
    return Mx.psnr(a, b).mean().item(), Mx.ssim(a, b).mean().item(), recon


def main():
    torch.manual_seed(seed)
    dev = pick_device(device)
    os.makedirs(out_dir, exist_ok=True)
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    if not os.access(out_dir, os.W_OK):
        raise SystemExit(f"out_dir {out_dir!r} is not writable")

    ds = D.load_dataset(data_dir)
    ends = ds['episode_ends']
    ranges = D.episode_ranges(ends)
    train_ids, val_ids = D.split_episodes(len(ends), val_frac, split_seed)
    stats = D.action_stats(ds['actions'], ends, train_ids)
    train_idx = np.concatenate([np.arange(*ranges[i]) for i in train_ids])
    val_idx = np.concatenate([np.arange(*ranges[i]) for i in val_ids])
    S = int(ds['frames'].shape[1])
    val_pick = np.sort(np.random.default_rng(0).choice(val_idx, min(eval_frames, len(val_idx)), replace=False))
    val_frames = np.asarray(ds['frames'][val_pick])
    print(f"data {data_dir}: {len(ends)} episodes ({len(train_ids)} train / {len(val_ids)} val), "
          f"{len(train_idx)} train frames, {S}x{S}")

    enc = M.Encoder(enc_ch, latent_ch).to(dev)
    dec = M.Decoder(dec_ch, dec_attn, latent_ch, emb_dim, heads).to(dev)
    abar = M.sigmoid_alpha_bar().to(dev)
    it, best = 0, -1.0
    run_cfg = dict(config)
    # the fine-tune reads the stage-1 checkpoint and writes its own, so the original is never lost
    save_path = os.path.join(out_dir, 'ckpt_finetune.pt' if finetune else 'ckpt.pt')
    ck = None
    if init_from == 'resume' or finetune:
        ck = load_checkpoint(save_path if init_from == 'resume' else ckpt_path, expect_kind='ae')
        for k in ('enc_ch', 'dec_ch', 'dec_attn', 'latent_ch', 'emb_dim', 'heads'):
            if tuple(np.atleast_1d(ck['config'][k]).tolist()) != tuple(np.atleast_1d(config[k]).tolist()):
                raise SystemExit(f"checkpoint in {out_dir} has {k}={ck['config'][k]!r}, this run has {config[k]!r} "
                                 f"(pass the same config file as the run that wrote it)")
        enc.load_state_dict(ck['encoder'])
        dec.load_state_dict(ck['decoder'])
    if finetune:
        enc.requires_grad_(False)
    params = list(dec.parameters()) + ([] if finetune else list(enc.parameters()))
    base_lr = lr * (0.1 if finetune else 1.0)
    opt = torch.optim.AdamW(params, lr=base_lr, weight_decay=weight_decay)
    if init_from == 'resume':
        opt.load_state_dict(ck['optimizer'])
        it, best = ck['iter'], ck['best_psnr']
    enc_run = torch.compile(enc) if compile else enc
    dec_run = torch.compile(dec) if compile else dec
    print(f"encoder {sum(p.numel() for p in enc.parameters())/1e6:.3f}M, decoder {sum(p.numel() for p in dec.parameters())/1e6:.3f}M params, device {dev}")

    def get_lr(i):  # linear warmup then cosine to min_lr
        if i < warmup_iters:
            return base_lr * (i + 1) / warmup_iters
        r = min(1.0, (i - warmup_iters) / max(1, max_iters - warmup_iters))
        return min_lr * (base_lr / lr) + 0.5 * (1 + math.cos(math.pi * r)) * (base_lr - min_lr * (base_lr / lr))

    def save(psnr_val):
        save_checkpoint({
            'kind': 'ae', 'encoder': enc.state_dict(), 'decoder': dec.state_dict(), 'optimizer': opt.state_dict(),
            'iter': it, 'best_psnr': best, 'val_psnr': psnr_val, 'config': run_cfg,
            'data': {'data_dir': os.path.abspath(data_dir), 'meta': ds['meta'], 'image_size': S,
                     'train_ids': train_ids.tolist() if hasattr(train_ids, 'tolist') else list(train_ids),
                     'val_ids': val_ids.tolist() if hasattr(val_ids, 'tolist') else list(val_ids),
                     'action_stats': stats},
            'encoder_fingerprint': fingerprint(enc.state_dict()),
        }, save_path)

    rng = np.random.default_rng(seed + it)
    trng = torch.Generator().manual_seed(seed + it)
    t0 = time.time()
    while it < max_iters:
        for g in opt.param_groups:
            g['lr'] = get_lr(it)
        idx = np.sort(rng.choice(train_idx, batch_size))
        x = M.frames_to_tensor(ds['frames'][idx], dev)
        z = enc_run(x)
        if finetune:
            t, s = finetune_levels(batch_size, trng, decode_steps)
            z = M.unit_norm(z + ft_z_noise * torch.randn_like(z))
        else:
            t, s = sample_levels(batch_size, trng, decode_steps)
        loss = M.decoder_loss(dec_run, x, z, t.to(dev), s.to(dev), abar, snr_gamma, both_terms)
        if not torch.isfinite(loss):
            raise SystemExit(f"iter {it}: loss is {loss.item()}; stopping, last good checkpoint left untouched")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        it += 1
        if it % log_interval == 0 or it == 1:
            dt = (time.time() - t0) / (log_interval if it > 1 else 1)
            t0 = time.time()
            print(f"iter {it}: loss {loss.item():.5f}, lr {get_lr(it):.2e}, {dt*1000:.0f} ms/iter", flush=True)
        if it % eval_interval == 0 or it == max_iters:
            p, ss, recon = evaluate(enc, dec, val_frames, abar, dev, decode_steps)
            best = max(best, p)
            print(f"iter {it}: val recon PSNR {p:.2f} dB, SSIM {ss:.4f} ({decode_steps} decoder jumps, {len(val_frames)} frames)", flush=True)
            save_grid(os.path.join(out_dir, f'samples_{it:06d}.png'), [val_frames[:8], M.tensor_to_frames(recon[:8])])
            save(p)
            t0 = time.time()
    return best


if __name__ == '__main__':
    main()
