"""
The few helpers every script shares: config override, device choice, checkpoint I/O.

Config override, in the nanoGPT manner (no framework):

    python train_ae.py config/ae_pusht_cpu.py --batch_size=32 --lr=1e-3

A config file is plain Python that reassigns some of the defaults. A --key=value
sets one default; the value is parsed as a Python literal when it can be and must
keep the default's type (an int default takes an int, a float default an int or a
float). Unknown keys and wrong types are errors, so a typo never silently trains
the wrong model.

Distributed training (torchrun), RNG state for exact resume, and start-up checks of out_dir live
here too, so both trainers do them the same way.
"""
import ast
import contextlib
import hashlib
import math
import os
import random
import shutil
import sys

import numpy as np
import torch
import torch.distributed as dist

import model as M


def configure(defaults, argv=None):
    """Return a copy of `defaults` (a dict) updated from config files and --key=value args."""
    argv = sys.argv[1:] if argv is None else argv
    cfg = dict(defaults)
    for arg in argv:
        if not arg.startswith('--'):
            # a config file: run it with the defaults as its globals, keep what it assigns
            try:
                src = open(arg).read()
            except OSError as e:
                raise SystemExit(f"config file {arg!r} cannot be read: {e}")
            scope = dict(cfg)  # the file sees the current values (it may compute from them) ...
            exec(compile(src, arg, 'exec'), {}, scope)  # ... and reassigns some; later arguments win over it
            for k, v in scope.items():
                if k.startswith('_'):  # a recipe's private helper names are not config keys
                    continue
                _set(cfg, k, v, source=arg)
        else:
            if '=' not in arg:
                raise SystemExit(f"argument {arg!r} must look like --key=value")
            key, val = arg[2:].split('=', 1)
            try:
                val = ast.literal_eval(val)
            except (ValueError, SyntaxError):
                pass  # keep it as a string (--out_dir=out/x needs no quotes); _set still checks the type
            _set(cfg, key, val, source=arg)
    return cfg


def config_from_globals(g, argv=None):
    """The defaults block of a script is its lower-case globals of plain types; override them."""
    keep = (int, float, str, bool, tuple, type(None))
    return configure({k: v for k, v in g.items() if not k.startswith('_') and k.islower() and isinstance(v, keep)}, argv)


def _set(cfg, key, val, source):
    """cfg[key] = val, refusing unknown keys and values of another type than the default's."""
    if key not in cfg:
        raise SystemExit(f"unknown config key {key!r} (from {source}); known keys: {', '.join(sorted(cfg))}")
    old = cfg[key]
    if old is not None and val is not None:
        if isinstance(old, bool) or isinstance(val, bool):  # bool is an int subclass: check it first,
            ok = isinstance(old, bool) and isinstance(val, bool)  # so --max_iters=True is not 1
        elif isinstance(old, float):  # --lr=1 means 1.0; an int default stays strict (--max_iters=1.5 fails)
            ok = isinstance(val, (int, float))
            val = float(val) if ok else val
        else:
            ok = isinstance(val, type(old))
        if not ok:
            raise SystemExit(f"config key {key!r} (from {source}) wants {type(old).__name__}, got {val!r}")
    cfg[key] = val


def pick_device(name='auto'):
    """cuda, then mps, then cpu, unless a device is named."""
    if name != 'auto':
        return name
    if torch.cuda.is_available():
        return 'cuda'
    if getattr(torch.backends, 'mps', None) is not None and torch.backends.mps.is_available():
        return 'mps'
    return 'cpu'


def save_checkpoint(obj, path):
    """Write atomically: a temp file in the same folder, fsync, then rename, so a crash (or a full disk)
    never leaves half a checkpoint and never costs the previous one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = path + '.tmp'
    try:
        with open(tmp, 'wb') as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them the checkpoint
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise SystemExit(f"cannot write checkpoint {path!r} ({e}); the previous one, if any, is untouched")
    with contextlib.suppress(OSError):  # make the rename itself durable (not possible on every OS)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def load_checkpoint(path, expect_kind=None):
    """Load a checkpoint as data only (weights_only=True) and check what stage wrote it."""
    if not os.path.isfile(path):
        raise SystemExit(f"checkpoint {path!r} does not exist")
    try:  # weights_only: tensors and plain data only, so a checkpoint from elsewhere cannot run code
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:
        raise SystemExit(f"checkpoint {path!r} cannot be read ({type(e).__name__}: {e})")
    if expect_kind is not None and ckpt.get('kind') != expect_kind:
        raise SystemExit(f"checkpoint {path!r} is a {ckpt.get('kind')!r} checkpoint, expected {expect_kind!r}")
    return ckpt


def fingerprint(state_dict):
    """A short hash of a module's weights: the dynamics checkpoint records which encoder it used."""
    h = hashlib.sha1()
    for k in sorted(state_dict):
        h.update(k.encode())
        h.update(state_dict[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def dataset_fingerprint(ds):
    """A short hash of a dataset's episode ends and actions: a resume checks it is the same data, wherever it lies."""
    h = hashlib.sha1(np.ascontiguousarray(ds['episode_ends'], np.int64).tobytes())
    for i in range(0, len(ds['actions']), 1 << 16):
        h.update(np.ascontiguousarray(ds['actions'][i:i + (1 << 16)]).tobytes())
    return h.hexdigest()[:16]


def save_grid(path, rows_u8):
    """Stack rows of uint8 frames (each (N, H, W, 3)) into one PNG."""
    from PIL import Image
    img = np.concatenate([np.concatenate(list(r), axis=1) for r in rows_u8], axis=0)
    Image.fromarray(img).save(path)


def load_autoencoder(path, dev, expect_fingerprint=None):
    """Encoder + decoder from a stage-1 checkpoint; optionally check it is the encoder we expect."""
    ck = load_checkpoint(path, expect_kind='ae')
    c = ck['config']
    enc = M.Encoder(c['enc_ch'], c['latent_ch']).to(dev).eval()
    dec = M.Decoder(tuple(c['dec_ch']), tuple(c['dec_attn']), c['latent_ch'], c['emb_dim'], c['heads'],
                    c.get('decoder_type') == 'deterministic').to(dev).eval()
    enc.load_state_dict(ck['encoder'])
    dec.load_state_dict(ck['decoder'])
    fp = fingerprint(enc.state_dict())
    if expect_fingerprint is not None and fp != expect_fingerprint:
        raise SystemExit(f"autoencoder {path!r} has encoder {fp}, but the dynamics model was trained on encoder "
                         f"{expect_fingerprint}: its latents mean something else. Use the stage-1 checkpoint it was trained on.")
    enc.requires_grad_(False), dec.requires_grad_(False)  # frozen: stage 2 and the tools only run them
    return enc, dec, ck, fp


def keep_copy(src, dst):
    """dst becomes a copy of the finished checkpoint src (the best one): a hard link when the file
    system has them (no second write), else a copy; atomic either way."""
    tmp = dst + '.tmp'
    with contextlib.suppress(OSError):
        os.remove(tmp)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise SystemExit(f"cannot write checkpoint {dst!r} ({e}); the previous one, if any, is untouched")


def check_finite_weights(modules, it, path):
    """Never write a checkpoint with NaN/Inf weights over a good one."""
    for m in modules:
        for name, p in m.named_parameters():
            if not torch.isfinite(p).all():
                raise SystemExit(f"iter {it}: weight {name} is not finite; not writing {path!r}, "
                                 f"the last good checkpoint is untouched")


# ---------------------------------------------------------------------------- start-up checks


def checkpoint_bytes(trained, frozen=()):
    """Rough size of a checkpoint: weights + two AdamW moments for trained modules, weights for frozen."""
    n = lambda ms: sum(p.numel() * p.element_size() for m in ms for p in m.parameters())
    return 3 * n(trained) + n(frozen) + (1 << 20)


def check_out_dir(out_dir, need_bytes=0, rank=0):
    """Fail at start-up, not after an hour: out_dir must take a file (probe written and removed) and
    the disk must have room for need_bytes more."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, f'.write_probe_{rank}')
        with open(probe, 'wb') as f:
            f.write(b'\0' * 4096)
            f.flush()
            os.fsync(f.fileno())
        os.remove(probe)
    except OSError as e:
        raise SystemExit(f"out_dir {out_dir!r} is not writable ({type(e).__name__}: {e})")
    free = shutil.disk_usage(out_dir).free
    if free < need_bytes:
        raise SystemExit(f"out_dir {out_dir!r} has {free / 2**20:.0f} MiB free, this run needs about "
                         f"{need_bytes / 2**20:.0f} MiB (checkpoints written as temp file + rename, latest and best)")


def _same(a, b):
    """Config values compared as plain data: a tuple and a list with the same items are the same."""
    norm = lambda v: tuple(norm(x) for x in v) if isinstance(v, (list, tuple)) else v
    return norm(a) == norm(b)


def check_compatible(path, ck_config, config, keys, extra=()):
    """Refuse a checkpoint written by a different run. keys: config keys that must agree; extra:
    (name, in checkpoint, in this run) triples for derived facts (data folder, split, latent shape).
    Every difference is named in one message."""
    bad = [f"{k}: checkpoint {ck_config.get(k, '<missing>')!r}, this run {config[k]!r}"
           for k in keys if not _same(ck_config.get(k, '<missing>'), config[k])]
    bad += [f"{name}: checkpoint {a!r}, this run {b!r}" for name, a, b in extra if not _same(a, b)]
    if bad:
        raise SystemExit(f"checkpoint {path!r} was written by a different run:\n  " + "\n  ".join(bad)
                         + "\n(pass the same config file and data as the run that wrote it)")


# ---------------------------------------------------------------------------- distributed (torchrun)


def ddp_setup(device_name='auto'):
    """-> (ddp, rank, local_rank, world_size, device). torchrun sets RANK, LOCAL_RANK and WORLD_SIZE;
    without them this is one plain process. nccl with one GPU per process on CUDA, gloo on CPU."""
    if 'RANK' not in os.environ:
        return False, 0, 0, 1, pick_device(device_name)
    rank, local, world = int(os.environ['RANK']), int(os.environ['LOCAL_RANK']), int(os.environ['WORLD_SIZE'])
    dev = pick_device(device_name)
    if dev.startswith('cuda'):
        dev = f'cuda:{local}'
        torch.cuda.set_device(dev)
    elif dev != 'cpu':
        raise SystemExit(f"distributed training runs on cuda (nccl) or cpu (gloo), not on {dev!r}")
    dist.init_process_group(backend='nccl' if dev.startswith('cuda') else 'gloo')
    return True, rank, local, world, dev


def ddp_cleanup(wait=False):
    """Tear the process group down. wait=True (a normal end) first waits for every rank: rank 0 may still be
    writing the last checkpoint, and a gloo peer that tears down while another is busy aborts the run."""
    if dist.is_available() and dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()


def ddp_sync(modules, sync):
    """Context for one micro-step: DDP all-reduces gradients only when sync is True (the last micro-step
    of an accumulation); forward and backward must both run inside it."""
    stack = contextlib.ExitStack()
    if not sync:
        for m in modules:
            if isinstance(m, torch.nn.parallel.DistributedDataParallel):
                stack.enter_context(m.no_sync())
    return stack


def all_gather(obj, ddp):
    """[obj of rank 0, obj of rank 1, ...] on every rank (just [obj] without DDP)."""
    if not ddp:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


# ---------------------------------------------------------------------------- random streams


def seed_streams(*key):
    """Seed every RNG a trainer uses from one integer key (seed, ...): the global torch RNG (CPU and
    all CUDA devices: noise inside the losses), python random, and return a fresh numpy Generator
    (batch indices) and torch.Generator (noise levels). SeedSequence children keep them independent."""
    kids = np.random.SeedSequence([int(k) for k in key]).spawn(4)
    word = lambda ss: int(ss.generate_state(1, np.uint64)[0])
    torch.manual_seed(word(kids[1]))
    random.seed(word(kids[2]))
    return np.random.default_rng(kids[0]), torch.Generator().manual_seed(word(kids[3]))


def rng_state(np_rng, gen=None):
    """Every RNG state of this process as plain data (tensors, dicts, lists, ints), loadable with
    weights_only=True."""
    st = {'torch': torch.get_rng_state(), 'numpy': np_rng.bit_generator.state}
    v, words, gauss = random.getstate()
    st['python'] = [v, list(words), gauss]  # a tuple of ints -> a list
    if gen is not None:
        st['gen'] = gen.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st['cuda'] = torch.cuda.get_rng_state()  # this process's device
    return st


def set_rng_state(st, np_rng, gen=None):
    """Inverse of rng_state."""
    torch.set_rng_state(st['torch'])
    np_rng.bit_generator.state = st['numpy']
    v, words, gauss = st['python']
    random.setstate((v, tuple(words), gauss))
    if gen is not None:
        gen.set_state(st['gen'])
    if 'cuda' in st and torch.cuda.is_available() and torch.cuda.is_initialized():  # a CUDA run
        torch.cuda.set_rng_state(st['cuda'])


def lr_at(it, peak, floor, warmup, total, cooldown=None):
    """The learning rate of step it: linear warm-up to peak over warmup steps, then cosine decay to floor at total;
    or, given cooldown (steps), constant at peak until total - cooldown, then linear decay to floor at total (a run
    that can be stopped anywhere: a short cool-down branch from any of its checkpoints reads it fairly)."""
    if it < warmup:
        return peak * (it + 1) / warmup
    if cooldown is not None:
        return peak - (peak - floor) * min(1.0, max(0, it - (total - cooldown)) / max(1, cooldown))
    r = min(1.0, (it - warmup) / max(1, total - warmup))
    return floor + 0.5 * (1 + math.cos(math.pi * r)) * (peak - floor)


def autocast(dev, on):
    """bf16 autocast on dev's device type when on, else nothing (fp32)."""
    return torch.autocast(dev.split(':')[0], dtype=torch.bfloat16) if on else contextlib.nullcontext()
