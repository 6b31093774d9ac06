use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::support::free_address;

/// Returns the status code and body of `GET path` on `address`, if it answers.
fn http_get(address: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())?;
    Some((status, body))
}

fn wait_ready(http_address: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some((200, _)) = http_get(http_address, "/readyz") {
            let (_, metrics) = http_get(http_address, "/metrics").unwrap_or_default();
            return Ok(metrics);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{http_address}/readyz never answered 200")
}

fn terminate(mut child: Child) -> anyhow::Result<std::process::ExitStatus> {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            child.kill()?;
            bail!("no exit within 15 s of sigterm");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_node_starts_from_environment_variables_alone() -> anyhow::Result<()> {
    let directory = tempfile::tempdir()?;
    let http_address = free_address();
    let child = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .arg("meta")
        .env("QUIVER_NODE_ID", "1")
        .env("QUIVER_DATA_DIR", directory.path().join("data"))
        .env("QUIVER_LISTEN", free_address())
        .env("QUIVER_INIT", "true")
        .env("QUIVER_HTTP_LISTEN", &http_address)
        .env("QUIVER_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let metrics = wait_ready(&http_address);
    let status = terminate(child)?;
    let metrics = metrics?;
    assert!(metrics.contains("quiver_meta_raft_term 1"), "{metrics}");
    assert!(
        metrics.contains("quiver_meta_raft_is_leader 1"),
        "{metrics}"
    );
    assert!(status.success(), "exit after sigterm: {status}");
    assert_eq!(
        http_get(&http_address, "/healthz"),
        None,
        "the http port is closed after exit"
    );
    Ok(())
}

#[test]
fn a_node_starts_from_a_config_file_alone() -> anyhow::Result<()> {
    let directory = tempfile::tempdir()?;
    let http_address = free_address();
    let config_path = directory.path().join("quiver.toml");
    let data_dir = directory.path().join("data");
    std::fs::write(
        &config_path,
        format!(
            "log_format = \"text\"\nhttp_listen = \"{http_address}\"\n\n[meta]\nnode_id = 7\ndata_dir = \"{}\"\nlisten = \"{}\"\ninit = true\nsnapshot_logs = 100\n",
            data_dir.display(),
            free_address()
        ),
    )?;
    let child = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .arg("meta")
        .arg("--config")
        .arg(&config_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let metrics = wait_ready(&http_address);
    let healthz = http_get(&http_address, "/healthz");
    let status = terminate(child)?;
    let metrics = metrics?;
    assert!(metrics.contains("quiver_meta_raft_leader 7"), "{metrics}");
    assert_eq!(healthz.map(|(code, _)| code), Some(200));
    assert!(status.success(), "exit after sigterm: {status}");
    assert!(data_dir.join("raft-log.redb").exists());
    Ok(())
}
