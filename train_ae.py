"""
Stage 1: train the encoder and the consistency decoder together, end to end, through the decoder's
loss only (Wang et al. 2026, arXiv 2603.08546, sec. on the autoencoder).

    python train_ae.py config/ae_pusht_cpu.py --data_dir=data/pusht64 --out_dir=out/ae --max_iters=3000

--decoder_type=deterministic trains, from scratch on the frozen encoder of a finished stage-1 checkpoint
(out_dir/ckpt.pt or --init_ckpt=), a plain deterministic decoder (the same UNet, one pass from a zero image,
MSE) into out_dir/ckpt_deterministic.pt; stage 1's checkpoint is only read. Not the paper's decoder: the
Push-T CPU recipe uses it because on Push-T it scores better and runs faster (EXPERIMENTS.md).

Several GPUs (or CPU processes, gloo): torchrun --standalone --nproc_per_node=N train_ae.py ...
Global batch per optimizer step = batch_size * grad_accum * N (batch_size is per micro-batch and rank).
"""
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import data as D
import metrics as Mx
import model as M
from common import (all_gather, check_compatible, check_finite_weights, check_out_dir, checkpoint_bytes, dataset_fingerprint,
                    config_from_globals, ddp_cleanup, ddp_setup, ddp_sync, fingerprint, keep_copy, load_checkpoint, lr_at,
                    rng_state, save_checkpoint, save_grid, seed_streams, set_rng_state)

# ---------------------------------------------------------------------------- defaults
data_dir = 'data/pusht64'
out_dir = 'out/ae'
init_from = 'scratch'  # 'scratch' or 'resume' (from the checkpoint this run writes)
decoder_type = 'consistency'  # the paper's; or 'deterministic': a plain decoder (one pass, MSE) trained on the frozen
                              # encoder of init_ckpt, written to out_dir/ckpt_deterministic.pt
init_ckpt = ''  # the stage-1 checkpoint whose encoder a deterministic decoder is trained on; '' = out_dir/ckpt.pt
val_frac = 0.1  # share of episodes held out (by episode, so no clip straddles the split)
split_seed = 0  # stage 2 must use the same split, so its held-out episodes stay unseen by both stages
# model (model.Encoder / model.Decoder)
enc_ch = 16  # encoder width; it downsamples 4x, so a 64x64 frame becomes a 16x16 latent
dec_ch = (16, 32, 64)  # decoder UNet widths per level: narrow at full resolution, where CPU time goes
dec_attn = (False, False, True)  # self-attention only at the coarsest level (cheap there)
latent_ch = 4  # latent channels, unit norm per latent pixel (model.unit_norm)
emb_dim = 64  # width of the noise-level embedding that FiLMs every decoder block
heads = 2  # attention heads
decode_steps = 3  # K jumps from noise to image at sampling time
# loss (model.decoder_loss)
snr_gamma = 5.0  # gamma of the loss weight min(SNR, gamma) / SNR: near-clean levels do not dominate (model.decoder_loss)
both_terms = False  # True: both loss terms for every sample (2 passes); False: one at random
p_sched = 0.5  # fraction of samples whose (t, s) is a consecutive pair of the K-jump sampling path
# optimisation
batch_size = 16  # per micro-batch and rank: global batch = batch_size * grad_accum * world_size
grad_accum = 1  # micro-batches per rank per optimizer step
max_iters = 3000
lr = 2e-3  # peak learning rate: linear warm-up, then cosine decay to min_lr at max_iters
min_lr = 2e-4
warmup_iters = 100
weight_decay = 0.0
grad_clip = 1.0  # clip the global gradient norm: one bad batch cannot throw the weights far
# logging / eval
log_interval = 50
eval_interval = 500  # validation reconstruction, sample grid and checkpoint every this many iters
eval_frames = 64  # held-out frames reconstructed at each evaluation
ckpt_interval = 0  # write the latest checkpoint every this many iters (0 = eval_interval); evals write it too
seed = 0
sample_seed = 'stream'  # 'stream': each rank's own RNG streams (in the checkpoint: exact resume); 'micro': each micro-batch
                        # reseeded from (seed, iter, its global index), so a step is the same however it is split
debug_nan_at_iter = -1  # test hook: a NaN in rank 0's loss at the step logged as this iter
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


@torch.no_grad()
def evaluate(enc, dec, frames_u8, abar, dev, K, gen_seed=0):
    """Reconstruction of fixed validation frames: encode, decode in K jumps (fixed noise seed)."""
    enc.eval(), dec.eval()
    x = M.frames_to_tensor(frames_u8, dev)
    g = torch.Generator().manual_seed(gen_seed)
    recon = torch.cat([M.decode(dec, enc(x[i:i + 32]), K, abar, x.shape[-1], g) for i in range(0, len(x), 32)])
    a, b = (recon + 1) / 2, (x + 1) / 2  # [-1, 1] -> [0, 1]: the metrics' data range 1
    enc.train(), dec.train()  # PSNR of the mean MSE, as metrics.summarise
    return float(Mx.psnr_from_mse(Mx.mse(a, b).mean().item())), Mx.ssim(a, b).mean().item(), recon


ARCH_KEYS = ('enc_ch', 'dec_ch', 'dec_attn', 'latent_ch', 'emb_dim', 'heads')


def main():
    ddp, rank, local_rank, world, dev = ddp_setup(device)
    master = rank == 0  # only rank 0 logs, evaluates and writes checkpoints
    if sample_seed not in ('stream', 'micro') or grad_accum < 1:
        raise SystemExit(f"sample_seed must be 'stream' or 'micro' (got {sample_seed!r}), grad_accum >= 1 (got {grad_accum})")
    if init_from not in ('scratch', 'resume') or decoder_type not in ('consistency', 'deterministic'):  # no typo starts over
        raise SystemExit(f"init_from must be 'scratch' or 'resume' (got {init_from!r}); decoder_type 'consistency' or "
                         f"'deterministic' (got {decoder_type!r})")
    det = decoder_type == 'deterministic'  # a deterministic decoder reads stage 1's checkpoint and writes its own
    stage1_path = init_ckpt or os.path.join(out_dir, 'ckpt.pt')
    save_path = os.path.join(out_dir, 'ckpt_deterministic.pt' if det else 'ckpt.pt')
    best_path = save_path[:-len('.pt')] + '_best.pt'

    torch.manual_seed(seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    enc = M.Encoder(enc_ch, latent_ch).to(dev)
    dec = M.Decoder(dec_ch, dec_attn, latent_ch, emb_dim, heads, det).to(dev)
    # room for the latest, the best and one being written; checked before any data is read
    est = checkpoint_bytes([dec], [enc]) if det else checkpoint_bytes([enc, dec])
    check_out_dir(out_dir, 3 * est, rank)

    ds = D.load_dataset(data_dir)
    ends = ds['episode_ends']
    ranges = D.episode_ranges(ends)
    train_ids, val_ids = D.split_episodes(len(ends), val_frac, split_seed)
    train_ids, val_ids = [int(i) for i in train_ids], [int(i) for i in val_ids]
    stats = D.action_stats(ds['actions'], ends, train_ids)
    train_idx = np.concatenate([np.arange(*ranges[i]) for i in train_ids])
    val_idx = np.concatenate([np.arange(*ranges[i]) for i in val_ids])
    S = int(ds['frames'].shape[1])
    val_pick = np.sort(np.random.default_rng(0).choice(val_idx, min(eval_frames, len(val_idx)), replace=False))
    val_frames = np.asarray(ds['frames'][val_pick])
    if master:
        print(f"data {data_dir}: {len(ends)} episodes ({len(train_ids)} train / {len(val_ids)} val), "
              f"{len(train_idx)} train frames, {S}x{S}", flush=True)

    abar = M.sigmoid_alpha_bar().to(dev)
    it, best, last_val = 0, -1.0, None
    ck = None
    if init_from == 'resume' or det:  # a resume reads what this run wrote; a deterministic decoder, stage 1's encoder
        src = save_path if init_from == 'resume' else stage1_path
        ck = load_checkpoint(src, expect_kind='ae')
        keys, extra = ARCH_KEYS, []
        if init_from == 'resume':  # a resume must continue the same run: same stage, data and split too
            d = ck['data']
            keys = ARCH_KEYS + ('decoder_type',)
            extra = [('data (episodes and actions)', d.get('fingerprint'), dataset_fingerprint(ds)), ('image_size', d['image_size'], S),
                     ('train_ids', d['train_ids'], train_ids), ('val_ids', d['val_ids'], val_ids)]
        check_compatible(src, ck['config'], config, keys, extra)
        enc.load_state_dict(ck['encoder'])
        if init_from == 'resume':  # (a new deterministic decoder starts from scratch)
            dec.load_state_dict(ck['decoder'])
    if det:
        enc.requires_grad_(False)
    params = list(dec.parameters()) + ([] if det else list(enc.parameters()))
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    np_rng, trng = seed_streams(seed, 0, rank)  # this rank's streams: batch indices, noise levels, noise
    if init_from == 'resume':
        opt.load_state_dict(ck['optimizer'])
        it, best, last_val = ck['iter'], ck['best_psnr'], ck.get('val_psnr')
        states = ck.get('rng')
        if states is not None and len(states) == world:
            set_rng_state(states[rank], np_rng, trng)
        else:  # another world size: there is no stream to continue, start fresh ones (not bit-exact)
            np_rng, trng = seed_streams(seed, 0, rank, it)
            if master:
                print(f"warning: checkpoint has RNG states for {len(states) if states else 0} ranks, this run has "
                      f"{world}; new random streams from iter {it} (the resume is not bit-exact)", flush=True)
    enc_run = torch.compile(enc) if compile else enc
    dec_run = torch.compile(dec) if compile else dec
    if ddp:  # wrap the (compiled) modules; checkpoints always take the raw enc / dec
        ids = [local_rank] if dev.startswith('cuda') else None
        dec_run = DDP(dec_run, device_ids=ids)
        if not det:  # a frozen encoder has no gradients to reduce
            enc_run = DDP(enc_run, device_ids=ids)
        print(f"rank {rank}/{world}: device {dev}, {grad_accum} micro-batch(es) of {batch_size} per step", flush=True)
    n_micro = grad_accum * world
    if master:
        print(f"encoder {sum(p.numel() for p in enc.parameters())/1e6:.3f}M, decoder {sum(p.numel() for p in dec.parameters())/1e6:.3f}M params, "
              f"device {dev}, world {world}, global batch {batch_size * n_micro} ({batch_size} x {grad_accum} accum x {world} ranks)", flush=True)

    def save(psnr_val, rng_states, improved):
        check_finite_weights([enc, dec], it, save_path)
        save_checkpoint({
            'kind': 'ae', 'encoder': enc.state_dict(), 'decoder': dec.state_dict(), 'optimizer': opt.state_dict(),
            'iter': it, 'best_psnr': best, 'val_psnr': psnr_val, 'config': dict(config),
            'data': {'data_dir': os.path.abspath(data_dir), 'meta': ds['meta'], 'image_size': S, 'fingerprint': dataset_fingerprint(ds),
                     'train_ids': train_ids, 'val_ids': val_ids, 'action_stats': stats},
            'encoder_fingerprint': fingerprint(enc.state_dict()),
            'rng': rng_states, 'world_size': world,  # rng: one dict of plain data per rank, for an exact resume
        }, save_path)
        if improved:
            keep_copy(save_path, best_path)

    t0 = time.time()
    while it < max_iters:
        for g in opt.param_groups:
            g['lr'] = lr_at(it, lr, min_lr, warmup_iters, max_iters)
        opt.zero_grad(set_to_none=True)
        tot = torch.zeros(2, device=dev)  # (sum of micro-batch losses, how many were not finite)
        for micro in range(grad_accum):
            if sample_seed == 'micro':  # keyed by the global micro-batch index, not by rank
                np_rng, trng = seed_streams(seed, 1, it, rank * grad_accum + micro)
            idx = np.sort(np_rng.choice(train_idx, batch_size))
            x = M.frames_to_tensor(ds['frames'][idx], dev)
            # DDP reduces gradients only on the last micro-step; forward and backward both inside
            with ddp_sync([enc_run, dec_run], micro == grad_accum - 1):
                z = enc_run(x)
                if det:
                    loss = M.deterministic_decoder_loss(dec_run, x, z, abar)
                else:
                    t, s = sample_levels(batch_size, trng, decode_steps)
                    loss = M.decoder_loss(dec_run, x, z, t.to(dev), s.to(dev), abar, snr_gamma, both_terms)
                if it + 1 == debug_nan_at_iter and rank == 0 and micro == 0:
                    loss = loss * float('nan')
                # a NaN still runs backward: every rank must join the all-reduce; the step is refused below
                (loss / grad_accum).backward()
            l = loss.detach()
            ok = torch.isfinite(l)
            tot += torch.stack([torch.where(ok, l, torch.zeros_like(l)), (~ok).float()])
        if ddp:
            dist.all_reduce(tot)  # every rank sees the same numbers, so every rank stops together
        gnorm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float('inf'))
        loss_sum, n_bad, gn = torch.cat([tot, gnorm.reshape(1).to(tot)]).tolist()
        if n_bad or not math.isfinite(gn):
            why = f"decoder loss is not finite (NaN/Inf) on {int(n_bad)} of {n_micro} micro-batches" if n_bad else f"gradient norm is {gn}"
            raise SystemExit(f"iter {it + 1}: {why}; stopped before the optimizer step, the last good checkpoint "
                             f"{save_path!r} is untouched")
        opt.step()
        it += 1
        if master and (it % log_interval == 0 or it == 1):
            dt = (time.time() - t0) / (log_interval if it > 1 else 1)
            t0 = time.time()
            print(f"iter {it}: loss {loss_sum / n_micro:.7f}, grad norm {gn:.4f}, lr {lr_at(it, lr, min_lr, warmup_iters, max_iters):.2e}, {dt*1000:.0f} ms/iter", flush=True)
        evaluated = it % eval_interval == 0 or it == max_iters
        improved = False
        if evaluated and master:
            p, ss, recon = evaluate(enc, dec, val_frames, abar, dev, decode_steps)
            improved, best, last_val = p > best, max(best, p), p
            print(f"iter {it}: val recon PSNR {p:.2f} dB, SSIM {ss:.4f} ({'one pass' if det else f'{decode_steps} decoder jumps'}, {len(val_frames)} frames)", flush=True)
            save_grid(os.path.join(out_dir, f'samples_{it:06d}.png'), [val_frames[:8], M.tensor_to_frames(recon[:8])])
        if evaluated or it % (ckpt_interval or eval_interval) == 0:
            states = all_gather(rng_state(np_rng, trng), ddp)  # a collective: every rank takes part
            if master:
                save(last_val, states, improved)
            t0 = time.time()
    return best


if __name__ == '__main__':
    try:
        main()
        ddp_cleanup(wait=True)
    finally:
        ddp_cleanup()  # after an error: no waiting (a rank that failed alone would hang the others)
