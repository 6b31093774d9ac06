//! Starting `quiver standalone` processes and talking REST to them.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use quiver_test_support::eventually;
pub use quiver_test_support::process::free_address;
use serde_json::{Value, json};

/// Returns a rustls client configuration trusting only `ca_pem` (none: nothing,
/// which is enough for plain http).
pub fn tls_client_config(ca_pem: Option<&str>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(pem) = ca_pem {
        use rustls::pki_types::pem::PemObject;
        for certificate in rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots
                .add(certificate.expect("test CA is PEM"))
                .expect("test CA is usable");
        }
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("default TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth()
}

/// Returns an HTTP client trusting only `ca_pem` for https.
pub fn http_client(ca_pem: Option<&str>) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .use_preconfigured_tls(tls_client_config(ca_pem))
        .build()
        .expect("http client")
}

/// How to start a server besides the defaults.
#[derive(Default)]
pub struct StartOptions<'a> {
    /// Environment variables.
    pub envs: Vec<(&'a str, &'a str)>,
    /// Extra flags after the standard ones.
    pub args: Vec<String>,
    /// CA certificate (PEM) when the server serves TLS: talk https trusting it.
    pub ca_pem: Option<String>,
    /// `RUST_LOG` (default `info,openraft=warn`).
    pub rust_log: Option<&'a str>,
}

/// One `quiver standalone` process.
pub struct Standalone {
    pub http: String,
    pub grpc: String,
    /// `http` or `https`.
    pub scheme: &'static str,
    pub log_path: PathBuf,
    child: Option<Child>,
    pub client: reqwest::Client,
}

impl Standalone {
    /// Starts a server over `data_dir` and waits until `/readyz` answers 200.
    pub async fn start(data_dir: &Path, envs: &[(&str, &str)]) -> anyhow::Result<Standalone> {
        Standalone::start_with(
            data_dir,
            StartOptions {
                envs: envs.to_vec(),
                ..StartOptions::default()
            },
        )
        .await
    }

    /// Starts a server with `options` and waits until `/readyz` answers 200.
    pub async fn start_with(
        data_dir: &Path,
        options: StartOptions<'_>,
    ) -> anyhow::Result<Standalone> {
        let http = free_address();
        let grpc = free_address();
        let log_path = data_dir.with_extension(format!("{}.log", rand::random::<u32>()));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_quiver"));
        command
            .args(["standalone", "--data-dir"])
            .arg(data_dir)
            .args([
                "--http-listen",
                &http,
                "--grpc-listen",
                &grpc,
                "--cache-size",
                "64MiB",
            ])
            .args(&options.args)
            .env("RUST_LOG", options.rust_log.unwrap_or("info,openraft=warn"))
            .stdout(Stdio::null())
            .stderr(log);
        for (key, value) in &options.envs {
            command.env(key, value);
        }
        let child = command.spawn().context("spawn quiver standalone")?;
        let server = Standalone {
            http,
            grpc,
            scheme: if options.ca_pem.is_some() {
                "https"
            } else {
                "http"
            },
            log_path,
            child: Some(child),
            client: http_client(options.ca_pem.as_deref()),
        };
        server.wait_ready(Duration::from_secs(60)).await?;
        Ok(server)
    }

    /// Returns the REST base URL (`https://localhost:…` under TLS, so the
    /// certificate's name matches).
    pub fn base_url(&self) -> String {
        match self.scheme {
            "https" => format!("https://localhost:{}", self.http_port()),
            _ => format!("http://{}", self.http),
        }
    }

    /// Returns the gRPC endpoint URL (as [`Standalone::base_url`]).
    pub fn grpc_url(&self) -> String {
        let port = self.grpc.rsplit(':').next().expect("port");
        match self.scheme {
            "https" => format!("https://localhost:{port}"),
            _ => format!("http://{}", self.grpc),
        }
    }

    fn http_port(&self) -> &str {
        self.http.rsplit(':').next().expect("port")
    }

    async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let answer = self
                .client
                .get(format!("{}/readyz", self.base_url()))
                .send()
                .await;
            if answer.is_ok_and(|response| response.status().is_success()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "server not ready after {timeout:?}; log:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Returns the end of the server's log (for failure messages).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Sends `method path` with an optional JSON body; returns (status, JSON body).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_with_key(method, path, body, None).await
    }

    /// Like [`Standalone::call`], with an API key.
    pub async fn call_with_key(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        key: Option<&str>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.base_url());
        let mut request = match method {
            "GET" => self.client.get(url),
            "PUT" => self.client.put(url),
            "DELETE" => self.client.delete(url),
            _ => self.client.post(url),
        };
        if let Some(body) = body {
            request = request.json(&body);
        }
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.expect("request sent");
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or_else(|_| json!({"raw": text}));
        (status, body)
    }

    /// Sends a raw body (to test malformed JSON).
    pub async fn post_raw(&self, path: &str, body: &str) -> (u16, Value) {
        let response = self
            .client
            .post(format!("{}{path}", self.base_url()))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("request sent");
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|_| json!({"raw": text})),
        )
    }

    /// Sends `method path` with raw `body` bytes and extra `headers`; returns the
    /// status, the body as JSON (`{"raw": text}` when it is not JSON) and the
    /// response headers.
    pub async fn send_raw(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("http method");
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base_url()));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.send().await.expect("request sent");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or_else(|_| json!({"raw": text}));
        (status, body, headers)
    }

    /// Returns the whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Kills the process at once (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the process with SIGTERM and returns whether it exited cleanly.
    pub fn terminate(&mut self) -> anyhow::Result<bool> {
        let Some(mut child) = self.child.take() else {
            return Ok(false);
        };
        let status = quiver_test_support::process::terminate(&mut child, Duration::from_secs(30))
            .context("server did not stop within 30 s of SIGTERM")?;
        Ok(status.success())
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A deterministic unit-ish vector for `id` (clustered so search is meaningful).
pub fn vector(id: u64, dim: usize) -> Vec<f32> {
    let centre = id % 17;
    (0..dim)
        .map(|i| {
            let base = ((centre * 31 + i as u64 * 7) % 23) as f32 / 23.0 - 0.5;
            let noise = ((id * 2654435761 + i as u64 * 40503) % 1000) as f32 / 4000.0;
            base + noise
        })
        .collect()
}

/// One `quiver` process with its log; killed when dropped.
pub struct RoleProcess {
    pub name: String,
    /// Its HTTP address (`--http-listen`).
    pub http: String,
    log_path: PathBuf,
    pub child: Child,
}

impl RoleProcess {
    /// Starts `quiver ARGS --http-listen ADDR` with `envs`, its stderr
    /// appended to `DIRECTORY/NAME.log`.
    pub fn spawn(
        directory: &Path,
        name: &str,
        args: Vec<String>,
        envs: &[(&str, String)],
    ) -> RoleProcess {
        let http = free_address();
        let log_path = directory.join(format!("{name}.log"));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_quiver"));
        command
            .args(&args)
            .args(["--http-listen", &http])
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (key, value) in envs {
            command.env(key, value);
        }
        let child = command.spawn().expect("spawn quiver");
        RoleProcess {
            name: name.to_string(),
            http,
            log_path,
            child,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub async fn wait_ready(&self, http: &reqwest::Client) {
        let url = format!("http://{}/readyz", self.http);
        let ready = eventually(
            &format!("{} ready", self.name),
            Duration::from_secs(60),
            || async {
                let answer = http.get(&url).send().await.ok()?;
                answer.status().is_success().then_some(())
            },
        )
        .await;
        if let Err(error) = ready {
            panic!("{error:#}; log of {}:\n{}", self.name, self.log());
        }
    }

    pub async fn wait_log(&self, what: &str, needles: &[&str], timeout: Duration) {
        let found = eventually(what, timeout, || async {
            let log = self.log();
            needles
                .iter()
                .all(|needle| log.contains(needle))
                .then_some(())
        })
        .await;
        if let Err(error) = found {
            panic!("{error:#}; log of {}:\n{}", self.name, self.log());
        }
    }
}

impl Drop for RoleProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
