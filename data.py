"""
Episode datasets on disk: load, validate, split, normalize, write, and collect Push-T play data.

Generate a Push-T dataset (defaults below; config files work too, see common.py):

    python data.py --out_dir=data/pusht --num_episodes=500 --episode_len=200 --image_size=64

On-disk format. A dataset is one folder DIR holding:

    frames.npy        uint8   (N, H, W, 3)  RGB frames of all episodes, concatenated in time order.
                                            H == W and H is a multiple of 4.
    actions.npy       float32 (N, A)        action[i] is the command issued AFTER seeing frame[i]:
                                            frame[i+1] results from frames <= i and actions <= i.
                                            The last action of an episode has no next frame in the
                                            file (it is kept so every frame has one action).
    episode_ends.npy  int64   (E,)          exclusive end index of each episode: strictly increasing,
                                            first > 0, last == N (the diffusion-policy replay-buffer
                                            convention). Episode k is rows [ends[k-1], ends[k]),
                                            with ends[-1] read as 0.
    meta.json         {"fps": 10, "image_size": H, "action_dim": A,
                       "action_low": [...], "action_high": [...],   # the action space's range,
                                                                    # [0,0]/[512,512] for Push-T
                       "source": "...", "num_episodes": E}          # extra keys are allowed
    states.npy        float32 (N, 5), optional. For Push-T: agent_x, agent_y, block_x, block_y,
                                            block_angle, as gym_pusht's state observation gives them:
                                            simulator units 0..512 (pixel column = x / 512 * H,
                                            pixel row = y / 512 * H, y is not flipped), (block_x,
                                            block_y) is the T's body origin (middle of the top edge
                                            of its bar, not its centre of mass), angle in radians
                                            wrapped to [0, 2*pi). For testing pixel-based physics
                                            metrics; training never reads it.

A hand-written dataset, e.g. two episodes of 3 and 2 frames:

    np.save('DIR/frames.npy', frames.astype(np.uint8))        # (5, 64, 64, 3)
    np.save('DIR/actions.npy', actions.astype(np.float32))    # (5, 2)
    np.save('DIR/episode_ends.npy', np.array([3, 5], dtype=np.int64))
    json.dump({...}, open('DIR/meta.json', 'w'))

load_dataset() checks all of the above and raises DatasetError naming the file and the problem.

Other robot datasets are converted once into this format (see convert() for the layouts read):

    python data.py --convert=zarr    --src=pusht_cchi_v7_replay.zarr --out_dir=data/dp_pusht --fps=10
    python data.py --convert=hdf5    --src=aloha_sim_insertion/ --camera=top --out_dir=data/aloha_top --fps=50
    python data.py --convert=lerobot --src=~/lerobot/aloha_mobile --camera=cam_high --out_dir=data/lr_high
    python data.py --convert=folder  --src=my_episodes/ --out_dir=data/mine --fps=15
"""
import glob
import importlib
import io
import json
import math
import os
import re
import secrets
import shutil
import warnings

import numpy as np

# -----------------------------------------------------------------------------
# defaults for `python data.py` (override with --key=value or a config file)
DEFAULTS = dict(
    out_dir='data/pusht',   # dataset folder to create
    num_episodes=100,
    episode_len=200,        # frames per episode (10 Hz)
    image_size=64,          # square frames, a multiple of 4
    num_workers=2,          # collection processes; results do not depend on it
    seed=0,                 # episode k is seeded from seed + k
    overwrite=False,        # replace an existing non-empty out_dir
    # converting another dataset (convert != ''); see convert() for each format's layout
    convert='',             # '' collects Push-T; zarr | hdf5 | lerobot | folder converts --src once
    src='',                 # the source: zarr store, folder of episode_*.hdf5, LeRobot root, folder of episode folders
    camera='',              # image stream to keep ('' = the only one); one dataset per camera
    crop='center',          # 'center': square centre crop before the resize; 'none': squash the frame to a square
    stride=1,               # keep every stride-th frame, and the action recorded at it
    action_keys='',         # '' = the format's action; else a comma list of arrays/columns, concatenated
    action_dims=None,       # None = all action columns; else column indices to keep, e.g. --action_dims=0,1
    fps=0.0,                # source frame rate, needed where the source does not record it (zarr, hdf5, folder)
    swap_rb=None,           # None = auto (True only for JPEG in hdf5, written by OpenCV as BGR); True/False forces it
    max_episodes=0,         # convert only the first k source episodes (0 = all)
    skip_bad=False,         # skip a corrupt or inconsistent episode with a warning instead of stopping
)
# -----------------------------------------------------------------------------

META_KEYS = ('fps', 'image_size', 'action_dim', 'action_low', 'action_high', 'source', 'num_episodes')
CHUNK_ROWS = 1 << 16  # rows per chunk when scanning big (memory-mapped) arrays


class DatasetError(ValueError):
    """A dataset folder is missing, malformed or inconsistent; the message names the file."""


# -----------------------------------------------------------------------------
# loading and validation

def _load_npy(data_dir, name, mmap=True, required=True):
    path = os.path.join(data_dir, name)
    if not os.path.isfile(path):
        if required:
            raise DatasetError(f"{path}: file is missing")
        return None
    try:
        with open(path, 'rb') as f:
            is_npy = f.read(6) == b'\x93NUMPY'
        # allow_pickle=False: a dataset is data, never code
        arr = np.load(path, mmap_mode='r' if mmap else None, allow_pickle=False) if is_npy else None
    except Exception as e:
        raise DatasetError(f"{path}: cannot be read as a .npy array ({type(e).__name__}: {e})")
    if arr is None:
        raise DatasetError(f"{path}: not a .npy file (bad header); write it with np.save")
    return arr


def _check_finite(arr, path):
    # chunked so a memory-mapped array is never pulled into memory whole
    for i in range(0, len(arr), CHUNK_ROWS):
        chunk = np.asarray(arr[i:i + CHUNK_ROWS])
        if not np.isfinite(chunk).all():
            bad = i + int(np.argwhere(~np.isfinite(chunk))[0][0])
            raise DatasetError(f"{path}: contains NaN or Inf (first at row {bad})")


def load_dataset(data_dir):
    """Open a dataset folder (arrays memory-mapped), validate it, return a dict of its parts."""
    if not os.path.isdir(data_dir):
        raise DatasetError(f"{data_dir}: dataset folder does not exist")
    p = lambda name: os.path.join(data_dir, name)

    frames = _load_npy(data_dir, 'frames.npy')
    if frames.dtype != np.uint8:
        raise DatasetError(f"{p('frames.npy')}: dtype is {frames.dtype}, expected uint8")
    if frames.ndim != 4 or frames.shape[3] != 3:
        raise DatasetError(f"{p('frames.npy')}: shape is {frames.shape}, expected (N, H, W, 3)")
    N, H, W = frames.shape[:3]
    if N == 0:
        raise DatasetError(f"{p('frames.npy')}: has no frames")
    if H != W:
        raise DatasetError(f"{p('frames.npy')}: frames are {H}x{W}, expected square (H == W)")
    if H % 4 != 0:
        raise DatasetError(f"{p('frames.npy')}: image size {H} is not a multiple of 4")

    actions = _load_npy(data_dir, 'actions.npy')
    if actions.dtype != np.float32:
        raise DatasetError(f"{p('actions.npy')}: dtype is {actions.dtype}, expected float32")
    if actions.ndim != 2:
        raise DatasetError(f"{p('actions.npy')}: shape is {actions.shape}, expected (N, action_dim)")
    if len(actions) != N:
        raise DatasetError(f"{p('actions.npy')}: has {len(actions)} rows but frames.npy has {N}")
    _check_finite(actions, p('actions.npy'))

    ends = _load_npy(data_dir, 'episode_ends.npy', mmap=False)
    # any integer dtype is accepted (np.array([...]) is int32 on some platforms)
    if not np.issubdtype(ends.dtype, np.integer):
        raise DatasetError(f"{p('episode_ends.npy')}: dtype is {ends.dtype}, expected int64")
    if ends.ndim != 1 or len(ends) == 0:
        raise DatasetError(f"{p('episode_ends.npy')}: shape is {ends.shape}, expected (num_episodes,) with at least one")
    ends = ends.astype(np.int64)
    if (ends < 0).any():
        raise DatasetError(f"{p('episode_ends.npy')}: contains negative values")
    lengths = np.diff(ends, prepend=0)
    if (lengths < 0).any():
        k = int(np.argmax(lengths < 0))
        raise DatasetError(f"{p('episode_ends.npy')}: not increasing (entry {k} = {ends[k]} after {ends[k - 1]})")
    if (lengths == 0).any():
        k = int(np.argmax(lengths == 0))
        raise DatasetError(f"{p('episode_ends.npy')}: episode {k} is empty (ends must be strictly increasing and > 0)")
    if ends[-1] != N:
        raise DatasetError(f"{p('episode_ends.npy')}: last end is {ends[-1]} but frames.npy has {N} frames")

    states = _load_npy(data_dir, 'states.npy', required=False)
    if states is not None:
        if states.dtype != np.float32 or states.ndim != 2:
            raise DatasetError(f"{p('states.npy')}: dtype/shape is {states.dtype} {states.shape}, expected float32 (N, state_dim)")
        if len(states) != N:
            raise DatasetError(f"{p('states.npy')}: has {len(states)} rows but frames.npy has {N}")
        _check_finite(states, p('states.npy'))

    mpath = p('meta.json')
    if not os.path.isfile(mpath):
        raise DatasetError(f"{mpath}: file is missing")
    try:
        with open(mpath) as f:
            meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{mpath}: not valid JSON ({e})")
    if not isinstance(meta, dict):
        raise DatasetError(f"{mpath}: must hold a JSON object, got {type(meta).__name__}")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise DatasetError(f"{mpath}: missing keys {missing}")
    A = actions.shape[1]
    if meta['image_size'] != H:
        raise DatasetError(f"{mpath}: image_size is {meta['image_size']!r} but frames.npy holds {H}x{W} images")
    if meta['action_dim'] != A:
        raise DatasetError(f"{mpath}: action_dim is {meta['action_dim']!r} but actions.npy has {A} columns")
    if meta['num_episodes'] != len(ends):
        raise DatasetError(f"{mpath}: num_episodes is {meta['num_episodes']!r} but episode_ends.npy has {len(ends)}")
    for k in ('action_low', 'action_high'):
        v = meta[k]
        if not (isinstance(v, list) and len(v) == A and all(isinstance(x, (int, float)) for x in v)):
            raise DatasetError(f"{mpath}: {k} must be a list of {A} numbers, got {v!r}")
    if not (isinstance(meta['fps'], (int, float)) and meta['fps'] > 0):
        raise DatasetError(f"{mpath}: fps must be a positive number, got {meta['fps']!r}")

    return dict(frames=frames, actions=actions, episode_ends=ends, meta=meta, states=states)


def episode_ranges(episode_ends):
    """[(start, end), ...] row ranges, end exclusive."""
    starts = [0] + [int(e) for e in episode_ends[:-1]]
    return list(zip(starts, [int(e) for e in episode_ends]))


# -----------------------------------------------------------------------------
# splits and action normalization

def split_episodes(num_episodes, val_frac=0.1, seed=0):
    """Split episode ids into (train_ids, val_ids), sorted; by episode so no clip straddles the split."""
    if num_episodes < 2:
        raise DatasetError(f"need at least 2 episodes to split into train and val, got {num_episodes}")
    if not 0.0 <= val_frac < 1.0:
        raise ValueError(f"val_frac must be in [0, 1), got {val_frac}")
    perm = np.random.default_rng(seed).permutation(num_episodes)
    n_val = min(max(1, round(val_frac * num_episodes)), num_episodes - 1)
    return sorted(int(i) for i in perm[n_val:]), sorted(int(i) for i in perm[:n_val])


def action_stats(actions, episode_ends, episode_ids, eps=1e-3):
    """Per-dimension min/max of the actions in the given episodes only (pass the train ids)."""
    ranges = episode_ranges(episode_ends)
    if len(episode_ids) == 0:
        raise ValueError("action_stats needs at least one episode id")
    low = np.full(actions.shape[1], np.inf)
    high = np.full(actions.shape[1], -np.inf)
    for i in episode_ids:
        s, e = ranges[i]
        for j in range(s, e, CHUNK_ROWS):
            chunk = np.asarray(actions[j:min(e, j + CHUNK_ROWS)], dtype=np.float64)
            low = np.minimum(low, chunk.min(0))
            high = np.maximum(high, chunk.max(0))
    # a constant dimension would divide by zero: widen it to eps around its value
    narrow = (high - low) < eps
    mid = (high + low) / 2
    low = np.where(narrow, mid - eps / 2, low)
    high = np.where(narrow, mid + eps / 2, high)
    return {"low": [float(x) for x in low], "high": [float(x) for x in high]}


def _bounds_like(a, stats):
    if isinstance(a, np.ndarray):
        dt = a.dtype if np.issubdtype(a.dtype, np.floating) else np.float32
        return a.astype(dt, copy=False), np.asarray(stats['low'], dt), np.asarray(stats['high'], dt)
    import torch  # only when given a tensor, so data.py itself stays torch-free
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"expected a numpy array or torch tensor, got {type(a).__name__}")
    a = a if a.is_floating_point() else a.float()
    low = torch.as_tensor(stats['low'], dtype=a.dtype, device=a.device)
    high = torch.as_tensor(stats['high'], dtype=a.dtype, device=a.device)
    return a, low, high


def normalize_actions(a, stats):
    """Map [low, high] to [-1, 1] per dimension (last axis); numpy in, numpy out; tensor in, tensor out."""
    a, low, high = _bounds_like(a, stats)
    return (a - low) / (high - low) * 2 - 1


def denormalize_actions(a, stats):
    """Inverse of normalize_actions."""
    a, low, high = _bounds_like(a, stats)
    return (a + 1) / 2 * (high - low) + low


# -----------------------------------------------------------------------------
# writing

def _check_out_dir(out_dir, overwrite):
    """Refuse early (before hours of collection) to clobber existing data."""
    if os.path.exists(out_dir):
        if not os.path.isdir(out_dir):
            raise DatasetError(f"{out_dir}: exists and is not a folder")
        if os.listdir(out_dir) and not overwrite:
            raise DatasetError(f"{out_dir}: folder exists and is not empty; refusing to overwrite it "
                               f"(pass overwrite=True / --overwrite=True to replace it)")


def _sibling_dir(out_dir, tag):
    # a fresh hidden folder next to out_dir (plain mkdir, so the umask applies, unlike tempfile.mkdtemp's 0700)
    path = os.path.abspath(out_dir)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")
    os.makedirs(tmp)
    return tmp


def write_dataset(out_dir, frames_list, actions_list, meta, states_list=None, overwrite=False):
    """Write per-episode arrays as one dataset folder, atomically (temp folder, validate, rename)."""
    _check_out_dir(out_dir, overwrite)
    E = len(frames_list)
    if E == 0 or len(actions_list) != E or (states_list is not None and len(states_list) != E):
        raise DatasetError(f"{out_dir}: need one actions (and states) array per episode and at least one "
                           f"episode; got {E} frames, {len(actions_list)} actions, "
                           f"{None if states_list is None else len(states_list)} states")
    for k, (f, a) in enumerate(zip(frames_list, actions_list)):
        f, a = np.asarray(f), np.asarray(a)
        # no silent casts: float frames in [0, 1] would turn into black uint8 images
        if f.dtype != np.uint8 or f.ndim != 4:
            raise DatasetError(f"{out_dir}: episode {k} frames are {f.dtype} {f.shape}, expected uint8 (T, H, W, 3)")
        if not np.issubdtype(a.dtype, np.floating) or a.ndim != 2:
            raise DatasetError(f"{out_dir}: episode {k} actions are {a.dtype} {a.shape}, expected float (T, A)")
        if len(a) != len(f) or (states_list is not None and len(states_list[k]) != len(f)):
            raise DatasetError(f"{out_dir}: episode {k} has {len(f)} frames but {len(a)} actions"
                               + ("" if states_list is None else f" and {len(states_list[k])} states"))
    lengths = [len(f) for f in frames_list]
    derived = dict(image_size=int(np.shape(frames_list[0])[1]), action_dim=int(np.shape(actions_list[0])[1]),
                   num_episodes=E)
    meta = dict(meta)
    for k, v in derived.items():
        if meta.setdefault(k, v) != v:
            raise DatasetError(f"{out_dir}: meta {k}={meta[k]!r} but the arrays say {v}")

    tmp = _sibling_dir(out_dir, 'tmp')  # same filesystem, so the final rename is atomic
    try:
        N = sum(lengths)

        def write_concat(name, arrays, dtype):
            # stream episodes into a memory-mapped file: never holds the concatenation in memory
            shape = (N,) + np.asarray(arrays[0]).shape[1:]
            out = np.lib.format.open_memmap(os.path.join(tmp, name), mode='w+', dtype=dtype, shape=shape)
            i = 0
            for x in arrays:
                x = np.asarray(x)
                if x.shape[1:] != shape[1:]:
                    raise DatasetError(f"{out_dir}: {name} episodes differ in shape: {x.shape[1:]} vs {shape[1:]}")
                out[i:i + len(x)] = x
                i += len(x)
            out.flush()
            del out

        write_concat('frames.npy', frames_list, np.uint8)
        write_concat('actions.npy', actions_list, np.float32)
        if states_list is not None:
            write_concat('states.npy', states_list, np.float32)
        np.save(os.path.join(tmp, 'episode_ends.npy'), np.cumsum(lengths).astype(np.int64))
        with open(os.path.join(tmp, 'meta.json'), 'w') as f:
            json.dump(meta, f, indent=1)
        try:
            load_dataset(tmp)  # never rename a dataset into place that we could not read back
        except DatasetError as e:
            raise DatasetError(f"{out_dir}: not written, the data fails validation: {e}") from None

        if os.path.exists(out_dir):
            # move the old folder aside, put the new one in, only then delete the old one
            old = _sibling_dir(out_dir, 'old')
            aside = os.path.join(old, 'd')
            os.rename(out_dir, aside)
            try:
                os.rename(tmp, out_dir)
            except BaseException:
                os.rename(aside, out_dir)
                os.rmdir(old)
                raise
            shutil.rmtree(old)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# -----------------------------------------------------------------------------
# Push-T collection with a scripted "play" policy

LO, HI = 20.0, 492.0  # keep commanded targets off the walls (walls at 5 and 506, agent radius 15)
# T in the block's body frame: bar x in [-60, 60], y in [0, 30]; stem x in [-15, 15], y in [30, 120]
ROT_CONTACTS = [(55.0, 15.0), (-55.0, 15.0), (0.0, 110.0)]  # near the two bar ends and the stem end
CLEAR = 115.0  # radius around the block's centre that clears the T (max extent 75) plus the agent


def _block_centre(env):
    return np.array(env.block.local_to_world(env.block.center_of_gravity))


def _around(start, goal, c, rng, p_skip=0.15):
    """Waypoints from start to goal that go around the block (centre c) instead of through it."""
    d = goal - start
    t = np.clip(np.dot(c - start, d) / max(np.dot(d, d), 1e-9), 0, 1)
    if np.linalg.norm(start + t * d - c) > 85 or rng.random() < p_skip:  # clear path, or a sloppy "failure"
        return [goal]
    a0 = math.atan2(*(start - c)[::-1])
    a1 = math.atan2(*(goal - c)[::-1])
    da = (a1 - a0 + math.pi) % (2 * math.pi) - math.pi
    n = max(1, int(abs(da) // (math.pi / 3)))  # arc points at most 60 degrees apart
    pts = [c + CLEAR * np.array([math.cos(a0 + da * k / (n + 1)), math.sin(a0 + da * k / (n + 1))])
           for k in range(1, n + 1)]
    return pts + [goal]


def _new_primitive(env, target, rng):
    """Pick a primitive; return (waypoints, max step per 10 Hz step, max duration in steps, name)."""
    c = _block_centre(env)
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
        wps = _around(target, behind, c, rng) + [c + d * rng.uniform(40, 180)]
    elif kind == 'rotate':
        # touch near one end of the bar or stem and push tangentially so the T turns about its centre
        p = np.array(env.block.local_to_world(ROT_CONTACTS[rng.integers(3)]))
        r = p - c
        tang = np.array([-r[1], r[0]]) / (np.linalg.norm(r) + 1e-9) * rng.choice([-1.0, 1.0])
        wps = _around(target, p - tang * 40, c, rng) + [p + tang * rng.uniform(40, 120)]
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
    os.environ.setdefault('SDL_VIDEODRIVER', 'dummy')  # headless: pygame never opens a window
    os.environ.setdefault('PYGAME_HIDE_SUPPORT_PROMPT', '1')
    from gym_pusht.envs.pusht import PushTEnv

    rng = np.random.default_rng(seed + index)
    env = PushTEnv(obs_type='pixels', render_mode='rgb_array',
                   observation_width=image_size, observation_height=image_size)
    obs, _ = env.reset(seed=int(rng.integers(2 ** 31)))  # the env's own random start state
    frames = np.empty((episode_len, image_size, image_size, 3), np.uint8)
    actions = np.empty((episode_len, 2), np.float32)
    states = np.empty((episode_len, 5), np.float32)
    target = np.clip(np.array(env.agent.position, dtype=np.float64), LO, HI)
    wps, speed, steps_left = [], 0.0, 0
    for i in range(episode_len):
        frames[i] = obs
        states[i] = [*env.agent.position, *env.block.position, env.block.angle % (2 * math.pi)]
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
    """
    from tqdm import tqdm
    _check_out_dir(out_dir, overwrite)
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
    except Exception:
        src_version = 'unknown'
    meta = dict(fps=10, image_size=image_size, action_dim=2, action_low=[0.0, 0.0], action_high=[512.0, 512.0],
                source=f"gym_pusht {src_version} PushT-v0, scripted play policy (data.py)",
                num_episodes=num_episodes, episode_len=episode_len, seed=seed)
    write_dataset(out_dir, [r[0] for r in results], [r[1] for r in results], meta,
                  states_list=[r[2] for r in results], overwrite=overwrite)


# -----------------------------------------------------------------------------
# converting other robot datasets (run once; training then reads the folder above)

CONVERT_FORMATS = ('zarr', 'hdf5', 'lerobot', 'folder')
IMAGE_EXTS = ('.png', '.jpg', '.jpeg')


def convert(fmt, src, out_dir, camera='', crop='center', image_size=64, stride=1, action_keys='', action_dims=None,
            fps=0.0, swap_rb=None, max_episodes=0, skip_bad=False, overwrite=False):
    """Convert a robot dataset at `src` into a dataset folder at `out_dir`; return a short summary dict.

    Formats (the layouts read; anything else in the source is ignored):

    zarr     diffusion-policy replay buffer (a folder store, or a .zip): data/<camera> uint8 (N, H, W, 3)
             (default: the only 4-D array under data/, 'img' for Push-T), data/action (N, A), meta/episode_ends
             (exclusive ends), data/state (N, k) kept as states.npy when present. Zarr v2 and v3 stores both
             open with zarr 3 (and v2 stores with zarr 2). No fps is stored: pass --fps (Push-T: 10).
             Arrays compressed with codecs numcodecs lacks (diffusion-policy's imagecodecs JPEG-XL for real
             robot data) fail to read: register the codec first, or export the images another way.
    hdf5     ALOHA / ACT, one file per episode, --src is the folder of episode_*.hdf5 (natural order:
             episode_2 before episode_10): /observations/images/<camera> uint8 (T, H, W, 3), /action (T, A),
             /observations/qpos (T, k) kept as states.npy when present. The JPEG variant (act-plus-plus
             `compress`) is read too: per frame a row of padded JPEG bytes, (T, L) or (T, L, 1) uint8 or a
             variable-length uint8 dataset; the zero padding after the JPEG's end marker is dropped, so
             `compress_len` is not needed (it indexes cameras in the recorder's order, which the file does
             not store). Those JPEGs were written by OpenCV from the camera's RGB arrays, so they hold R and
             B swapped: decoded with PIL they are swapped back (swap_rb=None -> True here; --swap_rb=False
             if yours were written as true-colour JPEGs). fps: a root attribute `fps` if present, else --fps
             (ALOHA: 50).
    lerobot  LeRobot dataset root, read from disk with pyarrow and PyAV, no lerobot package needed:
             meta/info.json (codebase_version, fps, features, data_path, video_path templates).
             v2.x: one parquet and one mp4 per camera per episode, paths from the templates with
             episode_chunk = episode_index // chunks_size; episodes from meta/episodes.jsonl (else
             0..total_episodes-1). v3.x: many episodes per parquet/mp4 file, indexed by the rows of
             meta/episodes/**/*.parquet (data/chunk_index, data/file_index, videos/<key>/chunk_index,
             videos/<key>/file_index, videos/<key>/from_timestamp). Rows of an episode are selected by its
             episode_index column and ordered by frame_index; row t shows the video frame nearest to
             from_timestamp + timestamp[t] (v2: from_timestamp = 0), which must lie within 0.4 / fps of it.
             --camera is a feature key of dtype video or image ('observation.images.top') or its last part
             ('top'); image features (PNG/JPEG bytes in the parquet) work too. Actions: the 'action' column;
             states: 'observation.state' when present.
    folder   one folder per episode under --src (natural order), each with numbered images (png/jpg, natural
             order: 2.png before 10.png), in the episode folder itself or in <episode>/<camera>/, and
             actions.npy (T, A) or actions.csv (T rows of A numbers, optionally a header line of column
             names that --action_keys can select). Pass --fps.

    Options. Frames: RGB, `crop='center'` cuts the largest centred square before the resize to image_size
    (PIL bilinear, antialiased), `crop='none'` squashes the whole frame; frames already image_size square
    are copied exactly. `stride=k` keeps frames 0, k, 2k, ... of each episode with the action recorded at
    each kept frame (right for absolute targets such as positions; delta actions would need summing, which
    is not done) and writes fps = source fps / k. `action_keys` picks the arrays/columns that hold actions
    (concatenated in order), `action_dims` then keeps some of their columns. meta.json gets fps,
    action_low/high = the converted actions' min/max, and a source string naming the format, path and camera.

    Several cameras: one dataset per camera. Convert once per --camera into its own out_dir, train one
    world model per view, and drive them all with the same action sequence (as the paper's reference code
    does); nothing in training needs to know about the other views.

    Safety: out_dir is checked before any work, and written by write_dataset (temp folder, validated,
    renamed). An episode that cannot be read or is inconsistent (frames vs actions count, missing key,
    NaN/Inf action, undecodable image or video) stops the conversion with a DatasetError naming the file,
    the episode and the problem; skip_bad=True skips it with a warning instead (listed in meta.json as
    skipped_episodes). Converted frames are spooled to disk episode by episode, so memory holds one
    episode at a time.
    """
    if fmt not in CONVERT_FORMATS:
        raise DatasetError(f"unknown format {fmt!r}; choose one of {', '.join(CONVERT_FORMATS)}")
    src = os.path.expanduser(str(src))
    if not src or not os.path.exists(src):
        raise DatasetError(f"{src or '--src'}: source does not exist (pass --src=PATH)")
    if image_size < 4 or image_size % 4 != 0:
        raise ValueError(f"image_size must be a positive multiple of 4, got {image_size}")
    if not (isinstance(stride, int) and stride >= 1):
        raise ValueError(f"stride must be an integer >= 1, got {stride!r}")
    crop = 'none' if crop is None else str(crop).lower()
    if crop not in ('center', 'none'):
        raise ValueError(f"crop must be 'center' or 'none', got {crop!r}")
    _check_out_dir(out_dir, overwrite)  # refuse before a long conversion, not after

    keys = [k.strip() for k in str(action_keys or '').split(',') if k.strip()]
    dims = _conv_dims(action_dims)
    camera = str(camera or '')
    reader = {'zarr': _zarr_episodes, 'hdf5': _hdf5_episodes, 'lerobot': _lerobot_episodes,
              'folder': _folder_episodes}[fmt]
    episodes, info = reader(src, camera, keys)
    if max_episodes:
        episodes = episodes[:max_episodes]
    if not episodes:
        raise DatasetError(f"{src}: no episodes found for --convert={fmt}")
    src_fps = float(fps) if fps else info.get('fps')
    if not src_fps or src_fps <= 0:
        raise DatasetError(f"{src}: the {fmt} source does not record its frame rate; pass --fps=HZ")
    swap = info.get('swap_rb', False) if swap_rb is None else bool(swap_rb)

    from tqdm import tqdm
    spool = _sibling_dir(out_dir, 'spool')  # converted frames wait on disk, not in memory
    try:
        frames, actions, states, skipped = [], [], [], []
        for name, load in tqdm(episodes, desc=f'convert {fmt}', unit='ep'):
            try:
                f, a, s = _conv_episode(load, dims, stride, crop, image_size, swap)
                if actions and a.shape[1] != actions[0].shape[1]:
                    raise DatasetError(f"{a.shape[1]} action columns, but earlier episodes have {actions[0].shape[1]}")
                if actions and (s is None) != (states[0] is None):
                    raise DatasetError("has states where earlier episodes have none, or the other way round")
                if actions and s is not None and s.shape[1] != states[0].shape[1]:
                    raise DatasetError(f"{s.shape[1]} state columns, but earlier episodes have {states[0].shape[1]}")
            except Exception as e:  # any read/decode failure is this episode's fault: name it
                why = str(e) if isinstance(e, DatasetError) else f"{type(e).__name__}: {e}"
                if not skip_bad:
                    raise DatasetError(f"{name}: {why} (pass --skip_bad=True to skip bad episodes)") from e
                warnings.warn(f"skipping {name}: {why}")
                skipped.append(name)
                continue
            path = os.path.join(spool, f'{len(frames)}.npy')
            np.save(path, f)
            frames.append(np.load(path, mmap_mode='r'))
            actions.append(a)
            states.append(s)
        if not frames:
            raise DatasetError(f"{src}: all {len(episodes)} episodes were bad and skipped")
        allact = np.concatenate(actions)
        meta = dict(fps=src_fps / stride, image_size=image_size, action_dim=int(allact.shape[1]),
                    action_low=[float(x) for x in allact.min(0)], action_high=[float(x) for x in allact.max(0)],
                    source=f"{fmt} {os.path.abspath(src)}" + (f" camera {info['camera']}" if info.get('camera') else ''),
                    num_episodes=len(frames), source_fps=src_fps, camera=info.get('camera', ''), crop=crop,
                    stride=stride, action_keys=info.get('action_keys', keys), action_dims=dims,
                    skipped_episodes=skipped)
        write_dataset(out_dir, frames, actions, meta, overwrite=overwrite,
                      states_list=None if states[0] is None else states)
        return dict(episodes=len(frames), frames=int(allact.shape[0]), skipped=skipped, camera=info.get('camera', ''))
    finally:
        frames = None  # drop the memory maps before deleting their files
        shutil.rmtree(spool, ignore_errors=True)


def _conv_dims(action_dims):
    # --action_dims=0,1 arrives as a tuple, --action_dims=3 as an int, a config file may give a list or a string
    if action_dims is None or action_dims == '':
        return None
    if isinstance(action_dims, str):
        action_dims = [x for x in action_dims.split(',') if x.strip()]
    if isinstance(action_dims, int):
        action_dims = [action_dims]
    try:
        return [int(x) for x in action_dims]
    except (TypeError, ValueError):
        raise ValueError(f"action_dims must be column indices like 0,1 got {action_dims!r}") from None


def _conv_episode(load, dims, stride, crop, size, swap):
    """Read one source episode, check it, return (frames uint8 (T', S, S, 3), actions float32, states or None)."""
    ep = load()
    a = np.asarray(ep['actions'])
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
        raise DatasetError(f"actions are {a.dtype} {a.shape}, expected numbers (T, A)")
    if dims is not None:
        bad = [d for d in dims if not -a.shape[1] <= d < a.shape[1]]
        if bad:
            raise DatasetError(f"action_dims {bad} out of range for {a.shape[1]} action columns")
        a = a[:, dims]
    a = a.astype(np.float32)
    T = int(ep['n_frames'])
    if T == 0:
        raise DatasetError("has no frames")
    if len(a) != T:
        raise DatasetError(f"has {T} frames but {len(a)} actions")
    if not np.isfinite(a).all():
        raise DatasetError(f"NaN or Inf action at frame {int(np.argwhere(~np.isfinite(a))[0][0])}")
    s = ep.get('states')
    if s is not None:
        s = np.asarray(s, dtype=np.float32).reshape(len(s), -1)
        if len(s) != T:
            raise DatasetError(f"has {T} frames but {len(s)} states")
        if not np.isfinite(s).all():
            raise DatasetError(f"NaN or Inf state at frame {int(np.argwhere(~np.isfinite(s))[0][0])}")
        s = s[::stride]
    keep = list(range(0, T, stride))
    out = np.empty((len(keep), size, size, 3), np.uint8)
    n = 0
    for img in ep['frames'](keep):
        if n == len(keep):
            raise DatasetError(f"the reader gave more than the {len(keep)} frames asked for")
        try:
            out[n] = _conv_image(img, crop, size, swap)
        except DatasetError as e:
            raise DatasetError(f"frame {keep[n]}: {e}") from None
        n += 1
    if n != len(keep):
        raise DatasetError(f"only {n} of the {len(keep)} frames could be read")
    return out, a[::stride], s


def _conv_image(img, crop, size, swap):
    """One frame (ndarray or PIL image) -> uint8 (size, size, 3): optional R/B swap, centre crop, resize."""
    from PIL import Image
    if isinstance(img, Image.Image):
        img = np.asarray(img.convert('RGB'))
    img = np.asarray(img)
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[..., 0]
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)  # grayscale camera
    # no silent casts: float images in [0, 1] would turn black in uint8
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] not in (3, 4):
        raise DatasetError(f"image is {img.dtype} {img.shape}, expected uint8 (H, W, 3)")
    img = img[..., :3]
    if swap:
        img = img[..., ::-1]
    h, w = img.shape[:2]
    if crop == 'center' and h != w:
        m = min(h, w)
        img = img[(h - m) // 2:(h - m) // 2 + m, (w - m) // 2:(w - m) // 2 + m]
    if img.shape[:2] != (size, size):
        img = np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize((size, size), Image.BILINEAR))
    return img


def _need(module, pip_name, fmt):
    # optional packages load only for the converter that uses them
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"--convert={fmt} needs the '{pip_name}' package: pip install {pip_name}") from None


def _natural_key(name):
    # 'episode_2' before 'episode_10'
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r'(\d+)', os.path.basename(name))]


def _pick_camera(available, camera, where):
    """The one image stream to convert: the named one, or the only one there is."""
    if camera:
        hits = [k for k in available if k == camera] or [k for k in available if k.split('.')[-1] == camera]
        if len(hits) == 1:
            return hits[0]
        raise DatasetError(f"{where}: no single camera {camera!r}; cameras found: {sorted(available) or 'none'}")
    if len(available) == 1:
        return available[0]
    if not available:
        raise DatasetError(f"{where}: no camera images found")
    raise DatasetError(f"{where}: several cameras {sorted(available)}; pick one with --camera=NAME "
                       f"(one dataset per camera, convert again for another view)")


def _blocks(arr, start, keep, block=64):
    # read an on-disk array (zarr/h5py) in blocks: one read per frame is slow on chunked, compressed data
    for i in range(0, len(keep), block):
        ks = keep[i:i + block]
        chunk = np.asarray(arr[start + ks[0]:start + ks[-1] + 1])
        yield from chunk[[k - ks[0] for k in ks]]


def _columns(group, keys, where, name='action'):
    """Concatenate the named 1-D/2-D arrays of a zarr/h5py group as (T, sum of widths) columns."""
    cols = []
    for k in keys:
        if k not in group:
            raise DatasetError(f"{where}: no {name} array {k!r}")
        x = np.asarray(group[k][()])
        cols.append(x.reshape(len(x), -1))
    if len({len(c) for c in cols}) > 1:
        raise DatasetError(f"{where}: {name} arrays {keys} differ in length: {[len(c) for c in cols]}")
    return np.concatenate(cols, axis=1)


# ---- zarr (diffusion-policy replay buffer)

def _zarr_episodes(src, camera, keys):
    zarr = _need('zarr', 'zarr', 'zarr')
    store = src
    if src.endswith('.zip'):
        zip_store = getattr(getattr(zarr, 'storage', None), 'ZipStore', None) or zarr.ZipStore
        store = zip_store(src, mode='r')
    try:
        root = zarr.open_group(store=store, mode='r')
    except Exception as e:
        raise DatasetError(f"{src}: cannot be opened as a zarr group ({type(e).__name__}: {e})") from None
    if 'data' not in root or 'meta' not in root or 'episode_ends' not in root['meta']:
        raise DatasetError(f"{src}: not a replay buffer: need data/ and meta/episode_ends, found {sorted(root.keys())}")
    data = root['data']
    names = sorted(data.keys())
    images = [k for k in names if len(data[k].shape) == 4 and data[k].shape[-1] in (1, 3, 4)]
    cam = _pick_camera(images, camera, f"{src}/data")
    keys = keys or ['action']
    img = data[cam]
    act = _columns(data, keys, f"{src}/data")  # low-dim: small enough to read whole
    states = np.asarray(data['state'][:]) if 'state' in data else None
    ends = np.asarray(root['meta']['episode_ends'][:]).astype(np.int64).reshape(-1)
    n_img = img.shape[0]

    def loader(s, e):
        def load():
            if e <= s:
                raise DatasetError(f"meta/episode_ends is not increasing ({s} then {e})")
            n = max(0, min(e, n_img) - s)
            if n < e - s:
                raise DatasetError(f"ends at row {e} but data/{cam} has {n_img} frames")
            return dict(n_frames=n, actions=act[s:e], states=None if states is None else states[s:e],
                        frames=lambda keep: _blocks(img, s, keep))
        return load

    starts = np.concatenate([[0], ends[:-1]])
    eps = [(f"{src} episode {k} (rows {s}:{e})", loader(int(s), int(e))) for k, (s, e) in enumerate(zip(starts, ends))]
    return eps, dict(camera=cam, action_keys=keys)


# ---- hdf5 (ALOHA / ACT, one file per episode)

def _hdf5_episodes(src, camera, keys):
    h5py = _need('h5py', 'h5py', 'hdf5')
    files = sorted(glob.glob(os.path.join(src, 'episode_*.hdf5')), key=_natural_key)
    if not files:
        raise DatasetError(f"{src}: no episode_*.hdf5 files in this folder")
    keys = keys or ['action']
    # peek at the first file for fps, the camera's name (for meta.json) and whether it holds JPEG rows
    fps, cam0, jpeg0 = None, camera, False
    try:
        with h5py.File(files[0], 'r') as f:
            fps = float(f.attrs['fps']) if 'fps' in f.attrs else None
            cam0 = _pick_camera(sorted(f['observations/images'].keys()), camera, files[0])
            jpeg0 = _is_jpeg_rows(f[f'observations/images/{cam0}'], h5py)
    except Exception:
        pass  # a broken first file is reported (or skipped) as a bad episode below

    def loader(path):
        def load():
            with h5py.File(path, 'r') as f:
                if 'observations/images' not in f:
                    raise DatasetError("no /observations/images group")
                cam = _pick_camera(sorted(f['observations/images'].keys()), camera, 'observations/images')
                ds = f[f'observations/images/{cam}']
                n, jpeg = ds.shape[0], _is_jpeg_rows(ds, h5py)
                if not jpeg and ds.ndim != 4:
                    raise DatasetError(f"{ds.name} has shape {ds.shape}: neither frames (T, H, W, 3) nor JPEG rows")
                acts = _columns(f, keys, 'the file')
                states = np.asarray(f['observations/qpos'][()]) if 'observations/qpos' in f else None

            def frames(keep):
                with h5py.File(path, 'r') as f:
                    d = f[f'observations/images/{cam}']
                    for k, row in zip(keep, _blocks(d, 0, keep)):
                        yield _decode_jpeg(row, k, d.name) if jpeg else row
            return dict(n_frames=n, actions=acts, states=states, frames=frames)
        return load

    eps = [(f"{p} (episode {i})", loader(p)) for i, p in enumerate(files)]
    return eps, dict(fps=fps, camera=cam0, action_keys=keys, swap_rb=jpeg0)


def _is_jpeg_rows(ds, h5py):
    # the JPEG variant: one row of encoded bytes per frame, padded, or a variable-length byte array
    return h5py.check_vlen_dtype(ds.dtype) is not None or ds.ndim == 2 or (ds.ndim == 3 and ds.shape[2] == 1)


def _decode_jpeg(row, k, where):
    from PIL import Image
    data = np.trim_zeros(np.asarray(row, dtype=np.uint8).reshape(-1), 'b')  # padding after the FFD9 end marker
    try:
        img = Image.open(io.BytesIO(data.tobytes()))
        img.load()
        return img
    except Exception as e:
        raise DatasetError(f"{where} frame {k}: undecodable JPEG ({type(e).__name__}: {e})") from None


# ---- LeRobot (v2.x: one file per episode; v3.x: many episodes per file)

def _lerobot_episodes(src, camera, keys):
    pq = _need('pyarrow.parquet', 'pyarrow', 'lerobot')
    info_path = os.path.join(src, 'meta', 'info.json')
    if not os.path.isfile(info_path):
        raise DatasetError(f"{src}: no meta/info.json, not a LeRobot dataset root")
    with open(info_path) as f:
        info = json.load(f)
    version = str(info.get('codebase_version', ''))
    major = version.lstrip('v').split('.')[0]
    if major not in ('2', '3'):
        raise DatasetError(f"{info_path}: codebase_version {version!r} is not supported (v2.x and v3.x are)")
    feats = info.get('features', {})
    cams = [k for k, v in feats.items() if v.get('dtype') in ('video', 'image')]
    cam = _pick_camera(cams, camera, info_path)
    is_video = feats[cam]['dtype'] == 'video'
    keys = keys or ['action']
    missing = [k for k in keys if k not in feats]
    if missing:
        raise DatasetError(f"{info_path}: no feature {missing}; features: {sorted(feats)}")
    state_key = 'observation.state' if 'observation.state' in feats else None
    fps = float(info['fps'])
    cols = keys + ([state_key] if state_key else []) + [cam] * (not is_video)

    if major == '2':
        path = os.path.join(src, 'meta', 'episodes.jsonl')
        if os.path.isfile(path):
            with open(path) as f:
                ids = [int(json.loads(line)['episode_index']) for line in f if line.strip()]
        else:
            ids = list(range(int(info['total_episodes'])))
        per = int(info.get('chunks_size', 1000))
        rows = []
        for ep in ids:
            fmt = dict(episode_chunk=ep // per, episode_index=ep, video_key=cam)
            rows.append((ep, os.path.join(src, info['data_path'].format(**fmt)),
                         os.path.join(src, info['video_path'].format(**fmt)) if is_video else None, 0.0))
    else:
        files = sorted(glob.glob(os.path.join(src, 'meta', 'episodes', '**', '*.parquet'), recursive=True),
                       key=_natural_key)
        if not files:
            raise DatasetError(f"{src}: no meta/episodes/**/*.parquet (the v3 episode index)")
        want = ['episode_index', 'data/chunk_index', 'data/file_index']
        if is_video:
            want += [f'videos/{cam}/chunk_index', f'videos/{cam}/file_index', f'videos/{cam}/from_timestamp']
        rows = []
        for p in files:
            names = pq.read_schema(p).names
            if any(w not in names for w in want):
                raise DatasetError(f"{p}: missing columns {[w for w in want if w not in names]}")
            t = pq.read_table(p, columns=want).to_pydict()
            for i in range(len(t['episode_index'])):
                data = info['data_path'].format(chunk_index=t['data/chunk_index'][i], file_index=t['data/file_index'][i])
                video = None
                if is_video:
                    video = os.path.join(src, info['video_path'].format(
                        video_key=cam, chunk_index=t[f'videos/{cam}/chunk_index'][i],
                        file_index=t[f'videos/{cam}/file_index'][i]))
                rows.append((int(t['episode_index'][i]), os.path.join(src, data), video,
                             float(t[f'videos/{cam}/from_timestamp'][i]) if is_video else 0.0))
        rows.sort()
    cache = {}  # v3: consecutive episodes share one parquet file, read it once

    def loader(ep, data_path, video_path, t0):
        def load():
            if data_path not in cache:
                if not os.path.isfile(data_path):
                    raise DatasetError(f"data file {data_path} is missing")
                names = pq.read_schema(data_path).names
                lost = [c for c in cols if c not in names]
                if lost:
                    raise DatasetError(f"{data_path} lacks columns {lost}")
                extra = [c for c in ('episode_index', 'frame_index', 'timestamp') if c in names]
                cache.clear()
                cache[data_path] = pq.read_table(data_path, columns=cols + extra)
            table = cache[data_path]
            if 'episode_index' in table.column_names:
                ids = table.column('episode_index').to_numpy()
                table = table.take(np.flatnonzero(ids == ep))
            if 'frame_index' in table.column_names:
                table = table.take(np.argsort(table.column('frame_index').to_numpy(), kind='stable'))
            n = table.num_rows
            if 'timestamp' in table.column_names:
                times = table.column('timestamp').to_numpy().astype(np.float64)
            else:
                times = np.arange(n) / fps
            acts = np.concatenate([_arrow_matrix(table.column(k), k) for k in keys], axis=1) if n else np.zeros((0, 1))
            states = _arrow_matrix(table.column(state_key), state_key) if state_key and n else None
            if is_video:
                frames = lambda keep: _video_frames(video_path, t0 + times[keep], fps)
            else:
                frames = lambda keep: (_decode_image_cell(table.column(cam)[k].as_py(), src, k) for k in keep)
            return dict(n_frames=n, actions=acts, states=states, frames=frames)
        return load

    eps = [(f"{src} episode {ep} ({os.path.relpath(d, src)}" + (f", {os.path.relpath(v, src)})" if v else ")"),
            loader(ep, d, v, t0)) for ep, d, v, t0 in rows]
    return eps, dict(fps=fps, camera=cam, action_keys=keys)


def _arrow_matrix(col, name):
    """A parquet column of numbers or of equal-length lists of numbers -> (rows, width) float64."""
    import pyarrow as pa
    import pyarrow.compute as pc
    col = col.combine_chunks()
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        if len(set(lengths.tolist())) > 1:
            raise DatasetError(f"column {name!r} has rows of different lengths {sorted(set(lengths.tolist()))}")
        values = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.float64)
        return values.reshape(len(col), -1)
    return col.to_numpy(zero_copy_only=False).astype(np.float64).reshape(len(col), 1)


def _decode_image_cell(cell, root, k):
    # LeRobot image features: {'bytes': PNG/JPEG bytes, 'path': ...}
    from PIL import Image
    try:
        data = cell.get('bytes') if isinstance(cell, dict) else cell
        img = Image.open(io.BytesIO(data)) if data else Image.open(os.path.join(root, cell['path']))
        img.load()
        return img
    except Exception as e:
        raise DatasetError(f"row {k}: undecodable image ({type(e).__name__}: {e})") from None


def _video_frames(path, wanted, fps):
    """Yield the decoded frame nearest to each wanted time (seconds, increasing), as RGB arrays."""
    av = _need('av', 'av', 'lerobot')
    if not os.path.isfile(path):
        raise DatasetError(f"video {path} is missing")
    tol = 0.4 / fps  # nearer than half a frame: a missing or shifted frame is an error, never a silent repeat
    with av.open(path) as box:
        stream = box.streams.video[0]
        if len(wanted) and wanted[0] > tol:
            # jump to the keyframe before the episode's start: v3 files hold many episodes
            box.seek(int(max(0.0, wanted[0] - tol) / stream.time_base), stream=stream, backward=True)
        prev = None  # (time, frame) of the last decoded frame before the current wanted time
        decoded = box.decode(stream)
        cur = None
        for w in wanted:
            # advance until a frame at or past w; the nearest frame is then prev or cur
            while cur is None or cur[0] < w:
                prev = cur
                fr = next(decoded, None)
                if fr is None:
                    cur = None
                    break
                if fr.pts is None:
                    raise DatasetError(f"video {path}: a frame has no timestamp")
                cur = (float(fr.pts * stream.time_base), fr)
            best = min([c for c in (prev, cur) if c is not None], key=lambda c: abs(c[0] - w), default=None)
            if best is None or abs(best[0] - w) > tol:
                got = 'no frame' if best is None else f"nearest frame at {best[0]:.4f} s"
                raise DatasetError(f"video {path}: no frame at {w:.4f} s ({got})")
            yield best[1].to_ndarray(format='rgb24')


# ---- folder (one folder of numbered images + actions file per episode)

def _folder_episodes(src, camera, keys):
    dirs = sorted([d for d in glob.glob(os.path.join(src, '*')) if os.path.isdir(d)], key=_natural_key)
    if not dirs:
        raise DatasetError(f"{src}: no episode folders inside")

    def loader(d):
        def load():
            img_dir = os.path.join(d, camera) if camera else d
            if not os.path.isdir(img_dir):
                raise DatasetError(f"no camera folder {camera!r}")
            names = sorted([n for n in os.listdir(img_dir) if n.lower().endswith(IMAGE_EXTS)], key=_natural_key)
            acts = _folder_actions(d, keys)

            def frames(keep):
                from PIL import Image
                for k in keep:
                    try:
                        img = Image.open(os.path.join(img_dir, names[k]))
                        img.load()
                    except Exception as e:
                        raise DatasetError(f"{names[k]}: undecodable image ({type(e).__name__}: {e})") from None
                    yield img
            return dict(n_frames=len(names), actions=acts, frames=frames)
        return load

    return [(f"{d} (episode {i})", loader(d)) for i, d in enumerate(dirs)], dict(camera=camera, action_keys=keys)


def _folder_actions(d, keys):
    npy, csv = os.path.join(d, 'actions.npy'), os.path.join(d, 'actions.csv')
    if os.path.isfile(npy):
        if keys:
            raise DatasetError("action_keys name CSV columns, but this episode has actions.npy")
        return np.load(npy, allow_pickle=False)
    if not os.path.isfile(csv):
        raise DatasetError("no actions.csv or actions.npy")
    import csv as csvlib
    with open(csv, newline='') as f:
        rows = [r for r in csvlib.reader(f) if r and any(x.strip() for x in r)]
    header = None
    if rows:
        try:
            [float(x) for x in rows[0]]
        except ValueError:
            header, rows = [x.strip() for x in rows[0]], rows[1:]  # a line of column names
    if keys:
        if header is None:
            raise DatasetError(f"actions.csv has no header line to pick columns {keys} from; use --action_dims")
        lost = [k for k in keys if k not in header]
        if lost:
            raise DatasetError(f"actions.csv has no columns {lost}; it has {header}")
        idx = [header.index(k) for k in keys]
        rows = [[r[i] for i in idx] for r in rows]
    try:
        a = np.array([[float(x) for x in r] for r in rows], dtype=np.float64)
    except ValueError as e:
        raise DatasetError(f"actions.csv: not a table of numbers ({e})") from None
    return a.reshape(len(rows), -1) if rows else np.zeros((0, 1))


if __name__ == '__main__':
    from common import configure
    cfg = configure(DEFAULTS)
    print(cfg)
    if cfg['convert']:
        opts = {k: cfg[k] for k in ('camera', 'crop', 'image_size', 'stride', 'action_keys', 'action_dims', 'fps',
                                    'swap_rb', 'max_episodes', 'skip_bad', 'overwrite')}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter('always')  # every skipped episode is reported
                r = convert(cfg['convert'], cfg['src'], cfg['out_dir'], **opts)
        except (DatasetError, ValueError, ImportError) as e:
            raise SystemExit(f"error: {e}")
        print(f"wrote {r['episodes']} episodes ({r['frames']} frames, camera {r['camera'] or '-'}) to "
              f"{cfg['out_dir']}" + (f"; skipped {len(r['skipped'])} bad episodes" if r['skipped'] else ''))
        raise SystemExit(0)
    try:
        generate_pusht(cfg['out_dir'], cfg['num_episodes'], cfg['episode_len'], cfg['image_size'],
                       num_workers=cfg['num_workers'], seed=cfg['seed'], overwrite=cfg['overwrite'])
    except (DatasetError, ValueError) as e:
        raise SystemExit(f"error: {e}")
    print(f"wrote {cfg['num_episodes']} episodes to {cfg['out_dir']}")
