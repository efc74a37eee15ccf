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

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use tokio_rustls::rustls::client::{verify_server_name, WebPkiServerVerifier};
use tokio_rustls::rustls::crypto::aws_lc_rs;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::ParsedCertificate;
use tokio_rustls::rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_rustls::TlsConnector;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

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
            Some(tls_connector(config.ca_pem.as_deref(), &host)?)
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
        let dial = Dial {
            host: host.trim_matches(['[', ']']).to_owned(),
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
}

impl Dial {
    async fn connect(self) -> io::Result<TokioIo<Box<dyn Io>>> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port)).await?;
        // Frames are small and latency-bound; the relay's Replies gate the next ones.
        tcp.set_nodelay(true)?;
        Ok(TokioIo::new(match &self.tls {
            None => Box::new(tcp),
            Some(tls) => Box::new(tls.0.connect(tls.1.clone(), tcp).await?),
        }))
    }
}

fn tls_connector(ca_pem: Option<&[u8]>, host: &str) -> Result<(TlsConnector, ServerName<'static>), TransportError> {
    let provider = Arc::new(aws_lc_rs::default_provider());
    let mut roots = RootCertStore::empty();
    let mut pinned = Vec::new();
    match ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| TransportError::Roots(e.to_string()))?;
                roots
                    .add(cert.clone())
                    .map_err(|e| TransportError::Roots(e.to_string()))?;
                pinned.push(cert);
            }
            if roots.is_empty() {
                return Err(TransportError::Roots("no certificate in the CA file".into()));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system store may hold certificates webpki cannot use; skip those.
                let _ = roots.add(cert);
            }
        }
    }
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TransportError::Roots(e.to_string()))?;
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TransportError::Roots(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(TrustedRoots { webpki, pinned }))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
        .map_err(|e| TransportError::Address(host.to_owned(), e.to_string()))?;
    Ok((TlsConnector::from(Arc::new(config)), name))
}

/// webpki's verification, and one addition: a certificate that is itself in the CA file
/// is trusted for the names it carries. That is how a self-signed server certificate is
/// trusted (OpenSSL, and so the API client, accept one; webpki refuses a CA certificate as
/// an end entity). Expired, not-yet-valid and wrong-name certificates stay refused.
#[derive(Debug)]
struct TrustedRoots {
    webpki: Arc<WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
}

impl ServerCertVerifier for TrustedRoots {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, tokio_rustls::rustls::Error> {
        use tokio_rustls::rustls::Error::InvalidCertificate;
        let error = match self
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Ok(verified) => return Ok(verified),
            Err(error) => error,
        };
        let final_ = matches!(
            error,
            InvalidCertificate(
                CertificateError::Expired
                    | CertificateError::ExpiredContext { .. }
                    | CertificateError::NotValidYet
                    | CertificateError::NotValidYetContext { .. }
                    | CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. }
                    | CertificateError::Revoked
            )
        );
        if final_ || !self.pinned.iter().any(|c| c.as_ref() == end_entity.as_ref()) {
            return Err(error);
        }
        verify_server_name(&ParsedCertificate::try_from(end_entity)?, server_name)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Frames are opaque bytes here: the protobuf lives on the Python side.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Where a stream is: `Open` once the relay accepted it (its response headers arrived),
/// `Ended` with the gRPC status it ended with (code 0 for a clean end or a local close).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Connecting,
    Open,
    Ended { code: i32, message: String },
}

/// What a drain returns: the stream's state, whether the relay ever accepted it, and the
/// frames received since the last drain.
#[derive(Debug)]
pub struct Drained {
    pub state: State,
    pub opened: bool,
    pub frames: Vec<Bytes>,
}

struct Inbox {
    state: State,
    opened: bool,
    frames: VecDeque<Bytes>,
    signalled: bool,
}

struct Shared {
    inbox: Mutex<Inbox>,
    wake: OwnedFd,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, change: impl FnOnce(&mut Inbox)) {
        let mut inbox = self.lock();
        if matches!(inbox.state, State::Ended { .. }) {
            return; // the first end is the one reported
        }
        change(&mut inbox);
        if !inbox.signalled {
            inbox.signalled = true;
            let one = 1u64.to_ne_bytes();
            // An eventfd counter cannot overflow at one write per drain.
            let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }

    fn end(&self, code: Code, message: &str) {
        let message = message.to_owned();
        self.update(|inbox| {
            inbox.state = State::Ended {
                code: code as i32,
                message,
            }
        });
    }
}

/// One stream to the relay. Dropping it cancels the stream.
pub struct RelayStream {
    shared: Arc<Shared>,
    outgoing: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
    task: JoinHandle<()>,
}

impl RelayStream {
    /// Opens a stream on `connection` with `metadata` (header name, value) pairs. Returns
    /// at once; the stream's state says when the relay accepted or refused it.
    pub fn open(connection: &Connection, metadata: &[(String, String)]) -> Result<Self, TransportError> {
        let mut headers = tonic::metadata::MetadataMap::new();
        for (name, value) in metadata {
            // Visible ASCII only: http would pass other bytes through as opaque octets.
            if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                return Err(TransportError::Metadata(name.clone()));
            }
            let key =
                AsciiMetadataKey::from_bytes(name.as_bytes()).map_err(|_| TransportError::Metadata(name.clone()))?;
            let value =
                AsciiMetadataValue::try_from(value.as_str()).map_err(|_| TransportError::Metadata(name.clone()))?;
            headers.insert(key, value);
        }
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox {
                state: State::Connecting,
                opened: false,
                frames: VecDeque::new(),
                signalled: false,
            }),
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let task = runtime().spawn(run(connection.channel.clone(), headers, rx, shared.clone()));
        Ok(Self {
            shared,
            outgoing: Mutex::new(Some(tx)),
            task,
        })
    }

    /// Readable whenever there is something to drain.
    pub fn wake_fd(&self) -> RawFd {
        self.shared.wake.as_raw_fd()
    }

    /// The state, and every frame received since the last drain; re-arms the wake fd.
    pub fn drain(&self) -> Drained {
        let mut inbox = self.shared.lock();
        let mut counter = [0u8; 8];
        let _ = unsafe { libc::read(self.shared.wake.as_raw_fd(), counter.as_mut_ptr().cast(), counter.len()) };
        inbox.signalled = false;
        Drained {
            state: inbox.state.clone(),
            opened: inbox.opened,
            frames: inbox.frames.drain(..).collect(),
        }
    }

    /// Queues `frame` for the relay; false once the stream has ended or been closed.
    pub fn write(&self, frame: Bytes) -> bool {
        let outgoing = self.outgoing.lock().unwrap_or_else(|e| e.into_inner());
        match outgoing.as_ref() {
            Some(tx) if !matches!(self.shared.lock().state, State::Ended { .. }) => tx.send(frame).is_ok(),
            _ => false,
        }
    }

    /// Cancels the stream (the relay sees RST_STREAM); its state becomes Ended with
    /// code 0 unless it had ended already.
    pub fn close(&self) {
        self.outgoing.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.task.abort();
        self.shared.end(Code::Ok, "closed");
    }
}

impl Drop for RelayStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Outgoing = Pin<Box<dyn tokio_stream::Stream<Item = Bytes> + Send>>;

async fn run(
    channel: Channel,
    headers: tonic::metadata::MetadataMap,
    outgoing: mpsc::UnboundedReceiver<Bytes>,
    shared: Arc<Shared>,
) {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(MAX_RECEIVE)
        .max_encoding_message_size(MAX_SEND);
    if let Err(error) = grpc.ready().await {
        return shared.end(Code::Unavailable, &format!("relay unreachable: {error}"));
    }
    let stream: Outgoing = Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(outgoing));
    let mut request = tonic::Request::new(stream);
    *request.metadata_mut() = headers;
    let path = PathAndQuery::from_static(METHOD);
    let mut incoming = match grpc.streaming(request, path, RawCodec).await {
        Ok(response) => response.into_inner(),
        Err(status) => return shared.end(status.code(), &describe(&status)),
    };
    shared.update(|inbox| {
        inbox.state = State::Open;
        inbox.opened = true;
    });
    loop {
        match incoming.message().await {
            Ok(Some(frame)) => shared.update(|inbox| inbox.frames.push_back(frame)),
            Ok(None) => return shared.end(Code::Ok, ""),
            Err(status) => return shared.end(status.code(), &describe(&status)),
        }
    }
}

/// A status's message, with the transport error under it when there is one (a refused
/// connection says so, not just "transport error").
fn describe(status: &Status) -> String {
    use std::error::Error;
    let mut text = status.message().to_owned();
    let mut source = status.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = if text.is_empty() {
                cause_text
            } else {
                format!("{text}: {cause_text}")
            };
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_ca_file_without_certificates_is_refused() {
        assert!(matches!(
            tls_connector(Some(b"not a pem"), "localhost"),
            Err(TransportError::Roots(_))
        ));
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
