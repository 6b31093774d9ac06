//! Membership changes that must not leave the metadata service unable to commit:
//! promoting a learner that does not answer, and a standalone's fixed membership.

use std::time::Duration;

use quiver_meta::{MetaConfig, run_single_node_with};
use quiver_proto::ErrorCode;
use quiver_proto::meta::MemberRole;

use crate::support::{collection_spec, test_client};

/// An address no process listens on.
fn nowhere() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    listener.local_addr().expect("probe address").to_string()
}

/// Promoting a learner no process answers for would enter a joint configuration
/// that needs it for every commit (the metadata service then hangs for good):
/// it is refused, saying how far behind the learner is, and nothing changes —
/// the learner stays a learner, writes commit, and it can be removed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promoting_a_learner_that_has_not_caught_up_is_refused_and_changes_nothing()
-> anyhow::Result<()> {
    let directory = tempfile::tempdir()?;
    let server = run_single_node_with(
        MetaConfig::new(1, directory.path().join("node-1"), "127.0.0.1:0").with_fast_timings(),
    )
    .await?;
    let client = test_client(vec![server.local_address().to_string()]);
    client
        .create_collection(collection_spec("before", 1, 1))
        .await?;
    let members = client.add_learner(4, &nowhere()).await?;
    assert!(
        members
            .iter()
            .any(|member| member.id == 4 && member.role == MemberRole::Learner as i32),
        "{members:?}"
    );

    let error = client
        .promote_voter(4)
        .await
        .expect_err("promoting an unreachable learner is refused");
    assert_eq!(error.kind(), ErrorCode::FailedPrecondition, "{error}");
    let message = error.to_string();
    assert!(
        message.contains("metadata node 4") && message.contains("not caught up"),
        "the refusal names the learner and why: {message}"
    );
    assert!(
        message.contains("replicated none"),
        "the refusal says how far behind it is: {message}"
    );

    let voters: Vec<u64> = server
        .status()
        .members
        .iter()
        .filter(|member| member.role == MemberRole::Voter as i32)
        .map(|member| member.id)
        .collect();
    assert_eq!(voters, vec![1], "node 4 did not become a voter");
    assert!(server.is_ready());
    tokio::time::timeout(
        Duration::from_secs(10),
        client.create_collection(collection_spec("after", 1, 1)),
    )
    .await
    .map_err(|_| anyhow::anyhow!("a write after the refused promotion hangs"))??;
    let members = tokio::time::timeout(Duration::from_secs(10), client.remove_member(4))
        .await
        .map_err(|_| anyhow::anyhow!("removing the learner hangs"))??;
    assert_eq!(members.len(), 1, "{members:?}");
    server.shutdown().await?;
    Ok(())
}

/// `quiver standalone`'s metadata node runs in process with the other roles and
/// has no peers: adding, promoting or removing a metadata node is refused
/// before anything is proposed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_membership_refuses_every_membership_change() -> anyhow::Result<()> {
    let directory = tempfile::tempdir()?;
    let server = run_single_node_with(MetaConfig {
        fixed_membership: true,
        ..MetaConfig::new(1, directory.path(), "127.0.0.1:0").with_fast_timings()
    })
    .await?;
    let client = test_client(vec![server.local_address().to_string()]);
    let address = nowhere();
    let refusals = [
        client.add_learner(4, &address).await.err(),
        client.promote_voter(4).await.err(),
        client.remove_member(1).await.err(),
    ];
    for refusal in refusals {
        let error = refusal.expect("a membership change is refused");
        assert_eq!(error.kind(), ErrorCode::FailedPrecondition, "{error}");
        assert!(error.to_string().contains("standalone"), "{error}");
    }
    assert_eq!(server.status().members.len(), 1);
    client
        .create_collection(collection_spec("still-writable", 1, 1))
        .await?;
    server.shutdown().await?;
    Ok(())
}
