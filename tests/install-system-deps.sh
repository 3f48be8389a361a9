#!/usr/bin/env bash
# System packages the test suite needs beyond Python: Debian's Chromium (the
# browser tests drive it headless; nothing is downloaded from elsewhere) and
# Node.js >= 20 (the browser client's unit tests). Installs only what is missing.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' >/dev/null 2>&1; then
  missing+=(nodejs)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "installing ${missing[*]} with apt-get" >&2
$sudo apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}" >/dev/null
