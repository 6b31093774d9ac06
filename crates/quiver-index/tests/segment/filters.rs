//! Filters evaluated on a segment's columns agree with the same filter applied
//! to each row's stored payload, and filtered searches return only matches.

use quiver_index::{Filter, MemorySource, SearchParams, SearchScratch, Segment};

use crate::data::small_segment_bytes;

/// Filters over the fields of [`small_segment_bytes`]: every operator, missing values.
const COLUMN_FILTERS: &[&str] = &[
    r#"color = "red""#,
    r#"color != "red""#,
    r#"color >= "green""#,
    r#"color in ["red", "blue"]"#,
    r#"color not in ["red", "purple"]"#,
    "price < 70",
    "price >= 10.5 and price <= 20",
    "weight > 100.0",
    "weight != 1.75",
    "weight = 0",
    "sale = true",
    "sale != false or price = 3",
    r#"not (color = "green" and sale = true) and price < 300"#,
    "price = 9999",
];

#[test]
fn segment_bitmaps_agree_with_payload_evaluation() {
    let bytes = small_segment_bytes();
    let segment = Segment::open(MemorySource::new("filters.qseg", &bytes)).unwrap();
    let schema = segment.header().fields.clone();
    let payloads: Vec<serde_json::Value> = (0..segment.rows() as u32)
        .map(|row| segment.payload(row).unwrap().unwrap())
        .collect();
    for text in COLUMN_FILTERS {
        let filter = Filter::parse(text).unwrap();
        filter.check(&schema).unwrap();
        let rows = filter.rows(&segment).unwrap();
        let expected: Vec<u32> = payloads
            .iter()
            .enumerate()
            .filter(|(_, payload)| filter.matches_payload(Some(payload)))
            .map(|(row, _)| row as u32)
            .collect();
        assert_eq!(rows.iter().collect::<Vec<_>>(), expected, "{text}");
    }
    // A selective filter: a search restricted to its rows returns only them.
    let filter = Filter::parse("price < 35").unwrap();
    let allowed = filter.rows(&segment).unwrap();
    assert_eq!(allowed.len(), 35);
    let query: Vec<f32> = segment.vector(3).unwrap();
    let mut scratch = SearchScratch::new();
    let params = SearchParams {
        nprobe: Some(8),
        ..SearchParams::new(10)
    };
    let allows = |row: u32| allowed.contains(row);
    let hits = segment
        .search(&query, &params, Some(&allows), &mut scratch)
        .unwrap();
    assert_eq!(hits.len(), 10);
    assert!(hits.iter().all(|hit| allowed.contains(hit.row)));
}

/// A payload for row `row` of [`undeclared_segment`]: mixed types, missing and
/// null values, rows without a payload and one row larger than a scan window.
fn undeclared_payload(row: usize) -> Option<serde_json::Value> {
    if row.is_multiple_of(11) {
        return None;
    }
    let color = ["red", "green", "blue"][row % 3];
    let mut payload = serde_json::json!({
        "color": color,
        "price": row as i64,
        "sale": row.is_multiple_of(2),
        "tags": ["a", "b"],
        "nested": {"color": "red"},
    });
    if !row.is_multiple_of(7) {
        payload["weight"] = serde_json::json!(row as f64 * 0.25);
    }
    if row.is_multiple_of(13) {
        payload["color"] = serde_json::Value::Null;
    }
    if row.is_multiple_of(17) {
        // The same key with another type in some rows.
        payload["price"] = serde_json::json!(row.to_string());
    }
    // Numbers beyond i64 among fractions.
    payload["big"] = if row.is_multiple_of(19) {
        serde_json::json!(u64::MAX)
    } else {
        serde_json::json!(row as f64 + 0.5)
    };
    if row == 4_500 {
        // Larger than a scan window (4 MiB) on its own.
        payload["blob"] = serde_json::json!("x".repeat(5 << 20));
    }
    Some(payload)
}

/// 9,000 rows (three scan windows of offsets) written with no payload schema.
fn undeclared_segment() -> Vec<u8> {
    use quiver_index::{IdType, Metric, PointId, SegmentSpec, SegmentWriter};
    let dim = 8;
    let (vectors, _) = crate::data::clustered(9_000, 0, dim, 4, 23);
    let mut spec = SegmentSpec::new(dim, Metric::L2, IdType::U64);
    spec.build.nlist = Some(8);
    let mut writer = SegmentWriter::new(spec).unwrap();
    for (row, vector) in vectors.chunks_exact(dim).enumerate() {
        writer
            .add(
                PointId::U64(row as u64),
                vector,
                undeclared_payload(row).as_ref(),
            )
            .unwrap();
    }
    let mut bytes = Vec::new();
    writer.finish(&mut bytes, &|_, _, _| {}).unwrap();
    bytes
}

#[test]
fn fields_without_a_column_are_read_from_the_payloads() {
    let bytes = undeclared_segment();
    let segment = Segment::open(MemorySource::new("undeclared.qseg", &bytes)).unwrap();
    assert!(segment.header().fields.is_empty());
    // Rows are stored in list order: each row's payload as the segment has it.
    let payloads: Vec<Option<serde_json::Value>> = (0..segment.rows() as u32)
        .map(|row| segment.payload(row).unwrap())
        .collect();
    assert_eq!(
        payloads.iter().filter(|payload| payload.is_none()).count(),
        819
    );
    for text in COLUMN_FILTERS.iter().chain(&[
        r#"price = "34""#,
        r#"blob = "x""#,
        r#"tags = "a""#,
        r#"nested = "red""#,
        r#"nested.color = "red""#,
        r#"nested.color != "red" or n.a = 1"#,
        "missing = 1",
        "missing != 1",
        "big > 1e18",
        "big <= 100",
        "big = 10.5",
        "big in [11.5, 12]",
        "price > 8990",
    ]) {
        let filter = Filter::parse(text).unwrap();
        filter.check(&[]).unwrap();
        let rows = filter.rows(&segment).unwrap();
        let expected: Vec<u32> = payloads
            .iter()
            .enumerate()
            .filter(|(_, payload)| filter.matches_payload(payload.as_ref()))
            .map(|(row, _)| row as u32)
            .collect();
        assert_eq!(rows.iter().collect::<Vec<_>>(), expected, "{text}");
    }
    // The same through values kept between filters, as a searcher does.
    let kept: Vec<(&str, quiver_index::FieldValues)> = ["price", "color"]
        .into_iter()
        .map(|field| (field, segment.field_values(field).unwrap()))
        .collect();
    assert!(kept.iter().all(|(_, values)| values.scanned()));
    let filter = Filter::parse(r#"price < 300 and color = "blue""#).unwrap();
    let lookup = |field: &str| {
        kept.iter()
            .find(|(name, _)| *name == field)
            .map(|(_, values)| values)
    };
    assert_eq!(
        filter.rows_of(segment.rows() as u32, &lookup),
        filter.rows(&segment).unwrap()
    );
    assert!(!filter.rows(&segment).unwrap().is_empty());
    // The row larger than a scan window is read, and those around it.
    let filter = Filter::parse(r#"blob >= "x" or price = 4095 or price = 8999"#).unwrap();
    let ids: Vec<quiver_index::PointId> = filter
        .rows(&segment)
        .unwrap()
        .iter()
        .map(|row| segment.id(row).unwrap())
        .collect();
    let mut ids: Vec<u64> = ids
        .into_iter()
        .map(|id| match id {
            quiver_index::PointId::U64(id) => id,
            other => panic!("{other:?}"),
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![4095, 4500, 8999]);
}

#[test]
fn a_declared_column_and_a_scan_of_the_same_payloads_agree() {
    let declared = small_segment_bytes();
    let declared = Segment::open(MemorySource::new("declared.qseg", &declared)).unwrap();
    let undeclared = crate::data::small_segment_bytes_with(|mut spec| {
        spec.fields.clear();
        quiver_index::SegmentWriter::new(spec).unwrap()
    });
    let undeclared = Segment::open(MemorySource::new("undeclared.qseg", &undeclared)).unwrap();
    assert!(undeclared.header().fields.is_empty());
    assert!(!declared.field_values("price").unwrap().scanned());
    assert!(undeclared.field_values("price").unwrap().scanned());
    for text in [
        r#"color = "red" and weight != 1.75"#,
        r#"color not in ["red"] or sale = true"#,
        "price > 3.5 and price < 600 and not weight < 20",
    ] {
        let filter = Filter::parse(text).unwrap();
        assert_eq!(
            filter.rows(&declared).unwrap(),
            filter.rows(&undeclared).unwrap(),
            "{text}"
        );
    }
}
