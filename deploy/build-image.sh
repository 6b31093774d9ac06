#!/usr/bin/env bash
# Builds the Quiver container image (deploy/Dockerfile) with podman on a machine that
# reaches package registries (apt, crates.io) but no image registry, as CI does:
#
#   deploy/build-image.sh [TAG]          # default TAG: localhost/quiver:dev
#
# What it does, and why:
#   1. installs podman, runc, mmdebstrap… with apt when missing, and points podman at a
#      containers.conf of its own (deploy/image/common.sh says why);
#   2. makes the two base images from Debian packages instead of pulling them
#      (mmdebstrap + podman import; remade weekly for security updates):
#        localhost/quiver-base-builder:bookworm  minbase + gcc, libc6-dev, make — the Rust
#            toolchain is not in it: the host's (`rustc --print sysroot`, 1.95+) is mounted
#            read-only into the build at /opt/rust-toolchain;
#        localhost/quiver-base-runtime:bookworm  only libc6, libgcc-s1, ca-certificates,
#            curl and their libraries, extracted without maintainer scripts: no shell,
#            no package manager (deploy/image/runtime-rootfs-hook.sh);
#   3. podman build --pull=never with those bases as build arguments. Crates are fetched
#      from crates.io inside the build; the host's CA bundle is mounted read-only over
#      the builder's (HTTPS may go through a proxy only the host trusts) and is never
#      part of an image. The cargo registry and target directory are cache mounts that
#      survive between builds, so a rebuild after a source change is incremental.
#
# Environment:
#   QUIVER_CARGO_PROFILE   cargo profile of the binaries (default release; CI's smoke test
#                          uses `image-ci`, a cheaper one the Dockerfile defines)
#   QUIVER_BUILD_CACHE_DIR where buildah keeps the cache mounts (default /var/tmp/quiver-image-cache)
#   QUIVER_IMAGE_STATE_DIR containers.conf and base image tarballs (default /var/tmp/quiver-image)
#   QUIVER_REFRESH_BASES=1 remake the base images now
#   QUIVER_BUILD_EXTRA_ARGS more `podman build` options, split on spaces (e.g. --no-cache)
#   QUIVER_IMAGE_ENGINE=docker  use `docker build` with the Dockerfile's public base
#                          images instead (needs a Docker daemon and Docker Hub)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tag="${1:-localhost/quiver:dev}"
# shellcheck source=deploy/image/common.sh
source "$repo/deploy/image/common.sh"

profile="${QUIVER_CARGO_PROFILE:-release}"
version="$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml")"
revision="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
if [[ "$revision" != unknown ]] && ! git -C "$repo" diff-index --quiet HEAD -- 2>/dev/null; then
    revision="$revision-dirty"
fi
created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
label_args=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "CREATED=$created")

if [[ "${QUIVER_IMAGE_ENGINE:-podman}" == docker ]]; then
    quiver_log "docker build (public base images) -> $tag"
    exec docker build -f "$repo/deploy/Dockerfile" --build-arg "CARGO_PROFILE=$profile" \
        "${label_args[@]}" -t "$tag" "$repo"
fi

quiver_podman_setup

# The host's Rust toolchain, mounted into the builder (no rustup inside the build).
command -v rustc >/dev/null || quiver_die "rustc is not on PATH (the build uses the host's toolchain, 1.95+)"
toolchain="$(rustc --print sysroot)"
rustc_version="$(rustc --version | awk '{print $2}')"
[[ -x "$toolchain/bin/cargo" ]] || quiver_die "$toolchain/bin/cargo is missing (install the toolchain's cargo component)"
if [[ "$(printf '%s\n' 1.95.0 "${rustc_version%%-*}" | sort -V | head -1)" != 1.95.0 ]]; then
    quiver_die "rustc $rustc_version is older than 1.95 (rust-version of the workspace)"
fi

path_env="PATH=/opt/rust-toolchain/bin:/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
quiver_debian_base localhost/quiver-base-builder:"$QUIVER_DEBIAN_SUITE" minbase \
    "gcc,libc6-dev,make,mawk,ca-certificates" "" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    -- "ENV $path_env" "ENV CARGO_HOME=/usr/local/cargo" "ENV LANG=C.UTF-8" \
    "LABEL org.opencontainers.image.description=Debian $QUIVER_DEBIAN_SUITE minbase with gcc and make; mount a Rust toolchain at /opt/rust-toolchain"
hook="$repo/deploy/image/runtime-rootfs-hook.sh"
quiver_debian_base localhost/quiver-base-runtime:"$QUIVER_DEBIAN_SUITE" extract \
    "libc6,libgcc-s1,ca-certificates,curl,base-files,netbase" "$(cat "$hook")" \
    --extract-hook="$hook \"\$1\"" \
    -- "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    "LABEL org.opencontainers.image.description=Debian $QUIVER_DEBIAN_SUITE libc6, libgcc-s1, ca-certificates, curl; no shell"

# Where buildah keeps the RUN --mount=type=cache directories (it uses $TMPDIR).
cache_dir="${QUIVER_BUILD_CACHE_DIR:-/var/tmp/quiver-image-cache}"
mkdir -p "$cache_dir"
volumes=(--volume "$toolchain:/opt/rust-toolchain:ro")
host_ca=/etc/ssl/certs/ca-certificates.crt
[[ -f "$host_ca" ]] && volumes+=(--volume "$host_ca:/etc/ssl/certs/ca-certificates.crt:ro")

# Split on spaces on purpose: it is a list of options.
read -r -a extra_args <<< "${QUIVER_BUILD_EXTRA_ARGS:-}"

quiver_log "podman build ($profile profile, rustc $rustc_version from $toolchain) -> $tag"
start=$(date +%s)
TMPDIR="$cache_dir" nice -n 10 podman build \
    --pull=never --format docker --layers \
    --file "$repo/deploy/Dockerfile" --ignorefile "$repo/deploy/Dockerfile.dockerignore" \
    --build-arg "BUILDER_IMAGE=localhost/quiver-base-builder:$QUIVER_DEBIAN_SUITE" \
    --build-arg "RUNTIME_IMAGE=localhost/quiver-base-runtime:$QUIVER_DEBIAN_SUITE" \
    --build-arg "CARGO_PROFILE=$profile" \
    "${label_args[@]}" "${volumes[@]}" \
    "${extra_args[@]}" \
    --tag "$tag" "$repo"
elapsed=$(( $(date +%s) - start ))
size="$(podman image inspect --format '{{.Size}}' "$tag")"
quiver_log "built $tag in ${elapsed}s: $(numfmt --to=si --suffix=B "$size") ($size bytes, uncompressed)"
