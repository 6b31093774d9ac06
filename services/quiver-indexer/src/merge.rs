//! The tiered merge policy (in the spirit of Lucene's): segments are grouped in
//! size tiers that grow by `merge_factor`; once a tier holds `merge_factor`
//! segments, its smallest ones are merged into one of the next tier. A segment
//! with many deleted rows is rewritten alone. Merges never exceed
//! `max_segment_rows`.
//!
//! One more merge keeps the shard's codebook sized for the shard: once the
//! shard holds more than `CODEBOOK_RETRAIN_GROWTH` times the rows its codebook
//! was trained on, every segment is merged into one, whose build trains a new
//! codebook on all of them. Lists trained on the first flush's 20k rows stay
//! 20k-sized otherwise, and a search of 100k rows then scans a third of them
//! for the recall one 100k-row codebook reaches scanning a seventh. The shard
//! is rewritten once per doubling (twice its final size in all), and every
//! later flush and merge shares the new codebook.
//!
//! And one more keeps the shard under one codebook: segments built with an older
//! codebook than the shard's (an L0 flushed while the merge that trained the new
//! one ran, or a shard whose refresh left the rest behind) are merged together
//! into one built with the current codebook — before a refresh, which would
//! take them in too but trains first (see `codebook_merge`). Searchers scan the
//! segments of one codebook as one index (one centroid ranking, one `nprobe`,
//! one top-k); each other codebook is another group, searched with its own
//! `nprobe`, which scans more rows for the same recall.

//!
//! And once a shard goes quiet — no write and no flush for
//! `consolidate_quiet_ms` — its segments are consolidated into one, when the
//! ones besides the largest hold at least `1 / CONSOLIDATE_MIN_SHARE` of its
//! rows. The tiered policy leaves a shard of 100k rows in two to four segments
//! of different tiers for good; a query then probes every list in each of them,
//! and each probe of a third of a list costs nearly what the whole list costs
//! (measured on real 100k × 384 in `quiver standalone`: 0.55–0.60 ms of server
//! CPU per query in three segments, 0.27 ms in one). The share bounds the
//! rewriting: a small flush into a large shard waits for the tiered merges.
//! A small shard (its largest segment at most `SMALL_SHARD_ROWS` live rows,
//! cheap to rewrite) is consolidated at a far smaller share, `1 /
//! SMALL_SHARD_SHARE`: a segment's probes cost about the same whatever its
//! rows, so even a flush of a twentieth of the rows costs a third more per
//! query (measured on real 100k × 384, 95k + 5k rows against one segment of
//! 100k: the engine alone 0.16–0.19 against 0.12–0.13 ms per query at nprobe
//! 200, `quiver-bench engine --segment-rows 95000 --shared-codebook`; `quiver
//! standalone` at c = 16 0.34–0.36 against 0.27–0.29 ms of server CPU). A load
//! whose last flush is small — the usual case — settled in two segments.

use crate::config::IndexerConfig;
use crate::segments::{CODEBOOK_RETRAIN_GROWTH, ShardIndex};

/// A quiet shard is consolidated when the segments besides its largest hold at
/// least 1 / this of the largest's live rows.
const CONSOLIDATE_MIN_SHARE: u64 = 8;

/// A shard whose largest segment holds at most this many live rows is small:
/// rewriting it takes seconds (100k × 384 with 2 KB payloads: 4 s).
const SMALL_SHARD_ROWS: u64 = 250_000;

/// A quiet small shard is consolidated when the segments besides its largest
/// hold at least 1 / this of the largest's live rows.
const SMALL_SHARD_SHARE: u64 = 64;

/// Share of deleted rows above which a segment is rewritten without them.
const REWRITE_DELETED_FRACTION: f64 = 0.3;

/// Segments to merge into one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MergePlan {
    pub segment_ids: Vec<String>,
    /// Tier of the result (names the merged segment).
    pub level: u32,
}

/// Returns the tier of a segment with `rows` live rows: 0 below the floor,
/// then one more per factor of `merge_factor`.
fn tier(rows: u64, config: &IndexerConfig) -> u32 {
    let floor = config.merge_floor_rows.max(1) as u64;
    if rows < floor {
        return 0;
    }
    let mut tier = 1;
    let mut bound = floor * config.merge_factor as u64;
    while rows >= bound {
        tier += 1;
        bound = bound.saturating_mul(config.merge_factor as u64);
    }
    tier
}

/// Returns the next merge to run, if any. `force` (an admin compaction) merges
/// every segment it can, however few.
pub(crate) fn plan_merges(
    index: &ShardIndex,
    config: &IndexerConfig,
    force: bool,
) -> Option<MergePlan> {
    let mut segments: Vec<(u64, u64, &str)> = index
        .entries()
        .map(|live| {
            (
                live.entry.live_rows() as u64,
                live.entry.rows as u64,
                live.entry.segment_id.as_str(),
            )
        })
        .collect();
    segments.sort_unstable();
    let max_rows = config.max_segment_rows as u64;

    if force {
        let mut chosen = Vec::new();
        let mut total = 0;
        for &(live, _, segment_id) in &segments {
            if total + live > max_rows {
                break;
            }
            total += live;
            chosen.push(segment_id.to_string());
        }
        let has_deletions = segments
            .iter()
            .any(|&(live, rows, id)| live < rows && chosen.iter().any(|c| c == id));
        if chosen.len() >= 2 || (chosen.len() == 1 && has_deletions) {
            return Some(MergePlan {
                level: tier(total, config),
                segment_ids: chosen,
            });
        }
        return None;
    }

    let current = index
        .codebook
        .as_ref()
        .filter(|_| config.codebook_refresh)
        .map(|codebook| (codebook.codebook.id(), codebook.codebook.trained_rows()));
    let codebook_of = |id: &str| index.segments.get(id).and_then(|live| live.codebook_id);
    if let Some(plan) = codebook_merge(&segments, current, codebook_of, config) {
        return Some(plan);
    }

    for tier_index in 0..=tier(max_rows, config) {
        let members: Vec<&(u64, u64, &str)> = segments
            .iter()
            .filter(|(live, _, _)| tier(*live, config) == tier_index)
            .collect();
        if members.len() < config.merge_factor {
            continue;
        }
        let chosen: Vec<&(u64, u64, &str)> =
            members.into_iter().take(config.merge_factor).collect();
        let total: u64 = chosen.iter().map(|(live, _, _)| live).sum();
        if total > max_rows {
            continue;
        }
        return Some(MergePlan {
            level: tier(total, config),
            segment_ids: chosen.iter().map(|(_, _, id)| id.to_string()).collect(),
        });
    }
    segments
        .iter()
        .find(|(live, rows, _)| {
            *rows > 0 && (*rows - *live) as f64 > REWRITE_DELETED_FRACTION * *rows as f64
        })
        .map(|&(live, _, segment_id)| MergePlan {
            level: tier(live, config),
            segment_ids: vec![segment_id.to_string()],
        })
}

/// Returns the merge that consolidates a quiet shard (see the module comment):
/// its segments, smallest first, as many as fit in `max_segment_rows`, when
/// there are at least two and the others hold at least `1 /
/// CONSOLIDATE_MIN_SHARE` of the largest's rows (`1 / SMALL_SHARD_SHARE` when
/// the largest has at most `SMALL_SHARD_ROWS`). Called only once the tiered
/// policy ([`plan_merges`]) has nothing to do.
pub(crate) fn plan_consolidation(index: &ShardIndex, config: &IndexerConfig) -> Option<MergePlan> {
    let mut segments: Vec<(u64, &str)> = index
        .entries()
        .map(|live| {
            (
                live.entry.live_rows() as u64,
                live.entry.segment_id.as_str(),
            )
        })
        .collect();
    segments.sort_unstable();
    let mut chosen = Vec::new();
    let mut total = 0;
    let mut largest = 0;
    for &(live, id) in &segments {
        if total + live > config.max_segment_rows as u64 {
            break;
        }
        total += live;
        largest = live;
        chosen.push(id.to_string());
    }
    let others = total - largest;
    let share = if largest <= SMALL_SHARD_ROWS {
        SMALL_SHARD_SHARE
    } else {
        CONSOLIDATE_MIN_SHARE
    };
    (chosen.len() >= 2 && others * share >= largest).then(|| MergePlan {
        level: tier(total, config),
        segment_ids: chosen,
    })
}

/// The merge that keeps the shard under one codebook sized for it, if one is
/// due, given the `current` codebook's id and trained rows: segments left under
/// older codebooks are re-encoded with the current one first, then a shard
/// that has outgrown it is merged whole into a new one. The re-encoding trains
/// nothing (444k rows of 768 dimensions took 40 s, the refresh of the whole 1M
/// rows 152 s), and until it is done every query searches those segments as
/// groups of their own: right after a 1M × 768 load, 578k rows under a codebook
/// trained on 106k cost 50k rows scanned per query for the 152 s a refresh
/// ahead of them took; one group of 1M rows under a codebook trained on 556k
/// scanned 5.9k (experiments item 45).
fn codebook_merge(
    segments: &[(u64, u64, &str)],
    current: Option<(u64, u64)>,
    codebook_of: impl Fn(&str) -> Option<u64>,
    config: &IndexerConfig,
) -> Option<MergePlan> {
    let (id, trained_rows) = current?;
    stale_codebook_merge(segments, Some(id), codebook_of, config)
        .or_else(|| codebook_refresh(segments, Some(trained_rows), config))
}

/// The merge of every segment `(live rows, rows, id)` when the shard has
/// outgrown the codebook trained on `trained_rows` (see the module comment).
fn codebook_refresh(
    segments: &[(u64, u64, &str)],
    trained_rows: Option<u64>,
    config: &IndexerConfig,
) -> Option<MergePlan> {
    let live: u64 = segments.iter().map(|(live, _, _)| live).sum();
    let outgrown = live > trained_rows? * CODEBOOK_RETRAIN_GROWTH;
    (outgrown && segments.len() >= 2 && live <= config.max_segment_rows as u64).then(|| MergePlan {
        level: tier(live, config),
        segment_ids: segments.iter().map(|(_, _, id)| id.to_string()).collect(),
    })
}

/// The merge of the segments `(live rows, rows, id)` not built with the shard's
/// `current` codebook (smallest first, up to `max_segment_rows`): their rows are
/// re-encoded with it, so the shard is searched as one codebook group.
fn stale_codebook_merge(
    segments: &[(u64, u64, &str)],
    current: Option<u64>,
    codebook_of: impl Fn(&str) -> Option<u64>,
    config: &IndexerConfig,
) -> Option<MergePlan> {
    let current = current?;
    let mut chosen = Vec::new();
    let mut total = 0;
    for &(live, _, id) in segments {
        if codebook_of(id) == Some(current) {
            continue;
        }
        if total + live > config.max_segment_rows as u64 {
            break;
        }
        total += live;
        chosen.push(id.to_string());
    }
    (!chosen.is_empty()).then(|| MergePlan {
        level: tier(total, config),
        segment_ids: chosen,
    })
}

#[cfg(test)]
mod tests {
    use roaring::RoaringBitmap;

    use super::*;
    use crate::catalog::{DeletesEntry, SegmentEntry};

    fn index_of(sizes: &[(u32, u32)]) -> ShardIndex {
        let mut index = ShardIndex::default();
        for (number, &(rows, deleted)) in sizes.iter().enumerate() {
            let entry = SegmentEntry {
                segment_id: format!("s{number:03}"),
                key: format!("k{number}"),
                rows,
                size_bytes: rows as u64 * 100,
                deletes: (deleted > 0).then(|| DeletesEntry {
                    key: format!("d{number}"),
                    version: 1,
                    deleted_rows: deleted,
                }),
                default_nprobe: None,
                probe_ratio_milli: None,
                wide_nprobe: None,
                wide_probe_ratio_milli: None,
                calibrated_rows: None,
            };
            index.add_segment(entry, RoaringBitmap::new(), Vec::new(), None);
        }
        index
    }

    fn config() -> IndexerConfig {
        IndexerConfig {
            merge_factor: 4,
            merge_floor_rows: 1000,
            max_segment_rows: 100_000,
            ..IndexerConfig::default()
        }
    }

    #[test]
    fn tiers_grow_by_the_merge_factor() {
        let config = config();
        assert_eq!(tier(0, &config), 0);
        assert_eq!(tier(999, &config), 0);
        assert_eq!(tier(1000, &config), 1);
        assert_eq!(tier(3999, &config), 1);
        assert_eq!(tier(4000, &config), 2);
        assert_eq!(tier(16_000, &config), 3);
    }

    #[test]
    fn a_full_tier_merges_its_smallest_segments() {
        let config = config();
        assert_eq!(plan_merges(&index_of(&[(500, 0); 3]), &config, false), None);
        let plan = plan_merges(
            &index_of(&[(500, 0), (600, 0), (700, 0), (800, 0), (900, 0), (5000, 0)]),
            &config,
            false,
        )
        .unwrap();
        assert_eq!(plan.segment_ids, vec!["s000", "s001", "s002", "s003"]);
        assert_eq!(plan.level, 1);
    }

    #[test]
    fn merges_never_exceed_the_maximum_segment() {
        let config = IndexerConfig {
            max_segment_rows: 3000,
            ..config()
        };
        // Four segments of tier 1 adding up to 4000 > 3000: no tiered merge.
        assert_eq!(
            plan_merges(&index_of(&[(1000, 0); 4]), &config, false),
            None
        );
        // Compaction takes as many as fit.
        let plan = plan_merges(&index_of(&[(1000, 0); 4]), &config, true).unwrap();
        assert_eq!(plan.segment_ids.len(), 3);
    }

    #[test]
    fn segments_of_an_older_codebook_are_merged_into_the_current_one() {
        let config = IndexerConfig {
            max_segment_rows: 50_000,
            ..config()
        };
        // The load this comes from: a merge trained codebook 2 on 54k rows while
        // three L0s were flushed with codebook 1.
        let segments = [
            (3_000, 3_000, "l0-c"),
            (20_000, 20_000, "l0-b"),
            (23_000, 23_000, "l0-a"),
            (54_000, 54_000, "m1"),
        ];
        let codebook_of = |id: &str| Some(if id == "m1" { 2 } else { 1 });
        let plan = stale_codebook_merge(&segments, Some(2), codebook_of, &config)
            .expect("three segments under codebook 1");
        assert_eq!(plan.segment_ids, vec!["l0-c", "l0-b", "l0-a"]);
        assert_eq!(plan.level, tier(46_000, &config));
        // Every segment under the current codebook, or no codebook known: nothing.
        assert_eq!(
            stale_codebook_merge(&segments, Some(2), |_| Some(2), &config),
            None
        );
        assert_eq!(
            stale_codebook_merge(&segments, None, codebook_of, &config),
            None
        );
        // One stale segment is re-encoded alone; a segment from before codebooks
        // counts as stale; the merge stops at the maximum segment size.
        let one = |id: &str| (id != "l0-b").then_some(2);
        let plan = stale_codebook_merge(&segments, Some(2), one, &config).unwrap();
        assert_eq!(plan.segment_ids, vec!["l0-b"]);
        let tight = IndexerConfig {
            max_segment_rows: 25_000,
            ..config.clone()
        };
        let plan = stale_codebook_merge(&segments, Some(2), codebook_of, &tight).unwrap();
        assert_eq!(plan.segment_ids, vec!["l0-c", "l0-b"]);
    }

    #[test]
    fn stale_segments_are_re_encoded_before_an_outgrown_codebook_is_refreshed() {
        let config = IndexerConfig {
            max_segment_rows: 2_000_000,
            ..config()
        };
        // Right after a fast load: the merge that trained codebook 2 on 422k rows
        // ran while 578k rows were flushed with codebook 1 (trained on 106k).
        let segments = [
            (26_000, 26_000, "l0-b"),
            (552_000, 552_000, "l0-a"),
            (422_000, 422_000, "m2"),
        ];
        let codebook_of = |id: &str| Some(if id == "m2" { 2 } else { 1 });
        let plan = codebook_merge(&segments, Some((2, 422_000)), codebook_of, &config)
            .expect("stale segments");
        assert_eq!(plan.segment_ids, vec!["l0-b", "l0-a"]);
        // Once they are under codebook 2, the shard (1M > 2 × 422k) is refreshed.
        let plan =
            codebook_merge(&segments, Some((2, 422_000)), |_| Some(2), &config).expect("outgrown");
        assert_eq!(plan.segment_ids, vec!["l0-b", "l0-a", "m2"]);
        // A codebook sized for the shard, no stale segment, or no codebook: nothing.
        assert_eq!(
            codebook_merge(&segments, Some((2, 600_000)), |_| Some(2), &config),
            None
        );
        assert_eq!(codebook_merge(&segments, None, codebook_of, &config), None);
    }

    #[test]
    fn an_outgrown_codebook_merges_the_whole_shard() {
        let config = config();
        let segments = [
            (20_000, 20_000, "a"),
            (20_000, 20_000, "b"),
            (20_000, 21_000, "c"),
        ];
        // No codebook yet (no segment built): nothing.
        assert_eq!(codebook_refresh(&segments, None, &config), None);
        let plan = codebook_refresh(&segments, Some(20_000), &config).expect("60k > 2 × 20k");
        assert_eq!(plan.segment_ids, vec!["a", "b", "c"]);
        assert_eq!(plan.level, tier(60_000, &config));
        // A codebook sized for the shard: nothing to do.
        assert_eq!(codebook_refresh(&segments, Some(30_000), &config), None);
        // One segment (its build already sized its codebook), or more rows than
        // a segment may hold: the tiers decide.
        assert_eq!(codebook_refresh(&segments[..1], Some(1_000), &config), None);
        let small = IndexerConfig {
            max_segment_rows: 50_000,
            ..config.clone()
        };
        assert_eq!(codebook_refresh(&segments, Some(20_000), &small), None);
        // Through plan_merges: three segments of one tier are no tiered merge,
        // and without a codebook recorded nothing is planned.
        let index = index_of(&[(20_000, 0), (20_000, 0), (20_000, 0)]);
        assert_eq!(plan_merges(&index, &config, false), None);
    }

    #[test]
    fn a_quiet_shard_is_consolidated_when_its_small_segments_are_worth_it() {
        let config = config();
        // Three segments of different tiers: no tiered merge, but consolidated.
        let three = index_of(&[(22_000, 0), (43_000, 0), (35_000, 0)]);
        assert_eq!(plan_merges(&three, &config, false), None);
        let plan = plan_consolidation(&three, &config).expect("consolidated");
        assert_eq!(plan.segment_ids, vec!["s000", "s002", "s001"]);
        assert_eq!(plan.level, tier(100_000, &config));
        // One segment: nothing to do.
        assert_eq!(plan_consolidation(&index_of(&[(50_000, 0)]), &config), None);
        // A small shard: a flush of a twentieth of its rows is taken in (it
        // costs a third more per query), one of a hundredth waits.
        let plan = plan_consolidation(&index_of(&[(95_000, 0), (5_000, 0)]), &config)
            .expect("a small shard's last small flush is consolidated");
        assert_eq!(plan.segment_ids, vec!["s001", "s000"]);
        let roomy = IndexerConfig {
            max_segment_rows: 2_000_000,
            ..config.clone()
        };
        assert_eq!(
            plan_consolidation(&index_of(&[(100_000, 0), (1_000, 0)]), &roomy),
            None
        );
        assert!(plan_consolidation(&index_of(&[(250_000, 0), (3_907, 0)]), &roomy).is_some());
        assert!(plan_consolidation(&index_of(&[(250_000, 0), (3_906, 0)]), &roomy).is_none());
        // A large shard: a small flush beside its large segment (under an
        // eighth of it) waits for the tiered merges; rewriting it is not cheap.
        assert_eq!(
            plan_consolidation(&index_of(&[(800_000, 0), (99_999, 0)]), &roomy),
            None
        );
        assert!(plan_consolidation(&index_of(&[(800_000, 0), (100_000, 0)]), &roomy).is_some());
        // Never past the largest segment allowed: the largest does not fit, the
        // rest is consolidated if worth it.
        let plan = plan_consolidation(
            &index_of(&[(90_000, 0), (5_000, 0), (4_000, 0), (20_000, 0)]),
            &config,
        )
        .expect("the ones that fit");
        assert_eq!(plan.segment_ids, vec!["s002", "s001", "s003"]);
        // Deleted rows do not count.
        assert_eq!(
            plan_consolidation(&index_of(&[(80_000, 0), (20_000, 19_500)]), &config),
            None
        );
    }

    #[test]
    fn heavily_deleted_segments_are_rewritten_and_compaction_stops() {
        let config = config();
        let plan = plan_merges(&index_of(&[(5000, 2000), (70_000, 0)]), &config, false).unwrap();
        assert_eq!(plan.segment_ids, vec!["s000"]);
        assert_eq!(plan_merges(&index_of(&[(5000, 0)]), &config, true), None);
        let plan = plan_merges(&index_of(&[(5000, 10)]), &config, true).unwrap();
        assert_eq!(plan.segment_ids, vec!["s000"]);
    }
}
