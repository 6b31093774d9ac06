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
    let listen = free_address()?;
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
