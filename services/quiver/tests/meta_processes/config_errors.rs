use std::process::Command;

use crate::support::free_address;

fn run_quiver(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(args)
        .output()
        .expect("quiver runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    )
}

#[test]
fn bad_configuration_exits_non_zero_with_a_one_line_reason() -> anyhow::Result<()> {
    let directory = tempfile::tempdir()?;
    let data_dir = directory.path().join("data");
    let data_dir = data_dir.to_str().expect("utf-8 path");
    let listen = free_address();
    let unknown_key = directory.path().join("unknown.toml");
    std::fs::write(&unknown_key, "[meta]\nnode_id = 1\ncolour = \"red\"\n")?;
    let bad_timeouts = directory.path().join("timeouts.toml");
    std::fs::write(
        &bad_timeouts,
        "[meta]\nelection_timeout_min_ms = 100\nelection_timeout_max_ms = 50\n",
    )?;

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["meta", "--data-dir", data_dir, "--listen", &listen],
            "--node-id",
        ),
        (
            vec![
                "meta",
                "--node-id",
                "0",
                "--data-dir",
                data_dir,
                "--listen",
                &listen,
            ],
            "node_id",
        ),
        (
            vec![
                "meta",
                "--node-id",
                "1",
                "--data-dir",
                data_dir,
                "--listen",
                "nowhere",
            ],
            "listen",
        ),
        (
            vec![
                "meta",
                "--node-id",
                "1",
                "--data-dir",
                data_dir,
                "--listen",
                &listen,
                "--config",
                unknown_key.to_str().expect("utf-8"),
            ],
            "colour",
        ),
        (
            vec![
                "meta",
                "--node-id",
                "1",
                "--data-dir",
                data_dir,
                "--listen",
                &listen,
                "--config",
                bad_timeouts.to_str().expect("utf-8"),
            ],
            "election_timeout",
        ),
        (
            vec![
                "meta",
                "--node-id",
                "1",
                "--data-dir",
                data_dir,
                "--listen",
                &listen,
                "--peers",
                "2=127.0.0.1:1",
                "--init",
            ],
            "--init",
        ),
    ];
    let mut cases = cases;
    cases.push((
        vec![
            "meta",
            "--node-id",
            "1",
            "--data-dir",
            data_dir,
            "--listen",
            &listen,
            "--http-listen",
            "nowhere",
        ],
        "--http-listen",
    ));
    for (args, expected) in cases {
        let (success, stderr) = run_quiver(&args);
        assert!(!success, "{args:?} should fail");
        assert_eq!(
            stderr.lines().count(),
            1,
            "{args:?}: one line expected, got {stderr:?}"
        );
        assert!(stderr.starts_with("error:"), "{stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: `{expected}` not in {stderr:?}"
        );
    }
    Ok(())
}

/// The gateway and standalone roles: bad `[gateway]`, `[searcher]` and
/// `[indexer]` sections and bad TLS files stop them at start with one line
/// naming the key or the file.
#[test]
fn bad_gateway_configuration_exits_non_zero_with_a_one_line_reason() -> anyhow::Result<()> {
    let directory = tempfile::tempdir()?;
    let path_of = |name: &str| directory.path().join(name).display().to_string();
    let write = |name: &str, text: &str| -> anyhow::Result<String> {
        std::fs::write(directory.path().join(name), text)?;
        Ok(path_of(name))
    };
    let unknown_key = write("unknown.toml", "[gateway]\ncolour = \"red\"\n")?;
    let wrong_type = write("wrong_type.toml", "[gateway]\nmax_k = \"many\"\n")?;
    let zero_limit = write("zero.toml", "[gateway]\nmax_batch_points = 0\n")?;
    let bad_size = write("size.toml", "[gateway]\nmax_request_bytes = \"huge\"\n")?;
    let unknown_section = write("section.toml", "[gatewey]\nmax_k = 10\n")?;
    let searcher_unknown = write("searcher_unknown.toml", "[searcher]\ncache = 1\n")?;
    let searcher_zero = write(
        "searcher_zero.toml",
        "[searcher]\nheartbeat_interval_ms = 0\n",
    )?;
    let searcher_backoff = write(
        "searcher_backoff.toml",
        "[searcher]\nwatch_initial_backoff_ms = 9000\nwatch_max_backoff_ms = 100\n",
    )?;
    let indexer_zero = write("indexer_zero.toml", "[indexer]\nmax_payload_bytes = 0\n")?;
    let indexer_size = write(
        "indexer_size.toml",
        "[indexer]\nmax_payload_bytes = \"roomy\"\n",
    )?;
    let storage_unknown = write("storage_unknown.toml", "[storage]\ntimeout_ms = 1\n")?;
    let storage_zero = write("storage_zero.toml", "[storage]\nrequest_timeout_ms = 0\n")?;
    let storage_order = write(
        "storage_order.toml",
        "[storage]\nrequest_timeout_ms = 5000\noperation_timeout_ms = 1000\n",
    )?;
    let key_only = write(
        "key_only.toml",
        "[gateway]\ntls_key = \"/nowhere/key.pem\"\n",
    )?;
    let first = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    let second = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    let cert = write("cert.pem", &first.cert.pem())?;
    let other_key = write("other.key", &second.signing_key.serialize_pem())?;
    let not_pem = write("not.pem", "hello\n")?;
    let missing = path_of("missing.pem");
    let data_dir = path_of("data");
    let http = free_address();
    let grpc = free_address();

    let standalone = |extra: &[&str]| -> Vec<String> {
        let mut args = vec![
            "standalone".to_string(),
            "--data-dir".into(),
            data_dir.clone(),
            "--http-listen".into(),
            http.clone(),
            "--grpc-listen".into(),
            grpc.clone(),
        ];
        args.extend(extra.iter().map(|arg| arg.to_string()));
        args
    };
    let gateway = |extra: &[&str]| -> Vec<String> {
        let mut args = vec![
            "gateway".to_string(),
            "--meta".into(),
            "127.0.0.1:1".into(),
            "--http-listen".into(),
            http.clone(),
            "--grpc-listen".into(),
            grpc.clone(),
        ];
        args.extend(extra.iter().map(|arg| arg.to_string()));
        args
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            standalone(&["--config", &unknown_key]),
            "unknown field `colour`",
        ),
        (standalone(&["--config", &wrong_type]), "max_k"),
        (
            standalone(&["--config", &zero_limit]),
            "max_batch_points must be at least 1",
        ),
        (standalone(&["--config", &bad_size]), "huge"),
        (standalone(&["--config", &unknown_section]), "gatewey"),
        (
            standalone(&["--config", &searcher_unknown]),
            "unknown field `cache`",
        ),
        (
            standalone(&["--config", &searcher_zero]),
            "[searcher] heartbeat_interval_ms must be positive",
        ),
        (
            standalone(&["--config", &searcher_backoff]),
            "watch_initial_backoff_ms exceeds watch_max_backoff_ms",
        ),
        (
            standalone(&["--config", &indexer_zero]),
            "[indexer] max_payload_bytes must be at least 1, got 0",
        ),
        (standalone(&["--config", &indexer_size]), "roomy"),
        (
            standalone(&["--config", &storage_unknown]),
            "unknown field `timeout_ms`",
        ),
        (
            standalone(&["--config", &storage_zero]),
            "[storage] request_timeout_ms must be positive",
        ),
        (
            standalone(&["--config", &storage_order]),
            "request_timeout_ms (5000 ms) exceeds operation_timeout_ms (1000 ms)",
        ),
        (
            standalone(&["--config", &key_only]),
            "--tls-key needs --tls-cert",
        ),
        (
            standalone(&["--tls-cert", &cert]),
            "--tls-cert needs --tls-key",
        ),
        (
            standalone(&["--tls-cert", &missing, "--tls-key", &other_key]),
            "missing.pem",
        ),
        (
            standalone(&["--tls-cert", &not_pem, "--tls-key", &other_key]),
            "no `BEGIN CERTIFICATE`",
        ),
        (
            standalone(&["--tls-cert", &cert, "--tls-key", &not_pem]),
            "no `BEGIN PRIVATE KEY`",
        ),
        (
            standalone(&["--tls-cert", &cert, "--tls-key", &other_key]),
            "does not fit",
        ),
        (
            gateway(&["--config", &unknown_key]),
            "unknown field `colour`",
        ),
        (gateway(&["--config", &wrong_type]), "max_k"),
        (
            gateway(&["--tls-cert", &cert, "--tls-key", &other_key]),
            "does not fit",
        ),
        (
            gateway(&["--tls-key", &other_key]),
            "--tls-key needs --tls-cert",
        ),
    ];
    for (args, expected) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (success, stderr) = run_quiver(&args);
        assert!(!success, "{args:?} should fail");
        assert_eq!(
            stderr.lines().count(),
            1,
            "{args:?}: one line expected, got {stderr:?}"
        );
        assert!(stderr.starts_with("error:"), "{stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: `{expected}` not in {stderr:?}"
        );
    }
    assert!(
        !directory.path().join("data").exists(),
        "nothing is created before the configuration is checked"
    );
    Ok(())
}

/// Every flag can be set in the config file (`data_dir` for `--data-dir`): a
/// standalone started with nothing but `--config` uses the file's data
/// directory and ports, a `QUIVER_*` variable wins over the file, and a bad
/// value in the file is one line naming the flag and the file.
#[test]
fn flags_set_in_the_config_file_start_a_role() -> anyhow::Result<()> {
    let directory = tempfile::tempdir()?;
    let data_dir = directory.path().join("from-file");
    let (http, grpc_in_file, grpc_in_env) = (free_address(), free_address(), free_address());
    let config = directory.path().join("quiver.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {data_dir:?}\nhttp_listen = \"{http}\"\ngrpc_listen = \"{grpc_in_file}\"\ncache_size = \"16MiB\"\n\n[indexer]\nflush_interval_ms = 3000\n"
        ),
    )?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["standalone", "--config", config.to_str().expect("utf-8")])
        .env("QUIVER_GRPC_LISTEN", &grpc_in_env)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let listening = |address: &str| std::net::TcpStream::connect(address).is_ok();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !(listening(&http) && listening(&grpc_in_env)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (http_up, env_grpc_up, file_grpc_up) = (
        listening(&http),
        listening(&grpc_in_env),
        listening(&grpc_in_file),
    );
    let wrote_data = data_dir.is_dir() && std::fs::read_dir(&data_dir)?.next().is_some();
    child.kill()?;
    child.wait()?;
    assert!(http_up, "the file's http_listen {http} is not served");
    assert!(
        env_grpc_up,
        "QUIVER_GRPC_LISTEN {grpc_in_env} is not served"
    );
    assert!(
        !file_grpc_up,
        "the file's grpc_listen won over the variable"
    );
    assert!(wrote_data, "nothing in the file's data_dir {data_dir:?}");

    let bad = directory.path().join("bad.toml");
    std::fs::write(
        &bad,
        format!("data_dir = {data_dir:?}\nlog_format = \"JSON\"\n"),
    )?;
    let (success, stderr) = run_quiver(&["standalone", "--config", bad.to_str().expect("utf-8")]);
    assert!(!success);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--log-format") && stderr.contains("config file: log_format"),
        "{stderr}"
    );
    Ok(())
}

/// A `QUIVER_SIMD_MAX` that names no instruction set stops any role at start,
/// with one line naming the variable and the values it takes; nothing is
/// created in the data directory.
#[test]
fn a_simd_cap_naming_no_instruction_set_stops_the_process_at_start() -> anyhow::Result<()> {
    let directory = tempfile::tempdir()?;
    let data_dir = directory.path().join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["standalone", "--data-dir"])
        .arg(&data_dir)
        .args([
            "--http-listen",
            &free_address(),
            "--grpc-listen",
            &free_address(),
        ])
        .env("QUIVER_SIMD_MAX", "sse9")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    // A process that accepted the cap would serve until stopped: give it a
    // bounded time to exit, then stop it and fail.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait()?.is_none() {
        if std::time::Instant::now() > deadline {
            child.kill()?;
            child.wait()?;
            panic!("quiver started with QUIVER_SIMD_MAX=sse9 instead of refusing it");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let output = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "one line expected, got {stderr:?}"
    );
    assert!(
        stderr.starts_with("error: QUIVER_SIMD_MAX=\"sse9\"")
            && stderr.contains("scalar, avx2 or avx512"),
        "{stderr}"
    );
    assert!(!data_dir.exists(), "nothing is written before the refusal");
    Ok(())
}
