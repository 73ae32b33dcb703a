"""
The networks and the one formula they share. No side effects: import it, build what you need.

Interactive World Simulator (Wang et al. 2026, arXiv 2603.08546), in small:
  stage 1  Encoder E: image -> 2D latent z (unit norm per latent pixel),
           Decoder D: a consistency model that turns noise into the image in K jumps, given z.
  stage 2  Dynamics F: a consistency model in latent space that predicts the next latent from a
           window of past latents and their actions.

Noise: discrete DDPM forward process, T = 1000, sigmoid beta schedule (start -3, end 3, tau 1):
    x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps                                  (1)
Networks predict v:  x0_hat = sqrt(abar_t) x_t - sqrt(1 - abar_t) v                 (2)
Trajectory jump (CTM parameterisation on integer steps), s <= t:
    G(x_t, t, s) = (s / t) x_t + (1 - s / t) x0_hat(x_t, t, s)                      (3)
so G(x, t, t) = x and G(x, t, 0) = x0_hat. Every network takes both t and s.
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

T_STEPS = 1000
CTX_NOISE_MAX = 99  # training context levels t ~ U{1..99} (noise std up to ~0.2 of the unit-norm latent)

# ----------------------------------------------------------------------------------------------
# the noise schedule and the jump G


def sigmoid_alpha_bar(T=T_STEPS, start=-3.0, end=3.0, tau=1.0):
    """abar_t for t = 0..T-1 from the sigmoid schedule; abar_999 ~ 3e-7 (pure noise)."""
    x = torch.linspace(0, T, T + 1, dtype=torch.float64) / T
    v0, v1 = torch.sigmoid(torch.tensor(start / tau)), torch.sigmoid(torch.tensor(end / tau))
    f = (v1 - torch.sigmoid((x * (end - start) + start) / tau)) / (v1 - v0)  # 1 -> 0
    f = f / f[0]
    betas = (1 - f[1:] / f[:-1]).clamp(0, 0.999)
    return torch.cumprod(1 - betas, 0).float()  # (T,)


def _bc(a, x):
    """Broadcast a per-sample vector a (B,) against x (B, ...)."""
    return a.view(-1, *([1] * (x.dim() - 1)))


def add_noise(x0, t, eps, abar):
    """Eq. (1). t is an integer tensor (B,); t = 0 returns x0 exactly (level 0 means clean)."""
    a = abar[t].where(t > 0, torch.ones_like(abar[t]))
    return _bc(a.sqrt(), x0) * x0 + _bc((1 - a).sqrt(), x0) * eps


def x0_from_v(x_t, t, v, abar):
    """Eq. (2)."""
    a = abar[t].where(t > 0, torch.ones_like(abar[t]))
    return _bc(a.sqrt(), x_t) * x_t - _bc((1 - a).sqrt(), x_t) * v


def jump(x_t, x0_hat, t, s):
    """Eq. (3): G(x_t, t, s) from the network's x0_hat."""
    r = _bc(s.float() / t.float().clamp(min=1), x_t)
    return r * x_t + (1 - r) * x0_hat


def frames_to_tensor(frames_u8, device='cpu'):
    """uint8 frames (B, H, W, 3) -> float (B, 3, H, W) in [-1, 1], the range every network sees."""
    if isinstance(frames_u8, np.ndarray) and not frames_u8.flags.writeable:
        frames_u8 = frames_u8.copy()  # a slice of a read-only memmap: torch.as_tensor warns on those
    x = torch.as_tensor(frames_u8).to(device)
    return x.permute(0, 3, 1, 2).float() / 127.5 - 1


def tensor_to_frames(x):
    """float (B, 3, H, W) in [-1, 1] -> uint8 numpy (B, H, W, 3)."""
    return ((x.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()


def unit_norm(z, dim=1, eps=1e-6):
    """Scale every latent pixel to unit L2 norm across its channels."""
    return z / z.norm(dim=dim, keepdim=True).clamp(min=eps)


# ----------------------------------------------------------------------------------------------
# building blocks


def timestep_embedding(t, dim):
    """Sinusoidal embedding of integer levels t (B,) -> (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([args.cos(), args.sin()], dim=-1)


class LevelEmbedding(nn.Module):
    """(t, s) -> embedding: two sinusoidal embeddings, each through a small MLP, concatenated."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.mlp_t = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim // 2))
        self.mlp_s = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim // 2))

    def forward(self, t, s):
        return torch.cat([self.mlp_t(timestep_embedding(t, self.dim)), self.mlp_s(timestep_embedding(s, self.dim))], -1)


def norm(ch):
    return nn.GroupNorm(min(8, ch // 4) if ch >= 8 else 1, ch)


def zero_init(m):
    nn.init.zeros_(m.weight)
    if m.bias is not None:
        nn.init.zeros_(m.bias)
    return m


class ResBlock(nn.Module):
    """GN -> SiLU -> conv -> GN -> FiLM(emb_1) [-> FiLM(emb_2)] -> SiLU -> conv, plus a residual.
    2D convs; the dynamics net applies it to every frame separately (= Conv3d with kernel (1,3,3))."""

    def __init__(self, cin, cout, emb_dims):
        super().__init__()
        self.n1, self.c1 = norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.n2, self.c2 = norm(cout), zero_init(nn.Conv2d(cout, cout, 3, padding=1))
        self.films = nn.ModuleList([nn.Linear(d, 2 * cout) for d in emb_dims])  # scale-shift per embedding
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, embs):
        h = self.c1(F.silu(self.n1(x)))
        h = self.n2(h)
        for film, e in zip(self.films, embs):
            scale, shift = film(e)[:, :, None, None].chunk(2, dim=1)
            h = h * (1 + scale) + shift
        return self.skip(x) + self.c2(F.silu(h))


class SpatialAttention(nn.Module):
    """Self-attention over the h*w tokens of each image (or frame)."""

    def __init__(self, ch, heads):
        super().__init__()
        self.heads, self.n = heads, norm(ch)
        self.qkv, self.out = nn.Conv2d(ch, 3 * ch, 1), zero_init(nn.Conv2d(ch, ch, 1))

    def forward(self, x):
        B, C, H, W = x.shape
        qkv = self.qkv(self.n(x)).reshape(B, 3, self.heads, C // self.heads, H * W)  # (B,3,heads,d,HW)
        # contiguous: CPU's fused attention wants unit stride along d (a transposed view takes the 2x slower path)
        q, k, v = qkv.transpose(-1, -2).contiguous().unbind(1)  # each (B, heads, HW, d)
        h = F.scaled_dot_product_attention(q, k, v)  # (B, heads, HW, d)
        h = h.transpose(-1, -2).reshape(B, C, H, W)  # (B, C, H, W)
        return x + self.out(h)


def rotary(x, pos):
    """Rotary position embedding over the last dim of x (..., T, d) at integer positions pos (T,)."""
    d = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(d, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[:, None] * freqs[None]  # (T, d)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class TemporalAttention(nn.Module):
    """Causal self-attention over the T frames, separately at every latent pixel, with rotary positions.
    Frame k sees frames <= k only, so a context frame's features never depend on later frames.
    pos (T,) and mask (T, T) (True = may attend) replace the plain causal layout when given (training
    with a query per frame, see Dynamics.forward)."""

    def __init__(self, ch, heads):
        super().__init__()
        self.heads, self.n = heads, norm(ch)
        self.qkv, self.out = nn.Linear(ch, 3 * ch), zero_init(nn.Linear(ch, ch))

    def forward(self, x, T, pos=None, mask=None):
        BT, C, H, W = x.shape
        B = BT // T
        h = self.n(x).reshape(B, T, C, H * W).permute(0, 3, 1, 2).reshape(B * H * W, T, C)  # (B*HW, T, C)
        q, k, v = self.qkv(h).reshape(B * H * W, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        pos = torch.arange(T, device=x.device) if pos is None else pos
        q, k = rotary(q, pos), rotary(k, pos)  # each (B*HW, heads, T, d)
        if mask is None:
            h = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B*HW, heads, T, d)
        else:
            h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = self.out(h.transpose(1, 2).reshape(B * H * W, T, C))  # (B*HW, T, C)
        h = h.reshape(B, H * W, T, C).permute(0, 2, 3, 1).reshape(BT, C, H, W)  # back to (B*T, C, H, W)
        return x + h


# ----------------------------------------------------------------------------------------------
# stage 1: encoder and consistency decoder


class Encoder(nn.Module):
    """(B, 3, H, W) in [-1, 1] -> (B, latent_ch, H/4, W/4), unit norm per latent pixel. No KL, no VQ."""

    def __init__(self, ch=32, latent_ch=4):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, ch, 3, padding=1), nn.SiLU(),
            nn.Conv2d(ch, ch, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(ch, 2 * ch, 3, padding=1), nn.SiLU(),
            nn.Conv2d(2 * ch, 2 * ch, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(2 * ch, 2 * ch, 3, padding=1), nn.SiLU(),
            nn.Conv2d(2 * ch, latent_ch, 3, padding=1),
        )

    def forward(self, x):
        return unit_norm(self.net(x))


class Decoder(nn.Module):
    """UNet on the noisy image x_t, FiLM by the (t, s) embedding, conditioned on the latent z.
    The latent goes through a small conv stack at its own resolution and is added, resized and
    1x1-projected, at the entry of every level (a cheap stand-in for the reference's ControlNet copy).
    Widest layers at the lowest resolution; attention only where it is switched on (few tokens)."""

    def __init__(self, ch=(16, 32, 64), attn=(False, False, True), latent_ch=4, emb_dim=64, heads=2, deterministic=False):
        super().__init__()
        self.deterministic = deterministic  # the ablation's plain decoder: one pass from a zero image (decode)
        self.emb = LevelEmbedding(emb_dim)
        self.cond = nn.Sequential(nn.Conv2d(latent_ch, ch[-1], 3, padding=1), nn.SiLU(),
                                  nn.Conv2d(ch[-1], ch[-1], 3, padding=1), nn.SiLU())
        self.cond_down = nn.ModuleList([nn.Conv2d(ch[-1], c, 1) for c in ch])
        self.cond_up = nn.ModuleList([nn.Conv2d(ch[-1], c, 1) for c in ch])
        self.conv_in = nn.Conv2d(3, ch[0], 3, padding=1)
        self.down = nn.ModuleList([ResBlock(c, c, [emb_dim]) for c in ch])
        self.down_attn = nn.ModuleList([SpatialAttention(c, heads) if a else nn.Identity() for c, a in zip(ch, attn)])
        self.downsample = nn.ModuleList([nn.Conv2d(ch[i], ch[i + 1], 3, stride=2, padding=1) for i in range(len(ch) - 1)])
        self.mid = ResBlock(ch[-1], ch[-1], [emb_dim])
        self.up = nn.ModuleList([ResBlock(2 * c, c, [emb_dim]) for c in ch])
        self.up_attn = nn.ModuleList([SpatialAttention(c, heads) if a else nn.Identity() for c, a in zip(ch, attn)])
        self.upsample = nn.ModuleList([nn.Conv2d(ch[i + 1], ch[i], 3, padding=1) for i in range(len(ch) - 1)])
        self.out = nn.Sequential(norm(ch[0]), nn.SiLU(), zero_init(nn.Conv2d(ch[0], 3, 3, padding=1)))

    def forward(self, x, t, s, z):
        """x (B,3,H,W), t, s (B,) integer levels, z (B,latent_ch,h,w) -> v (B,3,H,W)."""
        e = [self.emb(t, s)]
        c = self.cond(z)
        h, skips = self.conv_in(x), []
        for i in range(len(self.down)):
            h = h + self.cond_down[i](F.interpolate(c, size=h.shape[-2:], mode='nearest'))
            h = self.down_attn[i](self.down[i](h, e))
            skips.append(h)
            if i < len(self.downsample):
                h = self.downsample[i](h)
        h = self.mid(h, e)
        for i in reversed(range(len(self.up))):
            h = h + self.cond_up[i](F.interpolate(c, size=h.shape[-2:], mode='nearest'))
            h = self.up_attn[i](self.up[i](torch.cat([h, skips.pop()], 1), e))
            if i > 0:
                h = self.upsample[i - 1](F.interpolate(h, scale_factor=2, mode='nearest'))
        return self.out(h)


def decoder_x0(dec, x_t, t, s, z, abar):
    """x0_hat from the decoder's v-prediction, eq. (2)."""
    return x0_from_v(x_t, t, dec(x_t, t, s, z), abar)


def decoder_loss(dec, x0, z, t, s, abar, snr_gamma=5.0, both_terms=True):
    """Stage-1 consistency loss without a teacher (same eps for x_t and x_s):
        w(t) |G(x_t, t, s | z) - x_s|^2  +  w(s) |G(x_s, s, 0 | z) - x_0|^2
    with w = min(SNR, gamma) / SNR (gamma = snr_gamma = 5): full weight wherever SNR <= 5 (every point the
    sampler visits), gamma / SNR on the nearly clean, easy levels (min-SNR-gamma's noise-space weight, Hang
    et al. 2023, here on an x-space loss).
    both_terms=False gives each sample one of the two terms, at random: the same loss in expectation
    (halved) for one network pass per sample instead of two."""
    eps = torch.randn_like(x0)
    x_t, x_s = add_noise(x0, t, eps, abar), add_noise(x0, s, eps, abar)
    zero = torch.zeros_like(s)
    if both_terms:  # both terms in one batched forward pass: (2B, ...)
        xin, tin, sin, zin = torch.cat([x_t, x_s]), torch.cat([t, s]), torch.cat([s, zero]), torch.cat([z, z])
        target = torch.cat([x_s, x0])
    else:
        second = torch.rand(t.shape, device=t.device) < 0.5  # (B,) which term each sample trains
        xin, target = torch.where(_bc(second, x0), x_s, x_t), torch.where(_bc(second, x0), x0, x_s)
        tin, sin, zin = torch.where(second, s, t), torch.where(second, zero, s), z
    out = jump(xin, decoder_x0(dec, xin, tin, sin, zin, abar), tin, sin)
    snr = abar[tin] / (1 - abar[tin])
    w = snr.clamp(max=snr_gamma) / snr
    return (w * ((out - target) ** 2).mean(dim=(1, 2, 3))).mean()


def deterministic_decoder_loss(dec, x0, z, abar):
    """The ablation baseline: the same UNet as a plain deterministic decoder, x0_hat(0, 999, 0 | z)
    regressed onto the frame with MSE (no noise anywhere, so it predicts the mean image given z)."""
    t = torch.full((x0.shape[0],), T_STEPS - 1, dtype=torch.long, device=x0.device)
    return ((decoder_x0(dec, torch.zeros_like(x0), t, torch.zeros_like(t), z, abar) - x0) ** 2).mean()


def sample_schedule(K, T=T_STEPS):
    """The K-jump sampling path: linspace(999, 0, K + 1) rounded to integers."""
    return [int(round(v)) for v in torch.linspace(T - 1, 0, K + 1).tolist()]


@torch.no_grad()
def decode(dec, z, K, abar, image_size, generator=None):
    """Noise -> image in K jumps along the schedule, conditioned on z. Returns (B,3,S,S) in [-1, 1]."""
    B = z.shape[0]
    if dec.deterministic:  # one pass from a zero image, whatever K is
        x, path = torch.zeros(B, 3, image_size, image_size, device=z.device), [T_STEPS - 1, 0]
    else:
        x = torch.randn(B, 3, image_size, image_size, generator=generator, device='cpu').to(z.device)
        path = sample_schedule(K)
    for t_, s_ in zip(path[:-1], path[1:]):
        t = torch.full((B,), t_, device=z.device, dtype=torch.long)
        s = torch.full((B,), s_, device=z.device, dtype=torch.long)
        x = jump(x, decoder_x0(dec, x, t, s, z, abar), t, s)
    return x.clamp(-1, 1)


# ----------------------------------------------------------------------------------------------
# stage 2: latent dynamics


def point_map(dims, stats, low, high, image_size, latent_size):
    """The action map's coordinates: for the two action dims (x, y) that are a point in the image, the
    affine map from the normalised action (data.normalize_actions with the training stats) to the latent
    grid's coordinates, in which the latent pixel centres run from -1 to 1 (Dynamics' coordinate
    channels). low, high: where the action range lies on the image (meta.json's action_low/high span
    the frame edge to edge); a pixel-space coordinate u in [0, S] has its latent cell centre at
    u h / S - 1/2 (h = latent_size). Returns plain data for the checkpoint: {'dims', 'scale', 'offset'}."""
    h = latent_size
    scale, offset = [], []
    for d in dims:
        lo_s, hi_s, lo_m, hi_m = stats['low'][d], stats['high'][d], low[d], high[d]
        r = (hi_s - lo_s) / 2 / (hi_m - lo_m)  # normalised action -> fraction of the image: u/S = r a + c
        c = ((hi_s + lo_s) / 2 - lo_m) / (hi_m - lo_m)
        k = 2 * h / max(h - 1, 1)  # fraction of the image -> grid: g = k u/S - 1/(h-1) - 1
        scale.append(k * r)
        offset.append(k * c - 1 / max(h - 1, 1) - 1)
    return {'dims': [int(d) for d in dims], 'scale': scale, 'offset': offset}


class Dynamics(nn.Module):
    """Latent dynamics consistency model over a window of T frames.

    Input latents (B, T, C, h, w) at per-frame noise levels (t, s) (B, T), with per-frame action
    inputs (B, T, A+1) where the action attached to frame j is the one that produced it, a_{j-1}
    (see action_input; the extra bit says whether an action produced the frame at all). Output v for
    every frame: inference uses the last one, training (queries) every new one.
    input conv (1,5,5) -> temporal attention -> down blocks -> mid -> up blocks (skips, same resolution)
    -> output conv. Each block: ResBlock with FiLM(noise level) then FiLM(action), spatial attention,
    causal temporal attention. Convs are per frame (kernel (1,k,k)) and GroupNorm is per frame too, so
    nothing but the causal temporal attention mixes frames."""

    def __init__(self, latent_ch=4, ch=64, depth=2, action_dim=2, emb_dim=128, heads=4, spatial_attn='all', action_map=None):
        super().__init__()
        # action_map (not in the paper; the Push-T CPU recipe's): when two action dims are a point in the image
        # (Push-T: the agent's target), the action is also drawn as a Gaussian spot on the latent grid for the
        # input conv, so "the agent goes where the spot is" is a local rule the convs learn in a few hundred
        # steps, not a map from two numbers to a place that FiLM must discover. A dict from point_map().
        self.action_map = action_map
        self.emb = LevelEmbedding(emb_dim)
        self.act = nn.Sequential(nn.Linear(action_dim + 1, emb_dim),  # + the 'has action' bit (action_input)
                                  nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        # input conv (1,5,5) over [this frame, the previous frame, 2 coordinate channels]:
        # - the previous frame (a causal time kernel of 2): the next latent is mostly the last one, and
        #   with it one conv away the net need not first learn to copy it through attention;
        # - coordinates: convs are translation-equivariant, but an action like a Push-T target is a
        #   place in the image, so every latent pixel is told where it is.
        self.conv_in = nn.Conv2d(2 * latent_ch + 2 + int(action_map is not None), ch, 5, padding=2)
        self.attn_in = TemporalAttention(ch, heads)

        def block(cin, sa):  # spatial_attn 'all' or 'mid' (the cheaper CPU choice: 256 tokens cost)
            return nn.ModuleList([ResBlock(cin, ch, [emb_dim, emb_dim]),
                                  SpatialAttention(ch, heads) if sa else nn.Identity(), TemporalAttention(ch, heads)])
        if spatial_attn not in ('all', 'mid'):
            raise ValueError(f"spatial_attn must be 'all' or 'mid', got {spatial_attn!r}")
        every = spatial_attn == 'all'
        self.down = nn.ModuleList([block(ch, every) for _ in range(depth)])
        self.mid = block(ch, True)
        self.up = nn.ModuleList([block(2 * ch, every) for _ in range(depth)])
        self.out = nn.Sequential(norm(ch), nn.SiLU(), zero_init(nn.Conv2d(ch, latent_ch, 3, padding=1)))

    def forward(self, x, t, s, a, queries=False):
        """x (B, T, C, h, w) latents at levels t, s (B, T), actions a (B, T, A+1) -> v (B, T, C, h, w).
        queries=False: a plain causal window; frame j sees frames <= j, its 'previous frame' is j-1.
        queries=True (training, T = 2n): x holds n context frames z_0..z_{n-1}, then n new frames
        z_1..z_n (noisy). New frame z_{j+1} sees context frames <= j and itself, has z_j as its previous
        frame and sits at position j+1, so each of the n queries is exactly the last frame of a plain
        window over z_0..z_{j+1}: one pass trains n predictions instead of one."""
        B, T, C, H, W = x.shape
        e = [self.emb(t.reshape(-1), s.reshape(-1)), self.act(a.reshape(B * T, -1))]  # each (B*T, E)
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, H, device=x.device), torch.linspace(-1, 1, W, device=x.device), indexing='ij')
        coords = torch.stack([xs, ys])[None].expand(B * T, 2, H, W)  # (B*T, 2, H, W)
        pos = mask = None
        if queries:
            n = T // 2
            ctx = x[:, :n]  # (B, n, C, H, W)
            prev = torch.cat([ctx[:, :1], ctx[:, :-1], ctx], 1)  # (B, 2n, C, H, W)
            i = torch.arange(n, device=x.device)
            pos = torch.cat([i, i + 1])  # (2n,)
            causal = i[None, :] <= i[:, None]  # (n, n): row may see column
            mask = torch.cat([torch.cat([causal, torch.zeros(n, n, dtype=torch.bool, device=x.device)], 1),
                              torch.cat([causal, torch.eye(n, dtype=torch.bool, device=x.device)], 1)], 0)  # (2n, 2n)
        else:
            prev = torch.cat([x[:, :1], x[:, :-1]], 1)  # (B, T, C, H, W): frame j-1 (frame 0 for frame 0)
        h = [x.reshape(B * T, C, H, W), prev.reshape(B * T, C, H, W), coords]
        if self.action_map is not None:  # a spot of std one latent pixel at the action's (x, y); none where no action
            a2 = a.reshape(B * T, -1)  # (B*T, A+1): normalised action in [-1, 1], then the 'has action' bit
            m = self.action_map
            gx = a2[:, m['dims'][0], None, None] * m['scale'][0] + m['offset'][0]  # (B*T, 1, 1) grid x in [-1, 1]
            gy = a2[:, m['dims'][1], None, None] * m['scale'][1] + m['offset'][1]
            d2 = (coords[:, 0] - gx) ** 2 + (coords[:, 1] - gy) ** 2  # (B*T, H, W)
            sigma = 2.0 / max(W - 1, 1)
            h.append((torch.exp(-d2 / (2 * sigma ** 2)) * a2[:, -1, None, None])[:, None])  # (B*T, 1, H, W)
        h = torch.cat(h, 1)  # (B*T, 2C+2[+1], H, W)
        h = self.attn_in(self.conv_in(h), T, pos, mask)  # (B*T, ch, H, W)

        def run(blk, h):
            res, sa, ta = blk
            return ta(sa(res(h, e)), T, pos, mask)
        skips = []
        for blk in self.down:
            h = run(blk, h)
            skips.append(h)
        h = run(self.mid, h)
        for blk in self.up:
            h = run(blk, torch.cat([h, skips.pop()], 1))
        return self.out(h).reshape(B, T, C, H, W)  # v for every frame


def dynamics_levels(B, T, ctx_level, device):
    """Noise levels (t, s) for a window: context frames t = s (ctx_level an int, or None to draw
    U{1..CTX_NOISE_MAX} independently per frame), the new last frame t = 999 -> s = 0."""
    if ctx_level is None:
        t = torch.randint(1, CTX_NOISE_MAX + 1, (B, T), device='cpu').to(device)
    else:
        t = torch.full((B, T), ctx_level, dtype=torch.long, device=device)
    s = t.clone()
    t[:, -1], s[:, -1] = T_STEPS - 1, 0
    return t, s


def dynamics_loss(dyn, z, a, abar, ctx_noise=True, all_frames=True, ctx=None):
    """Stage-2 loss on a window of clean latents z (B, T, C, h, w) with actions a (B, T, A+1): the context
    really noised at t = s ~ U{1..99} (left clean if not ctx_noise), each new frame jumped from pure noise,
    G(x_999, 999, 0) = x0_hat (eqs. 2, 3), re-normalised as inference does, uniform MSE against its latent.
    all_frames=False: the paper's layout, the last frame is the only new one. all_frames=True: every frame after
    the first is new in one pass (Dynamics.forward, queries), each seeing exactly the context a plain window gives
    it: T-1 targets per window for (2T-2)/T the compute. ctx: context to show instead of z (own_context)."""
    B, T = z.shape[:2]
    ctx = z if ctx is None else ctx
    if all_frames:  # frames: context z_0..z_{n-1}, then the new z_1..z_n
        n = T - 1
        tc = (torch.randint(1, CTX_NOISE_MAX + 1, (B, n), device='cpu').to(z.device) if ctx_noise
              else torch.zeros(B, n, dtype=torch.long, device=z.device))
        t = torch.cat([tc, torch.full_like(tc, T_STEPS - 1)], 1)  # (B, 2n)
        s = torch.cat([tc, torch.zeros_like(tc)], 1)
        x0, a, target = torch.cat([ctx[:, :n], z[:, 1:]], 1), torch.cat([a[:, :n], a[:, 1:]], 1), z[:, 1:]
    else:
        n = 1
        t, s = dynamics_levels(B, T, None, z.device)
        if not ctx_noise:
            t[:, :-1], s[:, :-1] = 0, 0
        x0, target = ctx, z[:, -1:]
    eps = torch.randn_like(x0)
    x = add_noise(x0.flatten(0, 1), t.flatten(), eps.flatten(0, 1), abar).reshape(x0.shape)  # eq. (1), (B, T', C, h, w)
    v = dyn(x, t, s, a, queries=all_frames)[:, -n:].float()  # (B, n, C, h, w); fp32 under autocast
    xq, tq, sq = x[:, -n:].flatten(0, 1), t[:, -n:].flatten(), s[:, -n:].flatten()  # the new frames, (B*n, ...)
    pred = unit_norm(jump(xq, x0_from_v(xq, tq, v.flatten(0, 1), abar), tq, sq))
    return ((pred - target.flatten(0, 1)) ** 2).mean()


@torch.no_grad()
def predict_next(dyn, ctx, a, abar, ctx_level=15, generator=None):
    """The sliding-window step: ctx (B, T-1, C, h, w) clean context latents, a (B, T, A+1) the action
    inputs (action_input) attached to the T frames. The context is labelled with the small level
    ctx_level; a fresh noise latent is appended and jumped 999 -> 0 in one step, G(x, 999, 0) = x0_hat,
    then re-normalised to unit channel norm like the encoder's latents. Returns (B, C, h, w)."""
    B, Tc = ctx.shape[:2]
    x_new = torch.randn(ctx[:, 0].shape, generator=generator, device='cpu').to(ctx.device)
    t, s = dynamics_levels(B, Tc + 1, ctx_level, ctx.device)
    v = dyn(torch.cat([ctx, x_new[:, None]], 1), t, s, a)[:, -1].float()  # (B, C, h, w)
    return unit_norm(jump(x_new, x0_from_v(x_new, t[:, -1], v, abar), t[:, -1], s[:, -1]))


@torch.no_grad()
def own_context(dyn, z, a, abar, ctx_level=15):
    """Training on the model's own rollouts (train_dynamics' own_ctx; not in the paper): the window
    z (B, T, C, h, w) with frames 1..T-2 replaced by the model's open-loop predictions from frame 0 and
    the window's actions a (B, T, A+1), so the context a target sees carries the errors inference makes
    (no gradient through the rollout). Frames that no action produced (an episode's start) stay real."""
    out = z.clone()
    for j in range(1, z.shape[1] - 1):
        pred = predict_next(dyn, out[:, :j], a[:, :j + 1], abar, ctx_level)  # (B, C, h, w)
        out[:, j] = torch.where(_bc(a[:, j, -1] > 0, pred), pred, out[:, j])
    return out


# ----------------------------------------------------------------------------------------------
# the noisy-context sliding-window sampler


def action_input(a_norm, valid):
    """Per-frame action input of the dynamics net: the normalised action plus a 'has action' bit,
    so a frame that no action produced (the first frame, and its copies that fill the window at the
    start) is told apart from the action at the centre of the range. a_norm (..., A) -> (..., A+1)."""
    v = torch.full_like(a_norm[..., :1], float(valid))
    return torch.cat([a_norm * valid, v], -1)


def init_window(z0, window, action_dim):
    """Start a rollout from one latent z0 (B, C, h, w): the context is z0 repeated window-1 times,
    with no actions attached (training windows at the start of an episode look exactly like this)."""
    ctx = z0[:, None].repeat(1, window - 1, 1, 1, 1)  # (B, W-1, C, h, w)
    act = action_input(torch.zeros(z0.shape[0], window - 1, action_dim, device=z0.device), 0)  # (B, W-1, A+1)
    return ctx, act


@torch.no_grad()
def window_step(dyn, ctx, act, a_norm, abar, ctx_level=15, generator=None):
    """One live step: predict the frame that action a_norm (B, A) produces from the context, then slide
    the window (drop the oldest latent) so the cost per frame stays constant.
    Returns (new latent (B, C, h, w), new ctx, new act)."""
    a_new = action_input(a_norm, 1)[:, None]  # (B, 1, A+1)
    z = predict_next(dyn, ctx, torch.cat([act, a_new], 1), abar, ctx_level, generator)
    return z, torch.cat([ctx[:, 1:], z[:, None]], 1), torch.cat([act[:, 1:], a_new], 1)
