"""
Drive the world model live from a browser, and record what you do as a dataset:

    python play.py --ckpt=out/dyn/ckpt.pt --port=8765 --record_dir=out/play

A page at http://127.0.0.1:8765/ shows the model's current frame. Where the data's meta.json declares
the action a point in the image (image_point_dims, as pusht.py's collector writes it), the mouse
pointer is the action; otherwise actions are typed in. Reset starts again from a random held-out
real frame; Record writes every frame seen and action sent as a new dataset folder under record_dir
(one per recording; a reset starts a new episode), in the format data.py reads, so it can be mixed
into a training set (convert.py --format=concat --src=DATA,RECORDING --out_dir=MIXED). The server binds
to 127.0.0.1 unless --host says otherwise; each request runs one model step under a lock (the
noisy-context sliding-window sampler, constant cost per frame). Its options are rollout.py's (the
checkpoint and sampler knobs: ckpt, ae_ckpt, data_dir, window, ctx_level, decode_steps, seed, device)
and the four below.

The HTTP interface the page uses (JSON in and out; tested directly, so a script may drive it too):
    GET  /         the page, with the action space filled in
    GET  /info     {image_size, action_dim, action_low, action_high, fps, mouse, steps, last_action, recording}
    POST /step     {"action": [a_1, ..., a_A]} (finite numbers inside action_low..action_high): one model
                   step; replies {frame: base64 PNG, step, recording, recorded, saved, action}
    POST /reset    {}: a new start from a random held-out real frame (ends a recorded episode); same reply
    POST /record   {"on": true|false} (no "on": toggle): start, or stop and save, a recording; same reply,
                   "saved" naming the dataset folder written
A malformed request gets a 4xx with {"error": ...} (413 for a body over MAX_BODY bytes, 405 for a wrong
method, 404 for an unknown path) and the server keeps serving; a failure while serving (e.g. an
unwritable record_dir) is a 500 with the error, and the recording is kept so a stop can be retried.
A recording stops and is saved by itself after max_record_steps frames.
"""
import base64
import io
import json
import math
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import numpy as np
import torch

import data as D
import rollout
from common import config_from_globals, pick_device

# ---------------------------------------------------------------------------- defaults: rollout.py's and these
host = '127.0.0.1'
port = 8765  # 0 = any free port
record_dir = 'out/play'  # one new dataset folder per recording in here
max_record_steps = 6000  # a recording stops (and is saved) after this many steps (10 min at 10 Hz)
# ------------------------------------------------------------------------------------
# The page: a canvas showing the model's frame at 512 x 512 (nearest-neighbour upscaling), a reset and a
# record button, the live FPS. Its loop posts the current action to /step and draws the reply, again and
# again, so frames keep coming whatever the user does; the next request leaves only once a reply is in,
# so a slow model slows the page down instead of queueing requests at the server. The action: with
# info.mouse, the pointer's position over the canvas mapped linearly onto action_low..action_high
# (x -> dim 0, y -> dim 1, y down as in the frame); otherwise the arrow keys move dims 0 and 1 by 5 % of
# their range (any others stay at the middle). The target that produced a frame is drawn on it as a red
# cross. window.sim (frames drawn, the last reply, the last error) is there for the browser test to read.
PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>world model: play</title>
<style>
 body { font-family: sans-serif; margin: 16px; }
 canvas { border: 1px solid #888; cursor: crosshair; width: 512px; height: 512px; }
 button { margin: 8px 8px 0 0; font-size: 15px; }
 #rec.on { background: #d33; color: white; }
</style></head><body>
<canvas id="view" width="512" height="512"></canvas>
<div><button id="reset">reset (held-out frame)</button><button id="rec">record</button>
<span id="fps">fps: -</span> &middot; <span id="status">starting</span></div>
<p id="help"></p>
<script>
const info = __INFO__;  // filled in by the server: the action space and frame size
const cv = document.getElementById('view'), ctx = cv.getContext('2d');
const lo = info.action_low, hi = info.action_high, A = info.action_dim;
const clamp = (v, a, b) => Math.min(Math.max(v, a), b);
let action = lo.map((l, i) => (l + hi[i]) / 2);  // start in the middle of the action space
let recording = false;
window.sim = {frames: 0, last: null, error: null};  // read by the browser test
document.getElementById('help').textContent = info.mouse
  ? 'Move the mouse over the frame: the pointer is the target of the agent (action space ' + lo + ' .. ' + hi + ').'
  : 'Arrow keys move the target in the first two action dimensions (' + A + '-d actions, the others held at the middle).';
// the pointer over the frame is the target: pixel -> action space (Push-T: [0, 512]^2, y down like the frame)
cv.addEventListener('mousemove', e => {
  if (!info.mouse) return;
  const r = cv.getBoundingClientRect();
  action[0] = lo[0] + clamp((e.clientX - r.left) / r.width, 0, 1) * (hi[0] - lo[0]);
  action[1] = lo[1] + clamp((e.clientY - r.top) / r.height, 0, 1) * (hi[1] - lo[1]);
});
document.addEventListener('keydown', e => {
  const k = {ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [1, -1], ArrowDown: [1, 1]}[e.key];
  if (!k || k[0] >= A) return;
  e.preventDefault();
  const i = k[0];
  action[i] = clamp(action[i] + k[1] * 0.05 * (hi[i] - lo[i]), lo[i], hi[i]);
});
async function post(path, body) {
  const r = await fetch(path, {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)});
  const j = await r.json();
  if (!r.ok) throw new Error(j.error || r.status);
  return j;
}
function show(j) {
  const img = new Image();
  img.onload = () => {
    ctx.imageSmoothingEnabled = false;  // nearest-neighbour upscaling
    ctx.drawImage(img, 0, 0, cv.width, cv.height);
    if (A >= 2 && j.action) {  // the target that produced this frame, as a red cross
      const x = (j.action[0] - lo[0]) / (hi[0] - lo[0]) * cv.width, y = (j.action[1] - lo[1]) / (hi[1] - lo[1]) * cv.height;
      ctx.strokeStyle = 'red'; ctx.lineWidth = 2; ctx.beginPath();
      ctx.moveTo(x - 8, y); ctx.lineTo(x + 8, y); ctx.moveTo(x, y - 8); ctx.lineTo(x, y + 8); ctx.stroke();
    }
  };
  img.src = 'data:image/png;base64,' + j.frame;
  recording = j.recording;
  document.getElementById('rec').className = recording ? 'on' : '';
  document.getElementById('rec').textContent = recording ? 'stop recording (' + j.recorded + ' frames)' : 'record';
  document.getElementById('status').textContent = 'step ' + j.step + (j.saved ? ' - saved ' + j.saved : '');
  window.sim.last = j;
}
document.getElementById('reset').onclick = async () => show(await post('/reset', {}));
document.getElementById('rec').onclick = async () => show(await post('/record', {on: !recording}));
// the loop: send the current action, draw the next frame, again; frames keep coming whatever the pointer does
async function loop() {
  let n = 0, t0 = performance.now();
  for (;;) {
    try {
      show(await post('/step', {action: action.slice()}));
      window.sim.frames++; n++;
    } catch (e) {
      window.sim.error = String(e);
      document.getElementById('status').textContent = 'error: ' + e;
      await new Promise(r => setTimeout(r, 500));
    }
    const t = performance.now();
    if (t - t0 > 1000) { document.getElementById('fps').textContent = (n * 1000 / (t - t0)).toFixed(1) + ' fps'; n = 0; t0 = t; }
  }
}
loop();
</script></body></html>
"""
# Requests are small: an action is a few numbers. A larger body is refused before it is read (413), so a
# client cannot make the server read or parse megabytes.
MAX_BODY = 4096  # bytes


class HTTPError(Exception):
    """A request the server refuses: the HTTP status code to answer with, and the message."""

    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code


class Play:
    """One live session of the world model: the current frame, resets from held-out real frames, and
    recording (frames seen + actions sent) into the dataset format. All calls hold one lock, so requests
    from several connections (or tabs) take turns and the model runs one step at a time.

    A recording is a list of finished episodes plus the one in progress: its frames start with the frame
    shown when recording (or the episode, after a reset) began, and every step adds the action sent and
    the frame it produced, so an episode holds one frame more than actions. Closing it repeats the last
    action once (the dataset format has an action for every frame; the last one has no next frame). An
    episode without a single step is dropped."""

    def __init__(self, cfg, sim, ck, ds):
        self.cfg, self.sim, self.ck, self.ds = cfg, sim, ck, ds
        meta = ck['data']['meta']
        self.low = np.asarray(meta['action_low'], np.float64)
        self.high = np.asarray(meta['action_high'], np.float64)
        self.lock = threading.Lock()
        self.rng = np.random.default_rng(cfg['seed'])
        # while recording: {'episodes': [(frames, actions), ...] finished, 'frames': [...], 'actions': [...]}
        self.rec = None
        self.steps, self.last_action, self.saved = 0, None, None
        self.reset()

    def info(self):
        """What the page needs to know (GET /info). mouse: the pointer is the action only where meta.json
        says the 2-d action is a point in the image, (x, y) = image_point_dims [0, 1]."""
        meta = self.ck['data']['meta']
        return {'image_size': self.sim.S, 'action_dim': self.sim.A, 'action_low': self.low.tolist(),
                'action_high': self.high.tolist(), 'fps': meta.get('fps', 10),
                'mouse': self.sim.A == 2 and meta.get('image_point_dims') == [0, 1],
                'steps': self.steps, 'last_action': self.last_action, 'recording': self.rec is not None}

    def reset(self):
        """Start again from a random held-out real frame; a running recording closes its episode here."""
        with self.lock:
            self.frame = self.sim.reset(rollout.held_out_starts(self.ds, self.ck, 1, self.rng, self.cfg['data_dir'] or self.ck['data']['data_dir']))[0]
            self.steps = 0
            if self.rec is not None:  # a reset ends the recorded episode; the next one starts here
                self._close_episode()
                self.rec['frames'] = [self.frame]
            return self._reply()

    def step(self, action):
        """One model step with a checked action (parse_action); recorded when recording, saved at max_record_steps."""
        a = np.asarray(action, np.float64)
        with self.lock:
            self.frame = self.sim.step(a[None].astype(np.float32))[0]
            self.steps += 1
            self.last_action = a.tolist()
            # recorded as the dataset stores it (float32 actions), with the frame the action produced
            if self.rec is not None:
                self.rec['actions'].append(a.astype(np.float32))
                self.rec['frames'].append(self.frame)
                if sum(len(f) for f, _ in self.rec['episodes']) + len(self.rec['frames']) >= self.cfg['max_record_steps']:
                    self._stop()
            return self._reply()

    def record(self, on):
        """Start recording (from the current frame), or stop and save; asking for the current state is a no-op."""
        with self.lock:
            if on and self.rec is None:
                self.rec, self.saved = {'episodes': [], 'frames': [self.frame], 'actions': []}, None
            elif not on and self.rec is not None:
                self._stop()
            return self._reply()

    def _close_episode(self):
        """Move the frames and actions of the current episode to the finished ones."""
        f, a = self.rec['frames'], self.rec['actions']
        # an episode needs a step; the last frame's action (no next frame) repeats the last one sent
        if len(a) >= 1:
            self.rec['episodes'].append((np.stack(f), np.stack(a + [a[-1]])))
        self.rec['frames'], self.rec['actions'] = [], []

    def _stop(self):
        """End the recording: write its episodes as a new dataset folder under record_dir (play-DATE-TIME[-n])."""
        self._close_episode()
        eps = self.rec['episodes']
        if eps:
            path = os.path.join(self.cfg['record_dir'], time.strftime('play-%Y%m%d-%H%M%S'))
            # never write over an earlier recording: a second one within the same second gets -2, then -3, ...
            n = 1
            while os.path.exists(path if n == 1 else f"{path}-{n}"):
                n += 1
            path = path if n == 1 else f"{path}-{n}"
            src = self.ck['data']['meta']
            # the action space and its meaning carry over (image_point_dims: the dynamics may draw the action
            # as a map); the source names the model's own data, so a recording of Push-T stays Push-T (pusht.is_pusht)
            meta = {key: src[key] for key in ('fps', 'action_low', 'action_high', 'image_point_dims') if key in src}
            meta['source'] = (f"world model {os.path.abspath(self.cfg['ckpt'])}, driven live (play.py), "
                              f"trained on: {src.get('source')}")
            try:
                os.makedirs(self.cfg['record_dir'], exist_ok=True)
                D.write_dataset(path, [f for f, _ in eps], [a for _, a in eps], meta)
            except Exception:
                self.rec['frames'] = [self.frame]  # keep recording: nothing is lost, stop can be retried
                raise
            print(f"recorded {len(eps)} episode(s), {sum(len(f) for f, _ in eps)} frames: {path}", flush=True)
        self.rec, self.saved = None, (path if eps else None)

    def _reply(self):
        """The JSON reply to /step, /reset and /record: the current frame as a base64 PNG (lossless, so what
        the page shows is what is recorded), the step count since the last reset, whether recording and how
        many frames so far, the folder the last recording was saved to, and the action that produced the
        frame (None right after a reset)."""
        from PIL import Image
        buf = io.BytesIO()
        Image.fromarray(self.frame).save(buf, format='PNG')
        n = 0 if self.rec is None else sum(len(f) for f, _ in self.rec['episodes']) + len(self.rec['frames'])
        return {'frame': base64.b64encode(buf.getvalue()).decode(), 'step': self.steps, 'recording': self.rec is not None,
                'recorded': n, 'saved': self.saved, 'action': self.last_action if self.steps else None}

    def parse_action(self, body):
        """The action of a /step body: a list of action_dim finite numbers (no bools) inside the action space,
        else HTTPError 400."""
        a = body.get('action') if isinstance(body, dict) else None
        if not isinstance(a, list) or len(a) != self.sim.A:
            raise HTTPError(400, f"'action' must be a list of {self.sim.A} numbers")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in a):
            raise HTTPError(400, "action values must be finite numbers")
        if np.any(np.asarray(a) < self.low) or np.any(np.asarray(a) > self.high):
            raise HTTPError(400, f"action {a} is outside the action space {self.low.tolist()} .. {self.high.tolist()}")
        return a


def _no_constant(c):
    # json.loads' parse_constant: NaN and Infinity are not JSON numbers, refuse them
    raise ValueError(f"{c} is not a JSON number")


class PlayHandler(BaseHTTPRequestHandler):
    """The HTTP interface (the top of the file) over the server's Play session."""
    # browsers keep connections open between requests: a connection idle for this long is closed, so it
    # never holds its thread for long
    timeout = 30

    def log_message(self, fmt, *args):
        """Quiet: the default logs a line per request, one per frame, which would flood the terminal."""

    def _send(self, code, obj, ctype='application/json'):
        """Answer with status code and obj (bytes as they are, else JSON); never cached."""
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(code)
        self.send_header('Content-Type', ctype)
        self.send_header('Content-Length', str(len(body)))
        self.send_header('Cache-Control', 'no-store')
        self.end_headers()
        self.wfile.write(body)

    def _body(self):
        """The request's JSON object body ({} when empty); HTTPError 400 / 413 for anything else."""
        try:
            n = int(self.headers.get('Content-Length') or 0)
        except ValueError:
            raise HTTPError(400, "bad Content-Length")
        if n < 0:
            raise HTTPError(400, "bad Content-Length")
        if n > MAX_BODY:
            self.close_connection = True  # the unread body must not be parsed as the next request
            raise HTTPError(413, f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(n) if n else b'{}'
        try:  # NaN / Infinity literals are not JSON numbers
            body = json.loads(raw.decode('utf-8'), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError):
            raise HTTPError(400, "body is not valid JSON")
        if not isinstance(body, dict):
            raise HTTPError(400, "body must be a JSON object")
        return body

    def _handle(self, fn):
        """Run a request handler, turning every error into an answer so the server keeps serving; a client
        that went away gets none."""
        try:
            try:
                fn()
            except HTTPError as e:
                self._send(e.code, {'error': str(e)})
            except ConnectionError:
                raise
            except Exception as e:  # keep serving whatever happened (e.g. the record folder is not writable)
                self._send(500, {'error': f"{type(e).__name__}: {e}"})
        except ConnectionError:  # the page went away mid-request (a closed tab): nothing to answer
            self.close_connection = True

    def do_GET(self):
        """/ and /info; the POST paths answer 405, anything else 404."""
        play, path = self.server.play, urlsplit(self.path).path

        # the answer is sent from inside _handle, which turns an HTTPError (or any failure) into an error reply
        def get():
            if path == '/':
                self._send(200, PAGE.replace('__INFO__', json.dumps(play.info())).encode(), 'text/html; charset=utf-8')
            elif path == '/info':
                self._send(200, play.info())
            elif path in ('/step', '/reset', '/record'):
                raise HTTPError(405, f"{path} takes POST")
            else:
                raise HTTPError(404, f"no such path {path!r}")
        self._handle(get)

    def do_POST(self):
        """/step, /reset and /record; anything else 404 (the body unread: the connection is closed)."""
        play, path = self.server.play, urlsplit(self.path).path

        # as in do_GET: _handle answers whatever goes wrong; the body is read only for a known path
        def post():
            if path not in ('/step', '/reset', '/record'):
                self.close_connection = True
                raise HTTPError(404, f"no such path {path!r}")
            body = self._body()
            if path == '/step':
                self._send(200, play.step(play.parse_action(body)))
            elif path == '/reset':
                self._send(200, play.reset())
            else:
                on = body.get('on', play.rec is None)  # no 'on': toggle
                if not isinstance(on, bool):
                    raise HTTPError(400, "'on' must be true or false")
                self._send(200, play.record(on))
        self._handle(post)

    def _not_allowed(self):
        """PUT, DELETE and PATCH: 405."""
        self._send(405, {'error': f"method {self.command} not allowed"})

    do_PUT = do_DELETE = do_PATCH = _not_allowed


def make_play_server(cfg, sim, ck, ds):
    """A threading HTTP server on cfg host:port (port 0 = any free one; server_address says which) with
    its Play session as .play. One thread per connection, so a stalled browser never blocks another;
    the model still runs one call at a time, under Play's lock. The caller runs serve_forever."""
    srv = ThreadingHTTPServer((cfg['host'], cfg['port']), PlayHandler)
    srv.daemon_threads = True
    srv.play = Play(cfg, sim, ck, ds)
    return srv


def _interrupt(signum, frame):
    """SIGTERM handler: raise what Ctrl-C raises, so serve_forever ends the same way."""
    raise KeyboardInterrupt


def main(cfg):
    """Load the world model and its dataset (for the held-out start frames), serve the play page until
    Ctrl-C or SIGTERM; a running recording is saved then."""
    torch.manual_seed(cfg['seed'])
    dev = pick_device(cfg['device'])
    dyn, enc, dec, ck = rollout.load_world_model(cfg['ckpt'], dev, cfg['ae_ckpt'])
    ds, _ = rollout.load_data(ck, cfg['data_dir'])
    sim = rollout.Simulator(dyn, enc, dec, ck, cfg['window'], cfg['ctx_level'], cfg['decode_steps'], cfg['seed'])
    srv = make_play_server(cfg, sim, ck, ds)
    print(f"serving the world model at http://{cfg['host']}:{srv.server_address[1]}/ (Ctrl-C to stop); "
          f"recordings go to {cfg['record_dir']}/play-*", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` (SIGTERM) stops it like Ctrl-C: the recording is saved
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if srv.play.rec is not None:  # do not lose a recording to Ctrl-C or a kill
            srv.play.record(False)
        srv.server_close()


if __name__ == '__main__':
    main(config_from_globals({**vars(rollout), **globals()}))
