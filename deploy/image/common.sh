# shellcheck shell=bash
# Sourced by deploy/build-image.sh and deploy/tests/*.sh: makes podman usable on a
# Debian/Ubuntu machine that has no Docker daemon and reaches only package
# registries (apt, crates.io, PyPI), as the CI machine does.
#
#   quiver_podman_setup   installs podman, runc, mmdebstrap… with apt when missing and
#                         exports CONTAINERS_CONF (below) unless the caller set one.
#
# Why a containers.conf of our own (exported through CONTAINERS_CONF, so no global
# file is edited):
#   - podman sets `nofile` and `nproc` ulimits of 1048576 on every container; on the CI
#     machine runc cannot set a `nofile` above the caller's hard limit (20000) nor an
#     `nproc` above 32768 (kernel.pid_max there, although `ulimit -Hu` says 96363), and
#     every `podman run` fails. The containers get those limits instead.
#   - crun refuses hybrid cgroup v1/v2 hosts like the CI machine; runc works.
# State (this file, the base image tarballs, caches) lives in QUIVER_IMAGE_STATE_DIR,
# default /var/tmp/quiver-image.

QUIVER_IMAGE_STATE_DIR="${QUIVER_IMAGE_STATE_DIR:-/var/tmp/quiver-image}"

quiver_log() { printf '== %s\n' "$*" >&2; }
quiver_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# apt packages: podman and the OCI runtime it is configured to use, mmdebstrap for
# the base images, and the network pieces podman needs for container networks.
QUIVER_PODMAN_PACKAGES=(podman runc mmdebstrap fuse-overlayfs uidmap slirp4netns netavark aardvark-dns containernetworking-plugins)

quiver_install_podman() {
    local missing=() package
    for package in "${QUIVER_PODMAN_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    command -v apt-get >/dev/null || quiver_die "podman is missing and there is no apt-get: install ${missing[*]} by hand"
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || quiver_die "run as root (or install sudo) to install ${missing[*]}"
        sudo=(sudo)
    fi
    quiver_log "installing ${missing[*]} with apt"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

quiver_write_containers_conf() {
    local conf="$QUIVER_IMAGE_STATE_DIR/containers.conf" hard_nofile hard_nproc
    hard_nofile="$(ulimit -Hn)"
    [[ "$hard_nofile" == unlimited ]] && hard_nofile=1048576
    hard_nproc="$(ulimit -Hu)"
    [[ "$hard_nproc" == unlimited ]] && hard_nproc=4194304
    local pid_max
    pid_max="$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 4194304)"
    [[ $pid_max -lt $hard_nproc ]] && hard_nproc=$pid_max
    mkdir -p "$QUIVER_IMAGE_STATE_DIR"
    cat > "$conf.tmp" <<CONF
# Written by deploy/image/common.sh; used through CONTAINERS_CONF.
[containers]
# podman's defaults are above this machine's hard limits.
default_ulimits = ["nofile=${hard_nofile}:${hard_nofile}", "nproc=${hard_nproc}:${hard_nproc}"]

[engine]
# crun refuses hybrid cgroup layouts; runc does not.
runtime = "runc"
CONF
    mv "$conf.tmp" "$conf"
    export CONTAINERS_CONF="$conf"
}

# podman run/rm of a container with a healthcheck log errors about systemd timers where
# systemd is not running (CI), and aardvark-dns about syslog; the tests run healthchecks
# themselves and need no syslog, so those lines go.
quiver_podman_quiet() {
    podman "$@" 2> >(grep -v -e 'unable to get systemd connection' -e 'failed to connect to syslog' >&2)
}

quiver_podman_setup() {
    quiver_install_podman
    command -v podman >/dev/null || quiver_die "podman is not on PATH"
    if [[ -z "${CONTAINERS_CONF:-}" ]]; then
        quiver_write_containers_conf
    fi
}

# Debian release of every base image, and how old a locally made base may get before
# it is made again (security updates).
QUIVER_DEBIAN_SUITE="${QUIVER_DEBIAN_SUITE:-bookworm}"
QUIVER_BASE_MAX_AGE_DAYS="${QUIVER_BASE_MAX_AGE_DAYS:-7}"

# quiver_debian_base IMAGE VARIANT PACKAGES RECIPE_EXTRA [mmdebstrap options…] -- [podman import --change …]
#
# Makes IMAGE (e.g. localhost/quiver-base-runtime:bookworm) from Debian packages with
# mmdebstrap and `podman import`, unless it exists, was made from the same recipe
# (variant, packages, options, RECIPE_EXTRA such as a hook's contents) and is younger
# than QUIVER_BASE_MAX_AGE_DAYS. QUIVER_REFRESH_BASES=1 makes it again regardless.
quiver_debian_base() {
    local image="$1" variant="$2" packages="$3" recipe_extra="$4"
    shift 4
    local mmdebstrap_options=() import_changes=()
    while [[ $# -gt 0 && "$1" != -- ]]; do mmdebstrap_options+=("$1"); shift; done
    [[ $# -gt 0 ]] && shift
    import_changes=("$@")

    local recipe
    recipe="$(printf '%s\n' "$QUIVER_DEBIAN_SUITE" "$variant" "$packages" "$recipe_extra" \
        "${mmdebstrap_options[@]}" "${import_changes[@]}" | sha256sum | cut -c1-16)"
    if [[ "${QUIVER_REFRESH_BASES:-0}" != 1 ]] && podman image exists "$image"; then
        local have created age_days
        have="$(podman image inspect --format '{{index .Labels "org.quiver.base-recipe"}}' "$image")"
        created="$(podman image inspect --format '{{.Created.Unix}}' "$image")"
        age_days=$(( ($(date +%s) - created) / 86400 ))
        if [[ "$have" == "$recipe" && $age_days -lt $QUIVER_BASE_MAX_AGE_DAYS ]]; then
            quiver_log "base image $image is up to date (recipe $recipe, $age_days days old)"
            return 0
        fi
    fi

    local tarball="$QUIVER_IMAGE_STATE_DIR/${image##*/}.tar"
    tarball="${tarball//:/-}"
    quiver_log "making base image $image: mmdebstrap --variant=$variant $QUIVER_DEBIAN_SUITE ($packages)"
    mkdir -p "$QUIVER_IMAGE_STATE_DIR"
    mmdebstrap --quiet --variant="$variant" --include="$packages" --format=tar \
        "${mmdebstrap_options[@]}" "$QUIVER_DEBIAN_SUITE" "$tarball.tmp" \
        || quiver_die "mmdebstrap failed for $image (is deb.debian.org reachable?)"
    mv "$tarball.tmp" "$tarball"
    local change_args=() change
    for change in "${import_changes[@]}" "LABEL org.quiver.base-recipe=$recipe"; do
        change_args+=(--change "$change")
    done
    podman import --quiet "${change_args[@]}" --message "mmdebstrap --variant=$variant $QUIVER_DEBIAN_SUITE: $packages" \
        "$tarball" "$image" >/dev/null
    rm -f "$tarball"
    quiver_log "made $image ($(podman image inspect --format '{{.Size}}' "$image" | numfmt --to=iec) uncompressed)"
}
