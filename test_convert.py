"""
test_convert.py: the converters and concatenation (convert.py), on sources written inside the tests.

    python -m pytest -q test_convert.py
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
