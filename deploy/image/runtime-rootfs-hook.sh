#!/usr/bin/env bash
# mmdebstrap --extract-hook for the runtime base image (deploy/build-image.sh):
# turns the extracted packages (libc6, libgcc-s1, ca-certificates, curl and their
# dependencies; no maintainer script has run, there is no shell to run them) into a
# root filesystem the quiver binaries run in:
#   - /etc/ssl/certs/ca-certificates.crt: the Mozilla bundle, as update-ca-certificates
#     would write it (that script needs a shell; the image has none);
#   - /etc/passwd and /etc/group with root and quiver (uid/gid 10001);
#   - /tmp (1777);
#   - /var/lib/dpkg/status listing the packages, so image scanners see what is inside;
#   - no manual pages, changelogs or translations (copyright files stay).
# Usage (mmdebstrap passes the root directory): runtime-rootfs-hook.sh ROOT
set -euo pipefail
root="${1:?usage: runtime-rootfs-hook.sh ROOT}"
[[ -d "$root/usr/share/ca-certificates/mozilla" ]] || { echo "error: $root has no ca-certificates" >&2; exit 1; }

mkdir -p "$root/etc/ssl/certs"
cat "$root"/usr/share/ca-certificates/mozilla/*.crt > "$root/etc/ssl/certs/ca-certificates.crt"
chmod 0644 "$root/etc/ssl/certs/ca-certificates.crt"

cat > "$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/usr/sbin/nologin
quiver:x:10001:10001:quiver:/data:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
PASSWD
cat > "$root/etc/group" <<'GROUP'
root:x:0:
quiver:x:10001:
nogroup:x:65534:
GROUP
chmod 0644 "$root/etc/passwd" "$root/etc/group"
install -d -m 1777 "$root/tmp"
install -d -m 0700 "$root/root"

status="$root/var/lib/dpkg/status"
mkdir -p "$(dirname "$status")"
: > "$status"
for deb in "$root"/var/cache/apt/archives/*.deb; do
    dpkg-deb --field "$deb" Package Version Architecture Maintainer Source Installed-Size Depends Pre-Depends Description \
        | sed '1a Status: install ok installed' >> "$status"
    echo >> "$status"
done
grep -q '^Package: libc6$' "$status" || { echo "error: libc6 is not among the extracted packages" >&2; exit 1; }

rm -rf "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/locale" "$root/usr/share/lintian"
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
