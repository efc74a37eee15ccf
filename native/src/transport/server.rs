//! The relay's side of the relay protocol: hyper's HTTP/2 server under tonic's gRPC
//! framing, serving `/svc.relay.v1.Relay/Connect` and the standard health service
//! (tonic-health) on a tokio runtime of its own.
//!
//! As on the client (stream.rs), frames cross into Python as encoded protobuf bytes and
//! nothing here reads them. Unlike the client, one eventfd serves every stream: the
//! relay's event loop is woken once for whatever happened on any number of streams —
//! new streams, frames, ends, room to write again — and takes all of it in one `poll`.
//! Each stream's received frames stop being read from the connection past
//! [`RECEIVE_HIGH_WATER`] until the relay takes them (HTTP/2 flow control then holds the
//! client back), and each stream refuses writes past [`SEND_HIGH_WATER`] until hyper has
//! taken them, so a client that stops reading costs the relay a bounded amount.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinHandle;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{crypto::aws_lc_rs, ServerConfig as TlsConfig};
use tokio_rustls::TlsAcceptor;
use tonic::{Code, Status, Streaming};
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;
use tower::ServiceExt;

use super::stream::RawCodec;
use super::{TransportError, METHOD};

/// The relay protocol's service name, as the health service reports it.
pub const SERVICE: &str = "svc.relay.v1.Relay";
/// Bytes of received frames a stream holds for the relay before it stops reading them.
pub const RECEIVE_HIGH_WATER: usize = 1024 * 1024;
/// What a received frame counts toward [`RECEIVE_HIGH_WATER`] beyond its bytes: what it
/// costs to hold (its `Bytes`, then a Python object), so that a flood of empty frames is
/// bounded like a flood of large ones.
const FRAME_OVERHEAD: usize = 128;
/// HTTP/2 receive window of a stream (the client may send this much ahead of the relay's
/// reading), and the largest a connection's may be.
const STREAM_WINDOW: u32 = 256 * 1024;
const MAX_WINDOW: u32 = (1 << 31) - 1;
/// Bytes written to a stream and not yet taken by the connection past which writes are
/// refused until it drains to half of this. A client that stops reading so costs the
/// relay this, one frame, and h2's send buffer, per stream.
pub const SEND_HIGH_WATER: usize = 512 * 1024;

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

/// What happened on one stream since the relay last polled it.
#[derive(Debug, Default)]
pub struct StreamEvent {
    pub id: u64,
    pub frames: Vec<Bytes>,
    /// The client has sent its last frame (half-close).
    pub client_done: bool,
    /// The stream is over: (gRPC code, message). Code 0 when it ended cleanly.
    pub ended: Option<(i32, String)>,
    /// A write was refused for lack of room, and there is room again.
    pub writable: bool,
}

/// What a poll returns: streams that arrived (in order) and what happened on others.
pub struct Polled {
    pub accepted: Vec<ServerStream>,
    pub events: Vec<StreamEvent>,
}

struct Ready {
    accepted: Vec<ServerStream>,
    active: Vec<Arc<StreamShared>>,
    signalled: bool,
}

/// The one wake fd and the lists it announces.
struct Wakeup {
    ready: Mutex<Ready>,
    fd: OwnedFd,
}

impl Wakeup {
    fn lock(&self) -> MutexGuard<'_, Ready> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn signal(&self, ready: &mut Ready) {
        if !ready.signalled {
            ready.signalled = true;
            let one = 1u64.to_ne_bytes();
            // An eventfd counter cannot overflow at one write per poll.
            let _ = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }
}

#[derive(Default)]
struct StreamState {
    frames: VecDeque<Bytes>,
    // Bytes received and not yet released by the relay: in `frames` or handed over.
    queued: usize,
    handed: usize,
    client_done: bool,
    ended: Option<(i32, String)>,
    reported_end: bool,
    unsent: usize,
    blocked: bool,
    writable: bool,
    listed: bool,
}

struct StreamShared {
    id: u64,
    wakeup: Arc<Wakeup>,
    state: Mutex<StreamState>,
    drained: Notify,
}

impl StreamShared {
    fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `change` and, if it left something to report, lists the stream for the
    /// next poll.
    fn update(self: &Arc<Self>, change: impl FnOnce(&mut StreamState)) {
        let mut state = self.lock();
        if state.reported_end {
            return;
        }
        change(&mut state);
        if !state.listed {
            state.listed = true;
            drop(state);
            let mut ready = self.wakeup.lock();
            ready.active.push(self.clone());
            self.wakeup.signal(&mut ready);
        }
    }

    fn end(self: &Arc<Self>, code: Code, message: String) {
        self.update(|state| {
            if state.ended.is_none() {
                state.ended = Some((code as i32, message));
            }
        });
    }

    fn take(&self) -> StreamEvent {
        let mut state = self.lock();
        state.listed = false;
        let frames: Vec<Bytes> = state.frames.drain(..).collect();
        state.handed += frames.iter().map(|f| f.len() + FRAME_OVERHEAD).sum::<usize>();
        let event = StreamEvent {
            id: self.id,
            frames,
            client_done: state.client_done,
            ended: state.ended.clone(),
            writable: std::mem::take(&mut state.writable),
        };
        state.reported_end = state.ended.is_some();
        event
    }
}

type Decision = Result<(), Status>;

/// One client stream, as the relay's Python side holds it.
pub struct ServerStream {
    shared: Arc<StreamShared>,
    metadata: Vec<(String, String)>,
    decide: Mutex<Option<oneshot::Sender<Decision>>>,
    outgoing: Mutex<Option<mpsc::UnboundedSender<Result<Bytes, Status>>>>,
}

/// What [`ServerStream::write`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Queued,
    /// Over [`SEND_HIGH_WATER`]: try again after an event with `writable`.
    Full,
    Ended,
}

impl ServerStream {
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The request's ASCII metadata (header name, value), in the order received.
    pub fn metadata(&self) -> &[(String, String)] {
        &self.metadata
    }

    /// Accepts the stream: its response headers go out. No-op once decided.
    pub fn accept(&self) {
        if let Some(decide) = self.decide.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = decide.send(Ok(()));
        }
    }

    /// The relay has processed every frame it was handed: reading the client goes on
    /// (it stops while [`RECEIVE_HIGH_WATER`] bytes are handed over and not released).
    pub fn release(&self) {
        let mut state = self.shared.lock();
        state.queued -= std::mem::take(&mut state.handed);
        drop(state);
        // One waiter at most (the reading task); with none, the permit is kept for it.
        self.shared.drained.notify_one();
    }

    /// Queues `frame`; never blocks.
    pub fn write(&self, frame: Bytes) -> Written {
        let outgoing = self.outgoing.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = outgoing.as_ref() else {
            return Written::Ended;
        };
        let mut state = self.shared.lock();
        if state.ended.is_some() {
            return Written::Ended;
        }
        if state.unsent >= SEND_HIGH_WATER {
            state.blocked = true;
            return Written::Full;
        }
        state.unsent += frame.len();
        drop(state);
        if tx.send(Ok(frame)).is_err() {
            return Written::Ended;
        }
        Written::Queued
    }

    /// Ends the stream with gRPC status (`code`, `message`): a refusal if it was never
    /// accepted, otherwise after every frame written before. Later calls do nothing.
    pub fn finish(&self, code: i32, message: &str) {
        let status = Status::new(Code::from_i32(code), message);
        if let Some(decide) = self.decide.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = decide.send(Err(status));
        } else if let Some(tx) = self.outgoing.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if code != Code::Ok as i32 {
                let _ = tx.send(Err(status));
            }
        }
    }
}

/// The response body's frames: what the relay writes, until it finishes. Dropped when the
/// stream is over (hyper drops it on a client's cancel or a lost connection too), which
/// ends the stream for the relay and stops reading the client.
struct Outgoing {
    rx: mpsc::UnboundedReceiver<Result<Bytes, Status>>,
    shared: Arc<StreamShared>,
    reader: JoinHandle<()>,
}

impl tokio_stream::Stream for Outgoing {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            let mut state = self.shared.lock();
            state.unsent = state.unsent.saturating_sub(frame.len());
            if state.blocked && state.unsent <= SEND_HIGH_WATER / 2 {
                state.blocked = false;
                drop(state);
                self.shared.update(|state| state.writable = true);
            }
        }
        polled
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        self.reader.abort();
        self.shared.end(Code::Cancelled, "stream closed".into());
    }
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
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        let wakeup = Arc::new(Wakeup {
            ready: Mutex::new(Ready {
                accepted: Vec::new(),
                active: Vec::new(),
                signalled: false,
            }),
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        });
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
        self.wakeup.fd.as_raw_fd()
    }

    /// New streams, and what happened on the others since the last poll; re-arms the fd.
    pub fn poll(&self) -> Polled {
        let mut ready = self.wakeup.lock();
        let mut counter = [0u8; 8];
        let _ = unsafe { libc::read(self.wakeup.fd.as_raw_fd(), counter.as_mut_ptr().cast(), counter.len()) };
        ready.signalled = false;
        let accepted = std::mem::take(&mut ready.accepted);
        let active = std::mem::take(&mut ready.active);
        drop(ready);
        Polled {
            accepted,
            events: active.iter().map(|stream| stream.take()).collect(),
        }
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
            let connect = Connect { routes: self.clone() };
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

#[derive(Clone)]
struct Connect {
    routes: Routes,
}

impl tower::Service<tonic::Request<Streaming<Bytes>>> for Connect {
    type Response = tonic::Response<Outgoing>;
    type Error = Status;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Status>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let routes = self.routes.clone();
        Box::pin(async move {
            let metadata = request
                .metadata()
                .iter()
                .filter_map(|entry| match entry {
                    tonic::metadata::KeyAndValueRef::Ascii(key, value) => {
                        Some((key.as_str().to_owned(), value.to_str().ok()?.to_owned()))
                    }
                    tonic::metadata::KeyAndValueRef::Binary(..) => None,
                })
                .collect();
            let shared = Arc::new(StreamShared {
                id: routes.ids.fetch_add(1, Ordering::Relaxed),
                wakeup: routes.wakeup.clone(),
                state: Mutex::new(StreamState::default()),
                drained: Notify::new(),
            });
            let (decide, decided) = oneshot::channel();
            let (tx, rx) = mpsc::unbounded_channel();
            {
                // Listed before its reader starts: the relay learns of a stream before
                // any event of it.
                let mut ready = routes.wakeup.lock();
                ready.accepted.push(ServerStream {
                    shared: shared.clone(),
                    metadata,
                    decide: Mutex::new(Some(decide)),
                    outgoing: Mutex::new(Some(tx)),
                });
                routes.wakeup.signal(&mut ready);
            }
            let reader = tokio::spawn(read(request.into_inner(), shared.clone()));
            // From here, however this future ends (a client that cancels before the relay
            // decides drops it), the relay hears that the stream ended.
            let outgoing = Outgoing { rx, shared, reader };
            match decided.await {
                Ok(Ok(())) => Ok(tonic::Response::new(outgoing)),
                Ok(Err(status)) => Err(status),
                Err(_) => Err(Status::unavailable("the relay is shutting down")),
            }
        })
    }
}

async fn read(mut incoming: Streaming<Bytes>, shared: Arc<StreamShared>) {
    loop {
        loop {
            let notified = shared.drained.notified();
            if shared.lock().queued < RECEIVE_HIGH_WATER {
                break;
            }
            notified.await;
        }
        match incoming.message().await {
            Ok(Some(frame)) => shared.update(|state| {
                state.queued += frame.len() + FRAME_OVERHEAD;
                state.frames.push_back(frame);
            }),
            Ok(None) => return shared.update(|state| state.client_done = true),
            // tonic's one OUT_OF_RANGE here is a frame over the size limit, which gRPC
            // (and the relay's clients) call RESOURCE_EXHAUSTED.
            Err(status) if status.code() == Code::OutOfRange => {
                return shared.end(Code::ResourceExhausted, status.message().to_owned())
            }
            Err(status) => return shared.end(status.code(), super::stream::describe(&status)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

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
        let config = ConnectionConfig {
            endpoint: format!("127.0.0.1:{}", server.port()),
            ca_pem: None,
            keepalive: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
        };
        let shared = Connection::new(&config).unwrap();
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

    fn connect(server: &RelayServer, metadata: &[(&str, &str)]) -> RelayStream {
        let config = ConnectionConfig {
            endpoint: format!("127.0.0.1:{}", server.port()),
            ca_pem: None,
            keepalive: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
        };
        let metadata: Vec<_> = metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        RelayStream::open(&Connection::new(&config).unwrap(), &metadata).unwrap()
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
            let config = ConnectionConfig {
                endpoint: format!("127.0.0.1:{}", server.port()),
                ca_pem: None,
                keepalive: Duration::from_secs(30),
                keepalive_timeout: Duration::from_secs(10),
                connect_timeout: Duration::from_secs(5),
            };
            let channel = Connection::new(&config).unwrap().channel;
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
