# Stage-2 CPU recipe for your own data: latents 4x16x16 of 64x64 frames, ~15 min on 2 CPU cores (the Push-T
# CPU recipe's sizes, measured at ~276 ms/iter; the cost depends on the latent size, not on the scene).
# No Push-T assumption: the action enters through its embedding only, whatever its size (2-d, 14-d...).
# A recipe only reassigns defaults of train_dynamics.py; an unknown key is an error.
window = 6  # 5 context frames + 1 new: 0.5 s of history at 10 fps, and 6/10 of the default window's cost
dyn_ch = 64  # dynamics width: 0.5M params, what 2 cores train in ~15 min
dyn_depth = 1  # one block per level: the default's 2 doubles the blocks' cost
dyn_emb = 128  # action + noise-level embedding; wide enough for a 14-d joint action (ALOHA) through its MLP
dyn_heads = 2  # attention heads of 32 channels each at dyn_ch 64
dyn_spatial_attn = 'mid'  # spatial attention (256 tokens) only in the middle block: 'all' puts it in every block
dyn_action_map = False  # the action as a spot in the image is only for data whose meta.json declares
                        # image_point_dims (convert.py --image_point_dims); train_dynamics refuses it otherwise
all_frames = True  # every frame of a window is a target: 5 predictions per window in one pass
batch_size = 5  # windows per step: 25 targets, ~276 ms per step on 2 cores
lr = 2e-3  # 2x the default: the rate the Push-T CPU recipe trains this net and batch with
min_lr = 2e-4  # cosine decay to lr / 10
max_iters = 3200  # ~15 min; resume with --init_from=resume --max_iters=N to go further
