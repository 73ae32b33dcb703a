# Stage-1 CPU recipe: Push-T at 64x64, sized so the whole pipeline fits in ~45 minutes on 2 CPU cores.
# A recipe only reassigns defaults of train_ae.py; an unknown key is an error.
enc_ch = 32
dec_ch = (16, 32, 64)
dec_attn = (False, False, True)
emb_dim = 64
batch_size = 16
p_sched = 0.8
max_iters = 2000
