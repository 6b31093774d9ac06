//! Every section written comes back as written.

use quiver_index::{
    FieldValue, IdType, IndexErrorKind, MemorySource, Metric, MmapSource, PointId, SearchParams,
    SearchScratch, Segment, SegmentSpec, SegmentWriter,
};

use crate::data::{clustered, small_segment_bytes, small_segment_bytes_with};

#[test]
fn a_writer_spilling_rows_to_scratch_files_writes_the_same_segment() {
    let directory = tempfile::tempdir().unwrap();
    let spilled = small_segment_bytes_with(|spec| {
        SegmentWriter::with_scratch_dir(spec, directory.path()).unwrap()
    });
    assert!(spilled == small_segment_bytes(), "byte for byte");
    // Its scratch files are unnamed: nothing is left behind.
    assert_eq!(std::fs::read_dir(directory.path()).unwrap().count(), 0);
}

#[test]
fn a_writer_without_its_scratch_directory_names_it() {
    let spec = SegmentSpec::new(8, Metric::L2, IdType::U64);
    let error = SegmentWriter::with_scratch_dir(spec, std::path::Path::new("/nonexistent/scratch"))
        .err()
        .expect("no such directory");
    assert_eq!(error.kind(), IndexErrorKind::Io);
    assert!(
        error.to_string().contains("/nonexistent/scratch"),
        "{error}"
    );
}

#[test]
fn ids_payloads_vectors_fields_and_lookup_round_trip() {
    let bytes = small_segment_bytes();
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("small.qseg");
    std::fs::write(&path, &bytes).unwrap();
    let segment = Segment::open(MmapSource::open(&path).unwrap()).unwrap();
    segment.verify().unwrap();
    assert_eq!(segment.rows(), 700);
    assert_eq!(segment.header().nlist, 8);
    assert_eq!(segment.header().id_type, IdType::String);
    let color = segment
        .field_column("color")
        .unwrap()
        .expect("color column");
    let price = segment
        .field_column("price")
        .unwrap()
        .expect("price column");
    let weight = segment.field_column("weight").unwrap().expect("weight");
    let sale = segment.field_column("sale").unwrap().expect("sale");
    assert!(segment.field_column("missing").unwrap().is_none());
    let (vectors, _) = clustered(700, 0, 24, 5, 17);
    let all_ids = segment.ids().unwrap();
    assert_eq!(all_ids.len(), 700);
    for (row, id) in all_ids.iter().enumerate() {
        assert_eq!(&segment.id(row as u32).unwrap(), id);
    }
    for input in 0..700u32 {
        let id = PointId::String(format!("doc-{input}"));
        let row = segment.row_of(&id).unwrap().expect("every id is found");
        assert_eq!(segment.id(row).unwrap(), id);
        let payload = segment.payload(row).unwrap().expect("payload");
        assert_eq!(payload["price"], input as i64);
        assert_eq!(
            price.value(row as usize),
            Some(FieldValue::Integer(input as i64))
        );
        let expected_weight = (input % 7 != 0).then_some(FieldValue::Float(input as f64 * 0.25));
        assert_eq!(weight.value(row as usize), expected_weight);
        assert_eq!(
            sale.value(row as usize),
            Some(FieldValue::Bool(input % 2 == 0))
        );
        let expected_color = ["red", "green", "blue"][input as usize % 3];
        assert_eq!(
            color.value(row as usize),
            Some(FieldValue::Keyword(expected_color.into()))
        );
        // Cosine segments store normalised vectors.
        let original = &vectors[input as usize * 24..][..24];
        let norm = original.iter().map(|v| v * v).sum::<f32>().sqrt();
        let stored = segment.vector(row).unwrap();
        for (a, b) in stored.iter().zip(original) {
            assert!((a - b / norm).abs() < 1e-6);
        }
    }
    assert!(
        segment
            .row_of(&PointId::String("doc-700".into()))
            .unwrap()
            .is_none()
    );
    assert!(
        segment
            .row_of(&PointId::String("a".into()))
            .unwrap()
            .is_none()
    );
}

#[test]
fn u64_ids_round_trip_and_exact_match_is_first() {
    let dim = 16;
    let (vectors, _) = clustered(2_000, 0, dim, 4, 3);
    let mut writer = SegmentWriter::new(SegmentSpec::new(dim, Metric::L2, IdType::U64)).unwrap();
    for (row, vector) in vectors.chunks_exact(dim).enumerate() {
        writer
            .add(PointId::U64(row as u64 * 1_000_003), vector, None)
            .unwrap();
    }
    let mut bytes = Vec::new();
    let summary = writer.finish(&mut bytes, &|_, _, _| {}).unwrap();
    assert_eq!(summary.file_bytes, bytes.len() as u64);
    let segment = Segment::open(MemorySource::new("u64.qseg", &bytes)).unwrap();
    let all_ids = segment.ids().unwrap();
    assert_eq!(all_ids.len() as u64, segment.rows());
    for (row, id) in all_ids.iter().enumerate().step_by(37) {
        assert_eq!(&segment.id(row as u32).unwrap(), id);
    }
    let mut scratch = SearchScratch::new();
    for input in (0..2_000u64).step_by(97) {
        let row = segment
            .row_of(&PointId::U64(input * 1_000_003))
            .unwrap()
            .unwrap();
        assert_eq!(segment.id(row).unwrap(), PointId::U64(input * 1_000_003));
        assert!(segment.payload(row).unwrap().is_none());
        let query = &vectors[input as usize * dim..][..dim];
        let hits = segment
            .search(query, &SearchParams::new(1), None, &mut scratch)
            .unwrap();
        assert_eq!(hits[0].row, row, "a stored vector finds itself");
        assert!(hits[0].score.abs() < 1e-4);
    }
    assert!(segment.row_of(&PointId::U64(7)).unwrap().is_none());
}

#[test]
fn bad_rows_are_rejected_and_leave_nothing_behind() {
    let mut spec = SegmentSpec::new(4, Metric::Cosine, IdType::U64);
    spec.fields = vec![quiver_index::FieldSpec {
        name: "n".into(),
        kind: quiver_index::FieldKind::Integer,
    }];
    let mut writer = SegmentWriter::new(spec).unwrap();
    let wrong_dim = writer
        .add(PointId::U64(1), &[1.0, 2.0, 3.0], None)
        .unwrap_err();
    assert!(
        wrong_dim.to_string().contains("dimension 3, expected 4"),
        "{wrong_dim}"
    );
    let nan = writer
        .add(PointId::U64(1), &[1.0, f32::NAN, 3.0, 4.0], None)
        .unwrap_err();
    assert!(
        nan.to_string().contains("non-finite value at position 1"),
        "{nan}"
    );
    let zero = writer.add(PointId::U64(1), &[0.0; 4], None).unwrap_err();
    assert_eq!(zero.kind(), IndexErrorKind::InvalidArgument);
    let wrong_id = writer
        .add(PointId::String("x".into()), &[1.0; 4], None)
        .unwrap_err();
    assert!(
        wrong_id.to_string().contains("unsigned integers"),
        "{wrong_id}"
    );
    let bad_field = writer
        .add(
            PointId::U64(1),
            &[1.0; 4],
            Some(&serde_json::json!({"n": "seven"})),
        )
        .unwrap_err();
    assert!(bad_field.to_string().contains("\"n\""), "{bad_field}");
    assert!(writer.is_empty());
    writer.add(PointId::U64(1), &[1.0; 4], None).unwrap();
    writer.add(PointId::U64(1), &[2.0; 4], None).unwrap();
    let duplicate = writer.finish(&mut Vec::new(), &|_, _, _| {}).unwrap_err();
    assert!(
        duplicate.to_string().contains("id 1 appears twice"),
        "{duplicate}"
    );
}

#[test]
fn query_errors_name_the_problem() {
    let bytes = small_segment_bytes();
    let segment = Segment::open(MemorySource::new("small", &bytes)).unwrap();
    let mut scratch = SearchScratch::new();
    let error = segment
        .search(&[1.0; 5], &SearchParams::new(3), None, &mut scratch)
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("query has dimension 5, the segment has dimension 24"),
        "{error}"
    );
    let mut query = vec![1.0; 24];
    query[3] = f32::INFINITY;
    let error = segment
        .search(&query, &SearchParams::new(3), None, &mut scratch)
        .unwrap_err();
    assert!(error.to_string().contains("position 3"), "{error}");
}
