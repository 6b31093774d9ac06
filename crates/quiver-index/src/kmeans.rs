//! k-means for IVF: trained on a sample, k-means++ seeding on a sub-sample, Lloyd
//! iterations with SIMD distances, empty clusters refilled by splitting the
//! largest, then one assignment pass over every row that caps list sizes at 4× the
//! average and places each centroid at the mean of its capped list, then every row
//! to its nearest centroid — where a build given the codebook puts it, and where a
//! search looks for it.

use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use quiver_simd::BLOCK_COLUMNS;

/// Rows per assignment tile: the tile (96 KB at 384-d) stays in L2 while every
/// block of 16 centroids (24 KB) streams through L1.
const TILE_ROWS: usize = 64;
/// During training, a list over this many times the average is split.
const OVERSIZE_SPLIT_FACTOR: usize = 2;
/// No list holds more than this many times the average (see `assign_balanced`).
const MAX_LIST_FACTOR: usize = 4;
/// Rows the k-means++ seeding looks at, per centroid.
const SEEDING_ROWS_PER_CENTROID: usize = 8;

/// The trained centroids and the list each row belongs to.
pub struct Clustering {
    /// `k × dim` centroids.
    pub centroids: Vec<f32>,
    /// For every input row, the index of its nearest centroid.
    pub assignments: Vec<u32>,
}

/// Progress of a long step, reported as `(done, total)`.
pub type ProgressFn<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// How rows are matched to centroids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Geometry {
    /// The nearest by Euclidean distance (l2, and cosine over unit vectors).
    Euclidean,
    /// For inner products (dot): the centroid whose direction is nearest the
    /// row's (the largest `x·c / ‖c‖`); centroids stay the means of their rows,
    /// which a search ranks by the query's inner product.
    ///
    /// Euclidean k-means over vectors whose norms vary puts a centroid near the
    /// origin: a row of a direction no centroid stands for is nearer to it
    /// (‖x‖²) than to a centroid of several directions (‖x‖² + ‖c‖² − 2·x·c),
    /// so one list gathers rows of every direction — 17k of 100k rows at
    /// 1024-d, norms 0.6–2.5 — and its centroid, whose inner product with any
    /// query is about 0, ranks in the middle of every query's lists: 2 % of
    /// queries found none of their ten, and a stored row searched for itself
    /// was missed at 400 of 949 lists. By direction, a row's length does not
    /// decide its list, and no list gathers the short rows. Matched by the
    /// plain inner product instead, long centroids drew rows of neighbouring
    /// directions (lists up to the 4× cap, some empty: recall@10 0.71 at one
    /// list of 312 on 20k × 128-d of 1,000 directions, against 0.94 by
    /// direction); lifted onto a sphere (x ↦ [x, √(R² − ‖x‖²)], the reduction
    /// of inner products to distances), the short rows still shared one list
    /// (recall@10 0.936 at 19 lists, against 0.989).
    InnerProduct,
}

impl Geometry {
    /// The geometry rows of `metric` are matched to centroids in.
    pub fn of(metric: crate::Metric) -> Geometry {
        match metric {
            crate::Metric::Dot => Geometry::InnerProduct,
            crate::Metric::L2 | crate::Metric::Cosine => Geometry::Euclidean,
        }
    }

    /// The centroids rows are matched to by Euclidean distance: `centroids`
    /// themselves, or for inner products their directions (unit vectors).
    pub fn matching<'c>(self, centroids: &'c [f32], dim: usize) -> std::borrow::Cow<'c, [f32]> {
        match self {
            Geometry::Euclidean => std::borrow::Cow::Borrowed(centroids),
            Geometry::InnerProduct => {
                let mut unit = centroids.to_vec();
                for centroid in unit.chunks_exact_mut(dim) {
                    let norm = quiver_simd::dot_f32(centroid, centroid).sqrt();
                    if norm > 0.0 {
                        centroid.iter_mut().for_each(|value| *value /= norm);
                    }
                }
                std::borrow::Cow::Owned(unit)
            }
        }
    }
}

/// Clusters `data` (`rows × dim`) into `k` lists, matched in `geometry`.
#[allow(clippy::too_many_arguments)]
pub fn train_and_assign(
    data: &[f32],
    dim: usize,
    k: usize,
    iterations: usize,
    sample_per_list: usize,
    seed: u64,
    geometry: Geometry,
    progress: ProgressFn<'_>,
) -> Clustering {
    let rows = data.len() / dim;
    assert!(
        k >= 1 && rows >= k,
        "k-means: need at least k = {k} rows, got {rows}"
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sample_size = (k * sample_per_list).clamp(k, rows);
    let sample_rows: Vec<usize> = if sample_size == rows {
        (0..rows).collect()
    } else {
        sample(&mut rng, rows, sample_size).into_vec()
    };
    let mut training = Vec::with_capacity(sample_size * dim);
    for &row in &sample_rows {
        training.extend_from_slice(&data[row * dim..][..dim]);
    }

    let mut centroids = seed_plus_plus(&training, dim, k, &mut rng);
    let total_steps = iterations as u64 + 1;
    let mut assignments = vec![0u32; sample_size];
    for iteration in 0..iterations {
        assign(
            &training,
            dim,
            &geometry.matching(&centroids, dim),
            &mut assignments,
        );
        update_centroids(&training, dim, &assignments, &mut centroids, &mut rng);
        progress(iteration as u64 + 1, total_steps);
    }
    drop(training);
    let capacity = (rows.div_ceil(k) * MAX_LIST_FACTOR).max(1);
    let nearest = nearest_two(data, dim, &geometry.matching(&centroids, dim));
    let balanced = assign_balanced(&nearest, k, capacity);
    // One last update over every row, so each centroid is the mean of its
    // capped list: the cap shapes where the centroids go.
    recompute_means(data, dim, &balanced, &mut centroids);
    drop(balanced);
    // Then every row goes to its nearest centroid, as a build given this
    // codebook assigns it. A search probes the lists nearest the query, at
    // least the nearest one: a row the cap moved to its second list (or whose
    // centroid moved away from it in the update) was no longer in the list of
    // its nearest centroid, and the calibrated probe of clustered data — the
    // nearest list only — never found it, not even searched for by its own
    // vector (0.4 % of a 97k × 1024-d segment, 2,000 clusters), while every
    // later build with the codebook put it back in that list.
    let mut all_assignments = vec![0u32; rows];
    assign(
        data,
        dim,
        &geometry.matching(&centroids, dim),
        &mut all_assignments,
    );
    progress(total_steps, total_steps);
    Clustering {
        centroids,
        assignments: all_assignments,
    }
}

/// k-means++ seeding on a sub-sample of the training rows.
///
/// Each of the k picks updates every pool row's distance to its nearest pick,
/// so the pool is read k times (a 24k-row pool at 768 dimensions, 3,000 times
/// for 1M rows): it is kept as one contiguous copy in bf16, minus its mean —
/// half the bytes to read per pick; the distances that weigh the next pick are
/// then within ~2⁻⁸·‖x − c‖·‖x − μ‖ of the f32 ones, which moves a row's chance
/// of being picked by a fraction of a percent. The picks are the rows
/// themselves, in f32.
fn seed_plus_plus(training: &[f32], dim: usize, k: usize, rng: &mut impl Rng) -> Vec<f32> {
    /// Pool rows per parallel task of a pick's update.
    const UPDATE_ROWS: usize = 256;
    let rows = training.len() / dim;
    let pool_size = (k * SEEDING_ROWS_PER_CENTROID).min(rows);
    let pool: Vec<usize> = sample(rng, rows, pool_size).into_vec();
    let vector = |row: usize| &training[row * dim..][..dim];
    let mean = mean_of(pool.iter().map(|&row| vector(row)), dim);
    let mut pool_values = vec![0u16; pool_size * dim];
    pool_values
        .par_chunks_mut(dim)
        .zip(pool.par_iter())
        .for_each(|(values, &row)| {
            for ((slot, &value), &middle) in values.iter_mut().zip(vector(row)).zip(&mean) {
                *slot = quiver_simd::f32_to_bf16_bits(value - middle);
            }
        });
    let centered = |row: usize| -> Vec<f32> {
        vector(row)
            .iter()
            .zip(&mean)
            .map(|(value, middle)| value - middle)
            .collect()
    };
    let mut centroids = Vec::with_capacity(k * dim);
    let first = pool[rng.random_range(0..pool_size)];
    centroids.extend_from_slice(vector(first));
    let mut nearest = vec![f32::INFINITY; pool_size];
    let mut pick = centered(first);
    for step in 0..k {
        if step > 0 {
            let total: f64 = nearest.iter().map(|&d| d as f64).sum();
            let chosen = if total <= 0.0 {
                rng.random_range(0..pool_size)
            } else {
                let mut target = rng.random::<f64>() * total;
                let mut chosen = pool_size - 1;
                for (index, &distance) in nearest.iter().enumerate() {
                    target -= distance as f64;
                    if target <= 0.0 {
                        chosen = index;
                        break;
                    }
                }
                chosen
            };
            centroids.extend_from_slice(vector(pool[chosen]));
            pick = centered(pool[chosen]);
        }
        nearest
            .par_chunks_mut(UPDATE_ROWS)
            .zip(pool_values.par_chunks(UPDATE_ROWS * dim))
            .for_each(|(best, values)| {
                for (best, row) in best.iter_mut().zip(values.chunks_exact(dim)) {
                    let distance = quiver_simd::l2sq_bf16(&pick, row);
                    if distance < *best {
                        *best = distance;
                    }
                }
            });
    }
    centroids
}

/// Writes the index of the nearest centroid of every row into `assignments`.
pub fn assign(data: &[f32], dim: usize, centroids: &[f32], assignments: &mut [u32]) {
    let nearest = nearest_two(data, dim, centroids);
    for (slot, pair) in assignments.iter_mut().zip(nearest) {
        *slot = pair.first;
    }
}

/// A row's nearest and second-nearest centroid.
#[derive(Clone, Copy, Debug)]
struct NearestTwo {
    first: u32,
    second: u32,
    /// How much farther the second is (in ‖c‖² − 2·x·c units).
    margin: f32,
}

/// The mean of `rows` (each `dim` values), summed in f64.
pub(crate) fn mean_of<'a>(rows: impl Iterator<Item = &'a [f32]>, dim: usize) -> Vec<f32> {
    let mut sums = vec![0f64; dim];
    let mut count = 0usize;
    for row in rows {
        for (sum, &value) in sums.iter_mut().zip(row) {
            *sum += value as f64;
        }
        count += 1;
    }
    sums.iter()
        .map(|sum| (sum / count.max(1) as f64) as f32)
        .collect()
}

/// Writes `vectors` (`n × dim`) into `blocks` transposed 16 to a block
/// (`block[d * 16 + column]`, as [`quiver_simd::dot_transposed_block`] reads
/// them), zero-padded to whole blocks, and their squared norms into `norms`;
/// padding columns get an infinite norm, so they are never the nearest.
pub(crate) fn transpose_in_blocks(
    vectors: &[f32],
    dim: usize,
    blocks: &mut Vec<f32>,
    norms: &mut Vec<f32>,
) {
    let count = (vectors.len() / dim).div_ceil(BLOCK_COLUMNS);
    blocks.clear();
    blocks.resize(count * dim * BLOCK_COLUMNS, 0.0);
    norms.clear();
    norms.resize(count * BLOCK_COLUMNS, f32::INFINITY);
    for (index, values) in vectors.chunks_exact(dim).enumerate() {
        let (block, column) = (index / BLOCK_COLUMNS, index % BLOCK_COLUMNS);
        let block_values = &mut blocks[block * dim * BLOCK_COLUMNS..][..dim * BLOCK_COLUMNS];
        for (d, &value) in values.iter().enumerate() {
            block_values[d * BLOCK_COLUMNS + column] = value;
        }
        norms[index] = quiver_simd::dot_f32(values, values);
    }
}

/// Returns every row's two nearest centroids.
///
/// A small matrix product: centroids are transposed into blocks of 16, and a tile
/// of rows is scored against one block at a time with the register-blocked kernel
/// (each centroid value loaded once per 8 rows, no horizontal sums).
fn nearest_two(data: &[f32], dim: usize, centroids: &[f32]) -> Vec<NearestTwo> {
    if dim >= MIN_TILE_DIM && quiver_simd::tile_products_available() {
        return nearest_two_on_tiles(data, dim, centroids);
    }
    nearest_two_blocked(data, dim, centroids)
}

/// `nearest_two` with the f32 block kernel.
fn nearest_two_blocked(data: &[f32], dim: usize, centroids: &[f32]) -> Vec<NearestTwo> {
    let (mut transposed, mut norms) = (Vec::new(), Vec::new());
    transpose_in_blocks(centroids, dim, &mut transposed, &mut norms);
    let rows = data.len() / dim;
    let unset = NearestTwo {
        first: 0,
        second: 0,
        margin: 0.0,
    };
    let mut nearest = vec![unset; rows];
    data.par_chunks(TILE_ROWS * dim)
        .zip(nearest.par_chunks_mut(TILE_ROWS))
        .for_each(|(tile, tile_nearest)| {
            let tile_rows = tile.len() / dim;
            // (best distance, best, second distance, second)
            let mut best = [(f32::INFINITY, 0u32, f32::INFINITY, 0u32); TILE_ROWS];
            let mut dots = [0f32; TILE_ROWS * BLOCK_COLUMNS];
            for (block, block_values) in transposed.chunks_exact(dim * BLOCK_COLUMNS).enumerate() {
                quiver_simd::dot_transposed_block(tile, dim, block_values, &mut dots);
                let block_norms = &norms[block * BLOCK_COLUMNS..][..BLOCK_COLUMNS];
                for (row_best, row_dots) in best
                    .iter_mut()
                    .zip(dots.chunks_exact(BLOCK_COLUMNS))
                    .take(tile_rows)
                {
                    for (column, (&norm, &dot)) in block_norms.iter().zip(row_dots).enumerate() {
                        // ‖x − c‖² − ‖x‖² = ‖c‖² − 2·x·c: the row's norm does not change the order.
                        let distance = norm - 2.0 * dot;
                        if distance < row_best.2 {
                            let centroid = (block * BLOCK_COLUMNS + column) as u32;
                            if distance < row_best.0 {
                                *row_best = (distance, centroid, row_best.0, row_best.1);
                            } else {
                                row_best.2 = distance;
                                row_best.3 = centroid;
                            }
                        }
                    }
                }
            }
            for (slot, (first_distance, first, second_distance, second)) in
                tile_nearest.iter_mut().zip(best)
            {
                *slot = NearestTwo {
                    first,
                    second,
                    margin: second_distance - first_distance,
                };
            }
        });
    nearest
}

/// Dimensions from which `nearest_two` uses the tile products when the CPU has them.
const MIN_TILE_DIM: usize = 32;
/// Rows per tile task: their bf16 copy (192 KiB at 768 dimensions) stays in L2
/// while the centroids stream through in groups of 512.
const TILE_TASK_ROWS: usize = 128;
/// Bound on a bf16 tile product's error, relative to ‖x‖·‖c‖: two roundings to
/// 8 significant bits (2⁻⁹ each) and the f32 sums.
const TILE_PRODUCT_ERROR: f32 = 1.0 / 256.0 + 1.0 / 4096.0;

/// A thread's bf16 rows, approximate products and f32 candidates.
type TileScratch = (Vec<u16>, Vec<f32>, Vec<(f32, u32)>);

/// `nearest_two` on AMX tiles: every row's products with every centroid in bf16
/// (rows and centroids minus the centroids' mean, which shrinks the rounding
/// with the norms), then the centroids whose approximate distance is within
/// twice the error bound of the best one re-scored in f32 (as ‖x − c‖², which
/// loses less to rounding than the block kernel's ‖c‖² − 2·x·c) — so the nearest
/// is the one the f32 kernel finds (up to its rounding), and the second and the
/// margin are f32 when the second is among those, else at bf16 precision.
/// 1M × 768 rows against 3,000 centroids on 2 cores: 7.0–7.3 s, against 16–18 s
/// with the f32 block kernel (experiments item 46).
fn nearest_two_on_tiles(data: &[f32], dim: usize, centroids: &[f32]) -> Vec<NearestTwo> {
    use quiver_simd::{TilePanel, tile_products, tile_rows};
    let k = centroids.len() / dim;
    let center = mean_of(centroids.chunks_exact(dim), dim);
    let panel = TilePanel::new(centroids, dim, &center);
    let stride = panel.padded_count();
    // ‖c − μ‖² of every centroid (infinite for the padding, never the nearest)
    // and the largest ‖c − μ‖ for the bound.
    let mut shifted_norms = vec![f32::INFINITY; stride];
    let mut largest_norm = 0f32;
    for (slot, centroid) in shifted_norms.iter_mut().zip(centroids.chunks_exact(dim)) {
        *slot = quiver_simd::l2sq_f32(centroid, &center);
        largest_norm = largest_norm.max(slot.sqrt());
    }
    let unset = NearestTwo {
        first: 0,
        second: 0,
        margin: 0.0,
    };
    let mut nearest = vec![unset; data.len() / dim];
    thread_local! {
        /// A thread's bf16 rows, products and candidates, reused by its tasks
        /// (a fresh 1.5 MiB of products per task cost page faults).
        static SCRATCH: std::cell::RefCell<TileScratch> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
    }
    data.par_chunks(TILE_TASK_ROWS * dim)
        .zip(nearest.par_chunks_mut(TILE_TASK_ROWS))
        .for_each(|(tile, tile_nearest)| {
            SCRATCH.with_borrow_mut(|(rows, products, candidates)| {
                let padded_rows = tile_rows(tile, dim, &center, rows);
                products.resize(padded_rows * stride, 0.0);
                tile_products(rows, &panel, products);
                for ((row, slot), dots) in tile
                    .chunks_exact(dim)
                    .zip(tile_nearest)
                    .zip(products.chunks_exact_mut(stride))
                {
                    *slot = nearest_of_row(
                        row,
                        dots,
                        &shifted_norms,
                        TILE_PRODUCT_ERROR
                            * 2.0
                            * quiver_simd::l2sq_f32(row, &center).sqrt()
                            * largest_norm,
                        (centroids, dim, k),
                        candidates,
                    );
                }
            })
        });
    nearest
}

/// One row's two nearest centroids from its approximate products `dots` (see
/// `nearest_two_on_tiles`; overwritten with the approximate distances);
/// `error` bounds an approximate distance's error.
fn nearest_of_row(
    row: &[f32],
    dots: &mut [f32],
    shifted_norms: &[f32],
    error: f32,
    (centroids, dim, k): (&[f32], usize, usize),
    candidates: &mut Vec<(f32, u32)>,
) -> NearestTwo {
    // Approximate distances and their minimum (both vectorized).
    let mut lowest = [f32::INFINITY; 16];
    for (distances, norms) in dots
        .chunks_exact_mut(16)
        .zip(shifted_norms.chunks_exact(16))
    {
        for lane in 0..16 {
            distances[lane] = norms[lane] - 2.0 * distances[lane];
            lowest[lane] = lowest[lane].min(distances[lane]);
        }
    }
    let best = lowest.into_iter().fold(f32::INFINITY, f32::min);
    // Every centroid that may be nearer than the approximate best, re-scored in
    // f32 (a chunk of 16 is looked into only when one of them is that near).
    let threshold = best + 2.0 * error;
    candidates.clear();
    for (chunk, distances) in dots[..k].chunks(16).enumerate() {
        let near = distances
            .iter()
            .fold(false, |near, &distance| near | (distance <= threshold));
        if !near {
            continue;
        }
        for (lane, &distance) in distances.iter().enumerate() {
            if distance <= threshold {
                let index = chunk * 16 + lane;
                let centroid = &centroids[index * dim..][..dim];
                candidates.push((quiver_simd::l2sq_f32(row, centroid), index as u32));
            }
        }
    }
    let (mut first, mut second) = ((f32::INFINITY, u32::MAX), (f32::INFINITY, u32::MAX));
    for &(distance, index) in candidates.iter() {
        if distance < second.0 {
            if distance < first.0 {
                second = first;
                first = (distance, index);
            } else {
                second = (distance, index);
            }
        }
    }
    if first.1 == u32::MAX {
        // No distance compared as a number (a row whose products overflowed
        // to infinity or NaN): list 0, so that every row has a list.
        return NearestTwo {
            first: 0,
            second: 0,
            margin: 0.0,
        };
    }
    if second.1 != u32::MAX || k == 1 {
        return NearestTwo {
            first: first.1,
            second: if k == 1 { first.1 } else { second.1 },
            margin: if k == 1 { 0.0 } else { second.0 - first.0 },
        };
    }
    // Only the nearest is that near: the second at bf16 precision.
    dots[first.1 as usize] = f32::INFINITY;
    let mut lowest = [(f32::INFINITY, u32::MAX); 16];
    for (chunk, distances) in dots[..k].chunks(16).enumerate() {
        for (lane, &distance) in distances.iter().enumerate() {
            if distance < lowest[lane].0 {
                lowest[lane] = (distance, (chunk * 16 + lane) as u32);
            }
        }
    }
    let other = lowest.into_iter().fold((f32::INFINITY, u32::MAX), |a, b| {
        if b.0 < a.0 || (b.0 == a.0 && b.1 < a.1) {
            b
        } else {
            a
        }
    });
    if other.1 == u32::MAX {
        return NearestTwo {
            first: first.1,
            second: first.1,
            margin: 0.0,
        };
    }
    NearestTwo {
        first: first.1,
        second: other.1,
        margin: (other.0 - best).max(0.0),
    }
}

/// Assigns rows to their nearest list, except that no list may hold more than
/// `capacity` rows while the rows it sheds (those closest to their second choice)
/// fit in their second-nearest list: bounds the largest list, and so the cost of
/// probing it, at a small cost in recall for the few rows moved.
fn assign_balanced(nearest: &[NearestTwo], lists: usize, capacity: usize) -> Vec<u32> {
    let mut assignments: Vec<u32> = nearest.iter().map(|pair| pair.first).collect();
    let mut counts = vec![0usize; lists];
    for &list in &assignments {
        counts[list as usize] += 1;
    }
    if counts.iter().all(|&count| count <= capacity) {
        return assignments;
    }
    let mut movable: Vec<usize> = (0..nearest.len())
        .filter(|&row| counts[nearest[row].first as usize] > capacity)
        .collect();
    movable.sort_by(|&a, &b| nearest[a].margin.total_cmp(&nearest[b].margin));
    for row in movable {
        let (from, to) = (nearest[row].first as usize, nearest[row].second as usize);
        if counts[from] > capacity && counts[to] < capacity && from != to {
            counts[from] -= 1;
            counts[to] += 1;
            assignments[row] = to as u32;
        }
    }
    assignments
}

fn recompute_means(
    data: &[f32],
    dim: usize,
    assignments: &[u32],
    centroids: &mut [f32],
) -> Vec<usize> {
    let k = centroids.len() / dim;
    let mut sums = vec![0f64; k * dim];
    let mut counts = vec![0usize; k];
    for (row, &cluster) in data.chunks_exact(dim).zip(assignments) {
        let cluster = cluster as usize;
        counts[cluster] += 1;
        for (sum, &value) in sums[cluster * dim..][..dim].iter_mut().zip(row) {
            *sum += value as f64;
        }
    }
    for cluster in 0..k {
        if counts[cluster] == 0 {
            continue;
        }
        let inverse = 1.0 / counts[cluster] as f64;
        for (centroid, sum) in centroids[cluster * dim..][..dim]
            .iter_mut()
            .zip(&sums[cluster * dim..][..dim])
        {
            *centroid = (sum * inverse) as f32;
        }
    }
    counts
}

/// Moves every centroid to the mean of its rows; an empty cluster takes half of
/// the largest cluster by splitting it (as faiss does), so no list stays unused
/// while another is overloaded.
fn update_centroids(
    data: &[f32],
    dim: usize,
    assignments: &[u32],
    centroids: &mut [f32],
    rng: &mut impl Rng,
) {
    let k = centroids.len() / dim;
    let mut counts = recompute_means(data, dim, assignments, centroids);
    for empty in 0..k {
        if counts[empty] != 0 {
            continue;
        }
        let (largest, largest_count) = max_count(&counts);
        if largest_count < 2 {
            continue;
        }
        split(centroids, dim, largest, empty, rng);
        counts[empty] = largest_count / 2;
        counts[largest] = largest_count - largest_count / 2;
    }
    // Balance: a list over twice the average takes the centroid of a list under a
    // quarter of it (whose rows find other lists next iteration), a bounded number
    // of times per iteration, so dense regions end up with more lists.
    let average = (data.len() / dim).div_ceil(k).max(1);
    for _ in 0..k / 8 + 1 {
        let (largest, largest_count) = max_count(&counts);
        if largest_count <= OVERSIZE_SPLIT_FACTOR * average {
            break;
        }
        let Some((smallest, smallest_count)) = counts
            .iter()
            .enumerate()
            .filter(|(list, _)| *list != largest)
            .min_by_key(|(_, count)| **count)
            .map(|(list, count)| (list, *count))
        else {
            break;
        };
        if smallest_count * 4 > average {
            break;
        }
        split(centroids, dim, largest, smallest, rng);
        counts[smallest] = largest_count / 2;
        counts[largest] = largest_count - largest_count / 2;
    }
}

fn max_count(counts: &[usize]) -> (usize, usize) {
    let (list, count) = counts
        .iter()
        .enumerate()
        .max_by_key(|(_, count)| **count)
        .expect("k >= 1");
    (list, *count)
}

/// Puts centroid `target` next to `source`: two centroids nudged apart around it.
fn split(centroids: &mut [f32], dim: usize, source: usize, target: usize, rng: &mut impl Rng) {
    for d in 0..dim {
        let value = centroids[source * dim + d];
        let nudge = 1.0 + 1e-3 * (rng.random::<f32>() - 0.5);
        centroids[target * dim + d] = value * nudge;
        centroids[source * dim + d] = value / nudge;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_well_separated_clusters_and_uses_every_list() {
        let dim = 16;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let centers: Vec<Vec<f32>> = (0..8)
            .map(|_| (0..dim).map(|_| rng.random_range(-10.0..10.0)).collect())
            .collect();
        let mut data = Vec::new();
        let mut truth = Vec::new();
        for row in 0..4000 {
            let center = row % 8;
            truth.push(center);
            data.extend(
                centers[center]
                    .iter()
                    .map(|c| c + rng.random_range(-0.1..0.1)),
            );
        }
        let clustering =
            train_and_assign(&data, dim, 8, 10, 64, 1, Geometry::Euclidean, &|_, _| {});
        // Every true cluster maps onto exactly one list.
        let mut mapping = vec![None; 8];
        for (row, &list) in clustering.assignments.iter().enumerate() {
            let expected = mapping[truth[row]].get_or_insert(list);
            assert_eq!(*expected, list, "row {row} split from its cluster");
        }
        let mut lists: Vec<u32> = mapping.into_iter().map(|m| m.unwrap()).collect();
        lists.sort();
        lists.dedup();
        assert_eq!(lists.len(), 8, "every list is used");
    }

    #[test]
    fn a_row_with_overflowing_distances_still_gets_a_list() {
        // Squares of 1e38 overflow f32: the row's distances are infinite or
        // NaN, on the tile path and the block path alike.
        for dim in [8, 64] {
            for k in [1usize, 3] {
                let mut centroids = vec![0f32; k * dim];
                for (index, value) in centroids.iter_mut().enumerate() {
                    *value = (index % 7) as f32 * 0.1;
                }
                let mut data = vec![1e38f32; dim];
                data.extend(vec![0.5f32; dim]);
                data.extend(vec![-3e38f32; dim]);
                let mut assignments = vec![u32::MAX; 3];
                assign(&data, dim, &centroids, &mut assignments);
                for (row, &list) in assignments.iter().enumerate() {
                    assert!(
                        (list as usize) < k,
                        "dim {dim} k {k}: row {row} in list {list}"
                    );
                }
                let nearest = nearest_two(&data, dim, &centroids);
                for pair in nearest {
                    assert!((pair.first as usize) < k && (pair.second as usize) < k);
                }
            }
        }
    }

    #[test]
    fn no_list_exceeds_four_times_the_average() {
        // One dense blob and a sprinkle: plain k-means would put most rows in few lists.
        let dim = 8;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut data = Vec::new();
        for row in 0..6000 {
            let spread = if row % 10 == 0 { 10.0 } else { 0.01 };
            data.extend((0..dim).map(|_| rng.random_range(-spread..spread)));
        }
        let clustering =
            train_and_assign(&data, dim, 40, 6, 64, 2, Geometry::Euclidean, &|_, _| {});
        let mut counts = vec![0usize; 40];
        for &list in &clustering.assignments {
            counts[list as usize] += 1;
        }
        let largest = *counts.iter().max().unwrap();
        assert!(
            largest <= 4 * 6000usize.div_ceil(40),
            "largest list {largest}"
        );
    }

    #[test]
    fn every_row_is_in_the_list_of_its_nearest_centroid() {
        // Tight clusters, more of them than lists, some lists overfull: the
        // final assignment's cap moves rows to their second list, and the
        // centroids move to their lists' means after it. A search probes the
        // lists nearest the query (clustered data calibrates to the nearest
        // one), so a row anywhere else is not found even by its own vector.
        let dim = 16;
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let centres: Vec<f32> = (0..200 * dim)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let mut data = Vec::new();
        for row in 0..6000 {
            // Cluster sizes from 3 to 87 rows: dense regions overfill lists.
            let centre = (row * row / 7 + row) % 200;
            data.extend(
                (0..dim).map(|d| centres[centre * dim + d] + rng.random_range(-0.05..0.05)),
            );
        }
        for geometry in [Geometry::Euclidean, Geometry::InnerProduct] {
            let clustering = train_and_assign(&data, dim, 40, 6, 64, 4, geometry, &|_, _| {});
            let matched = geometry.matching(&clustering.centroids, dim);
            let mut nearest = vec![0u32; 6000];
            assign(&data, dim, &matched, &mut nearest);
            let misplaced = clustering
                .assignments
                .iter()
                .zip(&nearest)
                .filter(|(list, nearest)| list != nearest)
                .count();
            assert_eq!(
                misplaced, 0,
                "{geometry:?}: rows not in their nearest centroid's list"
            );
        }
    }

    #[test]
    fn the_nearest_on_tiles_is_the_nearest_in_f32() {
        if !quiver_simd::tile_products_available() {
            assert!(
                !quiver_simd::cpu_has_bf16_products()
                    || std::env::var_os("QUIVER_SIMD_NO_TILES").is_some()
                    || !quiver_simd::tiles_allowed_by_cap(),
                "the CPU has a bf16 product unit (AMX or AVX512-BF16) but it is not used"
            );
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(31);
        // Clustered rows far from the origin, centroids drawn from the rows
        // (near-ties between neighbouring centroids are common).
        for (dim, offset) in [(96, 3.0f32), (384, 0.0), (33, 10.0)] {
            let centers: Vec<f32> = (0..dim * 20).map(|_| rng.random_range(-1.0..1.0)).collect();
            let data: Vec<f32> = (0..3000 * dim)
                .map(|i| {
                    let (row, d) = (i / dim, i % dim);
                    offset + centers[(row % 20) * dim + d] + rng.random_range(-0.3..0.3)
                })
                .collect();
            let centroids: Vec<f32> = (0..150)
                .flat_map(|c| data[(c * 19) * dim..][..dim].to_vec())
                .map(|v| v + rng.random_range(-0.01..0.01))
                .collect();
            let tiles = nearest_two_on_tiles(&data, dim, &centroids);
            let blocked = nearest_two_blocked(&data, dim, &centroids);
            let distance = |row: usize, centroid: u32| {
                quiver_simd::l2sq_f32(
                    &data[row * dim..][..dim],
                    &centroids[centroid as usize * dim..][..dim],
                )
            };
            let mut same = 0;
            for (row, (a, b)) in tiles.iter().zip(&blocked).enumerate() {
                let (da, db) = (distance(row, a.first), distance(row, b.first));
                // The block kernel's ‖c‖² − 2·x·c loses ~1e-7 of ‖x‖² to rounding.
                let norm =
                    quiver_simd::dot_f32(&data[row * dim..][..dim], &data[row * dim..][..dim]);
                assert!(
                    da <= db + 1e-5 * norm,
                    "dim {dim} row {row}: tiles chose {} at {da}, f32 {} at {db}",
                    a.first,
                    b.first
                );
                assert_ne!(
                    a.first, a.second,
                    "dim {dim} row {row}: second is the first"
                );
                same += usize::from(a.first == b.first);
            }
            assert!(
                same * 100 >= 99 * tiles.len(),
                "dim {dim}: {same} of {} the same",
                tiles.len()
            );
        }
    }

    #[test]
    fn assignment_is_the_nearest_centroid() {
        let dim = 5;
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let data: Vec<f32> = (0..dim * 300)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let centroids: Vec<f32> = (0..dim * 37).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut assignments = vec![0; 300];
        assign(&data, dim, &centroids, &mut assignments);
        for (row, &chosen) in data.chunks_exact(dim).zip(&assignments) {
            let best = centroids
                .chunks_exact(dim)
                .map(|c| quiver_simd::l2sq_f32(row, c))
                .fold(f32::INFINITY, f32::min);
            let got = quiver_simd::l2sq_f32(row, &centroids[chosen as usize * dim..][..dim]);
            assert!(got <= best + 1e-4);
        }
    }
}
