#!/usr/bin/env bash
# Install the Debian packages whose tool is missing: one `apt-get update` and one `apt-get
# install` for all of them. Arguments are tool=package pairs; a tool is a command on PATH, or a
# path pattern that exists once the package is installed (PostgreSQL's server is not on PATH).
# SUDO: the command to run apt-get with (empty as root).
set -euo pipefail
missing=()
for pair in "$@"; do
  tool=${pair%%=*}
  package=${pair#*=}
  if [[ $tool == */* ]]; then
    compgen -G "$tool" >/dev/null && continue
  else
    command -v "$tool" >/dev/null 2>&1 && continue
  fi
  echo "$tool not found: installing Debian's $package"
  missing+=("$package")
done
((${#missing[@]})) || exit 0
${SUDO:-} apt-get update -qq
${SUDO:-} apt-get install -y -qq --no-install-recommends "${missing[@]}"
