# Stage-2 paper-size recipe: window of 10 latents of 4x32x32, for one large GPU. NOT run by us.
window = 10
dyn_ch = 256
dyn_depth = 2
dyn_emb = 256
dyn_heads = 8
dyn_spatial_attn = 'all'
batch_size = 32
lr = 2e-4
min_lr = 2e-5
warmup_iters = 1000
max_iters = 200000
eval_interval = 5000
log_interval = 100
val_horizon = 50
