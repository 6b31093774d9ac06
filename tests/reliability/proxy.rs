//! A TCP fault proxy for one link (one process dialing one address): it forwards
//! a loopback port to its target and can
//! - cut the link: every open connection is reset (RST) and new ones are reset
//!   as soon as they are accepted, until healed;
//! - stall it: nothing moves in either direction and new connections are held
//!   unanswered, like a network that drops every packet; on heal the data that
//!   waited flows again (TCP would retransmit it);
//! - delay it: every chunk is forwarded that much later, in both directions,
//!   without limiting throughput (chunks are pipelined);
//! - reset its open connections once (a flap): new connections pass.
//!
//! Each proxy counts what it did, for the scenario summaries.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What a link does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkMode {
    /// Forwards everything at once.
    Pass,
    /// Forwards everything this much later.
    Delay(Duration),
    /// Forwards nothing, holds every connection open.
    Stall,
    /// Resets every connection.
    Cut,
}

#[derive(Clone, Copy, Debug)]
struct Control {
    mode: LinkMode,
    /// Bumped by [`FaultProxy::reset`]: connections opened before it are reset.
    resets: u64,
}

/// What a proxy did so far.
#[derive(Debug, Default)]
pub struct ProxyCounts {
    pub accepted: AtomicU64,
    /// Connections reset at once because the link was cut.
    pub refused: AtomicU64,
    /// Open connections reset by a cut or a reset.
    pub killed: AtomicU64,
    pub bytes: AtomicU64,
}

/// One link's proxy; dropping it stops accepting (open connections end with
/// the test runtime).
pub struct FaultProxy {
    /// What the link is called in logs (`meta-1 -> meta-2`).
    pub name: String,
    /// The loopback address to dial instead of the target.
    pub address: String,
    control: watch::Sender<Control>,
    pub counts: Arc<ProxyCounts>,
    accept_task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `target`.
    pub async fn start(name: &str, target: &str) -> anyhow::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?.to_string();
        let (control, _) = watch::channel(Control {
            mode: LinkMode::Pass,
            resets: 0,
        });
        let counts = Arc::new(ProxyCounts::default());
        let accept_task = tokio::spawn(accept_loop(
            listener,
            target.to_string(),
            control.subscribe(),
            counts.clone(),
        ));
        Ok(FaultProxy {
            name: name.to_string(),
            address,
            control,
            counts,
            accept_task,
        })
    }

    /// Sets the link's mode (cutting resets every open connection).
    pub fn set_mode(&self, mode: LinkMode) {
        self.control.send_modify(|control| control.mode = mode);
    }

    /// Resets every open connection and refuses new ones until healed.
    pub fn cut(&self) {
        self.set_mode(LinkMode::Cut);
    }

    /// Stops all traffic until healed; connections stay open.
    pub fn stall(&self) {
        self.set_mode(LinkMode::Stall);
    }

    /// Forwards everything `delay` later until healed.
    pub fn delay(&self, delay: Duration) {
        self.set_mode(LinkMode::Delay(delay));
    }

    /// Forwards everything at once again.
    pub fn heal(&self) {
        self.set_mode(LinkMode::Pass);
    }

    /// Resets the connections open now; the mode stays as it is.
    pub fn reset(&self) {
        self.control.send_modify(|control| control.resets += 1);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        // Open connections see the sender gone and end.
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: String,
    control: watch::Receiver<Control>,
    counts: Arc<ProxyCounts>,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            // Out of file descriptors or similar: try again shortly.
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        counts.accepted.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(serve(
            inbound,
            target.clone(),
            control.clone(),
            counts.clone(),
        ));
    }
}

/// Closes a socket with a reset instead of an orderly shutdown.
fn reset_socket(stream: TcpStream) {
    // Deprecated because a positive linger blocks the thread on close; a zero
    // linger closes at once with a reset, which is the point here.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// How one direction of a connection ended.
enum End {
    /// The sender closed its side; the close was passed on.
    Closed,
    /// The link was cut or reset, or the proxy went away.
    Killed,
    /// Reading or writing failed (the other side went away).
    Failed,
}

async fn serve(
    inbound: TcpStream,
    target: String,
    mut control: watch::Receiver<Control>,
    counts: Arc<ProxyCounts>,
) {
    let resets_at_accept = control.borrow().resets;
    // A stalled link holds a new connection unanswered until it heals or is cut.
    loop {
        let now = *control.borrow_and_update();
        match now.mode {
            LinkMode::Cut => {
                counts.refused.fetch_add(1, Ordering::Relaxed);
                reset_socket(inbound);
                return;
            }
            LinkMode::Stall => {
                if control.changed().await.is_err() {
                    return;
                }
            }
            LinkMode::Pass | LinkMode::Delay(_) => break,
        }
    }
    let outbound =
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&target)).await {
            Ok(Ok(outbound)) => outbound,
            // The target is down: the dialer sees what it would see without us.
            _ => {
                reset_socket(inbound);
                return;
            }
        };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (mut inbound, mut outbound) = (inbound, outbound);
    let killed = {
        let (inbound_read, inbound_write) = inbound.split();
        let (outbound_read, outbound_write) = outbound.split();
        let upstream = pump(
            inbound_read,
            outbound_write,
            control.clone(),
            resets_at_accept,
            &counts,
        );
        let downstream = pump(
            outbound_read,
            inbound_write,
            control.clone(),
            resets_at_accept,
            &counts,
        );
        tokio::pin!(upstream, downstream);
        let (mut upstream_done, mut downstream_done) = (false, false);
        loop {
            let end = tokio::select! {
                end = &mut upstream, if !upstream_done => { upstream_done = true; end }
                end = &mut downstream, if !downstream_done => { downstream_done = true; end }
            };
            match end {
                End::Closed if upstream_done && downstream_done => break false,
                End::Closed => {}
                End::Killed => break true,
                End::Failed => break false,
            }
        }
    };
    if killed {
        counts.killed.fetch_add(1, Ordering::Relaxed);
        reset_socket(inbound);
        reset_socket(outbound);
    }
}

/// Copies one direction: each chunk is due `delay` after it was read (so delays
/// pipeline), nothing moves while stalled, a cut or reset ends it.
async fn pump(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    mut control: watch::Receiver<Control>,
    resets_at_accept: u64,
    counts: &ProxyCounts,
) -> End {
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut buffer = vec![0u8; 64 * 1024];
    let mut sender_closed = false;
    loop {
        let now = *control.borrow_and_update();
        if now.mode == LinkMode::Cut || now.resets != resets_at_accept {
            return End::Killed;
        }
        if sender_closed && queue.is_empty() {
            let _ = to.shutdown().await;
            return End::Closed;
        }
        let stalled = now.mode == LinkMode::Stall;
        let due = queue.front().map(|(due, _)| *due);
        tokio::select! {
            changed = control.changed() => {
                if changed.is_err() {
                    return End::Killed;
                }
            }
            read = from.read(&mut buffer), if !sender_closed && !stalled && queue.len() < 256 => {
                match read {
                    Ok(0) => sender_closed = true,
                    Ok(length) => {
                        // The mode now, not at the top of the loop: a delay set
                        // before these bytes were sent applies to them.
                        let delay = match control.borrow().mode {
                            LinkMode::Delay(delay) => delay,
                            _ => Duration::ZERO,
                        };
                        queue.push_back((Instant::now() + delay, buffer[..length].to_vec()));
                    }
                    Err(_) => return End::Failed,
                }
            }
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() && !stalled => {
                let (_, chunk) = queue.pop_front().expect("a due chunk");
                // A cut while blocked on a full peer must still end the copy.
                tokio::select! {
                    written = to.write_all(&chunk) => {
                        if written.is_err() {
                            return End::Failed;
                        }
                        counts.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                    _ = wait_killed(&mut control, resets_at_accept) => return End::Killed,
                }
            }
        }
    }
}

/// Returns once the link is cut or reset (or the proxy is gone).
async fn wait_killed(control: &mut watch::Receiver<Control>, resets_at_accept: u64) {
    loop {
        let now = *control.borrow_and_update();
        if now.mode == LinkMode::Cut || now.resets != resets_at_accept {
            return;
        }
        if control.changed().await.is_err() {
            return;
        }
    }
}

/// A set of links, e.g. every route of a group of processes.
#[derive(Default)]
pub struct Links {
    pub proxies: Vec<FaultProxy>,
}

impl Links {
    /// Adds a proxy for `name` to `target`; returns its address.
    pub async fn add(&mut self, name: &str, target: &str) -> anyhow::Result<String> {
        let proxy = FaultProxy::start(name, target).await?;
        let address = proxy.address.clone();
        self.proxies.push(proxy);
        Ok(address)
    }

    /// The links whose name mentions `process` as an endpoint (`a -> b`).
    pub fn touching<'a>(&'a self, process: &'a str) -> impl Iterator<Item = &'a FaultProxy> + 'a {
        self.proxies
            .iter()
            .filter(move |proxy| proxy.name.split(" -> ").any(|endpoint| endpoint == process))
    }

    /// Sets every link touching `process` to `mode`; returns how many.
    pub fn set_touching(&self, process: &str, mode: LinkMode) -> usize {
        let mut changed = 0;
        for proxy in self.touching(process) {
            proxy.set_mode(mode);
            changed += 1;
        }
        changed
    }

    /// Resets the open connections of every link touching `process`.
    pub fn reset_touching(&self, process: &str) -> usize {
        let mut changed = 0;
        for proxy in self.touching(process) {
            proxy.reset();
            changed += 1;
        }
        changed
    }

    /// Heals every link.
    pub fn heal_all(&self) {
        for proxy in &self.proxies {
            proxy.heal();
        }
    }

    /// Totals over every link: (accepted, refused, killed, bytes).
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        self.proxies.iter().fold((0, 0, 0, 0), |sum, proxy| {
            let counts = &proxy.counts;
            (
                sum.0 + counts.accepted.load(Ordering::Relaxed),
                sum.1 + counts.refused.load(Ordering::Relaxed),
                sum.2 + counts.killed.load(Ordering::Relaxed),
                sum.3 + counts.bytes.load(Ordering::Relaxed),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncBufReadExt;

    /// An echo server on a loopback port.
    async fn echo_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        address
    }

    async fn round_trip(stream: &mut tokio::io::BufReader<TcpStream>, line: &str) -> String {
        stream
            .get_mut()
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write");
        let mut answer = String::new();
        stream.read_line(&mut answer).await.expect("read");
        answer.trim_end().to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn links_pass_delay_stall_cut_and_reset() -> anyhow::Result<()> {
        let target = echo_server().await;
        let proxy = FaultProxy::start("test -> echo", &target).await?;
        let mut stream = tokio::io::BufReader::new(TcpStream::connect(&proxy.address).await?);
        assert_eq!(round_trip(&mut stream, "one").await, "one");

        // Delay: both directions, so a round trip takes at least twice the delay.
        proxy.delay(Duration::from_millis(150));
        let started = std::time::Instant::now();
        assert_eq!(round_trip(&mut stream, "two").await, "two");
        assert!(started.elapsed() >= Duration::from_millis(300));
        proxy.heal();

        // Stall: nothing comes back until healed, then the waiting data flows.
        proxy.stall();
        stream.get_mut().write_all(b"three\n").await?;
        let mut answer = String::new();
        let stalled =
            tokio::time::timeout(Duration::from_millis(400), stream.read_line(&mut answer)).await;
        assert!(stalled.is_err(), "a stalled link forwarded {answer:?}");
        proxy.heal();
        tokio::time::timeout(Duration::from_secs(5), stream.read_line(&mut answer)).await??;
        assert_eq!(answer.trim_end(), "three");

        // Cut: the open connection is reset, new ones are refused.
        proxy.cut();
        let mut rest = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await?;
        assert!(
            read.is_err() || rest.is_empty(),
            "a cut link kept the connection"
        );
        // (The reset may already fail the connect.)
        if let Ok(refused) = TcpStream::connect(&proxy.address).await {
            let mut refused = tokio::io::BufReader::new(refused);
            let mut answer = String::new();
            let _ = refused.get_mut().write_all(b"four\n").await;
            let refused_read =
                tokio::time::timeout(Duration::from_secs(5), refused.read_line(&mut answer))
                    .await?;
            assert!(
                refused_read.is_err() || answer.is_empty(),
                "a cut link answered {answer:?}"
            );
        }

        // Heal, then a reset: the open connection dies, a new one works.
        proxy.heal();
        let mut stream = tokio::io::BufReader::new(TcpStream::connect(&proxy.address).await?);
        assert_eq!(round_trip(&mut stream, "five").await, "five");
        proxy.reset();
        let mut rest = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await?;
        assert!(read.is_err() || rest.is_empty());
        let mut stream = tokio::io::BufReader::new(TcpStream::connect(&proxy.address).await?);
        assert_eq!(round_trip(&mut stream, "six").await, "six");
        assert_eq!(proxy.counts.refused.load(Ordering::Relaxed), 1);
        assert_eq!(proxy.counts.killed.load(Ordering::Relaxed), 2);
        Ok(())
    }
}
