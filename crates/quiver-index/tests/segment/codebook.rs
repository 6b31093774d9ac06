//! Segments built with one shard codebook: same lists, searched together.

use std::sync::Arc;

use quiver_index::{
    Codebook, IdType, MemorySource, Metric, PointId, SearchParams, SearchScratch, Segment,
    SegmentSpec, SegmentWriter, SharedProbe, search_shared,
};

use crate::data::{build, clustered};
use rand::SeedableRng;

/// Builds a segment of `vectors` with ids starting at `first_id`, with `codebook`.
fn build_with(
    vectors: &[f32],
    dim: usize,
    first_id: u64,
    codebook: Option<Arc<Codebook>>,
) -> Segment<MemorySource> {
    let mut spec = SegmentSpec::new(dim, Metric::Cosine, IdType::U64);
    spec.build.codebook = codebook;
    let mut writer = SegmentWriter::new(spec).unwrap();
    for (row, vector) in vectors.chunks_exact(dim).enumerate() {
        writer
            .add(PointId::U64(first_id + row as u64), vector, None)
            .unwrap();
    }
    let mut bytes = Vec::new();
    writer.finish(&mut bytes, &|_, _, _| {}).unwrap();
    Segment::open(MemorySource::new("codebook.qseg", &bytes)).unwrap()
}

fn ids(segment: &Segment<MemorySource>, row: u32) -> u64 {
    match segment.id(row).unwrap() {
        PointId::U64(id) => id,
        other => panic!("u64 ids expected, got {other:?}"),
    }
}

#[test]
fn segments_of_one_codebook_answer_together_like_one_segment() {
    let dim = 64;
    let parts = 4;
    let per_part = 4_000;
    let (base, queries) = clustered(parts * per_part, 50, dim, 40, 11);
    // The first part trains the codebook; the others reuse it (no k-means).
    let first = build_with(&base[..per_part * dim], dim, 0, None);
    let codebook = Arc::new(
        Codebook::of_segment(&first)
            .expect("centroids read")
            .expect("new segments carry a codebook"),
    );
    assert_eq!(codebook.trained_rows(), per_part as u64);
    let mut members = vec![first];
    for part in 1..parts {
        let slice = &base[part * per_part * dim..(part + 1) * per_part * dim];
        let segment = build_with(slice, dim, (part * per_part) as u64, Some(codebook.clone()));
        assert_eq!(segment.header().codebook, Some(codebook.info()));
        assert_eq!(segment.header().nlist, codebook.nlist());
        members.push(segment);
    }
    let whole = build(&base, dim, Metric::Cosine, |spec| {
        spec.build.nlist = Some(codebook.nlist())
    });
    // One copy of the codebook's tables in memory for all of them; a segment
    // that trained its own has its own.
    for member in &members[1..] {
        assert!(member.shares_centroid_tables_with(&members[0]));
    }
    assert!(!whole.shares_centroid_tables_with(&members[0]));
    let probes: Vec<SharedProbe<'_, MemorySource>> = members
        .iter()
        .map(|segment| SharedProbe {
            segment,
            filter: None,
        })
        .collect();
    let mut scratch = SearchScratch::new();
    let mut params = SearchParams::new(10);
    params.nprobe = Some(8);
    let (mut found, mut scanned_shared, mut scanned_whole) = (0usize, 0usize, 0usize);
    for query in queries.chunks_exact(dim) {
        let exact: Vec<u64> = whole
            .flat_search(query, 10, None, &mut scratch)
            .unwrap()
            .into_iter()
            .map(|hit| ids(&whole, hit.row))
            .collect();
        whole.search(query, &params, None, &mut scratch).unwrap();
        scanned_whole += scratch.stats.rows_scanned;
        let shared = search_shared(&probes, query, &params, &mut scratch).unwrap();
        scanned_shared += scratch.stats.rows_scanned;
        assert_eq!(shared.len(), 10);
        for pair in shared.windows(2) {
            assert!(pair[0].1.score >= pair[1].1.score, "best first");
        }
        found += shared
            .iter()
            .filter(|(member, hit)| exact.contains(&ids(&members[*member], hit.row)))
            .count();
    }
    let recall = found as f64 / (queries.len() / dim * 10) as f64;
    assert!(recall >= 0.9, "shared search recall {recall}");
    // The shared search scans the probed lists of the shard once: the rows of
    // `nprobe` lists, as one segment of every row would (its lists differ, so
    // only about the same), not `nprobe` lists per member.
    let ratio = scanned_shared as f64 / scanned_whole as f64;
    assert!(
        (0.5..2.0).contains(&ratio),
        "shared scanned {scanned_shared} rows, one segment {scanned_whole}"
    );
}

#[test]
fn segments_of_different_codebooks_are_refused_together() {
    let dim = 32;
    let (base, queries) = clustered(2_000, 1, dim, 10, 3);
    let a = build_with(&base[..1_000 * dim], dim, 0, None);
    let b = build_with(&base[1_000 * dim..], dim, 1_000, None);
    assert_ne!(a.header().codebook, b.header().codebook);
    let probes = [
        SharedProbe {
            segment: &a,
            filter: None,
        },
        SharedProbe {
            segment: &b,
            filter: None,
        },
    ];
    let error = search_shared(
        &probes,
        &queries,
        &SearchParams::new(5),
        &mut SearchScratch::new(),
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("do not share one codebook"),
        "{error}"
    );
}

#[test]
fn a_codebook_of_another_dimension_is_refused() {
    let (base, _) = clustered(500, 0, 16, 4, 1);
    let first = build_with(&base, 16, 0, None);
    let codebook = Arc::new(Codebook::of_segment(&first).unwrap().unwrap());
    let mut spec = SegmentSpec::new(32, Metric::Cosine, IdType::U64);
    spec.build.codebook = Some(codebook);
    let mut writer = SegmentWriter::new(spec).unwrap();
    writer.add(PointId::U64(1), &[0.5; 32], None).unwrap();
    let error = writer.finish(&mut Vec::new(), &|_, _, _| {}).unwrap_err();
    assert!(error.to_string().contains("dimension 16"), "{error}");
}

#[test]
fn a_segment_smaller_than_the_codebook_keeps_its_lists_and_finds_its_rows() {
    let dim = 32;
    let (base, _) = clustered(3_000, 0, dim, 12, 9);
    let first = build_with(&base, dim, 0, None);
    let codebook = Arc::new(Codebook::of_segment(&first).unwrap().unwrap());
    // Five rows over every list of the codebook: most lists are empty.
    let small = build_with(&base[..5 * dim], dim, 10_000, Some(codebook.clone()));
    assert_eq!(small.header().nlist, codebook.nlist());
    let mut scratch = SearchScratch::new();
    let hits = small
        .search(&base[..dim], &SearchParams::new(3), None, &mut scratch)
        .unwrap();
    assert_eq!(ids(&small, hits[0].row), 10_000, "a row is its own nearest");
}

#[test]
fn every_row_of_the_segment_that_trained_a_codebook_is_found_by_its_own_vector() {
    // Clusters of uneven sizes, more of them than lists: the trained build caps
    // overfull lists, and its centroids move to their lists' means. A row left
    // outside the list of its nearest centroid was not found by the narrowest
    // probe (the nearest list; what clustered data calibrates to), not even
    // searched for by its own vector, while a build given the codebook put it
    // back in that list and found it.
    let dim = 32;
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let centres: Vec<f32> = (0..400 * dim)
        .map(|_| rand::Rng::random_range(&mut rng, -1.0f32..1.0))
        .collect();
    let mut base = Vec::new();
    for row in 0..8000usize {
        let centre = (row * row / 7 + row) % 400;
        base.extend(
            (0..dim).map(|d| {
                centres[centre * dim + d] + rand::Rng::random_range(&mut rng, -0.1f32..0.1)
            }),
        );
    }
    let trained = build(&base, dim, Metric::L2, |_| {});
    let codebook = Arc::new(Codebook::of_segment(&trained).unwrap().unwrap());
    let given = build(&base, dim, Metric::L2, |spec| {
        spec.build.codebook = Some(codebook)
    });
    let mut params = SearchParams::new(10);
    params.probe_ratio = Some(0.0);
    let mut scratch = SearchScratch::new();
    for (name, segment) in [("trained", &trained), ("given the codebook", &given)] {
        let mut missed = Vec::new();
        for (row, vector) in base.chunks_exact(dim).enumerate() {
            let hits = segment.search(vector, &params, None, &mut scratch).unwrap();
            if !hits.iter().any(|hit| ids(segment, hit.row) == row as u64) {
                missed.push(row);
            }
        }
        assert!(
            missed.is_empty(),
            "{name}: {} of 8000 rows not found by their own vector, e.g. {:?}",
            missed.len(),
            &missed[..missed.len().min(5)]
        );
    }
}
