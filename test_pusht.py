"""
test_pusht.py: everything Push-T (pusht.py), the play page (play.py) and the benchmarks (bench.py, ablate.py).

    python -m pytest -q test_pusht.py
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

from common import config_from_globals
from test_smoke import ROOT, ABAR, TINY_AE, TINY_DYN, _randomize, _run, _tiny_nets


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
