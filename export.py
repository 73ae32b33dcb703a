"""
Export a trained world model for inference only: the dynamics weights and the autoencoder it was trained on,
without optimizer state, RNG streams or the cached latents, as two small files side by side:

    python export.py --ckpt=out/long/dyn/ckpt.pt --out_dir=weights --name=pusht64

writes weights/pusht64_ae.pt (encoder + decoder) and weights/pusht64_dyn.pt (dynamics), which every tool
loads like a training checkpoint (rollout.load_world_model finds the autoencoder beside the dynamics file),
and weights/pusht64.json: where they came from (iteration, config, data, git commit).
"""
import json
import os
import subprocess

from common import config_from_globals, fingerprint, load_checkpoint, save_checkpoint

# ---------------------------------------------------------------------------- defaults
ckpt = 'out/dyn/ckpt.pt'  # a dynamics checkpoint written by train_dynamics.py
ae_only = ''  # a stage-1 checkpoint to strip alone (no dynamics): written to out_dir/name_ae.pt
out_dir = 'weights'
name = 'pusht64'
# ------------------------------------------------------------------------------------


def export_ae(ae_path, dst):
    """A stage-1 checkpoint without its optimizer and RNG streams (encoder + decoder, config, data facts)."""
    ae = load_checkpoint(ae_path, expect_kind='ae')
    keep = ('kind', 'config', 'data', 'iter', 'encoder_fingerprint', 'val_psnr', 'encoder', 'decoder')
    save_checkpoint({k: ae[k] for k in keep if k in ae}, dst)
    return ae


def export(dyn_path, out, stem):
    """-> (ae file, dyn file, provenance dict). Refuses a dynamics checkpoint whose autoencoder has another encoder."""
    dyn = load_checkpoint(dyn_path, expect_kind='dynamics')
    ae_file, dyn_file = os.path.join(out, f'{stem}_ae.pt'), os.path.join(out, f'{stem}_dyn.pt')
    ae = export_ae(dyn['ae_ckpt'], ae_file)
    if fingerprint(ae['encoder']) != dyn['encoder_fingerprint']:
        os.remove(ae_file)
        raise SystemExit(f"{dyn['ae_ckpt']!r} holds another encoder than the one {dyn_path!r} was trained on")
    keep = ('kind', 'config', 'data', 'iter', 'encoder_fingerprint', 'latent_shape', 'action_dim', 'action_map', 'val_latent_mse')
    save_checkpoint({**{k: dyn[k] for k in keep}, 'model': dyn['model'], 'ae_ckpt': os.path.basename(ae_file)}, dyn_file)
    try:
        commit = subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = ''
    info = {'dynamics': {'iter': dyn['iter'], 'config': dyn['config'], 'val_latent_mse': dyn.get('val_latent_mse'),
                         'data_dir': dyn['data']['data_dir'], 'data_fingerprint': dyn['data'].get('fingerprint'),
                         'episodes': len(dyn['data']['train_ids']) + len(dyn['data']['val_ids'])},
            'autoencoder': {'iter': ae.get('iter'), 'config': ae['config'], 'val_psnr': ae.get('val_psnr')},
            'exported_from': os.path.abspath(dyn_path), 'exported_at_commit': commit}
    with open(os.path.join(out, f'{stem}.json'), 'w') as f:
        json.dump(info, f, indent=1)
    return ae_file, dyn_file, info


if __name__ == '__main__':
    cfg = config_from_globals(globals())
    os.makedirs(cfg['out_dir'], exist_ok=True)
    if cfg['ae_only']:
        export_ae(cfg['ae_only'], os.path.join(cfg['out_dir'], f"{cfg['name']}_ae.pt"))
        print(f"wrote {cfg['out_dir']}/{cfg['name']}_ae.pt")  # (exit status 0: scripts chain on it)
    else:
        a, d, info = export(cfg['ckpt'], cfg['out_dir'], cfg['name'])
        sizes = ', '.join(f"{p} {os.path.getsize(p) / 2**20:.1f} MiB" for p in (a, d))
        print(f"wrote {sizes} (dynamics iteration {info['dynamics']['iter']})")
