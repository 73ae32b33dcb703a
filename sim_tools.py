"""
The world model used as a simulator: the live play server (a page that drives the model with the
mouse, records demos), and for Push-T a pixel-based state estimator and goal-coverage scorer,
scripted policies, policy evaluation in gym-pusht vs inside the model, demos recorded inside the
model, and concatenating datasets (so such demos can be mixed into a training set).

    python rollout.py --ckpt=out/dyn/ckpt.pt --mode=play --port=8765 --record_dir=out/play
    python rollout.py --ckpt=out/dyn/ckpt.pt --mode=policy_eval --num_states=20 --steps=60 --out_dir=out/policy_eval
    python rollout.py --ckpt=out/dyn/ckpt.pt --mode=record_demos --num_episodes=8 --steps=60 --record_dir=out/demos
    python sim_tools.py --concat=data/pusht64,out/demos --out_dir=data/pusht64_plus_demos

Everything a policy sees and everything that is scored is read from frames, in the real simulator
and in the model alike: agent = centroid of the agent mask; T block = centroid and orientation (second
moments, the T's asymmetry resolved by the third moment along its long axis) of the block mask;
coverage = the share of the goal T's pixels (at the env's fixed goal pose) that the block covers.
"""
import base64
import csv
import io
import json
import math
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import numpy as np

import data as D
import metrics as Mx

# ---------------------------------------------------------------------------- defaults (python sim_tools.py)
concat = ''  # comma list of dataset folders to concatenate into out_dir
out_dir = ''
overwrite = False
# ------------------------------------------------------------------------------------

# Push-T geometry (gym_pusht add_tee, scale 30), in the block's body frame; y is not flipped on screen
BAR = (-60.0, 60.0, 0.0, 30.0)  # x0, x1, y0, y1
STEM = (-15.0, 15.0, 30.0, 120.0)
T_CY = (3600 * 15.0 + 2700 * 75.0) / 6300  # area centroid on the body y axis (bar area 3600, stem 2700)
GOAL_POSE = (256.0, 256.0, math.pi / 4)  # gym_pusht's fixed goal (x, y, angle)
WORLD = 512.0
LO, HI = 20.0, 492.0  # commanded targets stay off the walls (as in data.py)


def _axis(theta):
    # the body +y axis (bar -> stem end) in the world
    return np.array([-math.sin(theta), math.cos(theta)])


def t_centroid(pose):
    """Area centroid of the T at pose (x, y, angle) in world units."""
    return np.array(pose[:2], float) + T_CY * _axis(pose[2])


def t_mask(pose, S, sub=4):
    """Fraction (S, S) of each pixel covered by the T at pose, from sub x sub samples per pixel."""
    g = (np.arange(S * sub) + 0.5) / (S * sub) * WORLD
    X, Y = np.meshgrid(g, g)  # (rows = y, cols = x)
    c, s = math.cos(pose[2]), math.sin(pose[2])
    dx, dy = X - pose[0], Y - pose[1]
    bx, by = c * dx + s * dy, -s * dx + c * dy  # world -> body frame (rotate by -angle)
    inside = np.zeros_like(bx, bool)
    for x0, x1, y0, y1 in (BAR, STEM):
        inside |= (bx >= x0) & (bx <= x1) & (by >= y0) & (by <= y1)
    return inside.reshape(S, sub, S, sub).mean((1, 3))


def goal_mask(S):
    """Pixels (S, S) of the goal T (drawn LightGreen at GOAL_POSE): half or more covered."""
    return t_mask(GOAL_POSE, S) >= 0.5


def estimate_state(frames):
    """Push-T state read from uint8 frames (N, S, S, 3), in world units (0..512, y down):
    {'agent': (N, 2), 'block': (N, 3) body origin x, y and angle in [0, 2pi), NaN where not found,
     'masks': segment_pusht's masks}."""
    frames = np.asarray(frames)
    N, S = len(frames), frames.shape[1]
    m = Mx.segment_pusht(frames)
    k = WORLD / S
    agent, block = np.full((N, 2), np.nan), np.full((N, 3), np.nan)
    rows, cols = np.mgrid[0:S, 0:S]
    min_px = 0.25 * 6300 / k ** 2  # a quarter of the T's area: less is too little to measure a pose
    for i in range(N):
        if m['agent'][i].any():
            agent[i] = (cols[m['agent'][i]].mean() + 0.5) * k, (rows[m['agent'][i]].mean() + 0.5) * k
        b = m['block'][i]
        if b.sum() < min_px:
            continue
        p = np.stack([cols[b] + 0.5, rows[b] + 0.5], 1) * k
        c = p.mean(0)
        q = p - c
        w, v = np.linalg.eigh(q.T @ q / len(q))
        u = v[:, 1]  # the long axis: the stem direction (variance ~1214 vs ~718 across)
        if np.mean((q @ u) ** 3) < 0:  # the tail is at the stem's end: make u point bar -> stem
            u = -u
        theta = math.atan2(-u[0], u[1]) % (2 * math.pi)
        block[i] = *(c - T_CY * u), theta
    return {'agent': agent, 'block': block, 'masks': m}


def coverage(masks, goal):
    """Share (N,) of the goal T's pixels covered by the block mask, counted on the pixels the agent
    does not hide (the agent is drawn on top of both)."""
    seen = goal[None] & ~masks['agent']
    return (masks['block'] & seen).sum((1, 2)) / np.maximum(seen.sum((1, 2)), 1)


def angle_diff(a, b):
    """a - b wrapped to [-pi, pi)."""
    return (np.asarray(a) - np.asarray(b) + np.pi) % (2 * np.pi) - np.pi


# ---------------------------------------------------------------------------- scripted Push-T policies
# Each acts for n environments at once from estimated states (NaN where a frame showed nothing).
# A policy remembers the target it last commanded (the agent follows it with a PD controller).

class Hold:
    """Keeps commanding where the agent started: the T never moves unless it already touches."""

    def __init__(self, n, seed=0):
        self.n, self.rng, self.target = n, np.random.default_rng(seed), None

    def _start(self, agent):
        if self.target is None:  # first call: start from where the agent is seen (the middle if it is not)
            self.target = np.where(np.isnan(agent), 256.0, agent).clip(LO, HI)

    def act(self, agent, block):
        self._start(agent)
        return self.target.copy()


class RandomWalk(Hold):
    """Wanders between random waypoints at `speed` per step; pushes the T only by chance."""

    def __init__(self, n, seed=0, speed=20.0):
        super().__init__(n, seed)
        self.speed, self.wp = speed, None

    def act(self, agent, block):
        self._start(agent)
        if self.wp is None:
            self.wp = self.rng.uniform(LO, HI, (self.n, 2))
        d = self.wp - self.target
        dist = np.linalg.norm(d, axis=1, keepdims=True)
        self.target = np.where(dist <= self.speed, self.wp, self.target + d / np.maximum(dist, 1e-9) * self.speed)
        new = (dist[:, 0] <= self.speed)
        self.wp[new] = self.rng.uniform(LO, HI, (int(new.sum()), 2))
        return self.target.copy()


class Pusher(Hold):
    """A pushing heuristic that drives the T toward the goal pose: push the T's centre straight toward
    the goal's centre until it is within 40 units, then, while the angle is off by more than `rot_tol`,
    push tangentially at an end of the bar or stem (turns the T about its centre; the end whose push
    also helps the translation), else finish the translation. Walks to each contact around the T,
    not through it. `speed` = max target motion per step, `noise` = std of Gaussian noise on every
    action, `rotate=False` only translates."""

    def __init__(self, n, seed=0, speed=20.0, noise=0.0, rotate=True, rot_tol=0.3, pos_tol=8.0):
        super().__init__(n, seed)
        self.speed, self.noise, self.rotate, self.rot_tol, self.pos_tol = speed, noise, rotate, rot_tol, pos_tol
        self.push_end = [None] * n  # in a push: where the push ends

    def _plan(self, block):
        """Pre-contact point and push (direction, length) for one T pose, or None when at the goal."""
        c = t_centroid(block)
        dth = float(angle_diff(GOAL_POSE[2], block[2]))
        d = t_centroid(GOAL_POSE) - c
        dist = float(np.linalg.norm(d))
        if self.rotate and abs(dth) > self.rot_tol and dist < 40:  # near the goal: turn it
            plans = []
            for p in ((55.0, 15.0), (-55.0, 15.0), (0.0, 110.0)):  # the bar's ends and the stem's end
                p = np.array(block[:2]) + _rot(block[2]) @ np.array(p)
                r = p - c
                t = math.copysign(1.0, dth) * np.array([-r[1], r[0]]) / np.linalg.norm(r)  # torque sign = sign(dth)
                pre = p - t * 35  # the contact is inside the T: start clear of it
                # prefer the push that also moves the T toward the goal, reachable off the walls
                cost = -float(t @ d) / max(dist, 1.0) + 10.0 * (not LO <= pre.min() <= pre.max() <= HI)
                plans.append((cost, pre, t, float(np.clip(abs(dth) * np.linalg.norm(r), 15, 50)) + 20))
            return min(plans, key=lambda q: q[0])[1:]
        if dist < self.pos_tol:
            return None
        u = d / dist
        # where the line through the centre leaves the T behind it: the contact point
        h = np.arange(0.0, 130.0, 2.0)
        pts = c - u * h[:, None]
        b = (pts - np.array(block[:2])) @ _rot(block[2])  # world -> body frame
        inside = np.zeros(len(h), bool)
        for x0, x1, y0, y1 in (BAR, STEM):
            inside |= (b[:, 0] >= x0) & (b[:, 0] <= x1) & (b[:, 1] >= y0) & (b[:, 1] <= y1)
        back = float(h[inside].max()) if inside.any() else 0.0
        return c - u * (back + 25), u, min(dist, 60.0) + 10

    def act(self, agent, block):
        self._start(agent)
        for i in range(self.n):
            if self.push_end[i] is None:  # walking to the next contact (replanned every step)
                if np.isnan(block[i]).any():
                    continue
                plan = self._plan(block[i])
                if plan is None:
                    continue
                pre, u, length = plan
                pre = pre.clip(LO, HI)
                if np.linalg.norm(pre - self.target[i]) <= self.speed:
                    self.target[i] = pre
                    self.push_end[i] = (pre + u * length).clip(LO, HI)
                else:
                    wp = _detour(self.target[i], pre, t_centroid(block[i]))
                    self.target[i] = self._toward(self.target[i], np.clip(wp, LO, HI))
            else:  # pushing through
                self.target[i] = self._toward(self.target[i], self.push_end[i])
                if np.linalg.norm(self.push_end[i] - self.target[i]) < 1e-6:
                    self.push_end[i] = None
        a = self.target + (self.rng.normal(0, self.noise, (self.n, 2)) if self.noise > 0 else 0)
        return a.clip(LO, HI)

    def _toward(self, x, goal):
        d = goal - x
        dist = np.linalg.norm(d)
        return goal.copy() if dist <= self.speed else x + d / dist * self.speed


def _detour(start, goal, c, clear=115.0):
    """Next waypoint from start to goal around the T (centre c): straight when the path misses the T
    or the goal is within 45 degrees around it, else 60 degrees further round on a circle that clears it."""
    d = goal - start
    t = np.clip(np.dot(c - start, d) / max(np.dot(d, d), 1e-9), 0, 1)
    a0, a1 = math.atan2(*(start - c)[::-1]), math.atan2(*(goal - c)[::-1])
    da = (a1 - a0 + math.pi) % (2 * math.pi) - math.pi
    if np.linalg.norm(start + t * d - c) > 85 or abs(da) < math.pi / 4:
        return goal
    a = a0 + math.copysign(min(abs(da), math.pi / 3), da)
    return c + clear * np.array([math.cos(a), math.sin(a)])


def _rot(theta):
    c, s = math.cos(theta), math.sin(theta)
    return np.array([[c, -s], [s, c]])


# name -> constructor(n, seed); roughly best to worst
POLICIES = {
    'push': lambda n, s: Pusher(n, s),
    'push_noisy': lambda n, s: Pusher(n, s, noise=25.0),
    'push_very_noisy': lambda n, s: Pusher(n, s, noise=60.0),
    'push_slow': lambda n, s: Pusher(n, s, speed=6.0),
    'push_no_rotate': lambda n, s: Pusher(n, s, rotate=False),
    'random_walk': lambda n, s: RandomWalk(n, s),
    'hold': lambda n, s: Hold(n, s),
}


# ---------------------------------------------------------------------------- policy evaluation

def sample_states(n, seed=0):
    """Start states [agent_x, agent_y, block_x, block_y, block_angle] (gym_pusht reset_to_state):
    the T anywhere in the middle of the table at any angle, the agent clear of it."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        b = [*rng.uniform(150, 362, 2), rng.uniform(0, 2 * math.pi)]
        a = rng.uniform(60, 452, 2)
        if np.linalg.norm(a - t_centroid(b)) > 110:  # reset_to_state does not resolve overlaps
            out.append([*a, *b])
    return np.array(out)


def make_env(S):
    os.environ.setdefault('SDL_VIDEODRIVER', 'dummy')  # headless: pygame never opens a window
    os.environ.setdefault('PYGAME_HIDE_SUPPORT_PROMPT', '1')
    from gym_pusht.envs.pusht import PushTEnv
    return PushTEnv(obs_type='pixels', render_mode='rgb_array', observation_width=S, observation_height=S)


def run_policies(names, first, steps, step_fn, seed=0, on_step=None):
    """Drive len(names) x E environments (policy-major) for `steps` steps from first frames (E, S, S, 3):
    each policy sees the state estimated from the frames. step_fn(actions (N, 2)) -> frames (N, S, S, 3).
    Returns the final frames, the actions (N, steps, 2), the estimated states (N, steps+1, 5) and the
    final frames' estimate (with their masks)."""
    E = len(first)
    pols = [POLICIES[p](E, seed + k) for k, p in enumerate(names)]
    frames = np.concatenate([first] * len(names))
    est_log, act_log = [], []
    for t in range(steps + 1):
        est = estimate_state(frames)
        est_log.append(np.concatenate([est['agent'], est['block']], 1))
        if on_step is not None:
            on_step(t, frames, est)
        if t == steps:
            acts = np.stack(act_log, 1) if act_log else np.zeros((len(frames), 0, 2), np.float32)
            return frames, acts, np.stack(est_log, 1), est
        a = np.concatenate([pol.act(est['agent'][k * E:(k + 1) * E], est['block'][k * E:(k + 1) * E])
                            for k, pol in enumerate(pols)]).astype(np.float32)
        act_log.append(a)
        frames = step_fn(a)


class RealSim:
    """N gym-pusht environments behind the same step(actions) -> frames interface as the model."""

    def __init__(self, states, S):
        self.envs = [make_env(S) for _ in states]
        self.first = np.stack([e.reset(options={'reset_to_state': list(map(float, s))})[0] for e, s in zip(self.envs, states)])

    def truth(self):
        """(N, 5) true agent and block pose (block body origin, as estimate_state reports it), and the env's coverage."""
        st = np.array([[*e.agent.position, *e.block.position, e.block.angle % (2 * math.pi)] for e in self.envs])
        return st, np.array([e._get_coverage() for e in self.envs])

    def step(self, actions):
        return np.stack([e.step(np.asarray(a, np.float64))[0] for e, a in zip(self.envs, actions)])


DEFAULT_POLICIES = 'push,push_noisy,push_very_noisy,push_slow,random_walk,hold'


def _require_pusht(ck):
    meta = ck['data']['meta']
    if ck['action_dim'] != 2 or 'pusht' not in str(meta.get('source', '')).lower().replace('-', '').replace('_', ''):
        raise SystemExit(f"the scripted policies and the coverage score are Push-T's; this checkpoint's data is "
                         f"{meta.get('source')!r} with {ck['action_dim']}-d actions")


def _policy_names(spec):
    names = [p.strip() for p in (spec or DEFAULT_POLICIES).split(',') if p.strip()]
    bad = [p for p in names if p not in POLICIES]
    if bad or not names:
        raise SystemExit(f"unknown policies {bad}; known: {', '.join(POLICIES)}")
    return names


def _ranks(x):
    # average ranks, ties shared (for Spearman)
    x = np.asarray(x, float)
    order = np.argsort(x, kind='mergesort')
    r = np.empty(len(x))
    r[order] = np.arange(len(x))
    for v in np.unique(x):
        r[x == v] = r[x == v].mean()
    return r


def pearson(x, y):
    """Pearson r, None when either side is constant (undefined)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def spearman(x, y):
    return pearson(_ranks(x), _ranks(y))


def scatter_png(path, xs, ys, labels, title, note=''):
    """Scatter of real (x) vs model (y) scores with the diagonal and a legend, drawn with PIL; both axes
    run from 0 to the smallest tenth above the largest score (at most 1), so small scores stay readable."""
    from PIL import Image, ImageDraw
    W, m = 520, 60
    lim = min(1.0, max(0.1, math.ceil(max(list(xs) + list(ys) + [0.0]) * 10 + 1e-9) / 10))
    img = Image.new('RGB', (W, W), 'white')
    d = ImageDraw.Draw(img)
    px = lambda x, y: (m + x / lim * (W - 2 * m), W - m - y / lim * (W - 2 * m))
    d.rectangle([px(0, lim), px(lim, 0)], outline='black')
    for k in range(6):  # 5 tick intervals
        v = lim * k / 5
        d.line([px(v, 0), (px(v, 0)[0], px(v, 0)[1] + 5)], fill='black')
        d.line([px(0, v), (px(0, v)[0] - 5, px(0, v)[1])], fill='black')
        d.text((px(v, 0)[0] - 8, px(v, 0)[1] + 8), f"{v:.2f}", fill='black')
        d.text((px(0, v)[0] - 36, px(0, v)[1] - 6), f"{v:.2f}", fill='black')
    for k in range(50):  # dashed diagonal: model == real
        if k % 2 == 0:
            d.line([px(lim * k / 50, lim * k / 50), px(lim * (k + 1) / 50, lim * (k + 1) / 50)], fill=(160, 160, 160))
    colours = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
               (227, 119, 194), (127, 127, 127)]
    for k, (x, y, name) in enumerate(zip(xs, ys, labels)):
        cx, cy = px(min(max(x, 0), lim), min(max(y, 0), lim))
        col = colours[k % len(colours)]
        d.ellipse([cx - 5, cy - 5, cx + 5, cy + 5], fill=col)
        lx, ly = px(0, lim)[0] + 10, px(0, lim)[1] + 8 + 14 * k  # legend, top left inside the axes
        d.ellipse([lx, ly + 2, lx + 8, ly + 10], fill=col)
        d.text((lx + 14, ly), f"{name} ({x:.2f}, {y:.2f})", fill=col)
    d.text((m, 15), title, fill='black')
    d.text((m, 32), note, fill='black')
    d.text((W // 2 - 60, W - 25), 'real simulator (gym-pusht)', fill='black')
    d.text((5, m - 20), 'world model', fill='black')
    img.save(path)


def policy_eval(cfg):
    """Each policy from the same start states in gym-pusht and inside the world model, scored alike."""
    import torch
    import rollout
    from common import pick_device, save_grid
    torch.manual_seed(cfg['seed'])
    dev = pick_device(cfg['device'])
    dyn, enc, dec, ck = rollout.load_world_model(cfg['ckpt'], dev, cfg['ae_ckpt'])
    _require_pusht(ck)
    S, E, H, thr = ck['data']['image_size'], cfg['num_states'], cfg['steps'], cfg['success_threshold']
    names = _policy_names(cfg['policies'])
    P = len(names)
    goal = goal_mask(S)
    states = sample_states(E, cfg['seed'])
    print(f"policy evaluation: {P} policies x {E} start states x {H} steps at {S}x{S}, success = pixel coverage > {thr}")

    t0 = time.time()
    real = RealSim(np.concatenate([states] * P), S)
    first = real.first[:E]
    err = []  # the estimator against the env's internals, every step of the real runs

    def check(t, frames, est):
        truth, _ = real.truth()
        err.append(np.stack([np.linalg.norm(est['agent'] - truth[:, :2], axis=1),
                             np.linalg.norm(est['block'][:, :2] - truth[:, 2:4], axis=1),
                             np.abs(angle_diff(est['block'][:, 2], truth[:, 4]))], 1))

    fr_real, _, _, est_real = run_policies(names, first, H, real.step, cfg['seed'], on_step=check)
    env_cov = real.truth()[1]
    t_real = time.time() - t0
    print(f"real simulator: {t_real:.0f} s")

    t0 = time.time()
    sim = rollout.Simulator(dyn, enc, dec, ck, cfg['window'], cfg['ctx_level'], cfg['dyn_steps'], cfg['decode_steps'], cfg['seed'])
    sim.reset(np.concatenate([first] * P))  # all policies x states in one batch: one model call per step

    def progress(t, frames, est):
        if t and (t % 10 == 0 or t == H):
            print(f"world model: step {t}/{H}, {time.time() - t0:.0f} s", flush=True)

    fr_model, _, _, est_model = run_policies(names, first, H, sim.step, cfg['seed'], on_step=progress)
    t_model = time.time() - t0

    cov_r, cov_m = coverage(est_real['masks'], goal).reshape(P, E), coverage(est_model['masks'], goal).reshape(P, E)
    cov0 = coverage(estimate_state(first)['masks'], goal)
    rows = []
    for k, name in enumerate(names):
        rows.append({'policy': name, 'real_coverage': float(cov_r[k].mean()), 'model_coverage': float(cov_m[k].mean()),
                     'real_success': float((cov_r[k] > thr).mean()), 'model_success': float((cov_m[k] > thr).mean()),
                     'real_env_coverage': float(env_cov.reshape(P, E)[k].mean()), 'num_states': E})
    col = lambda key: [r[key] for r in rows]
    err = np.concatenate(err)
    out = {
        'policies': rows,
        'correlation': {'coverage': {'pearson': pearson(col('real_coverage'), col('model_coverage')),
                                     'spearman': spearman(col('real_coverage'), col('model_coverage'))},
                        'success': {'pearson': pearson(col('real_success'), col('model_success')),
                                    'spearman': spearman(col('real_success'), col('model_success'))},
                        'per_episode_coverage_pearson': pearson(cov_r.ravel(), cov_m.ravel())},
        'per_state': {'real_coverage': cov_r.round(4).tolist(), 'model_coverage': cov_m.round(4).tolist(),
                      'start_coverage': cov0.round(4).tolist()},
        'start_states': states.round(3).tolist(),
        'estimator_error_real': {'agent_units_median': float(np.nanmedian(err[:, 0])),
                                 'block_units_median': float(np.nanmedian(err[:, 1])),
                                 'block_angle_rad_median': float(np.nanmedian(err[:, 2])),
                                 'block_not_found': float(np.isnan(err[:, 1]).mean())},
        'success_threshold': thr, 'steps': H, 'num_states': E, 'seconds': {'real': t_real, 'model': t_model},
        'knobs': {k: cfg[k] for k in ('window', 'ctx_level', 'dyn_steps', 'decode_steps', 'seed')},
        'ckpt': os.path.abspath(cfg['ckpt']), 'device': dev,
    }
    od = cfg['out_dir']
    os.makedirs(od, exist_ok=True)
    with open(os.path.join(od, 'policy_eval.json'), 'w') as f:
        json.dump(out, f, indent=1)
    with open(os.path.join(od, 'policy_eval.csv'), 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    c = out['correlation']['coverage']
    fmt = lambda v: 'n/a' if v is None else f"{v:.2f}"
    scatter_png(os.path.join(od, 'policy_eval.png'), col('real_coverage'), col('model_coverage'), names,
                f"final goal coverage, {E} states x {H} steps", f"Pearson {fmt(c['pearson'])}, Spearman {fmt(c['spearman'])}")
    # final frames: one row per policy, real | model for the first few states
    show = min(E, 4)
    save_grid(os.path.join(od, 'final_frames.png'),
              [np.concatenate([np.stack([fr_real[k * E + j], fr_model[k * E + j]]) for j in range(show)]) for k in range(P)])

    print(f"\n{'policy':>16} {'real cov':>9} {'model cov':>9} {'real succ':>9} {'model succ':>10}")
    for r in rows:
        print(f"{r['policy']:>16} {r['real_coverage']:9.3f} {r['model_coverage']:9.3f} {r['real_success']:9.2f} {r['model_success']:10.2f}")
    print(f"coverage across policies: Pearson {fmt(c['pearson'])}, Spearman {fmt(c['spearman'])}; "
          f"success: Pearson {fmt(out['correlation']['success']['pearson'])}, Spearman {fmt(out['correlation']['success']['spearman'])}")
    print(f"real {t_real:.0f} s, model {t_model:.0f} s; wrote {od}/policy_eval.json, .csv, .png and final_frames.png")
    return out


def held_out_starts(ds, ck, n, rng):
    """n real frames from the checkpoint's held-out episodes (random episode, random frame)."""
    ranges = D.episode_ranges(ds['episode_ends'])
    ids = [i for i in ck['data']['val_ids'] if i < len(ranges)] or list(range(len(ranges)))
    pick = [ranges[ids[j]] for j in rng.integers(0, len(ids), n)]
    return np.stack([np.asarray(ds['frames'][rng.integers(s, e)]) for s, e in pick])


def record_demos(cfg):
    """A scripted policy drives the world model from held-out real frames; the episodes (model frames and
    the actions sent) are written as one dataset folder, record_dir, in the project's format."""
    import torch
    import rollout
    from common import pick_device
    torch.manual_seed(cfg['seed'])
    dev = pick_device(cfg['device'])
    dyn, enc, dec, ck = rollout.load_world_model(cfg['ckpt'], dev, cfg['ae_ckpt'])
    _require_pusht(ck)
    name = _policy_names(cfg['demo_policy'])[0]
    ds = D.load_dataset(cfg['data_dir'] or ck['data']['data_dir'])
    if os.path.isdir(cfg['record_dir']) and os.listdir(cfg['record_dir']):  # refuse before the rollout, not after
        raise SystemExit(f"{cfg['record_dir']}: folder exists and is not empty; record_demos writes a new dataset there")
    n, H = cfg['num_episodes'], cfg['steps']
    first = held_out_starts(ds, ck, n, np.random.default_rng(cfg['seed']))
    sim = rollout.Simulator(dyn, enc, dec, ck, cfg['window'], cfg['ctx_level'], cfg['dyn_steps'], cfg['decode_steps'], cfg['seed'])
    sim.reset(first)
    frames = []
    t0 = time.time()
    _, acts, _, _ = run_policies([name], first, H, sim.step, cfg['seed'], on_step=lambda t, f, e: frames.append(f))
    frames = np.stack(frames, 1)  # (n, H+1, S, S, 3)
    acts = np.concatenate([acts, acts[:, -1:]], 1)  # the last frame's action has no next frame: repeat the last
    meta = {k: ck['data']['meta'][k] for k in ('fps', 'action_low', 'action_high')}
    meta.update(source=f"world model {os.path.abspath(cfg['ckpt'])}, scripted Push-T policy {name!r} (rollout.py --mode=record_demos)",
                policy=name, steps=H, seed=cfg['seed'])
    D.write_dataset(cfg['record_dir'], list(frames), list(acts), meta)
    print(f"{n} episodes x {H + 1} frames recorded inside the model with policy {name!r} in {time.time() - t0:.0f} s; "
          f"wrote {cfg['record_dir']}")


def concat_datasets(dirs, out, overwrite=False):
    """Write the episodes of several datasets, in order, as one new dataset (e.g. play data + demos)."""
    if len(dirs) < 1:
        raise SystemExit("concat needs at least one dataset folder")
    dss = [D.load_dataset(d) for d in dirs]
    m0 = dss[0]['meta']
    for d, ds in zip(dirs, dss):
        m = ds['meta']
        if (m['image_size'], m['action_dim'], m['fps']) != (m0['image_size'], m0['action_dim'], m0['fps']):
            raise SystemExit(f"{d}: image size / action dim / fps {m['image_size']}, {m['action_dim']}, {m['fps']} differ "
                             f"from {dirs[0]}: {m0['image_size']}, {m0['action_dim']}, {m0['fps']}")
    frames, actions, states = [], [], []
    with_states = all(ds['states'] is not None for ds in dss) and len({ds['states'].shape[1] for ds in dss}) == 1
    for ds in dss:
        for s, e in D.episode_ranges(ds['episode_ends']):  # memory-mapped slices: read while writing
            frames.append(ds['frames'][s:e])
            actions.append(ds['actions'][s:e])
            if with_states:
                states.append(ds['states'][s:e])
    meta = {'fps': m0['fps'],
            'action_low': np.min([ds['meta']['action_low'] for ds in dss], 0).tolist(),
            'action_high': np.max([ds['meta']['action_high'] for ds in dss], 0).tolist(),
            'source': 'concatenation of ' + '; '.join(f"{os.path.abspath(d)} ({ds['meta']['source']})" for d, ds in zip(dirs, dss)),
            'parts': [{'data_dir': os.path.abspath(d), 'num_episodes': len(ds['episode_ends'])} for d, ds in zip(dirs, dss)]}
    D.write_dataset(out, frames, actions, meta, states if with_states else None, overwrite=overwrite)
    print(f"wrote {out}: {len(frames)} episodes from {len(dirs)} datasets")


# ---------------------------------------------------------------------------- live play (rollout.py --mode=play)
PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>world model: play</title>
<style>
 body { font-family: sans-serif; margin: 16px; }
 canvas { border: 1px solid #888; cursor: crosshair; width: 512px; height: 512px; }
 button { margin: 8px 8px 0 0; font-size: 15px; }
 #rec.on { background: #d33; color: white; }
</style></head><body>
<canvas id="view" width="512" height="512"></canvas>
<div><button id="reset">reset (held-out frame)</button><button id="rec">record</button>
<span id="fps">fps: -</span> &middot; <span id="status">starting</span></div>
<p id="help"></p>
<script>
const info = __INFO__;  // filled in by the server: the action space and frame size
const cv = document.getElementById('view'), ctx = cv.getContext('2d');
const lo = info.action_low, hi = info.action_high, A = info.action_dim;
const clamp = (v, a, b) => Math.min(Math.max(v, a), b);
let action = lo.map((l, i) => (l + hi[i]) / 2);  // start in the middle of the action space
let recording = false;
window.sim = {frames: 0, last: null, error: null};  // read by the browser test
document.getElementById('help').textContent = info.mouse
  ? 'Move the mouse over the frame: the pointer is the target of the agent (action space ' + lo + ' .. ' + hi + ').'
  : 'Arrow keys move the target in the first two action dimensions (' + A + '-d actions, the others held at the middle).';
// the pointer over the frame is the target: pixel -> action space (Push-T: [0, 512]^2, y down like the frame)
cv.addEventListener('mousemove', e => {
  if (!info.mouse) return;
  const r = cv.getBoundingClientRect();
  action[0] = lo[0] + clamp((e.clientX - r.left) / r.width, 0, 1) * (hi[0] - lo[0]);
  action[1] = lo[1] + clamp((e.clientY - r.top) / r.height, 0, 1) * (hi[1] - lo[1]);
});
document.addEventListener('keydown', e => {
  const k = {ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [1, -1], ArrowDown: [1, 1]}[e.key];
  if (!k || k[0] >= A) return;
  e.preventDefault();
  const i = k[0];
  action[i] = clamp(action[i] + k[1] * 0.05 * (hi[i] - lo[i]), lo[i], hi[i]);
});
async function post(path, body) {
  const r = await fetch(path, {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)});
  const j = await r.json();
  if (!r.ok) throw new Error(j.error || r.status);
  return j;
}
function show(j) {
  const img = new Image();
  img.onload = () => {
    ctx.imageSmoothingEnabled = false;  // nearest-neighbour upscaling
    ctx.drawImage(img, 0, 0, cv.width, cv.height);
    if (A >= 2 && j.action) {  // the target that produced this frame, as a red cross
      const x = (j.action[0] - lo[0]) / (hi[0] - lo[0]) * cv.width, y = (j.action[1] - lo[1]) / (hi[1] - lo[1]) * cv.height;
      ctx.strokeStyle = 'red'; ctx.lineWidth = 2; ctx.beginPath();
      ctx.moveTo(x - 8, y); ctx.lineTo(x + 8, y); ctx.moveTo(x, y - 8); ctx.lineTo(x, y + 8); ctx.stroke();
    }
  };
  img.src = 'data:image/png;base64,' + j.frame;
  recording = j.recording;
  document.getElementById('rec').className = recording ? 'on' : '';
  document.getElementById('rec').textContent = recording ? 'stop recording (' + j.recorded + ' frames)' : 'record';
  document.getElementById('status').textContent = 'step ' + j.step + (j.saved ? ' - saved ' + j.saved : '');
  window.sim.last = j;
}
document.getElementById('reset').onclick = async () => show(await post('/reset', {}));
document.getElementById('rec').onclick = async () => show(await post('/record', {on: !recording}));
// the loop: send the current action, draw the next frame, again; frames keep coming whatever the pointer does
async function loop() {
  let n = 0, t0 = performance.now();
  for (;;) {
    try {
      show(await post('/step', {action: action.slice()}));
      window.sim.frames++; n++;
    } catch (e) {
      window.sim.error = String(e);
      document.getElementById('status').textContent = 'error: ' + e;
      await new Promise(r => setTimeout(r, 500));
    }
    const t = performance.now();
    if (t - t0 > 1000) { document.getElementById('fps').textContent = (n * 1000 / (t - t0)).toFixed(1) + ' fps'; n = 0; t0 = t; }
  }
}
loop();
</script></body></html>
"""
MAX_BODY = 4096  # bytes: an action is a few numbers


class HTTPError(Exception):
    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code


class Play:
    """One live session of the world model: the current frame, resets from held-out real frames, and
    recording (frames seen + actions sent) into the dataset format. All calls hold one lock."""

    def __init__(self, cfg, sim, ck, ds):
        self.cfg, self.sim, self.ck, self.ds = cfg, sim, ck, ds
        meta = ck['data']['meta']
        self.low = np.asarray(meta['action_low'], np.float64)
        self.high = np.asarray(meta['action_high'], np.float64)
        self.lock = threading.Lock()
        self.rng = np.random.default_rng(cfg['seed'])
        self.rec = None  # while recording: {'episodes': [...], 'frames': [...], 'actions': [...]}
        self.steps, self.last_action, self.saved = 0, None, None
        self.reset()

    def info(self):
        meta = self.ck['data']['meta']
        src = str(meta.get('source', '')).lower().replace('-', '').replace('_', '')
        return {'image_size': self.sim.S, 'action_dim': self.sim.A, 'action_low': self.low.tolist(),
                'action_high': self.high.tolist(), 'fps': meta.get('fps', 10), 'mouse': self.sim.A == 2 and 'pusht' in src,
                'steps': self.steps, 'last_action': self.last_action, 'recording': self.rec is not None}

    def reset(self):
        with self.lock:
            self.frame = self.sim.reset(held_out_starts(self.ds, self.ck, 1, self.rng))[0]
            self.steps = 0
            if self.rec is not None:  # a reset ends the recorded episode; the next one starts here
                self._close_episode()
                self.rec['frames'] = [self.frame]
            return self._reply()

    def step(self, action):
        a = np.asarray(action, np.float64)
        with self.lock:
            self.frame = self.sim.step(a[None].astype(np.float32))[0]
            self.steps += 1
            self.last_action = a.tolist()
            if self.rec is not None:
                self.rec['actions'].append(a.astype(np.float32))
                self.rec['frames'].append(self.frame)
                if sum(len(f) for f, _ in self.rec['episodes']) + len(self.rec['frames']) >= self.cfg['max_record_steps']:
                    self._stop()
            return self._reply()

    def record(self, on):
        with self.lock:
            if on and self.rec is None:
                self.rec, self.saved = {'episodes': [], 'frames': [self.frame], 'actions': []}, None
            elif not on and self.rec is not None:
                self._stop()
            return self._reply()

    def _close_episode(self):
        f, a = self.rec['frames'], self.rec['actions']
        if len(a) >= 1:  # an episode needs a step; the last frame's action (no next frame) repeats the last sent
            self.rec['episodes'].append((np.stack(f), np.stack(a + [a[-1]])))
        self.rec['frames'], self.rec['actions'] = [], []

    def _stop(self):
        self._close_episode()
        eps = self.rec['episodes']
        if eps:
            path = os.path.join(self.cfg['record_dir'], time.strftime('play-%Y%m%d-%H%M%S'))
            n = 1
            while os.path.exists(path if n == 1 else f"{path}-{n}"):
                n += 1
            path = path if n == 1 else f"{path}-{n}"
            meta = {key: self.ck['data']['meta'][key] for key in ('fps', 'action_low', 'action_high')}
            meta['source'] = f"world model {os.path.abspath(self.cfg['ckpt'])}, driven live (rollout.py --mode=play)"
            try:
                os.makedirs(self.cfg['record_dir'], exist_ok=True)
                D.write_dataset(path, [f for f, _ in eps], [a for _, a in eps], meta)
            except Exception:
                self.rec['frames'] = [self.frame]  # keep recording: nothing is lost, stop can be retried
                raise
            print(f"recorded {len(eps)} episode(s), {sum(len(f) for f, _ in eps)} frames: {path}", flush=True)
        self.rec, self.saved = None, (path if eps else None)

    def _reply(self):
        from PIL import Image
        buf = io.BytesIO()
        Image.fromarray(self.frame).save(buf, format='PNG')
        n = 0 if self.rec is None else sum(len(f) for f, _ in self.rec['episodes']) + len(self.rec['frames'])
        return {'frame': base64.b64encode(buf.getvalue()).decode(), 'step': self.steps, 'recording': self.rec is not None,
                'recorded': n, 'saved': self.saved, 'action': self.last_action if self.steps else None}

    def parse_action(self, body):
        a = body.get('action') if isinstance(body, dict) else None
        if not isinstance(a, list) or len(a) != self.sim.A:
            raise HTTPError(400, f"'action' must be a list of {self.sim.A} numbers")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in a):
            raise HTTPError(400, "action values must be finite numbers")
        if np.any(np.asarray(a) < self.low) or np.any(np.asarray(a) > self.high):
            raise HTTPError(400, f"action {a} is outside the action space {self.low.tolist()} .. {self.high.tolist()}")
        return a


def _no_constant(c):
    raise ValueError(f"{c} is not a JSON number")


class PlayHandler(BaseHTTPRequestHandler):
    timeout = 30  # an idle browser connection never holds its thread for long

    def log_message(self, fmt, *args):  # quiet: one line per frame would flood the terminal
        pass

    def _send(self, code, obj, ctype='application/json'):
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(code)
        self.send_header('Content-Type', ctype)
        self.send_header('Content-Length', str(len(body)))
        self.send_header('Cache-Control', 'no-store')
        self.end_headers()
        self.wfile.write(body)

    def _body(self):
        try:
            n = int(self.headers.get('Content-Length') or 0)
        except ValueError:
            raise HTTPError(400, "bad Content-Length")
        if n < 0:
            raise HTTPError(400, "bad Content-Length")
        if n > MAX_BODY:
            self.close_connection = True  # the unread body must not be parsed as the next request
            raise HTTPError(413, f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(n) if n else b'{}'
        try:  # NaN / Infinity literals are not JSON numbers
            body = json.loads(raw.decode('utf-8'), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError):
            raise HTTPError(400, "body is not valid JSON")
        if not isinstance(body, dict):
            raise HTTPError(400, "body must be a JSON object")
        return body

    def _handle(self, fn):
        try:
            try:
                fn()
            except HTTPError as e:
                self._send(e.code, {'error': str(e)})
            except OSError as e:
                if isinstance(e, ConnectionError):
                    raise
                self._send(500, {'error': f"{type(e).__name__}: {e}"})
            except Exception as e:  # keep serving whatever happened (e.g. the record folder is not writable)
                self._send(500, {'error': f"{type(e).__name__}: {e}"})
        except ConnectionError:  # the page went away mid-request (a closed tab): nothing to answer
            self.close_connection = True

    def do_GET(self):
        play, path = self.server.play, urlsplit(self.path).path

        def get():
            if path == '/':
                self._send(200, PAGE.replace('__INFO__', json.dumps(play.info())).encode(), 'text/html; charset=utf-8')
            elif path == '/info':
                self._send(200, play.info())
            elif path in ('/step', '/reset', '/record'):
                raise HTTPError(405, f"{path} takes POST")
            else:
                raise HTTPError(404, f"no such path {path!r}")
        self._handle(get)

    def do_POST(self):
        play, path = self.server.play, urlsplit(self.path).path

        def post():
            if path not in ('/step', '/reset', '/record'):
                self.close_connection = True
                raise HTTPError(404, f"no such path {path!r}")
            body = self._body()
            if path == '/step':
                self._send(200, play.step(play.parse_action(body)))
            elif path == '/reset':
                self._send(200, play.reset())
            else:
                on = body.get('on', play.rec is None)  # no 'on': toggle
                if not isinstance(on, bool):
                    raise HTTPError(400, "'on' must be true or false")
                self._send(200, play.record(on))
        self._handle(post)

    def _not_allowed(self):
        self._send(405, {'error': f"method {self.command} not allowed"})

    do_PUT = do_DELETE = do_PATCH = _not_allowed


def make_play_server(cfg, sim, ck, ds):
    """A threading HTTP server (one model call at a time, under Play's lock) on cfg host:port; port 0 = any free one."""
    srv = ThreadingHTTPServer((cfg['host'], cfg['port']), PlayHandler)
    srv.daemon_threads = True
    srv.play = Play(cfg, sim, ck, ds)
    return srv


if __name__ == '__main__':
    from common import config_from_globals
    cfg = config_from_globals(globals())
    if not cfg['concat'] or not cfg['out_dir']:
        raise SystemExit("usage: python sim_tools.py --concat=DIR1,DIR2[,...] --out_dir=NEW_DIR [--overwrite=True]")
    concat_datasets([d for d in cfg['concat'].split(',') if d], cfg['out_dir'], cfg['overwrite'])
