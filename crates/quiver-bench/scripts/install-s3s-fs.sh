#!/usr/bin/env bash
# Installs s3s-fs 0.14.1 (an S3 server over a local directory, from crates.io), the
# S3 server of the beyond-RAM cluster benchmark, with one change: its accepted
# sockets get TCP_NODELAY. Without it, a response written in several pieces on a
# reused connection waits for the client's delayed ACK (~40 ms) — measured with a
# pooled client: a 64 KiB range GET 4 ms median / 51 ms max, 1 MiB 52–56 ms; with
# it 1.3 / 2.5 ms and 12 ms. Real S3 servers set it; a benchmark of a cache that
# fetches 64 KiB ranges would otherwise measure that stall.
#
#   crates/quiver-bench/scripts/install-s3s-fs.sh [ROOT]    (default /var/tmp/s3s-fs; binary in ROOT/bin)
set -euo pipefail
root=${1:-/var/tmp/s3s-fs}
work=$(mktemp -d -t s3s-fs-src.XXXXXX)
trap 'rm -rf "$work"' EXIT
curl -fsSL https://static.crates.io/crates/s3s-fs/s3s-fs-0.14.1.crate | tar -xz -C "$work"
cd "$work/s3s-fs-0.14.1"
python3 - <<'PY'
import pathlib
path = pathlib.Path("src/main.rs")
source = path.read_text()
accept = "        let conn = http_server.serve_connection(TokioIo::new(socket), service.clone());"
assert source.count(accept) == 1, "s3s-fs 0.14.1 changed: the accept loop was not found"
path.write_text(source.replace(accept, "        let _ = socket.set_nodelay(true);\n" + accept))
PY
cargo install --path . --features binary --locked --root "$root"
echo "s3s-fs (TCP_NODELAY) in $root/bin/s3s-fs"
