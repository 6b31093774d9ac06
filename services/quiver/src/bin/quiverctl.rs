//! `quiverctl`: the operator's command line, over the REST and admin API.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use quiver_client::{Client, ClientOptions, CollectionConfig, Point, PointId, Search};
use serde_json::Value;

/// Operate a Quiver cluster (or `quiver standalone`).
#[derive(Parser)]
#[command(name = "quiverctl", version)]
struct Cli {
    /// Gateway address.
    #[arg(
        long,
        env = "QUIVER_ENDPOINT",
        default_value = "http://127.0.0.1:7700",
        global = true
    )]
    endpoint: String,
    /// API key (sent as a bearer token).
    #[arg(long, env = "QUIVER_API_KEY", hide_env_values = true, global = true)]
    api_key: Option<String>,
    /// PEM CA certificate to trust for an https:// endpoint, besides the system's.
    #[arg(long, env = "QUIVER_CA_CERT", global = true)]
    ca_cert: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Cluster status.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Collections.
    Collections {
        #[command(subcommand)]
        command: CollectionsCommand,
    },
    /// Bulk upsert from an .fvecs file; ids are row numbers.
    Load {
        name: String,
        #[arg(long)]
        fvecs: PathBuf,
        /// Points per request (at least 1).
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        batch: u64,
        /// Requests in flight (at least 1).
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: u64,
    },
    /// Searches with vectors from an .fvecs file (one row, or all of them).
    Search {
        name: String,
        #[arg(long)]
        fvecs: PathBuf,
        #[arg(long, default_value_t = 10)]
        k: usize,
        /// Only this row of the file.
        #[arg(long)]
        row: Option<usize>,
        /// Payload filter, e.g. 'lang = "en"'.
        #[arg(long)]
        filter: Option<String>,
        #[arg(long)]
        nprobe: Option<u32>,
    },
    /// Merges a collection's segments.
    Compact { name: String },
    /// Drains a data node (its shards move elsewhere).
    Drain { node: String },
    /// Objects in the bucket that nothing references, and when the sweep deletes them.
    Orphans,
    /// Metadata membership.
    Meta {
        #[command(subcommand)]
        command: MetaCommand,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Meta leader and members, nodes, shards.
    Status,
}

#[derive(Subcommand)]
enum CollectionsCommand {
    /// Lists collections.
    List,
    /// Creates a collection.
    Create {
        name: String,
        /// Dimension of the collection's vectors (values per vector).
        #[arg(long)]
        dim: u32,
        /// Similarity: `cosine` (cosine similarity), `dot` (inner product) or
        /// `l2` (squared Euclidean distance).
        #[arg(long, default_value = "cosine", value_parser = ["cosine", "dot", "l2"])]
        metric: String,
        #[arg(long)]
        shards: Option<u32>,
        #[arg(long)]
        replication: Option<u32>,
        /// `u64` or `string`.
        #[arg(long)]
        id_type: Option<String>,
        /// Filterable payload field, NAME:TYPE (keyword, integer, float, bool); repeatable.
        #[arg(long = "field")]
        fields: Vec<String>,
    },
    /// Describes a collection (with live point count).
    Describe { name: String },
    /// Drops a collection.
    Drop { name: String },
}

#[derive(Subcommand)]
enum MetaCommand {
    /// Adds a metadata node as a learner.
    Add { id: u64, address: String },
    /// Promotes a learner to voter.
    Promote { id: u64 },
    /// Removes a metadata node.
    Remove { id: u64 },
}

fn print(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// Reads an .fvecs file: its dimension and its rows one after the other. A bad
/// file (a negative or absurd dimension, a size that is no whole number of rows)
/// is an error naming it.
fn read_fvecs(path: &Path) -> anyhow::Result<(usize, Vec<f32>)> {
    let matrix = quiver_common::vecs::read_fvecs(path, None)?;
    Ok((matrix.dim, matrix.data))
}

/// The load's progress bar: points per second in whole numbers (`4,503/s`;
/// indicatif's `{per_sec}` prints four decimals).
fn load_style() -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template(
        "load {bar:40} {pos}/{len} points [{elapsed_precise}, {rate}, eta {eta}]",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .with_key(
        "rate",
        |state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write| {
            let per_second = state.per_sec();
            let whole = if per_second.is_finite() {
                per_second.round() as u64
            } else {
                0
            };
            let _ = write!(out, "{}/s", indicatif::HumanCount(whole));
        },
    )
}

/// Checks `--batch` against the points a request may hold (the gateway's
/// `max_batch_points`), so a load too large for it fails before it starts.
fn check_batch(batch: usize) -> anyhow::Result<()> {
    let limit = quiver_gateway::Limits::default().max_batch_points;
    if batch > limit {
        bail!(
            "--batch {batch}: a request holds at most {limit} points (the gateway's max_batch_points); use --batch {limit} or less"
        );
    }
    Ok(())
}

async fn load(
    client: &Client,
    name: &str,
    path: &Path,
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    let (dim, values) = read_fvecs(path)?;
    let rows = values.len() / dim;
    let bar = indicatif::ProgressBar::new(rows as u64);
    bar.set_style(load_style());
    let started = Instant::now();
    let batches: Vec<std::ops::Range<usize>> = (0..rows)
        .step_by(batch.max(1))
        .map(|start| start..(start + batch.max(1)).min(rows))
        .collect();
    let values = std::sync::Arc::new(values);
    let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut tasks = Vec::new();
    for range in batches {
        let permit = semaphore.clone().acquire_owned().await?;
        let client = client.clone();
        let values = values.clone();
        let name = name.to_string();
        let bar = bar.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let points: Vec<Point> = range
                .clone()
                .map(|row| Point {
                    id: PointId::U64(row as u64),
                    vector: values[row * dim..(row + 1) * dim].to_vec(),
                    payload: None,
                })
                .collect();
            client.upsert(&name, &points).await?;
            bar.inc(range.len() as u64);
            Ok::<(), quiver_client::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    bar.finish();
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "loaded {rows} points of dimension {dim} into {name} in {seconds:.1} s ({:.0} points/s)",
        rows as f64 / seconds
    );
    Ok(())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let ca_certificate_pem = match &cli.ca_cert {
        Some(path) => Some(
            std::fs::read(path)
                .with_context(|| format!("cannot read --ca-cert {}", path.display()))?,
        ),
        None => None,
    };
    let client = Client::with_options(
        &cli.endpoint,
        ClientOptions {
            api_key: cli.api_key.clone(),
            ca_certificate_pem,
        },
    )?;
    match cli.command {
        Command::Cluster {
            command: ClusterCommand::Status,
        } => print(&client.cluster_status().await?),
        Command::Collections { command } => match command {
            CollectionsCommand::List => {
                for collection in client.list_collections().await? {
                    println!(
                        "{}\tdim={}\tmetric={}\tshards={}",
                        collection.name, collection.dimension, collection.metric, collection.shards
                    );
                }
            }
            CollectionsCommand::Create {
                name,
                dim,
                metric,
                shards,
                replication,
                id_type,
                fields,
            } => {
                let payload_schema = fields
                    .iter()
                    .map(|field| {
                        let (field, kind) = field
                            .split_once(':')
                            .with_context(|| format!("--field {field} is not NAME:TYPE"))?;
                        Ok(serde_json::json!({"name": field, "type": kind}))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let config = CollectionConfig {
                    dimension: dim,
                    metric,
                    id_type,
                    shards,
                    replication,
                    payload_schema,
                };
                print(&client.create_collection(&name, &config).await?);
            }
            CollectionsCommand::Describe { name } => print(&client.describe(&name).await?),
            CollectionsCommand::Drop { name } => {
                client.drop_collection(&name).await?;
                println!("dropped {name}");
            }
        },
        Command::Load {
            name,
            fvecs,
            batch,
            concurrency,
        } => {
            // Both are at least 1 (clap checks): a batch of 0 would never end.
            let batch = usize::try_from(batch).unwrap_or(usize::MAX);
            let concurrency = usize::try_from(concurrency).unwrap_or(usize::MAX);
            check_batch(batch)?;
            load(&client, &name, &fvecs, batch, concurrency).await?
        }
        Command::Search {
            name,
            fvecs,
            k,
            row,
            filter,
            nprobe,
        } => {
            let (dim, values) = read_fvecs(&fvecs)?;
            let rows = values.len() / dim;
            let selected: Vec<usize> = match row {
                Some(row) if row >= rows => bail!("--row {row}: the file has {rows} rows"),
                Some(row) => vec![row],
                None => (0..rows).collect(),
            };
            for row in selected {
                let mut search = Search::new(values[row * dim..(row + 1) * dim].to_vec(), k);
                search.filter = filter.clone().map(Value::String);
                search.nprobe = nprobe;
                let result = client.search(&name, &search).await?;
                let hits: Vec<String> = result
                    .hits
                    .iter()
                    .map(|hit| format!("{}:{:.4}", hit.id, hit.score))
                    .collect();
                println!("row {row}\t{:.2} ms\t{}", result.took_ms, hits.join(" "));
            }
        }
        Command::Compact { name } => {
            // Large shards compact for longer than one request waits: ask again
            // (joining the running compaction) until every shard is done.
            let started = std::time::Instant::now();
            let mut merges = 0;
            loop {
                let mut answer = client.compact_once(&name).await?;
                merges += answer.merges;
                if answer.done {
                    answer.merges = merges;
                    print(&answer);
                    break;
                }
                eprintln!(
                    "compacting {name}: shards {:?} still running ({:.0} s)",
                    answer.running_shards.unwrap_or_default(),
                    started.elapsed().as_secs_f64()
                );
            }
        }
        Command::Drain { node } => print(&client.drain(&node).await?),
        Command::Orphans => print(&client.orphans().await?),
        Command::Meta { command } => {
            let answer = match command {
                MetaCommand::Add { id, address } => {
                    client.meta_members("add", id, Some(&address)).await?
                }
                MetaCommand::Promote { id } => client.meta_members("promote", id, None).await?,
                MetaCommand::Remove { id } => client.meta_members("remove", id, None).await?,
            };
            print(&answer);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", one_line(&error));
            ExitCode::FAILURE
        }
    }
}

/// Returns `error` and its causes on one line, each cause once: some errors
/// print their source in their own message too (`reading F: No such file or
/// directory`), and `{:#}` would repeat it.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string().replace('\n', " ");
        if line.ends_with(&text) || line.contains(&format!("{text}: ")) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::{check_batch, load_style, one_line};

    /// A terminal that keeps what a progress bar draws.
    #[derive(Debug, Clone, Default)]
    struct Screen(Arc<Mutex<String>>);

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            160
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, line: &str) -> std::io::Result<()> {
            self.write_str(line)
        }
        fn write_str(&self, text: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push_str(text);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            self.0.lock().unwrap().clear();
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_load_rate_is_printed_in_whole_points_per_second() {
        let screen = Screen::default();
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(100_000),
            indicatif::ProgressDrawTarget::term_like(Box::new(screen.clone())),
        );
        bar.set_style(load_style());
        for _ in 0..50 {
            std::thread::sleep(std::time::Duration::from_micros(300));
            bar.inc(997);
        }
        bar.finish();
        let line = screen.0.lock().unwrap().clone();
        let rate = line
            .split(", ")
            .find(|part| part.ends_with("/s"))
            .unwrap_or_else(|| panic!("no rate in {line:?}"));
        let digits = rate.trim_end_matches("/s");
        assert!(
            !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit() || c == ','),
            "{line:?}"
        );
    }

    #[test]
    fn a_batch_larger_than_a_request_may_hold_is_refused_up_front() {
        check_batch(1).unwrap();
        check_batch(10_000).unwrap();
        let error = check_batch(20_000).unwrap_err().to_string();
        assert!(
            error.contains("--batch 20000: a request holds at most 10000 points"),
            "{error}"
        );
    }

    #[test]
    fn an_error_whose_message_holds_its_source_prints_it_once() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let error = anyhow::Error::new(quiver_common::vecs::VecsError::Io {
            operation: "reading",
            path: "/nonexistent.fvecs".into(),
            source: missing,
        });
        assert_eq!(
            one_line(&error),
            "reading /nonexistent.fvecs: entity not found"
        );
        let chained = anyhow::anyhow!("inner").context("outer");
        assert_eq!(one_line(&chained), "outer: inner");
    }
}
