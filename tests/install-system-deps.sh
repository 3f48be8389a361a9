#!/usr/bin/env bash
# System packages the test suite needs beyond Python: Debian's Chromium (the
# browser tests drive it headless; nothing is downloaded from elsewhere) and
# Node.js >= 20 (the browser client's unit tests), and, where the package can be had,
# promtool (Debian's prometheus package) for the alert rules' tests. Installs only what
# is missing.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' >/dev/null 2>&1; then
  missing+=(nodejs)
fi
command -v promtool >/dev/null 2>&1 || want_promtool=1
if [ ${#missing[@]} -eq 0 ] && [ -z "${want_promtool:-}" ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
$sudo apt-get update -q >/dev/null || [ ${#missing[@]} -eq 0 ]  # only promtool wanted: not fatal
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} with apt-get" >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}" >/dev/null
fi
if [ -n "${want_promtool:-}" ]; then
  # Best effort: without it only the promtool test is skipped.
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
    || echo "promtool could not be installed; tests/test_deploy.py skips its promtool test" >&2
fi
