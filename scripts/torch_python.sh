#!/usr/bin/env bash
# Prints the path of a python that can import torch: $AGOQ_PYTHON, then /usr/bin/python3 (Debian's
# python3-torch), then the python3 on PATH (e.g. one with a PyPI wheel). Fails with a message
# saying what to install when none can.
set -euo pipefail
for py in "${AGOQ_PYTHON:-}" /usr/bin/python3 "$(command -v python3 || true)"; do
  [ -n "$py" ] && [ -x "$py" ] || continue
  if "$py" -c "import torch" >/dev/null 2>&1; then
    echo "$py"
    exit 0
  fi
done
echo "agoq: no python that can import torch was found (tried \$AGOQ_PYTHON, /usr/bin/python3," \
  "python3); install Debian's python3-torch (scripts/install_deps.sh does) or a PyPI wheel" \
  "(pip install torch), or point AGOQ_PYTHON at a python that has it" >&2
exit 1
