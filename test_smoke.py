"""
Tests of the generic core (model, data, trainers, rollout, metrics): tiny configs, data made inside the tests,
CPU only. The Push-T tools and the converters have their own files (test_pusht.py, test_convert.py).

    python -m pytest -q test_smoke.py
"""
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import common
import data
import metrics
import metrics as Mx
import model as M
import rollout


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
    assert torch.equal(ctx2[:, -1], znew) and torch.equal(ctx2[:, :-1], ctx[:, 1:])  # the window slid by one
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
    """The action map draws an image-point action at the latent cell that holds that point, whatever the
    training statistics normalised it with (here asymmetric: x in [20, 492], y in [40, 400] of a 512
    world on a 64x64 image, 16x16 latent), and nothing for a frame no action produced."""
    stats = {'low': [20.0, 40.0], 'high': [492.0, 400.0]}
    amap = M.point_map([0, 1], stats, [0.0, 0.0], [512.0, 512.0], 64, 16)
    dyn = M.Dynamics(4, 16, 1, 2, 32, 2, action_map=amap)
    seen = {}
    dyn.conv_in.register_forward_pre_hook(lambda m, inp: seen.update(x=inp[0]))
    cells = [(0, 15), (3, 1), (12, 7)]  # (row, col) of latent cells whose centres fall inside the stats' range
    world = [[(c + 0.5) * 4 * 8, (r + 0.5) * 4 * 8] for r, c in cells]  # cell centre: image pixel (c+0.5)*4, world x8
    a = data.normalize_actions(np.array(world, np.float32), stats)
    a_in = torch.cat([M.action_input(torch.zeros(1, 1, 2), 0), M.action_input(torch.from_numpy(a)[None], 1)], 1)  # (1, 4, 3)
    z = M.unit_norm(torch.randn(1, 4, 4, 16, 16), 2)
    t, s = M.dynamics_levels(1, 4, 15, 'cpu')
    dyn(z, t, s, a_in)
    spot = seen['x'][:, -1]  # (4, 16, 16): the map channel of each frame
    assert spot[0].abs().max() == 0
    for k, rc in enumerate(cells):
        assert divmod(int(spot[k + 1].argmax()), 16) == rc
        assert abs(spot[k + 1].max().item() - 1) < 1e-4  # exactly on the cell centre


def _record_context_levels(monkeypatch):
    """Wrap Dynamics.forward to record, per call, the noise levels t of the context frames and how far
    the context input is from the clean latents (the loss passes x = noised latents)."""
    calls = []
    orig = M.Dynamics.forward

    def forward(self, x, t, s, a, queries=False):
        n = t.shape[1] // 2 if queries else t.shape[1] - 1  # context frames come first in both layouts
        calls.append(t[:, :n].clone())
        return orig(self, x, t, s, a, queries)
    monkeypatch.setattr(M.Dynamics, 'forward', forward)
    return calls


@pytest.mark.parametrize('all_frames', [True, False])
def test_context_noise_is_really_applied(monkeypatch, all_frames):
    """ctx_noise=True: the context frames go in noised at levels drawn from U{1..99} (so the input differs
    from the clean latents); ctx_noise=False: level 0 and the clean latents."""
    _, _, dyn = _tiny_nets()
    z = M.unit_norm(torch.randn(6, 5, 4, 8, 8), 2)
    a = M.action_input(torch.randn(6, 5, 2), 1)
    seen = {}
    dyn.conv_in.register_forward_pre_hook(lambda m, inp: seen.update(x=inp[0]))
    calls = _record_context_levels(monkeypatch)
    torch.manual_seed(0)
    M.dynamics_loss(dyn, z, a, ABAR, ctx_noise=True, all_frames=all_frames)
    t = calls[-1]
    assert t.min() >= 1 and t.max() <= 99 and len(t.unique()) > 3, t
    ctx_in = seen['x'][:, :4].reshape(6, -1, 4, 8, 8)[:, :t.shape[1]]  # (B, n, C, h, w): the frames' own latent channels
    assert (ctx_in - z[:, :t.shape[1]]).abs().max() > 0.05  # really noised, not only labelled
    M.dynamics_loss(dyn, z, a, ABAR, ctx_noise=False, all_frames=all_frames)
    assert (calls[-1] == 0).all()
    ctx_in = seen['x'][:, :4].reshape(6, -1, 4, 8, 8)[:, :t.shape[1]]
    assert (ctx_in - z[:, :t.shape[1]]).abs().max() < 0.05  # level 0: the clean latents (std ~0.01 of noise)


def test_training_applies_context_noise_when_asked(tmp_path, monkeypatch):
    """Through train_dynamics itself (in-process): ctx_noise=True reaches the net as context levels in
    1..99, ctx_noise=False as 0. Catches a trainer that drops the switch on the way to the loss."""
    d, ae = _ddp_data(tmp_path / 'd'), _ddp_fake_ae(tmp_path / 'ae.pt')
    calls = _record_context_levels(monkeypatch)
    for on in (True, False):
        calls.clear()
        _run_here(['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}', f'--out_dir={tmp_path}/o{on}',
                  '--max_iters=2', '--eval_interval=100', f'--ctx_noise={on}'] + _DDP_DYN, monkeypatch)
        train = [t for t in calls if t.shape[0] == 4]  # batch_size 4: the training forwards (validation is 1 episode)
        assert len(train) == 2, [t.shape for t in calls]
        lv = torch.cat([t.flatten() for t in train])
        if not on:
            assert (lv == 0).all(), lv
        else:
            assert ((lv >= 1) & (lv <= 99)).all() and len(lv.unique()) > 2, lv


def test_learning_rate_schedules_and_the_trainer_follows_them(tmp_path, monkeypatch):
    """common.lr_at at points known in closed form: cosine (warm-up, half-way = the mean of peak and floor, floor at
    the end) and constant-then-cool-down (peak until total - cooldown, half-way down at total - cooldown / 2). Then
    train_dynamics itself: the rate each optimizer step used, recorded from the optimizer, is lr_at's."""
    from common import lr_at
    assert lr_at(0, 1.0, 0.1, 10, 110) == 0.1 and lr_at(9, 1.0, 0.1, 10, 110) == 1.0
    assert abs(lr_at(60, 1.0, 0.1, 10, 110) - 0.55) < 1e-12 and abs(lr_at(110, 1.0, 0.1, 10, 110) - 0.1) < 1e-12
    assert [lr_at(i, 1.0, 0.1, 10, 110, 40) for i in (10, 50, 70)] == [1.0, 1.0, 1.0]
    assert abs(lr_at(90, 1.0, 0.1, 10, 110, 40) - 0.55) < 1e-12 and abs(lr_at(110, 1.0, 0.1, 10, 110, 40) - 0.1) < 1e-12
    assert lr_at(10 ** 6, 1.0, 0.1, 10, 2 * 10 ** 6, 0) == 1.0  # cooldown 0: constant until the very end
    d, ae = _ddp_data(tmp_path / 'd'), _ddp_fake_ae(tmp_path / 'ae.pt')
    seen, orig = [], torch.optim.AdamW.step
    monkeypatch.setattr(torch.optim.AdamW, 'step', lambda self, *a, **k: (seen.append(self.param_groups[0]['lr']), orig(self, *a, **k))[1])
    _run_here(['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}', f'--out_dir={tmp_path}/o',
              '--max_iters=6', '--eval_interval=100', '--warmup_iters=1', '--lr=0.01',
              '--min_lr=0.001', '--cooldown_iters=2'] + _DDP_DYN, monkeypatch)
    assert np.allclose(seen, [0.01, 0.01, 0.01, 0.01, 0.01, 0.0055]), seen


def test_export_writes_inference_files_that_roll_out_like_the_checkpoint(tmp_path, monkeypatch):
    """export.py: the dynamics and its autoencoder as two files without optimizer or RNG state, the autoencoder
    found beside the dynamics file wherever the folder is moved; a rollout from them equals the checkpoint's,
    frame for frame. A dynamics checkpoint whose autoencoder file holds another encoder is refused."""
    import export
    d, ae = _ddp_data(tmp_path / 'd'), _ddp_fake_ae(tmp_path / 'ae.pt')
    _run_here(['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}', f'--out_dir={tmp_path}/o',
              '--max_iters=2', '--eval_interval=2', '--lr=0.01'] + _DDP_DYN, monkeypatch)
    export.export(f'{tmp_path}/o/ckpt.pt', str(tmp_path / 'w'), 'm')
    os.rename(tmp_path / 'w', tmp_path / 'moved')  # the files travel together (a clone elsewhere)
    for f in ('m_ae.pt', 'm_dyn.pt'):
        assert not {'optimizer', 'rng'} & set(common.load_checkpoint(str(tmp_path / 'moved' / f)))
    frames = data.load_dataset(d)['frames'][:2]
    acts = np.array([[100.0, 400.0], [300.0, 50.0]], np.float32)
    out = []
    for path in (f'{tmp_path}/o/ckpt.pt', str(tmp_path / 'moved' / 'm_dyn.pt')):
        dyn, enc, dec, ck = rollout.load_world_model(path, 'cpu')
        sim = rollout.Simulator(dyn, enc, dec, ck, seed=3)
        sim.reset(np.asarray(frames))
        frames_out = np.stack([sim.step(acts) for _ in range(3)])
        out.append((frames_out, sim.ctx.clone()))  # frames and the latents behind them (an untrained decoder ignores z)
    np.testing.assert_array_equal(out[0][0], out[1][0])
    assert torch.equal(out[0][1], out[1][1]) and out[0][1].std() > 0
    assert json.load(open(tmp_path / 'moved' / 'm.json'))['dynamics']['iter'] == 2
    # the exported file is also weights-only training state (what the long run commits between sessions): a resume
    # from it continues the count with fresh Adam moments; at lr 0 the weights stay the exported ones
    os.makedirs(tmp_path / 'r')
    shutil.copy(tmp_path / 'moved' / 'm_dyn.pt', tmp_path / 'r' / 'ckpt.pt')
    _run_here(['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}', f'--out_dir={tmp_path}/r',
              '--init_from=resume', '--max_iters=3', '--eval_interval=3', '--lr=0', '--min_lr=0'] + _DDP_DYN, monkeypatch)
    r3, m2 = common.load_checkpoint(f'{tmp_path}/r/ckpt.pt'), common.load_checkpoint(str(tmp_path / 'moved' / 'm_dyn.pt'))
    assert r3['iter'] == 3 and 'optimizer' in r3 and all(torch.equal(r3['model'][k], m2['model'][k]) for k in m2['model'])
    other = _ddp_fake_ae(tmp_path / 'other.pt', seed=1)  # another encoder under the checkpoint's ae path
    os.replace(other, ae)
    with pytest.raises(SystemExit, match='another encoder'):
        export.export(f'{tmp_path}/o/ckpt.pt', str(tmp_path / 'w2'), 'm')
    # --ae_only strips a stage-1 checkpoint and exits 0: config/pusht_long_run.sh chains the next command on it
    r = subprocess.run([sys.executable, os.path.join(ROOT, 'export.py'), f'--ae_only={ae}', f'--out_dir={tmp_path}/s',
                        '--name=st'], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert 'optimizer' not in common.load_checkpoint(str(tmp_path / 's' / 'st_ae.pt'))


def test_make_windows_attaches_the_action_that_produced_each_frame():
    """Alignment (data.py's format): action[i] is issued after frame[i] and produces frame[i+1], so a
    window's frame p carries a_{p-1}; at an episode's start the first frame is repeated with 'no action',
    and nothing of the previous episode leaks in."""
    acts = np.arange(9, dtype=np.float32)[:, None] * 0.1  # (9, 1): a_i = 0.1 i, recognisable
    # episodes [0, 5) and [5, 9); windows of 4 ending on frames 1, 4, 6 and 8
    idx, act = data.make_windows([1, 4, 6, 8], [0, 0, 5, 5], 4, acts)
    assert idx.tolist() == [[0, 0, 0, 1], [1, 2, 3, 4], [5, 5, 5, 6], [5, 6, 7, 8]]
    has = act[..., 1]
    assert has.tolist() == [[0, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1], [0, 1, 1, 1]]
    expect = np.where(has > 0, (idx - 1) * 0.1, 0.0)  # frame p carries a_{p-1}
    assert np.allclose(act[..., 0], expect), act[..., 0]
    # with frames that show the action: a square drawn where the action that produced the frame pointed
    d = _square_episodes(lengths=(6, 5))
    idx, act = data.make_windows([5, 10], [0, 6], 3, d['actions'])
    for b in range(2):
        for w in range(3):
            if act[b, w, -1]:
                assert tuple(_square_centre(d['frames'][idx[b, w]])) == tuple(act[b, w, :2]), (b, w)


def _square_episodes(lengths=(14, 14, 14), S=32, seed=0):
    """Frames of a 4x4 square that jumps to the (x, y) pixel the previous action pointed at (absolute
    targets, the data format's alignment); actions in pixels of the frame."""
    rng = np.random.default_rng(seed)
    frames, actions = [], []
    for n in lengths:
        a = rng.integers(4, S - 4, (n, 2)).astype(np.float32)
        f = np.full((n, S, S, 3), 255, np.uint8)
        pos = rng.integers(4, S - 4, 2)
        for k in range(n):
            x, y = (pos if k == 0 else a[k - 1]).astype(int)
            f[k, y - 2:y + 2, x - 2:x + 2] = (200, 60, 40)
        frames.append(f), actions.append(a)
    return {'frames': np.concatenate(frames), 'actions': np.concatenate(actions), 'lists': (frames, actions)}


def _square_centre(frame):
    ys, xs = np.nonzero(frame[..., 1] < 128)
    return int(round(xs.mean() + 0.5)), int(round(ys.mean() + 0.5))


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
            z, ctx, act = M.window_step(dyn, ctx, act, a[None], ABAR, 15, g)
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


def test_every_recipe_file_resolves_against_its_trainer(monkeypatch):
    """Each config/ recipe only reassigns existing defaults with the right types (a typo fails here, not an
    hour into a run); the long stage-2 recipe, given after the short one, changes its length and nothing else."""
    monkeypatch.setattr(sys, 'argv', ['test'])  # the trainers read their command line when imported
    import train_ae
    import train_dynamics
    files = sorted(f for f in os.listdir(os.path.join(ROOT, 'config')) if f.endswith('.py'))  # (+ the long run's .sh)
    assert 'dyn_pusht_cpu_long.py' in files and len(files) >= 8
    for f in files:
        trainer = train_ae if f.startswith('ae_') else train_dynamics
        assert f.startswith(('ae_', 'dyn_')), f
        common.config_from_globals(vars(trainer), [os.path.join(ROOT, 'config', f)])
    short = common.config_from_globals(vars(train_dynamics), [os.path.join(ROOT, 'config/dyn_pusht_cpu.py')])
    long = common.config_from_globals(vars(train_dynamics), [os.path.join(ROOT, 'config', f) for f in
                                                             ('dyn_pusht_cpu.py', 'dyn_pusht_cpu_long.py')])
    assert {k for k in short if short[k] != long[k]} == {'max_iters', 'eval_interval'}
    assert long['max_iters'] == 6 * short['max_iters']
    # the long run behind weights/ trains the CPU recipe's network at a constant rate (its branches cool down)
    run = common.config_from_globals(vars(train_dynamics), [os.path.join(ROOT, 'config', f) for f in
                                                            ('dyn_pusht_cpu.py', 'dyn_pusht_long_run.py')])
    assert all(run[k] == short[k] for k in train_dynamics.ARCH_KEYS) and run['cooldown_iters'] == 0


# ------------------------------------------------------------------------------------- pipeline


def _run(args, cwd):
    r = subprocess.run([sys.executable] + args, cwd=cwd, capture_output=True, text=True, timeout=600)
    return r


def _run_here(args, monkeypatch):
    """Run a script in this process, as `python args...` would: no subprocess paying ~3 s of `import torch`."""
    import runpy
    monkeypatch.setattr(sys, 'argv', list(args))
    runpy.run_path(os.path.join(ROOT, args[0]), run_name='__main__')


TINY_AE = ['--enc_ch=8', '--dec_ch=(8,16)', '--dec_attn=(False,True)', '--emb_dim=32', '--batch_size=4',
           '--eval_frames=8', '--log_interval=5']
TINY_DYN = ['--window=4', '--dyn_ch=16', '--dyn_depth=1', '--dyn_emb=32', '--dyn_heads=2', '--batch_size=4',
            '--val_episodes=1', '--val_horizon=4', '--log_interval=5']


def test_end_to_end_pipeline(tmp_path, monkeypatch):
    """train_ae.py -> (resume) -> the deterministic decoder -> train_dynamics.py with the action map ->
    rollout.py, the Simulator API, and the autoencoder mismatch check, on a tiny square-follows-the-point
    dataset whose meta.json declares the action an image point. The runs that must work go through the command line;
    the ones that must be refused run in-process (the same code, less time)."""
    ae, dyn, ev = (str(tmp_path / n) for n in ('ae', 'dyn', 'eval'))
    sq = _square_episodes()
    d = str(tmp_path / 'data')
    data.write_dataset(d, *sq['lists'], dict(fps=10, action_low=[0.0, 0.0], action_high=[32.0, 32.0], source='squares',
                                             image_point_dims=[0, 1]))
    r = _run(['train_ae.py', f'--data_dir={d}', f'--out_dir={ae}', '--max_iters=6', '--eval_interval=6',
              '--val_frac=0.34'] + TINY_AE, ROOT)
    assert r.returncode == 0, r.stderr
    assert 'val recon PSNR' in r.stdout and os.path.isfile(f'{ae}/ckpt.pt')
    r = _run(['train_ae.py', f'--data_dir={d}', f'--out_dir={ae}', '--max_iters=8', '--eval_interval=8',
              '--val_frac=0.34', '--init_from=resume'] + TINY_AE, ROOT)
    assert r.returncode == 0, r.stderr
    assert 'iter 7:' not in r.stdout and common.load_checkpoint(f'{ae}/ckpt.pt')['iter'] == 8  # resumed at 6
    # the deterministic decoder: trained on stage 1's frozen encoder (same fingerprint and weights), into its own file
    base = common.load_checkpoint(f'{ae}/ckpt.pt', expect_kind='ae')
    r = _run(['train_ae.py', f'--data_dir={d}', f'--out_dir={ae}', '--max_iters=3', '--eval_interval=3', '--val_frac=0.34',
              '--decoder_type=deterministic'] + TINY_AE, ROOT)
    assert r.returncode == 0, r.stderr
    ft = common.load_checkpoint(f'{ae}/ckpt_deterministic.pt', expect_kind='ae')
    assert ft['config']['decoder_type'] == 'deterministic' and ft['iter'] == 3
    assert ft['encoder_fingerprint'] == base['encoder_fingerprint']
    assert all(torch.equal(ft['encoder'][k], base['encoder'][k]) for k in base['encoder'])
    assert common.load_checkpoint(f'{ae}/ckpt.pt')['iter'] == 8  # stage 1's checkpoint is untouched
    r = _run(['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}/ckpt_deterministic.pt', f'--out_dir={dyn}',
              '--max_iters=6', '--eval_interval=6', '--val_frac=0.34', '--dyn_action_map=True'] + TINY_DYN, ROOT)
    assert r.returncode == 0, r.stderr
    assert 'open-loop latent MSE' in r.stdout
    ck = common.load_checkpoint(f'{dyn}/ckpt.pt', expect_kind='dynamics')
    assert ck['data']['action_stats']['low'] and ck['config']['window'] == 4
    assert ck['action_map']['dims'] == [0, 1] and len(ck['action_map']['scale']) == 2
    # a resume reads the cached latents (a read-only memory map) and prints no warning about it
    r = _run(['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}/ckpt_deterministic.pt', f'--out_dir={dyn}',
              '--max_iters=7', '--eval_interval=7', '--val_frac=0.34', '--dyn_action_map=True', '--init_from=resume'] + TINY_DYN, ROOT)
    assert r.returncode == 0 and 'Warning' not in r.stderr, r.stderr
    assert 'encoded or loaded' in r.stdout and common.load_checkpoint(f'{dyn}/ckpt.pt')['iter'] == 7
    r = _run(['rollout.py', f'--ckpt={dyn}/ckpt.pt', '--num_episodes=1', '--horizon=5', f'--out_dir={ev}',
              '--fps_steps=2', f'--lpips_dir={tmp_path}'], ROOT)
    assert r.returncode == 0, r.stderr
    assert 'deterministic (one pass)' in r.stdout
    m = json.load(open(f'{ev}/metrics.json'))
    for k in ('model', 'copy_baseline'):
        assert set(m[k]) == {'mse', 'psnr', 'ssim', 'uiqi', 'lpips', 'curves'}
        assert m[k]['lpips'] is None  # no AlexNet weights in tmp_path: reported unavailable, not faked
        assert len(m[k]['curves']['ssim']) == 5
    assert m['horizon'] == 5 and m['num_episodes'] == 1
    # the copy baseline, computed here from the data: the held-out episode's first frame against its next 5
    ep = sq['frames'][14 * m['episodes'][0]:][:6].astype(np.float64) / 255  # every episode is 14 frames
    copy_mse = ((ep[1:] - ep[:1]) ** 2).mean((1, 2, 3))  # (5,)
    assert m['copy_baseline']['mse'] == pytest.approx(copy_mse.mean(), rel=1e-5) and copy_mse.min() > 0
    assert m['copy_baseline']['psnr'] == pytest.approx(10 * math.log10(1 / copy_mse.mean()), abs=1e-4)
    assert os.path.getsize(f'{ev}/rollout.gif') > 0 and os.path.isfile(f'{ev}/curves.png')
    assert m['episodes'][0] in ck['data']['val_ids']  # its own data: the held-out episodes only
    # another dataset is a test set the model never saw: every episode of it is rolled out
    d2 = str(tmp_path / 'data2')
    data.write_dataset(d2, *_square_episodes((14, 14, 14, 14), seed=3)['lists'],
                       dict(fps=10, action_low=[0.0, 0.0], action_high=[32.0, 32.0], source='squares', image_point_dims=[0, 1]))
    r = _run(['rollout.py', f'--ckpt={dyn}/ckpt.pt', f'--data_dir={d2}', '--num_episodes=4', '--horizon=5',
              f'--out_dir={ev}2', '--fps_steps=2', f'--lpips_dir={tmp_path}'], ROOT)
    assert r.returncode == 0, r.stderr
    m2 = json.load(open(f'{ev}2/metrics.json'))
    assert '4 test-set episodes' in r.stdout and m2['episodes'] == [0, 1, 2, 3]
    # the same rule picks the start frames of play.py and record_demos (rollout.held_out_starts)
    ck7 = common.load_checkpoint(f'{dyn}/ckpt.pt')
    assert rollout.unseen_episodes(ck7, d2, [(0, 14)] * 4) == ([0, 1, 2, 3], False)
    assert rollout.unseen_episodes(ck7, d, [(0, 14)] * 3) == (ck7['data']['val_ids'], True)
    # a warm start: the weights and action statistics of the given checkpoint, this run's data and split
    # (lr 0 leaves the weights as loaded: a scratch start would differ)
    warm_args = ['train_dynamics.py', f'--data_dir={d2}', f'--ae_ckpt={ae}/ckpt_deterministic.pt', f'--out_dir={dyn}w',
                 f'--init_from={dyn}/ckpt.pt', '--max_iters=1', '--eval_interval=1', '--val_frac=0.25', '--lr=0',
                 '--min_lr=0', '--dyn_action_map=True'] + TINY_DYN
    r = _run(warm_args, ROOT)
    assert r.returncode == 0 and 'warm start from' in r.stdout, r.stderr
    w, src = common.load_checkpoint(f'{dyn}w/ckpt.pt', expect_kind='dynamics'), common.load_checkpoint(f'{dyn}/ckpt.pt')
    assert w['iter'] == 1 and w['data']['action_stats'] == src['data']['action_stats']
    assert w['data']['data_dir'] == os.path.abspath(d2) and len(w['data']['train_ids']) == 3
    assert all(torch.equal(w['model'][k], src['model'][k]) for k in src['model'])
    # its resume keeps those statistics (not the ones of its own data)
    r = _run(warm_args[:4] + ['--init_from=resume', '--max_iters=2', '--eval_interval=2'] + warm_args[7:], ROOT)
    assert r.returncode == 0, r.stderr
    w2 = common.load_checkpoint(f'{dyn}w/ckpt.pt')
    assert w2['iter'] == 2 and w2['data']['action_stats'] == src['data']['action_stats']
    with pytest.raises(SystemExit, match='dyn_ch'):  # another architecture is refused by name, nothing written
        _run_here(warm_args + ['--dyn_ch=8'], monkeypatch)
    assert common.load_checkpoint(f'{dyn}w/ckpt.pt')['iter'] == 2
    # the simulator API over the trained checkpoint: batched, history reset, bad actions refused
    dyn_m, enc, dec, ckd = rollout.load_world_model(f'{dyn}/ckpt.pt', 'cpu')
    sim = rollout.Simulator(dyn_m, enc, dec, ckd, seed=1)
    hist = np.stack([sq['frames'][0:3], sq['frames'][14:17]])  # (2, 3, 32, 32, 3)
    sim.reset(hist, np.stack([sq['actions'][0:2], sq['actions'][14:16]]))
    f = sim.step(np.array([[10.0, 20.0], [30.0, 5.0]], dtype=np.float32))
    assert f.shape == (2, 32, 32, 3) and f.dtype == np.uint8
    with pytest.raises(ValueError, match='2 numbers'):
        sim.step(np.zeros((2, 3)))
    with pytest.raises(ValueError, match='uint8'):
        sim.reset(np.zeros((2, 16, 16, 3), np.uint8))
    # a different autoencoder (another stage-1 run) is refused by name
    _run_here(['train_ae.py', f'--data_dir={d}', f'--out_dir={tmp_path}/ae2', '--max_iters=1', '--eval_interval=1',
               '--val_frac=0.34', '--seed=5'] + TINY_AE, monkeypatch)
    with pytest.raises(SystemExit, match='was trained on encoder'):
        _run_here(['rollout.py', f'--ckpt={dyn}/ckpt.pt', f'--ae_ckpt={tmp_path}/ae2/ckpt.pt', '--horizon=2', f'--out_dir={ev}'], monkeypatch)
    # wrong-typed option is refused before anything runs, with the message and a failing exit status
    r = _run(['train_ae.py', f'--data_dir={d}', f'--out_dir={ae}', '--max_iters=two'], ROOT)
    assert r.returncode != 0 and 'wants int' in r.stderr
    # a misspelt init_from is refused, not taken as a fresh start (stage 1) or a path (stage 2)
    with pytest.raises(SystemExit, match="init_from must be 'scratch' or 'resume'"):
        _run_here(['train_ae.py', f'--data_dir={d}', f'--out_dir={ae}', '--init_from=resme'] + TINY_AE, monkeypatch)
    with pytest.raises(SystemExit, match="'resme' does not exist"):
        _run_here(['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}/ckpt.pt', f'--out_dir={dyn}', '--init_from=resme'], monkeypatch)
    assert common.load_checkpoint(f'{ae}/ckpt.pt')['iter'] == 8


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


@pytest.mark.parametrize('dims', [[0], [0, 0], [0, 2], [1, 0.5], 'xy'])
def test_load_rejects_bad_image_point_dims(tmp_path, dims):
    """image_point_dims must name two different action dims with a real range (the action map's frame)."""
    frames, actions, _, meta = _tiny_episodes()
    out = str(tmp_path / 'ds')
    data.write_dataset(out, frames, actions, dict(meta, image_point_dims=[1, 0]))  # a valid declaration loads
    assert data.load_dataset(out)['meta']['image_point_dims'] == [1, 0]
    m = json.load(open(f'{out}/meta.json'))
    json.dump(dict(m, image_point_dims=dims), open(f'{out}/meta.json', 'w'))
    with pytest.raises(data.DatasetError, match='image_point_dims'):
        data.load_dataset(out)


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


def test_ssim_has_data_range_one():
    """SSIM of two flat images a, b in closed form (zero variances): (2ab + C1) / (a^2 + b^2 + C1) with
    C1 = (0.01 L)^2 for data range L = 1 (a data range of 2, the reference code's bug, gives 0.889)."""
    x, y = torch.full((1, 3, 16, 16), 0.01), torch.full((1, 3, 16, 16), 0.02)
    c1 = 0.01 ** 2
    want = (2 * 0.01 * 0.02 + c1) / (0.01 ** 2 + 0.02 ** 2 + c1)  # 0.8333
    assert abs(Mx.ssim(x, y).item() - want) < 1e-6


def test_psnr_of_a_set_averages_the_mse_first():
    """One frame exact, one at MSE 0.01: the set's PSNR is that of the mean MSE 0.005 (23.0 dB); a mean of
    per-frame values capped at 100 dB would say 60 dB and reward a baseline for its exact frames."""
    r = {'mse': np.array([0.0, 0.01, 0.0, 0.01]), 'ssim': np.ones(4)}  # 2 episodes x 2 steps
    mean, curves = metrics.summarise(r, 2, 2)
    assert abs(mean['psnr'] - 10 * math.log10(1 / 0.005)) < 1e-6
    assert curves['psnr'][0] == 100.0 and abs(curves['psnr'][1] - 20.0) < 1e-6  # per step: over the episodes; exact = 100 dB
    json.dumps(curves, allow_nan=False)  # standard JSON: no Infinity in metrics.json
    assert mean['mse'] == 0.005 and mean['ssim'] == 1.0


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


def test_core_never_imports_the_tools_and_imports_have_no_side_effects():
    """Imports run one way: the core (the card's scripts' modules, common, metrics) never pulls in a tool
    (pusht, play, convert, bench, ablate) or a simulator, and importing metrics loads no weights package."""
    code = ("import sys, model, data, common, metrics, rollout; "
            "bad = [m for m in ('pusht', 'play', 'convert', 'bench', 'ablate', 'gym_pusht', 'gymnasium', 'pygame', 'lpips') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    for script in ('train_ae.py', 'train_dynamics.py'):  # scripts: read their imports without running them
        src = open(os.path.join(ROOT, script)).read()
        imported = set(re.findall(r'^(?:import|from) (\w+)', src, re.M))
        assert not imported & {'pusht', 'play', 'convert', 'bench', 'ablate'}, (script, imported)


def test_frechet_distance():
    """The Frechet distance against closed forms and against tr sqrtm(s1 s2) computed another way."""
    rng = np.random.default_rng(0)
    f = rng.normal(size=(300, 8))
    assert abs(Mx.frechet_from_features(f, f)) < 1e-8
    # diagonal covariances: d^2 = |mu1 - mu2|^2 + sum (sqrt(a) - sqrt(b))^2
    mu1, mu2, a, b = rng.normal(size=5), rng.normal(size=5), rng.uniform(.1, 3, 5), rng.uniform(.1, 3, 5)
    want = ((mu1 - mu2) ** 2).sum() + ((np.sqrt(a) - np.sqrt(b)) ** 2).sum()
    assert Mx.frechet_distance(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(want, rel=1e-9)
    # full covariances: tr sqrtm(s1 s2) of pytorch-fid's formula is the sum of the square roots of the
    # eigenvalues of s1 s2 (real and positive for two SPD matrices), computed here on the product itself
    A, B = rng.normal(size=(6, 6)), rng.normal(size=(6, 6))
    s1, s2 = A @ A.T + .1 * np.eye(6), B @ B.T + .1 * np.eye(6)
    m1, m2 = rng.normal(size=6), rng.normal(size=6)
    tr_sqrt = np.sqrt(np.linalg.eigvals(s1 @ s2).real).sum()
    ref = ((m1 - m2) ** 2).sum() + np.trace(s1 + s2) - 2 * tr_sqrt
    assert Mx.frechet_distance(m1, s1, m2, s2) == pytest.approx(ref, rel=1e-7)
    # singular covariances (fewer samples than dimensions) stay finite and >= 0
    assert 0 <= Mx.frechet_from_features(rng.normal(size=(5, 20)), rng.normal(size=(5, 20)) + 1) < 1e3


def test_fid_fvd_unavailable(tmp_path, monkeypatch):
    """Without weight files FID and FVD are reported unavailable with the path looked up, never computed."""
    monkeypatch.setenv('WM_FID_WEIGHTS', str(tmp_path / 'nope.pth'))
    monkeypatch.setenv('WM_FVD_WEIGHTS', str(tmp_path / 'nope.pt'))
    v = np.zeros((1, 16, 16, 16, 3), np.uint8)
    r = Mx.fid_fvd(v, v)
    assert r['fid'] is None and r['fvd'] is None
    assert r['fid_status'] == f"unavailable: no Inception weights at {tmp_path / 'nope.pth'}"
    assert r['fvd_status'] == f"unavailable: no I3D weights at {tmp_path / 'nope.pt'}"
    net, msg = Mx.load_inception(str(tmp_path / 'other.pth'))  # an explicit path wins over the variable
    assert net is None and msg.endswith('other.pth')


class _StandInI3D(torch.nn.Module):
    """STAND-IN for the I3D detector (random 3D conv, 7 features), with the TorchScript signature that
    StyleGAN-V's i3d_torchscript.pt has. Plumbing only: its Frechet distances are not FVDs."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 7, 3, stride=2)

    def forward(self, x, rescale: bool = False, resize: bool = False, return_features: bool = False):
        """Clips (B, 3, T, H, W) -> 7 features each."""
        x = x.float()
        if rescale:
            x = x / 127.5 - 1
        return self.conv(x).mean((2, 3, 4))


@pytest.mark.filterwarnings('ignore:`torch.jit:FutureWarning')  # the stand-in I3D is TorchScript, as the real file is
def test_frechet_plumbing_with_stand_ins(tmp_path):
    """The FID and FVD feature paths run end to end with stand-in networks (plumbing only: these are not
    FIDs)."""
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
    torch.jit.save(torch.jit.script(_StandInI3D()), str(path))
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


def test_fid_inception_loads_its_state_dict(tmp_path):
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


def _ddp_fake_ae(path, S=32, seed=0):
    """A stage-1 checkpoint with untrained tiny nets, written in-process (saves a training run)."""
    torch.manual_seed(seed)
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
    d2 = _ddp_data(tmp_path / 'data2', T=13)  # other data (the same data in another folder would be accepted)
    r = _ddp_run(args[:1] + [f'--data_dir={d2}'] + args[2:] + [f'--out_dir={killed}', '--init_from=resume', '--dyn_ch=8'])
    assert r.returncode != 0 and 'dyn_ch' in r.stderr and 'data (episodes and actions)' in r.stderr, r.stderr
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


def test_fourteen_dim_actions_non_pusht_scene_trains_and_rolls_out(tmp_path):
    """Issue 5: any action size and a scene that is not Push-T go through both stages and rollout, and what
    comes out means something: the checkpoint's action statistics are the training episodes' own in all 14
    dims, and the 14th reaches the prediction; rollout.py writes its files, scores the copy-first-frame
    baseline exactly as computed here from the dataset (frame 0 against frames 1..4 of the held-out
    episode, on [0, 1] pixels), and the model row as the same Simulator run here reproduces. A rollout
    scored against misaligned frames, with its predictions out of step order or decoded another way fails.
    (Three iterations teach the model too little to beat the copy baseline, or even to make its frames
    depend on the start frame, so neither is asked.)"""
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
    ck = common.load_checkpoint(f'{dyn}/ckpt.pt')
    assert ck['action_dim'] == 14 and ck['action_map'] is None
    seen = np.concatenate([actions[i] for i in ck['data']['train_ids']])
    np.testing.assert_allclose(ck['data']['action_stats']['low'], seen.min(0), rtol=1e-6)
    np.testing.assert_allclose(ck['data']['action_stats']['high'], seen.max(0), rtol=1e-6)
    H = 4
    r = _run(['rollout.py', f'--ckpt={dyn}/ckpt.pt', '--num_episodes=1', f'--horizon={H}', f'--out_dir={ev}',
              '--fps_steps=1', f'--lpips_dir={tmp_path}'], ROOT)
    assert r.returncode == 0, r.stderr
    m = json.load(open(f'{ev}/metrics.json'))
    assert m['horizon'] == H and len(m['episodes']) == 1 and m['episodes'][0] in ck['data']['val_ids']
    from PIL import Image
    assert Image.open(f'{ev}/rollout.gif').n_frames == H and len(open(f'{ev}/curves.csv').read().split()) == H + 1
    ep = m['episodes'][0]
    truth = frames[ep][:H + 1].astype(np.float64) / 255
    copy_mse = ((truth[1:] - truth[:1]) ** 2).mean((1, 2, 3))  # (H,): the first frame held
    assert copy_mse.min() > 0  # the square moves at every step
    assert m['copy_baseline']['mse'] == pytest.approx(copy_mse.mean(), rel=1e-6)
    assert m['copy_baseline']['curves']['mse'] == pytest.approx(copy_mse, abs=2e-6)
    # the model row: the Simulator, seeded as rollout.py seeds it, from the same frame with the same actions
    dyn_m, enc, dec, ck_m = rollout.load_world_model(f'{dyn}/ckpt.pt', 'cpu')
    sim = rollout.Simulator(dyn_m, enc, dec, ck_m, seed=0)
    sim.reset(frames[ep][:1])
    pred = np.concatenate([sim.step(actions[ep][k:k + 1]) for k in range(H)]).astype(np.float64) / 255
    model_mse = ((pred - truth[1:]) ** 2).mean((1, 2, 3))
    assert m['model']['mse'] == pytest.approx(model_mse.mean(), rel=1e-4)
    assert m['model']['curves']['mse'] == pytest.approx(model_mse, rel=1e-4, abs=2e-6)
    for row in ('model', 'copy_baseline'):
        assert all(np.isfinite(m[row][k]) for k in ('mse', 'psnr', 'ssim', 'uiqi')) and -1 <= m[row]['ssim'] <= 1
    # the last of the 14 numbers reaches the prediction: the same step with only it changed predicts another latent
    z = []
    for last in (-1.0, 1.0):
        sim = rollout.Simulator(dyn_m, enc, dec, ck_m, seed=0)
        sim.reset(frames[ep][:1])
        sim.step(np.concatenate([actions[ep][:1, :13], [[last]]], 1))
        z.append(sim.ctx[:, -1])
    assert not torch.equal(z[0], z[1])


def test_tools_stop_clearly_when_the_checkpoints_data_is_not_here(tmp_path):
    """Shipped weights travel without their training data: rollout.load_data names the missing folder and asks for
    --data_dir instead of a traceback; a dataset given with --data_dir is used."""
    ck = {'data': {'data_dir': str(tmp_path / 'gone')}}
    with pytest.raises(SystemExit, match=r"gone: dataset folder does not exist \(the checkpoint training data.*--data_dir="):
        rollout.load_data(ck)
    with pytest.raises(SystemExit, match=r"other: dataset folder does not exist; pass --data_dir="):
        rollout.load_data(ck, str(tmp_path / 'other'))
    d = _ddp_data(tmp_path / 'd')
    ds, path = rollout.load_data(ck, d)
    assert path == d and len(ds['episode_ends']) > 0
