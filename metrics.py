"""
Frame and video metrics, for any dataset: pixel (MSE, PSNR, SSIM, UIQI), perceptual (LPIPS-Alex),
distribution (FID, FVD), and the per-step curves rollout.py draws. (What a task reads off its own
pixels, such as Push-T's agent and T block, lives in the task's module: pusht.py.)

Conventions
- Image tensors are float (B, 3, H, W) in [0, 1]; every metric uses data range 1 and
  returns a per-image tensor (B,). Average over the batch yourself (PSNR: see psnr).
- FID / FVD take uint8 numpy frames (B, H, W, 3) / videos (B, T, H, W, 3).

Importing this module has no side effects: lpips is imported inside load_lpips, and
nothing here imports gym or pygame.
"""
import os
import warnings

import numpy as np
import torch
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# pixel metrics


def mse(x, y):
    """Mean squared error per image: mean over C, H, W of (x - y)^2."""
    return ((x - y) ** 2).flatten(1).mean(1)


def psnr(x, y):
    """PSNR in dB for data range 1 per image (B,): 10 log10(1 / mse), mse clamped at 1e-10 (x == y gives
    100 dB). To report a set of frames, average their MSE first (psnr_from_mse): a mean of capped
    per-frame values favours whatever predicts some frames exactly (a copy baseline on still frames)."""
    return 10.0 * torch.log10(1.0 / mse(x, y).clamp_min(1e-10))


def psnr_from_mse(m):
    """PSNR in dB for data range 1 of a mean MSE (a number or a numpy array): 10 log10(1 / m), with m floored
    at 1e-10 as in psnr, so an exact match reads 100 dB: a finite number that metrics.json (standard JSON,
    no Infinity) and curves.csv can hold."""
    return 10.0 * np.log10(1.0 / np.maximum(np.asarray(m, np.float64), 1e-10))


def _gaussian_window(size=11, sigma=1.5):
    # 1-D normalised Gaussian g; the 2-D window is the outer product g g^T (separable)
    r = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-r ** 2 / (2 * sigma ** 2))
    return g / g.sum()


def _local_stats(x, y, size=11, sigma=1.5):
    """Gaussian-weighted local mu_x, mu_y, var_x, var_y, cov_xy, per channel, 'valid' windows.

    'valid' = no padding: the map is (H - 10, W - 10), every window lies inside the image
    (the convention of Wang et al. 2004). Computed in float64 so that E[x^2] - mu^2 has
    negligible roundoff (matters for the 0/0 handling of UIQI on flat windows).
    """
    B, C, H, W = x.shape
    assert H >= size and W >= size, f"images must be at least {size}x{size}, got {H}x{W}"
    g = _gaussian_window(size, sigma).to(x.device)
    gx = g.view(1, 1, 1, size).repeat(C, 1, 1, 1)
    gy = g.view(1, 1, size, 1).repeat(C, 1, 1, 1)

    def filt(z):  # depthwise separable Gaussian filter, one channel at a time
        return F.conv2d(F.conv2d(z, gx, groups=C), gy, groups=C)

    x = x.double()
    y = y.double()
    mu_x, mu_y = filt(x), filt(y)
    var_x = filt(x * x) - mu_x ** 2  # var = E[x^2] - E[x]^2
    var_y = filt(y * y) - mu_y ** 2
    cov = filt(x * y) - mu_x * mu_y  # cov = E[xy] - E[x]E[y]
    return mu_x, mu_y, var_x, var_y, cov


def ssim(x, y):
    """SSIM per image: Gaussian window 11x11, sigma 1.5, K1 = 0.01, K2 = 0.03, data range L = 1,
    'valid' windows (no padding), computed per channel and averaged over channels and positions.

    SSIM = (2 mu_x mu_y + C1)(2 cov_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(var_x + var_y + C2)),
    C1 = (K1 L)^2, C2 = (K2 L)^2.
    """
    C1, C2 = (0.01 * 1.0) ** 2, (0.03 * 1.0) ** 2
    mu_x, mu_y, var_x, var_y, cov = _local_stats(x, y)
    s = ((2 * mu_x * mu_y + C1) * (2 * cov + C2)) / ((mu_x ** 2 + mu_y ** 2 + C1) * (var_x + var_y + C2))
    return s.flatten(1).mean(1).to(x.dtype)


def _ratio_one_if_undefined(num, den, eps=1e-12):
    # num / den, with 0/0 := 1; den is a sum of squares (>= 0) so "0" means below eps
    # (eps is far below the smallest variance an 8-bit image can have in a window, ~1e-11)
    flat = den.abs() < eps
    return torch.where(flat, torch.ones_like(num), num / torch.where(flat, torch.ones_like(den), den))


def uiqi(x, y):
    """Universal image quality index (Wang & Bovik 2002) per image: SSIM with C1 = C2 = 0,
    same 11x11 sigma 1.5 Gaussian 'valid' windows, per channel then averaged.

    Q = [2 mu_x mu_y / (mu_x^2 + mu_y^2)] * [2 cov_xy / (var_x + var_y)]
      = luminance * (correlation * contrast), since
        correlation * contrast = cov/(s_x s_y) * 2 s_x s_y/(var_x + var_y) = 2 cov/(var_x + var_y).
    Convention for 0/0 (denominator below 1e-12, float64):
      - luminance := 1 when both windows are black (mu_x = mu_y = 0);
      - structure (correlation * contrast) := 1 when both windows are flat (var_x = var_y = 0).
    If only one window is flat, cov = 0 and the denominator is > 0, so structure = 0: a flat
    prediction of a textured target scores 0 there. Hence Q(x, x) = 1 exactly for every x,
    including constant and black images.
    """
    mu_x, mu_y, var_x, var_y, cov = _local_stats(x, y)
    lum = _ratio_one_if_undefined(2 * mu_x * mu_y, mu_x ** 2 + mu_y ** 2)
    struct = _ratio_one_if_undefined(2 * cov, var_x + var_y)
    return (lum * struct).flatten(1).mean(1).to(x.dtype)


# -----------------------------------------------------------------------------
# LPIPS (AlexNet backbone), strictly offline

ALEXNET_FILE = "alexnet-owt-7be5be79.pth"  # the file torchvision's alexnet(pretrained) downloads


def load_lpips(weights_dir=None):
    """Build LPIPS-Alex without any download. Returns (model or None, message).

    lpips ships its linear heads (lpips/weights/v0.1/alex.pth) but takes the AlexNet backbone
    from torchvision's download. We build the net with a random backbone (pnet_rand=True, no
    download) and load torchvision's AlexNet feature weights ourselves from
      - weights_dir/alexnet-owt-7be5be79.pth, exclusively, when weights_dir is given;
      - otherwise torch.hub.get_dir()/checkpoints/alexnet-owt-7be5be79.pth (torchvision's cache).
    Missing file -> (None, "unavailable: no AlexNet weights at <paths>").
    """
    if weights_dir is not None:
        paths = [os.path.join(weights_dir, ALEXNET_FILE)]
    else:
        paths = [os.path.join(torch.hub.get_dir(), "checkpoints", ALEXNET_FILE)]
    path = next((p for p in paths if os.path.isfile(p)), None)
    if path is None:
        return None, "unavailable: no AlexNet weights at " + ", ".join(paths)

    import lpips  # lazy: keeps import of this module light and side-effect free

    with warnings.catch_warnings():  # lpips builds torchvision's alexnet with the deprecated pretrained=; not ours to fix
        warnings.simplefilter('ignore', UserWarning)
        model = lpips.LPIPS(net='alex', pretrained=True, pnet_rand=True, verbose=False)
    sd = torch.load(path, map_location='cpu', weights_only=True)
    # lpips splits torchvision's alexnet.features into slice1..slice5 but keeps each layer's
    # original index as its module name: lpips 'sliceK.N.weight' <- torchvision 'features.N.weight'
    mapped = {}
    for name in model.net.state_dict():
        _, idx, param = name.split('.')  # 'slice2.3.weight' -> idx '3', param 'weight'
        src = f"features.{idx}.{param}"
        if src not in sd:
            return None, f"unavailable: {path} lacks {src}"
        mapped[name] = sd[src]
    model.net.load_state_dict(mapped, strict=True)  # strict: every backbone tensor is replaced
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, f"LPIPS-Alex, backbone from {path}"


def lpips_distance(model, x, y):
    """LPIPS distance per image (B,); x, y in [0, 1] (mapped to lpips' [-1, 1] by 2x - 1)."""
    with torch.no_grad():
        d = model(x * 2 - 1, y * 2 - 1)
    return d.flatten()


# -----------------------------------------------------------------------------
# scoring a rollout: per-frame metrics, their means and per-step curves, the side-by-side video

def score_frames(pred_u8, true_u8, lp, extra=None):
    """Per-frame metrics of uint8 frames (N, S, S, 3) -> dict of (N,) numpy arrays (None: not measured).
    extra(pred_u8, true_u8) -> {name: (N,) array}: a task's own scores (pusht.physics), added as they are."""
    x = torch.from_numpy(pred_u8).permute(0, 3, 1, 2).float() / 255
    y = torch.from_numpy(true_u8).permute(0, 3, 1, 2).float() / 255
    r = {'mse': mse(x, y).numpy(), 'ssim': ssim(x, y).numpy(), 'uiqi': uiqi(x, y).numpy()}
    r['lpips'] = lpips_distance(lp, x, y).numpy() if lp is not None else None
    r.update(extra(pred_u8, true_u8) if extra is not None else {})
    return r


def summarise(r, E, H):
    """Per-frame scores (E*H,) -> (means, per-step curves (H,)). PSNR is 10 log10(1 / MSE) of the MSE
    averaged first (over all frames, or over the episodes at a step): a per-frame PSNR is infinite on
    a frame predicted exactly, and averaging capped values (say 100 dB) would reward a baseline for
    the frames it gets exactly right rather than for its error."""
    mean = {k: (None if v is None else float(v.mean())) for k, v in r.items()}
    curves = {k: (None if v is None else v.reshape(E, H).mean(0).round(6).tolist()) for k, v in r.items()}  # (E*H,) -> (E, H) -> (H,)
    mean['psnr'] = float(psnr_from_mse(r['mse'].mean()))
    curves['psnr'] = psnr_from_mse(r['mse'].reshape(E, H).mean(0)).round(4).tolist()
    return mean, curves


def write_strip(path, true_u8, pred_u8, steps=(1, 8, 16, 32, 64, 128), scale=2):
    """PNG of a few steps of each episode (columns): a truth row over a prediction row per episode.
    true_u8, pred_u8 (E, H, S, S, 3) with step k at index k-1; steps past H are left out."""
    from PIL import Image
    ks = [k for k in steps if k <= true_u8.shape[1]]
    gap = np.full((true_u8.shape[2], 2, 3), 255, np.uint8)  # a white column between steps
    row = lambda v: np.concatenate(sum([[v[k - 1], gap] for k in ks], [])[:-1], axis=1)
    img = np.concatenate([row(v[e]) for e in range(len(true_u8)) for v in (true_u8, pred_u8)], axis=0)
    Image.fromarray(img).resize((img.shape[1] * scale, img.shape[0] * scale), Image.NEAREST).save(path)


def write_video(path, true_u8, pred_u8, fps=10, scale=3):
    """Animated GIF, one row per episode: truth | prediction | |error| (amplified x2)."""
    from PIL import Image
    err = np.clip(np.abs(true_u8.astype(np.int16) - pred_u8.astype(np.int16)) * 2, 0, 255).astype(np.uint8)
    row = np.concatenate([true_u8, pred_u8, err], axis=3)  # (E, H, S, 3S, 3)
    grid = np.concatenate(list(row), axis=1)  # (H, E*S, 3S, 3)
    frames = [Image.fromarray(g).resize((g.shape[1] * scale, g.shape[0] * scale), Image.NEAREST) for g in grid]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0)


# -----------------------------------------------------------------------------
# horizon curves: CSV + a PNG drawn with PIL

CURVE_PANELS = ('psnr', 'ssim')  # a task adds its own (pusht.py: agent error, block IoU)
CURVE_PREFIX = {'model': 'model', 'copy_baseline': 'copy'}  # CSV column prefix per series
CURVE_COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189)]


def write_curves(out_dir, curves_by_name, panels=CURVE_PANELS):
    """Per-step metric curves -> out_dir/curves.csv and out_dir/curves.png.

    curves_by_name = {'model': {metric: [value per step] or None}, 'copy_baseline': {...}} (the shape of
    rollout.py's res[name]['curves']). curves.csv: 'step' (1 = the first predicted frame), then one
    column '<prefix>_<metric>' per series and metric (prefix 'model', 'copy'); None curves are skipped.
    curves.png: one panel per metric in `panels` that has a curve, all series on one chart, a legend.
    Returns the two paths."""
    os.makedirs(out_dir, exist_ok=True)
    cols = []  # (column name, series name, metric, values)
    for name, curves in curves_by_name.items():
        for k, v in (curves or {}).items():
            if v is not None:
                cols.append((f"{CURVE_PREFIX.get(name, name)}_{k}", name, k, [float(x) for x in v]))
    H = max((len(c[3]) for c in cols), default=0)
    csv_path = os.path.join(out_dir, 'curves.csv')
    with open(csv_path, 'w') as f:
        f.write(','.join(['step'] + [c[0] for c in cols]) + '\n')
        for i in range(H):
            f.write(','.join([str(i + 1)] + [f"{c[3][i]:.6g}" if i < len(c[3]) else '' for c in cols]) + '\n')
    png_path = os.path.join(out_dir, 'curves.png')
    draw_curves(png_path, [(m, [(c[1], c[3]) for c in cols if c[2] == m]) for m in panels
                            if any(c[2] == m for c in cols)])
    return csv_path, png_path


def draw_curves(path, panels, pw=360, ph=240, xticks=None, xname='step'):
    """panels: [(title, [(series name, values), ...])] -> one PNG, panels side by side in rows of 2. Values are
    drawn at evenly spaced x; xticks: a label for each of them (default: steps 1..H, five ticks)."""
    from PIL import Image, ImageDraw, ImageFont
    font = ImageFont.load_default()
    n = max(len(panels), 1)
    ncol = min(n, 2)
    nrow = (n + ncol - 1) // ncol
    img = Image.new('RGB', (pw * ncol, ph * nrow), 'white')
    d = ImageDraw.Draw(img)
    names = []
    for p, (title, series) in enumerate(panels):
        ox, oy = (p % ncol) * pw, (p // ncol) * ph
        x0, y0, x1, y1 = ox + 50, oy + 22, ox + pw - 12, oy + ph - 28  # plot area
        vals = [v for _, s in series for v in s if np.isfinite(v)]
        lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
        if hi - lo < 1e-9:
            lo, hi = lo - 0.5, hi + 0.5
        pad = 0.05 * (hi - lo)
        lo, hi = lo - pad, hi + pad
        H = max(len(s) for _, s in series)
        d.rectangle([x0, y0, x1, y1], outline=(0, 0, 0))
        d.text((ox + pw // 2 - 4 * len(title), oy + 5), title, fill=(0, 0, 0), font=font)
        for j in range(5):  # y ticks: value at 5 evenly spaced heights
            v = lo + (hi - lo) * j / 4
            yy = y1 - (y1 - y0) * j / 4
            d.line([x0 - 3, yy, x0, yy], fill=(0, 0, 0))
            d.text((ox + 2, yy - 6), f"{v:.3g}", fill=(0, 0, 0), font=font)
        ticks = list(enumerate(xticks)) if xticks else [(round((H - 1) * j / 4), str(1 + round((H - 1) * j / 4))) for j in range(5)]
        for i, label in ticks:  # x ticks: steps 1..H, or the given labels
            xx = x0 + (x1 - x0) * i / max(H - 1, 1)
            d.line([xx, y1, xx, y1 + 3], fill=(0, 0, 0))
            d.text((xx - 3 * len(label), y1 + 5), label, fill=(0, 0, 0), font=font)
        d.text((x1 - 6 * len(xname), y1 + 15), xname, fill=(0, 0, 0), font=font)
        drawn = []  # (name, points) of this panel: its legend names only these and avoids their points
        for name, s in series:
            if name not in names:
                names.append(name)
            col = CURVE_COLOURS[names.index(name) % len(CURVE_COLOURS)]
            pts = [(x0 + (x1 - x0) * i / max(H - 1, 1), y1 - (y1 - y0) * (v - lo) / (hi - lo))
                   for i, v in enumerate(s) if np.isfinite(v)]
            drawn.append((name, pts))
            if len(pts) > 1:
                d.line(pts, fill=col, width=2)
            elif pts:
                d.ellipse([pts[0][0] - 2, pts[0][1] - 2, pts[0][0] + 2, pts[0][1] + 2], fill=col)
        bh = 6 + 12 * len(drawn)  # the legend box: the first corner (top-right, bottom-right, top-left) no point is in
        boxes = [(x1 - 114, y0 + 3), (x1 - 114, y1 - 3 - bh), (x0 + 3, y0 + 3)]
        free = [b for b in boxes if not any(b[0] - 4 <= x <= b[0] + 115 and b[1] - 4 <= y <= b[1] + bh + 4
                                            for _, pts in drawn for x, y in pts)]
        bx, by = (free or boxes)[0]
        d.rectangle([bx, by, bx + 111, by + bh], fill='white', outline=(160, 160, 160))
        for i, (name, _) in enumerate(drawn):
            ly = by + 3 + 12 * i
            col = CURVE_COLOURS[names.index(name) % len(CURVE_COLOURS)]
            d.line([bx + 4, ly + 5, bx + 22, ly + 5], fill=col, width=2)
            d.text((bx + 26, ly), name, fill=(0, 0, 0), font=font)
    img.save(path)


# -----------------------------------------------------------------------------
# Frechet distances: FID (Inception pool3, 2048-d) and FVD (I3D, 400-d), strictly offline
#
# d^2 = |mu_1 - mu_2|^2 + tr(S_1) + tr(S_2) - 2 tr((S_1 S_2)^(1/2))
# tr((S_1 S_2)^(1/2)) is computed without scipy, by eigendecomposition: S_1 S_2 is similar to the
# symmetric PSD A = S_1^(1/2) S_2 S_1^(1/2) (same eigenvalues), so tr((S_1 S_2)^(1/2)) = sum sqrt(eig(A)),
# with numpy.linalg.eigh in float64 and tiny negative eigenvalues (roundoff) clipped to 0. Same value as
# pytorch-fid's scipy.linalg.sqrtm route where that one is well defined; stable for singular
# covariances (fewer samples than feature dimensions), where sqrtm needs its eps fix.

FID_FILE = 'pt_inception-2015-12-05-6726825d.pth'  # pytorch-fid's port of the TF FID Inception
FVD_FILE = 'i3d_torchscript.pt'  # StyleGAN-V's TorchScript port of the tf.hub I3D (Kinetics-400)


def feature_stats(feats):
    """Mean (D,) and covariance (D, D) of features (N, D), float64; covariance with N - 1 (np.cov)."""
    f = np.asarray(feats, np.float64)
    assert f.ndim == 2 and len(f) >= 2, f"need at least 2 feature rows, got {f.shape}"
    return f.mean(0), np.cov(f, rowvar=False)


def _sqrt_psd(s):
    w, v = np.linalg.eigh((s + s.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def frechet_distance(mu1, s1, mu2, s2):
    """Frechet distance between N(mu1, s1) and N(mu2, s2) (formula above)."""
    mu1, mu2 = np.atleast_1d(np.asarray(mu1, np.float64)), np.atleast_1d(np.asarray(mu2, np.float64))
    s1, s2 = np.atleast_2d(np.asarray(s1, np.float64)), np.atleast_2d(np.asarray(s2, np.float64))
    r = _sqrt_psd(s1)
    eig = np.linalg.eigvalsh(r @ s2 @ r)
    tr_covmean = np.sqrt(np.clip(eig, 0, None)).sum()
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * tr_covmean)


def frechet_from_features(fa, fb):
    """Frechet distance between Gaussians fitted to two feature sets (N, D) and (M, D)."""
    return frechet_distance(*feature_stats(fa), *feature_stats(fb))


def _weights_path(path, env, default):
    # explicit path > environment variable > the torch hub cache folder
    return path or os.environ.get(env) or os.path.join(torch.hub.get_dir(), 'checkpoints', default)


def _sha256_prefix(path, n=8):
    import hashlib
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            h.update(chunk)
    return h.hexdigest()[:n]


def build_fid_inception():
    """pytorch-fid's FID Inception (random weights until loaded): torchvision's Inception3 with 1008
    classes, no aux head, and the TF graph's pooling in the mixed blocks: average pools that do not
    count padding (5b-5d, 6b-6e, 7b) and a max pool in the last block's pool branch (7c).
    The blocks keep torchvision's parameter names, so pytorch-fid's state dict loads as it is."""
    import torchvision.models.inception as tvi

    def avg(x):  # the TF graph's average pool ignores the padding
        return F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, count_include_pad=False)

    class A(tvi.InceptionA):
        def forward(self, x):
            b1 = self.branch1x1(x)
            b5 = self.branch5x5_2(self.branch5x5_1(x))
            b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
            return torch.cat([b1, b5, b3, self.branch_pool(avg(x))], 1)

    class C(tvi.InceptionC):
        def forward(self, x):
            b1 = self.branch1x1(x)
            b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
            bd = x
            for m in (self.branch7x7dbl_1, self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4, self.branch7x7dbl_5):
                bd = m(bd)
            return torch.cat([b1, b7, bd, self.branch_pool(avg(x))], 1)

    class E(tvi.InceptionE):
        pool = 'avg'

        def forward(self, x):
            b1 = self.branch1x1(x)
            b3 = self.branch3x3_1(x)
            b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
            bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
            bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
            p = avg(x) if self.pool == 'avg' else F.max_pool2d(x, kernel_size=3, stride=1, padding=1)
            return torch.cat([b1, b3, bd, self.branch_pool(p)], 1)

    net = tvi.Inception3(num_classes=1008, aux_logits=False, transform_input=False, init_weights=False)
    net.Mixed_5b, net.Mixed_5c, net.Mixed_5d = A(192, 32), A(256, 64), A(288, 64)
    net.Mixed_6b, net.Mixed_6c, net.Mixed_6d, net.Mixed_6e = C(768, 128), C(768, 160), C(768, 160), C(768, 192)
    net.Mixed_7b, net.Mixed_7c = E(1280), E(2048)
    net.Mixed_7c.pool = 'max'
    return net.eval()


def load_inception(path=None, device='cpu'):
    """The FID Inception with pytorch-fid's weights from a local file, never downloaded.
    path > $WM_FID_WEIGHTS > torch.hub.get_dir()/checkpoints/pt_inception-2015-12-05-6726825d.pth
    (where pytorch-fid caches it). Returns (net or None, message)."""
    p = _weights_path(path, 'WM_FID_WEIGHTS', FID_FILE)
    if not os.path.isfile(p):
        return None, f"unavailable: no Inception weights at {p}"
    net = build_fid_inception()
    try:
        sd = torch.load(p, map_location='cpu', weights_only=True)
        missing, unexpected = net.load_state_dict(sd, strict=False)
    except Exception as e:  # not a state dict, or tensors of the wrong shapes
        return None, f"unavailable: {p} is not the FID Inception state dict ({type(e).__name__})"
    missing = [k for k in missing if not k.endswith('num_batches_tracked')]  # older BN files lack the counter
    if missing or unexpected:
        return None, f"unavailable: {p} is not the FID Inception state dict (missing {missing[:3]}, unexpected {unexpected[:3]})"
    for q in net.parameters():
        q.requires_grad_(False)
    h = _sha256_prefix(p)
    note = '' if h == '6726825d' else f" (sha256 {h}..., not pytorch-fid's 6726825d: not comparable to published FIDs)"
    return net.to(device), f"FID Inception from {p}{note}"


@torch.no_grad()
def inception_features(net, frames_u8, batch_size=50):
    """Pool3 features (N, 2048) of uint8 frames (N, H, W, 3), pytorch-fid's input pipeline: [0, 1],
    bilinear resize to 299x299 (align_corners False), then 2x - 1. A net that is not the FID Inception
    (no Mixed_7c) is called as net(x) on that input: a stand-in for tests, never an FID."""
    dev = next(net.parameters()).device
    out = []
    for i in range(0, len(frames_u8), batch_size):
        x = torch.from_numpy(np.asarray(frames_u8[i:i + batch_size])).to(dev).permute(0, 3, 1, 2).float() / 255
        x = F.interpolate(x, size=(299, 299), mode='bilinear', align_corners=False) * 2 - 1
        if not hasattr(net, 'Mixed_7c'):  # any other network (the tests' stand-in) gets the same input
            out.append(net(x).flatten(1).double().cpu().numpy())
            continue
        for name in ('Conv2d_1a_3x3', 'Conv2d_2a_3x3', 'Conv2d_2b_3x3', 'maxpool1', 'Conv2d_3b_1x1', 'Conv2d_4a_3x3',
                     'maxpool2', 'Mixed_5b', 'Mixed_5c', 'Mixed_5d', 'Mixed_6a', 'Mixed_6b', 'Mixed_6c', 'Mixed_6d',
                     'Mixed_6e', 'Mixed_7a', 'Mixed_7b', 'Mixed_7c'):
            x = getattr(net, name)(x)
        out.append(F.adaptive_avg_pool2d(x, 1).flatten(1).double().cpu().numpy())
    return np.concatenate(out)


def load_i3d(path=None, device='cpu'):
    """StyleGAN-V's TorchScript I3D from a local file (torch.jit.load), never downloaded.
    path > $WM_FVD_WEIGHTS > torch.hub.get_dir()/checkpoints/i3d_torchscript.pt. Returns (net or None, message)."""
    p = _weights_path(path, 'WM_FVD_WEIGHTS', FVD_FILE)
    if not os.path.isfile(p):
        return None, f"unavailable: no I3D weights at {p}"
    try:
        with warnings.catch_warnings():  # the weights only exist as TorchScript; torch's deprecation note is not actionable here
            warnings.simplefilter('ignore', FutureWarning)
            net = torch.jit.load(p, map_location=device).eval()
    except Exception as e:
        return None, f"unavailable: {p} does not load as TorchScript ({type(e).__name__})"
    return net, f"I3D (TorchScript) from {p}"


def video_clips(videos_u8, length=16, stride=16):
    """Cut videos (E, T, H, W, 3) into clips (N, length, H, W, 3): windows starting every `stride` frames."""
    v = np.asarray(videos_u8)
    starts = range(0, v.shape[1] - length + 1, stride)
    return np.stack([v[e, s:s + length] for e in range(len(v)) for s in starts]) if len(starts) else v[:0, :length]


@torch.no_grad()
def i3d_features(net, clips_u8, batch_size=8):
    """I3D features (N, 400) of uint8 clips (N, T, H, W, 3), called as StyleGAN-V's FVD does
    (src/metrics/frechet_video_distance.py + metric_utils.py): uint8 videos (N, 3, T, H, W) in [0, 255],
    detector(videos, rescale=True, resize=True, return_features=True) -> the logits layer before the
    softmax; the network itself maps [0, 255] to [-1, 1] and resizes to 224x224. (Ports that resize
    and scale to [-1, 1] themselves call it with rescale=False, resize=False instead.)"""
    out = []
    for i in range(0, len(clips_u8), batch_size):
        x = torch.from_numpy(np.asarray(clips_u8[i:i + batch_size])).permute(0, 4, 1, 2, 3).contiguous()
        x = x.to(next(net.parameters()).device)
        out.append(net(x, rescale=True, resize=True, return_features=True).double().cpu().numpy())
    return np.concatenate(out)


def fid_fvd(pred_videos, true_videos, fid_weights=None, fvd_weights=None, clip_len=16, device='cpu'):
    """FID over all frames and FVD over 16-frame clips of predicted vs true videos (E, T, H, W, 3) uint8.
    Returns {'fid', 'fid_status', 'fid_frames', 'fvd', 'fvd_status', 'fvd_clips'}; a value is None, with
    the status saying why, when its weights file is missing. Only the published networks give numbers
    here, so nothing from a stand-in network is ever reported under these names. Few samples bias both
    upwards (the covariances are 2048- and 400-dimensional): compare runs with the same counts only."""
    pred, true = np.asarray(pred_videos), np.asarray(true_videos)
    out = {}
    net, msg = load_inception(fid_weights, device)
    fp, ft = pred.reshape(-1, *pred.shape[2:]), true.reshape(-1, *true.shape[2:])
    out['fid'] = None if net is None else frechet_from_features(inception_features(net, fp), inception_features(net, ft))
    out['fid_status'], out['fid_frames'] = msg, int(len(fp))
    net, msg = load_i3d(fvd_weights, device)
    cp, ct = video_clips(pred, clip_len, clip_len), video_clips(true, clip_len, clip_len)
    if net is not None and len(cp) < 2:
        net, msg = None, f"unavailable: fewer than 2 clips of {clip_len} frames"
    out['fvd'] = None if net is None else frechet_from_features(i3d_features(net, cp), i3d_features(net, ct))
    out['fvd_status'], out['fvd_clips'] = msg, int(len(cp))
    return out
