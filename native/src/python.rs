//! PyO3 bindings: `svc_sdk._native`. Every call that does crypto or storage releases the
//! GIL; every failure is `MlsError` (a RuntimeError) starting with `MLS engine error: `.
//!
//! The exceptions are the library's own, defined in Python (`svc_sdk/errors.py`) and
//! raised from here, as pyca/cryptography does: one hierarchy under `SvcError`, whose
//! constructor adds the message prefix, so what we pass is the detail alone.
//!
//! This module holds that mapping and the module's definition; the classes live beside
//! it, one file per job: `py_engine` (an agent's engine and groups), `py_inspect` (what
//! is read without keys: framing, credentials), `py_tracker` (the relay's view of
//! groups), `py_local` (`client.sqlite3`, state at rest), `py_frames` (the relay
//! protocol's frames), `py_transport` (an agent's relay stream and the account API),
//! `py_server` (the relay's gRPC server).

use pyo3::import_exception;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::engine::{DEFAULT_CIPHER_SUITE, PQ_CIPHER_SUITE};
use crate::error::EngineError;

// Imported on first use, not when the extension loads: svc_sdk.errors imports nothing of
// the library, so it is importable whenever an engine call can fail.
import_exception!(svc_sdk.errors, MlsError);
import_exception!(svc_sdk.errors, PolicyError);
import_exception!(svc_sdk.errors, InternalError);
import_exception!(svc_sdk.errors, ChannelClosedError);

pub(crate) fn to_py(e: EngineError) -> PyErr {
    // Not MLS failures: the agent's directory is unusable as given, or a write to it
    // failed; the library reports both as `runtime error: ` (svc_sdk.errors.InternalError).
    let internal = match &e {
        EngineError::DataDir { .. }
        | EngineError::DataDirInUse { .. }
        | EngineError::Storage(_)
        | EngineError::StateKey(_) => Some(e.to_string()),
        e if e.is_storage() => Some(format!("storage failure: {e}")),
        _ => None,
    };
    match internal {
        Some(message) => InternalError::new_err(message),
        // A closed client's engine: what its threads still try fails as closing does.
        None if matches!(e, EngineError::Closed) => ChannelClosedError::new_err(e.to_string()),
        None if matches!(e, EngineError::Policy { .. }) => PolicyError::new_err(e.to_string()),
        None => MlsError::new_err(e.to_string()),
    }
}

pub(crate) fn bytes<'py>(py: Python<'py>, data: &[u8]) -> Bound<'py, PyBytes> {
    PyBytes::new(py, data)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    crate::py_engine::register(m)?;
    crate::py_inspect::register(m)?;
    crate::py_tracker::register(m)?;
    crate::py_local::register(m)?;
    m.add("DEFAULT_CIPHER_SUITE", DEFAULT_CIPHER_SUITE)?;
    m.add("PQ_CIPHER_SUITE", PQ_CIPHER_SUITE)?;
    crate::py_frames::register(m)?;
    crate::py_transport::register(m)?;
    crate::py_server::register(m)?;
    Ok(())
}
