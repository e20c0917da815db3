#!/usr/bin/env bash
# Builds meshrun's runtime image with buildah from scratch: no container registry, no base
# image. The image holds a `cmake --install` prefix under /usr/local and, for every ELF file
# in it (and the PJRT plugin, when given), the shared libraries it links, copied from this
# Debian 12 machine's own packages (the ones scripts/setup.sh installs; the Containerfile's
# runtime stage installs the same packages from Debian instead). One image serves the
# coordinator and the workers.
#
# Usage: build_image.sh <install prefix> <image name> [PJRT plugin .so] [-- buildah global flags]
#   e.g. cmake --install build --prefix /tmp/p && deploy/container/build_image.sh /tmp/p meshrun:dev
# The plugin lands at /usr/local/lib/meshrun/<its file name>; give it to the worker with
# --pjrt_plugin (libtpu.so on TPU hosts: mount or copy it there instead).
set -euo pipefail
prefix=$(cd "$1" && pwd)
image=$2
shift 2
plugin=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then plugin=$1; shift; fi
[ "${1:-}" = "--" ] && shift
global=("$@")
[ -x "$prefix/bin/meshrun-coordinator" ] || { echo "no meshrun-coordinator in $prefix/bin" >&2; exit 2; }
[ -z "$plugin" ] || [ -f "$plugin" ] || { echo "no PJRT plugin at $plugin" >&2; exit 2; }

ctr=$(buildah "${global[@]}" from scratch)
trap 'buildah "${global[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
root=$(buildah "${global[@]}" mount "$ctr")

mkdir -p "$root/usr/local" "$root/tmp" "$root/var/lib/meshrun" "$root/usr/local/lib/meshrun" \
  "$root/etc"
chmod 1777 "$root/tmp"
cp -a "$prefix/." "$root/usr/local/"
elves=()
while IFS= read -r -d '' f; do
  head -c 4 "$f" | grep -q $'\x7fELF' && elves+=("$f")
done < <(find "$prefix" -type f -print0)
if [ -n "$plugin" ]; then
  cp "$plugin" "$root/usr/local/lib/meshrun/"
  elves+=("$plugin")
fi
# The libraries each ELF needs (and the dynamic loader), at the same paths as here.
libs=$(for f in "${elves[@]}"; do ldd "$f" 2>/dev/null | awk '/=> \// { print $3 } /^\t\// { print $1 }'; done | sort -u)
[ -n "$libs" ] || { echo "ldd found no libraries" >&2; exit 1; }
for lib in $libs; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# /lib and /lib64 are symbolic links into /usr on Debian 12 (merged /usr).
for d in lib lib64; do
  if [ -L "/$d" ] && [ ! -e "$root/$d" ]; then ln -s "$(readlink "/$d")" "$root/$d"; fi
done
printf 'root:x:0:0:root:/root:/bin/false\nmeshrun:x:999:999:meshrun:/var/lib/meshrun:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nmeshrun:x:999:\n' >"$root/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
[ -f /etc/ssl/certs/ca-certificates.crt ] && mkdir -p "$root/etc/ssl/certs" &&
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"

buildah "${global[@]}" unmount "$ctr" >/dev/null
buildah "${global[@]}" config --env PATH=/usr/local/bin:/usr/bin:/bin \
  --port 7070 --port 7071 --port 7080 --workingdir /var/lib/meshrun \
  --label org.opencontainers.image.title=meshrun --entrypoint '[]' --cmd meshrun-coordinator "$ctr"
buildah "${global[@]}" commit --quiet --rm "$ctr" "$image" >/dev/null
trap - EXIT
echo "image $image: $(echo "$libs" | wc -l) libraries, $(du -sh "$prefix" | cut -f1) installed"
