"""
test_convert.py: the converters, the stride rule and concatenation (convert.py), on sources written inside
the tests, and the own-data path end to end (convert -> both stages with config/*_own_cpu.py -> rollout).

    python -m pytest -q test_convert.py
"""
import io
import json
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

import common
import convert
import data

from test_smoke import ROOT, TINY_AE, TINY_DYN, _run


# ---------------------------------------------------------------------- converters (python convert.py --format=...)


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
    """Random (T, A) float32 actions in -2..5, different per seed."""
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
    """Write an array into a zarr group (zarr 3: create_array; zarr 2: create_dataset), in a few chunks."""
    # zarr 3 has create_array; zarr 2 has create_dataset
    if hasattr(group, 'create_array'):
        group.create_array(name, data=arr, chunks=arr.shape if arr.ndim < 4 else (3,) + arr.shape[1:])
    else:
        group.create_dataset(name, data=arr, chunks=arr.shape if arr.ndim < 4 else (3,) + arr.shape[1:])


@pytest.mark.parametrize('zarr_format', [2, 3])
def test_convert_zarr(tmp_path, zarr_format):
    """A replay buffer (zarr v2 and v3): frames, actions, states, episodes; stride 2 on absolute actions."""
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

    convert.convert('zarr', src, str(tmp_path / 'out'), image_size=16, fps=10)
    d = _conv_check(tmp_path / 'out', frames, actions)
    assert np.array_equal(d['states'], np.concatenate(states))
    assert d['meta']['fps'] == 10 and 'zarr' in d['meta']['source'] and src in d['meta']['source']

    # stride 2, absolute targets: frames 0, 2, 4... of each episode, each with the last command of its
    # interval (the episode's last frame: its last command), fps halved; states stay with their frames
    convert.convert('zarr', src, str(tmp_path / 's2'), image_size=16, fps=10, stride=2, action_kind='absolute',
                    action_dims=(1,))
    last = [[1, 3, 4], [1, 3, 5, 6], [1, 3]]  # lengths 5, 7, 4
    d = _conv_check(tmp_path / 's2', [f[::2] for f in frames], [a[i, 1:] for a, i in zip(actions, last)])
    assert np.array_equal(d['states'], np.concatenate([s[::2] for s in states]))
    assert d['meta']['fps'] == 5 and d['meta']['action_dim'] == 1 and d['meta']['action_kind'] == 'absolute'

    with pytest.raises(data.DatasetError, match='--fps'):  # zarr does not record its frame rate
        convert.convert('zarr', src, str(tmp_path / 'nofps'), image_size=16)


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
    """One ALOHA episode_*.hdf5 with two cameras (the second sees the inverted frames), raw or JPEG rows."""
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
    """ALOHA hdf5, raw and JPEG: natural episode order, --camera required with two views, colours unswapped."""
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
        convert.convert('hdf5', str(src), str(tmp_path / 'x'), image_size=16, fps=50)
    convert.convert('hdf5', str(src), str(tmp_path / 'out'), camera='top', image_size=16, fps=50)
    d = _conv_check(tmp_path / 'out', frames, actions, lossy=jpeg)
    assert np.array_equal(d['states'], np.concatenate(qpos))
    assert d['meta']['camera'] == 'top' and d['meta']['fps'] == 50
    if jpeg:  # the colours come back the right way round, not R/B swapped
        wrong = np.abs(np.asarray(d['frames'], np.float64) - np.concatenate(frames)[..., ::-1]).mean()
        assert wrong > 3 * LOSSY_MAE


def test_convert_hdf5_bad_episode(tmp_path):
    """An inconsistent episode stops the conversion naming file and problem, and leaves nothing behind."""
    pytest.importorskip('h5py')
    src = tmp_path / 'aloha'
    src.mkdir()
    for k in range(3):
        T = 5
        acts = _conv_actions(T - 1 if k == 1 else T, 3, k)  # episode 1: one action short
        _conv_write_aloha(str(src / f'episode_{k}.hdf5'), _conv_frames(T, 16, 16, k), acts,
                          _conv_actions(T, 3, k), cams=('top',))
    with pytest.raises(data.DatasetError, match=r'episode_1\.hdf5.*5 frames but 4 actions'):
        convert.convert('hdf5', str(src), str(tmp_path / 'out'), image_size=16, fps=50)
    assert not os.path.exists(tmp_path / 'out')  # nothing half-written
    assert [p for p in os.listdir(tmp_path) if p.startswith('.')] == []  # no temp or spool folders left


def _conv_write_mp4(path, frames, fps):
    """Encode frames as an mp4 (mpeg4, high bit rate) with one frame every 1/fps s."""
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
    """The parquet rows of one LeRobot episode."""
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
    """A LeRobot meta/info.json for v2.x (one file per episode) or v3.x (shared files)."""
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
    """LeRobot v2.1: one parquet and one mp4 per episode, the camera picked by its last name part."""
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

    convert.convert('lerobot', str(src), str(tmp_path / 'out'), camera='top', image_size=32)
    d = _conv_check(tmp_path / 'out', frames, actions, lossy=True)
    assert np.allclose(d['states'], np.concatenate(states))
    assert d['meta']['fps'] == fps and d['meta']['camera'] == cam


def test_convert_lerobot_v3(tmp_path):
    """LeRobot v3.0: episodes share one parquet and one mp4; each gets its own stretch, frame-exact; stride 3."""
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

    convert.convert('lerobot', str(src), str(tmp_path / 'out'), image_size=32)  # one camera: no --camera needed
    d = _conv_check(tmp_path / 'out', frames, actions, lossy=True)
    assert np.allclose(d['states'], np.concatenate(states))
    # each episode got its own stretch of the shared video: frame-exact, a one-frame shift would show
    video = np.concatenate(frames).astype(np.float64)
    for k, (s, e) in enumerate(data.episode_ranges(d['episode_ends'])):
        got = np.asarray(d['frames'][s:e], np.float64)
        assert np.abs(got - video[s:e]).mean() < LOSSY_MAE
        shifted = video[s + 1:e + 1] if e < len(video) else video[s - 1:e - 1]
        assert np.abs(got[:len(shifted)] - shifted).mean() > 2 * LOSSY_MAE
    convert.convert('lerobot', str(src), str(tmp_path / 's3'), image_size=32, stride=3, action_kind='absolute')
    last = [[2, 4], [2, 5, 6], [2, 3]]  # lengths 5, 7, 4: the last command of each 3-frame interval
    _conv_check(tmp_path / 's3', [f[::3] for f in frames], [a[i] for a, i in zip(actions, last)], lossy=True)


def _conv_write_folder(root, k, frames, actions, header=None):
    """Episode folder ep{k}: numbered PNGs and actions.csv (with a header line of column names if given)."""
    from PIL import Image
    ep = root / f'ep{k}'
    ep.mkdir(parents=True)
    for i, f in enumerate(frames):  # 2.png before 10.png: numbers, not strings, give the order
        Image.fromarray(f).save(ep / f'{i}.png')
    lines = ([','.join(header)] if header else []) + [','.join(repr(float(x)) for x in r) for r in actions]
    (ep / 'actions.csv').write_text('\n'.join(lines) + '\n')
    return ep


def test_convert_folder(tmp_path):
    """Image folders: centre crop of non-square frames, columns picked by name, stride 2 on delta actions."""
    src = tmp_path / 'eps'
    lengths = [12, 5]
    frames = [_conv_frames(T, 16, 24, k) for k, T in enumerate(lengths)]  # not square: centre crop
    actions = [_conv_actions(T, 3, k) for k, T in enumerate(lengths)]
    for k in range(2):
        _conv_write_folder(src, k, frames[k], actions[k], header=['x', 'y', 'grip'])
    convert.convert('folder', str(src), str(tmp_path / 'out'), image_size=16, fps=15, stride=2, action_kind='delta',
                    action_keys='grip,x')
    a0, a1 = actions[0][:, [2, 0]], actions[1][:, [2, 0]]  # delta: each pair of commands summed, the
    sums = [a0[0::2] + a0[1::2], np.concatenate([a1[0:4:2] + a1[1:4:2], a1[4:5]])]  # 5th frame's alone
    _conv_check(tmp_path / 'out', [f[::2, :, 4:20] for f in frames], sums)
    d = data.load_dataset(str(tmp_path / 'out'))
    assert d['meta']['fps'] == 7.5 and d['meta']['stride'] == 2 and d['meta']['action_kind'] == 'delta'


def _folder_source(src, E, T, S):
    """E episode folders of T random S x S frames and 2-d actions under src; returns (frames, actions)."""
    frames = [_conv_frames(T, S, S, k) for k in range(E)]
    actions = [_conv_actions(T, 2, k) for k in range(E)]
    for k in range(E):
        _conv_write_folder(src, k, frames[k], actions[k])
    return frames, actions


def test_convert_folder_bad_and_skip(tmp_path):
    """A corrupt image or a NaN action stops the conversion naming it; skip_bad skips the episode instead."""
    src = tmp_path / 'eps'
    frames, actions = _folder_source(src, 3, 4, 16)
    (src / 'ep1' / '2.png').write_bytes(b'not a png at all')  # a corrupt frame in episode 1
    with pytest.raises(data.DatasetError, match=r'ep1 \(episode 1\).*2\.png.*undecodable'):
        convert.convert('folder', str(src), str(tmp_path / 'out'), image_size=16, fps=15)
    assert not os.path.exists(tmp_path / 'out')

    with pytest.warns(UserWarning, match=r'skipping .*ep1'):
        r = convert.convert('folder', str(src), str(tmp_path / 'out'), image_size=16, fps=15, skip_bad=True)
    assert r['episodes'] == 2 and len(r['skipped']) == 1
    d = _conv_check(tmp_path / 'out', [frames[0], frames[2]], [actions[0], actions[2]])
    assert d['meta']['skipped_episodes'] == r['skipped']

    from PIL import Image
    Image.fromarray(frames[1][2]).save(src / 'ep1' / '2.png')  # episode 1 mended
    actions[2][3, 1] = np.nan  # NaN action: named with its frame
    (src / 'ep2' / 'actions.csv').write_text('\n'.join(','.join(repr(float(x)) for x in r) for r in actions[2]))
    with pytest.raises(data.DatasetError, match=r'ep2 \(episode 2\).*NaN or Inf action at frame 3'):
        convert.convert('folder', str(src), str(tmp_path / 'out2'), image_size=16, fps=15, skip_bad=False)


def test_convert_cli(tmp_path):
    """The command line: python convert.py --format=folder ...; errors exit non-zero with the message."""
    src = tmp_path / 'eps'
    frames, actions = _folder_source(src, 2, 3, 8)
    out = tmp_path / 'out'
    cmd = [sys.executable, 'convert.py', '--format=folder', f'--src={src}', f'--out_dir={out}', '--image_size=8']
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and '--fps' in r.stderr  # folders do not record their frame rate
    r = subprocess.run(cmd + ['--fps=20', '--stride=2'], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "--action_kind: 'absolute'" in r.stderr and "'delta'" in r.stderr
    r = subprocess.run(cmd + ['--fps=20', '--action_dims=1', '--image_point_dims=1,0', '--image_point_range=-2,5'],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and 'image_point_dims [1, 0]' in r.stderr  # 1 column kept: there is no column 1
    assert not os.path.exists(out)
    r = subprocess.run(cmd + ['--fps=20', '--action_dims=1'], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    _conv_check(out, frames, [a[:, 1:] for a in actions])


# ---------------------------------------------------------------------- the stride rule


def _sim_episode(T, kinds, rng):
    """A point moved by its commands, per column: p[t+1] = a[t] (absolute: a target) or p[t] + a[t] (delta:
    a change). Returns the positions p[0..T], one past the episode's last frame, and the commands a[0..T-1]."""
    p, a = np.zeros((T + 1, len(kinds))), np.zeros((T, len(kinds)))
    p[0] = rng.uniform(-1, 1, len(kinds))
    for t in range(T):
        for c, kind in enumerate(kinds):
            a[t, c] = rng.uniform(-3, 3) if kind == 'absolute' else rng.uniform(-1, 1)
            p[t + 1, c] = a[t, c] if kind == 'absolute' else p[t, c] + a[t, c]
    return p, a.astype(np.float32)


@pytest.mark.parametrize('kinds', [('absolute', 'absolute'), ('delta', 'delta'), ('delta', 'absolute')])
def test_stride_keeps_the_alignment(tmp_path, kinds):
    """After --stride=3 the data still obeys data.py's alignment: action[j] is what leads from kept frame j
    to kept frame j+1 (checked through the positions, stored as states, by the law that made them: not by
    the converter's formula); the last kept frame's action leads where the episode's last command led."""
    zarr = pytest.importorskip('zarr')
    rng = np.random.default_rng(0)
    lengths = [11, 7, 9]  # last intervals of 2 (cut), 1 (cut) and 3 (whole) frames
    sims = [_sim_episode(T, kinds, rng) for T in lengths]
    src = str(tmp_path / 'sim.zarr')
    root = zarr.open_group(src, mode='w')
    _conv_zarr_put(root, 'data/img', np.concatenate([_conv_frames(T, 8, 8, k) for k, T in enumerate(lengths)]))
    _conv_zarr_put(root, 'data/action', np.concatenate([a for _, a in sims]))
    _conv_zarr_put(root, 'data/state', np.concatenate([p[:-1] for p, _ in sims]).astype(np.float32))
    _conv_zarr_put(root, 'meta/episode_ends', np.cumsum(lengths).astype(np.int64))

    kind = kinds[0] if len(set(kinds)) == 1 else ','.join(kinds)
    convert.convert('zarr', src, str(tmp_path / 'out'), image_size=8, fps=30, stride=3, action_kind=kind)
    d = data.load_dataset(str(tmp_path / 'out'))
    assert d['meta']['fps'] == 10 and d['meta']['stride'] == 3
    assert d['meta']['action_kind'] == (kinds[0] if len(set(kinds)) == 1 else list(kinds))
    for (s, e), (p, _) in zip(data.episode_ranges(d['episode_ends']), sims):
        pos, act = np.asarray(d['states'][s:e], np.float64), np.asarray(d['actions'][s:e], np.float64)
        assert len(pos) == len(range(0, len(p) - 1, 3))
        after = np.concatenate([pos[1:], p[-1:]])  # the next kept frame's position; past the last: p[T]
        for c, k in enumerate(kinds):
            want = act[:, c] if k == 'absolute' else pos[:, c] + act[:, c]
            assert np.allclose(want, after[:, c], atol=1e-5), (k, c, want, after[:, c])
    # at stride 1 the kind changes nothing, and is recorded
    convert.convert('zarr', src, str(tmp_path / 's1'), image_size=8, fps=30, action_kind=kind)
    assert np.array_equal(data.load_dataset(str(tmp_path / 's1'))['actions'], np.concatenate([a for _, a in sims]))


def test_stride_needs_a_valid_action_kind(tmp_path):
    """stride > 1 without action_kind, an unknown kind, or a kinds list of the wrong length is refused."""
    src = tmp_path / 'eps'
    _conv_write_folder(src, 0, _conv_frames(6, 8, 8, 0), _conv_actions(6, 3, 0))
    kw = dict(image_size=8, fps=10, stride=2)
    with pytest.raises(ValueError, match=r"stride=2 needs --action_kind: 'absolute'.*'delta'"):
        convert.convert('folder', str(src), str(tmp_path / 'o1'), **kw)
    with pytest.raises(ValueError, match="action_kind must be 'absolute' or 'delta'"):
        convert.convert('folder', str(src), str(tmp_path / 'o2'), action_kind='relative', **kw)
    with pytest.raises(data.DatasetError, match='action_kind lists 2 kinds for 3 converted action columns'):
        convert.convert('folder', str(src), str(tmp_path / 'o3'), action_kind='delta,absolute', skip_bad=True, **kw)
    assert not [p for p in os.listdir(tmp_path) if p != 'eps']  # nothing written, no temp or spool left


# ---------------------------------------------------------------------- image points


def test_image_point_dims(tmp_path):
    """--image_point_dims declares two converted columns a point in the image: meta.json gets the dims, and
    those columns' action_low/high become the frame's range (the other columns keep the data's min/max)."""
    src = tmp_path / 'eps'
    actions = [_conv_actions(5, 3, k) for k in range(2)]  # values in -2..5
    for k in range(2):
        _conv_write_folder(src, k, _conv_frames(5, 8, 8, k), actions[k])
    acts = np.concatenate(actions)
    kw = dict(image_size=8, fps=10)
    convert.convert('folder', str(src), str(tmp_path / 'out'), image_point_dims=(2, 0),
                    image_point_range=(-4, 6, -3, 7), **kw)
    m = data.load_dataset(str(tmp_path / 'out'))['meta']
    assert m['image_point_dims'] == [2, 0]
    assert m['action_low'] == pytest.approx([-3, acts[:, 1].min(), -4]) and m['action_high'] == pytest.approx([7, acts[:, 1].max(), 6])
    convert.convert('folder', str(src), str(tmp_path / 'plain'), **kw)
    assert 'image_point_dims' not in data.load_dataset(str(tmp_path / 'plain'))['meta']
    with pytest.warns(UserWarning, match=r'outside the frame.s range: .* in column 0 \(frame 0\.\.1'):  # a wrong range shows
        convert.convert('folder', str(src), str(tmp_path / 'w'), image_point_dims='0,1', image_point_range='0,1', **kw)

    with pytest.raises(data.DatasetError, match=r'image_point_dims \[0, 3\] name columns past the 3'):
        convert.convert('folder', str(src), str(tmp_path / 'x1'), image_point_dims=(0, 3), image_point_range=(0, 1), **kw)
    with pytest.raises(ValueError, match='two different action columns'):
        convert.convert('folder', str(src), str(tmp_path / 'x2'), image_point_dims=(1,), image_point_range=(0, 1), **kw)
    with pytest.raises(ValueError, match='needs --image_point_range'):
        convert.convert('folder', str(src), str(tmp_path / 'x3'), image_point_dims=(0, 1), **kw)
    with pytest.raises(ValueError, match='LO < HI'):
        convert.convert('folder', str(src), str(tmp_path / 'x4'), image_point_dims=(0, 1), image_point_range=(5, 1), **kw)
    with pytest.raises(ValueError, match='column 1 is declared a point in the image .* and a delta'):
        convert.convert('folder', str(src), str(tmp_path / 'x5'), image_point_dims=(0, 1), image_point_range=(0, 1),
                        stride=2, action_kind='absolute,delta,delta', **kw)


# ---------------------------------------------------------------------- concatenation


def _concat_part(path, lengths, seed, size=8, states=True, meta=None):
    """A small dataset folder; returns its (frames, actions, states) per episode."""
    rng = np.random.default_rng(seed)
    f = [rng.integers(0, 256, (T, size, size, 3), dtype=np.uint8) for T in lengths]
    a = [rng.uniform(-1, 1, (T, 2)).astype(np.float32) for T in lengths]
    s = [rng.uniform(0, 1, (T, 3)).astype(np.float32) for T in lengths] if states else None
    m = dict(fps=10, action_low=np.concatenate(a).min(0).tolist(), action_high=np.concatenate(a).max(0).tolist(),
             source=f'part {seed}')
    m.update(meta or {})
    data.write_dataset(str(path), f, a, m, s)
    return f, a, s


def test_concat(tmp_path):
    """--format=concat: episodes in order, meta merged (image points and kind only when all agree), states
    only when every part has them; mismatched image size or action kinds refused."""
    pts = dict(image_point_dims=[0, 1], action_low=[-1.0, -1.0], action_high=[1.0, 1.0])
    fa, aa, sa = _concat_part(tmp_path / 'a', [4, 3], 1, meta=dict(pts, action_kind='delta', stride=2))
    fb, ab, sb = _concat_part(tmp_path / 'b', [5], 2, meta=dict(pts, action_kind='delta', stride=3))
    fc, ac, _ = _concat_part(tmp_path / 'c', [2, 2], 3, states=False)
    r = convert.concat_datasets([tmp_path / 'b', tmp_path / 'a'], tmp_path / 'ba')
    d = data.load_dataset(str(tmp_path / 'ba'))
    assert r['episodes'] == 3 and list(d['episode_ends']) == [5, 9, 12]  # b's episode, then a's two
    assert np.array_equal(d['frames'], np.concatenate(fb + fa)) and np.array_equal(d['actions'], np.concatenate(ab + aa))
    assert np.array_equal(d['states'], np.concatenate(sb + sa))
    m = d['meta']
    assert m['image_point_dims'] == [0, 1] and m['action_low'] == [-1, -1] and m['action_high'] == [1, 1]
    assert m['action_kind'] == 'delta' and 'stride' not in m  # strides 3 and 2 differ (their fps were made equal)
    assert [p['num_episodes'] for p in m['parts']] == [1, 2] and 'part 2' in m['source']

    # a part without states and without image points: neither is kept, the action range is the union
    out = tmp_path / 'ac'
    r = subprocess.run([sys.executable, 'convert.py', '--format=concat', f"--src={tmp_path / 'a'},{tmp_path / 'c'}",
                        f'--out_dir={out}'], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = data.load_dataset(str(out))
    assert list(d['episode_ends']) == [4, 7, 9, 11] and np.array_equal(d['actions'], np.concatenate(aa + ac))
    assert d['states'] is None and 'image_point_dims' not in d['meta'] and 'action_kind' not in d['meta']
    assert d['meta']['action_low'] == pytest.approx(np.concatenate(aa + ac).min(0).clip(max=-1).tolist())

    _concat_part(tmp_path / 'big', [3], 4, size=16)
    with pytest.raises(data.DatasetError, match=r"big: image_size 16 differs from .*a's 8"):
        convert.concat_datasets([tmp_path / 'a', tmp_path / 'big'], tmp_path / 'x')
    _concat_part(tmp_path / 'abs', [3], 5, meta=dict(action_kind='absolute'))
    with pytest.raises(data.DatasetError, match='different action kinds'):
        convert.concat_datasets([tmp_path / 'a', tmp_path / 'abs'], tmp_path / 'x')
    # image points over different frame ranges are dropped, not merged into a wrong range
    _concat_part(tmp_path / 'wide', [3], 6, meta=dict(image_point_dims=[0, 1], action_low=[-2.0, -1.0], action_high=[2.0, 1.0]))
    convert.concat_datasets([tmp_path / 'a', tmp_path / 'wide'], tmp_path / 'aw')
    assert 'image_point_dims' not in data.load_dataset(str(tmp_path / 'aw'))['meta']
    assert not os.path.exists(tmp_path / 'x')


# ---------------------------------------------------------------------- your own data, end to end


def _square_source(root, episodes=4, T=20, S=32, seed=0):
    """A `folder` source that is not Push-T: a coloured 8x8 square on grey, moved by (dx, dy) pixel deltas,
    its red channel set by a third, absolute command (a gripper). Returns the squares' positions per episode."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    where = []
    for e in range(episodes):
        ep = root / f'episode_{e}'
        ep.mkdir(parents=True)
        pos, grip, acts, seen = np.array([12, 12]), 0.0, [], []
        for t in range(T):
            f = np.full((S, S, 3), 90, np.uint8)
            f[pos[1]:pos[1] + 8, pos[0]:pos[0] + 8] = (int(100 + 150 * grip), 200, 40)
            Image.fromarray(f).save(ep / f'{t}.png')
            seen.append(pos.copy())
            step = np.array([rng.choice([m for m in (-2, -1, 0, 1, 2) if 0 <= pos[c] + m <= S - 8]) for c in (0, 1)])
            grip = float(rng.integers(0, 2))
            acts.append([step[0], step[1], grip])
            pos = pos + step
        np.save(ep / 'actions.npy', np.array(acts, np.float32))
        where.append(np.array(seen))
    return where


@pytest.fixture(scope='module')
def own_data(tmp_path_factory):
    """The square source converted by the command line at stride 2 (delta moves, absolute gripper), and
    stage 1 trained on it with config/ae_own_cpu.py plus tiny overrides."""
    tmp = tmp_path_factory.mktemp('own')
    where = _square_source(tmp / 'src')
    d, ae = str(tmp / 'data'), str(tmp / 'ae')
    r = _run(['convert.py', '--format=folder', f'--src={tmp / "src"}', f'--out_dir={d}', '--fps=20', '--image_size=32',
              '--stride=2', '--action_kind=delta,delta,absolute'], ROOT)
    assert r.returncode == 0, r.stderr
    r = _run(['train_ae.py', 'config/ae_own_cpu.py', f'--data_dir={d}', f'--out_dir={ae}', '--max_iters=3',
              '--eval_interval=3', '--val_frac=0.25'] + TINY_AE, ROOT)
    assert r.returncode == 0, r.stderr
    return dict(tmp=tmp, data=d, ae=f'{ae}/ckpt.pt', where=where)


def test_own_data_converts_trains_and_rolls_out(own_data):
    """The own-data path: converted pixels move as the strided actions say; stage 2 with
    config/dyn_own_cpu.py and rollout.py run, metrics.json has the model and copy rows."""
    d = data.load_dataset(own_data['data'])
    assert d['meta']['fps'] == 10 and d['meta']['action_dim'] == 3 and 'image_point_dims' not in d['meta']
    # the converted pixels move as the converted actions say: the square's corner at kept frame j+1 is
    # its corner at j plus the summed moves (read from the pixels, not from the source's bookkeeping)
    for (s, e), seen in zip(data.episode_ranges(d['episode_ends']), own_data['where']):
        fr = np.asarray(d['frames'][s:e])
        corner = np.array([[np.flatnonzero((f[..., 1] == 200).any(0))[0], np.flatnonzero((f[..., 1] == 200).any(1))[0]]
                           for f in fr])
        assert np.array_equal(corner, seen[::2])
        assert np.array_equal(corner[1:] - corner[:-1], d['actions'][s:e - 1, :2])
        assert np.array_equal(fr[1:, :, :, 0].max((1, 2)), (100 + 150 * d['actions'][s:e - 1, 2]).astype(np.uint8))

    tmp, dyn, ev = own_data['tmp'], str(own_data['tmp'] / 'dyn'), str(own_data['tmp'] / 'eval')
    r = _run(['train_dynamics.py', 'config/dyn_own_cpu.py', f'--data_dir={own_data["data"]}', f'--ae_ckpt={own_data["ae"]}',
              f'--out_dir={dyn}', '--max_iters=3', '--eval_interval=3', '--val_frac=0.25'] + TINY_DYN, ROOT)
    assert r.returncode == 0, r.stderr
    ck = common.load_checkpoint(f'{dyn}/ckpt.pt', expect_kind='dynamics')
    assert ck['action_dim'] == 3 and ck['action_map'] is None
    assert (ck['config']['lr'], ck['config']['dyn_spatial_attn']) == (2e-3, 'mid')  # the recipe file was applied
    r = _run(['rollout.py', f'--ckpt={dyn}/ckpt.pt', '--num_episodes=1', '--horizon=3', f'--out_dir={ev}',
              '--fps_steps=1', f'--lpips_dir={tmp}'], ROOT)
    assert r.returncode == 0, r.stderr
    m = json.load(open(f'{ev}/metrics.json'))
    for row in ('model', 'copy_baseline'):
        assert np.isfinite(m[row]['mse']) and len(m[row]['curves']['psnr']) == 3
    assert m['horizon'] == 3


def test_own_data_refuses_the_action_map(own_data):
    """--dyn_action_map=True draws the action as a point in the image: refused on data that does not say
    which action dims are one."""
    r = _run(['train_dynamics.py', 'config/dyn_own_cpu.py', f'--data_dir={own_data["data"]}', f'--ae_ckpt={own_data["ae"]}',
              f'--out_dir={own_data["tmp"] / "dyn_map"}', '--max_iters=1', '--dyn_action_map=True'] + TINY_DYN, ROOT)
    assert r.returncode != 0 and 'image_point_dims' in r.stderr, r.stderr
    assert not os.path.exists(own_data['tmp'] / 'dyn_map' / 'ckpt.pt')
