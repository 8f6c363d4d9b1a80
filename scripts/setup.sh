#!/usr/bin/env bash
# Installs what gpudeploy and its lab need on a Debian machine (run as root): Debian packages and
# a virtualenv in .venv with the package and its dev tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need=(python3 python3-venv mmdebstrap systemd-container zstd iproute2 openssh-client)
missing=()
for pkg in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,k8s]'
# The lab (src/gpudeploy_lab) is not part of the gpudeploy package; the dev venv sees it through
# a .pth file, as the lab hosts see the stand-in.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD/src" > "$site/gpudeploy-lab.pth"
# pip writes an installed package's bytecode; an editable install's is written on first import, unless
# PYTHONDONTWRITEBYTECODE is set (as on our development machines): then every command, each test's too, would
# compile gpudeploy's modules from source again (~0.1 s of CPU a command). A module changed later is
# compiled from source again until this runs again (its .pyc no longer matches).
.venv/bin/python -m compileall -q src
echo "setup: done ($(.venv/bin/python --version), $(.venv/bin/invoke --version | head -1))"
