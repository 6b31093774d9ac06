//! Segment format versions: a v1 segment (1 MiB chunks everywhere, written by
//! the previous format's writer: `fixtures/v1.qseg`, 300 rows of 16-d l2, id =
//! 3 × row, payload `{"row": row}`) is still read and searched; v2 segments give
//! the row-read sections 64 KiB chunks starting on a 64 KiB boundary.
//!
//! The fixture was written by `SegmentWriter` at commit d1a4ffa (the last v1
//! writer) from [`fixture_vectors`], `SegmentSpec::new(16, Metric::L2,
//! IdType::U64)` and default build settings. `.gitignore` excludes `*.qseg`
//! except under `fixtures/`.

use quiver_index::{
    FORMAT_VERSION, IdType, MemorySource, Metric, PointId, SearchParams, SearchScratch,
    SectionKind, Segment, SegmentSpec, SegmentWriter,
};

/// The fixture's vectors: the xorshift sequence its writer used.
fn fixture_vectors() -> Vec<Vec<f32>> {
    let mut state = 12345u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 2000) as f32 / 1000.0 - 1.0
    };
    (0..300)
        .map(|_| (0..16).map(|_| next()).collect())
        .collect()
}

#[test]
fn a_v1_segment_is_still_read_and_searched() {
    let bytes = include_bytes!("fixtures/v1.qseg");
    let segment = Segment::open(MemorySource::new("v1.qseg", bytes)).unwrap();
    assert_eq!(segment.header().format_version, 1);
    assert_eq!(segment.rows(), 300);
    assert!(
        segment
            .sections()
            .iter()
            .all(|section| section.chunk_bytes == 1 << 20),
        "v1 chunks are 1 MiB"
    );
    segment.verify().unwrap();
    let vectors = fixture_vectors();
    let params = SearchParams {
        nprobe: Some(1000),
        ..SearchParams::new(1)
    };
    let mut scratch = SearchScratch::new();
    for row in (0..300).step_by(23) {
        let hits = segment
            .search(&vectors[row], &params, None, &mut scratch)
            .unwrap();
        assert!(hits[0].score < 1e-6, "row {row}: {hits:?}");
        assert_eq!(
            segment.id(hits[0].row).unwrap(),
            PointId::U64(row as u64 * 3)
        );
        assert_eq!(
            segment.payload(hits[0].row).unwrap().unwrap()["row"],
            row as u64
        );
        assert_eq!(segment.vector(hits[0].row).unwrap(), vectors[row]);
    }
}

#[test]
fn v2_segments_check_row_sections_in_small_aligned_chunks() {
    assert_eq!(FORMAT_VERSION, 2);
    let dim = 64;
    let mut writer =
        SegmentWriter::new(SegmentSpec::new(dim, Metric::Cosine, IdType::U64)).unwrap();
    for row in 0..3000u64 {
        let vector: Vec<f32> = (0..dim)
            .map(|i| ((row * 31 + i as u64) % 97) as f32 - 48.0)
            .collect();
        writer
            .add(
                PointId::U64(row),
                &vector,
                Some(&serde_json::json!({"row": row})),
            )
            .unwrap();
    }
    let mut bytes = Vec::new();
    writer.finish(&mut bytes, &|_, _, _| {}).unwrap();
    let segment = Segment::open(MemorySource::new("v2.qseg", &bytes)).unwrap();
    assert_eq!(segment.header().format_version, 2);
    for section in segment.sections() {
        let small = matches!(
            section.kind,
            SectionKind::RawVectors | SectionKind::Payloads
        );
        assert_eq!(
            section.chunk_bytes,
            if small { 64 << 10 } else { 1 << 20 },
            "{section:?}"
        );
        if small {
            assert_eq!(section.offset % (64 << 10), 0, "{section:?}");
        }
    }
    segment.verify().unwrap();
    let row = segment.row_of(&PointId::U64(2999)).unwrap().unwrap();
    assert_eq!(segment.payload(row).unwrap().unwrap()["row"], 2999);
}
