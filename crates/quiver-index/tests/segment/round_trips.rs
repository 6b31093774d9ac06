//! How many times a search would wait for a cold store: raw vectors read for
//! rescoring are asked for together ([`ByteSource::fetch_ahead`]), never one row
//! after the other. The source here tells a cache's story: every range it has not
//! been asked to fetch is cold, a `fetch_ahead` with cold ranges in it is one
//! round trip, and a read of a cold range on its own is one more.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use quiver_index::{
    ByteSource, ChunkChecksums, Codebook, DirectSession, IndexResult, MemorySource, Metric,
    ReadSession, SearchParams, SearchScratch, Segment, SharedProbe, search_shared,
};

use crate::data::{build, clustered};

/// A memory source that counts the round trips a cold cache would make for
/// reads outside a read session (the raw vectors; codes go through sessions).
struct ColdRows {
    inner: MemorySource,
    tracking: AtomicBool,
    resident: Mutex<HashSet<(u64, usize)>>,
    /// Shared by the members of a search over several segments: a fetch of
    /// several sources' ranges together is one round trip.
    round_trips: Arc<AtomicUsize>,
}

impl ColdRows {
    /// Marks `ranges` resident; tells whether any was cold.
    fn fetch(&self, ranges: &[(u64, usize)]) -> bool {
        if !self.tracking.load(Ordering::SeqCst) {
            return false;
        }
        let mut resident = self.resident.lock().unwrap();
        let mut cold = false;
        for range in ranges {
            cold |= resident.insert(*range);
        }
        cold
    }

    /// Returns how many distinct rows were read or fetched ahead so far.
    fn rows_asked(&self) -> usize {
        self.resident.lock().unwrap().len()
    }
}

impl ColdRows {
    fn start_tracking(&self) {
        self.resident.lock().unwrap().clear();
        self.round_trips.store(0, Ordering::SeqCst);
        self.tracking.store(true, Ordering::SeqCst);
    }
}

impl ByteSource for ColdRows {
    type Bytes<'a> = &'a [u8];
    type Session<'a> = DirectSession<'a>;

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn read_at(&self, offset: u64, length: usize) -> IndexResult<&[u8]> {
        if self.tracking.load(Ordering::SeqCst)
            && self.resident.lock().unwrap().insert((offset, length))
        {
            self.round_trips.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.read_at(offset, length)
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn fetch_ahead(&self, ranges: &[(u64, usize)]) {
        if self.fetch(ranges) {
            self.round_trips.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn fetch_ahead_together(requests: &[(&Self, &[(u64, usize)])]) {
        let mut cold = false;
        for (source, ranges) in requests {
            cold |= source.fetch(ranges);
        }
        if cold {
            requests[0].0.round_trips.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn session(&self) -> DirectSession<'_> {
        self.inner.session()
    }

    // Like a cache, it checks what it fetches itself: the segment does not read
    // whole chunks to check them.
    fn verify_with(&self, _checksums: &Arc<ChunkChecksums>) -> bool {
        true
    }
}

fn cold_segment(vectors: &[f32], dim: usize) -> Segment<ColdRows> {
    let built = build(vectors, dim, Metric::L2, |spec| spec.build.nlist = Some(64));
    cold_rows(&built, Arc::default())
}

/// `segment` read through a [`ColdRows`] counting its round trips in `round_trips`.
fn cold_rows(segment: &Segment<MemorySource>, round_trips: Arc<AtomicUsize>) -> Segment<ColdRows> {
    let bytes = segment
        .source()
        .read_at(0, segment.source().size() as usize)
        .unwrap()
        .to_vec();
    Segment::open(ColdRows {
        inner: MemorySource::new("cold.qseg", &bytes),
        tracking: AtomicBool::new(false),
        resident: Mutex::new(HashSet::new()),
        round_trips,
    })
    .unwrap()
}

/// Every probed list is scanned before anything is rescored, so a cold
/// search's rows come in a run or two of 80 (for k = 10; the first with the
/// guard's rows), not a list at a time: rescoring as each list was scanned
/// waited 452 times for these 20 queries (a third of the lists probed, many
/// small clusters, so that a query's candidates spread over them), now 67.
#[test]
fn a_cold_search_waits_for_a_run_or_two_of_rows_not_once_per_list() {
    let dim = 32;
    let (base, queries) = clustered(20_000, 20, dim, 2_000, 7);
    let segment = cold_segment(&base, dim);
    let params = SearchParams {
        k: 10,
        nprobe: Some(24),
        ..SearchParams::default()
    };
    let guard_rows = params.k * params.rescore;
    let mut scratch = SearchScratch::default();
    let (mut found, mut wanted, mut round_trips, mut lists) = (0, 0, 0, 0);
    for query in queries.chunks_exact(dim) {
        segment.source().start_tracking();
        let hits = segment.search(query, &params, None, &mut scratch).unwrap();
        assert_eq!(hits.len(), 10);
        let stats = scratch.stats;
        let trips = segment.source().round_trips.load(Ordering::SeqCst);
        // The runs, and the guard's rows the rescoring pushed into the reserve.
        assert!(
            trips <= 2 + stats.rows_rescored.div_ceil(80),
            "{trips} round trips for {} rescored rows in {} lists",
            stats.rows_rescored,
            stats.lists_probed
        );
        let asked = segment.source().rows_asked();
        assert!(
            asked <= stats.rows_rescored + guard_rows + 80,
            "{asked} rows asked for {} rescored",
            stats.rows_rescored
        );
        round_trips += trips;
        lists += stats.lists_probed;
        let exact = segment.flat_search(query, 10, None, &mut scratch).unwrap();
        found += hits
            .iter()
            .filter(|hit| exact.iter().any(|e| e.row == hit.row))
            .count();
        wanted += exact.len();
    }
    assert!(
        round_trips * 5 < lists,
        "{round_trips} round trips for {lists} probed lists"
    );
    let recall = found as f64 / wanted as f64;
    assert!(recall >= 0.95, "recall@10 {recall}");
}

/// A search over several segments of one codebook asks for every member's
/// rows of a run together: a cold search waits as often as over one segment
/// holding them all, not once per run and member (three members waited three
/// times as often).
#[test]
fn a_cold_search_over_several_segments_waits_once_per_run_not_once_per_member() {
    let dim = 32;
    let (base, queries) = clustered(30_000, 20, dim, 2_000, 11);
    let third = base.len() / 3;
    let first = build(&base[..third], dim, Metric::L2, |spec| {
        spec.build.nlist = Some(64)
    });
    let codebook = Arc::new(Codebook::of_segment(&first).unwrap().unwrap());
    let round_trips = Arc::new(AtomicUsize::new(0));
    let members: Vec<Segment<ColdRows>> = base
        .chunks(third)
        .map(|part| {
            let built = build(part, dim, Metric::L2, |spec| {
                spec.build.codebook = Some(codebook.clone())
            });
            cold_rows(&built, round_trips.clone())
        })
        .collect();
    let probes: Vec<SharedProbe<'_, ColdRows>> = members
        .iter()
        .map(|segment| SharedProbe {
            segment,
            filter: None,
        })
        .collect();
    let params = SearchParams {
        k: 10,
        nprobe: Some(24),
        ..SearchParams::default()
    };
    let mut scratch = SearchScratch::default();
    let mut rounds = 0;
    for query in queries.chunks_exact(dim) {
        for member in &members {
            member.source().start_tracking();
        }
        round_trips.store(0, Ordering::SeqCst);
        let hits = search_shared(&probes, query, &params, &mut scratch).unwrap();
        assert_eq!(hits.len(), 10);
        let members_hit: HashSet<usize> = hits.iter().map(|(member, _)| *member).collect();
        assert!(!members_hit.is_empty());
        let trips = round_trips.load(Ordering::SeqCst);
        let rescored = scratch.stats.rows_rescored;
        assert!(
            trips <= 2 + rescored.div_ceil(80),
            "{trips} round trips for {rescored} rescored rows over 3 members"
        );
        rounds += trips;
    }
    assert!(rounds > 0, "the searches fetched rows ahead");
}

#[test]
fn an_exact_search_of_listed_rows_fetches_them_in_chunks() {
    let dim = 16;
    let (base, queries) = clustered(3_000, 1, dim, 10, 11);
    let segment = cold_segment(&base, dim);
    let mut scratch = SearchScratch::default();
    segment.source().start_tracking();
    let hits = segment
        .search_rows(
            &queries[..dim],
            (0..1_000).map(|row| row * 3),
            10,
            &mut scratch,
        )
        .unwrap();
    assert_eq!(hits.len(), 10);
    let round_trips = segment.source().round_trips.load(Ordering::SeqCst);
    assert!(
        round_trips <= 1_000usize.div_ceil(256),
        "{round_trips} round trips for 1,000 rows"
    );
}

#[test]
fn rows_past_the_kth_upper_bound_are_neither_fetched_nor_read() {
    let dim = 32;
    let (base, queries) = clustered(20_000, 20, dim, 40, 7);
    let segment = cold_segment(&base, dim);
    let params = SearchParams {
        k: 10,
        ..SearchParams::default()
    };
    let guard_rows = params.k * params.rescore;
    let mut scratch = SearchScratch::default();
    let (mut found, mut wanted) = (0, 0);
    for query in queries.chunks_exact(dim) {
        segment.source().start_tracking();
        let hits = segment.search(query, &params, None, &mut scratch).unwrap();
        let stats = scratch.stats;
        let asked = segment.source().rows_asked();
        // The rows rescored, the guard's and at most one run fetched ahead
        // past the last one rescored — not every candidate of the first list
        // (a first list has no threshold yet, so every one of its ~300 rows is
        // a candidate).
        assert!(
            asked <= stats.rows_rescored + guard_rows + 80,
            "{asked} rows asked for {} rescored in {} lists",
            stats.rows_rescored,
            stats.lists_probed
        );
        // And what is skipped costs no recall.
        let exact = segment.flat_search(query, 10, None, &mut scratch).unwrap();
        found += hits
            .iter()
            .filter(|hit| exact.iter().any(|e| e.row == hit.row))
            .count();
        wanted += exact.len();
    }
    let recall = found as f64 / wanted as f64;
    assert!(recall >= 0.95, "recall@10 {recall}");
}

/// Rows whose values overflow f32 when squared (the writer stores any finite
/// row; the API refuses them, but rows written before that must still build)
/// make a segment, with a trained codebook and with a shared one of one list.
#[test]
fn rows_with_overflowing_squares_still_build_a_segment() {
    use quiver_index::{IdType, PointId, SegmentSpec, SegmentWriter};

    let dim = 4;
    let rows: [[f32; 4]; 3] = [[1e38; 4], [3e38, 0.0, 0.0, 0.0], [1e-45, 0.0, 0.0, 0.0]];
    let build = |metric: Metric, codebook: Option<Arc<Codebook>>| {
        let mut spec = SegmentSpec::new(dim, metric, IdType::U64);
        spec.build.codebook = codebook;
        let mut writer = SegmentWriter::new(spec).unwrap();
        for (row, vector) in rows.iter().enumerate() {
            writer
                .add(PointId::U64(20 + row as u64), vector, None)
                .unwrap();
        }
        let mut bytes = Vec::new();
        writer
            .finish(&mut bytes, &|_, _, _| {})
            .expect("the build succeeds");
        Segment::open(MemorySource::new("degenerate.qseg", &bytes)).unwrap()
    };
    for metric in [Metric::Cosine, Metric::Dot, Metric::L2] {
        let first = build(metric, None);
        assert_eq!(first.header().rows, 3);
        let codebook = Arc::new(Codebook::of_segment(&first).unwrap().unwrap());
        let second = build(metric, Some(codebook));
        assert_eq!(second.header().rows, 3);
        if metric == Metric::Cosine {
            // Stored unit length, every one of them.
            for row in 0..3 {
                let stored = second.vector(row).unwrap();
                let length: f32 = stored.iter().map(|v| v * v).sum::<f32>().sqrt();
                assert!((length - 1.0).abs() < 1e-5, "row {row}: {stored:?}");
            }
        }
    }
}

/// A memory source that counts the round trips a cold cache would make for the
/// codes a search scans (read through its session): a `fetch_scan_ahead_together` with
/// cold ranges in it is one, and a session read of a range it was not asked to
/// fetch is one more.
struct ColdCodes {
    inner: MemorySource,
    resident: Mutex<HashSet<(u64, usize)>>,
    round_trips: AtomicUsize,
}

struct ColdCodesSession<'a> {
    source: &'a ColdCodes,
    inner: DirectSession<'a>,
}

impl ReadSession for ColdCodesSession<'_> {
    fn read_at(&self, offset: u64, length: usize) -> IndexResult<Cow<'_, [u8]>> {
        if self
            .source
            .resident
            .lock()
            .unwrap()
            .insert((offset, length))
        {
            self.source.round_trips.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.read_at(offset, length)
    }
}

impl ByteSource for ColdCodes {
    type Bytes<'a> = &'a [u8];
    type Session<'a> = ColdCodesSession<'a>;

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn read_at(&self, offset: u64, length: usize) -> IndexResult<&[u8]> {
        self.inner.read_at(offset, length)
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn scans_ahead(&self) -> bool {
        true
    }

    fn fetch_scan_ahead_together(requests: &[(&Self, &[(u64, usize)])]) {
        for &(source, ranges) in requests {
            let mut resident = source.resident.lock().unwrap();
            let mut cold = false;
            for range in ranges {
                cold |= resident.insert(*range);
            }
            if cold {
                source.round_trips.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    fn session(&self) -> ColdCodesSession<'_> {
        ColdCodesSession {
            source: self,
            inner: self.inner.session(),
        }
    }

    fn verify_with(&self, _checksums: &Arc<ChunkChecksums>) -> bool {
        true
    }
}

/// The codes of every list a search probes are asked for together before the
/// scan reads them, so a cold search waits for its codes once, not once per
/// probed list (nor once per cache region they span).
#[test]
fn a_cold_search_asks_for_the_codes_of_its_lists_together() {
    let dim = 32;
    let (base, queries) = clustered(20_000, 20, dim, 200, 5);
    let built = build(&base, dim, Metric::L2, |spec| spec.build.nlist = Some(64));
    let bytes = built
        .source()
        .read_at(0, built.source().size() as usize)
        .unwrap()
        .to_vec();
    let segment = Segment::open(ColdCodes {
        inner: MemorySource::new("cold-codes.qseg", &bytes),
        resident: Mutex::new(HashSet::new()),
        round_trips: AtomicUsize::new(0),
    })
    .unwrap();
    let params = SearchParams {
        k: 10,
        nprobe: Some(16),
        ..SearchParams::default()
    };
    let mut scratch = SearchScratch::default();
    for query in queries.chunks_exact(dim) {
        segment.source().resident.lock().unwrap().clear();
        segment.source().round_trips.store(0, Ordering::SeqCst);
        let hits = segment.search(query, &params, None, &mut scratch).unwrap();
        assert_eq!(hits.len(), 10);
        assert_eq!(scratch.stats.lists_probed, 16);
        assert_eq!(
            segment.source().round_trips.load(Ordering::SeqCst),
            1,
            "a cold search of {} lists waits once for their codes",
            scratch.stats.lists_probed
        );
    }
}

/// What a search answers of its hits (ids, payloads, vectors) is asked for
/// together: one wait for the ids, payload offsets and vectors, one for the
/// texts the offsets point at — not one or two per hit.
#[test]
fn the_hits_ids_payloads_and_vectors_are_fetched_ahead_together() {
    let bytes = crate::data::small_segment_bytes();
    let segment = Segment::open(ColdRows {
        inner: MemorySource::new("hits.qseg", &bytes),
        tracking: AtomicBool::new(false),
        resident: Mutex::new(HashSet::new()),
        round_trips: Arc::default(),
    })
    .unwrap();
    let read_hits = |rows: &[u32]| {
        for &row in rows {
            segment.id(row).unwrap();
            assert!(segment.payload_bytes(row).unwrap().is_some());
            segment.vector(row).unwrap();
        }
    };
    // Read hit by hit, string ids and payloads wait twice each, vectors once.
    let rows: Vec<u32> = (0..10).map(|hit| hit * 67).collect();
    segment.source().start_tracking();
    read_hits(&rows);
    assert!(
        segment.source().round_trips.load(Ordering::SeqCst) >= 4 * rows.len(),
        "{} round trips read hit by hit",
        segment.source().round_trips.load(Ordering::SeqCst)
    );
    let rows: Vec<u32> = (0..10).map(|hit| hit * 67 + 5).collect();
    segment.source().start_tracking();
    segment.fetch_hits_ahead(&rows, true, true);
    read_hits(&rows);
    assert_eq!(segment.source().round_trips.load(Ordering::SeqCst), 2);
}
