# Stage-1 paper-size recipe: Push-T at 128x128 (latent 4x32x32), for one large GPU. NOT run by us
# (no GPU in our sessions); the sizes follow the reference's scale (tens of M parameters in total).
enc_ch = 64
dec_ch = (64, 128, 256, 256)
dec_attn = (False, False, True, True)
emb_dim = 256
heads = 4
batch_size = 64
lr = 2e-4
min_lr = 2e-5
warmup_iters = 1000
max_iters = 200000
eval_interval = 5000
log_interval = 100
eval_frames = 256
p_sched = 0.5
both_terms = True
