#!/usr/bin/env bash
# CI helper: Debian's headless Chromium and its chromedriver, for the play page's browser test
# (test_pusht.py::test_sim_play_in_browser; it skips when they are missing). Run as root.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver
