"""
How fast and how steady the live loop is.

    python bench.py --mode=speed                                   # random-init CPU and paper-size models
    python bench.py --mode=speed --ckpt=out/dyn/ckpt.pt            # a trained world model
    python bench.py --mode=stability --ckpt=out/dyn/ckpt.pt --steps=9000
    python bench.py --mode=diagnose --ckpt=out/dyn/ckpt.pt --out_dir=out/diagnose   # Push-T models
    python bench.py --mode=train --recipes=cpu                     # one training step of each stage

speed: frames per second of rollout.Simulator.step (one dynamics jump + decode_steps decoder jumps,
uint8 frame out) at batch 1 after warm-up; frames per second of N parallel rollouts; the cost of the
same networks in a multi-step sampler (multi_steps dynamics passes and multi_steps decoder jumps per
frame, as a diffusion world model would be), as a slow-down ratio. The Simulator has no such option
(training only ever draws the one 999 -> 0 dynamics jump), so that row is timed by calling the nets
multi_steps times per frame (_multi_stepper): its cost is real, its frames are not a sampler to use.
Also FLOPs per frame (torch.utils.flop_counter) and the FLOP/s they reach against this machine's fp32
matmul rate measured in the same run. Random weights are fine for speed: the cost of a forward pass
does not depend on the values. Writes OUT/speed.json, prints a markdown table.

stability: drives one world model for `steps` frames with smooth random actions (a damped random walk
on the commanded position: v <- act_smooth v + act_sigma range N(0, 1) - act_pull (a - centre),
a <- a + v, reflected at the action bounds), and per `report_every` frames reports non-finite latents,
the mean latent norm (1 by construction: a check), the mean squared change of the latent per step,
the colour drift of the frame vs the first frame, how often the agent and the T block are
detectable (pusht.pusht_detectable on every detect_every-th frame), how T-shaped the block still is
(pusht.block_shape_iou: IoU with a T drawn at its estimated pose), and FPS. Writes OUT/stability.json
and OUT/stability.png (the first frame, then the last frame of every report row).

train: ms per optimizer step (forward, backward, AdamW) of each stage at a recipe's sizes and batch, random
weights and data: stage 1 (encoder + consistency decoder, model.decoder_loss) and stage 2 (dynamics,
model.dynamics_loss with every frame a target), in fp32 and with bf16 autocast (on the CPU too: that is the
probe that says whether this machine's bf16 pays; the trainers stay fp32 there), and torch.compile'd when
--compile=True (the step is timed after a compile that may take a minute). Writes OUT/train.json.

diagnose (Push-T): where is the T block's error born? Four tables, written to OUT/diagnose.json:
  untouched  gym-pusht start states with the agent clear of the T and commanded to hold still, so the
             true T never moves: how T-shaped (pusht.block_shape_iou) and where (centroid drift, px) the
             block is in the truth, in decode(encode(truth)) and in the model's rollout, at a few steps;
  open loop  held-out episodes with the recorded actions, per block of 32 steps: block IoU of the
             decoder alone (decode(encode(truth))) and of the rollout, and the rollout's latent MSE
             against the encoded truth (copy-first-latent beside it): dynamics vs decoder;
  contact    from the real history (window-1 real frames) at every contact_every-th step, contact_len
             steps predicted with the recorded actions; where the true T moved (> 1 px or > 3 deg), the
             error of the predicted change of the T's centroid (px) and angle (deg), against
             predicting no change: is the T pushed the right way and turned by the right angle?
  fit        the stage-2 training loss (model.dynamics_loss, the run's context noise and targets) on
             fit_batches x 16 random windows of the training episodes and of unseen ones (as in open
             loop), the same draws for both: a ratio well above 1 is memorisation, a cue for more data.
The open loop and fit tables read unseen episodes from data_dir (rollout.unseen_episodes' rule).
"""
import ast
import contextlib
import json
import os
import time

import numpy as np
import torch

import model as M
import pusht
import rollout
from common import config_from_globals, pick_device, save_grid

# ---------------------------------------------------------------------------- defaults
mode = 'speed'  # 'speed', 'stability', 'diagnose' or 'train'
ckpt = ''  # dynamics checkpoint; '' = random-init models of the `recipes` sizes
ae_ckpt = ''  # '' = the autoencoder the dynamics checkpoint names
out_dir = 'out/bench'
device = 'auto'
seed = 0
threads = 0  # torch intra-op threads; 0 = torch's default
recipes = 'cpu,gpu'  # random-init sizes: cpu = config/*_pusht_cpu.py at 64x64, gpu = *_gpu.py at 128x128, tiny
batches = (1, 8, 32)  # parallel rollouts for the throughput (--batches=1,8; one: --batches=4,)
speed_steps = 10  # timed steps per measurement (fewer when max_seconds runs out; at least 1)
warmup = 3  # untimed steps first
max_seconds = 30.0  # per measurement; one whose estimate exceeds it is reported as an estimate instead
multi_steps = 20  # the multi-step sampler's cost: dynamics passes and decoder jumps per frame
matmul_size = 2048  # n of the n x n fp32 matmul that measures the machine's rate
bf16 = False  # CUDA only: bf16 autocast around the step
compile = False  # CUDA only: torch.compile the dynamics and decoder (train mode: any device, an extra row)
cuda_graphs = False  # CUDA only: torch.compile mode 'reduce-overhead' (CUDA graphs)
train_steps = 10  # train: timed optimizer steps per row (after 2 untimed ones)
steps = 9000  # stability: frames to drive
report_every = 1000  # stability: frames per report row
detect_every = 5  # stability: segment every k-th frame (segmentation costs ~12 ms a 64x64 frame)
act_smooth, act_sigma, act_pull = 0.9, 0.004, 0.002  # stability: the damped random walk (fractions of the range)
stop_on_nan = True  # stability: end after the report row in which a latent went non-finite
inject_nan_step = -1  # test hook: poison the context window with NaN at this step (-1: never)
num_states = 8  # diagnose: gym-pusht start states for the untouched-T test
num_episodes = 8  # diagnose: held-out episodes
horizon = 192  # diagnose: steps of the untouched-T test and of the open-loop rollouts
contact_every = 32  # diagnose: the short teacher-forced predictions start every this many steps
contact_len = 8  # diagnose: ... and run this many steps
data_dir = ''  # diagnose, stability: '' = the checkpoint's data (its held-out episodes); another dataset = all of it, a test set
fit_batches = 40  # diagnose: batches of 16 random windows for the one-step loss on training vs unseen episodes
# ------------------------------------------------------------------------------------
RECIPE_FILES = {'cpu': ('config/ae_pusht_cpu.py', 'config/dyn_pusht_cpu.py', 64),
                'gpu': ('config/ae_pusht_gpu.py', 'config/dyn_pusht_gpu.py', 128)}
TINY = dict(enc_ch=8, dec_ch=(8, 16), dec_attn=(False, True), latent_ch=4, emb_dim=16, heads=1, window=3,
            dyn_ch=8, dyn_depth=1, dyn_emb=16, dyn_heads=1, dyn_spatial_attn='mid', image_size=16)
HERE = os.path.dirname(os.path.abspath(__file__))


def _literals(path):
    """Top-level `name = literal` assignments of a Python file, read with ast (nothing is executed, so a
    trainer's defaults block can be read without starting the training)."""
    out = {}
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.Assign):
            try:
                val = ast.literal_eval(node.value)
            except ValueError:
                continue
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = val
    return out


def recipe_sizes(name):
    """Network sizes of a recipe: the trainers' defaults overridden by the recipe's config files."""
    if name == 'tiny':
        return dict(TINY)
    ae_cfg, dyn_cfg, S = RECIPE_FILES[name]
    c = _literals(os.path.join(HERE, 'train_ae.py')) | _literals(os.path.join(HERE, ae_cfg))
    c |= {k: v for k, v in (_literals(os.path.join(HERE, 'train_dynamics.py')) | _literals(os.path.join(HERE, dyn_cfg))).items()
          if k.startswith('dyn_') or k == 'window'}
    keys = ('enc_ch', 'dec_ch', 'dec_attn', 'latent_ch', 'emb_dim', 'heads', 'window', 'dyn_ch', 'dyn_depth', 'dyn_emb',
            'dyn_heads', 'dyn_spatial_attn', 'dyn_action_map')
    return {k: c[k] for k in keys} | {'image_size': S}


def random_world_model(sizes, dev, action_dim=2):
    """Random-init dynamics, encoder, decoder and the checkpoint fields Simulator reads. A recipe with
    dyn_action_map gets the map a Push-T dataset gives it (actions 0..512 spanning the frame)."""
    z, S = sizes, sizes['image_size']
    stats = {'low': [0.0] * action_dim, 'high': [512.0] * action_dim}
    enc = M.Encoder(z['enc_ch'], z['latent_ch']).to(dev).eval()
    dec = M.Decoder(tuple(z['dec_ch']), tuple(z['dec_attn']), z['latent_ch'], z['emb_dim'], z['heads']).to(dev).eval()
    amap = M.point_map([0, 1], stats, stats['low'], stats['high'], S, S // 4) if z.get('dyn_action_map') else None
    dyn = M.Dynamics(z['latent_ch'], z['dyn_ch'], z['dyn_depth'], action_dim, z['dyn_emb'], z['dyn_heads'],
                     z['dyn_spatial_attn'], amap).to(dev).eval()
    ck = {'action_dim': action_dim, 'config': {'window': z['window']}, 'action_map': amap,
          'data': {'image_size': S, 'action_stats': stats}}
    return dyn, enc, dec, ck


def n_params(m):
    """Number of parameters of a module."""
    return sum(p.numel() for p in m.parameters())


def _sync(dev):
    # CUDA runs asynchronously: wait for it before reading the clock
    if str(dev).startswith('cuda'):
        torch.cuda.synchronize()


def matmul_rate(dev, n=2048, reps=5):
    """Achieved fp32 FLOP/s of an n x n @ n x n matmul (2 n^3 FLOPs), best of `reps` after a warm-up."""
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    torch.mm(a, b)
    _sync(dev)
    best = float('inf')
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        _sync(dev)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def count_flops(fn):
    """FLOPs of one call of fn() (torch.utils.flop_counter: matmuls, convs, attention). CPU attention runs
    as aten._scaled_dot_product_flash_attention_for_cpu, which the counter does not know, so it is
    counted with the counter's own SDPA formula (4 B H Lq Lk d; causal masks counted as full)."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count
    extra = {}
    op = getattr(torch.ops.aten, '_scaled_dot_product_flash_attention_for_cpu', None)
    if op is not None:
        extra[op] = lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v)
    with FlopCounterMode(display=False, custom_mapping=extra) as fc:
        fn()
    return int(fc.get_total_flops())


def _time_steps(step, dev, n_steps, budget, warm):
    """Seconds per call of step(): `warm` untimed calls, then up to n_steps timed ones within budget (>= 1)."""
    for _ in range(warm):
        step()
    _sync(dev)
    t0, k = time.perf_counter(), 0
    while k < n_steps and (k == 0 or time.perf_counter() - t0 < budget):
        step()
        k += 1
    _sync(dev)
    return (time.perf_counter() - t0) / k


def make_sim(dyn, enc, dec, ck, dev, cfg, decode_steps=3):
    """The Simulator under test (context level 15, decode_steps decoder jumps), its nets compiled when
    cfg asks for it on CUDA."""
    sim = rollout.Simulator(dyn, enc, dec, ck, 0, 15, decode_steps, cfg['seed'])
    if str(dev).startswith('cuda') and (cfg['compile'] or cfg['cuda_graphs']):
        m = 'reduce-overhead' if cfg['cuda_graphs'] else 'default'
        sim.dyn, sim.dec = torch.compile(dyn, mode=m), torch.compile(dec, mode=m)
    return sim


def _stepper(sim, N, dev, cfg, rng):
    """step(): one Simulator.step of N rollouts from random frames with random actions (bf16 autocast
    when cfg asks for it on CUDA)."""
    S, A = sim.S, sim.A
    sim.reset(rng.integers(0, 256, (N, S, S, 3), dtype=np.uint8))
    acts = rng.uniform(0, 512, (64, N, A)).astype(np.float32)
    ctr = [0]
    use_bf16 = cfg['bf16'] and str(dev).startswith('cuda')

    def step():  # the next of 64 pre-drawn actions, so drawing them is not timed
        ctr[0] += 1
        with torch.autocast('cuda', dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext():
            sim.step(acts[ctr[0] % 64])
    return step


def _multi_stepper(sim, K, dev, cfg, rng):
    """step(): one frame of a K-step sampler at batch 1, for its cost only: K passes of the dynamics net
    over the window (K - 1 predict_next calls whose output is dropped, then the window_step that slides
    the window) and a K-jump decode, uint8 frame out. The Simulator always makes one dynamics jump
    (training never draws the (t, s) pairs of a longer chain), so this is how K jumps are timed."""
    S = sim.S
    sim.reset(rng.integers(0, 256, (1, S, S, 3), dtype=np.uint8))
    acts = torch.from_numpy(rng.uniform(-1, 1, (64, 1, sim.A)).astype(np.float32)).to(sim.dev)  # normalised
    ctr = [0]
    use_bf16 = cfg['bf16'] and str(dev).startswith('cuda')

    def step():  # as in _stepper: pre-drawn (already normalised) actions
        ctr[0] += 1
        a = acts[ctr[0] % 64]
        with torch.autocast('cuda', dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext():
            act = torch.cat([sim.act, M.action_input(a, 1)[:, None]], 1)
            for _ in range(K - 1):
                M.predict_next(sim.dyn, sim.ctx, act, sim.abar, sim.level, sim.gen)
            z, sim.ctx, sim.act = M.window_step(sim.dyn, sim.ctx, sim.act, a, sim.abar, sim.level, sim.gen)
            M.tensor_to_frames(M.decode(sim.dec, z, K, sim.abar, S, sim.gen))
    return step


def bench_speed(cfg):
    """--mode=speed (the top of the file); writes OUT/speed.json and returns it."""
    dev = pick_device(cfg['device'])
    torch.manual_seed(cfg['seed'])
    rng = np.random.default_rng(cfg['seed'])
    rate = matmul_rate(dev, cfg['matmul_size'])
    print(f"device {dev}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"fp32 matmul {cfg['matmul_size']}^3: {rate / 1e9:.1f} GFLOP/s")
    if cfg['ckpt']:
        dyn, enc, dec, ck = rollout.load_world_model(cfg['ckpt'], dev, cfg['ae_ckpt'])
        models = [('ckpt', dyn, enc, dec, ck)]
    else:
        models = [(r, *random_world_model(recipe_sizes(r), dev)) for r in cfg['recipes'].split(',') if r]
    batches = sorted({int(b) for b in cfg['batches']})  # batch 1 first: the others' estimates use it
    K = cfg['multi_steps']
    rows = []
    for name, dyn, enc, dec, ck in models:
        S = ck['data']['image_size']
        r = {'recipe': name, 'image_size': S, 'window': ck['config']['window'],
             'params_M': {'dynamics': n_params(dyn) / 1e6, 'decoder': n_params(dec) / 1e6, 'encoder': n_params(enc) / 1e6}}
        # FLOPs counted on the plain fp32 modules (a compiled graph hides its ops from the counter)
        psim = make_sim(dyn, enc, dec, ck, dev, cfg | {'compile': False, 'cuda_graphs': False})
        sim = make_sim(dyn, enc, dec, ck, dev, cfg)
        # cost of one jump of each network at batch 1 (the building blocks of any sampler)
        sim.reset(rng.integers(0, 256, (1, S, S, 3), dtype=np.uint8))
        z = sim.ctx[:, -1]
        ctx, act = sim.ctx, torch.cat([sim.act, sim.act[:, -1:]], 1)
        f_dyn = count_flops(lambda: M.predict_next(psim.dyn, ctx, act, sim.abar, 15))
        f_dec = count_flops(lambda: M.decode(psim.dec, z, 1, sim.abar, S))
        f_frame = count_flops(_stepper(psim, 1, dev, cfg, rng))
        r['gflops_per_frame'] = f_frame / 1e9
        r['gflops_per_jump'] = {'dynamics': f_dyn / 1e9, 'decoder': f_dec / 1e9}
        t_dyn = _time_steps(lambda: M.predict_next(sim.dyn, ctx, act, sim.abar, 15), dev, cfg['speed_steps'], cfg['max_seconds'], 1)
        t_dec = _time_steps(lambda: M.decode(sim.dec, z, 1, sim.abar, S), dev, cfg['speed_steps'], cfg['max_seconds'], 1)
        r['ms_per_jump'] = {'dynamics': t_dyn * 1e3, 'decoder': t_dec * 1e3}
        # the live loop at batch 1 (1 dynamics jump + 3 decoder jumps; one pass for a deterministic decoder),
        # then N parallel rollouts
        est1 = t_dyn + (1 if dec.deterministic else sim.ksteps) * t_dec
        fps = {}
        for N in batches:
            if est1 * N * (cfg['warmup'] + 1) > cfg['max_seconds'] and N > 1:
                # too slow to measure here: assume no gain from batching (the batch-1 rate), marked as estimated
                fps[N] = {'fps': fps[1]['fps'] if 1 in fps else 1 / est1, 'estimated': True}
                continue
            t = _time_steps(_stepper(sim, N, dev, cfg, rng), dev, cfg['speed_steps'], cfg['max_seconds'],
                            cfg['warmup'] if est1 * N * cfg['warmup'] < cfg['max_seconds'] else 1)
            fps[N] = {'fps': N / t, 'estimated': False}
        r['fps_by_batch'] = {str(N): v for N, v in fps.items()}
        base = fps[1]['fps'] if 1 in fps else 1 / est1
        r['fps_batch1'] = base
        r['achieved_gflops'] = f_frame * base / 1e9
        r['frac_of_matmul_rate'] = f_frame * base / rate
        # the same networks as a multi-step (diffusion-style) world model: K dynamics passes + K decoder
        # jumps per frame, timed by calling the nets K times (_multi_stepper), not through the Simulator
        est_k = K * (t_dyn + t_dec)
        how = f"the nets called {K} + {K} times per frame (bench._multi_stepper)"
        if est_k * 2 <= cfg['max_seconds']:
            t = _time_steps(_multi_stepper(sim, K, dev, cfg, rng), dev, cfg['speed_steps'], cfg['max_seconds'], 1)
            r['multi_step'] = {'jumps': K, 'fps': 1 / t, 'estimated': False, 'how': how}
        else:
            r['multi_step'] = {'jumps': K, 'fps': 1 / est_k, 'estimated': True, 'how': f"estimated: {K} x (dynamics + decoder jump)"}
        r['multi_step']['slowdown'] = base / r['multi_step']['fps']
        rows.append(r)
        print(f"{name}: {S}x{S}, {r['gflops_per_frame']:.2f} GFLOP/frame, batch-1 {base:.2f} FPS")
    out = {'device': dev, 'torch': torch.__version__, 'threads': torch.get_num_threads(),
           'matmul_gflops': rate / 1e9, 'date_utc': time.strftime('%Y-%m-%d %H:%M', time.gmtime()),
           'cuda_options': {k: cfg[k] for k in ('bf16', 'compile', 'cuda_graphs')} if str(dev).startswith('cuda') else None,
           'results': rows}
    os.makedirs(cfg['out_dir'], exist_ok=True)
    with open(os.path.join(cfg['out_dir'], 'speed.json'), 'w') as f:
        json.dump(out, f, indent=1)
    print(speed_table(out))
    return out


def speed_table(out):
    """Markdown table of a speed result; '~' marks numbers estimated from the per-jump timings."""
    def v(d):  # an FPS cell, '~' when estimated
        return ('~' if d['estimated'] else '') + f"{d['fps']:.3g}"
    Ns = sorted({int(n) for r in out['results'] for n in r['fps_by_batch']})
    head = ['recipe', 'size', 'params (M)', 'GFLOP/frame', 'FPS b1'] + [f"frames/s N={n}" for n in Ns if n != 1] + \
           ['multi-step FPS', 'slow-down', 'GFLOP/s', '% matmul']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for r in out['results']:
        p = sum(r['params_M'].values())
        cells = [r['recipe'], f"{r['image_size']}", f"{p:.2f}", f"{r['gflops_per_frame']:.3g}", f"{r['fps_batch1']:.3g}"]
        cells += [v(r['fps_by_batch'][str(n)]) if str(n) in r['fps_by_batch'] else '' for n in Ns if n != 1]
        ms = r['multi_step']
        cells += [v(ms) + f" ({ms['jumps']}+{ms['jumps']})", f"{ms['slowdown']:.1f}x", f"{r['achieved_gflops']:.3g}",
                  f"{100 * r['frac_of_matmul_rate']:.1f}"]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + f"\n\nfp32 matmul rate: {out['matmul_gflops']:.1f} GFLOP/s ({out['device']}, {out['threads']} threads)"


def smooth_actions(n, low, high, rng, smooth=0.9, sigma=0.004, pull=0.002, start=None):
    """n smooth random actions (n, A) inside [low, high]: a damped random walk on the commanded position,
    v <- smooth v + sigma range N(0, 1) - pull (a - centre), a <- a + v, reflected at the bounds; it
    starts at `start` (e.g. the episode's first recorded command, where the agent is) or the centre."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    rng_ = high - low
    a = (low + high) / 2 if start is None else np.clip(np.asarray(start, np.float64), low, high)
    v = np.zeros_like(low)
    out = np.empty((n, len(low)), np.float32)
    for i in range(n):
        v = smooth * v + sigma * rng_ * rng.standard_normal(len(low)) - pull * (a - (low + high) / 2)
        a = a + v
        over, under = a > high, a < low  # reflect: position mirrored, velocity flipped
        a = np.where(over, 2 * high - a, np.where(under, 2 * low - a, a))
        v = np.where(over | under, -v, v)
        out[i] = np.clip(a, low, high)
    return out


def _first_frame(ck, S, data_dir=''):
    """A real first frame and its recorded first command when a dataset is at hand (data_dir, '' = the checkpoint's
    own): the first episode the model never trained on (rollout.unseen_episodes); else a white frame, no command."""
    try:
        import data as D
        data_dir = data_dir or ck['data']['data_dir']
        ds = D.load_dataset(data_dir)
        ranges = D.episode_ranges(ds['episode_ends'])
        start = ranges[rollout.unseen_episodes(ck, data_dir, ranges)[0][0]][0]
        return np.array(ds['frames'][start:start + 1]), np.array(ds['actions'][start]), 'dataset'  # copies of a read-only memmap
    except Exception as e:
        print(f"note: no dataset to start from ({e}); a white frame instead. --data_dir=DIR starts from a real one")
        return np.full((1, S, S, 3), 255, np.uint8), None, 'white'


def bench_stability(cfg):
    """--mode=stability (the top of the file); writes OUT/stability.json and .png and returns the result."""
    dev = pick_device(cfg['device'])
    torch.manual_seed(cfg['seed'])
    rng = np.random.default_rng(cfg['seed'])
    if cfg['ckpt']:
        dyn, enc, dec, ck = rollout.load_world_model(cfg['ckpt'], dev, cfg['ae_ckpt'])
    else:
        dyn, enc, dec, ck = random_world_model(recipe_sizes(cfg['recipes'].split(',')[0]), dev)
    S = ck['data']['image_size']
    sim = make_sim(dyn, enc, dec, ck, dev, cfg)
    f0, a0, src = _first_frame(ck, S, cfg['data_dir']) if cfg['ckpt'] else (rng.integers(0, 256, (1, S, S, 3), dtype=np.uint8), None, 'random')
    sim.reset(f0)
    st = ck['data']['action_stats']
    acts = smooth_actions(cfg['steps'], st['low'], st['high'], rng, cfg['act_smooth'], cfg['act_sigma'], cfg['act_pull'], a0)
    mean0 = f0[0].reshape(-1, 3).astype(np.float64).mean(0)  # the first frame's mean colour
    rows, blk, first_bad, strip = [], None, None, [f0[0]]  # strip: the first frame, then the last of every row
    print(f"stability: {cfg['steps']} steps from a {src} frame, {S}x{S}, window {sim.W}, device {dev}")
    for k in range(cfg['steps']):
        if blk is None:
            blk = {'t': 0.0, 'n': 0, 'bad': 0, 'norm': [], 'dz': [], 'drift': [], 'agent': [], 'block': [], 'shape': []}
        if k == cfg['inject_nan_step']:
            sim.ctx = torch.full_like(sim.ctx, float('nan'))  # test hook
        prev = sim.ctx[:, -1].clone()
        t0 = time.perf_counter()
        frame = sim.step(acts[k:k + 1])
        _sync(dev)
        blk['t'] += time.perf_counter() - t0
        blk['n'] += 1
        z = sim.ctx[:, -1]  # the latent just predicted
        if not bool(torch.isfinite(z).all()):
            blk['bad'] += 1
            first_bad = k if first_bad is None else first_bad
        else:
            blk['norm'].append(float(z.norm(dim=1).mean()))  # per latent pixel, across channels: 1 by construction
            blk['dz'].append(float(((z - prev) ** 2).mean()) if bool(torch.isfinite(prev).all()) else float('nan'))
        blk['drift'].append(float(np.linalg.norm(frame[0].reshape(-1, 3).astype(np.float64).mean(0) - mean0)))
        if k % cfg['detect_every'] == 0:
            det = pusht.pusht_detectable(frame)
            blk['agent'].append(bool(det['agent'][0]))
            blk['block'].append(bool(det['block'][0]))
            blk['shape'].append(float(pusht.block_shape_iou(frame)[0]))
        if (k + 1) % cfg['report_every'] == 0 or k + 1 == cfg['steps']:
            row = {'steps': [k + 1 - blk['n'] + 1, k + 1], 'nonfinite_steps': blk['bad'],
                   'latent_norm': _mean(blk['norm']), 'latent_change': _mean(blk['dz']),
                   'colour_drift': _mean(blk['drift']), 'colour_drift_max': max(blk['drift']),
                   'agent_found': _mean(blk['agent']), 'block_found': _mean(blk['block']),
                   'block_shape_iou': _mean(blk['shape']), 'fps': blk['n'] / blk['t']}
            rows.append(row)
            strip.append(frame[0])
            print(' '.join(f"{a}={_fmt(b)}" for a, b in row.items()), flush=True)
            blk = None
            if first_bad is not None and cfg['stop_on_nan']:
                print(f"stopping: a latent went non-finite at step {first_bad}")
                break
    out = {'ckpt': os.path.abspath(cfg['ckpt']) if cfg['ckpt'] else f"random-init {cfg['recipes'].split(',')[0]}",
           'device': dev, 'steps_requested': cfg['steps'], 'steps_run': sum(r['steps'][1] - r['steps'][0] + 1 for r in rows),
           'first_nonfinite_step': first_bad, 'start_frame': src, 'image_size': S, 'window': sim.W,
           'detect_every': cfg['detect_every'], 'min_pixels': {k: pusht.min_pixels(S, k) for k in ('agent', 'block')},
           'actions': {k: cfg[k] for k in ('act_smooth', 'act_sigma', 'act_pull')},
           'date_utc': time.strftime('%Y-%m-%d %H:%M', time.gmtime()), 'rows': rows}
    os.makedirs(cfg['out_dir'], exist_ok=True)
    with open(os.path.join(cfg['out_dir'], 'stability.json'), 'w') as f:
        json.dump(out, f, indent=1)
    save_grid(os.path.join(cfg['out_dir'], 'stability.png'), [np.stack(strip)])  # look at it: is the scene still there?
    return out


def _mean(xs):
    # mean of the finite entries, None when there are none (JSON has no NaN)
    xs = [x for x in xs if x == x]  # drop NaN
    return float(np.mean(xs)) if xs else None


def _fmt(v):
    # a report value, floats to 4 significant digits
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _block(frames):
    """T-block pose (B, 3) (x px, y px, angle rad; NaN when not found) and shape IoU (B,) of uint8 frames."""
    seg = pusht.segment_pusht(frames)
    return pusht.block_pose(seg['block'], seg['agent']), pusht.block_shape_iou(frames)


def _wrap_deg(a):
    # |angle| wrapped to [0, 180] degrees
    return np.degrees(np.abs(pusht.angle_diff(a, 0)))


@torch.no_grad()
def one_step_loss(dyn, enc, ck, frames, actions, ranges, ids, n_batches, dev, seed=0, bs=16):
    """The stage-2 training loss on n_batches x bs random windows whose last frame lies in the episodes ids
    (frames encoded here). The seeds are fixed, so two sets of episodes, or two models, see the same draws
    of window position, noise level and noise. -> (mean, standard error of the mean)"""
    import data as D
    c, abar = ck['config'], M.sigmoid_alpha_bar().to(dev)
    a = D.normalize_actions(np.asarray(actions, np.float32), ck['data']['action_stats'])  # (N, A) in [-1, 1]
    tgt, start = D.window_targets(ranges, ids)  # as training draws them
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)  # dynamics_loss draws its levels and noise from torch's global generator
    losses = []
    for _ in range(n_batches):
        p = rng.integers(0, len(tgt), bs)
        fidx, act = D.make_windows(tgt[p], start[p], c['window'], a)  # (bs, W), (bs, W, A+1)
        z = enc(M.frames_to_tensor(np.asarray(frames[fidx.reshape(-1)]), dev))  # (bs*W, C, h, w)
        z = z.reshape(*fidx.shape, *z.shape[1:])  # (bs, W, C, h, w)
        losses.append(M.dynamics_loss(dyn, z, torch.from_numpy(act).to(dev), abar, c['ctx_noise'],
                                      c['all_frames']).item())
    return float(np.mean(losses)), float(np.std(losses) / np.sqrt(n_batches))


@torch.no_grad()
def bench_diagnose(cfg):
    """--mode=diagnose (the top of the file); writes OUT/diagnose.json and returns it."""
    import data as D
    dev = pick_device(cfg['device'])
    torch.manual_seed(cfg['seed'])
    dyn, enc, dec, ck = rollout.load_world_model(cfg['ckpt'], dev, cfg['ae_ckpt'])
    sim = make_sim(dyn, enc, dec, ck, dev, cfg)
    S, H, out = ck['data']['image_size'], cfg['horizon'], {}

    def recon(frames):  # decode(encode(frames)) with the simulator's decoder and jumps
        z = enc(M.frames_to_tensor(frames, dev))
        return M.tensor_to_frames(M.decode(dec, z, sim.ksteps, sim.abar, S, sim.gen)), z

    # 1. the untouched T: the truth is the first frame for every step
    states = pusht.sample_states(cfg['num_states'], cfg['seed'])
    first = pusht.RealSim(states, S).first  # (N, S, S, 3)
    hold = states[:, :2].astype(np.float32)  # the command = where the agent is: it stays
    sim.reset(first)
    z_true = enc(M.frames_to_tensor(first, dev))
    pose_t, shape_t = _block(first)
    steps = sorted({1, 10, 50, 100, H})
    rec, _ = recon(first)
    pose_r, shape_r = _block(rec)
    rows = [{'what': 'truth', 'step': 0, 'shape_iou': float(shape_t.mean()), 'drift_px': 0.0},
            {'what': 'decode(encode)', 'step': 0, 'shape_iou': float(shape_r.mean()),
             'drift_px': float(np.nanmean(np.linalg.norm(pose_r[:, :2] - pose_t[:, :2], axis=1)))}]
    for k in range(1, H + 1):
        fr = sim.step(hold)
        if k in steps:
            pose_m, shape_m = _block(fr)
            rows.append({'what': 'rollout', 'step': k, 'shape_iou': float(shape_m.mean()),
                         'drift_px': float(np.nanmean(np.linalg.norm(pose_m[:, :2] - pose_t[:, :2], axis=1))),
                         'block_iou': float(pusht.physics(fr, first)['block_iou'].mean()),
                         'latent_mse': float(((sim.ctx[:, -1] - z_true) ** 2).mean())})
    out['untouched'] = rows

    # 2. open loop on unseen episodes: decoder alone vs the rollout, per block of 32 steps
    data_dir = cfg['data_dir'] or ck['data']['data_dir']
    ds = D.load_dataset(data_dir)
    ranges = D.episode_ranges(ds['episode_ends'])
    unseen = rollout.unseen_episodes(ck, data_dir, ranges)[0]
    eps = [i for i in unseen if ranges[i][1] - ranges[i][0] > H][:cfg['num_episodes']]
    if not eps:
        raise SystemExit(f"diagnose: no unseen episode of {data_dir!r} is longer than horizon={H} steps")
    true = np.stack([np.asarray(ds['frames'][ranges[i][0]:ranges[i][0] + H + 1]) for i in eps])  # (E, H+1, S, S, 3)
    acts = np.stack([np.asarray(ds['actions'][ranges[i][0]:ranges[i][0] + H]) for i in eps])  # (E, H, A)
    E = len(eps)
    sim.reset(true[:, 0])
    pred, zp = [], []
    for k in range(H):
        pred.append(sim.step(acts[:, k]))
        zp.append(sim.ctx[:, -1])
    pred, zp = np.stack(pred, 1), torch.stack(zp, 1)  # (E, H, S, S, 3), (E, H, C, h, w)
    tgt = true[:, 1:].reshape(E * H, S, S, 3)
    rec, zt = recon(tgt)
    zt = zt.reshape(zp.shape)  # (E, H, C, h, w)
    iou_r = pusht.physics(rec, tgt)['block_iou'].reshape(E, H)
    iou_m = pusht.physics(pred.reshape(E * H, S, S, 3), tgt)['block_iou'].reshape(E, H)
    lat_m = ((zp - zt) ** 2).mean((2, 3, 4)).cpu().numpy()  # (E, H)
    z0 = enc(M.frames_to_tensor(true[:, 0], dev))  # (E, C, h, w): the copy baseline holds the first frame
    lat_c = ((z0[:, None] - zt) ** 2).mean((2, 3, 4)).cpu().numpy()
    out['open_loop'] = [{'steps': [b + 1, min(b + 32, H)], 'block_iou_decoder': float(iou_r[:, b:b + 32].mean()),
                         'block_iou_rollout': float(iou_m[:, b:b + 32].mean()), 'latent_mse_rollout': float(lat_m[:, b:b + 32].mean()),
                         'latent_mse_copy': float(lat_c[:, b:b + 32].mean())} for b in range(0, H, 32)]

    # 3. contact: short predictions from the real history, scored on the T's change where it really moved
    W, L, err = sim.W, cfg['contact_len'], []
    for k0 in range(W - 1, H - L + 1, cfg['contact_every']):
        sim.reset(true[:, k0 - W + 2:k0 + 1], acts[:, k0 - W + 2:k0])  # frames k0-W+2..k0, the actions between
        fr = [sim.step(acts[:, k0 + j]) for j in range(L)][-1]  # the prediction of frame k0 + L
        p0, _ = _block(true[:, k0])
        p1, _ = _block(true[:, k0 + L])
        pm, _ = _block(fr)
        for i in range(E):
            dt, dth = p1[i, :2] - p0[i, :2], _wrap_deg(p1[i, 2] - p0[i, 2])
            if np.isnan(dt).any() or np.isnan(pm[i, 0]) or (np.linalg.norm(dt) <= 1 and dth <= 3):
                continue
            err.append([np.linalg.norm(pm[i, :2] - p1[i, :2]), np.linalg.norm(dt), _wrap_deg(pm[i, 2] - p1[i, 2]), dth])
    err = np.array(err).reshape(-1, 4)
    out['contact'] = {'cases': len(err), 'steps_ahead': L, 'centroid_err_px': float(np.mean(err[:, 0])) if len(err) else None,
                      'centroid_err_px_no_change': float(np.mean(err[:, 1])) if len(err) else None,
                      'angle_err_deg': float(np.mean(err[:, 2])) if len(err) else None,
                      'angle_err_deg_no_change': float(np.mean(err[:, 3])) if len(err) else None}
    # 4. fit: the training loss on training windows vs unseen ones (same draws)
    tr = D.load_dataset(ck['data']['data_dir'])
    fit_tr = one_step_loss(dyn, enc, ck, tr['frames'], tr['actions'], D.episode_ranges(tr['episode_ends']),
                           ck['data']['train_ids'], cfg['fit_batches'], dev, cfg['seed'])
    fit_un = one_step_loss(dyn, enc, ck, ds['frames'], ds['actions'], ranges, unseen, cfg['fit_batches'], dev, cfg['seed'])
    out['fit'] = {'loss_train': fit_tr[0], 'loss_train_sem': fit_tr[1], 'loss_unseen': fit_un[0],
                  'loss_unseen_sem': fit_un[1], 'ratio': fit_un[0] / fit_tr[0], 'unseen_episodes': len(unseen),
                  'windows': 16 * cfg['fit_batches']}
    out.update({'data_dir': os.path.abspath(data_dir), 'ckpt': os.path.abspath(cfg['ckpt']), 'decoder': os.path.abspath(cfg['ae_ckpt'] or ck['ae_ckpt']),
                'episodes': [int(i) for i in eps], 'date_utc': time.strftime('%Y-%m-%d %H:%M', time.gmtime())})
    os.makedirs(cfg['out_dir'], exist_ok=True)
    with open(os.path.join(cfg['out_dir'], 'diagnose.json'), 'w') as f:
        json.dump(out, f, indent=1)
    for r in out['untouched']:
        print('untouched', ' '.join(f"{a}={_fmt(b)}" for a, b in r.items()))
    for r in out['open_loop']:
        print('open loop', ' '.join(f"{a}={_fmt(b)}" for a, b in r.items()))
    print('contact', ' '.join(f"{a}={_fmt(b)}" for a, b in out['contact'].items()))
    print('fit', ' '.join(f"{a}={_fmt(b)}" for a, b in out['fit'].items()))
    return out


def bench_train(cfg):
    """--mode=train (the top of the file); writes OUT/train.json and returns it."""
    dev = pick_device(cfg['device'])
    kinds = [('fp32', False, False), ('bf16 autocast', True, False)] + ([('compiled fp32', False, True)] if cfg['compile'] else [])
    rows = []
    for r in [r for r in cfg['recipes'].split(',') if r]:
        z = recipe_sizes(r)
        S, lc, h = z['image_size'], z['latent_ch'], z['image_size'] // 4
        lit = {k: _literals(os.path.join(HERE, f)) | (_literals(os.path.join(HERE, RECIPE_FILES[r][i])) if r != 'tiny' else {})
               for k, f, i in (('ae', 'train_ae.py', 0), ('dyn', 'train_dynamics.py', 1))}  # the trainers' settings
        batch = {k: 4 if r == 'tiny' else lit[k]['batch_size'] for k in lit}
        for stage in ('ae', 'dyn'):
            for kind, bf16, comp in kinds:
                torch.manual_seed(cfg['seed'])
                dyn, enc, dec, _ = random_world_model(z, dev)
                abar = M.sigmoid_alpha_bar().to(dev)
                nets = [enc.train(), dec.train()] if stage == 'ae' else [dyn.train()]
                opt = torch.optim.AdamW([p for n in nets for p in n.parameters()], lr=1e-4)
                run = [torch.compile(n) if comp else n for n in nets]
                B = batch[stage]
                if stage == 'ae':  # frames, and (t, s) drawn as stage 1 draws them
                    x0 = torch.rand(B, 3, S, S, device=dev) * 2 - 1
                    t = torch.randint(2, M.T_STEPS, (B,), device=dev)
                    s = (torch.rand(B, device=dev) * (t - 1)).long() + 1
                    loss_fn = lambda: M.decoder_loss(run[1], x0, run[0](x0), t, s, abar, both_terms=lit['ae']['both_terms'])
                else:  # a batch of windows of unit-norm latents, every frame with an action
                    W = z['window']
                    lat = M.unit_norm(torch.randn(B * W, lc, h, h, device=dev)).reshape(B, W, lc, h, h)  # (B, W, C, h, w)
                    act = M.action_input(torch.rand(B, W, 2, device=dev) * 2 - 1, 1)  # (B, W, 3)
                    loss_fn = lambda: M.dynamics_loss(run[0], lat, act, abar)

                def step():
                    opt.zero_grad(set_to_none=True)
                    with torch.autocast(dev.split(':')[0], dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
                        loss = loss_fn()
                    loss.float().backward()
                    opt.step()
                t0 = time.perf_counter()
                sec = _time_steps(step, dev, cfg['train_steps'], float('inf'), 2)
                rows.append({'recipe': r, 'stage': stage, 'kind': kind, 'batch': B, 'ms_per_step': sec * 1e3,
                             'first_two_steps_s': time.perf_counter() - t0 - sec * cfg['train_steps'],  # compile's cost
                             'params_M': sum(n_params(n) for n in nets) / 1e6})
                print(f"{r} {stage} {kind}: {sec * 1e3:.0f} ms/step (batch {B})", flush=True)
    out = {'device': dev, 'torch': torch.__version__, 'threads': torch.get_num_threads(),
           'date_utc': time.strftime('%Y-%m-%d %H:%M', time.gmtime()), 'results': rows}
    os.makedirs(cfg['out_dir'], exist_ok=True)
    with open(os.path.join(cfg['out_dir'], 'train.json'), 'w') as f:
        json.dump(out, f, indent=1)
    for r in rows:  # each row against the fp32 row of its recipe and stage
        ref = next(q for q in rows if q['recipe'] == r['recipe'] and q['stage'] == r['stage'] and q['kind'] == 'fp32')
        print(f"| {r['recipe']} | {r['stage']} | {r['kind']} | {r['ms_per_step']:.0f} | {ref['ms_per_step'] / r['ms_per_step']:.2f}x |")
    return out


def main(cfg):
    """Run the mode cfg['mode'] names."""
    if cfg['threads'] > 0:
        torch.set_num_threads(cfg['threads'])
    if cfg['mode'] == 'speed':
        return bench_speed(cfg)
    if cfg['mode'] == 'stability':
        return bench_stability(cfg)
    if cfg['mode'] == 'diagnose':
        return bench_diagnose(cfg)
    if cfg['mode'] == 'train':
        return bench_train(cfg)
    raise SystemExit(f"mode must be 'speed', 'stability', 'diagnose' or 'train', got {cfg['mode']!r}")


if __name__ == '__main__':
    main(config_from_globals(globals()))
