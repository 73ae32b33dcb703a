"""
Episode datasets on disk: load, validate, split, normalize, write. Any robot data works once it is in
this format: pusht.py collects Push-T play data into it, convert.py converts other datasets into it.

    python data.py DIR       # check a dataset folder and print what it holds

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
                       "source": "...", "num_episodes": E,          # extra keys are allowed
                       "image_point_dims": [0, 1]}   # optional: action dims (x, y) that are a point in
                                                     # the image, action_low..action_high spanning the
                                                     # frame edge to edge (x = column, y = row); only
                                                     # then may the dynamics draw the action as a map
    states.npy        float32 (N, k), optional: the simulator's state per frame where there is one
                                            (pusht.py's collector writes the agent and T-block pose;
                                            its docstring gives the units). For testing metrics that
                                            read the state from pixels; training never reads it.

A hand-written dataset, e.g. two episodes of 3 and 2 frames:

    np.save('DIR/frames.npy', frames.astype(np.uint8))        # (5, 64, 64, 3)
    np.save('DIR/actions.npy', actions.astype(np.float32))    # (5, 2)
    np.save('DIR/episode_ends.npy', np.array([3, 5], dtype=np.int64))
    json.dump({...}, open('DIR/meta.json', 'w'))

load_dataset() checks all of the above and raises DatasetError naming the file and the problem.
"""
import json
import os
import secrets
import shutil

import numpy as np

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
    dims = meta.get('image_point_dims')
    if dims is not None and not (isinstance(dims, list) and len(dims) == 2 and len(set(dims)) == 2
                                 and all(isinstance(d, int) and 0 <= d < A and meta['action_high'][d] > meta['action_low'][d]
                                         for d in dims)):
        raise DatasetError(f"{mpath}: image_point_dims must be two different action dims in 0..{A - 1} whose "
                           f"action_low < action_high (the frame's range), got {dims!r}")

    return dict(frames=frames, actions=actions, episode_ends=ends, meta=meta, states=states)


def episode_ranges(episode_ends):
    """[(start, end), ...] row ranges, end exclusive."""
    starts = [0] + [int(e) for e in episode_ends[:-1]]
    return list(zip(starts, [int(e) for e in episode_ends]))


def window_targets(ranges, ids):
    """Every frame of the episodes ids that can be a training target (all but an episode's first), and the
    first row of its episode: (tgt, start), two int arrays for make_windows."""
    tgt = np.concatenate([np.arange(ranges[i][0] + 1, ranges[i][1]) for i in ids])
    start = np.concatenate([np.full(ranges[i][1] - ranges[i][0] - 1, ranges[i][0]) for i in ids])
    return tgt, start


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
    low, high = np.full(actions.shape[1], np.inf), np.full(actions.shape[1], -np.inf)
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
# training windows

def make_windows(targets, starts, W, actions_norm):
    """Index tables for a batch of training windows (stage 2). targets (B,): the frame each window ends
    on (never its episode's first frame); starts (B,): that episode's first frame. The window holds
    frames e-W+1..e, clamped at the episode start (its first frame repeated, as a rollout starts), and
    each frame p carries the action that produced it, a_{p-1}, when p-1 is in the episode, else 'no
    action' (the alignment of the format above: action[i] is issued after frame[i], frame[i+1] is its
    result). Returns frame_idx (B, W) int64 and act (B, W, A+1) float32: the normalised action
    (zeros where none) and a 'has action' bit, the layout of model.action_input."""
    e = np.asarray(targets, np.int64)[:, None]  # (B, 1)
    st = np.asarray(starts, np.int64)[:, None]  # (B, 1)
    p = e - W + 1 + np.arange(W)[None]  # (B, W) raw positions, may reach before the episode
    frame_idx = np.maximum(p, st)  # (B, W)
    valid = p - 1 >= st  # (B, W): an action of this episode produced frame p
    a = np.asarray(actions_norm, np.float32)[np.maximum(p - 1, 0)]  # (B, W, A)
    act = np.concatenate([a * valid[..., None], valid[..., None]], -1).astype(np.float32)  # (B, W, A+1)
    return frame_idx, act


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


if __name__ == '__main__':
    import sys
    if len(sys.argv) != 2:
        raise SystemExit("usage: python data.py DATASET_DIR")
    try:
        ds = load_dataset(sys.argv[1])
    except DatasetError as e:
        raise SystemExit(f"error: {e}")
    lengths = np.diff(ds['episode_ends'], prepend=0)
    print(f"{sys.argv[1]}: {len(lengths)} episodes, {len(ds['frames'])} frames of {ds['frames'].shape[1]}x"
          f"{ds['frames'].shape[2]} (episode length {lengths.min()}..{lengths.max()}), {ds['actions'].shape[1]}-d actions, "
          f"states {'yes' if ds['states'] is not None else 'no'}\nmeta: {json.dumps(ds['meta'])}")
