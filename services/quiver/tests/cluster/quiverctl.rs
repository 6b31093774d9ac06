//! `quiverctl` refusing bad arguments before it does anything, and saying
//! what went wrong once.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn quiverctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quiverctl"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn load_refuses_a_batch_of_zero_before_sending_anything() {
    // A listener that counts connections: nothing may reach it.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let directory = tempfile::tempdir().unwrap();
    let fvecs = directory.path().join("rows.fvecs");
    let mut bytes = Vec::new();
    for row in 0..10u32 {
        bytes.extend_from_slice(&2i32.to_le_bytes());
        bytes.extend_from_slice(&(row as f32).to_le_bytes());
        bytes.extend_from_slice(&1f32.to_le_bytes());
    }
    std::fs::write(&fvecs, bytes).unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    let accepting = std::thread::spawn(move || {
        for _ in 0..40 {
            if let Ok((mut stream, _)) = listener.accept() {
                counter.fetch_add(1, Ordering::SeqCst);
                let mut buffer = [0u8; 1024];
                let _ = stream.read(&mut buffer);
                let _ = stream
                    .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n");
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    });
    for flag in ["--batch", "--concurrency"] {
        let output = quiverctl(&[
            "--endpoint",
            &endpoint,
            "load",
            "docs",
            "--fvecs",
            fvecs.to_str().unwrap(),
            flag,
            "0",
        ]);
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(flag) && stderr.contains("0 is not in 1.."),
            "{stderr}"
        );
    }
    accepting.join().unwrap();
    assert_eq!(connections.load(Ordering::SeqCst), 0, "nothing was sent");
}

#[test]
fn a_missing_file_is_reported_once() {
    let output = quiverctl(&["load", "docs", "--fvecs", "/nonexistent.fvecs"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("reading /nonexistent.fvecs"), "{stderr}");
}

#[test]
fn create_help_explains_dim_and_lists_the_metrics() {
    let output = quiverctl(&["collections", "create", "--help"]);
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    let dim_line = help
        .lines()
        .find(|line| line.trim_start().starts_with("--dim"))
        .unwrap_or_default();
    assert!(dim_line.contains("Dimension"), "{help}");
    assert!(
        help.contains("[possible values: cosine, dot, l2]"),
        "{help}"
    );
    let output = quiverctl(&[
        "collections",
        "create",
        "c",
        "--dim",
        "4",
        "--metric",
        "hamming",
    ]);
    assert_eq!(output.status.code(), Some(2));
}
