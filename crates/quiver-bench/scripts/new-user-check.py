"""A new user's check of a running Quiver, through the Python SDK (sdk/python).

    python crates/quiver-bench/scripts/new-user-check.py ENDPOINT [N] [DIM]

Against `quiver standalone` or a cluster's gateway: loads N clustered DIM-d points
(default 50,000 x 384) with nested payloads into a fresh collection `nu_docs` and
searches right after the load; then recall at c = 1, 16, 64, eight filters against
numpy's exact answers, an update, deletes, get, a batch, bad inputs (each must be
refused with a clear error and write nothing), k past the probed lists, l2 and dot
scores against numpy, string ids. Prints one PROBLEM line per failed expectation and
exits non-zero if there was any. Needs numpy and the SDK (`pip install
sdk/python[numpy]`). Found: filters on undeclared fields refused, fewer than k hits,
a 32 MiB searcher cache fetching a GB per query (README changelog).
"""
import sys, time, math, json, threading, random
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import quiver
from quiver import Client

ep = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 50000
DIM = int(sys.argv[3]) if len(sys.argv) > 3 else 384
c = Client(ep)
rng = np.random.default_rng(7)
problems = []


def problem(msg):
    print("PROBLEM:", msg, flush=True)
    problems.append(msg)


def clustered(n, dim, k=500, seed=1):
    r = np.random.default_rng(seed)
    cent = r.normal(size=(k, dim)).astype(np.float32)
    lab = r.integers(0, k, n)
    x = cent[lab] + 0.35 * r.normal(size=(n, dim)).astype(np.float32)
    return x.astype(np.float32)


def gt(base, q, metric, k=10, mask=None):
    if metric == "cosine":
        b = base / np.linalg.norm(base, axis=1, keepdims=True)
        qq = q / np.linalg.norm(q, axis=1, keepdims=True)
        s = qq @ b.T
        order = -s
    elif metric == "dot":
        s = q @ base.T
        order = -s
    else:
        s = (q * q).sum(1)[:, None] - 2 * q @ base.T + (base * base).sum(1)[None, :]
        order = s
    if mask is not None:
        order = np.where(mask[None, :], order, np.inf)
    idx = np.argsort(order, axis=1)[:, :k]
    return idx, s


def recall(found, truth):
    tot = 0
    for f, t in zip(found, truth):
        tot += len(set(f) & set(t.tolist()))
    return tot / (len(truth) * truth.shape[1])


def drop(name):
    try:
        c.drop_collection(name)
    except quiver.NotFound:
        pass


LANGS = ["en", "de", "fr", "ja"]

# ---------------------------------------------------------------- A. load + search right after
name = "nu_docs"
drop(name)
c.create_collection(name, dimension=DIM, metric="cosine")
allv = clustered(N + 300, DIM)
base, queries = allv[:N], allv[N:]
payloads = [{"lang": LANGS[i % 4], "n": i, "tags": ["t%d" % (i % 7)], "meta": {"src": "web" if i % 3 == 0 else "pdf"},
             "title": "document number %d" % i} for i in range(N)]
t = time.time()
last = [0]


def prog(done, total):
    if done - last[0] >= total // 5 or done == total:
        last[0] = done
        print("  load %d/%d" % (done, total), flush=True)


c.upsert_batches(name, ids=list(range(N)), vectors=base, payloads=payloads, batch_size=1000, concurrency=4, progress=prog)
print("load %.1fs" % (time.time() - t), flush=True)
d = c.describe(name)
print("describe right after load:", json.dumps({k: d.get(k) for k in ("points", "segments", "wal_tail_rows")}))
if d.get("points") != N:
    problem("points %r != %d right after load" % (d.get("points"), N))

truth, _ = gt(base, queries, "cosine")
lat = []
found = []
t0 = time.time()
for q in queries:
    t = time.time()
    hits = c.search(name, q, k=10)
    lat.append(time.time() - t)
    found.append([h.id for h in hits])
    for h in hits:
        if h.payload != payloads[h.id]:
            problem("payload of %r: %r != %r" % (h.id, h.payload, payloads[h.id]))
            break
r = recall(found, truth)
lat.sort()
print("fresh c=1 recall %.4f p50 %.2f ms p99 %.2f ms" % (r, 1000 * lat[len(lat) // 2], 1000 * lat[int(len(lat) * 0.99)]), flush=True)
if r < 0.95:
    problem("fresh recall %.4f < 0.95" % r)

# scores sorted and cosine
for hits in [c.search(name, queries[0], k=10)]:
    sc = [h.score for h in hits]
    if sc != sorted(sc, reverse=True):
        problem("cosine scores not descending: %r" % sc)
    qn = queries[0] / np.linalg.norm(queries[0])
    for h in hits:
        v = base[h.id] / np.linalg.norm(base[h.id])
        if abs(float(qn @ v) - h.score) > 2e-3:
            problem("cosine score %f vs %f" % (h.score, float(qn @ v)))
            break


def conc(cn, qs, **kw):
    errs = []
    res = [None] * len(qs)
    lats = [0.0] * len(qs)

    def one(i):
        t = time.time()
        try:
            res[i] = [h.id for h in c.search(name, qs[i], k=10, **kw)]
        except Exception as e:  # noqa
            errs.append(repr(e))
            res[i] = []
        lats[i] = time.time() - t

    t = time.time()
    with ThreadPoolExecutor(cn) as ex:
        list(ex.map(one, range(len(qs))))
    el = time.time() - t
    lats.sort()
    return res, errs, len(qs) / el, lats


for cn in (1, 16, 64):
    qs = np.concatenate([queries] * 3)
    res, errs, qps, lats = conc(cn, qs)
    r = recall(res, np.concatenate([truth] * 3))
    print("c=%d recall %.4f qps %.0f p50 %.2f p99 %.2f errors %d" % (cn, r, qps, 1000 * lats[len(lats) // 2], 1000 * lats[int(len(lats) * .99)], len(errs)), flush=True)
    if errs:
        problem("c=%d errors: %s" % (cn, errs[:3]))
    if r < 0.95:
        problem("c=%d recall %.4f" % (cn, r))

# ---------------------------------------------------------------- B. filters
lang = np.array([p["lang"] for p in payloads])
nn = np.arange(N)
src = np.array([p["meta"]["src"] for p in payloads])
cases = [
    ('lang = "en"', lang == "en"),
    ('n < 5000', nn < 5000),
    ('meta.src = "web"', src == "web"),
    ('lang = "de" AND n >= 1000', (lang == "de") & (nn >= 1000)),
    ('lang = "fr" OR lang = "ja"', (lang == "fr") | (lang == "ja")),
    ('lang IN ["en", "ja"]', (lang == "en") | (lang == "ja")),
    ('NOT lang = "en"', lang != "en"),
    ('n = 77', nn == 77),
]
for f, mask in cases:
    try:
        t_, _ = gt(base, queries[:50], "cosine", mask=mask)
        fs = []
        for q in queries[:50]:
            hits = c.search(name, q, k=10, filter=f)
            fs.append([h.id for h in hits])
            for h in hits:
                if not mask[h.id]:
                    problem("filter %s returned %d (payload %r)" % (f, h.id, h.payload))
                    break
        want = [[x for x in row if mask[x]] for row in t_]
        tot = sum(len(set(a) & set(b)) for a, b in zip(fs, want))
        den = sum(len(b) for b in want)
        r = tot / max(den, 1)
        print("filter %-30s recall %.4f" % (f, r), flush=True)
        if r < 0.9:
            problem("filter %s recall %.4f" % (f, r))
    except Exception as e:
        problem("filter %s: %r" % (f, e))

# ---------------------------------------------------------------- F/G. update, delete
newv = -base[5]
c.upsert(name, ids=[5], vectors=[newv], payloads=[{"lang": "xx", "n": 5}])
hits = c.search(name, newv, k=1)
if not hits or hits[0].id != 5 or hits[0].payload != {"lang": "xx", "n": 5}:
    problem("update not seen: %r" % hits)
hits = c.search(name, base[5], k=10)
if any(h.id == 5 for h in hits):
    problem("old vector of 5 still found")
c.delete(name, ids=[int(x) for x in truth[0][:3]])
hits = c.search(name, queries[0], k=10)
if any(h.id in set(int(x) for x in truth[0][:3]) for h in hits):
    problem("deleted ids returned")
d = c.describe(name)
if d.get("points") != N - 3:
    problem("points after delete %r != %d" % (d.get("points"), N - 3))
g = c.get(name, ids=[7, 8, int(truth[0][0])], include_vector=True)
print("get ->", [(p.id, (p.payload or {}).get("n")) for p in g])
for p in g:
    # A cosine collection keeps its vectors at unit length (docs/api.md).
    unit = base[7] / np.linalg.norm(base[7])
    if p.id == 7 and np.max(np.abs(np.array(p.vector, dtype=np.float32) - unit)) > 1e-5:
        problem("get vector of 7 differs")
if any(p.id == int(truth[0][0]) for p in g):
    problem("get returns a deleted point")

# batch
bs = c.search_batch(name, [{"vector": q.tolist(), "k": 10} for q in queries[:64]])
bf = [[h.id for h in r.hits] if hasattr(r, "hits") else [h.id for h in r] for r in bs]
print("batch recall %.4f" % recall(bf[1:], truth[1:64]))

# ---------------------------------------------------------------- H. bad inputs
before = c.describe(name)["points"]


def expect(err, fn, what):
    try:
        fn()
    except err as e:
        print("  ok %-40s -> %s: %s" % (what, type(e).__name__, str(e)[:150]))
        return
    except Exception as e:
        problem("%s: wrong error %r" % (what, e))
        return
    problem("%s: no error" % what)


bad = base[:3].copy().tolist()
bad[2] = bad[2][:-1]
expect(quiver.InvalidArgument, lambda: c.upsert(name, ids=[N + 1, N + 2, N + 3], vectors=bad), "one short vector in a batch")
nanv = base[:2].copy()
nanv[1, 3] = np.nan
expect(quiver.InvalidArgument, lambda: c.upsert(name, ids=[N + 4, N + 5], vectors=nanv), "NaN in a vector")
expect(quiver.InvalidArgument, lambda: c.search(name, queries[0][:-1], k=10), "short query")
expect(quiver.InvalidArgument, lambda: c.search(name, queries[0], k=0), "k=0")
expect(quiver.InvalidArgument, lambda: c.search(name, queries[0], k=10, filter="lang = "), "bad filter")
expect(quiver.NotFound, lambda: c.search("nope_nope", queries[0], k=10), "missing collection")
c.create_collection(name, dimension=DIM)  # the same definition: returns it
expect(quiver.AlreadyExists, lambda: c.create_collection(name, dimension=DIM + 1), "collection with another definition")
expect(quiver.InvalidArgument, lambda: c.create_collection("nu_bad", dimension=DIM, metric="hamming"), "bad metric")
expect(quiver.InvalidArgument, lambda: c.create_collection("nu_bad", dimension=0), "dimension 0")
after = c.describe(name)["points"]
if after != before:
    problem("bad requests changed points %d -> %d" % (before, after))
# One id twice in a request: the later point is kept (docs/api.md).
c.upsert(name, ids=[N + 6, N + 6], vectors=base[:2], payloads=[{"v": 1}, {"v": 2}])
got = c.get(name, ids=[N + 6])
if [p.payload for p in got] != [{"v": 2}]:
    problem("an id given twice kept %r" % got)
big = c.search(name, queries[0], k=1000)
print("k=1000 ->", len(big))
if len(big) != 1000:
    problem("k=1000 gave %d" % len(big))

# ---------------------------------------------------------------- C/D. l2, dot, string ids
for metric in ("l2", "dot"):
    nm = "nu_" + metric
    drop(nm)
    c.create_collection(nm, dimension=DIM, metric=metric)
    n2 = 20000
    c.upsert_batches(nm, ids=list(range(n2)), vectors=base[:n2], batch_size=2000)
    t_, s = gt(base[:n2], queries[:100], metric)
    fs = []
    for qi, q in enumerate(queries[:100]):
        hits = c.search(nm, q, k=10)
        fs.append([h.id for h in hits])
        for h in hits:
            if abs(s[qi, h.id] - h.score) > 1e-3 * max(1, abs(s[qi, h.id])):
                problem("%s score %f vs %f" % (metric, h.score, s[qi, h.id]))
                break
        sc = [h.score for h in hits]
        if sc != sorted(sc, reverse=(metric == "dot")):
            problem("%s order %r" % (metric, sc))
    print("%s recall %.4f" % (metric, recall(fs, t_)), flush=True)
    if recall(fs, t_) < 0.95:
        problem("%s recall %.4f" % (metric, recall(fs, t_)))
    c.drop_collection(nm)

nm = "nu_str"
drop(nm)
c.create_collection(nm, dimension=DIM, metric="cosine", id_type="string")
ids = ["doc-%d" % i for i in range(5000)]
c.upsert_batches(nm, ids=ids, vectors=base[:5000], payloads=[{"i": i} for i in range(5000)])
t_, _ = gt(base[:5000], queries[:50], "cosine")
fs = [[int(h.id.split("-")[1]) for h in c.search(nm, q, k=10)] for q in queries[:50]]
print("string ids recall %.4f" % recall(fs, t_))
expect(quiver.InvalidArgument, lambda: c.upsert(nm, ids=[5], vectors=base[:1]), "integer id on a string collection")
c.drop_collection(nm)

print("PROBLEMS:", len(problems))
for p in problems:
    print(" -", p)
sys.exit(1 if problems else 0)
