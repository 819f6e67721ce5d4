#!/usr/bin/env bash
# Builds weaviate-server from the Go module proxy's source with listen-host.patch applied (see its header):
# the patched server can put its gRPC and cluster data listeners on one address instead of every interface.
#
#   scripts/weaviate/build.sh VERSION [OUT]     (OUT defaults to .build/bin/weaviate-server)
#
# OUT.build records what OUT was built from (version, the patch's sha256, the build flags, CGO_ENABLED):
# a run whose record matches does nothing, so a changed patch or version rebuilds and an up-to-date build
# is a no-op. CGO_ENABLED=0 gives a static binary, for the HPC image (scripts/weaviate/weaviate.def).
# The source is copied from the read-only module cache into .build/weaviate-src.* (removed afterwards);
# the binary is written beside OUT and renamed over it, so servers running the old one are not disturbed.
# Without Go the build is skipped with a note (the Weaviate adapter then says what to install).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
version="${1:?usage: build.sh VERSION [OUT]}"
out="$(realpath -m "${2:-$repo/.build/bin/weaviate-server}")" # absolute: the build runs in another directory
patch_file="$here/listen-host.patch"
module="github.com/weaviate/weaviate"
# -buildvcs=false: the copied source sits inside this project's git work tree, whose state is not Weaviate's.
build_flags=(-buildvcs=false)

patch_sha="$(sha256sum "$patch_file" | cut -d' ' -f1)"
want="$module $version patch-sha256 $patch_sha flags ${build_flags[*]} CGO_ENABLED=${CGO_ENABLED-}"
up_to_date() { [ -x "$out" ] && [ -f "$out.build" ] && [ "$(cat "$out.build")" = "$want" ]; }
if up_to_date; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  if [ -e "$out" ]; then # an older or foreign build: it would listen on every interface
    echo "warning: $out is not the patched build of $version (no matching $out.build): its gRPC and" \
      "cluster data ports listen on every interface. Install Go >= 1.25 and run 'make weaviate'." >&2
  else
    echo "note: Go not found; Weaviate stages need $out (install Go >= 1.25 and run 'make weaviate')"
  fi
  exit 0
fi
for tool in patch sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || { echo "error: '$tool' is needed to build weaviate-server" >&2; exit 1; }
done

mkdir -p "$(dirname "$out")"
# One build at a time per OUT (make -j, two shells): the second waits, then finds the first's result.
exec 9>"$out.lock"
flock 9
if up_to_date; then
  exit 0
fi

echo "building weaviate-server $version with $(basename "$patch_file") (a few minutes, once)"
start=$SECONDS
# `go mod download -json` names the unpacked module's directory in the module cache.
src="$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -d "$src" ] || { echo "error: go mod download gave no source directory for $module@$version" >&2; exit 1; }

mkdir -p "$repo/.build"
work="$(mktemp -d "$repo/.build/weaviate-src.XXXXXX")"
tmp_out="$(mktemp "$out.XXXXXX")"
trap 'rm -rf "$work" "$tmp_out"' EXIT
cp -R "$src/." "$work"
chmod -R u+w "$work" # the module cache is read-only
(cd "$work" && patch -p1 --batch --forward --quiet <"$patch_file")
(cd "$work" && go build "${build_flags[@]}" -o "$tmp_out" ./cmd/weaviate-server)
chmod 755 "$tmp_out"
mv -f "$tmp_out" "$out"
printf '%s\n' "$want" >"$out.build"
echo "built $out in $((SECONDS - start)) s"
