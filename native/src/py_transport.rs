//! PyO3 bindings of the relay transport (`transport/`): `RelayChannel`, one HTTP/2
//! connection, and `RelayStream`, one relay protocol stream on it. `svc_sdk.relay_client`
//! drives them from an asyncio loop: it watches `fileno()` with `add_reader` and drains.
//! And `HttpClient`, the account API's connections (`svc_sdk.api_client`).

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::import_exception;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use crate::py_frames::event_of;
use crate::transport::{
    Connection, ConnectionConfig, HttpClient, HttpError, RelayStream, State, TransportError as SetupError,
    MAX_RESPONSE, RECEIVE_HIGH_WATER,
};

import_exception!(svc_sdk.errors, TransportError);
import_exception!(svc_sdk.errors, ChannelClosedError);

/// The kind `drain_events` gives a frame that is not a ServerFrame.
const MALFORMED: u8 = 255;

fn to_py(e: SetupError) -> PyErr {
    match e {
        SetupError::Metadata(_) => PyValueError::new_err(e.to_string()),
        e => TransportError::new_err(e.to_string()),
    }
}

/// One HTTP/2 connection to a relay, made when a stream first needs it and remade after
/// it breaks. `https://` checks the relay's certificate against `ca_pem` (PEM), else the
/// system's roots.
///
/// >>> channel = RelayChannel("http://127.0.0.1:50051")
#[pyclass(module = "svc_sdk._native", name = "RelayChannel", frozen)]
pub struct PyRelayChannel {
    inner: Connection,
}

#[pymethods]
impl PyRelayChannel {
    #[new]
    #[pyo3(signature = (endpoint, ca_pem=None, keepalive=30.0, keepalive_timeout=10.0, connect_timeout=10.0))]
    fn new(
        endpoint: &str,
        ca_pem: Option<&[u8]>,
        keepalive: f64,
        keepalive_timeout: f64,
        connect_timeout: f64,
    ) -> PyResult<Self> {
        let config = ConnectionConfig {
            endpoint: endpoint.to_owned(),
            ca_pem: ca_pem.map(<[u8]>::to_vec),
            keepalive: seconds(keepalive, "keepalive")?,
            keepalive_timeout: seconds(keepalive_timeout, "keepalive_timeout")?,
            connect_timeout: seconds(connect_timeout, "connect_timeout")?,
        };
        Ok(Self {
            inner: Connection::new(&config).map_err(to_py)?,
        })
    }
}

/// One relay protocol stream (`/svc.relay.v1.Relay/Connect`), opened at once in the
/// background. `fileno()` becomes readable when `drain()` has news: the stream was
/// accepted, it ended (with a gRPC status code and message), or frames arrived. Once
/// `RECEIVE_HIGH_WATER` bytes of frames wait undrained, it stops reading the relay until
/// the next `drain()`.
///
/// >>> stream = RelayStream(channel, [("authorization", "Bearer …")])
/// >>> opened, ended, frames = stream.drain()
#[pyclass(module = "svc_sdk._native", name = "RelayStream", frozen)]
pub struct PyRelayStream {
    inner: RelayStream,
}

#[pymethods]
impl PyRelayStream {
    #[new]
    fn new(channel: &PyRelayChannel, metadata: Vec<(String, String)>) -> PyResult<Self> {
        Ok(Self {
            inner: RelayStream::open(&channel.inner, &metadata).map_err(to_py)?,
        })
    }

    fn fileno(&self) -> i32 {
        self.inner.wake_fd()
    }

    /// `(opened, ended, frames)`: whether the relay accepted the stream, `(code, message)`
    /// once it has ended, and the encoded ServerFrames received since the last drain.
    #[allow(clippy::type_complexity)]
    fn drain<'py>(&self, py: Python<'py>) -> (bool, Option<(i32, String)>, Vec<Bound<'py, PyBytes>>) {
        let drained = self.inner.drain();
        let frames = drained.frames.iter().map(|f| PyBytes::new(py, f)).collect();
        match drained.state {
            State::Ended { code, message } => (drained.opened, Some((code, message)), frames),
            _ => (drained.opened, None, frames),
        }
    }

    /// `drain()` with each frame decoded where it was received, as
    /// `decode_server_frame` decodes it: `(opened, ended, events)`, each event a
    /// `(kind, fields)` pair. A frame that is not a ServerFrame ends the list as
    /// `(MALFORMED_FRAME, "malformed ServerFrame: …")`, without the frames after it: its
    /// reader ends the stream there. No frame is copied whole into Python.
    #[allow(clippy::type_complexity)]
    fn drain_events<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(bool, Option<(i32, String)>, Vec<(u8, Bound<'py, PyAny>)>)> {
        let drained = self.inner.drain();
        let mut events = Vec::with_capacity(drained.frames.len());
        for frame in drained.frames {
            match event_of(py, frame) {
                Ok(event) => events.push(event),
                Err(error) if error.is_instance_of::<PyValueError>(py) => {
                    let message = error.value(py).str()?.into_any();
                    events.push((MALFORMED, message));
                    break;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(match drained.state {
            State::Ended { code, message } => (drained.opened, Some((code, message)), events),
            _ => (drained.opened, None, events),
        })
    }

    /// Queues an encoded ClientFrame; False once the stream has ended or been closed. A
    /// `bytes` frame is not copied: the queue keeps the object alive until it is sent.
    fn write(&self, frame: PyBackedBytes) -> bool {
        self.inner.write(bytes::Bytes::from_owner(frame))
    }

    /// Cancels the stream.
    fn close(&self) {
        self.inner.close();
    }
}

pub(crate) fn seconds(s: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| PyValueError::new_err(format!("{what} must be a duration in seconds, got {s}")))
}

/// A pool of HTTP/1.1 connections to the account API at `base_url` (`http://` or
/// `https://`, with an optional path prefix); `https://` checks the server's certificate
/// against `ca_pem` (PEM), else the system's roots. `request` waits for the whole answer,
/// at most `timeout` seconds, without the GIL; an answer with an error status is returned
/// like any other. Transport failures raise `TransportError`, a `base_url` that is not an
/// `http(s)://` URL and arguments HTTP cannot carry `ValueError`, and requests after
/// `close()` `ChannelClosedError`.
///
/// >>> api = HttpClient("http://127.0.0.1:8000")
/// >>> status, body = api.request("POST", "/v1/tokens", [("authorization", "Bearer sk_live_…")])
#[pyclass(module = "svc_sdk._native", name = "HttpClient", frozen)]
pub struct PyHttpClient {
    inner: HttpClient,
}

#[pymethods]
impl PyHttpClient {
    #[new]
    #[pyo3(signature = (base_url, ca_pem=None, timeout=10.0))]
    fn new(base_url: &str, ca_pem: Option<&[u8]>, timeout: f64) -> PyResult<Self> {
        let inner = HttpClient::new(base_url, ca_pem, seconds(timeout, "timeout")?).map_err(|e| match e {
            SetupError::Address(_, why) => PyValueError::new_err(why),
            e => to_py(e),
        })?;
        Ok(Self { inner })
    }

    /// `(status, body)` of the answer to `method path` with `headers` and `body`.
    #[pyo3(signature = (method, path, headers, body=None))]
    fn request<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        path: &str,
        headers: Vec<(String, String)>,
        body: Option<Vec<u8>>,
    ) -> PyResult<(u16, Bound<'py, PyBytes>)> {
        let answer = py
            .allow_threads(|| self.inner.request(method, path, &headers, body.unwrap_or_default()))
            .map_err(|e| match e {
                HttpError::Request(_) => PyValueError::new_err(e.to_string()),
                HttpError::Closed => ChannelClosedError::new_err(e.to_string()),
                e => TransportError::new_err(e.to_string()),
            })?;
        Ok((answer.status, PyBytes::new(py, &answer.body)))
    }

    /// Closes the pooled connections.
    fn close(&self) {
        self.inner.close();
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRelayChannel>()?;
    m.add_class::<PyRelayStream>()?;
    m.add_class::<PyHttpClient>()?;
    m.add("RECEIVE_HIGH_WATER", RECEIVE_HIGH_WATER)?;
    m.add("MAX_API_RESPONSE", MAX_RESPONSE)?;
    m.add("MALFORMED_FRAME", MALFORMED)?;
    Ok(())
}
