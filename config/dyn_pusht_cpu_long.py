# Stage-2 long CPU recipe, given after config/dyn_pusht_cpu.py (later arguments win):
#   python train_dynamics.py config/dyn_pusht_cpu.py config/dyn_pusht_cpu_long.py --data_dir=... --ae_ckpt=... --out_dir=...
# The same model and batch trained 6x longer (~90 minutes of stage 2 on 2 CPU cores). Why: more stage-2
# iterations is the one lever that moved every T-block metric the right way (EXPERIMENTS.md).
max_iters = 19200  # the short recipe's 3200 x 6
eval_interval = 1600  # validation and sample strips less often: 12 in the run
