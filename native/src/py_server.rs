//! PyO3 bindings of the relay's server transport (`transport/server.rs`): `RelayServer`,
//! the listening HTTP/2 server, and `ServerStream`, one client's relay protocol stream.
//! `svc_server.relay.transport` drives them from the relay's asyncio loop: it watches
//! `fileno()` with `add_reader` and polls.

use bytes::Bytes;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyTuple};

use crate::py_frames::publish_of;
use crate::transport::{RelayServer, ServerConfig, ServerStream, TransportError as SetupError, Written, SERVICE};

/// The relay's gRPC server on `host:port` (0: a free port; `port` says which), serving
/// the relay protocol and the standard health service, in plaintext or, given a PEM
/// certificate chain and key, TLS. Frames over `max_frame` bytes end their stream
/// (RESOURCE_EXHAUSTED); header blocks over `max_header_bytes` are refused; a connection
/// that has not finished its TLS handshake and sent its first request in
/// `handshake_timeout` seconds is closed.
///
/// >>> server = RelayServer("127.0.0.1", 0, max_frame=1 << 20)
/// >>> accepted, events = server.poll()
#[pyclass(module = "svc_sdk._native", name = "RelayServer", frozen)]
pub struct PyRelayServer {
    inner: RelayServer,
}

#[pymethods]
impl PyRelayServer {
    #[new]
    #[pyo3(signature = (host, port, *, max_frame, max_send=16 * 1024 * 1024, keepalive=30.0,
        keepalive_timeout=10.0, max_header_bytes=16 * 1024, max_streams_per_connection=100,
        handshake_timeout=10.0, cert_pem=None, key_pem=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        host: &str,
        port: u16,
        max_frame: usize,
        max_send: usize,
        keepalive: f64,
        keepalive_timeout: f64,
        max_header_bytes: u32,
        max_streams_per_connection: u32,
        handshake_timeout: f64,
        cert_pem: Option<Vec<u8>>,
        key_pem: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        let tls = match (cert_pem, key_pem) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(PyValueError::new_err("TLS needs both cert_pem and key_pem")),
        };
        let config = ServerConfig {
            max_frame,
            max_send,
            keepalive: crate::py_transport::seconds(keepalive, "keepalive")?,
            keepalive_timeout: crate::py_transport::seconds(keepalive_timeout, "keepalive_timeout")?,
            max_header_bytes,
            max_streams_per_connection,
            handshake_timeout: crate::py_transport::seconds(handshake_timeout, "handshake_timeout")?,
            tls,
        };
        let inner = py
            .allow_threads(|| RelayServer::bind(host, port, config))
            .map_err(|e| match e {
                SetupError::Io(io) => PyOSError::new_err((io.raw_os_error().unwrap_or(0), io.to_string())),
                e => PyValueError::new_err(e.to_string()),
            })?;
        Ok(Self { inner })
    }

    #[getter]
    fn port(&self) -> u16 {
        self.inner.port()
    }

    fn fileno(&self) -> i32 {
        self.inner.wake_fd()
    }

    /// `(accepted, events)`: the streams that arrived since the last poll, and per stream
    /// with news `(id, frames, client_done, ended, writable)` — the ClientFrames received
    /// (each a `ReceivedFrame`, held as received until the relay reads it), whether the
    /// client has sent its last frame, `(code, message)` once the stream is over, and
    /// whether a refused write may be tried again.
    #[allow(clippy::type_complexity)]
    fn poll(
        &self,
    ) -> (
        Vec<PyServerStream>,
        Vec<(u64, Vec<PyReceivedFrame>, bool, Option<(i32, String)>, bool)>,
    ) {
        let polled = self.inner.poll();
        let accepted = polled
            .accepted
            .into_iter()
            .map(|inner| PyServerStream { inner })
            .collect();
        let events = polled
            .events
            .into_iter()
            .map(|e| {
                let frames = e.frames.into_iter().map(|frame| PyReceivedFrame { frame }).collect();
                (e.id, frames, e.client_done, e.ended, e.writable)
            })
            .collect();
        (accepted, events)
    }

    /// What the health service answers for "" and the relay service.
    fn set_serving(&self, py: Python<'_>, serving: bool) {
        py.allow_threads(|| self.inner.set_serving(serving));
    }

    /// Stops accepting connections; `hard` also closes every open connection now, where
    /// without it each is asked to finish (GOAWAY) and keeps its open streams.
    #[pyo3(signature = (hard=true))]
    fn stop(&self, hard: bool) {
        self.inner.stop(hard);
    }
}

/// One client's relay protocol stream: undecided until `accept()` (its response headers
/// go out) or `finish()` (a refusal with a gRPC status).
#[pyclass(module = "svc_sdk._native", name = "ServerStream", frozen)]
pub struct PyServerStream {
    inner: ServerStream,
}

#[pymethods]
impl PyServerStream {
    #[getter]
    fn id(&self) -> u64 {
        self.inner.id()
    }

    /// The request's ASCII metadata as (name, value) pairs; names are lowercase.
    fn metadata(&self) -> Vec<(String, String)> {
        self.inner.metadata().to_vec()
    }

    fn accept(&self) {
        self.inner.accept();
    }

    /// Every frame polled so far is processed: the stream reads on. (It stops reading
    /// the client while `RECEIVE_HIGH_WATER` bytes are polled and not released.)
    fn release(&self) {
        self.inner.release();
    }

    /// Queues an encoded ServerFrame: 0 queued, 1 refused for now (the client is not
    /// reading; wait for an event with `writable`), 2 the stream is over. A `bytes`
    /// frame is not copied: the queue keeps the object alive until it is sent.
    fn write(&self, frame: PyBackedBytes) -> u8 {
        match self.inner.write(bytes::Bytes::from_owner(frame)) {
            Written::Queued => 0,
            Written::Full => 1,
            Written::Ended => 2,
        }
    }

    /// Ends the stream with a gRPC status after what was written; a refusal if it was
    /// never accepted. Later calls do nothing.
    fn finish(&self, code: i32, message: &str) {
        self.inner.finish(code, message);
    }
}

/// One ClientFrame as a stream received it, not copied into Python: the relay reads a
/// Publish from it decoded (the one request on every message's path) and any other kind
/// from its bytes, one frame at a time, so that what a poll hands over costs no more
/// than the frames' own bytes. Those bytes may be a slice of the connection's read
/// buffer, which they keep alive until the relay has read the frame (up to about twice
/// the frames' size, within the stream's `RECEIVE_HIGH_WATER`).
#[pyclass(module = "svc_sdk._native", name = "ReceivedFrame", frozen)]
pub struct PyReceivedFrame {
    frame: Bytes,
}

#[pymethods]
impl PyReceivedFrame {
    /// The Publish this frame holds, as `decode_publish` gives it; None for any other
    /// frame, which `bytes()` gives to the generated module.
    fn publish<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        publish_of(py, &self.frame)
    }

    /// The frame's encoded bytes (a copy).
    fn bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.frame)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRelayServer>()?;
    m.add_class::<PyServerStream>()?;
    m.add_class::<PyReceivedFrame>()?;
    m.add("RELAY_SERVICE", SERVICE)?;
    Ok(())
}
