# shellcheck shell=bash
# Sourced by the Python test runners: ensure_venv VENV REQUIREMENTS makes a
# virtual environment with Debian's /usr/bin/python3 and installs the pinned
# wheels of REQUIREMENTS into it, once: it is cached, remade only when
# REQUIREMENTS changes, and made under a lock so parallel runs do not race.

ensure_venv() {
  local venv=$1 requirements=$2
  mkdir -p "$(dirname "$venv")"
  (
    flock 9
    local stamp=$venv/.requirements
    if [[ ! -x "$venv/bin/python" ]] || ! cmp -s "$requirements" "$stamp"; then
      echo "ensure_venv: making $venv"
      rm -rf "$venv"
      /usr/bin/python3 -m venv "$venv"
      PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install \
        --quiet --only-binary=:all: -r "$requirements"
      cp "$requirements" "$stamp"
    fi
  ) 9>"$venv.lock"
}
