"""
Tests of distributed training and fault tolerance (issue 6): torchrun with 2 CPU processes (gloo),
2 ranks == 1 rank with grad_accum 2, an exact resume after SIGKILL, the NaN guard, start-up checks.
Tiny configs and data made inside the tests; about a minute on 2 CPU cores.

    python -m pytest -q tests_ddp_part.py
"""
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import common
import data
import model as M

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


def _ddp_fake_ae(path, S=32):
    """A stage-1 checkpoint with untrained tiny nets, written in-process (saves a training run)."""
    torch.manual_seed(0)
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
    d2 = _ddp_data(tmp_path / 'data2')
    r = _ddp_run(args[:1] + [f'--data_dir={d2}'] + args[2:] + [f'--out_dir={killed}', '--init_from=resume', '--dyn_ch=8'])
    assert r.returncode != 0 and 'dyn_ch' in r.stderr and 'data_dir' in r.stderr, r.stderr
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
