#!/usr/bin/env bash
# A Debian bookworm + Python 3.11 base image made from Debian's own packages, for hosts that
# reach a Debian mirror but no container registry (CI here). The images of this folder build
# on it through their BASE_IMAGE argument (see smoke.sh); a host that can pull the pinned
# flwr/* images needs none of this. Needs root and debootstrap; reuses an existing image.
#   docker/python-base.sh [IMAGE]          (default: localhost/dept-python-base:bookworm)
set -euo pipefail

IMAGE=${1:-localhost/dept-python-base:bookworm}
ENGINE=${ENGINE:-$(command -v podman || command -v docker)}

if "$ENGINE" image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "python-base: $IMAGE is already there"
    exit 0
fi

# The mirror apt already uses (deb822 sources first, then the one-line format).
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "$mirror"

# Locally added CA certificates (a proxy's, say): without them pip inside cannot reach
# the package registry. The host's apt sources too, so builds can apt-get install.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates
fi
cp /etc/apt/sources.list.d/*.sources "$rootfs/etc/apt/sources.list.d/" 2>/dev/null || true
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/*

tar -C "$rootfs" -c . | "$ENGINE" import \
    --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$IMAGE"
echo "python-base: made $IMAGE"
