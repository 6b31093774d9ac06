//! Test data: clustered gaussian vectors, and segment construction helpers.

use quiver_index::{IdType, MemorySource, Metric, PointId, Segment, SegmentSpec, SegmentWriter};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

/// `rows` vectors around `clusters` random centres, plus `queries` more from the
/// same distribution.
pub fn clustered(
    rows: usize,
    queries: usize,
    dim: usize,
    clusters: usize,
    seed: u64,
) -> (Vec<f32>, Vec<f32>) {
    around_centres(
        rows,
        queries,
        dim,
        clusters,
        Shape::around(0.6, false),
        seed,
    )
}

/// Rows in small tight clusters far apart (`clusters` of `rows / clusters` rows
/// each), plus `queries` more: a query's own cluster holds its ten nearest, and
/// the rest of its hundred nearest lie in clusters no nearer than any other.
pub fn tight_clusters(
    rows: usize,
    queries: usize,
    dim: usize,
    clusters: usize,
    seed: u64,
) -> (Vec<f32>, Vec<f32>) {
    around_centres(rows, queries, dim, clusters, Shape::around(0.1, true), seed)
}

/// Inner-product data whose norms vary: `rows` vectors (and `queries` more)
/// around `clusters` unit directions, with noise of 0.7 in all, each scaled by
/// a norm drawn from 0.5–2 — more directions than a segment of `rows` has
/// lists, as with real embeddings of many topics.
pub fn varied_norms(
    rows: usize,
    queries: usize,
    dim: usize,
    clusters: usize,
    seed: u64,
) -> (Vec<f32>, Vec<f32>) {
    let shape = Shape {
        spread: 0.7 / (dim as f32).sqrt(),
        in_turn: false,
        unit_centres: true,
        norms: Some((0.5, 2.0)),
    };
    around_centres(rows, queries, dim, clusters, shape, seed)
}

/// How [`around_centres`] draws its vectors.
struct Shape {
    /// Gaussian noise added to the centre, per dimension.
    spread: f32,
    /// The centres in turn, else a random one per vector.
    in_turn: bool,
    /// Centres scaled to unit length.
    unit_centres: bool,
    /// Each vector scaled by a factor drawn from this range.
    norms: Option<(f32, f32)>,
}

impl Shape {
    fn around(spread: f32, in_turn: bool) -> Shape {
        Shape {
            spread,
            in_turn,
            unit_centres: false,
            norms: None,
        }
    }
}

/// Vectors around `clusters` unit-gaussian centres with gaussian noise, as
/// `shape` says.
fn around_centres(
    rows: usize,
    queries: usize,
    dim: usize,
    clusters: usize,
    shape: Shape,
    seed: u64,
) -> (Vec<f32>, Vec<f32>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let unit = Normal::new(0.0f32, 1.0).unwrap();
    let mut centres: Vec<f32> = (0..clusters * dim).map(|_| unit.sample(&mut rng)).collect();
    if shape.unit_centres {
        for centre in centres.chunks_exact_mut(dim) {
            let norm = centre.iter().map(|v| v * v).sum::<f32>().sqrt();
            centre.iter_mut().for_each(|v| *v /= norm);
        }
    }
    let mut draw = |count: usize| {
        let mut out = Vec::with_capacity(count * dim);
        for row in 0..count {
            let centre = if shape.in_turn {
                row % clusters
            } else {
                rng.random_range(0..clusters)
            };
            let scale = shape
                .norms
                .map_or(1.0, |(low, high)| rng.random_range(low..high));
            for d in 0..dim {
                out.push(
                    scale * (centres[centre * dim + d] + shape.spread * unit.sample(&mut rng)),
                );
            }
        }
        out
    };
    let base = draw(rows);
    let query = draw(queries);
    (base, query)
}

/// Builds an in-memory segment of `vectors` with ids 0..n and no payloads.
pub fn build(
    vectors: &[f32],
    dim: usize,
    metric: Metric,
    configure: impl FnOnce(&mut SegmentSpec),
) -> Segment<MemorySource> {
    let mut spec = SegmentSpec::new(dim, metric, IdType::U64);
    configure(&mut spec);
    let mut writer = SegmentWriter::new(spec).unwrap();
    for (row, vector) in vectors.chunks_exact(dim).enumerate() {
        writer.add(PointId::U64(row as u64), vector, None).unwrap();
    }
    let mut bytes = Vec::new();
    writer.finish(&mut bytes, &|_, _, _| {}).unwrap();
    Segment::open(MemorySource::new("test.qseg", &bytes)).unwrap()
}

/// Returns the bytes of a small segment with string ids, payloads and fields.
pub fn small_segment_bytes() -> Vec<u8> {
    small_segment_bytes_with(|spec| SegmentWriter::new(spec).unwrap())
}

/// [`small_segment_bytes`] written by the writer `make` returns.
pub fn small_segment_bytes_with(make: impl FnOnce(SegmentSpec) -> SegmentWriter) -> Vec<u8> {
    use quiver_index::{FieldKind, FieldSpec};
    let dim = 24;
    let (vectors, _) = clustered(700, 0, dim, 5, 17);
    let mut spec = SegmentSpec::new(dim, Metric::Cosine, IdType::String);
    spec.fields = vec![
        FieldSpec {
            name: "color".into(),
            kind: FieldKind::Keyword,
        },
        FieldSpec {
            name: "price".into(),
            kind: FieldKind::Integer,
        },
        FieldSpec {
            name: "weight".into(),
            kind: FieldKind::Float,
        },
        FieldSpec {
            name: "sale".into(),
            kind: FieldKind::Bool,
        },
    ];
    spec.build.nlist = Some(8);
    let mut writer = make(spec);
    for (row, vector) in vectors.chunks_exact(dim).enumerate() {
        let color = ["red", "green", "blue"][row % 3];
        let mut payload =
            serde_json::json!({"color": color, "price": row as i64, "sale": row % 2 == 0});
        // Every seventh row has no weight: a missing value, not a zero.
        if row % 7 != 0 {
            payload["weight"] = serde_json::json!(row as f64 * 0.25);
        }
        writer
            .add(
                PointId::String(format!("doc-{row}")),
                vector,
                Some(&payload),
            )
            .unwrap();
    }
    let mut bytes = Vec::new();
    writer.finish(&mut bytes, &|_, _, _| {}).unwrap();
    bytes
}
