"""
Convert other robot datasets, once, into the dataset folder format data.py reads (training then reads
only that folder), and concatenate dataset folders:

    python convert.py --format=zarr    --src=pusht_cchi_v7_replay.zarr --out_dir=data/dp_pusht --fps=10 \
                      --image_point_dims=0,1 --image_point_range=0,512
    python convert.py --format=hdf5    --src=aloha_sim_insertion/ --camera=top --out_dir=data/aloha_top --fps=50
    python convert.py --format=lerobot --src=~/lerobot/aloha_mobile --camera=cam_high --out_dir=data/lr_high
    python convert.py --format=folder  --src=my_episodes/ --out_dir=data/mine --fps=15 --stride=3 --action_kind=delta
    python convert.py --format=concat  --src=data/pusht64,out/demos --out_dir=data/pusht64_plus_demos

See convert() for the layouts read, --stride / --action_kind for keeping every k-th frame, and
--image_point_dims for actions that are a point in the image; concat_datasets() for --format=concat.
"""
import glob
import importlib
import io
import json
import os
import re
import shutil
import warnings

import numpy as np

from data import DatasetError, _check_out_dir, _sibling_dir, load_dataset, write_dataset
import data as D

# -----------------------------------------------------------------------------
# defaults for `python convert.py` (override with --key=value or a config file)
format = ''             # zarr | hdf5 | lerobot | folder | concat
src = ''                # the source: zarr store, folder of episode_*.hdf5, LeRobot root, folder of episode folders;
                        # concat: a comma list of dataset folders
out_dir = ''            # the dataset folder to create
image_size = 64         # square frames, a multiple of 4
camera = ''             # image stream to keep ('' = the only one); one dataset per camera
crop = 'center'         # 'center': square centre crop before the resize; 'none': squash the frame to a square
stride = 1              # keep every stride-th frame; > 1 needs action_kind
action_kind = ''        # what an action is, for stride > 1: 'absolute' (a commanded position/joint target: the
                        # interval's last command is kept) or 'delta' (a change: the interval's commands are
                        # summed); or a comma list, one per converted action column, e.g. delta,delta,absolute
action_keys = ''        # '' = the format's action; else a comma list of arrays/columns, concatenated
action_dims = None      # None = all action columns; else column indices to keep, e.g. --action_dims=0,1
image_point_dims = None # None, or the two converted action columns that are an (x, y) point in the image, e.g. 0,1
image_point_range = None  # with image_point_dims: the action values at the frame's edges, LO,HI for x and y
                        # (Push-T: 0,512) or XLO,XHI,YLO,YHI; written as those columns' action_low/high
fps = 0.0               # source frame rate, needed where the source does not record it (zarr, hdf5, folder)
swap_rb = None          # None = auto (True only for JPEG in hdf5, written by OpenCV as BGR); True/False forces it
max_episodes = 0        # convert only the first k source episodes (0 = all)
skip_bad = False        # skip a corrupt or inconsistent episode with a warning instead of stopping
overwrite = False       # replace an existing non-empty out_dir
# -----------------------------------------------------------------------------

CONVERT_FORMATS = ('zarr', 'hdf5', 'lerobot', 'folder')
IMAGE_EXTS = ('.png', '.jpg', '.jpeg')
ACTION_KINDS = ('absolute', 'delta')


class _OptionError(DatasetError):
    """An option that does not fit the data (a column index past the action's width...): the same for
    every episode, so it stops the conversion even with skip_bad instead of skipping every episode."""


def convert(fmt, src, out_dir, camera='', crop='center', image_size=64, stride=1, action_kind='', action_keys='',
            action_dims=None, image_point_dims=None, image_point_range=None, fps=0.0, swap_rb=None, max_episodes=0,
            skip_bad=False, overwrite=False):
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

    Every format is read with data.py's alignment: action[t] is the command issued after seeing frame[t],
    and frame[t+1] results from it.

    Options. Frames: RGB, `crop='center'` cuts the largest centred square before the resize to image_size
    (PIL bilinear, antialiased), `crop='none'` squashes the whole frame; frames already image_size square
    are copied exactly. `action_keys` picks the arrays/columns that hold actions (concatenated in order),
    `action_dims` then keeps some of their columns. meta.json gets fps, action_low/high = the converted
    actions' min/max, a source string naming the format, path and camera, and the options below.

    Stride. `stride=k` keeps frames 0, k, 2k, ... of each episode (fps = source fps / k) and needs
    `action_kind` (at stride 1 every action is kept as it is, and the kind only goes into meta.json).
    Kept frame j is source frame jk; its action must be the command that leads from it to kept frame j+1,
    source frame (j+1)k, which results from the k source commands a[jk], ..., a[jk+k-1]:
      'absolute' (a commanded position or joint target): the target in force when frame (j+1)k is
                 reached, the last command of the interval, a[jk+k-1];
      'delta'    (a change of position): the total change over the interval, a[jk] + ... + a[jk+k-1];
      a comma list gives one kind per converted action column (delta arm, absolute gripper).
    An episode's last kept frame has an interval cut by the episode's end (when T-1 is not a multiple of
    k): it gets the last recorded command (absolute) or the sum of the commands left (delta), i.e. the
    command leading to where the episode's last action leads. data.py's format keeps it without a next
    frame, so no training target depends on it; it only enters action_low/high and the action statistics.
    States are observations of the frames, so they are kept at frames 0, k, 2k, ... like the frames.
    meta.json records stride and action_kind.

    Image points. `image_point_dims=(x, y)` declares two converted action columns to be a point in the
    image (x = column, y = row), e.g. 0,1 for diffusion-policy Push-T's targets in 0..512 px of a 512
    frame; `image_point_range` must then give the action values at the converted frame's edges (LO,HI
    for both, or XLO,XHI,YLO,YHI; after a centre crop, the edges of the cropped square): meta.json gets
    image_point_dims, and those columns' action_low/high are the range, not the data's min/max (only
    then may train_dynamics draw the action as a map, --dyn_action_map=True). A point cannot be a delta.

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
    kinds = _conv_kinds(action_kind)
    if stride > 1 and not kinds:
        raise ValueError(f"stride={stride} needs --action_kind: 'absolute' if an action is a commanded position or "
                         f"joint target (the last command of each {stride}-frame interval is kept), 'delta' if it is "
                         f"a change (the interval's {stride} commands are summed); or one kind per action column, "
                         f"e.g. --action_kind=delta,delta,absolute")
    points = _conv_points(image_point_dims, image_point_range, kinds)
    _check_out_dir(out_dir, overwrite)  # refuse before a long conversion, not after

    # the reader lists the episodes (cheap: nothing is decoded yet); each is then read, checked,
    # converted and spooled in turn
    keys = [k.strip() for k in str(action_keys or '').split(',') if k.strip()]
    dims = _conv_dims(action_dims)
    camera = str(camera or '')
    reader = {'zarr': _zarr_episodes, 'hdf5': _hdf5_episodes, 'lerobot': _lerobot_episodes,
              'folder': _folder_episodes}[fmt]
    episodes, info = reader(src, camera, keys)
    if max_episodes:
        episodes = episodes[:max_episodes]
    if not episodes:
        raise DatasetError(f"{src}: no episodes found for --format={fmt}")
    src_fps = float(fps) if fps else info.get('fps')
    if not src_fps or src_fps <= 0:
        raise DatasetError(f"{src}: the {fmt} source does not record its frame rate; pass --fps=HZ")
    # hdf5 JPEG rows were written by OpenCV (BGR): the reader says so, unless --swap_rb forces a choice
    swap = info.get('swap_rb', False) if swap_rb is None else bool(swap_rb)

    from tqdm import tqdm
    spool = _sibling_dir(out_dir, 'spool')  # converted frames wait on disk, not in memory
    try:
        frames, actions, states, skipped = [], [], [], []
        for name, load in tqdm(episodes, desc=f'convert {fmt}', unit='ep'):
            try:
                f, a, s = _conv_episode(load, dims, stride, kinds, points, crop, image_size, swap)
                if actions and a.shape[1] != actions[0].shape[1]:
                    raise DatasetError(f"{a.shape[1]} action columns, but earlier episodes have {actions[0].shape[1]}")
                if actions and (s is None) != (states[0] is None):
                    raise DatasetError("has states where earlier episodes have none, or the other way round")
                if actions and s is not None and s.shape[1] != states[0].shape[1]:
                    raise DatasetError(f"{s.shape[1]} state columns, but earlier episodes have {states[0].shape[1]}")
            except _OptionError as e:  # wrong for every episode: skipping them all would only hide it
                raise DatasetError(f"{name}: {e}") from e
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
        # meta.json: the action range is the converted actions' (after column selection and striding),
        # except for declared image points, whose range is where the frame's edges lie
        allact = np.concatenate(actions)
        low, high = [float(x) for x in allact.min(0)], [float(x) for x in allact.max(0)]
        if points:  # the image's edges, not the data's extent: where the action lies on the frame
            off = []  # points off the frame are allowed (the spot falls outside), but many hint at a wrong range
            for d, (lo, hi) in zip(points['dims'], points['ranges']):
                n = int(((allact[:, d] < lo) | (allact[:, d] > hi)).sum())
                if n:
                    off.append(f"{n} of {len(allact)} in column {d} (frame {lo:g}..{hi:g}, data {low[d]:g}..{high[d]:g})")
                low[d], high[d] = lo, hi
            if off:
                warnings.warn(f"actions outside the frame's range: {'; '.join(off)}; is --image_point_range right?")
        meta = dict(fps=src_fps / stride, image_size=image_size, action_dim=int(allact.shape[1]),
                    action_low=low, action_high=high,
                    source=f"{fmt} {os.path.abspath(src)}" + (f" camera {info['camera']}" if info.get('camera') else ''),
                    num_episodes=len(frames), source_fps=src_fps, camera=info.get('camera', ''), crop=crop,
                    stride=stride, action_kind=_kinds_meta(kinds), action_keys=info.get('action_keys', keys),
                    action_dims=dims, skipped_episodes=skipped)
        if points:
            meta['image_point_dims'] = points['dims']
        write_dataset(out_dir, frames, actions, meta, overwrite=overwrite,
                      states_list=None if states[0] is None else states)
        return dict(episodes=len(frames), frames=int(allact.shape[0]), skipped=skipped, camera=info.get('camera', ''))
    finally:
        frames = None  # drop the memory maps before deleting their files
        shutil.rmtree(spool, ignore_errors=True)


def _conv_dims(action_dims, name='action_dims'):
    """Column indices as a list (None = all). --action_dims=0,1 arrives as a tuple, --action_dims=3 as
    an int, a config file may give a list or a string."""
    if action_dims is None or action_dims == '':
        return None
    if isinstance(action_dims, str):
        action_dims = [x for x in action_dims.split(',') if x.strip()]
    if isinstance(action_dims, int):
        action_dims = [action_dims]
    try:
        return [int(x) for x in action_dims]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be column indices like 0,1 got {action_dims!r}") from None


def _conv_kinds(action_kind):
    """--action_kind as a list: [] (not given), one kind for every column, or one per converted column."""
    if action_kind is None:
        return []
    items = list(action_kind) if isinstance(action_kind, (list, tuple)) else str(action_kind).split(',')
    items = [str(k).strip().lower() for k in items if str(k).strip()]
    bad = [k for k in items if k not in ACTION_KINDS]
    if bad:
        raise ValueError(f"action_kind must be 'absolute' or 'delta' (or a comma list of them, one per action "
                         f"column), got {action_kind!r}")
    return items


def _kinds_meta(kinds):
    """action_kind for meta.json: 'absolute' / 'delta' when one kind covers every column, the list when
    they differ, None when not given."""
    if not kinds:
        return None
    return kinds[0] if len(set(kinds)) == 1 else kinds


def _conv_points(image_point_dims, image_point_range, kinds):
    """Check --image_point_dims / --image_point_range (what they need of each other and of action_kind);
    return None or {'dims': [x, y], 'ranges': [(xlo, xhi), (ylo, yhi)]}. The column count is checked per
    episode (_check_columns), once it is known."""
    dims = _conv_dims(image_point_dims, 'image_point_dims')
    if dims is None:
        if image_point_range not in (None, ''):
            raise ValueError("image_point_range is given without image_point_dims (the columns it applies to)")
        return None
    if len(dims) != 2 or dims[0] == dims[1] or min(dims) < 0:
        raise ValueError(f"image_point_dims must be two different action columns (x, y), e.g. 0,1; got {dims}")
    if image_point_range in (None, ''):
        raise ValueError("image_point_dims needs --image_point_range=LO,HI (or XLO,XHI,YLO,YHI): the action values "
                         "at the frame's edges, e.g. 0,512 for Push-T's targets in 0..512 px; the data's own min/max "
                         "would put the points in the wrong place")
    # LO,HI applies to both columns; XLO,XHI,YLO,YHI gives each its own (a frame range in action units)
    try:
        r = [float(x) for x in (image_point_range.split(',') if isinstance(image_point_range, str)
                                else image_point_range)]
    except (TypeError, ValueError):
        r = []
    if len(r) == 2:
        r = r * 2
    if len(r) != 4 or not (r[0] < r[1] and r[2] < r[3]):
        raise ValueError(f"image_point_range must be LO,HI or XLO,XHI,YLO,YHI with LO < HI, got {image_point_range!r}")
    # a kinds list too short for d is reported by _check_columns, once the column count is known
    for d in dims:
        kind = kinds[0] if len(kinds) == 1 else kinds[d] if d < len(kinds) else None
        if kind == 'delta':
            raise ValueError(f"action column {d} is declared a point in the image (image_point_dims) and a delta "
                             f"(action_kind): a change of position is not a place in the frame")
    return {'dims': dims, 'ranges': [(r[0], r[1]), (r[2], r[3])]}


def _check_columns(A, kinds, points):
    """The options that index the converted action columns fit their number A."""
    if len(kinds) > 1 and len(kinds) != A:
        raise _OptionError(f"action_kind lists {len(kinds)} kinds for {A} converted action columns "
                           f"(give one kind, or one per column)")
    if points and max(points['dims']) >= A:
        raise _OptionError(f"image_point_dims {points['dims']} name columns past the {A} converted action columns "
                           f"(they index the columns after action_keys / action_dims)")


def _stride_actions(a, stride, kinds):
    """The action of each kept frame 0, k, 2k, ... (k = stride) under convert()'s stride rule: per interval
    [jk, jk+k) the last command (absolute columns) or the sum of its commands (delta columns); the last
    interval is cut at the episode's end. a: (T, A) float32; kinds: one kind, or one per column."""
    if stride == 1:
        return a
    T, A = a.shape
    starts = np.arange(0, T, stride)
    out = a[np.minimum(starts + stride, T) - 1].copy()  # the interval's last command; the cut last interval: a[T-1]
    delta = np.array([k == 'delta' for k in (kinds * A if len(kinds) == 1 else kinds)])
    if delta.any():  # summed in float64, so a long interval adds no rounding beyond float32's own
        sums = np.add.reduceat(a.astype(np.float64), starts, axis=0)
        out[:, delta] = sums[:, delta].astype(np.float32)
    return out


def _conv_episode(load, dims, stride, kinds, points, crop, size, swap):
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
            raise _OptionError(f"action_dims {bad} out of range for {a.shape[1]} action columns")
        a = a[:, dims]
    # action_kind and image_point_dims index the columns kept above: checked against their number
    _check_columns(a.shape[1], kinds, points)
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
    # frames 0, k, 2k, ...: only the kept frames are decoded, and the reader must give exactly those
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
    return out, _stride_actions(a, stride, kinds), s


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
    img = img[..., :3]  # an alpha channel is dropped
    if swap:
        img = img[..., ::-1]
    h, w = img.shape[:2]
    if crop == 'center' and h != w:
        m = min(h, w)
        img = img[(h - m) // 2:(h - m) // 2 + m, (w - m) // 2:(w - m) // 2 + m]
    # PIL's bilinear resize filters over the source pixels when shrinking (antialiased), unlike a plain
    # bilinear lookup; a frame already at size is kept bit-exact
    if img.shape[:2] != (size, size):
        img = np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize((size, size), Image.BILINEAR))
    return img


def _need(module, pip_name, fmt):
    """Import an optional package; only the converter that uses it loads it, with a pip hint if missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"--format={fmt} needs the '{pip_name}' package: pip install {pip_name}") from None


def _natural_key(name):
    """Sort key for natural order: 'episode_2' before 'episode_10'."""
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
    """Yield rows start + keep of an on-disk array (zarr/h5py), read in blocks: one read per frame is
    slow on chunked, compressed data."""
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


# ---- readers. Each _FORMAT_episodes(src, camera, keys) returns ([(name, load), ...], info): one entry per
# episode, `name` for error messages, `load()` reading it only when called (one episode in memory at a
# time) and returning dict(n_frames, actions (T, A), states (T, k) or None/absent, frames), where
# frames(keep) yields the frames at the increasing indices `keep` (ndarray or PIL image); info holds fps
# (if the source records it), camera, action_keys and swap_rb (hdf5 JPEG) for meta.json and _conv_image.

# ---- zarr (diffusion-policy replay buffer)

def _zarr_episodes(src, camera, keys):
    """Reader for a diffusion-policy replay buffer (see convert()); episodes are row ranges of data/."""
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
    # the images stay on disk (read per episode, in blocks); actions, states and ends are small: read now
    img = data[cam]
    act = _columns(data, keys, f"{src}/data")  # low-dim: small enough to read whole
    states = np.asarray(data['state'][:]) if 'state' in data else None
    ends = np.asarray(root['meta']['episode_ends'][:]).astype(np.int64).reshape(-1)
    n_img = img.shape[0]

    def loader(s, e):
        """The load() of the episode in rows [s, e): a closure, so nothing is read until it is converted."""
        def load():
            """Read the episode: dict(n_frames, actions, states (or absent/None), frames(keep) -> images)."""
            if e <= s:
                raise DatasetError(f"meta/episode_ends is not increasing ({s} then {e})")
            n = max(0, min(e, n_img) - s)
            if n < e - s:
                raise DatasetError(f"ends at row {e} but data/{cam} has {n_img} frames")
            return dict(n_frames=n, actions=act[s:e], states=None if states is None else states[s:e],
                        frames=lambda keep: _blocks(img, s, keep))
        return load

    # episode k is rows [ends[k-1], ends[k]) (exclusive ends); a bad end is reported by that episode's load()
    starts = np.concatenate([[0], ends[:-1]])
    eps = [(f"{src} episode {k} (rows {s}:{e})", loader(int(s), int(e))) for k, (s, e) in enumerate(zip(starts, ends))]
    return eps, dict(camera=cam, action_keys=keys)


# ---- hdf5 (ALOHA / ACT, one file per episode)

def _hdf5_episodes(src, camera, keys):
    """Reader for ALOHA / ACT episode_*.hdf5 files (see convert()), raw or JPEG frames."""
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

    # each file is opened once for its small arrays and again, inside frames(), for its frames: no
    # handle stays open between episodes
    def loader(path):
        """The load() of one episode file: a closure, so nothing is read until it is converted."""
        def load():
            """Read the episode: dict(n_frames, actions, states (or absent/None), frames(keep) -> images)."""
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
                """Yield the kept frames (indices `keep`, increasing) one by one."""
                with h5py.File(path, 'r') as f:
                    d = f[f'observations/images/{cam}']
                    for k, row in zip(keep, _blocks(d, 0, keep)):
                        yield _decode_jpeg(row, k, d.name) if jpeg else row
            return dict(n_frames=n, actions=acts, states=states, frames=frames)
        return load

    eps = [(f"{p} (episode {i})", loader(p)) for i, p in enumerate(files)]
    return eps, dict(fps=fps, camera=cam0, action_keys=keys, swap_rb=jpeg0)


def _is_jpeg_rows(ds, h5py):
    """Whether an hdf5 image dataset is the JPEG variant: one row of encoded bytes per frame, padded,
    or a variable-length byte array."""
    return h5py.check_vlen_dtype(ds.dtype) is not None or ds.ndim == 2 or (ds.ndim == 3 and ds.shape[2] == 1)


def _open_image(src, what):
    """PNG/JPEG bytes or a file path -> a decoded PIL image; a DatasetError naming `what` if it does not decode
    (the one image decoder of the hdf5 and LeRobot readers)."""
    from PIL import Image
    try:
        img = Image.open(io.BytesIO(src) if isinstance(src, (bytes, bytearray)) else src)
        img.load()
        return img
    except Exception as e:
        raise DatasetError(f"{what} ({type(e).__name__}: {e})") from None


def _decode_jpeg(row, k, where):
    """One padded row of JPEG bytes (frame k of `where`) -> PIL image; DatasetError if undecodable."""
    data = np.trim_zeros(np.asarray(row, dtype=np.uint8).reshape(-1), 'b')  # padding after the FFD9 end marker
    return _open_image(data.tobytes(), f"{where} frame {k}: undecodable JPEG")


# ---- LeRobot (v2.x: one file per episode; v3.x: many episodes per file)

def _lerobot_episodes(src, camera, keys):
    """Reader for a LeRobot v2.x / v3.x dataset root (see convert()): parquet rows + video or image frames."""
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
    # the parquet columns read: actions, states, and the frames themselves when they are image cells
    cols = keys + ([state_key] if state_key else []) + [cam] * (not is_video)

    # rows: one (episode_index, parquet path, video path or None, video start time) per episode, in
    # episode order. v2 derives the paths from the templates; v3 reads them from its episode index.
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
        """The load() of episode `ep`: its parquet rows, and its video from time t0 (v3: files are shared)."""
        def load():
            """Read the episode: dict(n_frames, actions, states (or absent/None), frames(keep) -> images)."""
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
            # this episode's rows, in frame order (a v3 file holds many episodes, not necessarily sorted)
            table = cache[data_path]
            if 'episode_index' in table.column_names:
                ids = table.column('episode_index').to_numpy()
                table = table.take(np.flatnonzero(ids == ep))
            if 'frame_index' in table.column_names:
                table = table.take(np.argsort(table.column('frame_index').to_numpy(), kind='stable'))
            # frame t is looked up in the video by its timestamp, not by its position: a dropped or
            # duplicated video frame then shows as an error, never as a silent shift of the episode
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
    """Decode a LeRobot image feature cell, {'bytes': PNG/JPEG bytes, 'path': ...}, to a PIL image."""
    data = cell.get('bytes') if isinstance(cell, dict) else cell
    if not data and not (isinstance(cell, dict) and cell.get('path')):
        raise DatasetError(f"row {k}: undecodable image (no bytes and no path)")
    return _open_image(bytes(data) if data else os.path.join(root, cell['path']), f"row {k}: undecodable image")


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
    """Reader for one folder per episode of numbered images and an actions file (see convert())."""
    dirs = sorted([d for d in glob.glob(os.path.join(src, '*')) if os.path.isdir(d)], key=_natural_key)
    if not dirs:
        raise DatasetError(f"{src}: no episode folders inside")

    def loader(d):
        """The load() of episode folder d: a closure, so nothing is read until it is converted."""
        def load():
            """Read the episode: dict(n_frames, actions, states (or absent/None), frames(keep) -> images)."""
            img_dir = os.path.join(d, camera) if camera else d
            if not os.path.isdir(img_dir):
                raise DatasetError(f"no camera folder {camera!r}")
            # numbered images in natural order (2.png before 10.png); anything else in the folder is ignored
            names = sorted([n for n in os.listdir(img_dir) if n.lower().endswith(IMAGE_EXTS)], key=_natural_key)
            acts = _folder_actions(d, keys)

            def frames(keep):
                """Yield the kept frames (indices `keep`, increasing) one by one."""
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
    """An episode folder's actions.npy, or actions.csv (optional header line; `keys` pick named columns)."""
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
    # a first line that does not parse as numbers is taken as the column names
    header = None
    if rows:
        try:
            [float(x) for x in rows[0]]
        except ValueError:
            header, rows = [x.strip() for x in rows[0]], rows[1:]  # a line of column names
    if keys:  # --action_keys picks CSV columns by name, in the order given
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


def concat_datasets(dirs, out, overwrite=False):
    """Write the episodes of several dataset folders, in the order given, as one new dataset (e.g. play
    data + demos); return a short summary dict.

    The parts must agree on image size, action dim and fps (else DatasetError naming both parts), and
    on action_kind where they record one. Merged meta.json: fps; action_low/high = the union of the
    parts' ranges; image_point_dims (with the frame range it gives those columns) only when every part
    declares the same dims and range, else dropped with a note (the union of two different frame ranges
    would put the points wrong); action_kind and stride when every part records the same; a source
    string and the list of parts. states.npy is kept only when every part has states of one width."""
    dirs = [str(d) for d in dirs]
    if not dirs:
        raise DatasetError("concat needs at least one dataset folder (--src=DIR1,DIR2,...)")
    if any(os.path.abspath(d) == os.path.abspath(out) for d in dirs):
        raise DatasetError(f"{out}: the output folder is also one of the parts; write the concatenation elsewhere")
    _check_out_dir(out, overwrite)  # before reading the parts
    # load_dataset validates each part (and memory-maps it): a broken part is named before anything is written
    dss = [load_dataset(d) for d in dirs]
    metas = [ds['meta'] for ds in dss]
    m0 = metas[0]
    for d, m in zip(dirs, metas):
        for key in ('image_size', 'action_dim', 'fps'):
            if m[key] != m0[key]:
                raise DatasetError(f"{d}: {key} {m[key]} differs from {dirs[0]}'s {m0[key]}; only datasets with the "
                                   f"same image size, action dim and fps can be concatenated (convert again to match)")
    # a part without action_kind (Push-T collection, older conversions) is not a conflict, only unknown
    kinds = {json.dumps(m['action_kind']) for m in metas if m.get('action_kind')}
    if len(kinds) > 1:
        raise DatasetError(f"the parts record different action kinds {sorted(kinds)}: their actions do not mean the same")

    widths = {None if ds['states'] is None else ds['states'].shape[1] for ds in dss}
    with_states = None not in widths and len(widths) == 1
    if not with_states and widths != {None}:
        print(f"note: states.npy dropped (the parts' state widths: {[w for w in widths]}; kept only when all agree)")
    # the parts are memory-mapped: write_dataset streams their episodes into the new files
    frames, actions, states = [], [], []
    for ds in dss:
        for s, e in D.episode_ranges(ds['episode_ends']):  # memory-mapped slices: read while writing
            frames.append(ds['frames'][s:e])
            actions.append(ds['actions'][s:e])
            if with_states:
                states.append(ds['states'][s:e])
    meta = {'fps': m0['fps'],
            'action_low': np.min([m['action_low'] for m in metas], 0).tolist(),
            'action_high': np.max([m['action_high'] for m in metas], 0).tolist(),
            'source': 'concatenation of ' + '; '.join(f"{os.path.abspath(d)} ({m['source']})" for d, m in zip(dirs, metas)),
            'parts': [{'data_dir': os.path.abspath(d), 'num_episodes': len(ds['episode_ends'])} for d, ds in zip(dirs, dss)]}
    # stride is kept for the record only: equal fps is what makes the parts' steps the same duration
    for key in ('action_kind', 'stride'):  # facts about every action: kept only when every part states the same
        vals = [m.get(key) for m in metas]
        if vals[0] is not None and all(v == vals[0] for v in vals):
            meta[key] = vals[0]

    def point_frame(m):
        """A part's image points: its dims and the frame range those columns' action_low/high give."""
        dims = m.get('image_point_dims')
        return None if dims is None else (list(dims), [(m['action_low'][d], m['action_high'][d]) for d in dims])
    pts = [point_frame(m) for m in metas]
    if pts[0] is not None and all(p == pts[0] for p in pts):
        meta['image_point_dims'] = pts[0][0]
        for d, (lo, hi) in zip(*pts[0]):
            meta['action_low'][d], meta['action_high'][d] = lo, hi
    elif any(p is not None for p in pts):
        print(f"note: image_point_dims dropped: the parts declare {[p for p in pts]}, not all the same")
    write_dataset(out, frames, actions, meta, states if with_states else None, overwrite=overwrite)
    print(f"wrote {out}: {len(frames)} episodes from {len(dirs)} datasets")
    return dict(episodes=len(frames), frames=int(sum(len(a) for a in actions)), states=with_states)


def main(cfg):
    """`python convert.py ...`: convert or concatenate per cfg; errors exit with the message, not a traceback."""
    if not cfg['src'] or not cfg['out_dir']:
        raise SystemExit("usage: python convert.py --format=FORMAT --src=SOURCE --out_dir=NEW_FOLDER (see the top of convert.py)")
    if cfg['format'] not in CONVERT_FORMATS + ('concat',):
        raise SystemExit(f"error: --format={cfg['format']!r}; choose one of {', '.join(CONVERT_FORMATS + ('concat',))}")
    try:
        if cfg['format'] == 'concat':  # --src is then a comma list of dataset folders
            return concat_datasets([d for d in cfg['src'].split(',') if d], cfg['out_dir'], cfg['overwrite'])
        opts = {k: cfg[k] for k in ('camera', 'crop', 'image_size', 'stride', 'action_kind', 'action_keys', 'action_dims',
                                    'image_point_dims', 'image_point_range', 'fps', 'swap_rb', 'max_episodes',
                                    'skip_bad', 'overwrite')}
        with warnings.catch_warnings():
            warnings.simplefilter('always')  # every skipped episode is reported
            r = convert(cfg['format'], cfg['src'], cfg['out_dir'], **opts)
    except (DatasetError, ValueError, ImportError) as e:
        raise SystemExit(f"error: {e}")
    print(f"wrote {r['episodes']} episodes ({r['frames']} frames, camera {r['camera'] or '-'}) to "
          f"{cfg['out_dir']}" + (f"; skipped {len(r['skipped'])} bad episodes" if r['skipped'] else ''))
    return r


if __name__ == '__main__':
    from common import config_from_globals
    main(config_from_globals(globals()))
