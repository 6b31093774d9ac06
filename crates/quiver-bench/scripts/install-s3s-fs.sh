#!/usr/bin/env bash
# Installs s3s-fs 0.14.1 (an S3 server over a local directory, from crates.io), the
# S3 server of the beyond-RAM cluster benchmark, with one change: its accepted
# sockets get TCP_NODELAY. Without it, a response written in several pieces on a
# reused connection waits for the client's delayed ACK (~40 ms) — measured with a
# pooled client: a 64 KiB range GET 4 ms median / 51 ms max, 1 MiB 52–56 ms; with
# it 1.3 / 2.5 ms and 12 ms. Real S3 servers set it; a benchmark of a cache that
# fetches 64 KiB ranges would otherwise measure that stall.
#
# With READ_BUFFER_KIB set (e.g. 256), a second change: GetObject reads the file
# in pieces of that size instead of 4 KiB. Each piece is a hop through tokio's
# blocking pool, so a 64 KiB range costs 16 hops; on a 2-core machine shared with
# the searcher, that CPU (≈0.4 ms per request) is most of a query's at a small
# cache. The beyond-RAM benchmark reports which server it ran against.
#
#   [READ_BUFFER_KIB=256] crates/quiver-bench/scripts/install-s3s-fs.sh [ROOT]    (default /var/tmp/s3s-fs; binary in ROOT/bin)
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
if [ -n "${READ_BUFFER_KIB:-}" ]; then
    READ_BUFFER_KIB=$READ_BUFFER_KIB python3 - <<'PY'
import os, pathlib
path = pathlib.Path("src/s3.rs")
source = path.read_text()
read = "bytes_stream(ReaderStream::with_capacity(file, 4096), content_length_usize)"
assert source.count(read) == 1, "s3s-fs 0.14.1 changed: GetObject's reader was not found"
size = int(os.environ["READ_BUFFER_KIB"]) * 1024
path.write_text(source.replace(read, read.replace("4096", str(size))))
PY
fi
cargo install --path . --features binary --locked --root "$root"
echo "s3s-fs (TCP_NODELAY) in $root/bin/s3s-fs"
