use super::*;

const SHARD: &str = "7/0";

fn segment(id: &str) -> SegmentEntry {
    SegmentEntry::new(id.into(), format!("k/{id}"), 10, 100, &Default::default())
}

fn wal(sequence: u64) -> WalEntry {
    WalEntry {
        position: WalPosition { epoch: 1, sequence },
        key: format!("w/{sequence}"),
        rows: 1,
    }
}

fn no_gc(_: &str) -> bool {
    false
}

fn manifest_with_tail() -> Manifest {
    let mut manifest = Manifest::default();
    for sequence in 1..=3 {
        manifest.commit_wal(&SHARD, wal(sequence), no_gc).unwrap();
    }
    manifest
}

#[test]
fn changes_apply_atomically_or_not_at_all() {
    let mut manifest = manifest_with_tail();
    apply_change(
        &mut manifest,
        &SHARD,
        &ManifestChange {
            add_segments: vec![segment("a")],
            ..Default::default()
        },
        no_gc,
    )
    .unwrap();
    assert_eq!(manifest.version, 4);
    let deletes = DeletesEntry {
        key: "d/a-1".into(),
        version: 1,
        deleted_rows: 2,
    };
    let change = ManifestChange {
        add_segments: vec![segment("b")],
        set_deletes: vec![("a".into(), deletes.clone())],
        trim_wal_through: Some(WalPosition {
            epoch: 1,
            sequence: 2,
        }),
        ..Default::default()
    };
    let outcome = apply_change(&mut manifest, &SHARD, &change, no_gc).unwrap();
    assert_eq!(
        outcome,
        ChangeOutcome::Applied {
            retired_keys: vec!["w/1".into(), "w/2".into()]
        }
    );
    assert_eq!(manifest.version, 5);
    assert_eq!(manifest.segments.len(), 2);
    assert_eq!(manifest.segments[0].deletes, Some(deletes));
    assert_eq!(manifest.segments[0].live_rows(), 8);
    assert_eq!(manifest.wal_tail, vec![wal(3)]);
    assert_eq!(
        apply_change(&mut manifest, &SHARD, &change, no_gc).unwrap(),
        ChangeOutcome::Duplicate,
        "a retried change is recognised"
    );
    assert_eq!(manifest.version, 5);

    let before = manifest.clone();
    for bad in [
        ManifestChange {
            remove_segments: vec!["zzz".into()],
            ..Default::default()
        },
        ManifestChange {
            add_segments: vec![segment("a")],
            remove_segments: vec!["b".into()],
            ..Default::default()
        },
        ManifestChange {
            remove_segments: vec!["a".into()],
            set_deletes: vec![("a".into(), before.segments[0].deletes.clone().unwrap())],
            ..Default::default()
        },
        ManifestChange {
            set_deletes: vec![("a".into(), before.segments[0].deletes.clone().unwrap())],
            ..Default::default()
        },
        ManifestChange {
            trim_wal_through: Some(WalPosition {
                epoch: 1,
                sequence: 9,
            }),
            ..Default::default()
        },
        ManifestChange {
            retire_keys: vec!["k/a".into()],
            ..Default::default()
        },
    ] {
        let error = apply_change(&mut manifest, &SHARD, &bad, no_gc).unwrap_err();
        assert!(error.message.contains(SHARD), "{error}");
        assert_eq!(manifest, before, "a refused change changes nothing");
    }
    let error = apply_change(
        &mut manifest,
        &SHARD,
        &ManifestChange {
            add_segments: vec![segment("c")],
            ..Default::default()
        },
        |key| key == "k/c",
    )
    .unwrap_err();
    assert_eq!(error.code, ErrorCode::FailedPrecondition);
    assert!(error.message.contains("gc list"), "{error}");
}

#[test]
fn segments_stay_in_id_order() {
    let mut manifest = Manifest::default();
    for id in ["m", "c", "x", "a"] {
        apply_change(
            &mut manifest,
            &SHARD,
            &ManifestChange {
                add_segments: vec![segment(id)],
                ..Default::default()
            },
            no_gc,
        )
        .unwrap();
    }
    let ids: Vec<&str> = manifest
        .segments
        .iter()
        .map(|segment| segment.segment_id.as_str())
        .collect();
    assert_eq!(ids, ["a", "c", "m", "x"]);
    assert_eq!(manifest.segment("m").map(|segment| segment.rows), Some(10));
    assert!(manifest.segment("b").is_none());
}

#[test]
fn wal_commits_are_idempotent_and_ordered() {
    let mut manifest = manifest_with_tail();
    assert_eq!(
        manifest.commit_wal(&SHARD, wal(3), no_gc),
        Ok(WalCommit::Duplicate)
    );
    let mut other_key = wal(3);
    other_key.key = "w/other".into();
    assert!(manifest.commit_wal(&SHARD, other_key, no_gc).is_err());
    apply_change(
        &mut manifest,
        &SHARD,
        &ManifestChange {
            add_segments: vec![segment("a")],
            trim_wal_through: Some(WalPosition {
                epoch: 1,
                sequence: 2,
            }),
            ..Default::default()
        },
        no_gc,
    )
    .unwrap();
    assert_eq!(
        manifest.commit_wal(&SHARD, wal(1), no_gc),
        Ok(WalCommit::Duplicate),
        "a late retry of a trimmed batch"
    );
    let version = manifest.version;
    assert_eq!(
        manifest.commit_wal(&SHARD, wal(4), |key| key == "w/4"),
        Err(ManifestError::failed(format!(
            "wal object `w/4` of shard {SHARD} is on the gc list"
        )))
    );
    assert_eq!(
        manifest.commit_wal(&SHARD, wal(4), no_gc),
        Ok(WalCommit::Appended)
    );
    assert_eq!(manifest.version, version + 1);
    assert_eq!(
        manifest.last_committed,
        Some(WalPosition {
            epoch: 1,
            sequence: 4
        })
    );
}

/// The serde form is the metadata service's Raft log and snapshot format.
#[test]
fn the_serde_form_is_the_catalogs() {
    let mut manifest = manifest_with_tail();
    let mut with_deletes = segment("a");
    with_deletes.deletes = Some(DeletesEntry {
        key: "d/a".into(),
        version: 2,
        deleted_rows: 1,
    });
    with_deletes.default_nprobe = Some(8);
    with_deletes.probe_ratio_milli = Some(680);
    with_deletes.wide_nprobe = Some(40);
    with_deletes.wide_probe_ratio_milli = Some(1250);
    with_deletes.calibrated_rows = Some(240_000);
    manifest.segments = vec![with_deletes, segment("b")];
    manifest.last_committed = None;
    let json = serde_json::to_string(&manifest).unwrap();
    assert_eq!(
        json,
        r#"{"version":3,"segments":{"a":{"segment_id":"a","object_key":"k/a","rows":10,"size_bytes":100,"deletes":{"object_key":"d/a","version":2,"deleted_rows":1},"default_nprobe":8,"probe_ratio_milli":680,"wide_nprobe":40,"wide_probe_ratio_milli":1250,"calibrated_rows":240000},"b":{"segment_id":"b","object_key":"k/b","rows":10,"size_bytes":100,"deletes":null,"default_nprobe":0}},"wal_tail":[{"epoch":1,"seq":1,"object_key":"w/1","rows":1},{"epoch":1,"seq":2,"object_key":"w/2","rows":1},{"epoch":1,"seq":3,"object_key":"w/3","rows":1}]}"#
    );
    assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap(), manifest);
    let change = ManifestChange {
        remove_segments: vec!["a".into()],
        trim_wal_through: Some(WalPosition {
            epoch: 1,
            sequence: 2,
        }),
        retire_keys: vec!["x".into()],
        ..Default::default()
    };
    let json = serde_json::to_string(&change).unwrap();
    assert_eq!(
        json,
        r#"{"add_segments":[],"remove_segment_ids":["a"],"set_deletes":[],"trim_wal_through":[1,2],"gc_keys":["x"]}"#
    );
    assert_eq!(
        serde_json::from_str::<ManifestChange>(&json).unwrap(),
        change
    );
}

#[test]
fn new_default_probes_apply_to_live_segments_only() {
    let mut manifest = manifest_with_tail();
    let add = |id: &str| ManifestChange {
        add_segments: vec![segment(id)],
        ..Default::default()
    };
    apply_change(&mut manifest, &SHARD, &add("a"), no_gc).unwrap();
    apply_change(&mut manifest, &SHARD, &add("b"), no_gc).unwrap();
    let probes = SegmentProbes {
        default_nprobe: Some(41),
        probe_ratio_milli: Some(187),
        wide_nprobe: Some(300),
        wide_probe_ratio_milli: None,
        calibrated_rows: Some(200_000),
    };
    let set = |ids: &[&str]| ManifestChange {
        set_probes: ids.iter().map(|id| (id.to_string(), probes)).collect(),
        ..Default::default()
    };
    let before = manifest.clone();
    // A segment that is not live, or one named twice: nothing applies.
    for (change, code) in [
        (set(&["a", "gone"]), ErrorCode::FailedPrecondition),
        (set(&["a", "a"]), ErrorCode::InvalidArgument),
        (
            ManifestChange {
                remove_segments: vec!["b".into()],
                ..set(&["b"])
            },
            ErrorCode::FailedPrecondition,
        ),
    ] {
        let error = apply_change(&mut manifest, &SHARD, &change, no_gc).unwrap_err();
        assert_eq!(error.code, code, "{error:?}");
        assert_eq!(manifest, before);
    }
    apply_change(&mut manifest, &SHARD, &set(&["a", "b"]), no_gc).unwrap();
    assert_eq!(manifest.version, before.version + 1);
    for id in ["a", "b"] {
        let entry = manifest.segment(id).unwrap();
        assert_eq!(entry.probes(), probes);
        assert_eq!(entry.key, format!("k/{id}"), "the rest of the entry stays");
    }
    // Serialized only when there are some: older changes read the same.
    let json = serde_json::to_string(&set(&["a"])).unwrap();
    assert!(
        json.contains(r#""set_probes":[["a",{"default_nprobe":41"#),
        "{json}"
    );
    assert_eq!(
        serde_json::from_str::<ManifestChange>(&json).unwrap(),
        set(&["a"])
    );
    assert!(
        !serde_json::to_string(&add("c"))
            .unwrap()
            .contains("set_probes")
    );
}
