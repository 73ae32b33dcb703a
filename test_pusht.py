"""
test_pusht.py: everything Push-T (pusht.py), the play page (play.py), the benchmarks (bench.py), the
ablation (ablate.py), and the Push-T panels of metrics.py's curves.

    python -m pytest -q test_pusht.py

Frames come from gym-pusht itself (rendered at known states), or from a tiny world model trained
once per module (the tiny_world fixture, built by whichever test asks first).
"""
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

import ablate
import bench
import common
import convert
import data
import metrics as Mx
import model as M
import play
import pusht
import rollout

from common import config_from_globals
from test_smoke import ROOT, ABAR, TINY_AE, TINY_DYN, _run


# ------------------------------------------------------------------------------ frames at known states


def _render(env, state):
    """The frame at a gym-pusht state and the env's true state after the reset (env_state: reset_to_state
    sets the position, then the angle, which pymunk applies about the centre of gravity, so the origin
    moves)."""
    obs, _ = env.reset(options={'reset_to_state': list(map(float, state))})
    return obs, pusht.env_state(env)


def _frames(S, states):
    """uint8 frames (B, S, S, 3) and true states (B, 5) at gym-pusht states."""
    env = pusht.make_env(S)
    out = [_render(env, st) for st in states]
    env.close()
    return np.stack([o for o, _ in out]), np.stack([s for _, s in out])


# agent kept clear of the block; the last one sits on the block's stem (drawn on top of it)
STATES = [[100, 400, 300, 200, 0.5], [420, 90, 200, 300, -1.0], [60, 60, 350, 350, 2.0],
          [256, 360, 256, 300, 0.0]]
# agent, block x, y, angle: the agent kept clear of the T (it is drawn on top and would hide part of it)
CLEAR_STATES = [[60, 460, 250, 250, 0.0], [450, 60, 200, 300, 1.0], [60, 60, 300, 220, -2.2],
                [460, 460, 260, 280, 2.9], [460, 250, 180, 200, -0.7], [60, 250, 320, 300, 4.0]]


def test_generate_pusht_shapes_motion_and_meta(tmp_path):
    """The collector writes a valid dataset in which the agent moves, that declares its action an image point,
    and that depends on the seed only."""
    out = str(tmp_path / 'pusht')
    pusht.generate_pusht(out, num_episodes=2, episode_len=12, image_size=32, num_workers=1, seed=0)
    d = data.load_dataset(out)
    assert d['frames'].shape == (24, 32, 32, 3) and d['frames'].dtype == np.uint8
    assert d['actions'].shape == (24, 2) and d['states'].shape == (24, 5)
    assert d['episode_ends'].tolist() == [12, 24]
    assert d['meta']['action_low'] == [0.0, 0.0] and d['meta']['action_high'] == [512.0, 512.0]
    # the action is the agent's target, a point in the image: what lets the dynamics draw it as a map
    assert d['meta']['image_point_dims'] == [0, 1] and pusht.is_pusht(d['meta'])
    a, s = np.asarray(d['actions']), np.asarray(d['states'])
    for lo, hi in data.episode_ranges(d['episode_ends']):
        assert np.linalg.norm(s[hi - 1, :2] - s[lo, :2]) > 1.0  # the agent moved
        assert np.abs(np.diff(d['frames'][lo:hi].astype(int), axis=0)).sum() > 0  # and the pixels changed
        # the agent follows the commanded target (PD control): it ends near the last commands
        assert np.linalg.norm(s[hi - 1, :2] - a[hi - 2]) < 60
    # episodes depend only on seed + index: regenerating one reproduces it exactly
    again = str(tmp_path / 'again')
    pusht.generate_pusht(again, num_episodes=1, episode_len=12, image_size=32, num_workers=1, seed=0)
    assert np.array_equal(data.load_dataset(again)['frames'], d['frames'][:12])


@pytest.mark.parametrize("S", [64, 96])
def test_agent_centroid_and_block(S):
    """The agent's centroid read from frames rendered at known states is within a pixel of the truth; a frame
    scores perfectly against itself, moved ones do not."""
    frames, st = _frames(S, STATES)
    est = pusht.agent_position(frames)
    err = np.linalg.norm(est - st[:, :2] * S / 512, axis=1)  # no y flip: pixel = sim * S / 512
    assert (err < 1.0).all(), err  # measured ~0.1-0.25 px
    seg = pusht.segment_pusht(frames)
    assert (seg["block"].sum((1, 2)) > 50).all()
    assert not seg["agent"][:, :3].any() and not seg["block"][:, :3].any()  # top wall excluded
    r = pusht.physics(frames, frames)
    assert np.array_equal(r["block_iou"], np.ones(len(STATES)))
    assert np.array_equal(r["agent_err_px"], np.zeros(len(STATES)))
    # moving the block (and agent) lowers IoU; errors stay finite
    r = pusht.physics(frames[1:], frames[:-1])
    assert (r["block_iou"] < 0.5).all() and np.isfinite(r["agent_err_px"]).all()
    assert (r["agent_err_px"] > 5).all()


def test_physics_missing_agent_and_iou_edge_cases():
    """A blank prediction gets the worst agent error (the diagonal) and IoU 0; two blank frames agree
    perfectly."""
    frames, _ = _frames(64, STATES[:1])
    blank = np.full_like(frames, 255)  # a prediction that lost everything
    assert np.isnan(pusht.agent_position(blank)).all()
    r = pusht.physics(blank, frames)
    assert np.allclose(r["agent_err_px"], np.hypot(64, 64)) and r["block_iou"][0] == 0.0
    r = pusht.physics(blank, blank)
    assert r["agent_err_px"][0] == 0.0 and r["block_iou"][0] == 1.0  # both empty -> IoU 1
    # small block shift: IoU drops but stays well above 0
    frames2, _ = _frames(64, [[100, 400, 310, 200, 0.5]])
    iou = pusht.physics(frames2, frames)["block_iou"][0]
    assert 0.2 < iou < 0.95, iou


def test_one_found_rule_for_the_agent():
    """physics, pusht_detectable, agent_position and estimate_state all say "found" by min_pixels: a frame
    with one agent pixel (less than min_pixels(64, 'agent') = 2) has no agent for any of them, one with
    two pixels has one for all of them."""
    S = 64
    frames, _ = _frames(S, CLEAR_STATES[:1])
    no_agent = frames.copy()
    no_agent[pusht.segment_pusht(frames)['agent']] = 255  # erase the agent
    assert not pusht.segment_pusht(no_agent)['agent'].any()
    assert pusht.min_pixels(S, 'agent') == 2
    for n, found in ((1, False), (2, True)):
        f = no_agent.copy()
        f[0, 30:30 + n, 5] = (65, 105, 225)  # n RoyalBlue pixels, away from the T
        assert pusht.segment_pusht(f)['agent'].sum() == n
        assert pusht.pusht_detectable(f)['agent'][0] == found
        assert np.isnan(pusht.agent_position(f)[0, 0]) != found
        assert np.isnan(pusht.estimate_state(f)['agent'][0, 0]) != found
        # against a frame without the agent: missing in both (0), or found in one only (the diagonal)
        assert pusht.physics(f, no_agent)['agent_err_px'][0] == (np.hypot(S, S) if found else 0.0)


@pytest.mark.parametrize('size', [64, 96])
def test_block_pose_and_estimate_state_from_pixels(size):
    """block_pose finds the T's area centroid and angle; estimate_state turns them into gym-pusht's pose
    (body origin in sim units, angle in [0, 2 pi)), the convention of states.npy."""
    frames, st = _frames(size, CLEAR_STATES)
    seg = pusht.segment_pusht(frames)
    pose = pusht.block_pose(seg['block'], seg['agent'])
    true_c = pusht.tee_centroid(st[:, 2:]) * size / 512  # the area centroid, not the body origin
    assert (np.hypot(*(pose[:, :2] - true_c).T) < 1.5).all(), (pose, true_c)
    assert (np.degrees(np.abs(pusht.angle_diff(pose[:, 2], st[:, 4]))) < 5.0).all(), (pose[:, 2], st[:, 4])
    est = pusht.estimate_state(frames)
    assert (np.linalg.norm(est['block'][:, :2] - st[:, 2:4], axis=1) < 3.0).all(), (est['block'], st)
    assert (np.abs(pusht.angle_diff(est['block'][:, 2], st[:, 4])) < np.radians(5)).all()
    assert (est['block'][:, 2] >= 0).all() and (est['block'][:, 2] < 2 * np.pi).all()
    assert (np.linalg.norm(est['agent'] - st[:, :2], axis=1) < 512 / size).all()  # within a pixel
    det = pusht.pusht_detectable(frames)
    assert det['agent'].all() and det['block'].all()
    # the body origin is not the centroid: (0, 40.7) in the body frame
    assert np.allclose(pusht.tee_centroid([0.0, 0.0, 0.0]), [0, 40.714], atol=1e-3)
    white = np.full((1, size, size, 3), 255, np.uint8)
    assert not pusht.pusht_detectable(white)['block'][0] and not pusht.pusht_detectable(white)['agent'][0]
    assert np.isnan(pusht.estimate_state(white)['block']).all()


def test_physics_metrics():
    """physics() is zero against itself, measures a known move and turn of the T, ignores stray block-coloured
    pixels, and scores a vanished block with the worst values, never NaN."""
    S = 64
    env = pusht.make_env(S)
    a = np.pi / 4  # block exactly on the goal: origin at (256, 256), angle pi/4
    cog = np.array([256.0, 256.0]) + 45 * np.array([-np.sin(a), np.cos(a)])  # reset rotates about the cog (0, 45)
    on_goal, st = _render(env, [60, 460, cog[0], cog[1] - 45, a])
    assert np.allclose(st[2:], pusht.GOAL_POSE, atol=1e-6)
    off, st2 = _render(env, [60, 460, 120, 100, 2.0])
    moved, st3 = _render(env, [460, 60, 120, 100, 2.5])  # agent elsewhere, block turned by 0.5 rad
    env.close()
    assert np.allclose(st3[2:4], st2[2:4], atol=30)  # same cog, so the origin moved only a little

    r = pusht.physics(np.stack([on_goal, off]), np.stack([on_goal, off]))
    for k in ('agent_err_px', 'block_centroid_err_px', 'block_angle_err_deg', 'coverage_err'):
        assert np.allclose(r[k], 0), k
    for k in ('block_iou', 'agent_iou'):
        assert np.allclose(r[k], 1), k
    assert r['coverage_true'][0] > 0.9 and r['coverage_true'][1] < 0.05  # the pixel coverage of the goal T

    hidden = on_goal.copy()  # the agent drawn over part of the T on the goal hides it, it does not uncover it
    ys, xs = np.nonzero(pusht.goal_mask(S))
    hidden[ys[:6], xs[:6]] = (65, 105, 225)
    seg = pusht.segment_pusht(hidden[None])
    assert pusht.goal_coverage(seg['block'], seg['agent'])[0] > 0.9
    assert pusht.goal_coverage(seg['block'])[0] < pusht.goal_coverage(seg['block'], seg['agent'])[0]

    r = pusht.physics(moved[None], off[None])
    c2, c3 = pusht.tee_centroid(st2[2:]) * S / 512, pusht.tee_centroid(st3[2:]) * S / 512
    assert abs(r['block_centroid_err_px'][0] - np.hypot(*(c3 - c2))) < 1.5
    assert abs(r['block_angle_err_deg'][0] - np.degrees(0.5)) < 5
    assert r['agent_iou'][0] == 0 and r['agent_err_px'][0] > 40

    noisy = off.copy()  # stray slate-grey pixels far from the T (decoder noise) do not move the pose
    far = [(2, 60), (60, 60), (61, 3), (40, 62), (62, 30), (5, 45)]
    for y, x in far:
        noisy[y, x] = (143, 163, 184)
    assert pusht.segment_pusht(noisy[None])['block'][0][tuple(np.array(far).T)].all()
    r = pusht.physics(noisy[None], off[None])
    assert r['block_centroid_err_px'][0] < 0.3 and r['block_angle_err_deg'][0] < 2
    assert set(r) == set(pusht.PHYSICS_KEYS)

    white = np.full((1, S, S, 3), 255, np.uint8)  # block gone in the prediction: worst values, not NaN
    r = pusht.physics(white, off[None])
    assert r['block_centroid_err_px'][0] == pytest.approx(np.hypot(S, S)) and r['block_angle_err_deg'][0] == 180
    assert r['coverage_err'][0] == pytest.approx(r['coverage_true'][0])
    assert all(np.isfinite(v).all() for v in r.values())


def test_goal_mask_geometry():
    """The geometric goal mask has the T's area and matches the green the renderer draws."""
    g = pusht.goal_mask(64)
    assert abs(g.sum() - 6300 * (64 / 512) ** 2) < 8  # the T's area, 98.4 px at 64x64
    for S in (64, 96):  # the geometric goal matches the green the renderer draws (block and agent away)
        obs, _ = _frames(S, [[460, 460, 100, 100, 0.0]])
        green = np.abs(obs[0].astype(int) - (144, 238, 144)).sum(-1) < 60
        assert pusht.mask_iou(green[None], pusht.goal_mask(S)[None])[0] > 0.85


def test_block_shape_iou():
    """A rendered T is T-shaped; a blob of the block's colour with the T's area is detectable but not
    T-shaped."""
    frames, _ = _frames(64, CLEAR_STATES[:3])
    assert (pusht.block_shape_iou(frames) > 0.75).all()  # a rendered T is T-shaped
    blob = np.full((1, 64, 64, 3), 255, np.uint8)  # a melted block: a disc of the block's colour, same area
    yy, xx = np.mgrid[0:64, 0:64]
    blob[0][(yy - 30) ** 2 + (xx - 30) ** 2 <= 5.6 ** 2] = (143, 163, 184)
    assert pusht.pusht_detectable(blob)['block'][0] and pusht.block_shape_iou(blob)[0] < 0.6
    assert pusht.block_shape_iou(np.full((1, 64, 64, 3), 255, np.uint8))[0] == 0


# ------------------------------------------------------------------------------ moving the T


def test_route_around_goes_round_the_T_not_through_it():
    """Straight when the path is clear or the goal nearly reached; otherwise round the T on the CLEAR circle,
    in steps of at most 60 degrees, every leg but the last missing the T."""
    c = np.array([256.0, 256.0])
    # a clear path, and a goal within 45 degrees round the T: straight
    assert len(pusht.route_around([100, 100], [400, 100], c)) == 1
    near = c + 60 * np.array([math.cos(-1.2), math.sin(-1.2)])  # next to the T, 21 degrees round from the start
    assert np.linalg.norm(near - c) < pusht.PATH_CLEAR and len(pusht.route_around([256, 156], near, c)) == 1
    # through the T: arc points on the CLEAR circle, at most 60 degrees apart, ending at the goal
    for start, goal in (([100, 256], [420, 256]), ([256, 120], [240, 400]), ([150, 150], [360, 380])):
        wps = pusht.route_around(start, goal, c)
        assert np.allclose(wps[-1], goal) and len(wps) >= 2
        pts = [np.asarray(start, float)] + wps
        for p in wps[:-1]:
            assert abs(np.linalg.norm(p - c) - pusht.CLEAR) < 1e-9
        ang = [math.atan2(*(p - c)[::-1]) for p in pts]
        steps = np.abs(pusht.angle_diff(np.array(ang[1:]), np.array(ang[:-1])))
        assert (steps <= math.pi / 3 + 1e-9).all(), np.degrees(steps)
        # every leg but the last misses the T: its closest approach to c is beyond the T's reach
        for a, b in zip(pts[:-2], pts[1:-1]):
            t = np.linspace(0, 1, 50)[:, None]
            assert np.linalg.norm(a + t * (b - a) - c, axis=1).min() > pusht.TEE_REACH


def test_pusher_moves_the_T_to_the_goal_in_gym_pusht():
    """The Pusher, seeing only estimate_state of the frames, brings the T's centroid toward the goal's in
    the real simulator; Hold leaves it where it is."""
    states = np.array([[80.0, 80.0, 330.0, 330.0, 1.0], [440.0, 440.0, 170.0, 200.0, 4.0]])
    real = pusht.RealSim(np.concatenate([states, states]), 64)
    goal_c = pusht.tee_centroid(pusht.GOAL_POSE)
    d0 = np.linalg.norm(pusht.tee_centroid(real.truth()[0][:, 2:]) - goal_c, axis=1)
    _, acts, est, _ = pusht.run_policies(['push', 'hold'], real.first[:2], 60, real.step, seed=0)
    d1 = np.linalg.norm(pusht.tee_centroid(real.truth()[0][:, 2:]) - goal_c, axis=1)
    assert (d1[:2] < 0.5 * d0[:2]).all(), (d0, d1)  # pushed at least half way
    assert np.allclose(d1[2:], d0[2:], atol=1) and np.ptp(acts[2:], axis=1).max() == 0, (d0, d1)  # held still
    assert est.shape == (4, 61, 5)


# ------------------------------------------------------------------------------ a tiny world model


@pytest.fixture(scope='module')
def tiny_world(tmp_path_factory):
    """Tiny Push-T data (3 x 14 frames at 32x32, collected through pusht.py's command line), stage 1, and
    stage 2 with the action map (allowed because the collector's meta.json declares image_point_dims).
    Returns (data_dir, dyn_ckpt). Module-scoped: built once by whichever test asks first and the same for
    all, so no test depends on the order tests run in; tests only read it."""
    root = tmp_path_factory.mktemp('tiny_world')
    d, ae, dyn = (str(root / n) for n in ('data', 'ae', 'dyn'))
    # seed 3: the held-out episode (2 of 3) pushes the T, so bench's contact table has cases to score
    for args in (['pusht.py', '--mode=collect', f'--data_dir={d}', '--num_episodes=3', '--episode_len=14',
                  '--image_size=32', '--num_workers=1', '--seed=3'],
                 ['train_ae.py', f'--data_dir={d}', f'--out_dir={ae}', '--max_iters=6', '--eval_interval=6',
                  '--val_frac=0.34'] + TINY_AE,
                 ['train_dynamics.py', f'--data_dir={d}', f'--ae_ckpt={ae}/ckpt.pt', f'--out_dir={dyn}', '--max_iters=6',
                  '--eval_interval=6', '--val_frac=0.34', '--dyn_action_map=True'] + TINY_DYN):
        r = _run(args, ROOT)
        assert r.returncode == 0, r.stderr
    assert common.load_checkpoint(f'{dyn}/ckpt.pt')['action_map']['dims'] == [0, 1]
    return d, f'{dyn}/ckpt.pt'


def _play_server(tmp_path, ckpt):
    """The play server (play.py's options) on a free port in a thread; returns (server, base url)."""
    cfg = config_from_globals({**vars(rollout), **vars(play)}, [f'--ckpt={ckpt}', '--port=0', f'--record_dir={tmp_path}/rec'])
    dyn, enc, dec, ck = rollout.load_world_model(ckpt, 'cpu')
    sim = rollout.Simulator(dyn, enc, dec, ck, seed=0)
    srv = play.make_play_server(cfg, sim, ck, data.load_dataset(ck['data']['data_dir']))
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
    """The frame (S, S, 3) of a /step, /reset or /record reply."""
    import base64
    import io
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(json.loads(reply)['frame']))))


def test_play_endpoints(tmp_path, tiny_world):
    """Page, step, reset, record -> a dataset data.py loads; malformed requests get a 4xx and serving goes on;
    the mouse drives the action only where meta.json declares it an image point."""
    d, ckpt = tiny_world
    srv, url = _play_server(tmp_path, ckpt)
    try:
        code, page = _sim_req(url + '/')
        assert code == 200 and b'<canvas' in page and b"'/step'" in page and b'"action_high": [512.0, 512.0]' in page
        assert b'"mouse": true' in page
        ck = srv.play.ck
        srv.play.ck = dict(ck, data=dict(ck['data'], meta={k: v for k, v in ck['data']['meta'].items() if k != 'image_point_dims'}))
        assert json.loads(_sim_req(url + '/info')[1])['mouse'] is False  # 2-d actions, but not declared a point
        srv.play.ck = ck
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
        assert pusht.is_pusht(ds['meta'])  # a recording of Push-T is Push-T data (the action map may be trained on it)
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


def test_play_sigterm_saves_recording(tmp_path, tiny_world):
    """play.py as its own process: a recording running when it gets SIGTERM (a `kill`, a service stop) is
    saved, as on Ctrl-C, and the process exits cleanly."""
    d, ckpt = tiny_world
    p = subprocess.Popen([sys.executable, 'play.py', f'--ckpt={ckpt}', '--port=0', f'--record_dir={tmp_path}/rec'],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()  # "serving the world model at http://127.0.0.1:PORT/ ..."
        assert 'serving' in line, (line, p.stderr.read() if p.poll() is not None else '')
        url = line.split('http://')[1].split('/')[0]
        assert _sim_req(f'http://{url}/record', {'on': True})[0] == 200
        for k in range(2):
            assert _sim_req(f'http://{url}/step', {'action': [100 + k, 200]})[0] == 200
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    saved = [os.path.join(tmp_path, 'rec', n) for n in os.listdir(tmp_path / 'rec')]
    assert len(saved) == 1 and 'recorded 1 episode(s), 3 frames' in out
    assert data.load_dataset(saved[0])['frames'].shape[0] == 3


def _sim_free_port():
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not (shutil.which('chromium') or os.path.exists('/usr/bin/chromium')) or not shutil.which('chromedriver'),
                    reason="needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)")
def test_play_in_browser(tmp_path, tiny_world):
    """Headless Chromium (plain WebDriver over HTTP) opens the page, moves the pointer over the frame,
    and new frames keep arriving with the pointer's position as the action."""
    d, ckpt = tiny_world
    srv, url = _play_server(tmp_path, ckpt)
    port = _sim_free_port()
    drv = subprocess.Popen([shutil.which('chromedriver'), f'--port={port}'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wd = f'http://127.0.0.1:{port}'

    def call(path, body=None, method=None):  # one WebDriver command; its value
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


def test_estimator_on_collected_data_and_coverage(tiny_world):
    """estimate_state recovers the recorded Push-T state (states.npy, gym-pusht's convention) from the
    collected frames; goal coverage is 1 with the T on the goal and 0 far off."""
    d, _ = tiny_world
    ds = data.load_dataset(d)
    est = pusht.estimate_state(np.asarray(ds['frames']))
    st = np.asarray(ds['states'])
    ok = ~np.isnan(est['block'][:, 0])
    assert ok.mean() > 0.9
    assert np.median(np.linalg.norm(est['block'][ok, :2] - st[ok, 2:4], axis=1)) < 10  # sim units, at 32x32
    assert np.median(np.abs(pusht.angle_diff(est['block'][ok, 2], st[ok, 4]))) < 0.15
    assert np.nanmedian(np.linalg.norm(est['agent'] - st[:, :2], axis=1)) < 8
    env = pusht.make_env(32)
    env.reset(options={'reset_to_state': [60.0, 60.0, 256.0, 256.0, 0.0]})
    for pos, ang, lo, hi in (((256, 256), math.pi / 4, 0.95, 1.0), ((420, 120), 0.0, 0.0, 0.01)):
        env.block.angle, env.block.position = ang, pos
        env.space.reindex_shapes_for_body(env.block)
        m = pusht.segment_pusht(env._render()[None])
        cov = pusht.goal_coverage(m['block'], m['agent'])[0]
        assert lo <= cov <= hi, (pos, cov)
    env.close()
    assert pusht.pearson([1, 2, 3], [2, 4, 7]) > 0.98 and pusht.pearson([1, 2, 3], [1, 1, 1]) is None
    assert pusht.spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)


def test_policy_eval_demos_and_training(tmp_path, tiny_world):
    """policy_eval (through pusht.py's command line) writes JSON/CSV/PNG for every policy; demos recorded
    inside the model load through data.py, concatenate with real data (convert.py) and train stage 2."""
    d, ckpt = tiny_world
    out, demos, mixed = tmp_path / 'pe', tmp_path / 'demos', tmp_path / 'mixed'
    r = _run(['pusht.py', '--mode=policy_eval', f'--ckpt={ckpt}', '--num_states=2', '--steps=3', f'--out_dir={out}'], ROOT)
    assert r.returncode == 0, r.stderr
    res = json.load(open(out / 'policy_eval.json'))
    names = pusht.DEFAULT_POLICIES.split(',')
    assert [p['policy'] for p in res['policies']] == names
    per = res['per_state']
    for k, p in enumerate(res['policies']):  # the table is the mean over the start states
        assert p['real_coverage'] == pytest.approx(np.mean(per['real_coverage'][k]), abs=1e-4)
        assert p['model_coverage'] == pytest.approx(np.mean(per['model_coverage'][k]), abs=1e-4)
    # hold keeps the agent where it is, clear of the T: the real T does not move, its coverage stays
    np.testing.assert_allclose(per['real_coverage'][names.index('hold')], per['start_coverage'], atol=1e-4)
    # the estimator reads gym-pusht's own pose (body origin, not the centroid 40 units away) from real frames
    assert res['estimator_error_real']['block_units_median'] < 10 and res['estimator_error_real']['block_not_found'] == 0
    assert set(res['correlation']['coverage']) == {'pearson', 'spearman'}
    assert open(out / 'policy_eval.csv').read().startswith('policy,real_coverage,model_coverage')
    assert (out / 'policy_eval.png').stat().st_size > 0 and (out / 'final_frames.png').stat().st_size > 0

    cfg = config_from_globals({**vars(rollout), **vars(pusht)}, ['--mode=record_demos', f'--ckpt={ckpt}', '--num_episodes=2',
                                                                 '--steps=5', f'--record_dir={demos}'])
    pusht.main(cfg)
    dm = data.load_dataset(str(demos))
    assert dm['frames'].shape == (12, 32, 32, 3) and dm['episode_ends'].tolist() == [6, 12]
    assert pusht.is_pusht(dm['meta'])  # Push-T demos: the action map may be trained on them
    with pytest.raises(SystemExit, match='not empty'):  # never written over
        pusht.main(cfg)
    convert.concat_datasets([d, str(demos)], str(mixed))
    mx = data.load_dataset(str(mixed))
    assert mx['episode_ends'].tolist() == [14, 28, 42, 48, 54] and mx['states'] is None
    np.testing.assert_array_equal(mx['frames'][42:], dm['frames'])
    assert pusht.is_pusht(mx['meta'])  # play data + demos: still Push-T, the action still an image point
    r = _run(['train_dynamics.py', f'--data_dir={mixed}', f'--ae_ckpt={common.load_checkpoint(ckpt)["ae_ckpt"]}',
              f'--out_dir={tmp_path}/dyn_mixed', '--max_iters=2', '--eval_interval=2', '--val_frac=0.2',
              '--dyn_action_map=True'] + TINY_DYN, ROOT)
    assert r.returncode == 0, r.stderr
    with pytest.raises(SystemExit, match='unknown mode'):
        pusht.main(dict(cfg, mode='fly'))


def test_replay_starts_where_asked_and_scores_physics_from_a_near_miss(tmp_path, tiny_world):
    """replay_start reproduces the recorded episodes bit for bit (reset_to_state alone does not: gym-pusht
    sets the angle after the position, and pymunk turns the T about its centre of gravity), moves the T's
    centroid by exactly the pixels asked and turns it about that centroid; --mode=replay scores the exact
    replay as perfect and a 2-pixel near miss as worse, and rejects a malformed offset list."""
    d, ckpt = tiny_world
    ds = data.load_dataset(d)
    S = ds['frames'].shape[1]
    env = pusht.make_env(S)
    for s0, e in data.episode_ranges(ds['episode_ends']):
        st = ds['states'][s0]
        assert (pusht.replay_start(env, st, S=S) == ds['frames'][s0]).all()
        for k in range(s0, e - 1):  # frame k+1 follows action k
            assert (env.step(ds['actions'][k].astype(np.float64))[0] == ds['frames'][k + 1]).all()
        pusht.replay_start(env, st, (1.0, -0.5), 10.0, S)
        now = pusht.env_state(env)
        np.testing.assert_allclose(pusht.tee_centroid(now[2:5]) - pusht.tee_centroid(st[2:5]), [512 / S, -256 / S], atol=1e-3)
        assert math.degrees(pusht.angle_diff(now[4], st[4])) == pytest.approx(10.0, abs=1e-4)
    env.close()
    cfg = config_from_globals({**vars(rollout), **vars(pusht)}, ['--mode=replay', f'--ckpt={ckpt}', '--horizon=12',
                                                                 '--replay_offsets=0:0,2:10', f'--out_dir={tmp_path}/rp'])
    res = pusht.main(cfg)
    assert res == json.load(open(tmp_path / 'rp' / 'replay.json'))
    exact, near = res['rows']
    assert exact['rollouts'] == exact['exact_rollouts'] == len(res['episodes']) >= 1
    assert exact['block_iou'] == 1.0 and exact['block_centroid_err_px'] == 0.0 and exact['agent_err_px'] == 0.0
    assert near['exact_rollouts'] == 0 and near['block_iou'] < 0.9 and near['block_centroid_err_px'] > 1.0
    with pytest.raises(SystemExit, match='PX:DEG'):
        pusht.main(dict(cfg, replay_offsets='0.5'))
    # the policy ranking from the same offsets: exact from 0:0, something else from a 4-pixel, 20-degree miss
    pol = pusht.main(dict(cfg, replay_offsets='0:0,4:20', replay_policies=True, num_states=3, steps=6, horizon=2,
                          policies='push,hold', out_dir=str(tmp_path / 'rp2')))['policies']
    assert pol['names'] == ['push', 'hold'] and len(pol['real']) == 2
    same, off = pol['rows']
    assert same['coverage'] == pol['real'] and same['max_abs_diff'] == 0.0
    assert off['coverage'] != pol['real']


def test_bench_diagnose_scores_a_copy_simulator_as_the_copy_baseline(tmp_path, monkeypatch, tiny_world):
    """bench.py --mode=diagnose with a simulator that holds the last real frame it was given: the untouched T
    is then exactly the truth (IoU 1, no drift, latent error 0), the open-loop rollout equals the
    copy-first-frame baseline, and the contact errors equal predicting no change. Any step misalignment
    between prediction and truth (or a baseline taken from the wrong frame) breaks these equalities. The fit
    rows, with a stand-in loss of 2 on the training episodes and 6 on the held-out one: loss_train 2,
    loss_unseen 6, ratio 3 (unseen over training: above 1 is memorisation). The real loss's rows:
    test_bench_fit_rows_of_a_copy_of_the_training_episodes_are_equal."""
    d, ckpt = tiny_world
    dyn, enc, dec, ck = rollout.load_world_model(ckpt, 'cpu')
    fit_loss = {tuple(ck['data']['train_ids']): (2.0, 0.1), tuple(ck['data']['val_ids']): (6.0, 0.3)}
    monkeypatch.setattr(bench, 'one_step_loss', lambda dyn, enc, ck, frames, actions, ranges, ids, *a, **k: fit_loss[tuple(ids)])

    class HoldSim:  # the Simulator's interface, predicting "nothing moves"
        W, ksteps, abar, gen = 3, 1, ABAR, torch.Generator().manual_seed(0)

        def reset(self, frames, actions=None):  # remember the last real frame and its latent
            f = np.asarray(frames)
            self.last = f[:, -1] if f.ndim == 5 else f
            self.ctx = enc(M.frames_to_tensor(self.last))[:, None]  # (N, 1, C, h, w)
            return self.last

        def step(self, a):  # nothing moves
            return self.last.copy()
    monkeypatch.setattr(bench, 'make_sim', lambda *a, **k: HoldSim())
    old = torch.get_num_threads()
    try:
        out = bench.main(_bench_cfg(tmp_path, '--mode=diagnose', f'--ckpt={ckpt}', '--num_states=2', '--num_episodes=1',
                                    '--horizon=12', '--contact_every=1', '--contact_len=3'))
    finally:
        torch.set_num_threads(old)
    truth = out['untouched'][0]
    for r in out['untouched'][2:]:
        assert r['what'] == 'rollout' and r['block_iou'] == 1 and r['drift_px'] == 0 and r['latent_mse'] == 0
        assert r['shape_iou'] == pytest.approx(truth['shape_iou'])
    assert [r['step'] for r in out['untouched'][2:]] == [1, 10, 12]
    for r in out['open_loop']:
        assert r['latent_mse_rollout'] == pytest.approx(r['latent_mse_copy'], abs=1e-9)
    c = out['contact']
    assert c['cases'] > 0, "the held-out episode's T never moves: collect tiny_world's data with another seed"
    assert c['centroid_err_px'] == pytest.approx(c['centroid_err_px_no_change'])
    assert c['angle_err_deg'] == pytest.approx(c['angle_err_deg_no_change'], abs=1e-6)
    assert json.load(open(tmp_path / 'diagnose.json'))['open_loop'][0]['steps'] == [1, 12]
    f = out['fit']  # tiny_world holds out 1 of its 3 episodes
    assert f['unseen_episodes'] == 1 and (f['loss_train'], f['loss_unseen'], f['ratio']) == (2.0, 6.0, 3.0), f
    assert (f['loss_train_sem'], f['loss_unseen_sem']) == (0.1, 0.3), f


def test_bench_fit_rows_of_a_copy_of_the_training_episodes_are_equal(tmp_path, tiny_world):
    """diagnose's fit table with a test set that is a copy of the model's training episodes (in the same
    order): the fixed draws of bench.one_step_loss then pick the same windows, levels and noise for both rows,
    so the 'unseen' loss equals the training loss bit for bit, the ratio is exactly 1, and every episode of
    the copy counts as unseen. A row read from the held-out episodes, from the other dataset's frames or
    actions, or with unseeded noise differs."""
    d, ckpt = tiny_world
    ck = common.load_checkpoint(ckpt)
    ds = data.load_dataset(d)
    ranges = [data.episode_ranges(ds['episode_ends'])[i] for i in ck['data']['train_ids']]
    copy = str(tmp_path / 'train_copy')
    data.write_dataset(copy, [np.asarray(ds['frames'][s:e]) for s, e in ranges],
                       [np.asarray(ds['actions'][s:e]) for s, e in ranges],
                       {k: ds['meta'][k] for k in ('fps', 'action_low', 'action_high', 'source', 'image_point_dims')})
    old = torch.get_num_threads()
    try:
        out = bench.main(_bench_cfg(tmp_path, '--mode=diagnose', f'--ckpt={ckpt}', f'--data_dir={copy}', '--num_states=1',
                                    '--num_episodes=1', '--horizon=4', '--contact_len=1', '--fit_batches=3'))
    finally:
        torch.set_num_threads(old)
    f = out['fit']
    assert f['unseen_episodes'] == len(ranges) == 2 and f['windows'] == 48
    assert np.isfinite(f['loss_train']) and f['loss_train'] > 0
    assert f['loss_unseen'] == f['loss_train'] and f['loss_unseen_sem'] == f['loss_train_sem'] and f['ratio'] == 1.0, f


def test_one_step_loss_reads_only_the_episodes_it_is_given(tiny_world):
    """bench.one_step_loss (diagnose's fit table): the training-window loss does not change, bit for bit, when
    the held-out episode's frames are wiped, and the held-out loss does; the same call twice gives the same
    number (fixed draws). A sampler that strays into other episodes, or unseeded noise, fails this."""
    d, ckpt = tiny_world
    dyn, _, _, ck = rollout.load_world_model(ckpt, 'cpu')
    # a 6-step encoder hardly tells frames apart: a stand-in whose latent is the frame's mean makes a wiped episode show
    enc = lambda x: x.mean((1, 2, 3)).reshape(-1, 1, 1, 1).expand(-1, *ck['latent_shape'])  # (B, C, h, w)
    ds = data.load_dataset(d)
    ranges = data.episode_ranges(ds['episode_ends'])
    tr, va = ck['data']['train_ids'], ck['data']['val_ids']
    frames = np.array(ds['frames'])
    args = (ds['actions'], ranges)
    base_tr = bench.one_step_loss(dyn, enc, ck, frames, *args, tr, 3, 'cpu', bs=4)
    base_va = bench.one_step_loss(dyn, enc, ck, frames, *args, va, 3, 'cpu', bs=4)
    assert bench.one_step_loss(dyn, enc, ck, frames, *args, tr, 3, 'cpu', bs=4) == base_tr
    for i in va:
        frames[ranges[i][0]:ranges[i][1]] = 255  # a white screen where the held-out episode was
    assert bench.one_step_loss(dyn, enc, ck, frames, *args, tr, 3, 'cpu', bs=4) == base_tr
    assert bench.one_step_loss(dyn, enc, ck, frames, *args, va, 3, 'cpu', bs=4)[0] != pytest.approx(base_va[0], rel=1e-3)


def test_ablate_scorer_follows_the_data():
    """ablate.py scores with pusht.evaluate (physics columns) when the data is gym-pusht's, else with
    rollout.main and the generic columns only."""
    meta = {'action_dim': 2, 'image_point_dims': [0, 1], 'source': 'gym_pusht 0.1 PushT-v0, scripted play policy'}
    fn, cols = ablate.scorer(meta)
    assert fn is pusht.evaluate and 'block_iou' in cols and set(cols) <= set(rollout.METRICS) | set(pusht.EVAL_KEYS)
    for other in ({k: v for k, v in meta.items() if k != 'image_point_dims'}, dict(meta, source='aloha hdf5')):
        fn, cols = ablate.scorer(other)
        assert fn is rollout.main and cols == rollout.METRICS


def test_ablate_trains_its_variants_and_scores_every_row(tmp_path, monkeypatch, tiny_world):
    """On the tiny consistency-decoder model, ablate.py trains the deterministic decoder on the frozen encoder
    and the dynamics without context noise (for real, 2 iterations each) and scores 7 rows with the Push-T
    columns. Then a model on that deterministic decoder with both stage-2 switches on: the stage-1
    consistency decoder is scored instead, there is no K=1 row, and one variant per switch is asked of
    train_dynamics.py with only that switch off (the trainer's own defaults parse the arguments; the
    variant checkpoints are the model's weights with the parsed config, so no training time is spent)."""
    d, ckpt = tiny_world
    ck = common.load_checkpoint(ckpt)
    ab = tmp_path / 'ablation'
    rows = ablate.main(config_from_globals(vars(ablate), [f'--ckpt={ckpt}', f'--out_dir={ab}', '--num_episodes=1',
                                                          '--horizon=3', '--dyn_iters=2', '--ae_iters=2', '--windows=(2,)']))
    names = [r['row'] for r in rows]
    assert len(rows) == 7 and any('K=1' in n for n in names) and any('deterministic MSE decoder' in n for n in names), names
    assert any('no context noise' in n for n in names) and names[-1].startswith('copy first frame')
    for r in rows:
        assert 0 <= r['block_iou'] <= 1 and np.isfinite(r['agent_err_px']) and np.isfinite(r['mse'])
    head = open(ab / 'ablation.md').read().split('\n')[0]
    assert head == '| variant | ' + ' | '.join(ablate.scorer(ck['data']['meta'])[1] + ('fps',)) + ' |'
    det_path = str(ab / 'det_decoder' / 'ckpt_deterministic.pt')
    det = common.load_checkpoint(det_path, expect_kind='ae')
    assert det['config']['decoder_type'] == 'deterministic' and det['iter'] == 2
    assert det['encoder_fingerprint'] == common.load_checkpoint(ck['ae_ckpt'])['encoder_fingerprint']  # frozen
    assert not common.load_checkpoint(str(ab / 'dyn_no_ctx_noise' / 'ckpt.pt'))['config']['ctx_noise']

    # the Push-T CPU recipe's shape: dynamics on the deterministic decoder, here with own_ctx on too
    full = dict(ck, ae_ckpt=det_path, config=dict(ck['config'], ae_ckpt=det_path, own_ctx=0.5))
    full_path = str(tmp_path / 'dyn_det' / 'ckpt.pt')
    common.save_checkpoint(full, full_path)
    asked = {}

    def fake_train(script, args, log_path):  # parse as the trainer would, then write the model with that config
        assert script == 'train_dynamics.py', script
        c = common.configure(bench._literals(os.path.join(ROOT, script)), args)
        asked[os.path.basename(c['out_dir'])] = c
        common.save_checkpoint(dict(full, config={k: c.get(k, v) for k, v in full['config'].items()}),
                               os.path.join(c['out_dir'], 'ckpt.pt'))
    monkeypatch.setattr(ablate, '_train', fake_train)
    rows = ablate.main(config_from_globals(vars(ablate), [f'--ckpt={full_path}', f'--out_dir={tmp_path / "ablation2"}',
                                                          '--num_episodes=1', '--horizon=3', '--dyn_iters=2', '--windows=()']))
    names = [r['row'] for r in rows]
    assert len(rows) == 6 and not any('K=1' in n for n in names), names
    cons = [r for r in rows if 'consistency decoder' in r['row']]
    assert len(cons) == 1 and os.path.samefile(cons[0]['change']['ae_ckpt'], ck['ae_ckpt'])
    assert sorted(asked) == ['dyn_no_ctx_noise', 'dyn_no_own_ctx']
    for variant, key, off in (('no_ctx_noise', 'ctx_noise', False), ('no_own_ctx', 'own_ctx', 0.0)):
        c = asked['dyn_' + variant]
        changed = {k for k, v in full['config'].items() if c.get(k, v) != v}
        assert c[key] == off and changed <= {key, 'out_dir', 'max_iters', 'device'}, (variant, changed)
        assert c['ae_ckpt'] == det_path and c['max_iters'] == 2


# ------------------------------------------------------------------------------ bench.py


def _bench_cfg(tmp_path, *args):
    """bench.py's options for a run on the tiny random recipe, one thread, writing to tmp_path."""
    return config_from_globals(vars(bench), [f'--out_dir={tmp_path}', '--recipes=tiny', '--threads=1', *args])


class _Clock:
    """bench's `time` module with a perf_counter that only moves when the test advances it, so the timings
    bench reports are exact, known numbers; every other name is the real module's."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds

    def __getattr__(self, name):
        return getattr(time, name)


def _tick_per_call(monkeypatch, clock, cls, seconds):
    """Every forward pass of cls (a module class) advances clock by seconds, then runs as usual."""
    fwd = cls.forward
    monkeypatch.setattr(cls, 'forward', lambda self, *a, **k: (clock.advance(seconds), fwd(self, *a, **k))[1])


def test_bench_speed_tiny(tmp_path, monkeypatch):
    """The speed table's timings and rates against a clock that ticks only when a network runs: 4 ms a
    dynamics pass, 1 ms a decoder pass (each whatever the batch), and a machine rate of 1000 GFLOP/s.
    A live frame is then 1 dynamics + 3 decoder jumps = 7 ms (1000/7 FPS at batch 1, twice that at batch 2),
    the multi-step row K=2 is 2 + 2 passes = 10 ms (100 FPS, a slow-down of 10/7), and the achieved
    GFLOP/s is the frame's FLOPs at 1000/7 frames a second. A wrong pass count, batch accounting, timed
    warm-up or inverted ratio gives other numbers. The FLOPs: a frame is one dynamics and three decoder jumps."""
    clock = _Clock()
    monkeypatch.setattr(bench, 'time', clock)
    monkeypatch.setattr(bench, 'matmul_rate', lambda dev, n=0, reps=0: 1e12)
    _tick_per_call(monkeypatch, clock, M.Dynamics, 0.004)
    _tick_per_call(monkeypatch, clock, M.Decoder, 0.001)
    old = torch.get_num_threads()
    try:
        out = bench.main(_bench_cfg(tmp_path, '--mode=speed', '--batches=1,2', '--speed_steps=2', '--warmup=1',
                                    '--multi_steps=2'))
    finally:
        torch.set_num_threads(old)
    saved = json.load(open(tmp_path / 'speed.json'))
    assert saved == json.loads(json.dumps(out)) and len(saved['results']) == 1
    r = saved['results'][0]
    assert r['recipe'] == 'tiny' and r['image_size'] == 16 and saved['matmul_gflops'] == pytest.approx(1000)
    j = r['gflops_per_jump']
    assert r['gflops_per_frame'] == pytest.approx(j['dynamics'] + 3 * j['decoder'], rel=0.01)
    assert r['ms_per_jump'] == pytest.approx({'dynamics': 4.0, 'decoder': 1.0}, rel=1e-9)
    assert {n: v['fps'] for n, v in r['fps_by_batch'].items()} == pytest.approx({'1': 1000 / 7, '2': 2000 / 7}, rel=1e-9)
    assert not any(v['estimated'] for v in r['fps_by_batch'].values())
    assert r['fps_batch1'] == pytest.approx(1000 / 7, rel=1e-9)
    assert r['achieved_gflops'] == pytest.approx(r['gflops_per_frame'] * 1000 / 7, rel=1e-9)
    assert r['frac_of_matmul_rate'] == pytest.approx(r['gflops_per_frame'] * 1000 / 7 / 1000, rel=1e-9)
    ms = r['multi_step']
    assert ms['jumps'] == 2 and not ms['estimated'] and 'bench._multi_stepper' in ms['how']
    assert ms['fps'] == pytest.approx(100, rel=1e-9) and ms['slowdown'] == pytest.approx(10 / 7, rel=1e-9)
    table = bench.speed_table(out)
    assert '| tiny | 16 |' in table and '| 143 | 286 | 100 (2+2) | 1.4x |' in table, table


def test_bench_train_times_real_optimizer_steps_with_and_without_bf16(tmp_path, monkeypatch):
    """bench.py --mode=train: every row runs its 2 untimed + train_steps timed optimizer steps of the stage it
    names (stage 1's loss or stage 2's), under bf16 autocast exactly in the bf16 rows, and writes train.json.
    Its timings against a clock that ticks only in the losses (3 ms stage 1's, 7 ms stage 2's): a row's
    ms/step is then its loss's 3 or 7 ms, and the two untimed first steps (compile's cost) 6 or 14 ms. Timing
    the warm-up steps, or dividing by the wrong count, gives other numbers."""
    clock = _Clock()
    monkeypatch.setattr(bench, 'time', clock)
    seen = []
    for name, sec in (('decoder_loss', 0.003), ('dynamics_loss', 0.007)):
        orig = getattr(M, name)
        def rec(*a, _orig=orig, _name=name, _sec=sec, **k):
            seen.append((_name, torch.is_autocast_enabled('cpu')))
            clock.advance(_sec)
            return _orig(*a, **k)
        monkeypatch.setattr(M, name, rec)
    steps = []
    orig_step = torch.optim.AdamW.step
    monkeypatch.setattr(torch.optim.AdamW, 'step', lambda self, *a, **k: (steps.append(1), orig_step(self, *a, **k))[1])
    old = torch.get_num_threads()
    try:
        out = bench.main(_bench_cfg(tmp_path, '--mode=train', '--train_steps=2'))
    finally:
        torch.set_num_threads(old)
    assert json.load(open(tmp_path / 'train.json')) == json.loads(json.dumps(out))
    assert [(r['stage'], r['kind']) for r in out['results']] == [('ae', 'fp32'), ('ae', 'bf16 autocast'), ('dyn', 'fp32'),
                                                                  ('dyn', 'bf16 autocast')]
    want = [(loss, bf16) for loss in ('decoder_loss', 'dynamics_loss') for bf16 in (False, True) for _ in range(4)]
    assert seen == want and len(steps) == 16
    assert [r['ms_per_step'] for r in out['results']] == pytest.approx([3, 3, 7, 7], rel=1e-9)
    assert [r['first_two_steps_s'] for r in out['results']] == pytest.approx([0.006, 0.006, 0.014, 0.014], rel=1e-6)


def test_bench_flops_of_a_frame_and_of_the_multi_step_sampler():
    """count_flops counts CPU attention (bench's own mapping for the op torch's counter does not know), and
    the multi-step timing really runs K dynamics passes and K decoder jumps per frame."""
    q = torch.randn(1, 2, 8, 4)
    assert bench.count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)) == 4 * 2 * 8 * 8 * 4
    torch.manual_seed(0)
    dyn, enc, dec, ck = bench.random_world_model(bench.recipe_sizes('tiny'), 'cpu')
    cfg = config_from_globals(vars(bench), [])
    sim = bench.make_sim(dyn, enc, dec, ck, 'cpu', cfg)
    rng = np.random.default_rng(0)
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny nets: one thread is faster and fair to a busy machine
    try:
        sim.reset(rng.integers(0, 256, (1, 16, 16, 3), dtype=np.uint8))
        act = torch.cat([sim.act, sim.act[:, -1:]], 1)
        f_dyn = bench.count_flops(lambda: M.predict_next(sim.dyn, sim.ctx, act, sim.abar, 15))
        f_dec = bench.count_flops(lambda: M.decode(sim.dec, sim.ctx[:, -1], 1, sim.abar, 16))
        f_frame = bench.count_flops(bench._stepper(sim, 1, 'cpu', cfg, rng))
        f_multi = bench.count_flops(bench._multi_stepper(sim, 5, 'cpu', cfg, rng))
    finally:
        torch.set_num_threads(old)
    assert f_dyn > 0 and f_dec > 0
    assert f_frame == pytest.approx(f_dyn + 3 * f_dec, rel=0.01)
    assert f_multi == pytest.approx(5 * (f_dyn + f_dec), rel=0.01)


def test_bench_recipe_sizes_read_the_configs():
    """recipe_sizes reads the recipes' config files (nothing executed); the action map of a recipe gets
    Push-T's point map."""
    gpu, cpu = bench.recipe_sizes('gpu'), bench.recipe_sizes('cpu')
    assert gpu['image_size'] == 128 and cpu['image_size'] == 64
    assert gpu['dyn_ch'] == 256 and gpu['window'] == 10 and tuple(gpu['dec_ch']) == (64, 128, 256, 256)
    assert cpu['dyn_spatial_attn'] == 'mid' and cpu['window'] == 6 and cpu['dyn_action_map'] is True
    # a recipe with the action map gets the map a Push-T dataset would give it: (0, 0) .. (512, 512) spans the frame
    dyn, enc, dec, ck = bench.random_world_model(cpu, 'meta')
    m = ck['action_map']
    assert dyn.action_map is m and m['dims'] == [0, 1]
    h = 16  # the 64x64 recipe's latent grid: the action range's middle is the grid's middle, its ends 1/(2h) beyond the edge cells
    assert m['offset'] == pytest.approx([0.0, 0.0], abs=1e-9) and m['scale'][0] == pytest.approx(h / (h - 1))


def test_bench_stability_tiny_and_nan(tmp_path):
    """The stability report's rows and a NaN injected into the context: found at its step, and the run stops
    after that row."""
    old = torch.get_num_threads()
    try:
        out = bench.main(_bench_cfg(tmp_path, '--mode=stability', '--steps=12', '--report_every=6', '--detect_every=3'))
        assert out['first_nonfinite_step'] is None and out['steps_run'] == 12 and len(out['rows']) == 2
        row = out['rows'][0]
        assert row['steps'] == [1, 6] and row['nonfinite_steps'] == 0 and row['latent_norm'] == pytest.approx(1, abs=1e-4)
        assert json.load(open(tmp_path / 'stability.json'))['rows'][1]['steps'] == [7, 12]
        assert (tmp_path / 'stability.png').exists()
        out = bench.main(_bench_cfg(tmp_path, '--mode=stability', '--steps=30', '--report_every=5', '--inject_nan_step=7'))
    finally:
        torch.set_num_threads(old)
    assert out['first_nonfinite_step'] == 7 and out['steps_run'] == 10  # stopped after the row with the NaN
    assert out['rows'][0]['nonfinite_steps'] == 0 and out['rows'][1]['nonfinite_steps'] == 3


def test_bench_stability_rows_summarise_their_own_steps(tmp_path, monkeypatch):
    """Each stability row is the mean of its own steps, checked against a scripted simulator whose every
    output is known. 12 steps, a row every 6, frames segmented every 3rd step (0, 3, 6, 9); each step takes
    20 ms (50 FPS); step k's latent is (k + 1, 0) at every latent pixel (norm k + 1, so the rows' mean
    norms are 3.5 and 9.5; squared change from the step before 0.5). The segmented frames are a gym-pusht
    frame (agent and T found), a white one (neither), the same frame with its agent erased (the T only) and
    the gym-pusht frame again; every other step shows the start frame back (no colour drift). A row that
    reads the wrong latent, segments other steps, mixes the agent and block columns or times the wrong
    thing gives other numbers."""
    S = 64
    clock = _Clock()
    monkeypatch.setattr(bench, 'time', clock)
    ck = {'action_dim': 2, 'config': {'window': 3}, 'action_map': None,
          'data': {'image_size': S, 'action_stats': {'low': [0.0, 0.0], 'high': [512.0, 512.0]}}}
    monkeypatch.setattr(bench, 'random_world_model', lambda sizes, dev, action_dim=2: (None, None, None, ck))
    tee, _ = _frames(S, CLEAR_STATES[:1])
    no_agent = tee.copy()
    no_agent[pusht.segment_pusht(tee)['agent']] = 255
    white = np.full_like(tee, 255)
    shown = {0: tee, 3: white, 6: no_agent, 9: tee}

    class ScriptedSim:
        W = 3

        def reset(self, f0):
            self.f0, self.k = np.array(f0), 0
            self.ctx = torch.zeros(1, self.W - 1, 2, 2, 2)  # (N, W-1, C, h, w): the start latent is 0

        def step(self, a):
            clock.advance(0.02)
            z = torch.zeros(1, 2, 2, 2)
            z[:, 0] = self.k + 1
            self.ctx = torch.cat([self.ctx[:, 1:], z[:, None]], 1)
            frame = shown.get(self.k, self.f0)
            self.k += 1
            return frame
    sim = ScriptedSim()
    monkeypatch.setattr(bench, 'make_sim', lambda *a, **k: sim)
    out = bench.main(_bench_cfg(tmp_path, '--mode=stability', '--steps=12', '--report_every=6', '--detect_every=3'))
    assert out['steps_run'] == 12 and out['first_nonfinite_step'] is None and out['image_size'] == S and out['window'] == 3
    r1, r2 = out['rows']
    # colour drift: how far a frame's mean colour is from the start frame's (0 for the start frame shown back)
    mean0 = sim.f0.reshape(-1, 3).astype(np.float64).mean(0)
    drift = {k: float(np.linalg.norm(f.reshape(-1, 3).mean(0) - mean0)) for k, f in shown.items()}
    shape = {k: float(pusht.block_shape_iou(f)[0]) for k, f in shown.items()}
    want1 = {'nonfinite_steps': 0, 'latent_norm': 3.5, 'latent_change': 0.5,
             'colour_drift': (drift[0] + drift[3]) / 6, 'colour_drift_max': max(drift[0], drift[3]),
             'agent_found': 0.5, 'block_found': 0.5, 'block_shape_iou': shape[0] / 2, 'fps': 50.0}
    want2 = {'nonfinite_steps': 0, 'latent_norm': 9.5, 'latent_change': 0.5,
             'colour_drift': (drift[6] + drift[9]) / 6, 'colour_drift_max': max(drift[6], drift[9]),
             'agent_found': 0.5, 'block_found': 1.0, 'block_shape_iou': (shape[6] + shape[9]) / 2, 'fps': 50.0}
    assert r1.pop('steps') == [1, 6] and r2.pop('steps') == [7, 12]
    assert r1 == pytest.approx(want1, rel=1e-9) and r2 == pytest.approx(want2, rel=1e-9), (r1, r2)
    assert shape[0] > 0.75 and drift[3] > 50  # the frames really are a T and a white screen


def test_bench_smooth_actions_are_smooth_travel_and_start_at_the_agent():
    """The stability run's actions move a little each step, cover the range, and start at the given command."""
    a = bench.smooth_actions(2000, [20, 20], [492, 492], np.random.default_rng(0))
    step = np.linalg.norm(np.diff(a, axis=0), axis=1)
    assert 2 < np.median(step) < 15 and a.std(0).min() > 40  # smooth, yet it travels
    a = bench.smooth_actions(50, [20, 20], [492, 492], np.random.default_rng(0), start=[400, 60])
    assert np.linalg.norm(a[0] - [400, 60]) < 20  # starts where the agent is, not at the centre


# ------------------------------------------------------------------------------ the metrics the tools report


def test_write_curves_with_the_push_t_panels(tmp_path):
    """curves.csv has a column per series and metric (None skipped); curves.png draws the four Push-T panels."""
    H = 12
    curves = {'model': {'psnr': list(np.linspace(30, 20, H)), 'ssim': list(np.linspace(0.9, 0.7, H)),
                        'lpips': None, 'agent_err_px': list(np.linspace(0, 5, H)), 'block_iou': list(np.linspace(1, .5, H))},
              'copy_baseline': {'psnr': [18.0] * H, 'ssim': [0.6] * H, 'lpips': None, 'agent_err_px': [6.0] * H,
                                'block_iou': [0.4] * H}}
    csv, png = Mx.write_curves(str(tmp_path), curves, pusht.PANELS)
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


# ------------------------------------------------------------------------------------------ shipped weights

SHIPPED = os.path.join(ROOT, 'weights', 'pusht64_dyn.pt')


def _shipped_rollout(dyn, enc, dec, ck, E=4, H=32, seed=777):
    """E fresh gym-pusht start states (sample_states(seed): no training run collected them) x 2 policies: 'push'
    (walks round the T and pushes it) and 'hold' (the agent stays put, the T is never touched), H steps in
    gym-pusht; then the same actions open loop in the model from the same first frames.
    -> true (2E, H+1, S, S, 3), pred (2E, H, S, S, 3); rows 0..E-1 push, E..2E-1 hold."""
    S = ck['data']['image_size']
    real = pusht.RealSim(np.concatenate([pusht.sample_states(E, seed)] * 2), S)
    true = []
    _, acts, _, _ = pusht.run_policies(['push', 'hold'], real.first[:E], H, real.step, 0, on_step=lambda t, f, e: true.append(f))
    true = np.stack(true, 1)
    sim = rollout.Simulator(dyn, enc, dec, ck, seed=0)
    sim.reset(true[:, 0])
    return true, np.stack([sim.step(acts[:, k]) for k in range(H)], 1)


def test_shipped_weights_track_the_agent_keep_the_T_and_push_it():
    """The shipped model (weights/, README) on fresh episodes: the agent is tracked (mean error <= 0.5 px, pushing
    and holding; copying the first frame is ~20 px off), an untouched T keeps its place and shape ('hold': block IoU
    >= 0.75 on average and >= 0.6 at every step, centroid within 1.5 px), and a pushed T moves the right way (on the
    steps where the true T has moved >= 3 px, the predicted centroid is well closer to the truth than the unmoved T
    is). Each assertion was checked by breaking the code on purpose: a sampler whose window never takes in its
    predictions (agent 4.6 px, centroid ratio 0.99), the action map's x read from y (agent 12.6 px), the encoder
    given BGR frames (agent 3.1 px), the decoder given another row's latent (agent 20 px, hold IoU 0.11), on the
    weights shipped first; on the width-64 weights at 32,000 iterations the sampler and BGR breakages again: agent
    3.0 and 1.6 px; on the 64,000 weights BGR frames gave 0.93 px, which is why the bound is 0.5 px, not 1. On
    today's (128,000) the model recovers the agent from BGR start frames (0.24 px), so the first predicted frame is
    checked too: pixel MSE <= 2e-4 (PSNR >= 37 dB; the autoencoder alone: 39.3 dB), 1.6e-4 as shipped, 2.9e-4 from
    BGR frames; a frozen sampler still gives agent 20.8 px, centroid ratio 0.99. Today's weights: agent 0.22 / 0.01
    px, hold IoU 0.91 (min 0.80), centroid ratio 0.23 (the 64,000 weights: 0.22 / 0.07, 0.89 (0.76), 0.25; first
    frame 1.6e-4) (2026-12-07)."""
    assert os.path.isfile(SHIPPED), f"{SHIPPED} is missing: the shipped weights are part of the repository"
    dyn, enc, dec, ck = rollout.load_world_model(SHIPPED, 'cpu')
    true, pred = _shipped_rollout(dyn, enc, dec, ck)
    E, H, S = len(true) // 2, pred.shape[1], pred.shape[2]
    flat = lambda x: x.reshape(-1, S, S, 3)
    model = {k: v.reshape(2 * E, H) for k, v in pusht.physics(flat(pred), flat(true[:, 1:])).items()}
    copy = {k: v.reshape(2 * E, H) for k, v in pusht.physics(flat(np.repeat(true[:, :1], H, 1)), flat(true[:, 1:])).items()}
    first = (((pred[:, 0].astype(np.float64) - true[:, 1]) / 255) ** 2).mean()  # step 1, all 2E rows
    assert first <= 2e-4, first
    agent, hold_agent = model['agent_err_px'][:E].mean(), model['agent_err_px'][E:].mean()
    assert agent <= 0.5 and hold_agent <= 0.5 and copy['agent_err_px'][:E].mean() > 10 * agent, (agent, hold_agent)
    iou = model['block_iou'][E:]  # (E, H) the untouched T
    assert iou.mean() >= 0.75 and iou.min() >= 0.6, iou.min(1)
    assert model['block_centroid_err_px'][E:].mean() <= 1.5, model['block_centroid_err_px'][E:].mean(1)
    moved = copy['block_centroid_err_px'][:E] >= 3.0  # (E, H): steps where the pushed T is >= 3 px from its start
    assert moved.sum() >= 20, moved.sum(1)  # the pushes really move the T in these episodes
    m, c = model['block_centroid_err_px'][:E][moved].mean(), copy['block_centroid_err_px'][:E][moved].mean()
    assert m < 0.6 * c, (m, c)


def test_long_run_script_segments_saves_and_branches(tiny_world, tmp_path):
    """config/pusht_long_run.sh, dry run on the tiny world (D, R, O, P0 point it at temporary folders): `train 4`
    trains the trunk in segments ending at the doubling points 2 and 4 and keeps a snapshot at each; `save` writes
    the weights-only state; in a "new session" (the trunk's folder and the data gone) `branch 4` collects the same
    episodes again (COLLECT: the tiny world's collection), starts from that state, cools
    down over the last 4/4 iterations and is exported as curve point 5; `save` then keeps the branch's state, from
    which a later session exports a finished branch without training it again and goes on with an unfinished one;
    a branch with no snapshot, an unreadable checkpoint and an unknown command are errors. `ship M` copies curve
    point M to the weights folder (W), its dynamics naming the autoencoder beside it, and refuses a point that is not
    there, leaving the shipped files as they were."""
    d, dyn_ckpt = tiny_world
    R, O = tmp_path / 'runs', tmp_path / 'out'
    R.mkdir()
    shutil.copy(common.load_checkpoint(dyn_ckpt)['ae_ckpt'], R / 'ae.pt')  # stage 1 already trained: the script skips it
    extra = ' '.join(TINY_DYN + ['--val_frac=0.34', '--eval_interval=2'])
    W = tmp_path / 'weights'
    # COLLECT: the tiny world's own collection, so a branch on a bare checkout (no D) collects the same episodes again
    env = {**os.environ, 'D': d, 'R': str(R), 'O': str(O), 'P0': '2', 'W': str(W), 'EXTRA': extra,
           'COLLECT': '--num_episodes=3 --episode_len=14 --image_size=32 --num_workers=1 --seed=3'}
    sh = lambda *a, **e: subprocess.run(['bash', os.path.join(ROOT, 'config', 'pusht_long_run.sh'), *a], env={**env, **e},
                                        capture_output=True, text=True, timeout=300)
    it = lambda f: common.load_checkpoint(str(f))['iter']
    r = sh('train', '4')
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (it(O / 'dyn' / 'ckpt.pt'), it(O / 'dyn' / 'trunk_2.pt'), it(O / 'dyn' / 'trunk_4.pt')) == (4, 2, 4)
    r = sh('save')
    assert r.returncode == 0 and 'iteration 4' in r.stdout, r.stdout + r.stderr
    state = torch.load(R / 'ckpt.pt', weights_only=True)
    assert 'optimizer' not in state and 'rng' not in state and state['iter'] == 4
    shutil.rmtree(O / 'dyn')  # a new session on a bare checkout: only the committed state is left, no data
    bare = tmp_path / 'bare_data'
    r = sh('branch', '4', D=str(bare))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert np.array_equal(np.load(bare / 'frames.npy'), np.load(os.path.join(d, 'frames.npy')))  # collected again
    b = common.load_checkpoint(str(O / 'branch_4' / 'ckpt.pt'))
    assert (b['iter'], b['config']['max_iters'], b['config']['cooldown_iters']) == (5, 5, 1)  # P + P/4, cooling P/4
    assert it(O / 'curve' / 'it5_dyn.pt') == 5 and (O / 'curve' / 'it5_ae.pt').is_file()
    r = sh('branch', '8')
    assert r.returncode == 1 and 'no snapshot of the trunk at iteration 8' in r.stdout, r.stdout + r.stderr
    # the session ends: `save` keeps the branch as weights-only state too; the next session goes on from it
    r = sh('save')
    assert r.returncode == 0 and 'branch_4.pt: iteration 5' in r.stdout, r.stdout + r.stderr
    assert 'optimizer' not in torch.load(R / 'branch_4.pt', weights_only=True)
    state = torch.load(R / 'branch_4.pt', weights_only=True)
    state['iter'] = 9  # as if branch 8 (2 cool-down iterations) had been stopped after its first
    torch.save(state, R / 'branch_8.pt')
    shutil.rmtree(O / 'branch_4'), shutil.rmtree(O / 'curve')
    r = sh('branch', '4')  # finished: exported from the saved state, not trained again
    assert r.returncode == 0 and 'from iter' not in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert it(O / 'curve' / 'it5_dyn.pt') == 5 and 'optimizer' not in torch.load(O / 'branch_4' / 'ckpt.pt', weights_only=True)
    r = sh('branch', '8')  # unfinished: goes on from iteration 9, not from a trunk snapshot
    assert r.returncode == 0 and 'new random streams from iter 9' in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    b = common.load_checkpoint(str(O / 'branch_8' / 'ckpt.pt'))
    assert (b['iter'], b['config']['cooldown_iters']) == (10, 2) and it(O / 'curve' / 'it10_dyn.pt') == 10
    r = sh('ship', '10')
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    _, _, _, ck = rollout.load_world_model(str(W / 'pusht64_dyn.pt'), 'cpu')  # finds its autoencoder beside it
    assert (ck['iter'], ck['ae_ckpt']) == (10, str(W / 'pusht64_ae.pt')) and (W / 'pusht64.json').is_file()
    shipped = {f: f.read_bytes() for f in W.iterdir()}
    os.remove(O / 'curve' / 'it5.json')  # a half-exported point: refused before anything is copied
    for bad in ('5', '20'):
        r = sh('ship', bad)
        assert r.returncode == 1 and f"no {O / 'curve' / ('it' + bad)}" in r.stdout, r.stdout + r.stderr
    assert {f: f.read_bytes() for f in W.iterdir()} == shipped
    os.remove(R / 'branch_4.pt'), shutil.rmtree(O / 'branch_4')
    state['iter'] = 5  # the committed trunk past 4 is not a branch's state: no cool-down starts from it
    torch.save(state, R / 'ckpt.pt')
    r = sh('branch', '4')
    assert r.returncode == 1 and 'no snapshot of the trunk at iteration 4' in r.stdout, r.stdout + r.stderr
    (R / 'ckpt.pt').write_bytes(b'not a checkpoint')  # the script reads iterations without torch: a bad file is named
    r = sh('branch', '4')
    assert r.returncode == 1 and f"checkpoint '{R / 'ckpt.pt'}' cannot be read" in r.stderr, r.stdout + r.stderr
    assert sh('nonsense').returncode == 2


def test_curve_tabulates_each_point_from_its_scores(tmp_path):
    """curve.py: one row per exported point (in iteration order, not file order), IoU over steps 1-32 the mean of
    the first 32 steps of the per-step curve, the stability column the worst row, the policy gap the largest
    |real - model| coverage; the copy baseline's row; scores already on disk are read, not recomputed."""
    import curve
    cd, od = tmp_path / 'curve', tmp_path / 'eval'
    cd.mkdir()

    def point(cd, it, iou):  # a placeholder export whose every score is on disk already
        (cd / f'it{it}_dyn.pt').write_bytes(b'')
        for part in ('eval', 'policy_eval', 'stability'):
            os.makedirs(od / f'it{it}' / part, exist_ok=True)
        m = {k: 1.0 for k in ('mse', 'psnr', 'ssim', 'agent_err_px', 'block_centroid_err_px', 'block_angle_err_deg')}
        curves = [iou] * 32 + [0.0] * 160  # steps 1-32 at iou, the rest at 0
        json.dump({'model': {**m, 'block_iou': iou / 6, 'curves': {'block_iou': curves}},
                   'copy_baseline': {**m, 'block_iou': 0.1, 'curves': {'block_iou': [0.3] * 192}}},
                  open(od / f'it{it}' / 'eval' / 'metrics.json', 'w'))
        json.dump({'correlation': {'coverage': {'pearson': 0.9, 'spearman': 0.8}},
                   'policies': [{'real_coverage': 0.5, 'model_coverage': 0.5 + iou}, {'real_coverage': 0.2, 'model_coverage': 0.1}]},
                  open(od / f'it{it}' / 'policy_eval' / 'policy_eval.json', 'w'))
        json.dump({'rows': [{'block_shape_iou': 0.9}, {'block_shape_iou': iou}]}, open(od / f'it{it}' / 'stability' / 'stability.json', 'w'))
    for it, iou in ((16000, 0.5), (4000, 0.2)):
        point(cd, it, iou)
    cfg = {'curve_dir': str(cd), 'data_dir': str(tmp_path), 'out_dir': str(od), 'num_episodes': 16, 'horizon': 192,
           'num_states': 20, 'policy_steps': 60, 'stability_steps': 9000, 'skip': '', 'prior': ''}
    rows = curve.main(cfg)
    assert [r['iters'] for r in rows] == [4000, 16000]
    assert [round(r['iou32'], 6) for r in rows] == [0.2, 0.5] and [round(r['block_iou'], 6) for r in rows] == [round(0.2 / 6, 6), round(0.5 / 6, 6)]
    assert [r['shape_min'] for r in rows] == [0.2, 0.5] and [round(r['gap'], 6) for r in rows] == [0.2, 0.5]
    md = open(od / 'curve.md').read().splitlines()
    assert len(md) == 5 and md[2].startswith('| 4000 |') and md[4].startswith('| copying the first frame |') and '| 0.300 |' in md[4]
    assert os.path.getsize(od / 'curve.png') > 1000
    with pytest.raises(SystemExit, match='no itM_dyn.pt'):
        curve.main({'curve_dir': str(tmp_path / 'none'), 'data_dir': str(tmp_path), 'out_dir': str(od), 'skip': ''})
    # a later session: only the new point is exported; --prior keeps the earlier rows, a re-scored point wins
    os.replace(od / 'curve.json', tmp_path / 'prior.json')
    cd2 = tmp_path / 'curve2'
    cd2.mkdir()
    point(cd2, 32000, 0.7)
    point(cd2, 16000, 0.6)
    rows = curve.main({**cfg, 'curve_dir': str(cd2), 'prior': str(tmp_path / 'prior.json')})
    assert [(r['iters'], round(r['iou32'], 6)) for r in rows] == [(4000, 0.2), (16000, 0.6), (32000, 0.7)]
    assert len(open(od / 'curve.md').read().splitlines()) == 6
    with pytest.raises(SystemExit, match='other settings: horizon 192 vs 96'):
        curve.main({**cfg, 'curve_dir': str(cd2), 'prior': str(tmp_path / 'prior.json'), 'horizon': 96})
    with pytest.raises(SystemExit, match='no such file'):
        curve.main({**cfg, 'curve_dir': str(cd2), 'prior': str(tmp_path / 'missing.json')})
