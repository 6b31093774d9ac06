//! Damaged segments: every flipped byte or cut is an error naming the object, never
//! a panic and never a wrong answer.

use proptest::prelude::*;
use quiver_index::{
    IndexErrorKind, MemorySource, SearchParams, SearchScratch, SectionKind, Segment,
};

use crate::data::small_segment_bytes;

/// Opens and fully exercises a segment; returns the first error.
fn exercise(bytes: &[u8]) -> Result<Vec<u32>, quiver_index::IndexError> {
    let segment = Segment::open(MemorySource::new("bucket/seg-1.qseg", bytes))?;
    let mut scratch = SearchScratch::new();
    let query = vec![0.5f32; 24];
    let mut rows = Vec::new();
    let params = SearchParams {
        nprobe: Some(8),
        ..SearchParams::new(5)
    };
    for hit in segment.search(&query, &params, None, &mut scratch)? {
        segment.id(hit.row)?;
        segment.payload(hit.row)?;
        rows.push(hit.row);
    }
    for hit in segment.flat_search(&query, 5, None, &mut scratch)? {
        rows.push(hit.row);
    }
    for row in 0..segment.rows() as u32 {
        let id = segment.id(row)?;
        segment.payload(row)?;
        if segment.row_of(&id)? != Some(row) {
            rows.push(u32::MAX);
        }
    }
    segment.field_column("color")?;
    Ok(rows)
}

#[test]
fn intact_segment_passes() {
    exercise(&small_segment_bytes()).unwrap();
}

#[test]
fn truncated_segments_are_rejected() {
    let bytes = small_segment_bytes();
    for cut in [
        0,
        1,
        31,
        32,
        100,
        4096,
        bytes.len() / 2,
        bytes.len() - 33,
        bytes.len() - 1,
    ] {
        let error = exercise(&bytes[..cut]).unwrap_err();
        assert_eq!(
            error.kind(),
            IndexErrorKind::Corrupted,
            "cut at {cut}: {error}"
        );
        assert!(
            error.to_string().contains("bucket/seg-1.qseg"),
            "error names the object: {error}"
        );
    }
}

#[test]
fn wrong_version_is_named() {
    let mut bytes = small_segment_bytes();
    let at = bytes.len() - 16;
    bytes[at..at + 4].copy_from_slice(&7u32.to_le_bytes());
    let error = exercise(&bytes).unwrap_err();
    assert!(error.to_string().contains("format version 7"), "{error}");
}

#[test]
fn a_flip_in_every_section_is_detected() {
    let bytes = small_segment_bytes();
    let segment = Segment::open(MemorySource::new("probe", &bytes)).unwrap();
    let sections: Vec<_> = segment.sections().to_vec();
    for entry in sections {
        if entry.length == 0 {
            continue;
        }
        for position in [0, entry.length / 2, entry.length - 1] {
            let mut damaged = bytes.clone();
            damaged[(entry.offset + position) as usize] ^= 0x10;
            let error = exercise(&damaged).expect_err(&format!(
                "flip in {} at {position} went unnoticed",
                entry.kind.name()
            ));
            assert_eq!(error.kind(), IndexErrorKind::Corrupted, "{error}");
            if entry.kind != SectionKind::ChunkChecksums {
                assert!(error.to_string().contains("bucket/seg-1.qseg"), "{error}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Any single damaged byte anywhere: an error, or (padding bytes) the same answer.
    #[test]
    fn random_damage_never_changes_an_answer(position in any::<prop::sample::Index>(), flip in 1u8..=255) {
        let bytes = small_segment_bytes();
        let expected = exercise(&bytes).unwrap();
        let mut damaged = bytes.clone();
        let at = position.index(damaged.len());
        damaged[at] ^= flip;
        match exercise(&damaged) {
            Ok(rows) => prop_assert_eq!(rows, expected, "damage at {} changed the answer", at),
            Err(error) => prop_assert_eq!(error.kind(), IndexErrorKind::Corrupted),
        }
    }
}
