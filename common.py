"""
The few helpers every script shares: config override, device choice, checkpoint I/O.

Config override, in the nanoGPT manner (no framework):

    python train_ae.py config/pusht_cpu.py --batch_size=32 --lr=1e-3

A config file is plain Python that reassigns some of the defaults. A --key=value
sets one default; the value is parsed as a Python literal when it can be and must
keep the default's type (an int default takes an int, a float default an int or a
float). Unknown keys and wrong types are errors, so a typo never silently trains
the wrong model.
"""
import ast
import hashlib
import os
import sys

import numpy as np
import torch

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
            scope = dict(cfg)
            exec(compile(src, arg, 'exec'), {}, scope)
            for k, v in scope.items():
                if k.startswith('_'):
                    continue
                _set(cfg, k, v, source=arg)
        else:
            if '=' not in arg:
                raise SystemExit(f"argument {arg!r} must look like --key=value")
            key, val = arg[2:].split('=', 1)
            try:
                val = ast.literal_eval(val)
            except (ValueError, SyntaxError):
                pass  # keep it as a string
            _set(cfg, key, val, source=arg)
    return cfg


def config_from_globals(g, argv=None):
    """The defaults block of a script is its lower-case globals of plain types; override them."""
    keep = (int, float, str, bool, tuple, type(None))
    return configure({k: v for k, v in g.items() if not k.startswith('_') and k.islower() and isinstance(v, keep)}, argv)


def _set(cfg, key, val, source):
    if key not in cfg:
        raise SystemExit(f"unknown config key {key!r} (from {source}); known keys: {', '.join(sorted(cfg))}")
    old = cfg[key]
    if old is not None and val is not None:
        if isinstance(old, bool) or isinstance(val, bool):
            ok = isinstance(old, bool) and isinstance(val, bool)
        elif isinstance(old, float):
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
    """Write atomically: a temp file in the same folder, then rename, so a crash never leaves half a checkpoint."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + '.tmp'
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, expect_kind=None):
    """Load a checkpoint as data only (weights_only=True) and check what stage wrote it."""
    if not os.path.isfile(path):
        raise SystemExit(f"checkpoint {path!r} does not exist")
    try:
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
    dec = M.Decoder(tuple(c['dec_ch']), tuple(c['dec_attn']), c['latent_ch'], c['emb_dim'], c['heads']).to(dev).eval()
    enc.load_state_dict(ck['encoder'])
    dec.load_state_dict(ck['decoder'])
    fp = fingerprint(enc.state_dict())
    if expect_fingerprint is not None and fp != expect_fingerprint:
        raise SystemExit(f"autoencoder {path!r} has encoder {fp}, but the dynamics model was trained on encoder "
                         f"{expect_fingerprint}: its latents mean something else. Use the stage-1 checkpoint it was trained on.")
    enc.requires_grad_(False), dec.requires_grad_(False)
    return enc, dec, ck, fp
