# Stage-2 recipe of the long Push-T run behind weights/ (config/pusht_long_run.sh runs it), given after
# config/dyn_pusht_cpu.py: the CPU recipe's network and batch on 1000 episodes, at a constant learning rate so that
# the run can stop anywhere and go on in a later session (--init_from=resume is exact); each reading of it is a
# short cool-down branch from a trunk checkpoint (common.lr_at), not the trunk's own noisier weights.
max_iters = 1000000  # the trunk runs until stopped or until --max_iters=N
cooldown_iters = 0  # constant lr after warm-up (a branch sets max_iters = its start + N and cooldown_iters = N)
eval_interval = 1600  # open-loop validation and a sample strip
ckpt_interval = 200  # resumable state every ~1-3 minutes on 2 cores
