# Stage-1 CPU recipe for your own data (a convert.py dataset) at 64x64 on 2 CPU cores. Nothing in it is
# about Push-T: these are the network sizes of the Push-T CPU recipe, kept because their cost is measured
# (~195 ms/iter on 2 cores, 2000 iters ~6.5 min; it depends on the frame size, not on what the frames show).
# A recipe only reassigns defaults of train_ae.py; an unknown key is an error.
enc_ch = 32  # encoder width (0.1M params, cheap beside the decoder); 2x the default so the latent keeps more detail
dec_ch = (16, 32, 64)  # decoder UNet widths at 64, 32, 16 px: 0.5M params, 33 dB PSNR on 64x64 Push-T frames
dec_attn = (False, False, True)  # self-attention only at the coarsest level (16x16 = 256 tokens), where it is cheap
emb_dim = 64  # noise-level embedding width (the default): it only carries two scalars, t and s
batch_size = 16  # frames per step: ~195 ms per step on 2 cores at 64x64
p_sched = 0.8  # most (t, s) pairs on the K-jump sampling path that decoding walks: sampling quality is what counts
max_iters = 2000  # ~6.5 min; frames with more detail than a 2-D scene may want more: --init_from=resume --max_iters=N
