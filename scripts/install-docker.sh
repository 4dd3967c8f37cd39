#!/usr/bin/env bash
# Makes a Docker engine and a base image ready for `make test-image`, and prints the base image's
# name as its last line of standard output (everything else goes to standard error).
#
# - Installs docker.io (and debootstrap) from the system's packages when `docker`/`dockerd` are
#   missing, and starts dockerd when no engine answers: the vfs storage driver and no bridge or
#   iptables, which work inside a container or VM without kernel extras. Its log and pid go to
#   ${XDG_CACHE_HOME:-~/.cache}/context-guard/dockerd.{log,pid}.
# - The Dockerfile's base is python:3.11-slim. When Docker Hub cannot be reached (no network but the
#   package indexes), a stand-in is built once: Debian bookworm (Python 3.11, pip) by debootstrap from
#   the Debian mirror, tagged context-guard-base:bookworm-r2, its root file system cached as a tarball.
#   The stand-in trusts this machine's CA bundle, so pip inside `docker build` reaches the package
#   index through the same TLS-inspecting proxy the host uses, if any.
set -euo pipefail

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/context-guard"
OFFICIAL=python:3.11-slim
# The tag and the tarball carry a revision: a stand-in made by an earlier, faulty revision of this
# script (its root directory 0700, so the image's unprivileged user could not reach /bin) is not reused.
STAND_IN=context-guard-base:bookworm-r2
mkdir -p "$CACHE"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
say() { echo "install-docker: $*" >&2; }

missing=()
command -v docker >/dev/null 2>&1 || missing+=(docker.io)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u) >&2
fi

if ! docker info >/dev/null 2>&1; then
  say "starting dockerd (vfs storage, no bridge; log: $CACHE/dockerd.log)"
  $SUDO bash -c "nohup dockerd --storage-driver=vfs --iptables=false --bridge=none \
    --pidfile '$CACHE/dockerd.pid' >'$CACHE/dockerd.log' 2>&1 &"
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { say "dockerd did not answer within 60 s:"; tail -n 20 "$CACHE/dockerd.log" >&2; exit 1; }
fi

if docker image inspect "$OFFICIAL" >/dev/null 2>&1 || timeout 60 docker pull -q "$OFFICIAL" >/dev/null 2>&1; then
  echo "$OFFICIAL"
  exit 0
fi

if ! docker image inspect "$STAND_IN" >/dev/null 2>&1; then
  tarball="$CACHE/base-bookworm-r2.tar"
  if [ ! -s "$tarball" ]; then
    say "$OFFICIAL cannot be pulled; building the stand-in $STAND_IN with debootstrap (a few minutes, once)"
    rootfs="$(mktemp -d)"
    trap '$SUDO rm -rf "$rootfs"' EXIT
    chmod 755 "$rootfs"  # it becomes the image's `/`: mktemp makes it 0700, which only root could enter
    $SUDO debootstrap --variant=minbase --include=python3,python3-pip,python-is-python3,ca-certificates \
      bookworm "$rootfs" http://deb.debian.org/debian >&2
    $SUDO cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
    $SUDO rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    $SUDO tar -C "$rootfs" -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
  fi
  # Debian marks its Python as system-managed; the image installs into it as the official one does.
  docker import \
    --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' \
    "$tarball" "$STAND_IN" >/dev/null
fi
say "using the stand-in $STAND_IN ($OFFICIAL cannot be pulled here)"
echo "$STAND_IN"
