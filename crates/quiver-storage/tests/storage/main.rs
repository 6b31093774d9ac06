//! Storage against real stores: memory, a local directory, and an S3-compatible
//! server over HTTP (its endpoint in `QUIVER_TEST_S3_ENDPOINT`; without it the S3
//! parts are skipped, visibly, and under `CI=true` they fail).

use bytes::Bytes;
use quiver_storage::{
    S3Settings, Storage, StorageErrorKind, StorageOptions, StoreUrl, ensure_bucket, keys,
};
use quiver_test_support::{S3TestServer, fresh_bucket_name};

async fn stores(directory: &std::path::Path) -> Vec<Storage> {
    let options = StorageOptions::default();
    let mut stores = vec![
        Storage::open(&StoreUrl::Memory, &S3Settings::default(), options.clone()).unwrap(),
        Storage::open(
            &StoreUrl::File {
                root: directory.join("objects"),
            },
            &S3Settings::default(),
            options.clone(),
        )
        .unwrap(),
    ];
    if let Some(server) = S3TestServer::from_env("the S3 store of this test") {
        let settings = server.settings();
        let bucket = fresh_bucket_name("quiver-storage-test");
        ensure_bucket(&settings, &bucket).await.unwrap();
        // A second call on an existing bucket succeeds.
        ensure_bucket(&settings, &bucket).await.unwrap();
        let url: StoreUrl = format!("s3://{bucket}/prefix/one").parse().unwrap();
        stores.push(Storage::open(&url, &settings, options).unwrap());
    }
    stores
}

#[tokio::test]
async fn put_get_range_head_list_delete_on_every_store() {
    let directory = tempfile::tempdir().unwrap();
    for store in stores(directory.path()).await {
        let name = store.description().to_string();
        let key = keys::segment_key("c1", 2, "seg-1");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        store.put(&key, Bytes::from(data.clone())).await.unwrap();
        assert_eq!(
            store.get(&key).await.unwrap().as_ref(),
            data.as_slice(),
            "{name}"
        );
        let range = store.get_range(&key, 4096..9000).await.unwrap();
        assert_eq!(range.as_ref(), &data[4096..9000], "{name}");
        let info = store.head(&key).await.unwrap();
        assert_eq!(info.size, 100_000, "{name}");
        store
            .put(&keys::wal_key("c1", 2, 1, 1), Bytes::from_static(b"wal"))
            .await
            .unwrap();
        let mut listed: Vec<String> = store
            .list(&keys::shard_prefix("c1", 2))
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        listed.sort();
        assert_eq!(
            listed,
            vec![
                keys::segment_key("c1", 2, "seg-1"),
                keys::wal_key("c1", 2, 1, 1)
            ],
            "{name}"
        );
        // A range past the end is an error naming the object, not a short answer.
        let error = store.get_range(&key, 99_000..120_000).await.unwrap_err();
        assert!(error.to_string().contains(&key), "{name}: {error}");
        store.delete(&key).await.unwrap();
        store.delete(&key).await.unwrap();
        let missing = store.get(&key).await.unwrap_err();
        assert_eq!(
            missing.kind(),
            StorageErrorKind::NotFound,
            "{name}: {missing}"
        );
        assert!(missing.to_string().contains(&key), "{name}: {missing}");
    }
}

/// Writes `data` into an unnamed scratch file under `directory`, as a segment
/// build leaves it, and maps it.
fn finished_file(directory: &std::path::Path, data: &[u8]) -> (std::fs::File, Bytes) {
    use std::io::Write;
    let mut file = tempfile::tempfile_in(directory).unwrap();
    file.write_all(data).unwrap();
    // SAFETY: the file is unnamed and finished; nothing writes to it.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    (file, Bytes::from_owner(map))
}

#[tokio::test]
async fn a_finished_file_becomes_the_object_and_a_local_store_links_it() {
    use std::os::unix::fs::MetadataExt;
    let directory = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir_in(directory.path()).unwrap();
    for store in stores(directory.path()).await {
        let name = store.description().to_string();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 251) as u8).collect();
        let (file, bytes) = finished_file(scratch.path(), &data);
        let key = keys::segment_key("c1", 3, "linked");
        store.put_file(&key, &file, bytes).await.unwrap();
        assert_eq!(store.get(&key).await.unwrap().as_ref(), &data[..], "{name}");
        if let Some(path) = store.local_path(&key) {
            // The object is the scratch file itself, not a copy of it.
            let (object, scratch_file) =
                (std::fs::metadata(&path).unwrap(), file.metadata().unwrap());
            assert_eq!(object.ino(), scratch_file.ino(), "{name}: a copy");
            assert_eq!(object.nlink(), 1, "{name}");
            // Dropping the scratch file (and its mapping) leaves the object whole.
            drop(file);
            assert_eq!(std::fs::read(&path).unwrap(), data, "{name}");
            // A key that exists already: written over, as `put` does.
            let (again, bytes) = finished_file(scratch.path(), b"second");
            store.put_file(&key, &again, bytes).await.unwrap();
            assert_eq!(store.get(&key).await.unwrap().as_ref(), b"second", "{name}");
            // A file that had a name and lost it cannot be linked: copied.
            let named = tempfile::NamedTempFile::new_in(scratch.path()).unwrap();
            std::fs::write(named.path(), b"third").unwrap();
            let (reopened, path_of_named) = (named.reopen().unwrap(), named.path().to_owned());
            drop(named);
            assert!(!path_of_named.exists());
            // SAFETY: nothing writes to the file any more.
            let map = unsafe { memmap2::Mmap::map(&reopened) }.unwrap();
            let key = keys::segment_key("c1", 3, "copied");
            store
                .put_file(&key, &reopened, Bytes::from_owner(map))
                .await
                .unwrap();
            assert_eq!(store.get(&key).await.unwrap().as_ref(), b"third", "{name}");
            let copied = std::fs::metadata(store.local_path(&key).unwrap()).unwrap();
            assert_ne!(copied.ino(), reopened.metadata().unwrap().ino(), "{name}");
        }
    }
}

#[tokio::test]
async fn large_objects_go_up_in_parts() {
    let directory = tempfile::tempdir().unwrap();
    for store in stores(directory.path()).await {
        let name = store.description().to_string();
        // Lower the threshold so a 12 MiB object takes the multipart path (S3 parts ≥ 5 MiB).
        let options = StorageOptions {
            multipart_threshold_bytes: 6 << 20,
            part_size_bytes: 5 << 20,
            ..Default::default()
        };
        let store = Storage::from_store_with_options(&store, options);
        let data: Vec<u8> = (0..(12u32 << 20)).map(|i| (i % 253) as u8).collect();
        store
            .put("big/object", Bytes::from(data.clone()))
            .await
            .unwrap();
        let back = store.get("big/object").await.unwrap();
        assert!(
            back.as_ref() == data.as_slice(),
            "{name}: multipart object differs"
        );
        store.delete("big/object").await.unwrap();
    }
}

#[tokio::test]
async fn an_unreachable_server_fails_within_the_timeout_with_the_key() {
    let settings = S3Settings {
        endpoint: Some("http://127.0.0.1:9".into()),
        access_key_id: Some("a".into()),
        secret_access_key: Some("b".into()),
        ..Default::default()
    };
    let options = StorageOptions {
        operation_timeout: std::time::Duration::from_secs(3),
        max_retries: 2,
        initial_backoff: std::time::Duration::from_millis(10),
        ..Default::default()
    };
    let store = Storage::open(&"s3://nowhere".parse().unwrap(), &settings, options).unwrap();
    let started = std::time::Instant::now();
    let error = store.get("some/key").await.unwrap_err();
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(error.kind(), StorageErrorKind::Unavailable);
    assert!(error.to_string().contains("some/key"), "{error}");
}

/// Through a proxy that cuts off, resets or refuses half of the reads, every read
/// returns exactly the object's bytes (object_store retried or resumed it) or an
/// error naming the key — never fewer or other bytes.
#[tokio::test]
async fn reads_through_a_faulty_server_are_whole_or_errors() {
    use quiver_storage::testing::{Fault, FaultConfig, FaultProxy};
    let Some(server) = S3TestServer::from_env("this test") else {
        return;
    };
    let bucket = server.create_bucket("quiver-storage-faults").await;
    let proxy = FaultProxy::start(server.endpoint(), FaultConfig::none())
        .await
        .unwrap();
    let options = StorageOptions {
        operation_timeout: std::time::Duration::from_secs(5),
        request_timeout: std::time::Duration::from_millis(700),
        max_retries: 2,
        initial_backoff: std::time::Duration::from_millis(10),
        ..Default::default()
    };
    let store = server.storage_via(&proxy.endpoint(), &bucket, "faults", options);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 251) as u8).collect();
    store
        .put("object", Bytes::from(data.clone()))
        .await
        .unwrap();
    proxy.set_config(
        FaultConfig::new(
            0.5,
            &[Fault::TruncateBody, Fault::Reset, Fault::ServerError],
        )
        .only_methods(&["GET"]),
    );
    let (mut whole, mut failed) = (0, 0);
    for round in 0..20u64 {
        let start = round * 9_000;
        let outcome = if round % 2 == 0 {
            store.get("object").await.map(|bytes| (0, bytes))
        } else {
            store
                .get_range("object", start..start + 100_000)
                .await
                .map(|bytes| (start as usize, bytes))
        };
        match outcome {
            Ok((offset, bytes)) => {
                assert!(
                    bytes.as_ref() == &data[offset..offset + bytes.len()]
                        && (bytes.len() == data.len() || bytes.len() == 100_000),
                    "round {round}: {} bytes at {offset} differ from the object",
                    bytes.len()
                );
                whole += 1;
            }
            Err(error) => {
                assert!(error.to_string().contains("object"), "{error}");
                failed += 1;
            }
        }
    }
    let stats = proxy.stats();
    assert!(
        whole >= 10,
        "{whole} whole reads, {failed} failed; {stats:?}"
    );
    assert!(
        stats
            .injected
            .iter()
            .any(|(name, count)| *name == "truncate_body" && *count > 0),
        "{stats:?}"
    );
}

/// A multipart upload whose `CompleteMultipartUpload` the server carried out but
/// whose answer never came back (a timeout while a large object was assembled):
/// the retries find the upload gone, and the put still succeeds because the
/// object is there, whole. When the parts themselves cannot go up, the put fails
/// naming the key and nothing is left under it.
#[tokio::test]
async fn a_lost_answer_to_a_completed_multipart_upload_is_not_a_failure() {
    use quiver_storage::testing::{Fault, FaultConfig, FaultProxy};
    let Some(server) = S3TestServer::from_env("this test") else {
        return;
    };
    let bucket = server.create_bucket("quiver-storage-lost-answer").await;
    let proxy = FaultProxy::start(server.endpoint(), FaultConfig::none())
        .await
        .unwrap();
    let options = StorageOptions {
        operation_timeout: std::time::Duration::from_secs(20),
        max_retries: 2,
        initial_backoff: std::time::Duration::from_millis(10),
        multipart_threshold_bytes: 6 << 20,
        part_size_bytes: 5 << 20,
        ..Default::default()
    };
    let store = server.storage_via(&proxy.endpoint(), &bucket, "lost", options);
    let data: Vec<u8> = (0..(12u32 << 20)).map(|i| (i % 249) as u8).collect();

    // Every completion (a POST with an upload id) is carried out, its answer lost.
    proxy.set_config(
        FaultConfig::new(1.0, &[Fault::LostAnswer])
            .only_methods(&["POST"])
            .only_queries_containing("uploadId="),
    );
    store
        .put("segment", Bytes::from(data.clone()))
        .await
        .expect("the object is whole although the completion's answer was lost");
    let stats = proxy.stats();
    assert!(
        stats
            .injected
            .iter()
            .any(|(name, count)| *name == "lost_answer" && *count > 0),
        "{stats:?}"
    );
    proxy.set_config(FaultConfig::none());
    let back = store.get("segment").await.unwrap();
    assert!(back.as_ref() == data.as_slice(), "the object differs");

    // Parts that never arrive: a failure, and no object.
    proxy.set_config(
        FaultConfig::new(1.0, &[Fault::Reset])
            .only_methods(&["PUT"])
            .only_queries_containing("uploadId="),
    );
    let error = store
        .put("never", Bytes::from(data.clone()))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("never"), "{error}");
    proxy.set_config(FaultConfig::none());
    assert_eq!(
        store.head("never").await.unwrap_err().kind(),
        StorageErrorKind::NotFound
    );
}

#[tokio::test]
async fn a_bucket_is_created_outside_the_default_region_too() {
    let Some(server) = S3TestServer::from_env("bucket creation in eu-west-1") else {
        return;
    };
    let settings = S3Settings {
        region: Some("eu-west-1".into()),
        ..server.settings()
    };
    let bucket = fresh_bucket_name("quiver-storage-region");
    // The PUT names the region in its body (S3 refuses it without, outside us-east-1).
    ensure_bucket(&settings, &bucket).await.unwrap();
    ensure_bucket(&settings, &bucket).await.unwrap();
    let url: StoreUrl = format!("s3://{bucket}/p").parse().unwrap();
    let store = Storage::open(&url, &settings, StorageOptions::default()).unwrap();
    store.put("k", Bytes::from_static(b"v")).await.unwrap();
    assert_eq!(store.get("k").await.unwrap().as_ref(), b"v");
}

#[tokio::test]
async fn creating_a_bucket_on_a_closed_port_names_the_bucket_and_the_cause() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let settings = S3TestServer::settings_via(&format!("http://127.0.0.1:{port}"));
    let error = ensure_bucket(&settings, "quiver-nowhere")
        .await
        .expect_err("nothing listens there");
    assert_eq!(error.kind(), StorageErrorKind::Unavailable);
    let message = error.to_string();
    assert!(message.contains("quiver-nowhere"), "{message}");
    assert!(message.contains("HEAD"), "{message}");
}

#[test]
fn a_missing_or_empty_ca_bundle_is_refused_naming_the_file() {
    let directory = tempfile::tempdir().unwrap();
    let url: StoreUrl = "s3://quiver-ca/p".parse().unwrap();
    let missing = directory.path().join("nowhere.pem");
    let empty = directory.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    for (path, reason) in [(&missing, "No such file"), (&empty, "BEGIN CERTIFICATE")] {
        let settings = S3Settings {
            endpoint: Some("https://127.0.0.1:1".into()),
            ca_bundle: Some(path.display().to_string()),
            ..S3Settings::default()
        };
        let error =
            Storage::open(&url, &settings, StorageOptions::default()).expect_err("a bad CA bundle");
        let message = error.to_string();
        assert!(
            message.contains(&path.display().to_string()) && message.contains(reason),
            "{message}"
        );
    }
}

#[tokio::test]
async fn an_object_of_several_mebibytes_comes_back_whole_from_every_store() {
    // A local store writes a WAL object in 1 MiB pieces: every boundary and the
    // short last piece must land where they belong.
    let directory = tempfile::tempdir().unwrap();
    for store in stores(directory.path()).await {
        let name = store.description().to_string();
        for size in [(1 << 20) - 1, 1 << 20, (3 << 20) + 12_345] {
            let data: Vec<u8> = (0..size as u32).map(|i| (i * 7 % 253) as u8).collect();
            let key = keys::wal_key("c1", 4, 1, size as u64);
            store.put(&key, Bytes::from(data.clone())).await.unwrap();
            let back = store.get(&key).await.unwrap();
            assert!(back.as_ref() == &data[..], "{name}: {size} bytes");
            if let Some(path) = store.local_path(&key) {
                assert_eq!(std::fs::metadata(path).unwrap().len(), size as u64);
            }
        }
    }
}
