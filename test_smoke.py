"""
Smoke tests: tiny configs, data made inside the tests, CPU only, a few minutes in all.

    python -m pytest -q test_smoke.py
"""
import io
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from fractions import Fraction

import numpy as np
import pytest
import torch

import bench
import common
import data
import metrics
import metrics as Mx
import model as M
import rollout
import sim_tools
from common import config_from_globals

ROOT = os.path.dirname(os.path.abspath(__file__))
ABAR = M.sigmoid_alpha_bar()


def _randomize(module, seed=0):
    """Zero-initialised output layers make a fresh net ignore its inputs; give every weight a value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return module


def _tiny_nets(A=2):
    enc = M.Encoder(8, 4)
    dec = M.Decoder((8, 16), (False, True), 4, 32, 2)
    dyn = M.Dynamics(4, 16, 1, A, 32, 2)
    return enc, dec, dyn


# ---------------------------------------------------------------------------------------- model


def test_schedule_matches_the_brief():
    assert ABAR.shape == (1000,)
    assert abs(ABAR[999].item() - 3e-7) < 1e-7  # pure noise at the top
    assert abs((1 - ABAR[15]).sqrt().item() - 0.07) < 0.005  # level 15: std ~0.07
    assert abs((1 - ABAR[99]).sqrt().item() - 0.2) < 0.01  # level 99: std ~0.2
    assert M.sample_schedule(3) == [999, 666, 333, 0]


def test_jump_identities():
    x, x0 = torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8)
    t = torch.tensor([999, 500, 10, 2])
    assert torch.allclose(M.jump(x, x0, t, t), x)  # G(x, t, t) = x
    assert torch.allclose(M.jump(x, x0, t, torch.zeros_like(t)), x0)  # G(x, t, 0) = x0_hat
    eps = torch.randn_like(x0)
    xt = M.add_noise(x0, t, eps, ABAR)
    v = M._bc(ABAR[t].sqrt(), x0) * eps - M._bc((1 - ABAR[t]).sqrt(), x0) * x0  # the true v
    assert torch.allclose(M.x0_from_v(xt, t, v, ABAR), x0, atol=1e-5)


def test_shapes_through_every_module():
    enc, dec, dyn = _tiny_nets()
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    z = enc(x)
    assert z.shape == (2, 4, 8, 8)
    assert torch.allclose(z.norm(dim=1), torch.ones(2, 8, 8), atol=1e-5)  # unit norm per latent pixel
    t, s = torch.tensor([999, 500]), torch.tensor([666, 0])
    assert dec(x, t, s, z).shape == x.shape
    assert M.decode(dec, z, 3, ABAR, 32).shape == x.shape
    # the ablation's deterministic decoder: one pass from a zero image, the same output whatever the seed
    det = _randomize(M.Decoder((8, 16), (False, True), 4, 32, 2, deterministic=True))
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    assert torch.equal(M.decode(det, z, 3, ABAR, 32, g1), M.decode(det, z, 1, ABAR, 32, g2))
    assert torch.isfinite(M.deterministic_decoder_loss(det, x, z, ABAR))
    zw = M.unit_norm(torch.randn(2, 5, 4, 8, 8), 2)
    a = M.action_input(torch.randn(2, 5, 2), 1)
    tt, ss = M.dynamics_levels(2, 5, None, 'cpu')
    assert dyn(zw, tt, ss, a).shape == zw.shape
    ctx, act = M.init_window(z, 5, 2)
    assert ctx.shape == (2, 4, 4, 8, 8) and act.shape == (2, 4, 3)
    znew, ctx2, act2 = M.window_step(dyn, ctx, act, torch.zeros(2, 2), ABAR)
    assert znew.shape == z.shape and ctx2.shape == ctx.shape and act2.shape == act.shape
    assert torch.allclose(znew.norm(dim=1), torch.ones(2, 8, 8), atol=1e-5)


def test_temporal_attention_is_causal():
    _, _, dyn = _tiny_nets()
    _randomize(dyn)
    z = M.unit_norm(torch.randn(1, 5, 4, 8, 8), 2)
    a = torch.randn(1, 5, 3)
    t, s = M.dynamics_levels(1, 5, 15, 'cpu')
    out1 = dyn(z, t, s, a)
    z2, a2 = z.clone(), a.clone()
    z2[:, -1] += 1.0  # change only the last frame and its action
    a2[:, -1] += 1.0
    out2 = dyn(z2, t, s, a2)
    assert torch.allclose(out1[:, :-1], out2[:, :-1], atol=1e-5)  # earlier frames do not see it
    assert not torch.allclose(out1[:, -1], out2[:, -1])


def test_action_map_spot_is_where_the_action_points():
    """dyn_action_map draws the action (x, y) in [-1, 1] at (column, row) of the latent grid, and
    nothing for a frame no action produced."""
    dyn = M.Dynamics(4, 16, 1, 2, 32, 2, action_map=True)
    seen = {}
    dyn.conv_in.register_forward_pre_hook(lambda m, inp: seen.update(x=inp[0]))
    z = M.unit_norm(torch.randn(1, 3, 4, 8, 8), 2)
    a = torch.cat([M.action_input(torch.zeros(1, 1, 2), 0),  # first frame: no action
                   M.action_input(torch.tensor([[[1.0, -1.0]]]), 1),  # right edge, top row
                   M.action_input(torch.tensor([[[-1.0, 3 / 7 * 2 - 1]]]), 1)], 1)  # left edge, row 3
    t, s = M.dynamics_levels(1, 3, 15, 'cpu')
    dyn(z, t, s, a)
    spot = seen['x'][:, -1]  # (3, 8, 8)
    assert spot[0].abs().max() == 0
    assert divmod(int(spot[1].argmax()), 8) == (0, 7) and divmod(int(spot[2].argmax()), 8) == (3, 0)
    assert abs(spot[1].max().item() - 1) < 1e-5


def test_query_layout_equals_plain_windows():
    """Training with a query per frame (all_frames) must give each new frame exactly what inference
    gives it: the last frame of a plain causal window over the frames before it."""
    _, _, dyn = _tiny_nets()
    _randomize(dyn)
    B, n = 2, 4
    z = M.unit_norm(torch.randn(B, n + 1, 4, 8, 8), 2)
    x = torch.cat([z[:, :n], torch.randn(B, n, 4, 8, 8)], 1)  # context z_0..z_3, then 4 noisy new frames
    tc = torch.randint(1, 100, (B, n))
    t = torch.cat([tc, torch.full((B, n), 999)], 1)
    s = torch.cat([tc, torch.zeros(B, n, dtype=torch.long)], 1)
    a = torch.randn(B, 2 * n, 3)
    vq = dyn(x, t, s, a, queries=True)
    for j in range(n):  # plain window: context 0..j, then new frame j+1
        sel = list(range(j + 1)) + [n + j]
        vp = dyn(x[:, sel], t[:, sel], s[:, sel], a[:, sel])
        assert torch.allclose(vp[:, -1], vq[:, n + j], atol=1e-5), j
        assert torch.allclose(vp[:, :-1], vq[:, :j + 1], atol=1e-5), j
    # and the loss in both layouts trains (finite, differentiable) on the same window
    act = M.action_input(torch.randn(B, n + 1, 2), 1)
    for all_frames in (True, False):
        loss = M.dynamics_loss(dyn, z, act, ABAR, all_frames=all_frames)
        loss.backward()
        assert torch.isfinite(loss) and dyn.conv_in.weight.grad.abs().sum() > 0
        dyn.zero_grad()


def test_residual_dynamics_predicts_the_change_from_the_clean_previous_latent():
    """dyn_residual: an untrained residual net (zero output conv) copies the last context latent, in a
    rollout and in the loss; the loss's 'previous latent' is z_j before its training noise, so with the
    net at zero it is exactly the copy-previous error whatever noise the context gets."""
    torch.manual_seed(0)
    dyn = M.Dynamics(4, 16, 1, 2, 32, 2, residual=True)
    B, T = 3, 5
    z = M.unit_norm(torch.randn(B, T, 4, 8, 8), 2)
    a = M.action_input(torch.randn(B, T, 2), 1)
    # (up to sqrt(abar_999) ~ 5e-4 of the input noise that eq. (2) lets through at t = 999)
    assert torch.allclose(M.predict_next(dyn, z[:, :-1], a, ABAR), z[:, -2], atol=5e-3)
    copy_err = ((z[:, :-1] - z[:, 1:]) ** 2).mean()
    for all_frames in (True, False):
        for ctx_noise in (True, False):
            loss = M.dynamics_loss(dyn, z, a, ABAR, ctx_noise, all_frames, residual=True)
            want = copy_err if all_frames else ((z[:, -2] - z[:, -1]) ** 2).mean()
            assert torch.allclose(loss, want, rtol=1e-2), (all_frames, ctx_noise)
    # a window where nothing moves: the residual target is exactly 0 however noisy the context the net sees
    still = z[:, :1].repeat(1, T, 1, 1, 1)
    for all_frames in (True, False):
        assert M.dynamics_loss(dyn, still, a, ABAR, True, all_frames, residual=True) < 1e-5
    # the plain (non-residual) net at zero predicts no latent in particular: far from the copy
    plain = M.Dynamics(4, 16, 1, 2, 32, 2)
    assert not torch.allclose(M.predict_next(plain, z[:, :-1], a, ABAR), z[:, -2], atol=1e-2)
    # given a context, the residual loss measures the change from that context's previous latent
    ctx = M.unit_norm(torch.randn(B, T, 4, 8, 8), 2)
    loss = M.dynamics_loss(dyn, z, a, ABAR, True, True, residual=True, ctx=ctx)
    assert torch.allclose(loss, ((ctx[:, :-1] - z[:, 1:]) ** 2).mean(), rtol=1e-2)


def test_own_context_is_the_models_open_loop_rollout():
    """own_ctx: frames 1..T-2 of the window become the model's own predictions from frame 0 with the
    window's actions, one step at a time; frames no action produced and the last frame stay real."""
    torch.manual_seed(0)
    _, _, dyn = _tiny_nets()
    _randomize(dyn)
    B, T = 2, 5
    z = M.unit_norm(torch.randn(B, T, 4, 8, 8), 2)
    a = M.action_input(torch.randn(B, T, 2), 1)
    a[1, :2] = M.action_input(torch.zeros(2, 2), 0)  # window 1 starts at an episode start: frame 1 is a copy
    z[1, 1] = z[1, 0]
    torch.manual_seed(1)  # the same noise for the new frames in both rollouts
    own = M.own_context(dyn, z, a, ABAR)
    assert torch.equal(own[:, 0], z[:, 0]) and torch.equal(own[:, -1], z[:, -1]) and torch.equal(own[1, 1], z[1, 1])
    ref = z.clone()
    torch.manual_seed(1)
    for j in range(1, T - 1):  # the same rollout, written out
        p = M.predict_next(dyn, ref[:, :j], a[:, :j + 1], ABAR, 15)
        ref[:, j] = torch.where(a[:, j, -1, None, None, None] > 0, p, ref[:, j])
    assert torch.allclose(own, ref, atol=1e-6)
    assert not torch.allclose(own[0, 1:-1], z[0, 1:-1], atol=1e-2)  # it really replaced them


def test_a_few_steps_lower_the_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    enc, dec, dyn = _tiny_nets()
    x = torch.rand(8, 3, 32, 32) * 2 - 1
    t, s = torch.randint(2, 1000, (8,)), None
    s = (torch.rand(8) * (t - 1).float()).long() + 1

    def ae_loss():
        torch.manual_seed(1)  # same eps every time: the loss is a fixed function of the weights
        return M.decoder_loss(dec, x, enc(x), t, s, ABAR)
    opt = torch.optim.Adam(list(enc.parameters()) + list(dec.parameters()), 3e-3)
    before = ae_loss().item()
    for _ in range(15):
        opt.zero_grad(); ae_loss().backward(); opt.step()
    assert ae_loss().item() < 0.8 * before

    z = M.unit_norm(torch.randn(4, 5, 4, 8, 8), 2)
    a = M.action_input(torch.randn(4, 5, 2), 1)

    def dyn_loss():
        torch.manual_seed(2)
        return M.dynamics_loss(dyn, z, a, ABAR)
    opt = torch.optim.Adam(dyn.parameters(), 3e-3)
    before = dyn_loss().item()
    for _ in range(15):
        opt.zero_grad(); dyn_loss().backward(); opt.step()
    assert dyn_loss().item() < 0.8 * before


def test_save_load_identical_outputs(tmp_path):
    _, dec, dyn = _tiny_nets()
    _randomize(dec), _randomize(dyn)
    path = str(tmp_path / 'c.pt')
    common.save_checkpoint({'kind': 'test', 'dec': dec.state_dict(), 'dyn': dyn.state_dict(), 'config': {'a': (1, 2)}}, path)
    assert not os.path.exists(path + '.tmp')  # written atomically
    ck = common.load_checkpoint(path, expect_kind='test')
    _, dec2, dyn2 = _tiny_nets()
    dec2.load_state_dict(ck['dec']), dyn2.load_state_dict(ck['dyn'])
    z = M.unit_norm(torch.randn(1, 4, 8, 8))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(M.decode(dec, z, 3, ABAR, 32, g1), M.decode(dec2, z, 3, ABAR, 32, g2))
    with pytest.raises(SystemExit, match="expected 'dynamics'"):
        common.load_checkpoint(path, expect_kind='dynamics')
    with pytest.raises(SystemExit, match='does not exist'):
        common.load_checkpoint(str(tmp_path / 'nope.pt'))


def test_actions_matter_and_seed_reproduces():
    _, _, dyn = _tiny_nets()
    _randomize(dyn)
    z0 = M.unit_norm(torch.randn(1, 4, 8, 8))

    def roll(actions, seed):
        g = torch.Generator().manual_seed(seed)
        ctx, act = M.init_window(z0, 4, 2)
        out = []
        for a in actions:
            z, ctx, act = M.window_step(dyn, ctx, act, a[None], ABAR, 15, 1, g)
            out.append(z)
        return torch.stack(out)
    a1 = torch.tensor([[-0.5, 0.5]] * 6)
    a2 = torch.tensor([[0.8, -0.8]] * 6)
    r1 = roll(a1, 0)
    assert torch.equal(r1, roll(a1, 0))  # same seed, same rollout
    assert (r1 - roll(a2, 0)).abs().mean() > 1e-3  # other actions, other future


def test_config_override_rejects_unknown_keys_and_wrong_types(tmp_path):
    d = dict(a=1, b=0.5, c='x', d=True, e=(1, 2))
    assert common.configure(d, ['--a=3', '--b=2', '--c=hi', '--d=False', '--e=(3,4)']) == \
        dict(a=3, b=2.0, c='hi', d=False, e=(3, 4))
    for bad, msg in [('--zz=1', 'unknown'), ('--a=1.5', 'wants int'), ('--d=1', 'wants bool'), ('--a', 'key=value')]:
        with pytest.raises(SystemExit, match=msg):
            common.configure(d, [bad])
    f = tmp_path / 'rec.py'
    f.write_text('a = 7\nb = 1e-3\n')
    assert common.configure(d, [str(f), '--a=8'])['a'] == 8
    f.write_text('nope = 1\n')
    with pytest.raises(SystemExit, match='unknown'):
        common.configure(d, [str(f)])


# ------------------------------------------------------------------------------------- pipeline


def _run(args, cwd):
    r = subprocess.run([sys.executable] + args, cwd=cwd, capture_output=True, text=True, timeout=600)
    return r


TINY_AE = ['--enc_ch=8', '--dec_ch=(8,16)', '--dec_attn=(False,True)', '--emb_dim=32', '--batch_size=4',
           '--eval_frames=8', '--log_interval=5']
TINY_DYN = ['--window=4', '--dyn_ch=16', '--dyn_depth=1', '--dyn_emb=32', '--dyn_heads=2', '--batch_size=4',
            '--val_episodes=1', '--val_horizon=4', '--log_interval=5']


def test_end_to_end_pipeline(tmp_path):
    """data.py -> train_ae.py -> train_dynamics.py -> rollout.py on a tiny Push-T set, plus resume and
    the autoencoder mismatch check."""
    d, ae, dyn, ev = (str(tmp_path / n) for n in ('data', 'ae', 'dyn', 'eval'))
    r = _run(['data.py', f'--out_dir={d}', '--num_episodes=3', '--episode_len=14', '--image_size=32', '--num_workers=1'], ROOT)
    assert r.returncode == 0, r.stderr
    r = _run(['train_ae.py', f'--data_dir={d}', f'--out_dir={ae}', '--max_iters=6', '--eval_interval=6',
              '--val_frac=0.34'] + TINY_AE, ROOT)
    assert r.returncode == 0, r.stderr
    assert 'val recon PSNR' in r.stdout and os.path.isfile(f'{ae}/ckpt.pt')
    r = _run(['train_ae.py', f'--data_dir={d}', f'--out_dir={ae}', '--max_iters=8', '--eval_interval=8',
              '--val_frac=0.34', '--init_from=resume'] + TINY_AE, ROOT)
    assert r.returncode == 0, r.stderr
    assert 'iter 7:' not in r.stdout and common.load_checkpoint(f'{ae}/ckpt.pt')['iter'] == 8  # resumed at 6
    r = _run(['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}/ckpt.pt', f'--out_dir={dyn}', '--max_iters=6',
              '--eval_interval=6', '--val_frac=0.34'] + TINY_DYN, ROOT)
    assert r.returncode == 0, r.stderr
    assert 'open-loop latent MSE' in r.stdout
    ck = common.load_checkpoint(f'{dyn}/ckpt.pt', expect_kind='dynamics')
    assert ck['data']['action_stats']['low'] and ck['config']['window'] == 4
    r = _run(['rollout.py', f'--ckpt={dyn}/ckpt.pt', '--num_episodes=1', '--horizon=5', f'--out_dir={ev}',
              '--fps_steps=2', f'--lpips_dir={tmp_path}'], ROOT)
    assert r.returncode == 0, r.stderr
    m = json.load(open(f'{ev}/metrics.json'))
    for k in ('model', 'copy_baseline'):
        for name in ('mse', 'psnr', 'ssim', 'uiqi', 'lpips', 'agent_err_px', 'block_iou'):
            assert name in m[k]
        assert m[k]['lpips'] is None  # no AlexNet weights in tmp_path: reported unavailable, not faked
        assert len(m[k]['curves']['psnr']) == 5
    assert m['horizon'] == 5 and m['num_episodes'] == 1 and m['fps'] > 0
    assert os.path.getsize(f'{ev}/rollout.gif') > 0
    # the simulator API over the trained checkpoint: batched, history reset, bad actions refused
    sys.path.insert(0, ROOT)
    import rollout
    dyn_m, enc, dec, ckd = rollout.load_world_model(f'{dyn}/ckpt.pt', 'cpu')
    sim = rollout.Simulator(dyn_m, enc, dec, ckd, seed=1)
    ds = data.load_dataset(d)
    hist = np.stack([ds['frames'][0:3], ds['frames'][14:17]])  # (2, 3, 32, 32, 3)
    sim.reset(hist, np.stack([ds['actions'][0:2], ds['actions'][14:16]]))
    f = sim.step(np.array([[100.0, 200.0], [300.0, 50.0]], dtype=np.float32))
    assert f.shape == (2, 32, 32, 3) and f.dtype == np.uint8
    with pytest.raises(ValueError, match='2 numbers'):
        sim.step(np.zeros((2, 3)))
    with pytest.raises(ValueError, match='uint8'):
        sim.reset(np.zeros((2, 16, 16, 3), np.uint8))
    # the ablation command: trains its two variants (tiny) and scores every row on the same episodes
    ab = str(tmp_path / 'ablation')
    r = _run(['ablate.py', f'--ckpt={dyn}/ckpt.pt', f'--out_dir={ab}', '--num_episodes=1', '--horizon=3',
              '--dyn_iters=2', '--ae_iters=2', '--windows=(2,)'], ROOT)
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    rows = json.load(open(f'{ab}/ablation.json'))['rows']
    names = [x['row'] for x in rows]
    assert len(rows) == 7 and any('deterministic' in n for n in names) and any('no context noise' in n for n in names)
    assert all(np.isfinite(x['mse']) for x in rows) and '| variant |' in open(f'{ab}/ablation.md').read()
    det = common.load_checkpoint(f'{ab}/det_decoder/ckpt_deterministic.pt', expect_kind='ae')
    assert det['config']['decoder_type'] == 'deterministic' and det['iter'] == 2
    assert det['encoder_fingerprint'] == common.load_checkpoint(f'{ae}/ckpt.pt')['encoder_fingerprint']  # frozen
    assert not common.load_checkpoint(f'{ab}/dyn_no_ctx_noise/ckpt.pt')['config']['ctx_noise']
    # the Push-T CPU recipe's shape: dynamics on the deterministic decoder, here with both stage-2 switches on;
    # the ablation then scores the stage-1 consistency decoder instead, has no K=1 row, and retrains one
    # variant per switch with only that switch off
    r = _run(['train_ae.py', f'--data_dir={d}', f'--out_dir={ae}', '--max_iters=2', '--eval_interval=2', '--val_frac=0.34',
              '--finetune=True', '--decoder_type=deterministic'] + TINY_AE, ROOT)
    assert r.returncode == 0, r.stderr
    dyn2, ab2 = str(tmp_path / 'dyn2'), str(tmp_path / 'ablation2')
    r = _run(['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}/ckpt_deterministic.pt', f'--out_dir={dyn2}',
              '--max_iters=2', '--eval_interval=2', '--val_frac=0.34', '--dyn_residual=True', '--own_ctx=0.5'] + TINY_DYN, ROOT)
    assert r.returncode == 0, r.stderr
    r = _run(['ablate.py', f'--ckpt={dyn2}/ckpt.pt', f'--out_dir={ab2}', '--num_episodes=1', '--horizon=3',
              '--dyn_iters=2', '--windows=()'], ROOT)
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    rows = json.load(open(f'{ab2}/ablation.json'))['rows']
    names = [x['row'] for x in rows]
    assert not any('K=1' in n for n in names) and any('consistency decoder' in n for n in names), names
    cons = [x for x in rows if 'consistency decoder' in x['row']][0]
    assert os.path.samefile(cons['change']['ae_ckpt'], f'{ae}/ckpt.pt')
    for variant, key, off in (('no_residual', 'dyn_residual', False), ('no_own_ctx', 'own_ctx', 0.0)):
        c = common.load_checkpoint(f'{ab2}/dyn_{variant}/ckpt.pt')['config']
        assert c[key] == off and c['ctx_noise'], variant
        other = 'own_ctx' if key == 'dyn_residual' else 'dyn_residual'
        assert c[other] == common.load_checkpoint(f'{dyn2}/ckpt.pt')['config'][other]  # only that switch is off
    assert len(rows) == 7, names  # full, level 0, no ctx noise, no residual, no own ctx, consistency decoder, copy
    # a different autoencoder (another stage-1 run) is refused by name
    r = _run(['train_ae.py', f'--data_dir={d}', f'--out_dir={tmp_path}/ae2', '--max_iters=1', '--eval_interval=1',
              '--val_frac=0.34', '--seed=5'] + TINY_AE, ROOT)
    assert r.returncode == 0, r.stderr
    r = _run(['rollout.py', f'--ckpt={dyn}/ckpt.pt', f'--ae_ckpt={tmp_path}/ae2/ckpt.pt', '--horizon=2', f'--out_dir={ev}'], ROOT)
    assert r.returncode != 0 and 'was trained on encoder' in r.stderr
    # wrong-typed option is refused before anything runs
    r = _run(['train_ae.py', f'--data_dir={d}', f'--out_dir={ae}', '--max_iters=two'], ROOT)
    assert r.returncode != 0 and 'wants int' in r.stderr


# ----------------------------------------------------------------------------------------- data


def _tiny_episodes(lengths=(5, 3, 4), size=8, seed=0):
    rng = np.random.default_rng(seed)
    frames = [rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8) for n in lengths]
    actions = [rng.uniform(0, 512, (n, 2)).astype(np.float32) for n in lengths]
    states = [rng.uniform(0, 512, (n, 5)).astype(np.float32) for n in lengths]
    meta = dict(fps=10, action_low=[0.0, 0.0], action_high=[512.0, 512.0], source='test')
    return frames, actions, states, meta


def test_write_load_round_trip_and_overwrite(tmp_path):
    frames, actions, states, meta = _tiny_episodes()
    out = str(tmp_path / 'ds')
    data.write_dataset(out, frames, actions, meta, states_list=states)
    d = data.load_dataset(out)
    assert isinstance(d['frames'], np.memmap)  # memory-mapped, not loaded
    assert d['episode_ends'].tolist() == [5, 8, 12]
    assert data.episode_ranges(d['episode_ends']) == [(0, 5), (5, 8), (8, 12)]
    assert np.array_equal(d['frames'], np.concatenate(frames))
    assert np.array_equal(d['actions'], np.concatenate(actions))
    assert np.array_equal(d['states'], np.concatenate(states))
    assert d['meta']['image_size'] == 8 and d['meta']['action_dim'] == 2 and d['meta']['num_episodes'] == 3

    # existing data is never clobbered by default; overwrite=True replaces it whole
    with pytest.raises(data.DatasetError, match='refusing to overwrite'):
        data.write_dataset(out, frames[:1], actions[:1], meta)
    assert len(data.load_dataset(out)['episode_ends']) == 3
    data.write_dataset(out, frames[:2], actions[:2], meta, overwrite=True)
    d = data.load_dataset(out)
    assert d['episode_ends'].tolist() == [5, 8] and d['states'] is None
    assert sorted(os.listdir(tmp_path)) == ['ds']  # no temp folders left behind

    # bad data is refused before anything lands on disk
    actions[1][0, 0] = np.nan
    with pytest.raises(data.DatasetError, match='NaN'):
        data.write_dataset(str(tmp_path / 'bad'), frames, actions, meta)
    assert sorted(os.listdir(tmp_path)) == ['ds']


def test_load_rejects_corrupt_datasets_naming_the_file(tmp_path):
    frames, actions, _, meta = _tiny_episodes()
    good = str(tmp_path / 'good')
    data.write_dataset(good, frames, actions, meta)

    def corrupt(name, fix):
        d = tmp_path / name
        d.mkdir()
        for f in os.listdir(good):
            (d / f).write_bytes(open(os.path.join(good, f), 'rb').read())
        fix(str(d))
        return str(d)

    def nan_action(d):
        a = np.load(f'{d}/actions.npy')
        a[6, 1] = np.nan
        np.save(f'{d}/actions.npy', a)

    def edit_meta(d, **kw):
        m = json.load(open(f'{d}/meta.json'))
        m.update(kw)
        json.dump({k: v for k, v in m.items() if v is not None}, open(f'{d}/meta.json', 'w'))

    cases = [
        ('nan', nan_action, 'actions.npy', 'NaN'),
        ('ends_order', lambda d: np.save(f'{d}/episode_ends.npy', np.array([5, 3, 12])), 'episode_ends.npy', 'increasing'),
        ('ends_empty', lambda d: np.save(f'{d}/episode_ends.npy', np.array([5, 5, 12])), 'episode_ends.npy', 'empty'),
        ('ends_last', lambda d: np.save(f'{d}/episode_ends.npy', np.array([5, 8, 11])), 'episode_ends.npy', 'last end'),
        ('dtype', lambda d: np.save(f'{d}/actions.npy', np.load(f'{d}/actions.npy').astype(np.float64)),
         'actions.npy', 'float32'),
        ('frames_dtype', lambda d: np.save(f'{d}/frames.npy', np.load(f'{d}/frames.npy').astype(np.float32)),
         'frames.npy', 'uint8'),
        ('length', lambda d: np.save(f'{d}/actions.npy', np.load(f'{d}/actions.npy')[:-1]), 'actions.npy', 'rows'),
        ('garbage', lambda d: open(f'{d}/frames.npy', 'wb').write(b'not numpy'), 'frames.npy', 'not a .npy'),
        ('no_meta', lambda d: os.remove(f'{d}/meta.json'), 'meta.json', 'missing'),
        ('bad_json', lambda d: open(f'{d}/meta.json', 'w').write('{"fps": '), 'meta.json', 'JSON'),
        ('meta_key', lambda d: edit_meta(d, fps=None), 'meta.json', 'fps'),
        ('meta_size', lambda d: edit_meta(d, image_size=16), 'meta.json', 'image_size'),
    ]
    for name, fix, fname, words in cases:
        with pytest.raises(data.DatasetError) as e:
            data.load_dataset(corrupt(name, fix))
        assert fname in str(e.value) and words in str(e.value), (name, str(e.value))
    with pytest.raises(data.DatasetError, match='does not exist'):
        data.load_dataset(str(tmp_path / 'nowhere'))


def test_split_and_action_stats_use_train_only():
    train, val = data.split_episodes(10, val_frac=0.2, seed=3)
    assert (train, val) == data.split_episodes(10, val_frac=0.2, seed=3)  # deterministic
    assert len(val) == 2 and sorted(train + val) == list(range(10))
    assert len(data.split_episodes(2, val_frac=0.01)[1]) == 1  # always one val and one train episode
    assert len(data.split_episodes(3, val_frac=0.9)[0]) == 1
    with pytest.raises(data.DatasetError):
        data.split_episodes(1)

    # three episodes with disjoint action ranges: stats must see only the ones asked for
    actions = np.array([[0, 5], [1, 5], [10, 5], [11, 5], [100, 5], [101, 5]], np.float32)
    ends = np.array([2, 4, 6])
    stats = data.action_stats(actions, ends, [0, 1])
    assert stats['low'][0] == 0 and stats['high'][0] == 11  # episode 2 (val) ignored
    assert stats['high'][1] > stats['low'][1]  # constant dimension widened, no division by zero
    n = data.normalize_actions(actions[:4], stats)
    assert isinstance(n, np.ndarray) and np.isfinite(n).all()
    assert np.allclose(n[[0, 3], 0], [-1, 1]) and np.allclose(n[:, 1], 0)
    assert np.allclose(data.denormalize_actions(n, stats), actions[:4], atol=1e-4)
    torch = pytest.importorskip('torch')
    t = data.normalize_actions(torch.from_numpy(actions[:4]), stats)
    assert isinstance(t, torch.Tensor) and np.allclose(t.numpy(), n)
    assert torch.allclose(data.denormalize_actions(t, stats), torch.from_numpy(actions[:4]), atol=1e-4)


def test_generate_pusht_shapes_and_motion(tmp_path):
    out = str(tmp_path / 'pusht')
    data.generate_pusht(out, num_episodes=2, episode_len=12, image_size=32, num_workers=1, seed=0)
    d = data.load_dataset(out)
    assert d['frames'].shape == (24, 32, 32, 3) and d['frames'].dtype == np.uint8
    assert d['actions'].shape == (24, 2) and d['states'].shape == (24, 5)
    assert d['episode_ends'].tolist() == [12, 24]
    assert d['meta']['action_low'] == [0.0, 0.0] and d['meta']['action_high'] == [512.0, 512.0]
    a, s = np.asarray(d['actions']), np.asarray(d['states'])
    assert (a >= 0).all() and (a <= 512).all()
    for lo, hi in data.episode_ranges(d['episode_ends']):
        assert np.linalg.norm(s[hi - 1, :2] - s[lo, :2]) > 1.0  # the agent moved
        assert np.abs(np.diff(d['frames'][lo:hi].astype(int), axis=0)).sum() > 0  # and the pixels changed
    # episodes depend only on seed + index: regenerating one reproduces it exactly
    again = str(tmp_path / 'again')
    data.generate_pusht(again, num_episodes=1, episode_len=12, image_size=32, num_workers=1, seed=0)
    assert np.array_equal(data.load_dataset(again)['frames'], d['frames'][:12])


# -------------------------------------------------------------------------------------- metrics


def _rand_img(seed, shape=(2, 3, 32, 32)):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g)


def test_ssim_uiqi_identical_is_one():
    x = _rand_img(0)
    flat = torch.full((2, 3, 32, 32), 0.37)
    black = torch.zeros(1, 3, 16, 16)
    for img in (x, flat, black):
        assert torch.allclose(metrics.ssim(img, img), torch.ones(len(img)), atol=1e-6)
        # UIQI: 0/0 terms on flat windows are defined as 1, so this must be exact
        assert torch.equal(metrics.uiqi(img, img), torch.ones(len(img)))


def test_ssim_uiqi_perturbed_below_one():
    x = _rand_img(0)
    y = (x + 0.3 * (_rand_img(1) - 0.5)).clamp(0, 1)  # noise var ~0.0075 vs signal var ~0.083
    s, q = metrics.ssim(x, y), metrics.uiqi(x, y)
    assert s.shape == (2,) and q.shape == (2,)
    assert (s < 0.97).all() and (q < 0.97).all()
    assert (s > 0).all() and (q > 0).all()  # still similar, not garbage
    # flat target vs textured prediction: structure term 0 -> UIQI about 0
    flat = torch.full_like(x, 0.5)
    assert metrics.uiqi(x, flat).abs().max() < 1e-6
    # a flat image at another grey level: only luminance differs, 2*0.5*0.6/(0.25+0.36)
    flat2 = torch.full_like(x, 0.6)
    assert torch.allclose(metrics.uiqi(flat, flat2), torch.full((2,), 0.6 / 0.61), atol=1e-6)


def test_mse_psnr_known_values():
    x = _rand_img(2) * 0.8
    y = x + 0.1  # constant offset 0.1: mse = 0.01 -> psnr = 10 log10(1/0.01) = 20 dB
    assert torch.allclose(metrics.mse(x, y), torch.full((2,), 0.01), atol=1e-6)
    assert torch.allclose(metrics.psnr(x, y), torch.full((2,), 20.0), atol=1e-4)
    assert torch.allclose(metrics.psnr(x, x), torch.full((2,), 100.0))  # mse clamped at 1e-10


def test_load_lpips_unavailable(tmp_path):
    # weights_dir given -> searched exclusively, so the real torch hub cache cannot interfere
    model, msg = metrics.load_lpips(weights_dir=str(tmp_path))
    assert model is None
    assert msg.startswith("unavailable") and str(tmp_path) in msg


def _fake_alexnet_state_dict(seed=0):
    # torchvision alexnet.features conv layers (index: weight shape)
    shapes = {0: (64, 3, 11, 11), 3: (192, 64, 5, 5), 6: (384, 192, 3, 3),
              8: (256, 384, 3, 3), 10: (256, 256, 3, 3)}
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for i, s in shapes.items():
        sd[f"features.{i}.weight"] = torch.randn(s, generator=g) * 0.05
        sd[f"features.{i}.bias"] = torch.randn(s[0], generator=g) * 0.05
    sd["classifier.1.weight"] = torch.zeros(4, 4)  # extra keys (full model file) are ignored
    return sd


def test_lpips_fake_weights(tmp_path):
    sd = _fake_alexnet_state_dict()
    torch.save(sd, tmp_path / metrics.ALEXNET_FILE)
    model, msg = metrics.load_lpips(weights_dir=str(tmp_path))
    assert model is not None, msg
    # every backbone tensor must now equal the file's tensor (lpips sliceK.N <- features.N)
    n = 0
    for name, p in model.net.state_dict().items():
        _, idx, param = name.split('.')
        assert torch.equal(p, sd[f"features.{idx}.{param}"]), name
        n += 1
    assert n == 10
    x, y = _rand_img(3, (2, 3, 64, 64)), _rand_img(4, (2, 3, 64, 64))
    d_xx, d_xy = metrics.lpips_distance(model, x, x), metrics.lpips_distance(model, x, y)
    assert d_xx.shape == (2,) and d_xy.shape == (2,)
    assert d_xx.abs().max() < 1e-6
    assert (d_xy > 1e-4).all()


def _render(S, states):
    """uint8 frames (B, S, S, 3) and true agent positions in frame pixels (B, 2)."""
    os.environ.setdefault('SDL_VIDEODRIVER', 'dummy')
    gym = pytest.importorskip("gymnasium")
    pytest.importorskip("gym_pusht")
    env = gym.make("gym_pusht/PushT-v0", obs_type="pixels", observation_width=S, observation_height=S)
    frames, pos = [], []
    for st in states:
        obs, _ = env.reset(options={"reset_to_state": st})
        frames.append(obs)
        # renderer does not flip y: pixel = sim * S / 512 for both axes
        pos.append(np.array(env.unwrapped.agent.position) * S / 512)
    env.close()
    return np.stack(frames), np.stack(pos)


# agent kept clear of the block; the last one sits on the block's stem (drawn on top of it)
STATES = [[100, 400, 300, 200, 0.5], [420, 90, 200, 300, -1.0], [60, 60, 350, 350, 2.0],
          [256, 360, 256, 300, 0.0]]


@pytest.mark.parametrize("S", [64, 96])
def test_pusht_agent_centroid_and_block(S):
    frames, pos = _render(S, STATES)
    est = metrics.agent_position(frames)
    assert est.shape == (len(STATES), 2)
    err = np.linalg.norm(est - pos, axis=1)
    assert (err < 1.0).all(), err  # measured ~0.1-0.25 px
    seg = metrics.segment_pusht(frames)
    assert seg["block"].shape == (len(STATES), S, S)
    assert (seg["block"].sum((1, 2)) > 50).all()
    assert not seg["agent"][:, :3].any() and not seg["block"][:, :3].any()  # top wall excluded
    r = metrics.pusht_physics(frames, frames)
    assert np.array_equal(r["block_iou"], np.ones(len(STATES)))
    assert np.array_equal(r["agent_err_px"], np.zeros(len(STATES)))
    # moving the block (and agent) lowers IoU; errors stay finite
    r = metrics.pusht_physics(frames[1:], frames[:-1])
    assert (r["block_iou"] < 0.5).all() and np.isfinite(r["agent_err_px"]).all()
    assert (r["agent_err_px"] > 5).all()


def test_pusht_physics_missing_agent_and_iou_edge_cases():
    frames, _ = _render(64, STATES[:1])
    blank = np.full_like(frames, 255)  # a prediction that lost everything
    assert np.isnan(metrics.agent_position(blank)).all()
    r = metrics.pusht_physics(blank, frames)
    assert np.allclose(r["agent_err_px"], np.hypot(64, 64)) and r["block_iou"][0] == 0.0
    r = metrics.pusht_physics(blank, blank)
    assert r["agent_err_px"][0] == 0.0 and r["block_iou"][0] == 1.0  # both empty -> IoU 1
    # small block shift: IoU drops but stays well above 0
    frames2, _ = _render(64, [[100, 400, 310, 200, 0.5]])
    iou = metrics.pusht_physics(frames2, frames)["block_iou"][0]
    assert 0.2 < iou < 0.95, iou


def test_import_has_no_side_effects():
    import subprocess
    import sys
    code = ("import sys, metrics; bad = [m for m in ('gym_pusht', 'gymnasium', 'pygame', 'lpips') "
            "if m in sys.modules]; assert not bad, bad")
    here = os.path.dirname(os.path.abspath(metrics.__file__))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=here)


# ---------------------------------------------------------------------- converters (data.py --convert)


LOSSY_MAE = 10.0  # mean abs error in 0..255 allowed for JPEG / mp4 round trips


def _conv_frames(T, H, W, seed):
    """Smooth moving colour gradients (lossy codecs keep them well), different per seed."""
    y, x = np.mgrid[0:H, 0:W].astype(np.float64)
    t = np.arange(T)[:, None, None]
    r = 128 + 90 * np.sin(x[None] / 5.0 + 0.4 * t + seed)
    g = 128 + 90 * np.cos(y[None] / 6.0 - 0.3 * t + 2 * seed)
    b = 128 + 60 * np.sin((x + y)[None] / 9.0 + 0.2 * t * (seed + 1))
    return np.stack([r, g, b], -1).clip(0, 255).astype(np.uint8)


def _conv_actions(T, A, seed):
    return np.random.default_rng(seed).uniform(-2, 5, (T, A)).astype(np.float32)


def _conv_check(out, frames, actions, lossy=False):
    """The converted folder holds these episodes, in order, with these frames and actions."""
    d = data.load_dataset(str(out))
    assert list(d['episode_ends']) == list(np.cumsum([len(f) for f in frames]))
    assert np.array_equal(d['actions'], np.concatenate(actions).astype(np.float32))
    want = np.concatenate(frames)
    if lossy:
        err = np.abs(np.asarray(d['frames'], np.float64) - want).mean()
        assert err < LOSSY_MAE, f"mean abs error {err:.2f} over {LOSSY_MAE}"
    else:
        assert np.array_equal(d['frames'], want)
    acts = np.concatenate(actions)
    assert d['meta']['action_low'] == pytest.approx(acts.min(0).tolist())
    assert d['meta']['action_high'] == pytest.approx(acts.max(0).tolist())
    return d


def _conv_zarr_put(group, name, arr):
    # zarr 3 has create_array; zarr 2 has create_dataset
    if hasattr(group, 'create_array'):
        group.create_array(name, data=arr, chunks=arr.shape if arr.ndim < 4 else (3,) + arr.shape[1:])
    else:
        group.create_dataset(name, data=arr, chunks=arr.shape if arr.ndim < 4 else (3,) + arr.shape[1:])


@pytest.mark.parametrize('zarr_format', [2, 3])
def test_convert_zarr(tmp_path, zarr_format):
    zarr = pytest.importorskip('zarr')
    if zarr_format == 3 and not zarr.__version__.startswith('3'):
        pytest.skip('zarr v3 stores need zarr 3')
    lengths = [5, 7, 4]
    frames = [_conv_frames(T, 16, 16, k) for k, T in enumerate(lengths)]
    actions = [_conv_actions(T, 2, k) for k, T in enumerate(lengths)]
    states = [_conv_actions(T, 5, 10 + k) for k, T in enumerate(lengths)]
    src = str(tmp_path / 'replay.zarr')
    kw = dict(zarr_format=zarr_format) if zarr.__version__.startswith('3') else {}
    root = zarr.open_group(src, mode='w', **kw)
    _conv_zarr_put(root, 'data/img', np.concatenate(frames))
    _conv_zarr_put(root, 'data/action', np.concatenate(actions))
    _conv_zarr_put(root, 'data/state', np.concatenate(states))
    _conv_zarr_put(root, 'meta/episode_ends', np.cumsum(lengths).astype(np.int64))

    data.convert('zarr', src, str(tmp_path / 'out'), image_size=16, fps=10)
    d = _conv_check(tmp_path / 'out', frames, actions)
    assert np.array_equal(d['states'], np.concatenate(states))
    assert d['meta']['fps'] == 10 and 'zarr' in d['meta']['source'] and src in d['meta']['source']

    # stride 2: frames 0, 2, 4... of each episode with their actions, fps halved
    data.convert('zarr', src, str(tmp_path / 's2'), image_size=16, fps=10, stride=2, action_dims=(1,))
    d = _conv_check(tmp_path / 's2', [f[::2] for f in frames], [a[::2, 1:] for a in actions])
    assert d['meta']['fps'] == 5 and d['meta']['action_dim'] == 1

    with pytest.raises(data.DatasetError, match='--fps'):  # zarr does not record its frame rate
        data.convert('zarr', src, str(tmp_path / 'nofps'), image_size=16)


def _conv_jpeg_rows(frames):
    """ALOHA's compressed layout: per frame the JPEG bytes, zero-padded to one length. The recorder used
    OpenCV, which reads its RGB arrays as BGR: emulate that by encoding the channel-swapped frame."""
    from PIL import Image
    enc = []
    for f in frames:
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(f[..., ::-1])).save(buf, format='JPEG', quality=95)
        enc.append(np.frombuffer(buf.getvalue(), np.uint8))
    rows = np.zeros((len(enc), max(len(e) for e in enc) + 17), np.uint8)
    for i, e in enumerate(enc):
        rows[i, :len(e)] = e
    return rows, np.array([len(e) for e in enc], np.float32)


def _conv_write_aloha(path, frames, actions, qpos, jpeg=False, cams=('top', 'wrist')):
    h5py = pytest.importorskip('h5py')
    with h5py.File(path, 'w') as f:
        f.attrs['sim'] = True
        f.attrs['compress'] = jpeg
        lens = []
        for i, cam in enumerate(cams):
            imgs = frames if i == 0 else 255 - frames  # the second camera sees something else
            if jpeg:
                imgs, n = _conv_jpeg_rows(imgs)
                lens.append(n)
            f.create_dataset(f'observations/images/{cam}', data=imgs)
        if jpeg:
            f.create_dataset('compress_len', data=np.stack(lens))
        f.create_dataset('observations/qpos', data=qpos)
        f.create_dataset('action', data=actions)


@pytest.mark.parametrize('jpeg', [False, True])
def test_convert_hdf5(tmp_path, jpeg):
    pytest.importorskip('h5py')
    src = tmp_path / 'aloha'
    src.mkdir()
    lengths = [6, 4, 5]  # written as episode_0, episode_1, episode_10: natural order keeps them so
    frames = [_conv_frames(T, 16, 16, k) for k, T in enumerate(lengths)]
    actions = [_conv_actions(T, 14, k) for k, T in enumerate(lengths)]
    qpos = [_conv_actions(T, 14, 20 + k) for k, T in enumerate(lengths)]
    for k, name in enumerate(['episode_0', 'episode_1', 'episode_10']):
        _conv_write_aloha(str(src / f'{name}.hdf5'), frames[k], actions[k], qpos[k], jpeg=jpeg)

    with pytest.raises(data.DatasetError, match='several cameras'):  # two views: the user picks one
        data.convert('hdf5', str(src), str(tmp_path / 'x'), image_size=16, fps=50)
    data.convert('hdf5', str(src), str(tmp_path / 'out'), camera='top', image_size=16, fps=50)
    d = _conv_check(tmp_path / 'out', frames, actions, lossy=jpeg)
    assert np.array_equal(d['states'], np.concatenate(qpos))
    assert d['meta']['camera'] == 'top' and d['meta']['fps'] == 50
    if jpeg:  # the colours come back the right way round, not R/B swapped
        wrong = np.abs(np.asarray(d['frames'], np.float64) - np.concatenate(frames)[..., ::-1]).mean()
        assert wrong > 3 * LOSSY_MAE


def test_convert_hdf5_bad_episode(tmp_path):
    pytest.importorskip('h5py')
    src = tmp_path / 'aloha'
    src.mkdir()
    for k in range(3):
        T = 5
        acts = _conv_actions(T - 1 if k == 1 else T, 3, k)  # episode 1: one action short
        _conv_write_aloha(str(src / f'episode_{k}.hdf5'), _conv_frames(T, 16, 16, k), acts,
                          _conv_actions(T, 3, k), cams=('top',))
    with pytest.raises(data.DatasetError, match=r'episode_1\.hdf5.*5 frames but 4 actions'):
        data.convert('hdf5', str(src), str(tmp_path / 'out'), image_size=16, fps=50)
    assert not os.path.exists(tmp_path / 'out')  # nothing half-written
    assert [p for p in os.listdir(tmp_path) if p.startswith('.')] == []  # no temp or spool folders left


def _conv_write_mp4(path, frames, fps):
    av = pytest.importorskip('av')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with av.open(str(path), 'w') as box:
        st = box.add_stream('mpeg4', rate=fps)
        st.width, st.height, st.pix_fmt = frames.shape[2], frames.shape[1], 'yuv420p'
        st.bit_rate = 4_000_000
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format='rgb24')
            vf.pts, vf.time_base = i, Fraction(1, fps)
            for pkt in st.encode(vf):
                box.mux(pkt)
        for pkt in st.encode():
            box.mux(pkt)


def _conv_lerobot_table(ep, actions, states, start_index, fps):
    import pyarrow as pa
    T, A = actions.shape
    return pa.table({
        'action': pa.FixedSizeListArray.from_arrays(pa.array(actions.reshape(-1)), A),
        'observation.state': pa.FixedSizeListArray.from_arrays(pa.array(states.reshape(-1)), states.shape[1]),
        'timestamp': pa.array((np.arange(T) / fps).astype(np.float32)),
        'frame_index': pa.array(np.arange(T)),
        'episode_index': pa.array(np.full(T, ep)),
        'index': pa.array(start_index + np.arange(T)),
        'task_index': pa.array(np.zeros(T, np.int64)),
    })


def _conv_lerobot_info(version, T_total, E, cam, A, fps):
    v2 = version.startswith('v2')
    return {
        'codebase_version': version, 'robot_type': 'test', 'fps': fps, 'total_episodes': E,
        'total_frames': T_total, 'chunks_size': 1000,
        'data_path': ('data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet' if v2 else
                      'data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet'),
        'video_path': ('videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4' if v2 else
                       'videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4'),
        'features': {
            cam: {'dtype': 'video', 'shape': [32, 32, 3], 'names': ['height', 'width', 'channels']},
            'observation.state': {'dtype': 'float32', 'shape': [3], 'names': None},
            'action': {'dtype': 'float32', 'shape': [A], 'names': None},
            'timestamp': {'dtype': 'float32', 'shape': [1], 'names': None},
            'frame_index': {'dtype': 'int64', 'shape': [1], 'names': None},
            'episode_index': {'dtype': 'int64', 'shape': [1], 'names': None},
            'index': {'dtype': 'int64', 'shape': [1], 'names': None},
            'task_index': {'dtype': 'int64', 'shape': [1], 'names': None},
        },
    }


def test_convert_lerobot_v2(tmp_path):
    pytest.importorskip('pyarrow')
    pytest.importorskip('av')
    import pyarrow.parquet as pq
    fps, cam, lengths = 10, 'observation.images.top', [6, 5]
    src = tmp_path / 'lr2'
    frames = [_conv_frames(T, 32, 32, k) for k, T in enumerate(lengths)]
    actions = [_conv_actions(T, 2, k) for k, T in enumerate(lengths)]
    states = [_conv_actions(T, 3, 30 + k) for k, T in enumerate(lengths)]
    (src / 'meta').mkdir(parents=True)
    (src / 'data/chunk-000').mkdir(parents=True)
    (src / 'meta/info.json').write_text(json.dumps(_conv_lerobot_info('v2.1', sum(lengths), 2, cam, 2, fps)))
    (src / 'meta/episodes.jsonl').write_text(''.join(
        json.dumps({'episode_index': k, 'tasks': ['push'], 'length': T}) + '\n' for k, T in enumerate(lengths)))
    start = 0
    for k, T in enumerate(lengths):
        pq.write_table(_conv_lerobot_table(k, actions[k], states[k], start, fps),
                       str(src / f'data/chunk-000/episode_{k:06d}.parquet'))
        _conv_write_mp4(str(src / f'videos/chunk-000/{cam}/episode_{k:06d}.mp4'), frames[k], fps)
        start += T

    data.convert('lerobot', str(src), str(tmp_path / 'out'), camera='top', image_size=32)
    d = _conv_check(tmp_path / 'out', frames, actions, lossy=True)
    assert np.allclose(d['states'], np.concatenate(states))
    assert d['meta']['fps'] == fps and d['meta']['camera'] == cam


def test_convert_lerobot_v3(tmp_path):
    pytest.importorskip('pyarrow')
    pytest.importorskip('av')
    import pyarrow as pa
    import pyarrow.parquet as pq
    fps, cam, lengths = 10, 'observation.images.front', [5, 7, 4]
    src = tmp_path / 'lr3'
    frames = [_conv_frames(T, 32, 32, k) for k, T in enumerate(lengths)]
    actions = [_conv_actions(T, 3, k) for k, T in enumerate(lengths)]
    states = [_conv_actions(T, 3, 40 + k) for k, T in enumerate(lengths)]
    for p in ('meta/episodes/chunk-000', 'data/chunk-000'):
        (src / p).mkdir(parents=True)
    (src / 'meta/info.json').write_text(json.dumps(_conv_lerobot_info('v3.0', sum(lengths), 3, cam, 3, fps)))
    # all episodes in one parquet and one mp4, one after the other
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pq.write_table(pa.concat_tables([_conv_lerobot_table(k, actions[k], states[k], int(starts[k]), fps)
                                     for k in range(3)]), str(src / 'data/chunk-000/file-000.parquet'))
    _conv_write_mp4(str(src / f'videos/{cam}/chunk-000/file-000.mp4'), np.concatenate(frames), fps)
    ends = np.cumsum(lengths)
    pq.write_table(pa.table({
        'episode_index': pa.array(np.arange(3)),
        'tasks': pa.array([['push']] * 3),
        'length': pa.array(np.array(lengths)),
        'data/chunk_index': pa.array(np.zeros(3, np.int64)), 'data/file_index': pa.array(np.zeros(3, np.int64)),
        'dataset_from_index': pa.array(starts), 'dataset_to_index': pa.array(ends),
        f'videos/{cam}/chunk_index': pa.array(np.zeros(3, np.int64)),
        f'videos/{cam}/file_index': pa.array(np.zeros(3, np.int64)),
        f'videos/{cam}/from_timestamp': pa.array(starts / fps),
        f'videos/{cam}/to_timestamp': pa.array(ends / fps),
    }), str(src / 'meta/episodes/chunk-000/file-000.parquet'))

    data.convert('lerobot', str(src), str(tmp_path / 'out'), image_size=32)  # one camera: no --camera needed
    d = _conv_check(tmp_path / 'out', frames, actions, lossy=True)
    assert np.allclose(d['states'], np.concatenate(states))
    # each episode got its own stretch of the shared video: frame-exact, a one-frame shift would show
    video = np.concatenate(frames).astype(np.float64)
    for k, (s, e) in enumerate(data.episode_ranges(d['episode_ends'])):
        got = np.asarray(d['frames'][s:e], np.float64)
        assert np.abs(got - video[s:e]).mean() < LOSSY_MAE
        shifted = video[s + 1:e + 1] if e < len(video) else video[s - 1:e - 1]
        assert np.abs(got[:len(shifted)] - shifted).mean() > 2 * LOSSY_MAE
    data.convert('lerobot', str(src), str(tmp_path / 's3'), image_size=32, stride=3)
    _conv_check(tmp_path / 's3', [f[::3] for f in frames], [a[::3] for a in actions], lossy=True)


def _conv_write_folder(root, k, frames, actions, header=None):
    from PIL import Image
    ep = root / f'ep{k}'
    ep.mkdir(parents=True)
    for i, f in enumerate(frames):  # 2.png before 10.png: numbers, not strings, give the order
        Image.fromarray(f).save(ep / f'{i}.png')
    lines = ([','.join(header)] if header else []) + [','.join(repr(float(x)) for x in r) for r in actions]
    (ep / 'actions.csv').write_text('\n'.join(lines) + '\n')
    return ep


def test_convert_folder(tmp_path):
    src = tmp_path / 'eps'
    lengths = [12, 5]
    frames = [_conv_frames(T, 16, 24, k) for k, T in enumerate(lengths)]  # not square: centre crop
    actions = [_conv_actions(T, 3, k) for k, T in enumerate(lengths)]
    for k in range(2):
        _conv_write_folder(src, k, frames[k], actions[k], header=['x', 'y', 'grip'])
    data.convert('folder', str(src), str(tmp_path / 'out'), image_size=16, fps=15, stride=2, action_keys='grip,x')
    _conv_check(tmp_path / 'out', [f[::2, :, 4:20] for f in frames], [a[::2][:, [2, 0]] for a in actions])
    d = data.load_dataset(str(tmp_path / 'out'))
    assert d['meta']['fps'] == 7.5 and d['meta']['stride'] == 2


def test_convert_folder_bad_and_skip(tmp_path):
    src = tmp_path / 'eps'
    frames = [_conv_frames(4, 16, 16, k) for k in range(3)]
    actions = [_conv_actions(4, 2, k) for k in range(3)]
    for k in range(3):
        _conv_write_folder(src, k, frames[k], actions[k])
    (src / 'ep1' / '2.png').write_bytes(b'not a png at all')  # a corrupt frame in episode 1
    with pytest.raises(data.DatasetError, match=r'ep1 \(episode 1\).*2\.png.*undecodable'):
        data.convert('folder', str(src), str(tmp_path / 'out'), image_size=16, fps=15)
    assert not os.path.exists(tmp_path / 'out')

    with pytest.warns(UserWarning, match=r'skipping .*ep1'):
        r = data.convert('folder', str(src), str(tmp_path / 'out'), image_size=16, fps=15, skip_bad=True)
    assert r['episodes'] == 2 and len(r['skipped']) == 1
    d = _conv_check(tmp_path / 'out', [frames[0], frames[2]], [actions[0], actions[2]])
    assert d['meta']['skipped_episodes'] == r['skipped']

    from PIL import Image
    Image.fromarray(frames[1][2]).save(src / 'ep1' / '2.png')  # episode 1 mended
    actions[2][3, 1] = np.nan  # NaN action: named with its frame
    (src / 'ep2' / 'actions.csv').write_text('\n'.join(','.join(repr(float(x)) for x in r) for r in actions[2]))
    with pytest.raises(data.DatasetError, match=r'ep2 \(episode 2\).*NaN or Inf action at frame 3'):
        data.convert('folder', str(src), str(tmp_path / 'out2'), image_size=16, fps=15, skip_bad=False)


def test_convert_cli(tmp_path):
    """The command line: python data.py --convert=folder ...; errors exit non-zero with the message."""
    src = tmp_path / 'eps'
    frames = [_conv_frames(3, 8, 8, k) for k in range(2)]
    actions = [_conv_actions(3, 2, k) for k in range(2)]
    for k in range(2):
        _conv_write_folder(src, k, frames[k], actions[k])
    out = tmp_path / 'out'
    cmd = [sys.executable, 'data.py', '--convert=folder', f'--src={src}', f'--out_dir={out}', '--image_size=8']
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and '--fps' in r.stderr  # folders do not record their frame rate
    r = subprocess.run(cmd + ['--fps=20', '--action_dims=1'], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    _conv_check(out, frames, [a[:, 1:] for a in actions])


# ------------------------------------------------------------- distributed, resume, guards (issue 6)


_DDP_ROOT = os.path.dirname(os.path.abspath(__file__))
_DDP_AE = ['--enc_ch=8', '--dec_ch=(8,16)', '--dec_attn=(False,True)', '--emb_dim=32', '--batch_size=4',
           '--eval_frames=8', '--log_interval=1', '--val_frac=0.34']
_DDP_DYN = ['--window=4', '--dyn_ch=16', '--dyn_depth=1', '--dyn_emb=32', '--dyn_heads=2', '--batch_size=4',
            '--val_episodes=1', '--val_horizon=4', '--log_interval=1', '--val_frac=0.34']


def _ddp_env():
    # one thread per process: the same float summation order in every run, and kind to a 2-core box.
    # (Not PYTHONUNBUFFERED: unbuffered, print writes text and newline separately and the two ranks'
    # lines interleave on the shared pipe; the trainers flush whole lines.)
    env = dict(os.environ, OMP_NUM_THREADS='1')
    env.pop('PYTHONUNBUFFERED', None)
    return env


def _ddp_run(args, nproc=1, timeout=180):
    """python script args..., or torchrun with nproc CPU processes; returns the CompletedProcess."""
    if nproc > 1:
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}'] + args
    else:
        cmd = [sys.executable] + args
    return subprocess.run(cmd, cwd=_DDP_ROOT, capture_output=True, text=True, timeout=timeout, env=_ddp_env())


def _ddp_data(path, episodes=3, T=14, S=32):
    """A tiny dataset of random frames (no simulator needed to test the training loop)."""
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (T, S, S, 3), dtype=np.uint8) for _ in range(episodes)]
    actions = [rng.uniform(0, 512, (T, 2)).astype(np.float32) for _ in range(episodes)]
    data.write_dataset(str(path), frames, actions, dict(fps=10, action_low=[0.0, 0.0], action_high=[512.0, 512.0],
                                                       source='test'))
    return str(path)


def _ddp_fake_ae(path, S=32):
    """A stage-1 checkpoint with untrained tiny nets, written in-process (saves a training run)."""
    torch.manual_seed(0)
    enc, dec = M.Encoder(8, 4), M.Decoder((8, 16), (False, True), 4, 32, 2)
    cfg = dict(enc_ch=8, dec_ch=(8, 16), dec_attn=(False, True), latent_ch=4, emb_dim=32, heads=2)
    common.save_checkpoint({'kind': 'ae', 'encoder': enc.state_dict(), 'decoder': dec.state_dict(), 'config': cfg,
                            'data': {'image_size': S}, 'encoder_fingerprint': common.fingerprint(enc.state_dict())},
                           str(path))
    return str(path)


def _ddp_losses(text):
    """{iter: logged loss string} from a training log."""
    return {int(m.group(1)): m.group(2) for m in re.finditer(r'iter (\d+): loss ([0-9.eE+-]+|nan|inf)', text)}


def _ddp_close(a, b, atol=1e-6):
    return all(torch.allclose(a[k], b[k], atol=atol, rtol=1e-5) for k in a)


def _ddp_check_two_ranks(r, out, stage_line):
    """Both ranks ran; rank 0 alone logged, evaluated and wrote one checkpoint (and its best copy)."""
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert 'rank 0/2:' in log and 'rank 1/2:' in log, log[-3000:]
    assert r.stdout.count('iter 1: loss') == 1, r.stdout
    assert len(re.findall(stage_line, r.stdout)) == 1, r.stdout
    assert sorted(f for f in os.listdir(out) if '.pt' in f) == ['ckpt.pt', 'ckpt_best.pt'], os.listdir(out)
    ck = common.load_checkpoint(os.path.join(out, 'ckpt.pt'))
    assert ck['world_size'] == 2 and len(ck['rng']) == 2 and ck['iter'] == 2
    return ck


def test_ddp_ae_two_ranks_equal_one_rank_with_accumulation(tmp_path):
    """torchrun 2 x grad_accum 1 and 1 process x grad_accum 2 take the same step (sample_seed='micro':
    micro-batch g of step i is drawn from (seed, i, g) whichever rank draws it)."""
    d = _ddp_data(tmp_path / 'data')
    common_args = [f'--data_dir={d}', '--max_iters=2', '--eval_interval=2', '--sample_seed=micro'] + _DDP_AE
    two, one = str(tmp_path / 'two'), str(tmp_path / 'one')
    r2 = _ddp_run(['train_ae.py', f'--out_dir={two}'] + common_args, nproc=2)
    ck2 = _ddp_check_two_ranks(r2, two, 'val recon PSNR')
    r1 = _ddp_run(['train_ae.py', f'--out_dir={one}', '--grad_accum=2'] + common_args)
    assert r1.returncode == 0, r1.stderr
    ck1 = common.load_checkpoint(os.path.join(one, 'ckpt.pt'))
    assert _ddp_close(ck1['encoder'], ck2['encoder']) and _ddp_close(ck1['decoder'], ck2['decoder'])
    l1, l2 = _ddp_losses(r1.stdout), _ddp_losses(r2.stdout)
    assert l1.keys() == l2.keys() == {1, 2}
    assert all(abs(float(l1[k]) - float(l2[k])) < 1e-5 for k in l1), (l1, l2)


def test_ddp_dynamics_two_ranks(tmp_path):
    d, ae = _ddp_data(tmp_path / 'data'), _ddp_fake_ae(tmp_path / 'ae.pt')
    two = str(tmp_path / 'two')
    r = _ddp_run(['train_dynamics.py', f'--out_dir={two}', f'--data_dir={d}', f'--ae_ckpt={ae}', '--max_iters=2',
                  '--eval_interval=2'] + _DDP_DYN, nproc=2)
    _ddp_check_two_ranks(r, two, 'open-loop latent MSE')


def test_ddp_sigkill_nan_and_resume(tmp_path):
    """Kill a dynamics run with SIGKILL once its first checkpoint exists. Resuming it with a NaN injected
    in the next step stops with a message naming the step and leaves the checkpoint byte-identical; a
    resume with another architecture or data folder is refused, naming both; a clean resume gives the
    same losses after the checkpoint, and the same final weights, as an uninterrupted run."""
    d, ae = _ddp_data(tmp_path / 'data'), _ddp_fake_ae(tmp_path / 'ae.pt')
    killed, full = str(tmp_path / 'killed'), str(tmp_path / 'full')
    n = 12
    args = ['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}', f'--max_iters={n}', '--eval_interval=100',
            '--ckpt_interval=2', '--seed=3'] + _DDP_DYN
    with open(tmp_path / 'killed.log', 'w') as logf:
        p = subprocess.Popen([sys.executable] + args + [f'--out_dir={killed}'], cwd=_DDP_ROOT, env=_ddp_env(),
                             stdout=logf, stderr=subprocess.STDOUT)
        ckpt, t_end = os.path.join(killed, 'ckpt.pt'), time.time() + 120
        while not os.path.exists(ckpt) and p.poll() is None and time.time() < t_end:
            time.sleep(0.01)
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert p.returncode == -signal.SIGKILL, open(tmp_path / 'killed.log').read()
    k = common.load_checkpoint(ckpt)['iter']  # written atomically: whole, whatever the kill interrupted
    assert 2 <= k < n
    before = open(ckpt, 'rb').read()
    r = _ddp_run(args + [f'--out_dir={killed}', '--init_from=resume', f'--debug_nan_at_iter={k + 1}'])
    assert r.returncode != 0
    assert f'iter {k + 1}:' in r.stderr and 'dynamics loss is not finite' in r.stderr, r.stderr
    assert open(ckpt, 'rb').read() == before and common.load_checkpoint(ckpt)['iter'] == k
    d2 = _ddp_data(tmp_path / 'data2')
    r = _ddp_run(args[:1] + [f'--data_dir={d2}'] + args[2:] + [f'--out_dir={killed}', '--init_from=resume', '--dyn_ch=8'])
    assert r.returncode != 0 and 'dyn_ch' in r.stderr and 'data_dir' in r.stderr, r.stderr
    assert open(ckpt, 'rb').read() == before
    r_res = _ddp_run(args + [f'--out_dir={killed}', '--init_from=resume'])
    assert r_res.returncode == 0, r_res.stderr
    r_full = _ddp_run(args + [f'--out_dir={full}'])
    assert r_full.returncode == 0, r_full.stderr
    l_res, l_full = _ddp_losses(r_res.stdout), _ddp_losses(r_full.stdout)
    after = list(range(k + 1, n + 1))
    assert sorted(l_res) == after, r_res.stdout
    assert [l_res[i] for i in after] == [l_full[i] for i in after], (l_res, l_full)
    a, b = (common.load_checkpoint(os.path.join(o, 'ckpt.pt')) for o in (killed, full))
    assert a['iter'] == b['iter'] == n
    assert all(torch.equal(a['model'][name], b['model'][name]) for name in a['model'])


def test_ddp_startup_checks_and_plain_data_checkpoints(tmp_path):
    """Unwritable out_dir and a too-small disk fail at once; mismatches are named; RNG states survive
    a weights_only round trip and restore every stream."""
    blocker = tmp_path / 'file'
    blocker.write_text('x')
    with pytest.raises(SystemExit, match='not writable'):
        common.check_out_dir(str(blocker / 'out'))
    common.check_out_dir(str(tmp_path / 'ok'), 1 << 20)
    assert os.listdir(tmp_path / 'ok') == []  # the probe file is removed
    with pytest.raises(SystemExit, match='MiB free'):
        common.check_out_dir(str(tmp_path / 'ok'), 1 << 62)
    with pytest.raises(SystemExit, match=r"(?s)dyn_ch: checkpoint 16, this run 8.*data_dir"):
        common.check_compatible('x.pt', {'dyn_ch': 16, 'window': (1, 2)}, {'dyn_ch': 8, 'window': [1, 2]},
                                ('dyn_ch', 'window'), [('data_dir', '/a', '/b')])
    common.check_compatible('x.pt', {'dec_ch': [8, 16]}, {'dec_ch': (8, 16)}, ('dec_ch',))  # list == tuple
    np_rng, gen = common.seed_streams(0, 0, 1)
    common.save_checkpoint({'rng': [common.rng_state(np_rng, gen)]}, str(tmp_path / 'r.pt'))
    draw = lambda: (np_rng.random(3).tolist(), torch.rand(3, generator=gen).tolist(), torch.randn(3).tolist(),
                    random.random())
    first = draw()
    st = common.load_checkpoint(str(tmp_path / 'r.pt'))['rng'][0]  # weights_only=True
    np_rng2, gen2 = common.seed_streams(5)
    common.set_rng_state(st, np_rng2, gen2)
    np_rng, gen = np_rng2, gen2
    assert draw() == first


# ------------------------------------------------------------- the simulator: play, policies, demos (issue 4)


SIM_TINY_AE = ['--enc_ch=8', '--dec_ch=(8,16)', '--dec_attn=(False,True)', '--emb_dim=32', '--batch_size=4',
               '--eval_frames=8', '--log_interval=5']
SIM_TINY_DYN = ['--window=4', '--dyn_ch=16', '--dyn_depth=1', '--dyn_emb=32', '--dyn_heads=2', '--batch_size=4',
                '--val_episodes=1', '--val_horizon=4', '--log_interval=5']
_SIM_CACHE = {}


def _sim_run(args):
    return subprocess.run([sys.executable] + args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def _sim_tiny(tmp_path):
    """Tiny Push-T data (3 x 14 frames, 32x32) + stage 1 + stage 2, built once per module under the
    first caller's tmp_path; returns (data_dir, dyn_ckpt)."""
    if not _SIM_CACHE:
        d, ae, dyn = (str(tmp_path / n) for n in ('sim_data', 'sim_ae', 'sim_dyn'))
        for args in (['data.py', f'--out_dir={d}', '--num_episodes=3', '--episode_len=14', '--image_size=32', '--num_workers=1'],
                     ['train_ae.py', f'--data_dir={d}', f'--out_dir={ae}', '--max_iters=6', '--eval_interval=6',
                      '--val_frac=0.34'] + SIM_TINY_AE,
                     ['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}/ckpt.pt', f'--out_dir={dyn}', '--max_iters=6',
                      '--eval_interval=6', '--val_frac=0.34'] + SIM_TINY_DYN):
            r = _sim_run(args)
            assert r.returncode == 0, r.stderr
        _SIM_CACHE.update(data=d, ckpt=f'{dyn}/ckpt.pt')
    return _SIM_CACHE['data'], _SIM_CACHE['ckpt']


def _sim_server(tmp_path, ckpt):
    """The play server on a free port in a thread; returns (server, base url)."""
    cfg = common.config_from_globals(vars(rollout), ['--mode=play', f'--ckpt={ckpt}', '--port=0',
                                                     f'--record_dir={tmp_path}/rec'])
    dyn, enc, dec, ck = rollout.load_world_model(ckpt, 'cpu')
    sim = rollout.Simulator(dyn, enc, dec, ck, seed=0)
    srv = sim_tools.make_play_server(cfg, sim, ck, data.load_dataset(ck['data']['data_dir']))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f'http://127.0.0.1:{srv.server_address[1]}'


def _sim_req(url, body=None, raw=None, method=None):
    """(status, bytes) of one request; a JSON body, or raw bytes."""
    payload = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    r = urllib.request.Request(url, data=payload, method=method, headers={'Content-Type': 'application/json'})
    try:
        with urllib.request.urlopen(r, timeout=30) as f:
            return f.status, f.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _sim_frame(reply):
    import base64
    import io
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(json.loads(reply)['frame']))))


def test_sim_play_endpoints(tmp_path):
    """Page, step, reset, record -> a dataset data.py loads; malformed requests get a 4xx and serving goes on."""
    d, ckpt = _sim_tiny(tmp_path)
    srv, url = _sim_server(tmp_path, ckpt)
    try:
        code, page = _sim_req(url + '/')
        assert code == 200 and b'<canvas' in page and b"'/step'" in page and b'"action_high": [512.0, 512.0]' in page
        code, b = _sim_req(url + '/step', {'action': [100, 200.5]})
        assert code == 200 and _sim_frame(b).shape == (32, 32, 3) and json.loads(b)['step'] == 1
        code, b = _sim_req(url + '/reset', {})
        assert code == 200 and json.loads(b)['step'] == 0 and _sim_frame(b).shape == (32, 32, 3)
        assert json.loads(_sim_req(url + '/record', {'on': True})[1])['recording']
        for k in range(3):
            _sim_req(url + '/step', {'action': [100 + k, 200]})
        _sim_req(url + '/reset', {})  # closes the first episode, starts a second
        _sim_req(url + '/step', {'action': [10, 20]})
        code, b = _sim_req(url + '/record', {'on': False})
        saved = json.loads(b)['saved']
        assert code == 200 and saved and not json.loads(b)['recording']
        ds = data.load_dataset(saved)
        assert ds['frames'].shape == (6, 32, 32, 3) and ds['episode_ends'].tolist() == [4, 6]
        np.testing.assert_allclose(ds['actions'][:, 0], [100, 101, 102, 102, 10, 10])
        assert ds['meta']['action_high'] == [512.0, 512.0] and 'play' in ds['meta']['source']
        # malformed or out of range: 4xx, and the server keeps answering
        bad = [('/step', None, b'{bad'), ('/step', {'action': [1]}), ('/step', None, b'{"action": [NaN, 1]}'),
               ('/step', {'action': [600, 1]}), ('/step', {'action': [-1, 1]}), ('/step', {'action': ['1', 2]}),
               ('/step', {'action': [True, 1]}), ('/step', None, b'[1, 2]'), ('/step', None, b'\xff\xfe'),
               ('/nope', {}), ('/record', {'on': 'yes'}), ('/step', None, b'{"action": [' + b'1,' * 3000 + b'1]}')]
        for args in bad:
            code, b = _sim_req(url + args[0], *args[1:])
            assert 400 <= code < 500, (args, code)
        assert _sim_req(url + '/step')[0] == 405 and _sim_req(url + '/info', method='PUT')[0] == 405
        assert _sim_req(url + '/favicon.ico')[0] == 404
        code, b = _sim_req(url + '/step', {'action': [256, 256]})
        assert code == 200 and json.loads(_sim_req(url + '/info')[1])['last_action'] == [256.0, 256.0]
        # a recording stops and is saved by itself at max_record_steps frames
        srv.play.cfg['max_record_steps'] = 3
        _sim_req(url + '/record', {})  # no 'on': toggles
        replies = [json.loads(_sim_req(url + '/step', {'action': [50, 60]})[1]) for _ in range(3)]
        assert [r['recording'] for r in replies] == [True, False, False] and replies[1]['saved'] != saved
        assert data.load_dataset(replies[1]['saved'])['frames'].shape[0] == 3
    finally:
        srv.shutdown()
        srv.server_close()


def _sim_free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not (shutil.which('chromium') or os.path.exists('/usr/bin/chromium')) or not shutil.which('chromedriver'),
                    reason="needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)")
def test_sim_play_in_browser(tmp_path):
    """Headless Chromium (plain WebDriver over HTTP) opens the page, moves the pointer over the frame,
    and new frames keep arriving with the pointer's position as the action."""
    d, ckpt = _sim_tiny(tmp_path)
    srv, url = _sim_server(tmp_path, ckpt)
    port = _sim_free_port()
    drv = subprocess.Popen([shutil.which('chromedriver'), f'--port={port}'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wd = f'http://127.0.0.1:{port}'

    def call(path, body=None, method=None):
        code, b = _sim_req(wd + path, body, method=method)
        assert code == 200, (path, code, b[:500])
        return json.loads(b)['value']

    sid = None
    try:
        for _ in range(100):  # chromedriver up?
            try:
                if call('/status')['ready']:
                    break
            except (urllib.error.URLError, ConnectionError, AssertionError):
                pass
            time.sleep(0.1)
        args = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
                '--disable-sync', '--no-first-run', f'--user-data-dir={tmp_path}/chromium', '--window-size=900,900']
        caps = {'capabilities': {'alwaysMatch': {'browserName': 'chrome', 'goog:chromeOptions': {
            'binary': shutil.which('chromium') or '/usr/bin/chromium', 'args': args}}}}
        sid = call('/session', caps)['sessionId']
        call(f'/session/{sid}/url', {'url': url + '/'})
        frames = lambda: call(f'/session/{sid}/execute/sync', {'script': 'return window.sim.frames', 'args': []})
        el = call(f'/session/{sid}/element', {'using': 'css selector', 'value': '#view'})
        eid = next(iter(el.values()))
        for (dx, dy), want in (((-128, -128), (128.0, 128.0)), ((128, 64), (384.0, 320.0))):
            # pointer offsets are from the canvas's centre; 512 css pixels span [0, 512] in action units
            call(f'/session/{sid}/actions', {'actions': [{'type': 'pointer', 'id': 'mouse', 'parameters': {'pointerType': 'mouse'},
                  'actions': [{'type': 'pointerMove', 'duration': 0, 'origin': {'element-6066-11e4-a52e-4f735466cecf': eid},
                               'x': dx, 'y': dy}]}]})
            n0, t0 = frames(), time.time()
            while time.time() - t0 < 20:
                time.sleep(0.2)
                last = json.loads(_sim_req(url + '/info')[1])['last_action']
                if frames() >= n0 + 3 and last is not None and np.allclose(last, want, atol=3):
                    break
            assert frames() >= n0 + 3, "no new frames arrived"
            assert np.allclose(last, want, atol=3), (last, want)
        assert call(f'/session/{sid}/execute/sync', {'script': 'return window.sim.error', 'args': []}) is None
        fps, t0 = '-', time.time()
        while not fps.endswith(' fps') and time.time() - t0 < 10:  # the live FPS shows after a second of frames
            time.sleep(0.2)
            fps = call(f'/session/{sid}/execute/sync', {'script': "return document.getElementById('fps').textContent", 'args': []})
        assert fps.endswith(' fps') and float(fps.split()[0]) > 0, fps
    finally:
        if sid:
            _sim_req(f'{wd}/session/{sid}', method='DELETE')
        drv.terminate()
        drv.wait(10)
        srv.shutdown()
        srv.server_close()


def test_sim_estimator_and_scores(tmp_path):
    """The pixel estimator recovers the recorded Push-T state; coverage is 1 at the goal and 0 far off."""
    d, _ = _sim_tiny(tmp_path)
    ds = data.load_dataset(d)
    est = sim_tools.estimate_state(np.asarray(ds['frames']))
    st = np.asarray(ds['states'])
    ok = ~np.isnan(est['block'][:, 0])
    assert ok.mean() > 0.9
    assert np.median(np.linalg.norm(est['block'][ok, :2] - st[ok, 2:4], axis=1)) < 10  # world units, at 32x32
    assert np.median(np.abs(sim_tools.angle_diff(est['block'][ok, 2], st[ok, 4]))) < 0.15
    assert np.nanmedian(np.linalg.norm(est['agent'] - st[:, :2], axis=1)) < 8
    env = sim_tools.make_env(32)
    env.reset(options={'reset_to_state': [60.0, 60.0, 256.0, 256.0, 0.0]})
    g = sim_tools.goal_mask(32)
    for pos, ang, lo, hi in (((256, 256), math.pi / 4, 0.95, 1.0), ((420, 120), 0.0, 0.0, 0.01)):
        env.block.angle, env.block.position = ang, pos
        env.space.reindex_shapes_for_body(env.block)
        cov = sim_tools.coverage(sim_tools.estimate_state(env._render()[None])['masks'], g)[0]
        assert lo <= cov <= hi, (pos, cov)
    assert sim_tools.pearson([1, 2, 3], [2, 4, 7]) > 0.98 and sim_tools.pearson([1, 2, 3], [1, 1, 1]) is None
    assert sim_tools.spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)


def test_bench_diagnose_scores_a_copy_simulator_as_the_copy_baseline(tmp_path, monkeypatch):
    """bench.py --mode=diagnose with a simulator that holds the last real frame it was given: the untouched T
    is then exactly the truth (IoU 1, no drift, latent error 0), the open-loop rollout equals the
    copy-first-frame baseline, and the contact errors equal predicting no change. Any step misalignment
    between prediction and truth (or a baseline taken from the wrong frame) breaks these equalities."""
    d, ckpt = _sim_tiny(tmp_path)
    dyn, enc, dec, ck = rollout.load_world_model(ckpt, 'cpu')

    class HoldSim:  # the Simulator's interface, predicting "nothing moves"
        W, ksteps, abar, gen = 3, 1, ABAR, torch.Generator().manual_seed(0)

        def reset(self, frames, actions=None):
            f = np.asarray(frames)
            self.last = f[:, -1] if f.ndim == 5 else f
            self.ctx = enc(M.frames_to_tensor(self.last))[:, None]  # (N, 1, C, h, w)
            return self.last

        def step(self, a):
            return self.last.copy()
    monkeypatch.setattr(bench, 'make_sim', lambda *a, **k: HoldSim())
    old = torch.get_num_threads()
    try:
        out = bench.main(_bench_cfg(tmp_path, '--mode=diagnose', f'--ckpt={ckpt}', '--num_states=2', '--num_episodes=1',
                                    '--horizon=8', '--contact_every=1', '--contact_len=3'))
    finally:
        torch.set_num_threads(old)
    truth = out['untouched'][0]
    for r in out['untouched'][2:]:
        assert r['what'] == 'rollout' and r['block_iou'] == 1 and r['drift_px'] == 0 and r['latent_mse'] == 0
        assert r['shape_iou'] == pytest.approx(truth['shape_iou'])
    assert [r['step'] for r in out['untouched'][2:]] == [1, 8]
    for r in out['open_loop']:
        assert r['latent_mse_rollout'] == pytest.approx(r['latent_mse_copy'], abs=1e-9)
    c = out['contact']
    if c['cases']:
        assert c['centroid_err_px'] == pytest.approx(c['centroid_err_px_no_change'])
        assert c['angle_err_deg'] == pytest.approx(c['angle_err_deg_no_change'], abs=1e-6)
    assert json.load(open(tmp_path / 'diagnose.json'))['open_loop'][0]['steps'] == [1, 8]


def test_sim_policy_eval_demos_and_training(tmp_path):
    """policy_eval writes JSON/CSV/PNG for every policy; demos recorded inside the model load through data.py,
    concatenate with real data and train stage 2."""
    d, ckpt = _sim_tiny(tmp_path)
    out, demos, mixed = tmp_path / 'pe', tmp_path / 'demos', tmp_path / 'mixed'
    r = _sim_run(['rollout.py', f'--ckpt={ckpt}', '--mode=policy_eval', '--num_states=2', '--steps=3', f'--out_dir={out}'])
    assert r.returncode == 0, r.stderr
    res = json.load(open(out / 'policy_eval.json'))
    names = sim_tools.DEFAULT_POLICIES.split(',')
    assert [p['policy'] for p in res['policies']] == names and len(names) >= 6
    for p in res['policies']:
        for k in ('real_coverage', 'model_coverage', 'real_success', 'model_success'):
            assert 0.0 <= p[k] <= 1.0
    assert set(res['correlation']['coverage']) == {'pearson', 'spearman'}
    assert open(out / 'policy_eval.csv').read().startswith('policy,real_coverage,model_coverage')
    assert (out / 'policy_eval.png').stat().st_size > 0 and (out / 'final_frames.png').stat().st_size > 0
    r = _sim_run(['rollout.py', f'--ckpt={ckpt}', '--mode=record_demos', '--num_episodes=2', '--steps=5', f'--record_dir={demos}'])
    assert r.returncode == 0, r.stderr
    dm = data.load_dataset(str(demos))
    assert dm['frames'].shape == (12, 32, 32, 3) and dm['episode_ends'].tolist() == [6, 12]
    sim_tools.concat_datasets([d, str(demos)], str(mixed))
    mx = data.load_dataset(str(mixed))
    assert mx['episode_ends'].tolist() == [14, 28, 42, 48, 54] and mx['states'] is None
    np.testing.assert_array_equal(mx['frames'][42:], dm['frames'])
    r = _sim_run(['train_dynamics.py', f'--data_dir={mixed}', f'--ae_ckpt={common.load_checkpoint(ckpt)["ae_ckpt"]}',
                  f'--out_dir={tmp_path}/dyn_mixed', '--max_iters=2', '--eval_interval=2', '--val_frac=0.2'] + SIM_TINY_DYN)
    assert r.returncode == 0, r.stderr
    r = _sim_run(['rollout.py', f'--ckpt={ckpt}', '--mode=fly'])
    assert r.returncode != 0 and 'unknown mode' in r.stderr


# ------------------------------------------------------------- measurement: physics, curves, FID/FVD, bench (issue 3)


def _bench_env(size):
    os.environ.setdefault('SDL_VIDEODRIVER', 'dummy')
    os.environ.setdefault('PYGAME_HIDE_SUPPORT_PROMPT', '1')
    from gym_pusht.envs.pusht import PushTEnv
    return PushTEnv(obs_type='pixels', render_mode='rgb_array', observation_width=size, observation_height=size)


def _bench_render(env, state):
    """Frame at a state, and the block's true body pose after reset (reset_to_state sets the position,
    then the angle, which pymunk applies about the centre of gravity: the origin moves)."""
    obs, _ = env.reset(options={'reset_to_state': state})
    return obs, (*env.block.position, env.block.angle)


# agent, block x, y, angle: the agent kept clear of the T (it is drawn on top and would hide part of it)
_BENCH_STATES = [[60, 460, 250, 250, 0.0], [450, 60, 200, 300, 1.0], [60, 60, 300, 220, -2.2],
                 [460, 460, 260, 280, 2.9], [460, 250, 180, 200, -0.7], [60, 250, 320, 300, 4.0]]


@pytest.mark.parametrize('size', [64, 96])
def test_bench_block_pose_from_pixels(size):
    env = _bench_env(size)
    for st in _BENCH_STATES:
        obs, (bx, by, ba) = _bench_render(env, st)
        seg = Mx.segment_pusht(obs[None])
        pose = Mx.block_pose(seg['block'], Mx.min_pixels(size, 'block'), seg['agent'])[0]
        true_c = Mx.tee_centroid(bx, by, ba) * size / 512  # area centroid, not the body origin
        assert np.hypot(*(pose[:2] - true_c)) < 1.5, (st, pose, true_c)
        dang = np.degrees(abs((pose[2] - ba + np.pi) % (2 * np.pi) - np.pi))
        assert dang < 5.0, (st, pose[2], ba)
        det = Mx.pusht_detectable(obs[None])
        assert det['agent'][0] and det['block'][0]
    env.close()
    # the body origin is not the centroid: (0, 40.7) in the body frame
    assert np.allclose(Mx.tee_centroid(0.0, 0.0, 0.0), [0, 40.714], atol=1e-3)
    white = np.full((1, size, size, 3), 255, np.uint8)
    assert not Mx.pusht_detectable(white)['block'][0] and not Mx.pusht_detectable(white)['agent'][0]


def test_bench_physics_metrics():
    S = 64
    env = _bench_env(S)
    a = np.pi / 4  # block exactly on the goal: origin at (256, 256), angle pi/4
    cog = np.array([256.0, 256.0]) + 45 * np.array([-np.sin(a), np.cos(a)])  # reset rotates about the cog (0, 45)
    on_goal, pose = _bench_render(env, [60, 460, cog[0], cog[1] - 45, a])
    assert np.allclose(pose, [256, 256, a], atol=1e-6)
    off, pose2 = _bench_render(env, [60, 460, 120, 100, 2.0])
    moved, pose3 = _bench_render(env, [460, 60, 120, 100, 2.5])  # agent elsewhere, block turned by 0.5 rad
    env.close()
    assert np.allclose(pose3[:2], pose2[:2], atol=30)  # same cog, so the origin moved only a little

    r = Mx.pusht_physics(np.stack([on_goal, off]), np.stack([on_goal, off]))
    for k in ('agent_err_px', 'block_centroid_err_px', 'block_angle_err_deg', 'coverage_err'):
        assert np.allclose(r[k], 0), k
    for k in ('block_iou', 'agent_iou'):
        assert np.allclose(r[k], 1), k
    assert r['coverage_true'][0] > 0.9 and r['coverage_true'][1] < 0.05  # the pixel coverage of the goal T

    hidden = on_goal.copy()  # the agent drawn over part of the T on the goal hides it, it does not uncover it
    ys, xs = np.nonzero(Mx.goal_mask(S))
    hidden[ys[:6], xs[:6]] = (65, 105, 225)
    seg = Mx.segment_pusht(hidden[None])
    assert Mx.goal_coverage(seg['block'], seg['agent'])[0] > 0.9
    assert Mx.goal_coverage(seg['block'])[0] < Mx.goal_coverage(seg['block'], seg['agent'])[0]

    r = Mx.pusht_physics(moved[None], off[None])
    c2 = Mx.tee_centroid(*pose2) * S / 512
    c3 = Mx.tee_centroid(*pose3) * S / 512
    assert abs(r['block_centroid_err_px'][0] - np.hypot(*(c3 - c2))) < 1.5
    assert abs(r['block_angle_err_deg'][0] - np.degrees(0.5)) < 5
    assert r['agent_iou'][0] == 0 and r['agent_err_px'][0] > 40

    noisy = off.copy()  # stray slate-grey pixels far from the T (decoder noise) do not move the pose
    far = [(2, 60), (60, 60), (61, 3), (40, 62), (62, 30), (5, 45)]
    for y, x in far:
        noisy[y, x] = (143, 163, 184)
    assert Mx.segment_pusht(noisy[None])['block'][0][tuple(np.array(far).T)].all()
    r = Mx.pusht_physics(noisy[None], off[None])
    assert r['block_centroid_err_px'][0] < 0.3 and r['block_angle_err_deg'][0] < 2
    assert set(r) == set(Mx.PHYSICS_KEYS)

    white = np.full((1, S, S, 3), 255, np.uint8)  # block gone in the prediction: worst values, not NaN
    r = Mx.pusht_physics(white, off[None])
    assert r['block_centroid_err_px'][0] == pytest.approx(np.hypot(S, S)) and r['block_angle_err_deg'][0] == 180
    assert r['coverage_err'][0] == pytest.approx(r['coverage_true'][0])
    assert all(np.isfinite(v).all() for v in r.values())


def test_bench_goal_mask_geometry():
    g = Mx.goal_mask(64)
    assert abs(g.sum() - 6300 * (64 / 512) ** 2) < 8  # the T's area, 98.4 px at 64x64
    assert g.sum() == Mx.tee_mask(64, 256, 256, np.pi / 4).sum()
    for S in (64, 96):  # the geometric goal matches the green the renderer draws (block and agent away)
        env = _bench_env(S)
        obs, _ = _bench_render(env, [460, 460, 100, 100, 0.0])
        env.close()
        green = np.abs(obs.astype(int) - (144, 238, 144)).sum(-1) < 60
        assert Mx.mask_iou(green[None], Mx.goal_mask(S)[None])[0] > 0.85


def test_bench_write_curves(tmp_path):
    H = 12
    curves = {'model': {'psnr': list(np.linspace(30, 20, H)), 'ssim': list(np.linspace(0.9, 0.7, H)),
                        'lpips': None, 'agent_err_px': list(np.linspace(0, 5, H)), 'block_iou': list(np.linspace(1, .5, H))},
              'copy_baseline': {'psnr': [18.0] * H, 'ssim': [0.6] * H, 'lpips': None, 'agent_err_px': [6.0] * H,
                                'block_iou': [0.4] * H}}
    csv, png = Mx.write_curves(str(tmp_path), curves)
    lines = open(csv).read().strip().split('\n')
    head = lines[0].split(',')
    assert head[0] == 'step' and 'model_psnr' in head and 'copy_block_iou' in head
    assert not any('lpips' in h for h in head)  # None curves skipped
    assert len(lines) == H + 1 and lines[1].split(',')[0] == '1'
    assert float(lines[1].split(',')[head.index('model_psnr')]) == pytest.approx(30)
    from PIL import Image
    im = np.asarray(Image.open(png).convert('RGB'))
    assert im.shape[0] >= 400 and im.shape[1] >= 600  # 4 panels, 2 x 2
    assert ((im[..., 2] > 150) & (im[..., 0] < 80)).sum() > 50  # the blue model series is drawn
    assert ((im[..., 0] > 180) & (im[..., 1] < 80)).sum() > 50  # the red copy series too


def test_bench_frechet_distance():
    rng = np.random.default_rng(0)
    f = rng.normal(size=(300, 8))
    assert abs(Mx.frechet_from_features(f, f)) < 1e-8
    # diagonal covariances: d^2 = |mu1 - mu2|^2 + sum (sqrt(a) - sqrt(b))^2
    mu1, mu2, a, b = rng.normal(size=5), rng.normal(size=5), rng.uniform(.1, 3, 5), rng.uniform(.1, 3, 5)
    want = ((mu1 - mu2) ** 2).sum() + ((np.sqrt(a) - np.sqrt(b)) ** 2).sum()
    assert Mx.frechet_distance(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(want, rel=1e-9)
    # full covariances: the same value as the scipy.linalg.sqrtm route of pytorch-fid
    A, B = rng.normal(size=(6, 6)), rng.normal(size=(6, 6))
    s1, s2 = A @ A.T + .1 * np.eye(6), B @ B.T + .1 * np.eye(6)
    m1, m2 = rng.normal(size=6), rng.normal(size=6)
    scipy_linalg = pytest.importorskip('scipy.linalg')
    ref = ((m1 - m2) ** 2).sum() + np.trace(s1 + s2 - 2 * scipy_linalg.sqrtm(s1 @ s2).real)
    assert Mx.frechet_distance(m1, s1, m2, s2) == pytest.approx(ref, rel=1e-7)
    # singular covariances (fewer samples than dimensions) stay finite and >= 0
    assert 0 <= Mx.frechet_from_features(rng.normal(size=(5, 20)), rng.normal(size=(5, 20)) + 1) < 1e3


def test_bench_fid_fvd_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv('WM_FID_WEIGHTS', str(tmp_path / 'nope.pth'))
    monkeypatch.setenv('WM_FVD_WEIGHTS', str(tmp_path / 'nope.pt'))
    v = np.zeros((1, 16, 16, 16, 3), np.uint8)
    r = Mx.fid_fvd(v, v)
    assert r['fid'] is None and r['fvd'] is None
    assert r['fid_status'] == f"unavailable: no Inception weights at {tmp_path / 'nope.pth'}"
    assert r['fvd_status'] == f"unavailable: no I3D weights at {tmp_path / 'nope.pt'}"
    net, msg = Mx.load_inception(str(tmp_path / 'other.pth'))  # an explicit path wins over the variable
    assert net is None and msg.endswith('other.pth')


class _BenchStandInI3D(torch.nn.Module):
    """STAND-IN for the I3D detector (random 3D conv, 7 features), with the TorchScript signature that
    StyleGAN-V's i3d_torchscript.pt has. Plumbing only: its Frechet distances are not FVDs."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 7, 3, stride=2)

    def forward(self, x, rescale: bool = False, resize: bool = False, return_features: bool = False):
        x = x.float()
        if rescale:
            x = x / 127.5 - 1
        return self.conv(x).mean((2, 3, 4))


def test_bench_frechet_plumbing_with_stand_ins(tmp_path):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    true = rng.integers(0, 256, (3, 32, 16, 16, 3), dtype=np.uint8)
    pred = np.clip(true.astype(int) + rng.integers(-60, 60, true.shape), 0, 255).astype(np.uint8)
    # FID path: a random conv net STANDS IN for the Inception (same preprocessing, 5 features)
    stand_in = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 7, stride=4), torch.nn.AdaptiveAvgPool2d(1)).eval()
    fa = Mx.inception_features(stand_in, true.reshape(-1, 16, 16, 3), batch_size=40)
    fb = Mx.inception_features(stand_in, pred.reshape(-1, 16, 16, 3), batch_size=40)
    assert fa.shape == (96, 5) and abs(Mx.frechet_from_features(fa, fa)) < 1e-8 and Mx.frechet_from_features(fa, fb) > 0
    # FVD path: the stand-in I3D saved as TorchScript and loaded through load_i3d, as the real file would be
    path = tmp_path / 'stand_in_i3d.pt'
    torch.jit.save(torch.jit.script(_BenchStandInI3D()), str(path))
    net, msg = Mx.load_i3d(str(path))
    assert net is not None and str(path) in msg
    clips = Mx.video_clips(true, 16, 16)
    assert clips.shape == (6, 16, 16, 16, 3)
    ga, gb = Mx.i3d_features(net, clips), Mx.i3d_features(net, Mx.video_clips(pred, 16, 16))
    assert ga.shape == (6, 7) and abs(Mx.frechet_from_features(ga, ga)) < 1e-8 and Mx.frechet_from_features(ga, gb) > 0
    # a file that is not TorchScript is refused with a message, not a crash
    bad = tmp_path / 'bad.pt'
    bad.write_bytes(b'not a model')
    assert Mx.load_i3d(str(bad))[0] is None


def test_bench_fid_inception_loads_its_state_dict(tmp_path):
    """The FID Inception architecture loads a state dict with pytorch-fid's layout (random weights here,
    so this is a plumbing check only) and gives 2048-d pool3 features."""
    net = Mx.build_fid_inception()
    sd = {k: v for k, v in net.state_dict().items() if not k.endswith('num_batches_tracked')}  # as in older files
    p = tmp_path / 'random_inception.pth'
    torch.save(sd, str(p))
    loaded, msg = Mx.load_inception(str(p))
    assert loaded is not None and 'not comparable' in msg  # not the published file: flagged
    f = Mx.inception_features(loaded, np.zeros((1, 16, 16, 3), np.uint8))
    assert f.shape == (1, 2048) and np.isfinite(f).all()
    torch.save({'fc.weight': torch.zeros(3)}, str(p))
    assert Mx.load_inception(str(p))[0] is None


def _bench_cfg(tmp_path, *args):
    return config_from_globals(vars(bench), [f'--out_dir={tmp_path}', '--recipes=tiny', '--threads=1', *args])


def test_bench_speed_tiny(tmp_path):
    old = torch.get_num_threads()
    try:
        out = bench.main(_bench_cfg(tmp_path, '--mode=speed', '--batches=1,2', '--speed_steps=2', '--warmup=1',
                                    '--multi_steps=2', '--matmul_size=128'))
    finally:
        torch.set_num_threads(old)
    saved = json.load(open(tmp_path / 'speed.json'))
    assert saved['matmul_gflops'] > 0 and len(saved['results']) == 1
    r = saved['results'][0]
    assert r['recipe'] == 'tiny' and r['image_size'] == 16 and r['gflops_per_frame'] > 0
    assert set(r['fps_by_batch']) == {'1', '2'} and r['fps_batch1'] > 0
    assert r['multi_step']['jumps'] == 2 and r['multi_step']['slowdown'] > 0
    assert '| tiny |' in bench.speed_table(out)


def test_bench_flops_scale_with_batch():
    torch.manual_seed(0)
    dyn, enc, dec, ck = bench.random_world_model(bench.recipe_sizes('tiny'), 'cpu')
    cfg = config_from_globals(vars(bench), [])
    sim = bench.make_sim(dyn, enc, dec, ck, 'cpu', cfg)
    rng = np.random.default_rng(0)
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny nets: one thread is faster and fair to a busy machine
    try:
        f1 = bench.count_flops(bench._stepper(sim, 1, 'cpu', cfg, rng))
        f4 = bench.count_flops(bench._stepper(sim, 4, 'cpu', cfg, rng))
    finally:
        torch.set_num_threads(old)
    assert f1 > 0 and 3.9 < f4 / f1 < 4.1
    # attention is counted on CPU too (spatial attention present in the tiny decoder and dynamics)
    q = torch.randn(1, 2, 8, 4)
    assert bench.count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)) == 4 * 2 * 8 * 8 * 4


def test_bench_recipe_sizes_read_the_configs():
    gpu, cpu = bench.recipe_sizes('gpu'), bench.recipe_sizes('cpu')
    assert gpu['image_size'] == 128 and cpu['image_size'] == 64
    assert gpu['dyn_ch'] == 256 and gpu['window'] == 10 and tuple(gpu['dec_ch']) == (64, 128, 256, 256)
    assert cpu['dyn_spatial_attn'] == 'mid' and cpu['window'] == 6


def test_bench_stability_tiny_and_nan(tmp_path):
    old = torch.get_num_threads()
    try:
        out = bench.main(_bench_cfg(tmp_path, '--mode=stability', '--steps=12', '--report_every=6', '--detect_every=3'))
        assert out['first_nonfinite_step'] is None and out['steps_run'] == 12 and len(out['rows']) == 2
        row = out['rows'][0]
        for k in ('nonfinite_steps', 'latent_norm', 'latent_change', 'colour_drift', 'agent_found', 'block_found', 'fps'):
            assert k in row, k
        assert row['steps'] == [1, 6] and row['nonfinite_steps'] == 0 and row['latent_norm'] == pytest.approx(1, abs=1e-4)
        assert json.load(open(tmp_path / 'stability.json'))['rows'][1]['steps'] == [7, 12]
        assert (tmp_path / 'stability.png').exists()
        out = bench.main(_bench_cfg(tmp_path, '--mode=stability', '--steps=30', '--report_every=5', '--inject_nan_step=7'))
    finally:
        torch.set_num_threads(old)
    assert out['first_nonfinite_step'] == 7 and out['steps_run'] == 10  # stopped after the row with the NaN
    assert out['rows'][0]['nonfinite_steps'] == 0 and out['rows'][1]['nonfinite_steps'] == 3


def test_bench_smooth_actions_stay_in_range():
    a = bench.smooth_actions(2000, [20, 20], [492, 492], np.random.default_rng(0))
    assert a.shape == (2000, 2) and a.min() >= 20 and a.max() <= 492
    step = np.linalg.norm(np.diff(a, axis=0), axis=1)
    assert 2 < np.median(step) < 15 and a.std(0).min() > 40  # smooth, yet it travels


def test_fourteen_dim_actions_non_pusht_scene_trains_and_rolls_out(tmp_path):
    """Issue 5: any action size and a scene that is not Push-T go through both stages and rollout."""
    rng = np.random.default_rng(0)
    frames, actions = [], []
    for e in range(3):  # a square whose position follows the first two of 14 action numbers
        a = rng.uniform(-1, 1, (14, 14)).astype(np.float32)
        f = np.zeros((14, 32, 32, 3), np.uint8)
        for k in range(14):
            x, y = int(12 + 8 * a[k - 1, 0]) if k else 12, int(12 + 8 * a[k - 1, 1]) if k else 12
            f[k, y:y + 8, x:x + 8] = (200, 80, 40)
        frames.append(f), actions.append(a)
    d = str(tmp_path / 'arm')
    data.write_dataset(d, frames, actions, dict(fps=10, action_low=[-1.0] * 14, action_high=[1.0] * 14, source='synthetic arm'))
    ae, dyn, ev = (str(tmp_path / n) for n in ('ae', 'dyn', 'eval'))
    r = _run(['train_ae.py', f'--data_dir={d}', f'--out_dir={ae}', '--max_iters=3', '--eval_interval=3', '--val_frac=0.34'] + TINY_AE, ROOT)
    assert r.returncode == 0, r.stderr
    r = _run(['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}/ckpt.pt', f'--out_dir={dyn}', '--max_iters=3',
              '--eval_interval=3', '--val_frac=0.34'] + TINY_DYN, ROOT)
    assert r.returncode == 0, r.stderr
    assert common.load_checkpoint(f'{dyn}/ckpt.pt')['action_dim'] == 14
    r = _run(['rollout.py', f'--ckpt={dyn}/ckpt.pt', '--num_episodes=1', '--horizon=4', f'--out_dir={ev}',
              '--fps_steps=1', f'--lpips_dir={tmp_path}'], ROOT)
    assert r.returncode == 0, r.stderr
    m = json.load(open(f'{ev}/metrics.json'))
    assert m['model']['agent_err_px'] is None  # Push-T physics is not applied to another scene
    assert m['model']['mse'] is not None and m['horizon'] == 4


def _bench_env2(size):
    os.environ.setdefault('SDL_VIDEODRIVER', 'dummy')
    os.environ.setdefault('PYGAME_HIDE_SUPPORT_PROMPT', '1')
    from gym_pusht.envs.pusht import PushTEnv
    return PushTEnv(obs_type='pixels', render_mode='rgb_array', observation_width=size, observation_height=size)


def test_bench_block_shape_iou():
    env = _bench_env2(64)
    frames = np.stack([env.reset(options={'reset_to_state': st})[0]
                       for st in ([60, 460, 250, 250, 0.0], [450, 60, 200, 300, 1.0], [60, 60, 300, 220, -2.2])])
    env.close()
    assert (Mx.block_shape_iou(frames) > 0.75).all()  # a rendered T is T-shaped
    blob = np.full((1, 64, 64, 3), 255, np.uint8)  # a melted block: a disc of the block's colour, same area
    yy, xx = np.mgrid[0:64, 0:64]
    blob[0][(yy - 30) ** 2 + (xx - 30) ** 2 <= 5.6 ** 2] = (143, 163, 184)
    assert Mx.pusht_detectable(blob)['block'][0] and Mx.block_shape_iou(blob)[0] < 0.6
    assert Mx.block_shape_iou(np.full((1, 64, 64, 3), 255, np.uint8))[0] == 0


def test_bench_smooth_actions_start():
    a = bench.smooth_actions(50, [20, 20], [492, 492], np.random.default_rng(0), start=[400, 60])
    assert np.linalg.norm(a[0] - [400, 60]) < 20  # starts where the agent is, not at the centre
