//! Parameters of a segment and of a search.

use serde::{Deserialize, Serialize};

use crate::fields::FieldSpec;

// The collection-level enums are the model's, shared with every role.
pub use quiver_model::{IdType, Metric};

/// Longest string id accepted.
pub const MAX_STRING_ID_BYTES: usize = 128;

/// Precision of the stored full vectors used for rescoring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RawPrecision {
    /// 32-bit floats: exact rescoring.
    #[default]
    F32,
    /// bfloat16: half the bytes to read per rescored candidate.
    Bf16,
}

impl RawPrecision {
    /// Returns the bytes one stored value takes.
    pub fn value_bytes(self) -> usize {
        match self {
            RawPrecision::F32 => 4,
            RawPrecision::Bf16 => 2,
        }
    }
}

/// How a segment's index is built.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BuildParams {
    /// Number of IVF lists; `None` picks one from the row count ([`default_nlist`]).
    pub nlist: Option<usize>,
    /// Precision of the stored full vectors.
    pub raw_precision: RawPrecision,
    /// k-means iterations.
    pub kmeans_iterations: usize,
    /// Training sample size per list (the sample is `nlist × this`, at most all rows).
    pub kmeans_sample_per_list: usize,
    /// Seed of k-means sampling and of the RaBitQ rotation.
    pub seed: u64,
    /// Threads used to build (0 = all cores).
    pub threads: usize,
    /// Build with these centroids and rotation instead of training k-means
    /// (the shard's codebook); `None` trains a new one from the rows.
    #[serde(skip)]
    pub codebook: Option<std::sync::Arc<crate::codebook::Codebook>>,
}

impl Default for BuildParams {
    fn default() -> Self {
        BuildParams {
            nlist: None,
            raw_precision: RawPrecision::F32,
            kmeans_iterations: 8,
            kmeans_sample_per_list: 48,
            seed: 0x5157_4956_4552,
            threads: 0,
            codebook: None,
        }
    }
}

/// Returns the default number of IVF lists for `rows` rows: about `3·√rows`,
/// keeping at least 64 rows per list on average.
pub fn default_nlist(rows: usize) -> usize {
    let by_sqrt = (3.0 * (rows as f64).sqrt()).round() as usize;
    by_sqrt.min(rows / 64).max(1)
}

/// Returns the default number of lists to probe for a segment with `nlist` lists:
/// about 1/16 of them for small indexes down to ~1.5% for large ones, at least 8.
pub fn default_nprobe(nlist: usize) -> usize {
    let fraction = if nlist <= 256 { 8 } else { 32 };
    nlist.div_ceil(fraction).clamp(8.min(nlist), nlist.max(1))
}

/// Knobs of one search.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchParams {
    /// Number of hits to return.
    pub k: usize,
    /// Lists to probe; `None` uses [`default_nprobe`].
    pub nprobe: Option<usize>,
    /// Candidate multiplier: every row whose error-bound lower bound beats the
    /// k-th exact key is rescored with its full vector; of the rows the bound rules
    /// out, the best `k × rescore` by estimate are rescored too.
    pub rescore: usize,
    /// Width of the RaBitQ error bound in standard deviations (the paper's ε₀);
    /// larger is safer and rescores more.
    pub bound_sigma: f32,
    /// Lists chosen by distance instead of counted: every list whose centroid's
    /// squared distance to the query is within `1 + probe_ratio` times the nearest
    /// centroid's, at most [`max_ratio_probes`] of them. A query far from the data (a question against passages, a query
    /// from another source than the rows) has many centroids about as near as its
    /// nearest and probes more lists; one among dense rows probes fewer. Takes
    /// precedence over `nprobe`, except for [`Metric::Dot`], whose keys are not
    /// distances (`nprobe` applies there).
    pub probe_ratio: Option<f32>,
}

/// The most lists a search by distance probes: a query about as far from every
/// centroid would otherwise scan the whole segment. There is no floor but one
/// list: a floor of a fixed share of the lists cost 2.6× the rows on clustered
/// synthetic data, whose calibrated ratio probes 17 of 1,342 lists on average,
/// and saved 7 % on real embeddings (experiments item 41).
pub fn max_ratio_probes(nlist: usize) -> usize {
    (nlist / 2).max(1)
}

/// How a search chooses its lists (see [`SearchParams::probe`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Probe {
    /// The `n` nearest lists.
    Nearest(usize),
    /// The lists within `1 + ratio` of the nearest's squared distance, at
    /// least `min` and at most `max`.
    Within { ratio: f32, min: usize, max: usize },
}

/// Rows a search scans at least per hit it asks for past the first
/// [`CALIBRATED_K`]: a calibration sets the probe for the top ten, and its
/// lists hold few rows for a large k (whose hits then come from only about as
/// many rows as asked for), so a larger k probes more lists. On 100k clustered
/// 384-d vectors, k = 1,000 found 71 % of its true hits in ~1,100 rows, 86 % in
/// ~3,000, 93 % in ~6,300 (a k of 10 or 100 scans far more than this already).
pub const MIN_ROWS_PER_HIT: usize = 10;

/// Hits per query a calibration reaches its recall for (`CalibrationOptions::k`'s
/// default).
pub const CALIBRATED_K: usize = 10;

/// Hits per query of a segment's second calibration
/// ([`crate::CalibrationOptions::wide`]): where the rows form small tight
/// clusters, the probe that finds a query's ten nearest is its own cluster's
/// list, and the hundred nearest lie in lists no rule derived from it names
/// (50k × 1024-d in clusters of 25: recall@100 0.42, and 0.71 for ten hits under
/// a filter keeping a tenth of the rows). Between the two calibrated `k`s a
/// search interpolates ([`probe_for_k`]); past this one, [`MIN_ROWS_PER_HIT`]
/// adds lists.
pub const CALIBRATED_WIDE_K: usize = 100;

/// A default probe calibrated for some number of hits: a distance ratio (with
/// `nprobe` the mean lists it probed) or, without one, a count of lists.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CalibratedProbe {
    /// Lists probed (the mean, with a ratio).
    pub nprobe: usize,
    /// The distance ratio ([`SearchParams::probe_ratio`]), if lists are chosen
    /// by distance.
    pub ratio: Option<f32>,
}

/// The default probe of a search for `k` hits (`hits`: a filtered search asks
/// for as many as the filter's selectivity says it must look at), from the probe
/// calibrated for [`CALIBRATED_K`] hits and, if the segment has one, the one
/// calibrated for [`CALIBRATED_WIDE_K`]: up to ten hits the first; between
/// them the two interpolated in log `k` (ratios when both have one, else counts);
/// from a hundred on the second. Never fewer lists than the first.
pub fn probe_for_k(
    k: usize,
    narrow: CalibratedProbe,
    wide: Option<CalibratedProbe>,
) -> CalibratedProbe {
    let Some(wide) = wide else {
        return narrow;
    };
    if k <= CALIBRATED_K {
        return narrow;
    }
    let share = if k >= CALIBRATED_WIDE_K {
        1.0
    } else {
        ((k as f64) / CALIBRATED_K as f64).ln()
            / (CALIBRATED_WIDE_K as f64 / CALIBRATED_K as f64).ln()
    };
    let between = |low: f64, high: f64| low + (high - low).max(0.0) * share;
    let nprobe = between(narrow.nprobe as f64, wide.nprobe as f64).ceil() as usize;
    CalibratedProbe {
        nprobe: nprobe.max(narrow.nprobe),
        ratio: match (narrow.ratio, wide.ratio) {
            (Some(low), Some(high)) => Some(between(low as f64, high as f64) as f32),
            _ => None,
        },
    }
}

impl Probe {
    /// The same choice, but of at least `lists` lists (of `nlist`).
    pub(crate) fn at_least(self, lists: usize, nlist: usize) -> Probe {
        let lists = lists.min(nlist.max(1));
        match self {
            Probe::Nearest(count) => Probe::Nearest(count.max(lists)),
            Probe::Within { ratio, min, max } => Probe::Within {
                ratio,
                min: min.max(lists),
                max: max.max(lists),
            },
        }
    }
}

impl SearchParams {
    /// Returns parameters for top-`k` with the defaults for everything else.
    pub fn new(k: usize) -> Self {
        SearchParams {
            k,
            nprobe: None,
            rescore: 4,
            bound_sigma: 1.9,
            probe_ratio: None,
        }
    }

    /// How a search of `nlist` lists under `metric` chooses them.
    pub(crate) fn probe(&self, nlist: usize, metric: Metric) -> Probe {
        match self.probe_ratio {
            Some(ratio) if metric != Metric::Dot && ratio.is_finite() && ratio >= 0.0 => {
                Probe::Within {
                    ratio,
                    min: 1,
                    max: max_ratio_probes(nlist),
                }
            }
            _ => Probe::Nearest(
                self.nprobe
                    .unwrap_or_else(|| default_nprobe(nlist))
                    .clamp(1, nlist.max(1)),
            ),
        }
    }
}

impl Default for SearchParams {
    fn default() -> Self {
        SearchParams::new(10)
    }
}

impl crate::writer::SegmentSpec {
    /// Returns the spec every segment of `collection` is built with: its
    /// dimension, metric, id type, payload fields and raw-vector precision, and
    /// its name and id recorded in the header.
    pub fn for_collection(collection: &quiver_model::Collection) -> Self {
        let spec = &collection.spec;
        let mut segment_spec = Self::new(spec.dimension as usize, spec.metric, spec.id_type);
        segment_spec.fields = spec
            .payload_schema
            .iter()
            .map(|field| FieldSpec {
                name: field.name.clone(),
                kind: field.kind,
            })
            .collect();
        segment_spec.build = BuildParams {
            raw_precision: match spec.index.raw_precision {
                quiver_model::VectorPrecision::F32 => RawPrecision::F32,
                quiver_model::VectorPrecision::Bf16 => RawPrecision::Bf16,
            },
            ..BuildParams::default()
        };
        segment_spec.collection = serde_json::json!({
            "name": spec.name,
            "collection_id": collection.collection_id,
        });
        segment_spec
    }
}

#[cfg(test)]
mod tests {
    use quiver_model::{
        Collection, CollectionSpec, FieldKind, IndexParams, PayloadField, VectorPrecision,
    };

    use super::*;
    use crate::writer::SegmentSpec;

    #[test]
    fn collection_specs_become_segment_specs() {
        let collection = Collection {
            collection_id: 7,
            spec: CollectionSpec {
                name: "docs".into(),
                dimension: 384,
                metric: Metric::Cosine,
                id_type: IdType::String,
                shards: 1,
                replication: 1,
                index: IndexParams {
                    raw_precision: VectorPrecision::Bf16,
                    ..IndexParams::default()
                },
                payload_schema: vec![PayloadField {
                    name: "lang".into(),
                    kind: FieldKind::Keyword,
                }],
            },
            created_at_ms: 0,
        };
        let spec = SegmentSpec::for_collection(&collection);
        assert_eq!(spec.dim, 384);
        assert_eq!(spec.metric, Metric::Cosine);
        assert_eq!(spec.id_type, IdType::String);
        assert_eq!(spec.fields[0].kind, FieldKind::Keyword);
        assert_eq!(spec.fields[0].name, "lang");
        assert_eq!(spec.build.raw_precision, RawPrecision::Bf16);
        assert_eq!(
            spec.collection,
            serde_json::json!({"name": "docs", "collection_id": 7})
        );
    }

    #[test]
    fn a_k_between_the_calibrated_ones_probes_between_their_probes() {
        let narrow = CalibratedProbe {
            nprobe: 10,
            ratio: Some(0.5),
        };
        let wide = CalibratedProbe {
            nprobe: 100,
            ratio: Some(1.5),
        };
        assert_eq!(probe_for_k(50, narrow, None), narrow);
        assert_eq!(probe_for_k(1, narrow, Some(wide)), narrow);
        assert_eq!(probe_for_k(CALIBRATED_K, narrow, Some(wide)), narrow);
        assert_eq!(probe_for_k(CALIBRATED_WIDE_K, narrow, Some(wide)), wide);
        assert_eq!(probe_for_k(5_000, narrow, Some(wide)), wide);
        // Half-way in log k: √(10 · 100) ≈ 32.
        let middle = probe_for_k(32, narrow, Some(wide));
        assert!((54..=56).contains(&middle.nprobe), "{middle:?}");
        assert!((middle.ratio.unwrap() - 1.0).abs() < 0.02, "{middle:?}");
        let mut previous = narrow;
        for k in CALIBRATED_K..=CALIBRATED_WIDE_K {
            let probe = probe_for_k(k, narrow, Some(wide));
            assert!(probe.nprobe >= previous.nprobe && probe.ratio >= previous.ratio);
            previous = probe;
        }
        // A count when either is one; never fewer lists than the narrow probe.
        let counted = CalibratedProbe {
            nprobe: 6,
            ratio: None,
        };
        assert_eq!(probe_for_k(100, narrow, Some(counted)).ratio, None);
        assert_eq!(probe_for_k(100, narrow, Some(counted)).nprobe, 10);
    }
}
