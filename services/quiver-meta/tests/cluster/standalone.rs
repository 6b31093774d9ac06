use std::time::Duration;

use quiver_meta::run_single_node;

use crate::support::{collection_spec, test_client};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_mode_initializes_itself_and_keeps_state_across_restarts() -> anyhow::Result<()>
{
    let directory = tempfile::tempdir()?;
    let server = run_single_node(directory.path(), "127.0.0.1:0").await?;
    assert!(server.is_leader());
    let address = server.local_address().to_string();
    let status = server.status();
    assert_eq!(status.members.len(), 1);
    assert_eq!(
        status.members[0].address, address,
        "the bound port is advertised"
    );
    let client = test_client(vec![address]);
    let created = client
        .create_collection(collection_spec("docs", 2, 1))
        .await?;
    assert!(created.created);
    server.shutdown().await?;

    let server = run_single_node(directory.path(), "127.0.0.1:0").await?;
    let catalog = server.catalog();
    assert!(catalog.collection("docs").is_some());
    assert_eq!(catalog.shards().count(), 2);
    let client = test_client(vec![server.local_address().to_string()]);
    let listed =
        tokio::time::timeout(Duration::from_secs(10), client.list_collections(true)).await??;
    assert_eq!(listed.len(), 1);
    server.shutdown().await?;
    Ok(())
}
