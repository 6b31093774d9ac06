//! Filters evaluated on a segment's columns agree with the same filter applied
//! to each row's stored payload, and filtered searches return only matches.

use quiver_index::{Filter, MemorySource, SearchParams, SearchScratch, Segment};

use crate::data::small_segment_bytes;

#[test]
fn segment_bitmaps_agree_with_payload_evaluation() {
    let bytes = small_segment_bytes();
    let segment = Segment::open(MemorySource::new("filters.qseg", &bytes)).unwrap();
    let schema = segment.header().fields.clone();
    let payloads: Vec<serde_json::Value> = (0..segment.rows() as u32)
        .map(|row| segment.payload(row).unwrap().unwrap())
        .collect();
    for text in [
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
    ] {
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
