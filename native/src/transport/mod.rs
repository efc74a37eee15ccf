//! The relay link's transport: the relay protocol's one bidirectional gRPC stream
//! (`/svc.relay.v1.Relay/Connect`), over tonic on a tokio runtime of its own.
//!
//! Frames cross this boundary as encoded protobuf bytes: the Python side builds and reads
//! them (`svc_sdk.relay_client`), this side moves them. Received frames wait in a queue
//! until the owner drains it; an eventfd becomes readable whenever the queue has gone from
//! empty to non-empty, so an asyncio loop learns of them with `add_reader` and no thread
//! of its own, and takes everything that arrived in one call. Writes never block: a frame
//! goes into an unbounded queue that the stream's task drains (the callers bound what they
//! have in flight: the outbox's window).

mod api;
mod proxy;
mod server;
mod server_stream;
mod stream;
mod tls;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::runtime::{Handle, Runtime};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

pub use api::{HttpClient, HttpError, HttpResponse, MAX_RESPONSE};
pub use server::{Polled, RelayServer, ServerConfig, ServerStream, StreamEvent, Written, SERVICE};
pub use stream::{Drained, RelayStream, State, RECEIVE_HIGH_WATER};
use tls::tls_connector;

/// The relay protocol's one method (proto/relay.proto).
pub const METHOD: &str = "/svc.relay.v1.Relay/Connect";

/// Largest frame accepted from the relay (a catch-up page of large messages).
pub const MAX_RECEIVE: usize = 64 * 1024 * 1024;
/// Largest frame sent (the relay refuses more than this).
pub const MAX_SEND: usize = 16 * 1024 * 1024;

/// Why a stream could not be set up: the caller's arguments, before anything was sent.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("invalid relay address {0:?}: {1}")]
    Address(String, String),
    #[error("invalid TLS roots: {0}")]
    Roots(String),
    #[error("{0}")]
    Proxy(String),
    #[error("invalid metadata {0:?}: not ASCII header text")]
    Metadata(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// The process's tokio runtime for relay streams: one worker, created on first use. A
/// forked child gets a new one (the parent's threads do not exist there).
fn runtime() -> Handle {
    static RUNTIME: Mutex<Option<(u32, Runtime)>> = Mutex::new(None);
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if let Some((owner, runtime)) = slot.as_ref() {
        if *owner == pid {
            return runtime.handle().clone();
        }
    }
    if let Some((_, inherited)) = slot.take() {
        // Dropping would wait for worker threads that were not forked.
        std::mem::forget(inherited);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("svc-relay-io")
        .enable_all()
        .build()
        .expect("a tokio runtime (threads and an epoll instance)");
    let handle = runtime.handle().clone();
    *slot = Some((pid, runtime));
    handle
}

/// Settings of one HTTP/2 connection to a relay.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// `http://host:port`, `https://host:port` or bare `host:port` (plaintext).
    pub endpoint: String,
    /// PEM certificates to trust instead of the system's roots (`https://` only).
    pub ca_pem: Option<Vec<u8>>,
    pub keepalive: Duration,
    pub keepalive_timeout: Duration,
    pub connect_timeout: Duration,
}

/// One HTTP/2 connection to a relay, made on first use and remade after it breaks; any
/// number of streams share it.
#[derive(Clone)]
pub struct Connection {
    channel: Channel,
}

impl Connection {
    pub fn new(config: &ConnectionConfig) -> Result<Self, TransportError> {
        let (tls, authority) = split_endpoint(&config.endpoint)?;
        let bad = |e: &dyn std::fmt::Display| TransportError::Address(config.endpoint.clone(), e.to_string());
        let uri: Uri = format!("http://{authority}").parse().map_err(|e| bad(&e))?;
        let host = uri.host().ok_or_else(|| bad(&"no host"))?.to_owned();
        let port = uri.port_u16().ok_or_else(|| bad(&"no port"))?;
        let tls = if tls {
            Some(tls_connector(config.ca_pem.as_deref(), &host, b"h2")?)
        } else {
            None
        };
        let endpoint = Endpoint::from(uri)
            .http2_keep_alive_interval(config.keepalive)
            .keep_alive_timeout(config.keepalive_timeout)
            .keep_alive_while_idle(true)
            .connect_timeout(config.connect_timeout)
            .initial_stream_window_size(4 * 1024 * 1024)
            .initial_connection_window_size(8 * 1024 * 1024);
        let host = host.trim_matches(['[', ']']).to_owned();
        let dial = Dial {
            proxy: proxy::from_env(tls.is_some(), &host, port)?,
            host,
            port,
            tls: tls.map(Arc::new),
        };
        let connector = tower::service_fn(move |_: Uri| {
            let dial = dial.clone();
            async move { dial.connect().await }
        });
        // The channel's buffer task is spawned on the current runtime.
        let _inside = runtime().enter();
        Ok(Self {
            channel: endpoint.connect_with_connector_lazy(connector),
        })
    }
}

fn split_endpoint(endpoint: &str) -> Result<(bool, &str), TransportError> {
    let (tls, rest) = if let Some(rest) = endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("grpcs://"))
    {
        (true, rest)
    } else {
        (
            false,
            endpoint
                .strip_prefix("http://")
                .or_else(|| endpoint.strip_prefix("grpc://"))
                .unwrap_or(endpoint),
        )
    };
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        return Err(TransportError::Address(
            endpoint.to_owned(),
            "expected [scheme://]host:port".into(),
        ));
    }
    Ok((tls, authority))
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

#[derive(Clone)]
struct Dial {
    host: String,
    port: u16,
    tls: Option<Arc<(TlsConnector, ServerName<'static>)>>,
    /// The proxy the environment named for this destination when the client was made.
    proxy: Option<proxy::Proxy>,
}

impl Dial {
    async fn connect(self) -> io::Result<TokioIo<Box<dyn Io>>> {
        let tcp = match &self.proxy {
            None => TcpStream::connect((self.host.as_str(), self.port)).await?,
            Some(proxy) => proxy.tunnel(&self.host, self.port).await?,
        };
        // Frames are small and latency-bound; the relay's Replies gate the next ones.
        tcp.set_nodelay(true)?;
        Ok(TokioIo::new(match &self.tls {
            None => Box::new(tcp),
            Some(tls) => Box::new(tls.0.connect(tls.1.clone(), tcp).await?),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tonic::Code;

    #[test]
    fn endpoints_parse_with_and_without_a_scheme() {
        assert_eq!(
            split_endpoint("http://127.0.0.1:50051/").unwrap(),
            (false, "127.0.0.1:50051")
        );
        assert_eq!(split_endpoint("127.0.0.1:50051").unwrap(), (false, "127.0.0.1:50051"));
        assert_eq!(
            split_endpoint("https://relay.example:443").unwrap(),
            (true, "relay.example:443")
        );
        assert_eq!(split_endpoint("grpcs://[::1]:9").unwrap(), (true, "[::1]:9"));
        assert!(split_endpoint("http://").is_err());
        assert!(split_endpoint("http://host:1/path").is_err());
    }

    #[test]
    fn a_refused_connection_ends_the_stream_with_unavailable() {
        // A port nobody listens on: bind, read the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = ConnectionConfig {
            endpoint: format!("127.0.0.1:{port}"),
            ca_pem: None,
            keepalive: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
        };
        let stream = RelayStream::open(&Connection::new(&config).unwrap(), &[]).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let state = loop {
            let drained = stream.drain();
            if let State::Ended { code, message } = drained.state {
                break (code, message);
            }
            assert!(std::time::Instant::now() < deadline, "no end");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(state.0, Code::Unavailable as i32, "{state:?}");
        assert!(!stream.write(Bytes::from_static(b"x")));
    }
}
