//! PyO3 bindings of the relay transport (`transport/`): `RelayChannel`, one HTTP/2
//! connection, and `RelayStream`, one relay protocol stream on it. `svc_sdk.relay_client`
//! drives them from an asyncio loop: it watches `fileno()` with `add_reader` and drains.

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::import_exception;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::transport::{
    Connection, ConnectionConfig, RelayStream, State, TransportError as SetupError, RECEIVE_HIGH_WATER,
};

import_exception!(svc_sdk.errors, TransportError);

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
        let seconds = |s: f64, what: &str| {
            Duration::try_from_secs_f64(s)
                .map_err(|_| PyValueError::new_err(format!("{what} must be a duration in seconds, got {s}")))
        };
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

    /// Queues an encoded ClientFrame; False once the stream has ended or been closed.
    fn write(&self, frame: &[u8]) -> bool {
        self.inner.write(bytes::Bytes::copy_from_slice(frame))
    }

    /// Cancels the stream.
    fn close(&self) {
        self.inner.close();
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRelayChannel>()?;
    m.add_class::<PyRelayStream>()?;
    m.add("RECEIVE_HIGH_WATER", RECEIVE_HIGH_WATER)?;
    Ok(())
}
