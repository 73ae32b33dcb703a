"""
Everything that knows Push-T (gym-pusht, Chi et al. 2023) is here; the core scripts never import it.

    python pusht.py --mode=collect --data_dir=data/pusht64 --num_episodes=200 --episode_len=200 --image_size=64
    python pusht.py --mode=eval --ckpt=out/dyn/ckpt.pt --num_episodes=16 --horizon=192 --out_dir=out/eval
    python pusht.py --mode=policy_eval --ckpt=out/dyn/ckpt.pt --num_states=20 --steps=60 --out_dir=out/policy_eval
    python pusht.py --mode=record_demos --ckpt=out/dyn/ckpt.pt --num_episodes=8 --steps=60 --record_dir=out/demos
    python pusht.py --mode=replay --ckpt=out/dyn/ckpt.pt --num_episodes=16 --horizon=192 --out_dir=out/replay

What it holds, top to bottom (one copy of each idea):
- the T: its geometry (TEE_RECTS, TEE_CENTROID, GOAL_POSE, SIM_SIZE), THE pose convention, body <->
  world coordinates, the one pixel renderer of the T (tee_fraction; tee_mask and goal_mask on top of
  it), angle_diff (the one angle wrap), env_state and make_env (gym-pusht's state and environment);
- reading frames: segment_pusht (pixel classes by the renderer's colours), min_pixels (the one
  "found" rule for the agent and the block), agent_position, block_pose (centroid + angle of the T),
  estimate_state (the state in gym-pusht's units, built on block_pose), goal_coverage,
  pusht_detectable, block_shape_iou;
- physics(): per-frame errors of a predicted frame against the true one (the open-loop evaluation's
  extra scores);
- route_around: how the agent walks round the T instead of through it (the collector and the Pusher);
- the play-data collector (generate_pusht; its meta.json declares the action an image point, so the
  dynamics may draw it as a map), and is_pusht: is a dataset (its meta.json) gym-pusht's?
- scripted policies (Hold, RandomWalk, Pusher; POLICIES), start states, policy evaluation: the same
  policies from the same start states in gym-pusht and inside the world model, scored on goal
  coverage read from the frames (policy_eval);
- demos recorded inside the model (record_demos), the open-loop evaluation with the physics scores
  added (evaluate = rollout.main with physics as its extra score), the same evaluation of gym-pusht
  itself started slightly off (replay: what physics alone loses over a long open loop), and the command line.

Everything a policy sees and everything that is scored is read from frames, in the real simulator
and in the model alike.
"""
import csv
import json
import math
import os
import time

import numpy as np
import torch
from tqdm import tqdm

import data as D
import rollout
from common import config_from_globals, load_checkpoint, pick_device, save_grid


# -----------------------------------------------------------------------------
# The T, its pose convention, and gym-pusht's state
#
# The T (gym-pusht PushTEnv.add_tee, scale 30, length 4), in the block's body frame (sim units):
#   bar  x in [-60, 60], y in [0, 30]     (area 3600)
#   stem x in [-15, 15], y in [30, 120]   (area 2700)
# THE pose convention, used everywhere in this file: a pose is (x, y, angle) = the body origin in sim
# (world) units, 0..SIM_SIZE, and the body angle in radians; it is what gym-pusht reports as
# env.block.position / env.block.angle and what states.npy holds. The body origin is the middle of the
# bar's outer edge, NOT the centroid: the area centroid is at TEE_CENTROID = (0, 40.71) in the body
# frame (pymunk's centre of gravity, PYMUNK_COG = (0, 45), the mean of the two shapes' centroids, is not it
# either; only replay_start uses it). world = (x, y) + R(angle) local, R(a) = [[cos a, -sin a], [sin a, cos a]]; no
# y flip anywhere: a frame pixel is world * S / SIM_SIZE, pixel (row r, col c) covering [c, c+1) x
# [r, r+1). Angles are reported in [0, 2 pi) (states.npy's convention); differences go through
# angle_diff. The goal is the same T drawn LightGreen at the fixed pose GOAL_POSE.
TEE_RECTS = ((-60.0, 60.0, 0.0, 30.0), (-15.0, 15.0, 30.0, 120.0))  # (x0, x1, y0, y1): bar, stem
TEE_CENTROID = (0.0, (3600 * 15 + 2700 * 75) / 6300)  # (0, 40.714): the area centroid, body frame
PYMUNK_COG = (0.0, 45.0)  # pymunk's centre of gravity of the T, body frame (setting the angle turns about it)
TEE_REACH = 80.7  # farthest points of the T from its centroid (the stem's outer corners), sim units
CONTACTS = ((55.0, 15.0), (-55.0, 15.0), (0.0, 110.0))  # body frame: near the bar's two ends, the stem's end
GOAL_POSE = (256.0, 256.0, math.pi / 4)
SIM_SIZE = 512.0
TEE_AREA, AGENT_AREA = 6300.0, math.pi * 15 ** 2  # sim units^2 (agent: a disc of radius 15)
MIN_FRAC = 0.25  # a thing counts as "found" with at least this fraction of its expected pixel area


def angle_diff(a, b):
    """a - b wrapped to [-pi, pi) (radians, arrays broadcast)."""
    return (np.asarray(a) - np.asarray(b) + np.pi) % (2 * np.pi) - np.pi


def body_to_world(pose, local):
    """World (sim) coordinates (..., 2) of body-frame points local (..., 2) of a T at pose(s) (..., 3)."""
    pose, local = np.asarray(pose, float), np.asarray(local, float)
    c, s = np.cos(pose[..., 2]), np.sin(pose[..., 2])
    lx, ly = local[..., 0], local[..., 1]
    return np.stack([pose[..., 0] + c * lx - s * ly, pose[..., 1] + s * lx + c * ly], -1)


def world_to_body(pose, world):
    """Body-frame coordinates (..., 2) of world points (..., 2) for a T at pose(s) (..., 3): R(-angle) (world - origin)."""
    pose, world = np.asarray(pose, float), np.asarray(world, float)
    c, s = np.cos(pose[..., 2]), np.sin(pose[..., 2])
    dx, dy = world[..., 0] - pose[..., 0], world[..., 1] - pose[..., 1]
    return np.stack([c * dx + s * dy, -s * dx + c * dy], -1)


def tee_centroid(pose):
    """World position (..., 2) of the T's area centroid for pose(s) (..., 3)."""
    return body_to_world(pose, TEE_CENTROID)


def pose_from_centroid(cx, cy, angle, size):
    """The pose (..., 3) of the T whose area centroid is at (cx, cy) frame pixels of a size x size frame
    and whose body angle is angle (rad): origin = centroid - R(angle) TEE_CENTROID, in sim units."""
    angle = np.asarray(angle, float)
    zero = np.zeros_like(angle)
    off = body_to_world(np.stack([zero, zero, angle], -1), TEE_CENTROID)  # R(angle) TEE_CENTROID
    k = SIM_SIZE / size
    return np.stack([np.asarray(cx) * k - off[..., 0], np.asarray(cy) * k - off[..., 1], angle], -1)


def inside_tee(lx, ly):
    """True where body-frame points (sim units; arrays broadcast) lie in the T (edges included)."""
    inside = False
    for x0, x1, y0, y1 in TEE_RECTS:
        inside = inside | ((lx >= x0) & (lx <= x1) & (ly >= y0) & (ly <= y1))
    return inside


def tee_fraction(poses, xs, ys, size, sub=4):
    """The one pixel renderer of the T: the fraction (K, P) of each pixel (centres xs, ys: (P,) in frame
    pixels of a size x size frame) that the T covers at each of poses (K, 3), from sub x sub sample
    points per pixel."""
    poses = np.asarray(poses, float).reshape(-1, 3)
    o = (np.arange(sub) + 0.5) / sub - 0.5  # sample offsets from the pixel centre
    k = SIM_SIZE / size
    wx = (np.asarray(xs, float)[:, None, None] + o[None, :, None]) * k  # (P, sub, 1) sim units
    wy = (np.asarray(ys, float)[:, None, None] + o[None, None, :]) * k  # (P, 1, sub)
    x, y, a = (poses[:, i, None, None, None] for i in range(3))  # each (K, 1, 1, 1)
    c, s = np.cos(a), np.sin(a)
    dx, dy = wx[None] - x, wy[None] - y  # world -> body: R(-angle) (world - origin), as world_to_body
    inside = inside_tee(c * dx + s * dy, -s * dx + c * dy)  # (K, P, sub, sub)
    return inside.reshape(len(poses), len(xs), -1).mean(-1)


def tee_mask(size, pose, sub=4):
    """Boolean (size, size) mask of the T at pose: the pixels it covers at least half of."""
    ys, xs = np.mgrid[0:size, 0:size] + 0.5
    return tee_fraction(pose, xs.ravel(), ys.ravel(), size, sub)[0].reshape(size, size) >= 0.5


_GOAL_CACHE = {}


def goal_mask(size):
    """The LightGreen goal T as a (size, size) mask, computed geometrically (the block hides the green
    where it sits on it, so the goal cannot be read from the frame itself)."""
    if size not in _GOAL_CACHE:
        _GOAL_CACHE[size] = tee_mask(size, GOAL_POSE)
    return _GOAL_CACHE[size]


def make_env(S):
    """A headless gym-pusht environment rendering S x S frames (pygame never opens a window)."""
    os.environ.setdefault('SDL_VIDEODRIVER', 'dummy')
    os.environ.setdefault('PYGAME_HIDE_SUPPORT_PROMPT', '1')
    from gym_pusht.envs.pusht import PushTEnv
    return PushTEnv(obs_type='pixels', render_mode='rgb_array', observation_width=S, observation_height=S)


def env_state(env):
    """The env's true state (5,) as states.npy holds it: agent x, y, then the T's pose (angle in [0, 2 pi))."""
    return np.array([*env.agent.position, *env.block.position, env.block.angle % (2 * math.pi)])


# -----------------------------------------------------------------------------
# Reading frames: what is where
#
# How gym-pusht draws a frame (envs/pusht.py, pymunk_override.py), onto a 512x512 surface:
#   white background -> goal T in LightGreen -> pymunk debug_draw: walls (LightGray fat
#   segments), block (T polygons filled 1.2x LightSlateGray, outlined in LightSlateGray 4 px
#   lines), agent (RoyalBlue disc r=15 with a 1.2x lighter disc r=11 inside).
#   Measured: the agent ends up on top of the block where they overlap, so it stays visible.
#   No y flip (positive_y_is_up = False): pixel row = sim y. Then cv2.resize(INTER_LINEAR)
#   down to the observation size, which blends neighbouring pixels at edges.
# Colours as measured in rendered uint8 frames:
PUSHT_COLOURS = {
    "background": [(255, 255, 255), (144, 238, 144), (211, 211, 211)],  # white, goal, walls
    "block": [(143, 163, 184), (119, 136, 153)],  # fill (1.2 x LightSlateGray), outline
    "agent": [(65, 105, 225), (78, 126, 255)],  # RoyalBlue rim, lighter centre
}
COLOUR_TOLERANCE = 40.0  # max RGB distance (0..255 units) from the nearest mixing segment


def _palette():
    # the reference colours (P, 3) and their classes (P,): 0 nothing, 1 block, 2 agent
    cols, labels = [], []
    for k, name in enumerate(["background", "block", "agent"]):
        for c in PUSHT_COLOURS[name]:
            cols.append(c)
            labels.append(k)
    return np.array(cols, np.float32), np.array(labels)


def segment_pusht(frames):
    """Boolean masks {"agent", "block"} (B, H, W) from uint8 frames (B, H, W, 3).

    Rule: nearest reference colour, extended to antialiased blends. Every pixel is explained
    as a mix p ~ t a + (1 - t) b of two reference colours a, b (pure colours are t = 1); the
    pair whose mixing segment is nearest in RGB wins and the pixel goes to the class of the
    dominant colour (a if t >= 0.5). Pixels farther than COLOUR_TOLERANCE from every segment
    are left out (as are background, goal and walls). Why segments, not points: a 75 % agent /
    25 % white edge pixel (113, 143, 233) is about as close to the block fill as to RoyalBlue,
    so plain nearest-colour would paint a ring of "block" around the agent.
    """
    frames = np.asarray(frames)
    assert frames.ndim == 4 and frames.shape[-1] == 3, frames.shape
    cols, labels = _palette()
    ia, ib = np.triu_indices(len(cols))  # all pairs, incl. (a, a) = the pure colour
    a, b = cols[ia], cols[ib]
    d = a - b  # (P, 3)
    dd = (d ** 2).sum(1)
    cls = np.zeros(frames.shape[:3], np.int64)
    for i in range(len(frames)):  # one frame at a time keeps the (pixels, pairs, 3) temp small
        p = frames[i].reshape(-1, 3).astype(np.float32)
        # t = clamp(<p - b, a - b> / |a - b|^2, 0, 1); distance |p - (b + t (a - b))|
        t = ((p[:, None, :] - b[None]) * d[None]).sum(-1) / np.maximum(dd, 1e-6)[None]
        t = np.where(dd[None] > 0, np.clip(t, 0, 1), 1.0)
        dist = np.linalg.norm(p[:, None, :] - (b[None] + t[..., None] * d[None]), axis=-1)
        best = dist.argmin(1)
        rows = np.arange(len(p))
        c = np.where(t[rows, best] >= 0.5, labels[ia][best], labels[ib][best])
        c = np.where(dist[rows, best] <= COLOUR_TOLERANCE, c, 0)
        cls[i] = c.reshape(frames.shape[1:3])
    return {"agent": cls == 2, "block": cls == 1}


def min_pixels(size, what):
    """THE "found" rule: the agent / the block counts as found in a size x size frame iff its mask has
    at least this many pixels, MIN_FRAC of its area at that scale (64x64: agent 11 px -> 2, block 98 px
    -> 24). physics, pusht_detectable, agent_position, block_pose and estimate_state all apply it."""
    area = {'agent': AGENT_AREA, 'block': TEE_AREA}[what] * (size / SIM_SIZE) ** 2
    return max(1, int(MIN_FRAC * area))


def _found(masks, what):
    # (B,) bool: the mask (B, H, W) has at least min_pixels pixels
    m = np.asarray(masks, bool)
    return m.reshape(len(m), -1).sum(1) >= min_pixels(m.shape[1], what)


def _agent_xy(masks):
    # agent centroid (B, 2) as (x, y) frame pixels from agent masks (B, H, W), NaN where not found;
    # pixel centres at (c + 0.5, r + 0.5)
    m = np.asarray(masks, bool)
    B, H, W = m.shape
    out = np.full((B, 2), np.nan)
    ys, xs = np.mgrid[0:H, 0:W]
    for i in np.nonzero(_found(m, 'agent'))[0]:
        out[i] = xs[m[i]].mean() + 0.5, ys[m[i]].mean() + 0.5
    return out


def agent_position(frames):
    """Agent centroid (B, 2) as (x, y) in frame pixels of uint8 frames (B, H, W, 3), NaN where it is not
    found (min_pixels). A sim position maps to pixels by p = sim * S / SIM_SIZE (no y flip)."""
    return _agent_xy(segment_pusht(frames)["agent"])


def mask_iou(a, b):
    """IoU per image (B,) of boolean masks (B, H, W): |a & b| / |a | b|, := 1.0 when both are empty."""
    a = np.asarray(a, bool).reshape(len(a), -1)
    b = np.asarray(b, bool).reshape(len(b), -1)
    inter = (a & b).sum(1)
    union = (a | b).sum(1)
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def block_pose(mask, ignore=None):
    """The T block measured in block masks (B, H, W): (B, 3) = (area centroid x, y in frame pixels, body
    angle in rad in [0, 2 pi)); NaN rows where the block is not found (min_pixels). pose_from_centroid
    turns a row into a pose.

    Centroid: mean pixel centre of the mask pixels within the T's reach (TEE_REACH + 1.5 px) of the
    mask's median, then of their mean (so stray pixels elsewhere in a predicted frame are ignored).
    Angle, in two stages:
    1. moments: the T's symmetry axis is the major principal axis of the mask's second moments
       (variances 1214 vs 718 sim units^2 along / across it), phi = atan2(2 mu11, mu20 - mu02) / 2;
       the flip phi vs phi + pi is resolved by the third moment along the axis, positive toward the
       stem (skewness +0.8: the heavy bar on one side, the long stem on the other). The stem points
       along R(a) (0, 1) = (-sin a, cos a), so a = atan2(-d_x, d_y) for the stem direction d.
    2. template match: at 64x64 the T is 15 px wide and pixelisation moves the moment axis by up to ~8
       degrees, so the angle is refined (+-12 deg in 1.5 deg steps around it and around its flip, then
       +-1.5 in 0.25) by minimising sum |tee_fraction - mask| over the pixels near the T, with the T's
       centroid held at the mask centroid. Pixels where ignore (B, H, W) is True (the agent, which is
       drawn on top of the block) are left out of the match."""
    m = np.asarray(mask, bool)
    B, H, W = m.shape
    scale = W / SIM_SIZE
    out = np.full((B, 3), np.nan)
    ys, xs = np.mgrid[0:H, 0:W] + 0.5
    r = TEE_REACH * scale + 1.5  # the T's reach, plus pixelisation
    for i in np.nonzero(_found(m, 'block'))[0]:
        px, py = xs[m[i]], ys[m[i]]
        # stray pixels (decoder noise that happens to be slate-grey) would pull the moments: keep only
        # pixels within the T's reach of the median, then of the mean of those (all of them if that
        # leaves none: the block is found by the count alone, one rule)
        cx, cy = np.median(px), np.median(py)
        for reach in (r + 15 * scale, r):
            keep = (px - cx) ** 2 + (py - cy) ** 2 <= reach ** 2
            if keep.any():
                px, py = px[keep], py[keep]
            cx, cy = px.mean(), py.mean()
        dx, dy = px - cx, py - cy
        mu20, mu02, mu11 = (dx * dx).mean(), (dy * dy).mean(), (dx * dy).mean()
        phi = 0.5 * np.arctan2(2 * mu11, mu20 - mu02)  # major axis direction
        d = np.array([np.cos(phi), np.sin(phi)])
        if ((dx * d[0] + dy * d[1]) ** 3).mean() < 0:  # point d toward the stem
            d = -d
        a = np.arctan2(-d[0], d[1])
        near = (np.abs(xs - cx) <= r) & (np.abs(ys - cy) <= r)
        if ignore is not None:
            near &= ~np.asarray(ignore[i], bool)
        wx, wy, target = xs[near], ys[near], m[i][near].astype(np.float64)
        for span, step, sub in ((np.radians(12), np.radians(1.5), 2), (np.radians(1.5), np.radians(0.25), 4)):
            cand = a + np.arange(-span, span + 1e-9, step)
            if span > np.radians(2):  # the coarse stage also tries the flipped T, in case the third moment misled
                cand = np.concatenate([cand, cand + np.pi])
            poses = pose_from_centroid(np.full_like(cand, cx), np.full_like(cand, cy), cand, W)
            cost = np.abs(tee_fraction(poses, wx, wy, W, sub) - target[None]).sum(1)
            a = cand[cost.argmin()]
        out[i] = cx, cy, a % (2 * np.pi)
    return out


def estimate_state(frames):
    """The Push-T state read from uint8 frames (N, S, S, 3), in gym-pusht's units (the pose convention
    above): {'agent': (N, 2) agent centre, sim units; 'block': (N, 3) the T's pose (body origin x, y in
    sim units, angle in [0, 2 pi)), from block_pose's centroid and angle; NaN rows where a thing is not
    found (min_pixels); 'masks': segment_pusht's masks}."""
    seg = segment_pusht(frames)
    S = seg['block'].shape[1]
    c = block_pose(seg['block'], seg['agent'])
    return {'agent': _agent_xy(seg['agent']) * (SIM_SIZE / S), 'block': pose_from_centroid(c[:, 0], c[:, 1], c[:, 2], S),
            'masks': seg}


def goal_coverage(block_masks, agent_masks=None):
    """|block & goal| / |goal| per frame (B,), in pixels; the goal mask is geometric (goal_mask). With
    agent_masks, both counts skip the goal pixels the agent hides (it is drawn on top of the block), so a
    T on the goal scores the same wherever the agent stands."""
    m = np.asarray(block_masks, bool)
    g = np.broadcast_to(goal_mask(m.shape[1])[None], m.shape)
    if agent_masks is not None:
        g = g & ~np.asarray(agent_masks, bool)
    return (m & g).reshape(len(m), -1).sum(1) / np.maximum(g.reshape(len(m), -1).sum(1), 1)


def pusht_detectable(frames):
    """Booleans {'agent', 'block'} (B,): is the thing found in the frame (min_pixels)? For stability
    checks of long rollouts."""
    seg = segment_pusht(frames)
    return {k: _found(seg[k], k) for k in ('agent', 'block')}


def block_shape_iou(frames):
    """How T-shaped the block still is, per frame (B,): IoU of the block mask with the T drawn at the
    mask's own pose (block_pose); 0 where no block is found. A long rollout can keep a block that is
    detectable but has melted into a blob: this catches that (rendered frames score ~0.85). Pixels the
    agent covers are left out of both masks."""
    seg = segment_pusht(frames)
    m, agent = seg['block'], seg['agent']
    S = m.shape[1]
    out = np.zeros(len(m))
    for i, (cx, cy, a) in enumerate(block_pose(m, agent)):
        if not np.isnan(cx):
            t = tee_mask(S, pose_from_centroid(cx, cy, a, S)) & ~agent[i]
            out[i] = mask_iou(t[None], (m[i] & ~agent[i])[None])[0]
    return out


# -----------------------------------------------------------------------------
# Physics errors of a predicted frame against the true one

PHYSICS_KEYS = ('agent_err_px', 'block_iou', 'agent_iou', 'block_centroid_err_px', 'block_angle_err_deg',
                'coverage_err', 'coverage_pred', 'coverage_true')  # what physics returns


def physics(pred_frames, true_frames):
    """Per-frame physics errors between predicted and true uint8 frames (B, H, W, 3), all (B,), never NaN.

    Segmentation rule (segment_pusht): every pixel is explained as a blend of two reference colours
    of the renderer and goes to the class of the dominant one (agent RoyalBlue, block
    LightSlateGray; background, goal LightGreen and walls are nothing); pixels far from every blend
    are nothing too. The agent and the block count as found by min_pixels (a quarter of their area
    at that scale), the same rule pusht_detectable and estimate_state apply.

    "agent_err_px": Euclidean distance of the agent centroids in frame pixels. When the agent
      is found in one frame but not the other (e.g. the model lost it), the error is the image
      diagonal sqrt(H^2 + W^2); when it is missing in both, 0.
    "block_iou": IoU of the block masks.
    "agent_iou": IoU of the agent masks (1 when both are empty).
    "block_centroid_err_px": distance of the T-block centroids (block_pose); diagonal when the
      block is found in one frame only, 0 when in neither.
    "block_angle_err_deg": |angle_diff| of the block angles (block_pose: second moments, third-moment
      flip, template refinement that skips agent pixels), in [0, 180]; 180 when found in one frame
      only, 0 in neither.
    "coverage_pred", "coverage_true": goal_coverage with the frame's agent mask (goal pixels the agent
      hides are left out of both counts), "coverage_err": |coverage_pred - coverage_true|.
    """
    H, W = np.asarray(true_frames).shape[1:3]
    diag = float(np.hypot(H, W))
    seg_p, seg_t = segment_pusht(pred_frames), segment_pusht(true_frames)

    def err(p, t, e, worst):  # e where found in both, worst where found in one only, 0 in neither
        miss_p, miss_t = np.isnan(p[:, 0]), np.isnan(t[:, 0])
        return np.where(miss_p != miss_t, worst, np.where(miss_p & miss_t, 0.0, e))

    pos_p, pos_t = _agent_xy(seg_p["agent"]), _agent_xy(seg_t["agent"])
    bp, bt = block_pose(seg_p["block"], seg_p["agent"]), block_pose(seg_t["block"], seg_t["agent"])
    cov_p, cov_t = goal_coverage(seg_p["block"], seg_p["agent"]), goal_coverage(seg_t["block"], seg_t["agent"])
    return {"agent_err_px": err(pos_p, pos_t, np.linalg.norm(pos_p - pos_t, axis=1), diag),
            "block_iou": mask_iou(seg_p["block"], seg_t["block"]),
            "agent_iou": mask_iou(seg_p["agent"], seg_t["agent"]),
            "block_centroid_err_px": err(bp, bt, np.linalg.norm(bp[:, :2] - bt[:, :2], axis=1), diag),
            "block_angle_err_deg": err(bp, bt, np.degrees(np.abs(angle_diff(bp[:, 2], bt[:, 2]))), 180.0),
            "coverage_pred": cov_p, "coverage_true": cov_t, "coverage_err": np.abs(cov_p - cov_t)}


# -----------------------------------------------------------------------------
# Walking round the T

LO, HI = 20.0, 492.0  # commanded targets stay off the walls (walls at 5 and 506, agent radius 15)
PATH_CLEAR = 85.0  # a straight path that passes farther than this from the T's centroid misses it (a graze at worst)
CLEAR = 115.0  # a circle of this radius around the T's centroid clears the T (TEE_REACH 81) and the agent (15)


def route_around(start, goal, c):
    """Waypoints from start to goal (sim units) that go round the T whose centroid is c instead of through
    it: [goal] when the straight path misses the T (closest approach > PATH_CLEAR) or the goal lies
    within 45 degrees of the start as seen from c (the last stretch to a contact point next to the T),
    else points on the circle of radius CLEAR around c, at most 60 degrees apart, then goal. The
    collector walks the whole list; the Pusher, replanning every step, heads for the first point."""
    start, goal, c = (np.asarray(v, float) for v in (start, goal, c))
    d = goal - start
    t = np.clip(np.dot(c - start, d) / max(np.dot(d, d), 1e-9), 0, 1)
    a0, a1 = math.atan2(*(start - c)[::-1]), math.atan2(*(goal - c)[::-1])
    da = float(angle_diff(a1, a0))
    if np.linalg.norm(start + t * d - c) > PATH_CLEAR or abs(da) < math.pi / 4:
        return [goal]
    n = max(1, int(abs(da) // (math.pi / 3)))  # arc points at most 60 degrees apart
    return [c + CLEAR * np.array([math.cos(a0 + da * k / (n + 1)), math.sin(a0 + da * k / (n + 1))])
            for k in range(1, n + 1)] + [goal]


# -----------------------------------------------------------------------------
# Push-T collection with a scripted "play" policy


def _approach(start, goal, c, rng, p_skip=0.15):
    # the collector's walk to a contact: round the T, except in a share p_skip of cases (sloppy "failures")
    return [np.asarray(goal, float)] if rng.random() < p_skip else route_around(start, goal, c)


def _new_primitive(env, target, rng):
    """Pick a primitive; return (waypoints, max step per 10 Hz step, max duration in steps, name)."""
    pose = env_state(env)[2:]
    c = tee_centroid(pose)
    speed = float(np.exp(rng.uniform(np.log(4), np.log(30))))  # log-uniform: slow moves are common too
    kind = rng.choice(['push', 'rotate', 'contact', 'free', 'pause'], p=[0.4, 0.3, 0.15, 0.1, 0.05])
    if kind == 'push':
        # straight push through the centre; mostly toward the arena middle so the T stays in play
        if rng.random() < 0.5 or np.abs(c - 256).max() > 150:
            to_mid = np.array([256.0, 256.0]) - c + rng.normal(0, 40, 2)
            ang = math.atan2(to_mid[1], to_mid[0])
        else:
            ang = rng.uniform(-math.pi, math.pi)
        d = np.array([math.cos(ang), math.sin(ang)])
        behind = c - d * rng.uniform(95, 120)
        wps = _approach(target, behind, c, rng) + [c + d * rng.uniform(40, 180)]
    elif kind == 'rotate':
        # touch near one end of the bar or stem and push tangentially so the T turns about its centre
        p = body_to_world(pose, CONTACTS[rng.integers(3)])
        r = p - c
        tang = np.array([-r[1], r[0]]) / (np.linalg.norm(r) + 1e-9) * rng.choice([-1.0, 1.0])
        wps = _approach(target, p - tang * 40, c, rng) + [p + tang * rng.uniform(40, 120)]
    elif kind == 'contact':
        wps = [c + rng.normal(0, 40, 2) for _ in range(rng.integers(1, 3))]
    elif kind == 'free':
        wps = []
        for _ in range(rng.integers(1, 4)):
            for _ in range(20):  # waypoints away from the block (it may still be bumped on the way)
                w = rng.uniform(LO, HI, 2)
                if np.linalg.norm(w - c) > CLEAR:
                    break
            wps.append(w)
    else:
        return [], 0.0, int(rng.integers(2, 8)), kind
    wps = [np.clip(w, LO, HI) for w in wps]
    path = sum(np.linalg.norm(b - a) for a, b in zip([target] + wps[:-1], wps))
    # a random time budget: usually enough for the path, sometimes too short so the primitive is cut off (failures)
    budget = rng.uniform(0.3, 0.8) if rng.random() < 0.15 else rng.uniform(0.9, 1.6)
    steps = int(path / speed * budget) + int(rng.integers(1, 6))
    return wps, speed, min(steps, 100), kind


def _collect_episode(args):
    """One Push-T episode; depends only on (seed + index), so results do not depend on the worker count."""
    index, seed, episode_len, image_size = args
    rng = np.random.default_rng(seed + index)
    env = make_env(image_size)
    obs, _ = env.reset(seed=int(rng.integers(2 ** 31)))  # the env's own random start state
    frames = np.empty((episode_len, image_size, image_size, 3), np.uint8)
    actions = np.empty((episode_len, 2), np.float32)
    states = np.empty((episode_len, 5), np.float32)
    target = np.clip(np.array(env.agent.position, dtype=np.float64), LO, HI)
    wps, speed, steps_left = [], 0.0, 0
    for i in range(episode_len):
        frames[i] = obs
        states[i] = env_state(env)
        if steps_left <= 0 or (not wps and speed > 0):
            wps, speed, steps_left, _ = _new_primitive(env, target, rng)
        steps_left -= 1
        if wps:
            # move the commanded target toward the waypoint by at most `speed`, with a little noise
            d = wps[0] - target
            dist = np.linalg.norm(d)
            if dist <= speed:
                target = wps.pop(0).copy()
            else:
                target = target + d / dist * speed
            target = np.clip(target + rng.normal(0, 1.0, 2), LO, HI)
        actions[i] = target
        if i + 1 < episode_len:  # the last action's result is never recorded
            obs, _, _, _, _ = env.step(actions[i].astype(np.float64))  # `terminated` ignored: play on
    env.close()
    return frames, actions, states


def generate_pusht(out_dir, num_episodes, episode_len, image_size, num_workers=2, seed=0, overwrite=False):
    """Collect scripted play episodes in worker processes and write them as a dataset folder.

    Workers are spawned, so a script calling this with num_workers > 1 needs the usual
    `if __name__ == '__main__':` guard. num_workers <= 1 collects in this process.
    Besides the frames and actions (the agent's (x, y) target, 0..512 on the 512 board, declared an image
    point in meta.json), it writes states.npy (N, 5): agent_x, agent_y, block_x, block_y, block_angle as
    gym-pusht's state observation gives them: simulator units 0..512 (pixel column = x / 512 * S, pixel
    row = y / 512 * S, y not flipped), (block_x, block_y) the T's body origin (the middle of the bar's
    outer edge, not its centroid), the angle in radians in [0, 2 pi). Only tests of the pixel physics read it.
    """
    D._check_out_dir(out_dir, overwrite)
    if num_episodes < 1 or episode_len < 2:
        raise ValueError(f"need num_episodes >= 1 and episode_len >= 2, got {num_episodes}, {episode_len}")
    if image_size < 4 or image_size % 4 != 0:
        raise ValueError(f"image_size must be a positive multiple of 4, got {image_size}")
    jobs = [(i, seed, episode_len, image_size) for i in range(num_episodes)]
    results = []
    bar = tqdm(total=num_episodes, desc='pusht episodes', unit='ep')
    if num_workers <= 1:
        for job in jobs:
            results.append(_collect_episode(job))
            bar.update()
    else:
        import multiprocessing as mp
        # spawn: workers start clean even if the caller has torch threads or a pygame display
        with mp.get_context('spawn').Pool(num_workers) as pool:
            for r in pool.imap(_collect_episode, jobs):  # imap keeps episode order
                results.append(r)
                bar.update()
    bar.close()
    try:
        from importlib.metadata import version
        src_version = version('gym_pusht')
    except Exception:  # not installed as a distribution (e.g. a source checkout): the data still says where it is from
        src_version = 'unknown'
    meta = dict(fps=10, image_size=image_size, action_dim=2, action_low=[0.0, 0.0], action_high=[512.0, 512.0],
                source=f"gym_pusht {src_version} PushT-v0, scripted play policy (pusht.py)",
                image_point_dims=[0, 1],  # the action is the agent's target, a point in the image (x, y)
                num_episodes=num_episodes, episode_len=episode_len, seed=seed)
    D.write_dataset(out_dir, [r[0] for r in results], [r[1] for r in results], meta,
                    states_list=[r[2] for r in results], overwrite=overwrite)


def is_pusht(meta):
    """Is a dataset (its meta.json) gym-pusht's: 2-d actions that are an image point (image_point_dims
    [0, 1]) and a source that names gym_pusht (the collector's, and what record_demos writes)?"""
    return (meta.get('image_point_dims') == [0, 1] and meta.get('action_dim', 2) == 2
            and 'gym_pusht' in str(meta.get('source', '')))


# -----------------------------------------------------------------------------
# Scripted Push-T policies
# Each acts for n environments at once from estimated states (NaN where a frame showed nothing).
# A policy remembers the target it last commanded (the agent follows it with a PD controller).

class Hold:
    """Keeps commanding where the agent started: the T never moves unless it already touches."""

    def __init__(self, n, seed=0):
        self.n, self.rng, self.target = n, np.random.default_rng(seed), None

    def _start(self, agent):
        """On the first call, the commanded target starts where the agent is seen (the middle if it is not)."""
        if self.target is None:
            self.target = np.where(np.isnan(agent), 256.0, agent).clip(LO, HI)

    def act(self, agent, block):
        """Actions (n, 2) from the estimated agent positions (n, 2) and T poses (n, 3)."""
        self._start(agent)
        return self.target.copy()


class RandomWalk(Hold):
    """Wanders between random waypoints at `speed` per step; pushes the T only by chance."""

    def __init__(self, n, seed=0, speed=20.0):
        super().__init__(n, seed)
        self.speed, self.wp = speed, None

    def act(self, agent, block):
        """One step toward each environment's waypoint; a new waypoint once it is reached."""
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
    also helps the translation), else finish the translation. Walks to each contact round the T
    (route_around), not through it. `speed` = max target motion per step, `noise` = std of Gaussian
    noise on every action, `rotate=False` only translates."""

    def __init__(self, n, seed=0, speed=20.0, noise=0.0, rotate=True, rot_tol=0.3, pos_tol=8.0):
        super().__init__(n, seed)
        self.speed, self.noise, self.rotate, self.rot_tol, self.pos_tol = speed, noise, rotate, rot_tol, pos_tol
        self.push_end = [None] * n  # in a push: where the push ends

    def _plan(self, pose):
        """Pre-contact point and push (direction, length) for one T pose, or None when at the goal."""
        c = tee_centroid(pose)
        dth = float(angle_diff(GOAL_POSE[2], pose[2]))
        d = tee_centroid(GOAL_POSE) - c
        dist = float(np.linalg.norm(d))
        if self.rotate and abs(dth) > self.rot_tol and dist < 40:  # near the goal: turn it
            plans = []
            for p in body_to_world(pose, CONTACTS):
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
        b = world_to_body(pose, c - u * h[:, None])
        inside = inside_tee(b[:, 0], b[:, 1])
        back = float(h[inside].max()) if inside.any() else 0.0
        return c - u * (back + 25), u, min(dist, 60.0) + 10

    def act(self, agent, block):
        """Per environment: walk toward the next pre-contact point (replanned every step), then push through."""
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
                    wp = route_around(self.target[i], pre, tee_centroid(block[i]))[0]
                    self.target[i] = self._toward(self.target[i], np.clip(wp, LO, HI))
            else:  # pushing through
                self.target[i] = self._toward(self.target[i], self.push_end[i])
                if np.linalg.norm(self.push_end[i] - self.target[i]) < 1e-6:
                    self.push_end[i] = None
        a = self.target + (self.rng.normal(0, self.noise, (self.n, 2)) if self.noise > 0 else 0)
        return a.clip(LO, HI)

    def _toward(self, x, goal):
        """x moved toward goal by at most speed."""
        d = goal - x
        dist = np.linalg.norm(d)
        return goal.copy() if dist <= self.speed else x + d / dist * self.speed


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


# -----------------------------------------------------------------------------
# Policy evaluation: gym-pusht vs the world model

def sample_states(n, seed=0):
    """Start states [agent_x, agent_y, block_x, block_y, block_angle] (gym_pusht reset_to_state): the T
    anywhere in the middle of the table at any angle, the agent clear of it (CLEAR from its centroid)."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        b = [*rng.uniform(150, 362, 2), rng.uniform(0, 2 * math.pi)]
        a = rng.uniform(60, 452, 2)
        if np.linalg.norm(a - tee_centroid(b)) > CLEAR:  # reset_to_state does not resolve overlaps
            out.append([*a, *b])
    return np.array(out)


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
        """(N, 5) true states (env_state) and (N,) the env's own coverage (polygon areas)."""
        return np.stack([env_state(e) for e in self.envs]), np.array([e._get_coverage() for e in self.envs])

    def step(self, actions):
        """One step of every environment; the new frames (N, S, S, 3)."""
        return np.stack([e.step(np.asarray(a, np.float64))[0] for e, a in zip(self.envs, actions)])


DEFAULT_POLICIES = 'push,push_noisy,push_very_noisy,push_slow,random_walk,hold'


def _require_pusht(ck):
    # the scripted policies act in gym-pusht's action space and are scored on its renderer's frames
    meta = ck['data']['meta']
    if ck['action_dim'] != 2 or not is_pusht(meta):
        raise SystemExit(f"the scripted policies and the coverage score are Push-T's; this checkpoint's data is "
                         f"{meta.get('source')!r} with {ck['action_dim']}-d actions and image_point_dims "
                         f"{meta.get('image_point_dims')} (pusht.is_pusht)")


def _policy_names(spec):
    """The policies named in a comma list ('' = DEFAULT_POLICIES); unknown names stop the run."""
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
    """Spearman's rank correlation (Pearson r of the average ranks), None when undefined."""
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
    torch.manual_seed(cfg['seed'])
    dev = pick_device(cfg['device'])
    dyn, enc, dec, ck = rollout.load_world_model(cfg['ckpt'], dev, cfg['ae_ckpt'])
    _require_pusht(ck)
    S, E, H, thr = ck['data']['image_size'], cfg['num_states'], cfg['steps'], cfg['success_threshold']
    names = _policy_names(cfg['policies'])
    P = len(names)
    states = sample_states(E, cfg['seed'])
    print(f"policy evaluation: {P} policies x {E} start states x {H} steps at {S}x{S}, success = pixel coverage > {thr}")

    t0 = time.time()
    real = RealSim(np.concatenate([states] * P), S)
    first = real.first[:E]
    err = []  # the estimator against the env's internals, every step of the real runs

    def check(t, frames, est):  # on_step hook: the estimate of every real frame against the env's state
        truth, _ = real.truth()
        err.append(np.stack([np.linalg.norm(est['agent'] - truth[:, :2], axis=1),
                             np.linalg.norm(est['block'][:, :2] - truth[:, 2:4], axis=1),
                             np.abs(angle_diff(est['block'][:, 2], truth[:, 4]))], 1))

    fr_real, _, _, est_real = run_policies(names, first, H, real.step, cfg['seed'], on_step=check)
    env_cov = real.truth()[1]
    t_real = time.time() - t0
    print(f"real simulator: {t_real:.0f} s")

    t0 = time.time()
    sim = rollout.Simulator(dyn, enc, dec, ck, cfg['window'], cfg['ctx_level'], cfg['decode_steps'], cfg['seed'])
    sim.reset(np.concatenate([first] * P))  # all policies x states in one batch: one model call per step

    def progress(t, frames, est):  # on_step hook: the model is slow on a CPU, so say where it is
        if t and (t % 10 == 0 or t == H):
            print(f"world model: step {t}/{H}, {time.time() - t0:.0f} s", flush=True)

    fr_model, _, _, est_model = run_policies(names, first, H, sim.step, cfg['seed'], on_step=progress)
    t_model = time.time() - t0

    cov = lambda masks: goal_coverage(masks['block'], masks['agent'])
    cov_r, cov_m = cov(est_real['masks']).reshape(P, E), cov(est_model['masks']).reshape(P, E)
    cov0 = cov(segment_pusht(first))
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
        'knobs': {k: cfg[k] for k in ('window', 'ctx_level', 'decode_steps', 'seed')},
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


def record_demos(cfg):
    """A scripted policy drives the world model from held-out real frames; the episodes (model frames and
    the actions sent) are written as one dataset folder, record_dir, in the project's format."""
    torch.manual_seed(cfg['seed'])
    dev = pick_device(cfg['device'])
    dyn, enc, dec, ck = rollout.load_world_model(cfg['ckpt'], dev, cfg['ae_ckpt'])
    _require_pusht(ck)
    name = _policy_names(cfg['demo_policy'])[0]
    ds, _ = rollout.load_data(ck, cfg['data_dir'])
    if os.path.isdir(cfg['record_dir']) and os.listdir(cfg['record_dir']):  # refuse before the rollout, not after
        raise SystemExit(f"{cfg['record_dir']}: folder exists and is not empty; record_demos writes a new dataset there")
    n, H = cfg['num_episodes'], cfg['steps']
    first = rollout.held_out_starts(ds, ck, n, np.random.default_rng(cfg['seed']), cfg['data_dir'] or ck['data']['data_dir'])
    sim = rollout.Simulator(dyn, enc, dec, ck, cfg['window'], cfg['ctx_level'], cfg['decode_steps'], cfg['seed'])
    sim.reset(first)
    frames = []
    t0 = time.time()
    _, acts, _, _ = run_policies([name], first, H, sim.step, cfg['seed'], on_step=lambda t, f, e: frames.append(f))
    frames = np.stack(frames, 1)  # (n, H+1, S, S, 3)
    acts = np.concatenate([acts, acts[:, -1:]], 1)  # the last frame's action has no next frame: repeat the last
    src = ck['data']['meta']
    meta = {k: src[k] for k in ('fps', 'action_low', 'action_high', 'image_point_dims')}  # _require_pusht: all there
    # the source names the model's own data (gym_pusht's), so is_pusht holds for the demos too
    meta.update(source=f"scripted Push-T policy {name!r} inside the world model {os.path.abspath(cfg['ckpt'])} "
                       f"(pusht.py --mode=record_demos), trained on: {src['source']}", policy=name, steps=H, seed=cfg['seed'])
    D.write_dataset(cfg['record_dir'], list(frames), list(acts), meta)
    print(f"{n} episodes x {H + 1} frames recorded inside the model with policy {name!r} in {time.time() - t0:.0f} s; "
          f"wrote {cfg['record_dir']}")


def replay_start(env, state, d_px=0.0, d_deg=0.0, S=64):
    """Reset env to a recorded first state (states.npy's 5 numbers, everything at rest), with the T's centroid
    moved by d_px = (dx, dy) frame pixels of an S x S frame and the T turned by d_deg degrees about its
    centroid; returns the first frame (S, S, 3). With no offset the episode replays bit for bit.

    Why not reset_to_state(state): gym-pusht sets the T's position and then its angle, and pymunk's angle
    setter keeps the centre of gravity (PYMUNK_COG in the body frame) in place, so the body origin ends up to
    ~90 sim units from the one asked for, and states.npy holds where it ended. So we ask for the position
    that the angle setter then moves to the recorded one: p = origin - cog + R(angle) cog. Teleporting the
    T after the reset instead is not exact: the reset's physics step has then run with the T elsewhere."""
    state = np.asarray(state, np.float64)
    d = np.broadcast_to(np.asarray(d_px, np.float64), (2,)) * SIM_SIZE / S  # pixels -> sim units
    a = state[4] + math.radians(d_deg)
    o = tee_centroid(state[2:5]) + d - body_to_world((0.0, 0.0, a), TEE_CENTROID)  # origin = centroid - R(a) TEE_CENTROID
    p = o - np.asarray(PYMUNK_COG) + body_to_world((0.0, 0.0, a), PYMUNK_COG)
    obs, _ = env.reset(options={'reset_to_state': [float(state[0]), float(state[1]), float(p[0]), float(p[1]), float(a)]})
    return obs


def replay(cfg):
    """The perfect simulator's score on the open-loop evaluation: gym-pusht itself replays the recorded actions
    of the same held-out episodes as --mode=eval (the checkpoint's split, the first num_episodes longer than
    horizon) from a first state that is slightly off (the T moved by PX pixels in a random direction and
    turned by DEG degrees either way, for each PX:DEG of replay_offsets), scored by physics() against the
    recorded frames. It says what the task's own sensitivity to the start costs an open-loop score: how far
    physics itself drifts from the recording when it starts a fraction of a pixel off, as a model starts
    from its reading of the first frame. The row 0:0 checks the replay (it matches the recording up to the
    float32 rounding of states.npy).

    replay_policies: the same for policy_eval's ranking. policy_eval's policies and start states run in
    gym-pusht, and again in gym-pusht with each start's T off by PX:DEG (one draw per start state, the same
    for every policy), standing in for the world model: Pearson and Spearman across policies and the largest
    |difference| of a policy's mean final coverage, the numbers policy_eval reports for a model."""
    ck = load_checkpoint(cfg['ckpt'], expect_kind='dynamics')
    _require_pusht(ck)
    ds, data_dir = rollout.load_data(ck, cfg['data_dir'])
    if ds['states'] is None or ds['states'].shape[1] != 5:
        raise SystemExit(f"{data_dir}: replay needs states.npy with gym-pusht's 5 numbers per frame (pusht.py --mode=collect writes it)")
    try:
        offsets = [tuple(float(v) for v in o.split(':')) for o in cfg['replay_offsets'].split(',')]
        assert all(len(o) == 2 and o[0] >= 0 for o in offsets)
    except (ValueError, AssertionError):
        raise SystemExit(f"--replay_offsets={cfg['replay_offsets']!r}: expected a comma list of PX:DEG, PX >= 0, e.g. 0:0,0.5:2")
    S, H = ds['frames'].shape[1], cfg['horizon']
    ranges = D.episode_ranges(ds['episode_ends'])
    eps = [i for i in rollout.unseen_episodes(ck, data_dir, ranges)[0] if ranges[i][1] - ranges[i][0] > H][:cfg['num_episodes']]
    if not eps:
        raise SystemExit(f"no unseen episode of {data_dir!r} is longer than horizon {H}")
    env, rng, rows = make_env(S), np.random.default_rng(cfg['seed']), []
    print(f"replaying {len(eps)} episodes x {H} steps in gym-pusht from perturbed starts")
    for px, deg in offsets:
        t0, scores, exact = time.time(), [], 0
        for _ in range(cfg['replay_draws'] if px or deg else 1):
            for i in eps:
                s0 = ranges[i][0]
                phi = rng.uniform(0, 2 * math.pi)
                replay_start(env, ds['states'][s0], px * np.array([math.cos(phi), math.sin(phi)]), deg * rng.choice([-1, 1]), S)
                true = np.asarray(ds['frames'][s0 + 1:s0 + 1 + H])  # (H, S, S, 3): frame k+1 follows action k
                pred = np.stack([env.step(np.asarray(ds['actions'][s0 + k], np.float64))[0] for k in range(H)])
                exact += bool((pred == true).all())
                scores.append(physics(pred, true))
        per = {k: np.stack([r[k] for r in scores]) for k in EVAL_KEYS}  # each (episodes x draws, H)
        row = {'offset_px': px, 'offset_deg': deg, 'rollouts': len(scores), 'exact_rollouts': exact}
        row |= {k: float(v.mean()) for k, v in per.items()}
        row['per_32_steps'] = {k: [round(float(v[:, j:j + 32].mean()), 4) for j in range(0, H, 32)] for k, v in per.items()}
        rows.append(row)
        print(f"  off by {px} px, {deg} deg: block IoU {row['block_iou']:.3f} (steps 1-32 {row['per_32_steps']['block_iou'][0]:.3f}), "
              f"centroid {row['block_centroid_err_px']:.2f} px, angle {row['block_angle_err_deg']:.1f} deg; "
              f"{exact} of {len(scores)} rollouts pixel-exact; {time.time() - t0:.0f} s")
    env.close()
    out = {'rows': rows, 'episodes': [int(i) for i in eps], 'horizon': H, 'data_dir': os.path.abspath(data_dir), 'seed': cfg['seed']}
    if cfg['replay_policies']:
        out['policies'] = replay_ranking(cfg, offsets, S, rng)
    os.makedirs(cfg['out_dir'], exist_ok=True)
    with open(os.path.join(cfg['out_dir'], 'replay.json'), 'w') as f:
        json.dump(out, f, indent=1)
    print(f"wrote {cfg['out_dir']}/replay.json")
    return out


def replay_ranking(cfg, offsets, S, rng):
    """replay's policy part (replay_policies=True; see replay): {'names', 'real': mean final coverage per policy, 'rows': one per offset}."""
    names, E, steps = _policy_names(cfg['policies']), cfg['num_states'], cfg['steps']
    P = len(names)
    real = RealSim(np.concatenate([sample_states(E, cfg['seed'])] * P), S)
    starts = real.truth()[0][:E]  # where the resets put things (reset_to_state moves the T: replay_start)
    cov = lambda est: goal_coverage(est['masks']['block'], est['masks']['agent']).reshape(P, E).mean(1)  # (P,)
    ref = cov(run_policies(names, real.first[:E], steps, real.step, cfg['seed'])[3])
    rows, fmt = [], lambda v: 'n/a' if v is None else f"{v:.3f}"  # None: one side constant
    for px, deg in offsets:
        t0 = time.time()
        d = [(px * math.cos(f), px * math.sin(f), deg * rng.choice([-1, 1])) for f in rng.uniform(0, 2 * math.pi, E)]
        first = np.stack([replay_start(e, starts[j % E], d[j % E][:2], d[j % E][2], S) for j, e in enumerate(real.envs)])
        c = cov(run_policies(names, first[:E], steps, real.step, cfg['seed'])[3])
        rows.append({'offset_px': px, 'offset_deg': deg, 'coverage': c.round(4).tolist(), 'pearson': pearson(ref, c),
                     'spearman': spearman(ref, c), 'max_abs_diff': float(np.abs(c - ref).max())})
        print(f"  policies from starts off by {px} px, {deg} deg: Pearson {fmt(rows[-1]['pearson'])}, Spearman "
              f"{fmt(rows[-1]['spearman'])}, largest |difference| {rows[-1]['max_abs_diff']:.3f}; {time.time() - t0:.0f} s")
    for e in real.envs:
        e.close()
    return {'names': names, 'real': ref.round(4).tolist(), 'num_states': E, 'steps': steps, 'rows': rows}


# ---------------------------------------------------------------------------- the command line
# defaults: rollout.py's (checkpoint, sampler, open-loop evaluation) and these
mode = 'eval'  # collect | eval | policy_eval | record_demos | replay
# collect: a new Push-T play dataset written to data_dir
num_workers = 2  # collection processes; the episodes do not depend on it
episode_len = 200  # frames per collected episode (10 Hz)
image_size = 64  # square frames, a multiple of 4
overwrite = False  # replace an existing non-empty data_dir
# policy_eval / record_demos
num_states = 20  # policy_eval: start states, the same for every policy, in gym-pusht and in the model
steps = 60  # steps per policy episode
policies = ''  # policy_eval: comma list of POLICIES; '' = DEFAULT_POLICIES
success_threshold = 0.9  # pixel goal coverage that counts as success (~0.87 of the env's own polygon coverage)
demo_policy = 'push'  # record_demos: the scripted policy that stands in for a human
record_dir = 'out/demos'  # record_demos: the dataset folder written
# replay: gym-pusht replays the held-out episodes from a start that is off by PX pixels and DEG degrees
replay_offsets = '0:0,0.25:1,0.5:2,1:5'  # comma list of PX:DEG; 0:0 checks that the replay is exact
replay_draws = 1  # random directions per episode for each nonzero offset
replay_policies = False  # also policy_eval's ranking (num_states, steps, policies) from the same offsets
PANELS = ('psnr', 'ssim', 'agent_err_px', 'block_iou')  # the curves pusht eval draws
EVAL_KEYS = ('agent_err_px', 'block_iou', 'agent_iou', 'block_centroid_err_px', 'block_angle_err_deg', 'coverage_err')


def evaluate(cfg):
    """rollout.py's open-loop evaluation with the physics read from the frames added to every row."""
    meta = load_checkpoint(cfg['ckpt'], expect_kind='dynamics')['data']['meta']
    if not is_pusht(meta):  # physics() reads gym-pusht's colours: on other frames its numbers mean little
        print(f"note: this checkpoint's data ({meta.get('source')!r}) is not gym-pusht's (pusht.is_pusht); "
              f"the physics scores assume gym-pusht's renderer")
    return rollout.main(cfg, physics, EVAL_KEYS, PANELS)


def main(cfg):
    """Run the mode cfg['mode'] names (the top of the file lists them)."""
    if cfg['mode'] == 'collect':
        if cfg['num_episodes'] < 1 or not cfg['data_dir']:
            raise SystemExit("collect needs --data_dir=NEW_FOLDER and --num_episodes >= 1")
        try:
            generate_pusht(cfg['data_dir'], cfg['num_episodes'], cfg['episode_len'], cfg['image_size'],
                           num_workers=cfg['num_workers'], seed=cfg['seed'], overwrite=cfg['overwrite'])
        except (D.DatasetError, ValueError) as e:
            raise SystemExit(f"error: {e}")
        print(f"wrote {cfg['num_episodes']} episodes to {cfg['data_dir']}")
        return None
    modes = {'eval': evaluate, 'policy_eval': policy_eval, 'record_demos': record_demos, 'replay': replay}
    if cfg['mode'] not in modes:
        raise SystemExit(f"unknown mode {cfg['mode']!r}; modes: collect, {', '.join(modes)}")
    return modes[cfg['mode']](cfg)


if __name__ == '__main__':
    main(config_from_globals({**vars(rollout), **globals()}))
