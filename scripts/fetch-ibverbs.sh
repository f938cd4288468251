#!/usr/bin/env bash
# Fetches the RDMA verbs library that Mooncake Store's client and master load even over TCP
# (libibverbs.so.1 and the netlink libraries it links), without root: the Debian packages are
# downloaded with apt-get download and unpacked with dpkg -x into DIR. Prints the
# LD_LIBRARY_PATH to use (docs/remote-tier.md).
#
#   scripts/fetch-ibverbs.sh DIR
#   export LD_LIBRARY_PATH="$(scripts/fetch-ibverbs.sh DIR | tail -n 1 | cut -d= -f2-)"
set -euo pipefail
if [[ $# -ne 1 ]]; then
    echo "usage: $0 DIR   (DIR: where to unpack libibverbs1, libnl-3-200 and libnl-route-3-200)" >&2
    exit 2
fi
for tool in apt-get dpkg dpkg-architecture; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "$0: '$tool' not found: this script needs a Debian or Ubuntu system (apt and dpkg)" >&2
        exit 1
    fi
done
dest="$(mkdir -p "$1" && cd "$1" && pwd)"
debs="$dest/debs"
mkdir -p "$debs"
(cd "$debs" && apt-get download libibverbs1 libnl-3-200 libnl-route-3-200 >&2)
for deb in "$debs"/*.deb; do
    dpkg -x "$deb" "$dest/root"
done
multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH)"
# libnl-3 unpacks under lib/, libibverbs and libnl-route-3 under usr/lib/ (Debian's layout).
path=""
for dir in "$dest/root/usr/lib/$multiarch" "$dest/root/lib/$multiarch"; do
    [[ -d "$dir" ]] && path="${path:+$path:}$dir"
done
for lib in libibverbs.so.1 libnl-3.so.200 libnl-route-3.so.200; do
    if ! compgen -G "$dest/root/*lib/$multiarch/$lib" >/dev/null && ! compgen -G "$dest/root/usr/lib/$multiarch/$lib" >/dev/null; then
        echo "$0: $lib not found under $dest/root after unpacking" >&2
        exit 1
    fi
done
echo "LD_LIBRARY_PATH=$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
