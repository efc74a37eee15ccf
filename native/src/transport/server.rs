//! The relay's side of the relay protocol: hyper's HTTP/2 server under tonic's gRPC
//! framing, serving `/svc.relay.v1.Relay/Connect` and the standard health service
//! (tonic-health) on a tokio runtime of its own.
//!
//! As on the client (stream.rs), frames cross into Python as encoded protobuf bytes and
//! nothing here reads them. Unlike the client, one eventfd serves every stream: the
//! relay's event loop is woken once for whatever happened on any number of streams —
//! new streams, frames, ends, room to write again — and takes all of it in one `poll`.
//! Each stream (server_stream.rs) stops reading its client past `RECEIVE_HIGH_WATER`
//! until the relay releases what it was handed (HTTP/2 flow control then holds the
//! client back), and refuses writes past `SEND_HIGH_WATER` until hyper has taken them,
//! so a client that stops reading or writes too fast costs the relay a bounded amount.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::{watch, Notify};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{crypto::aws_lc_rs, ServerConfig as TlsConfig};
use tokio_rustls::TlsAcceptor;
use tonic::Status;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;
use tower::ServiceExt;

use super::server_stream::{Connect, Wakeup};
pub use super::server_stream::{ServerStream, StreamEvent, Written};
use super::stream::RawCodec;
use super::{TransportError, METHOD};

/// The relay protocol's service name, as the health service reports it.
pub const SERVICE: &str = "svc.relay.v1.Relay";
/// HTTP/2 receive window of a stream (the client may send this much ahead of the relay's
/// reading), and the largest a connection's may be.
const STREAM_WINDOW: u32 = 256 * 1024;
const MAX_WINDOW: u32 = (1 << 31) - 1;

/// The server's limits.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest frame accepted from a client; a larger one ends its stream.
    pub max_frame: usize,
    /// Largest frame sent.
    pub max_send: usize,
    /// How often an idle connection is pinged, and how long its answer may take.
    pub keepalive: Duration,
    pub keepalive_timeout: Duration,
    /// Largest header block (HTTP/2's SETTINGS_MAX_HEADER_LIST_SIZE).
    pub max_header_bytes: u32,
    /// Streams one connection may have open at once.
    pub max_streams_per_connection: u32,
    /// How long a new connection may take to start: its TLS handshake, HTTP/2's preface
    /// and its first request. A connection that has not is closed.
    pub handshake_timeout: Duration,
    /// PEM certificate chain and private key: TLS (ALPN h2) instead of plaintext.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
}

/// What a poll returns: streams that arrived (in order) and what happened on others.
pub struct Polled {
    pub accepted: Vec<ServerStream>,
    pub events: Vec<StreamEvent>,
}

/// The relay's listening server. Dropping it stops it.
pub struct RelayServer {
    wakeup: Arc<Wakeup>,
    port: u16,
    health: HealthReporter,
    stop: watch::Sender<u8>,
    runtime: Handle,
    _runtime: Arc<Runtime>,
}

const RUNNING: u8 = 0;
const DRAINING: u8 = 1;
const STOPPED: u8 = 2;

impl RelayServer {
    /// Listens on `host:port` (0: a free port) and serves until [`RelayServer::stop`].
    pub fn bind(host: &str, port: u16, config: ServerConfig) -> Result<Self, TransportError> {
        let tls = match &config.tls {
            Some((cert, key)) => Some(tls_acceptor(cert, key)?),
            None => None,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("svc-relay-server")
            .enable_all()
            .build()?;
        let address: SocketAddr = {
            let host = host.trim_matches(['[', ']']);
            let mut found = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))?;
            found
                .next()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?
        };
        // std sets SO_REUSEADDR on Unix: a port left in TIME_WAIT is free, one with a
        // listener is not.
        let std_listener = std::net::TcpListener::bind(address)?;
        std_listener.set_nonblocking(true)?;
        let port = std_listener.local_addr()?.port();
        let listener = {
            let _inside = runtime.enter();
            TcpListener::from_std(std_listener)?
        };
        let wakeup = Arc::new(Wakeup::new()?);
        let health = HealthReporter::new();
        let health_service = HealthServer::new(HealthService::from_health_reporter(health.clone()));
        // Not serving until the relay says so (set_serving), "" included.
        runtime.block_on(async {
            health.set_service_status("", ServingStatus::NotServing).await;
            health.set_service_status(SERVICE, ServingStatus::NotServing).await;
        });
        let (stop, stopping) = watch::channel(RUNNING);
        let routes = Routes {
            wakeup: wakeup.clone(),
            health: health_service,
            config: Arc::new(config),
            ids: Arc::new(AtomicU64::new(1)),
        };
        runtime.spawn(accept_loop(listener, tls, routes, stopping));
        let handle = runtime.handle().clone();
        Ok(Self {
            wakeup,
            port,
            health,
            stop,
            runtime: handle,
            _runtime: Arc::new(runtime),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Readable whenever there is something to poll.
    pub fn wake_fd(&self) -> RawFd {
        self.wakeup.fd()
    }

    /// New streams, and what happened on the others since the last poll; re-arms the fd.
    pub fn poll(&self) -> Polled {
        let (accepted, events) = self.wakeup.take_all();
        Polled { accepted, events }
    }

    /// What the health service answers for the server ("") and the relay service.
    pub fn set_serving(&self, serving: bool) {
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        let health = self.health.clone();
        self.runtime.block_on(async move {
            health.set_service_status("", status).await;
            health.set_service_status(SERVICE, status).await;
        });
    }

    /// Stops accepting connections. With `hard`, also closes every connection now;
    /// without, asks each to finish (GOAWAY) and keeps the streams it has open.
    pub fn stop(&self, hard: bool) {
        self.stop.send_replace(if hard { STOPPED } else { DRAINING });
    }
}

impl Drop for RelayServer {
    fn drop(&mut self) {
        self.stop.send_replace(STOPPED);
    }
}

fn tls_acceptor(cert_pem: &[u8], key_pem: &[u8]) -> Result<TlsAcceptor, TransportError> {
    let bad = |e: &dyn std::fmt::Display| TransportError::Roots(format!("relay certificate or key: {e}"));
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    if chain.is_empty() {
        return Err(bad(&"no certificate in the PEM"));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| bad(&e))?;
    let mut config = TlsConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| bad(&e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    routes: Routes,
    mut stopping: watch::Receiver<u8>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else {
                    // Out of file descriptors, say: give the process a moment, not a spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                tokio::spawn(connection(tcp, tls.clone(), routes.clone(), stopping.clone()));
            }
            _ = stopping.changed() => return,
        }
    }
}

async fn connection(
    tcp: tokio::net::TcpStream,
    tls: Option<TlsAcceptor>,
    routes: Routes,
    mut stopping: watch::Receiver<u8>,
) {
    let config = routes.config.clone();
    // One deadline for the whole start: the TLS handshake, HTTP/2's preface and settings,
    // and the first request. hyper waits for the preface without a limit and pings only
    // after it, so a connection that stalls anywhere before its first request would hold
    // its socket for good. Dropping the connection closes it.
    let deadline = tokio::time::Instant::now() + config.handshake_timeout;
    let io: Box<dyn super::Io> = match tls {
        None => Box::new(tcp),
        Some(tls) => match tokio::time::timeout_at(deadline, tls.accept(tcp)).await {
            Ok(Ok(stream)) => Box::new(stream),
            _ => return,
        },
    };
    // The stream window times the streams a connection may have: a stream whose reader
    // has stopped holds its own window of the connection's, never another stream's.
    let connection_window = STREAM_WINDOW.saturating_mul(config.max_streams_per_connection);
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .keep_alive_interval(config.keepalive)
        .keep_alive_timeout(config.keepalive_timeout)
        .max_header_list_size(config.max_header_bytes)
        .max_concurrent_streams(config.max_streams_per_connection)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(connection_window.min(MAX_WINDOW));
    let started = Arc::new(Notify::new());
    let first_request = started.clone();
    let service = hyper::service::service_fn(move |request| {
        first_request.notify_one();
        routes.clone().route(request)
    });
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = started.notified() => {}
        _ = tokio::time::sleep_until(deadline) => return,
        _ = stopping.changed() => {}
    }
    if *stopping.borrow_and_update() == RUNNING {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = stopping.changed() => {}
        }
    }
    if *stopping.borrow_and_update() == DRAINING {
        conn.as_mut().graceful_shutdown();
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = stopping.wait_for(|state| *state == STOPPED) => {}
        }
    }
    // Stopped: dropping the connection closes it and every stream on it.
}

#[derive(Clone)]
struct Routes {
    wakeup: Arc<Wakeup>,
    health: HealthServer<HealthService>,
    config: Arc<ServerConfig>,
    ids: Arc<AtomicU64>,
}

type Response = http::Response<tonic::body::Body>;

impl Routes {
    async fn route(self, request: http::Request<Incoming>) -> Result<Response, std::convert::Infallible> {
        let path = request.uri().path();
        if path == METHOD {
            let mut grpc = tonic::server::Grpc::new(RawCodec)
                .max_decoding_message_size(self.config.max_frame)
                .max_encoding_message_size(self.config.max_send);
            let connect = Connect {
                wakeup: self.wakeup.clone(),
                ids: self.ids.clone(),
            };
            return Ok(grpc.streaming(connect, request).await);
        }
        if path.starts_with("/grpc.health.v1.Health/") {
            return match self.health.oneshot(request).await {
                Ok(response) => Ok(response),
                Err(never) => match never {},
            };
        }
        Ok(Status::unimplemented(format!("no method {path}")).into_http())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use bytes::Bytes;
    use tonic::Code;

    use super::super::server_stream::{FRAME_OVERHEAD, RECEIVE_HIGH_WATER};
    use super::super::{Connection, ConnectionConfig, RelayStream, State};
    use super::*;

    fn config(max_frame: usize) -> ServerConfig {
        ServerConfig {
            max_frame,
            max_send: 16 * 1024 * 1024,
            keepalive: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            max_streams_per_connection: 100,
            handshake_timeout: Duration::from_secs(10),
            tls: None,
        }
    }

    fn server(max_frame: usize) -> RelayServer {
        RelayServer::bind("127.0.0.1", 0, config(max_frame)).unwrap()
    }

    /// Whether the relay closes `sock` (end of stream or a reset) within 4 s; anything
    /// it sends before (HTTP/2's settings) is read past.
    fn closed_soon(mut sock: std::net::TcpStream) -> bool {
        use std::io::Read;
        sock.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
        let mut buf = [0u8; 1024];
        loop {
            match sock.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) => return e.kind() == io::ErrorKind::ConnectionReset,
            }
        }
    }

    #[test]
    fn a_connection_that_starts_no_request_in_time_is_closed() {
        use std::io::Write;
        let config = ServerConfig {
            handshake_timeout: Duration::from_millis(200),
            ..config(1024)
        };
        let server = RelayServer::bind("127.0.0.1", 0, config).unwrap();
        let silent = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        assert!(closed_soon(silent), "a silent connection was kept");
        // HTTP/2's preface and an empty SETTINGS frame, then nothing.
        let mut idle = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .unwrap();
        assert!(closed_soon(idle), "a connection with no request was kept");
        // A connection whose first request comes in time stays, past the deadline.
        let client = connect(&server, &[]);
        let stream = accepted(&server);
        stream.accept();
        std::thread::sleep(Duration::from_millis(400));
        assert!(client.write(Bytes::from_static(b"still here")));
        until("frame", || {
            server.poll().events.into_iter().find(|e| !e.frames.is_empty())
        });
    }

    #[test]
    fn streams_whose_reading_stopped_leave_the_connection_to_the_others() {
        let server = server(1024 * 1024);
        let shared = Connection::new(&client_config(&server)).unwrap();
        let open = || {
            let client = RelayStream::open(&shared, &[]).unwrap();
            let stream = accepted(&server);
            stream.accept();
            (client, stream)
        };
        // Three streams the relay stops processing (never released), each sent 6 MiB:
        // more than any window, so each holds all the connection would give it.
        let stalled: Vec<_> = (0..3).map(|_| open()).collect();
        for (client, _) in &stalled {
            for _ in 0..96 {
                assert!(client.write(Bytes::from(vec![0u8; 64 * 1024])));
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        let (live, stream) = open();
        assert!(live.write(Bytes::from_static(b"still served")));
        until("the live stream's frame", || {
            server
                .poll()
                .events
                .into_iter()
                .find(|e| e.id == stream.id() && !e.frames.is_empty())
        });
    }

    #[test]
    fn empty_frames_count_toward_the_receive_bound() {
        let server = server(1024);
        let client = connect(&server, &[]);
        let stream = accepted(&server);
        stream.accept();
        for _ in 0..20_000 {
            assert!(client.write(Bytes::new()));
        }
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            got += server.poll().events.iter().map(|e| e.frames.len()).sum::<usize>();
            std::thread::sleep(Duration::from_millis(5));
        }
        let bound = RECEIVE_HIGH_WATER / FRAME_OVERHEAD;
        assert!(
            (bound..=bound + 1).contains(&got),
            "{got} empty frames handed over unreleased"
        );
    }

    fn client_config(server: &RelayServer) -> ConnectionConfig {
        ConnectionConfig {
            endpoint: format!("127.0.0.1:{}", server.port()),
            ca_pem: None,
            keepalive: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
        }
    }

    fn connect(server: &RelayServer, metadata: &[(&str, &str)]) -> RelayStream {
        let metadata: Vec<_> = metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        RelayStream::open(&Connection::new(&client_config(server)).unwrap(), &metadata).unwrap()
    }

    fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(found) = check() {
                return found;
            }
            assert!(Instant::now() < deadline, "no {what} in 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn accepted(server: &RelayServer) -> ServerStream {
        until("stream", || server.poll().accepted.pop())
    }

    fn ended(client: &RelayStream) -> (i32, String) {
        until("end", || match client.drain().state {
            State::Ended { code, message } => Some((code, message)),
            _ => None,
        })
    }

    #[test]
    fn frames_cross_both_ways_and_the_status_reaches_the_client() {
        let server = server(1024);
        let client = connect(&server, &[("authorization", "Bearer t"), ("svc-identity", "6869")]);
        let stream = accepted(&server);
        assert!(stream.metadata().contains(&("authorization".into(), "Bearer t".into())));
        assert!(stream.metadata().contains(&("svc-identity".into(), "6869".into())));
        stream.accept();
        assert!(client.write(Bytes::from_static(b"ping")));
        let event = until("frame", || {
            server.poll().events.into_iter().find(|e| !e.frames.is_empty())
        });
        assert_eq!(
            (event.id, event.frames),
            (stream.id(), vec![Bytes::from_static(b"ping")])
        );
        assert_eq!(stream.write(Bytes::from_static(b"pong")), Written::Queued);
        let frames = until("reply", || Some(client.drain().frames).filter(|f| !f.is_empty()));
        assert_eq!(frames, vec![Bytes::from_static(b"pong")]);
        stream.finish(Code::Unauthenticated as i32, "token expired");
        assert_eq!(ended(&client), (Code::Unauthenticated as i32, "token expired".into()));
        assert_eq!(stream.write(Bytes::from_static(b"late")), Written::Ended);
    }

    #[test]
    fn a_stream_refused_before_it_is_accepted_ends_with_its_status() {
        let server = server(1024);
        let client = connect(&server, &[]);
        accepted(&server).finish(Code::InvalidArgument as i32, "no identity");
        assert_eq!(ended(&client), (Code::InvalidArgument as i32, "no identity".into()));
    }

    #[test]
    fn a_frame_over_the_limit_ends_the_stream_as_resource_exhausted_and_others_go_on() {
        let server = server(1024);
        let client = connect(&server, &[]);
        let stream = accepted(&server);
        stream.accept();
        assert!(client.write(Bytes::from(vec![7u8; 2048])));
        let event = until("end", || server.poll().events.into_iter().find(|e| e.ended.is_some()));
        assert!(event.frames.is_empty());
        assert_eq!(event.ended.unwrap().0, Code::ResourceExhausted as i32);
        let other = connect(&server, &[]);
        let second = accepted(&server);
        second.accept();
        assert!(other.write(Bytes::from(vec![1u8; 1024])));
        until("frame", || {
            server.poll().events.into_iter().find(|e| e.frames.len() == 1)
        });
    }

    #[test]
    fn a_client_that_cancels_is_reported_and_its_writes_end() {
        let server = server(1024);
        let client = connect(&server, &[]);
        let stream = accepted(&server);
        stream.accept();
        until("open", || (client.drain().opened).then_some(()));
        client.close();
        let event = until("end", || server.poll().events.into_iter().find(|e| e.ended.is_some()));
        assert_eq!(event.ended.unwrap().0, Code::Cancelled as i32);
        assert_eq!(stream.write(Bytes::from_static(b"x")), Written::Ended);
    }

    #[test]
    fn writes_to_a_client_that_does_not_read_are_refused_until_it_reads() {
        let server = server(1024);
        let client = connect(&server, &[]);
        let stream = accepted(&server);
        stream.accept();
        let frame = Bytes::from(vec![0u8; 64 * 1024]);
        // The client holds 1 MiB undrained, HTTP/2's windows 8 MiB more: well under this.
        let full = (0..1024).find(|_| {
            let written = stream.write(frame.clone());
            assert_ne!(written, Written::Ended);
            if written == Written::Queued {
                std::thread::sleep(Duration::from_micros(200)); // let the connection take it
            }
            written == Written::Full
        });
        assert!(full.is_some(), "never refused");
        until("room", || {
            client.drain();
            server.poll().events.into_iter().find(|e| e.writable)
        });
        assert_eq!(stream.write(frame), Written::Queued);
    }

    #[test]
    fn frames_wait_in_the_server_until_released() {
        let server = server(1024 * 1024);
        let client = connect(&server, &[]);
        let stream = accepted(&server);
        stream.accept();
        for _ in 0..64 {
            assert!(client.write(Bytes::from(vec![0u8; 64 * 1024])));
        }
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            got += server.poll().events.iter().map(|e| e.frames.len()).sum::<usize>();
            std::thread::sleep(Duration::from_millis(5));
        }
        // RECEIVE_HIGH_WATER (1 MiB = 16 frames) and the frame that crossed it.
        assert!((16..=17).contains(&got), "{got} frames handed over unreleased");
        stream.release();
        until("the rest", || {
            got += server.poll().events.iter().map(|e| e.frames.len()).sum::<usize>();
            stream.release();
            (got == 64).then_some(())
        });
    }

    #[test]
    fn the_health_service_answers_for_the_relay_service() {
        let server = server(1024);
        let check = |service: &str| -> Result<Bytes, Status> {
            let channel = Connection::new(&client_config(&server)).unwrap().channel;
            // HealthCheckRequest{service}: field 1, length-delimited.
            let mut request = vec![0x0a, service.len() as u8];
            request.extend_from_slice(service.as_bytes());
            super::super::runtime().block_on(async move {
                let mut grpc = tonic::client::Grpc::new(channel);
                grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
                let path = http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check");
                let reply = grpc
                    .unary(tonic::Request::new(Bytes::from(request)), path, RawCodec)
                    .await?;
                Ok(reply.into_inner())
            })
        };
        // HealthCheckResponse{status}: field 1, varint; SERVING = 1, NOT_SERVING = 2.
        assert_eq!(check(SERVICE).unwrap(), Bytes::from_static(&[0x08, 2]));
        server.set_serving(true);
        assert_eq!(check(SERVICE).unwrap(), Bytes::from_static(&[0x08, 1]));
        assert_eq!(check("").unwrap(), Bytes::from_static(&[0x08, 1]));
        assert_eq!(check("nope").unwrap_err().code(), Code::NotFound);
    }
}
