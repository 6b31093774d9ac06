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

/// A client in the server's process reaches it without the network once the
/// service is registered for in-process calls (what `quiver standalone` does):
/// an address no socket listens on answers while registered, and fails once
/// the registration is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_process_registration_serves_calls_without_a_socket() -> anyhow::Result<()> {
    let directory = tempfile::tempdir()?;
    let server = run_single_node(directory.path(), "127.0.0.1:0").await?;
    // Nothing listens here: a network call is refused at once.
    let nowhere = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?.to_string()
    };
    let registration = quiver_proto::serve_in_process(nowhere.clone(), server.local_service());
    let client = test_client(vec![nowhere.clone()]);
    let created = client
        .create_collection(collection_spec("docs", 1, 1))
        .await?;
    assert!(created.created);
    let listed = client.list_collections(true).await?;
    assert_eq!(listed.len(), 1, "a linearizable read in process");
    drop(registration);
    let refused =
        tokio::time::timeout(Duration::from_secs(30), client.cluster_status_of(&nowhere)).await?;
    assert!(
        refused.is_err(),
        "no registration: the call goes to the network"
    );
    server.shutdown().await?;
    Ok(())
}

/// With its handlers registered for direct calls (`quiver standalone`), a
/// client in the process calls them with the messages as they are — no encoded
/// service behind the address, no socket — and falls back to the channel once
/// the registration is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_handlers_answer_direct_calls_without_encoding() -> anyhow::Result<()> {
    let directory = tempfile::tempdir()?;
    let server = run_single_node(directory.path(), "127.0.0.1:0").await?;
    let nowhere = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?.to_string()
    };
    // Only the handlers: a call that took the channel would find no service
    // and be refused by the closed port.
    let registration = quiver_proto::serve_meta_in_process(nowhere.clone(), server.local_meta());
    let client = test_client(vec![nowhere.clone()]);
    let created = client
        .create_collection(collection_spec("docs", 2, 1))
        .await?;
    assert!(created.created);
    let routing = client.get_routing("docs", true).await?;
    assert_eq!(routing.collections.len(), 1);
    assert_eq!(
        routing.shards.len(),
        2,
        "a linearizable routing read, direct"
    );
    let missing = client.get_routing("nope", true).await;
    assert!(
        missing.is_err_and(|error| error
            .to_string()
            .contains("collection `nope` does not exist")),
        "a refusal comes back as it does over the channel"
    );
    drop(registration);
    let refused =
        tokio::time::timeout(Duration::from_secs(30), client.cluster_status_of(&nowhere)).await?;
    assert!(
        refused.is_err(),
        "unregistered: the call goes to the network"
    );
    server.shutdown().await?;
    Ok(())
}

/// A one-node metadata service decides alone what is committed: its
/// linearizable reads take no read-index round (every acknowledged write is
/// already applied on it), and see every write acknowledged before them. Once a
/// second node is added — the first step of any membership change — reads go
/// back to read-index rounds, and still see every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_alone_reads_linearizably_without_a_round_until_it_has_company() -> anyhow::Result<()>
{
    let reads = |server: &quiver_meta::MetaServer, path: &str| {
        server
            .metrics()
            .linearizable_reads_total
            .with_label_values(&[path])
            .get()
    };
    let directory = tempfile::tempdir()?;
    let server = run_single_node(&directory.path().join("node-1"), "127.0.0.1:0").await?;
    let client = test_client(vec![server.local_address().to_string()]);
    for index in 0..20 {
        let name = format!("c{index:02}");
        client
            .create_collection(collection_spec(&name, 1, 1))
            .await?;
        // Each read right after its write's acknowledgement sees it.
        let routing = client.get_routing(&name, true).await?;
        assert_eq!(routing.collections.len(), 1, "{name} seen by the next read");
    }
    assert_eq!(reads(&server, "read_index"), 0, "no read-index round alone");
    assert!(reads(&server, "local") >= 20, "every read served locally");

    // A second node joins as a learner: reads take rounds from now on.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?.to_string();
    let config = quiver_meta::MetaConfig::new(2, directory.path().join("node-2"), address.clone())
        .with_fast_timings();
    let learner =
        quiver_meta::MetaServer::start_with_listener(config, listener, None, None).await?;
    client.add_learner(2, &address).await?;
    let local_before = reads(&server, "local");
    client
        .create_collection(collection_spec("with-company", 1, 1))
        .await?;
    let routing = client.get_routing("with-company", true).await?;
    assert_eq!(routing.collections.len(), 1, "the write is seen");
    assert_eq!(
        reads(&server, "local"),
        local_before,
        "no local read once another node was added"
    );
    assert!(reads(&server, "read_index") >= 1, "a read-index round");
    learner.shutdown().await?;
    server.shutdown().await?;
    Ok(())
}
