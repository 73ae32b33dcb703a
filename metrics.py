"""
Frame metrics for the Push-T world model: pixel (MSE, PSNR, SSIM, UIQI), perceptual
(LPIPS-Alex) and physics read off the pixels (agent position, block mask IoU).

Conventions
- Image tensors are float (B, 3, H, W) in [0, 1]; every metric uses data range 1 and
  returns a per-image tensor (B,). Average over the batch yourself.
- Physics functions take uint8 numpy frames (B, H, W, 3), as rendered by gym-pusht.

Importing this module has no side effects: lpips is imported inside load_lpips, and
nothing here imports gym or pygame.
"""
import os

import numpy as np
import torch
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# pixel metrics


def mse(x, y):
    """Mean squared error per image: mean over C, H, W of (x - y)^2."""
    return ((x - y) ** 2).flatten(1).mean(1)


def psnr(x, y):
    """PSNR in dB for data range 1: 10 log10(1 / mse), mse clamped at 1e-10 (so x == y gives 100 dB)."""
    return 10.0 * torch.log10(1.0 / mse(x, y).clamp_min(1e-10))


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
# Push-T physics from pixels
#
# How gym-pusht draws a frame (envs/pusht.py, pymunk_override.py), onto a 512x512 surface:
#   white background -> goal T in LightGreen -> pymunk debug_draw: walls (LightGray fat
#   segments), block (T polygons filled 1.2x LightSlateGray, outlined in LightSlateGray 4 px
#   lines), agent (RoyalBlue disc r=15 with a 1.2x lighter disc r=11 inside).
#   Measured: the agent ends up on top of the block where they overlap, so it stays visible.
#   No y flip (positive_y_is_up = False): pixel row = sim y. Then cv2.resize(INTER_LINEAR)
#   down to the observation size, which blends neighbouring pixels at edges.
# Colours as measured in rendered uint8 frames:
PUSHT_COLOURS = {
    "background": [(255, 255, 255), (144, 238, 144), (211, 211, 211)],  # white, goal, walls
    "block": [(143, 163, 184), (119, 136, 153)],  # fill (1.2 x LightSlateGray), outline
    "agent": [(65, 105, 225), (78, 126, 255)],  # RoyalBlue rim, lighter centre
}
COLOUR_TOLERANCE = 40.0  # max RGB distance (0..255 units) from the nearest mixing segment


def _palette():
    cols, labels = [], []
    for k, name in enumerate(["background", "block", "agent"]):
        for c in PUSHT_COLOURS[name]:
            cols.append(c)
            labels.append(k)
    return np.array(cols, np.float32), np.array(labels)


def segment_pusht(frames):
    """Boolean masks {"agent", "block"} (B, H, W) from uint8 frames (B, H, W, 3).

    Rule: nearest reference colour, extended to antialiased blends. Every pixel is explained
    as a mix p ~ t a + (1 - t) b of two reference colours a, b (pure colours are t = 1); the
    pair whose mixing segment is nearest in RGB wins and the pixel goes to the class of the
    dominant colour (a if t >= 0.5). Pixels farther than COLOUR_TOLERANCE from every segment
    are left out (as are background, goal and walls). Why segments, not points: a 75 % agent /
    25 % white edge pixel (113, 143, 233) is about as close to the block fill as to RoyalBlue,
    so plain nearest-colour would paint a ring of "block" around the agent.
    """
    frames = np.asarray(frames)
    assert frames.ndim == 4 and frames.shape[-1] == 3, frames.shape
    cols, labels = _palette()
    ia, ib = np.triu_indices(len(cols))  # all pairs, incl. (a, a) = the pure colour
    a, b = cols[ia], cols[ib]
    d = a - b  # (P, 3)
    dd = (d ** 2).sum(1)
    cls = np.zeros(frames.shape[:3], np.int64)
    for i in range(len(frames)):  # one frame at a time keeps the (pixels, pairs, 3) temp small
        p = frames[i].reshape(-1, 3).astype(np.float32)
        # t = clamp(<p - b, a - b> / |a - b|^2, 0, 1); distance |p - (b + t (a - b))|
        t = ((p[:, None, :] - b[None]) * d[None]).sum(-1) / np.maximum(dd, 1e-6)[None]
        t = np.where(dd[None] > 0, np.clip(t, 0, 1), 1.0)
        dist = np.linalg.norm(p[:, None, :] - (b[None] + t[..., None] * d[None]), axis=-1)
        best = dist.argmin(1)
        rows = np.arange(len(p))
        c = np.where(t[rows, best] >= 0.5, labels[ia][best], labels[ib][best])
        c = np.where(dist[rows, best] <= COLOUR_TOLERANCE, c, 0)
        cls[i] = c.reshape(frames.shape[1:3])
    return {"agent": cls == 2, "block": cls == 1}


def _centroids(m):
    # mean (x, y) of the True pixels of each mask (B, H, W), pixel centres at (c + 0.5, r + 0.5)
    B, H, W = m.shape
    out = np.full((B, 2), np.nan)
    ys, xs = np.mgrid[0:H, 0:W]
    for i in range(B):
        if m[i].any():
            out[i] = xs[m[i]].mean() + 0.5, ys[m[i]].mean() + 0.5
    return out


def agent_position(frames):
    """Agent centroid (B, 2) as (x, y) in frame pixels, NaN where no agent pixel is found.

    Pixel (row r, col c) covers [c, c+1) x [r, r+1), so its centre is (c + 0.5, r + 0.5);
    with this convention a sim position maps to pixels by p = sim * S / 512 (no y flip).
    """
    return _centroids(segment_pusht(frames)["agent"])


def mask_iou(a, b):
    """IoU per image (B,) of boolean masks (B, H, W): |a & b| / |a | b|, := 1.0 when both are empty."""
    a = np.asarray(a, bool).reshape(len(a), -1)
    b = np.asarray(b, bool).reshape(len(b), -1)
    inter = (a & b).sum(1)
    union = (a | b).sum(1)
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def pusht_physics(pred_frames, true_frames):
    """Per-frame physics errors between predicted and true uint8 frames (B, H, W, 3).

    "agent_err_px": Euclidean distance of the agent centroids in frame pixels. When the agent
      is found in one frame but not the other (e.g. the model lost it, or drew it where the
      truth has it hidden under the block), the error is the image diagonal sqrt(H^2 + W^2);
      when it is missing in both, 0. Never NaN.
    "block_iou": IoU of the block masks.
    """
    H, W = np.asarray(true_frames).shape[1:3]
    seg_p, seg_t = segment_pusht(pred_frames), segment_pusht(true_frames)
    pos_p, pos_t = _centroids(seg_p["agent"]), _centroids(seg_t["agent"])
    miss_p, miss_t = np.isnan(pos_p[:, 0]), np.isnan(pos_t[:, 0])
    err = np.linalg.norm(pos_p - pos_t, axis=1)
    err = np.where(miss_p != miss_t, float(np.hypot(H, W)), err)
    err = np.where(miss_p & miss_t, 0.0, err)
    return {"agent_err_px": err, "block_iou": mask_iou(seg_p["block"], seg_t["block"])}
