//! The agent's `client.sqlite3` (`LocalStore`), and converting a `data_dir` between
//! plaintext and encrypted at rest.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::local_state::LocalStore;
use crate::python::{bytes, to_py};
use crate::state_key::{self, StateKey};

/// `data_dir/client.sqlite3`: see svc_sdk.local_state, which wraps it.
#[pyclass(module = "svc_sdk._native", name = "LocalStore", frozen)]
pub(crate) struct PyLocalStore {
    pub(crate) inner: LocalStore,
}

#[pymethods]
impl PyLocalStore {
    #[new]
    #[pyo3(signature = (data_dir, *, state_key=None))]
    fn new(py: Python<'_>, data_dir: PathBuf, state_key: Option<&[u8]>) -> PyResult<Self> {
        let key = state_key.map(StateKey::from_bytes).transpose().map_err(to_py)?;
        let inner = py
            .allow_threads(|| LocalStore::open(&data_dir, key.as_ref()))
            .map_err(to_py)?;
        Ok(Self { inner })
    }

    /// Closes the database after a last checkpoint of its WAL (without the GIL).
    fn close(&self, py: Python<'_>) {
        py.allow_threads(|| self.inner.close());
    }

    fn channels(&self, py: Python<'_>) -> PyResult<Vec<(String, i64, i64)>> {
        py.allow_threads(|| self.inner.channels()).map_err(to_py)
    }

    fn add_channel(&self, py: Python<'_>, name: &str, cursor: i64, joined_epoch: i64) -> PyResult<()> {
        py.allow_threads(|| self.inner.add_channel(name, cursor, joined_epoch))
            .map_err(to_py)
    }

    fn remove_channel(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        py.allow_threads(|| self.inner.remove_channel(name)).map_err(to_py)
    }

    // Payloads arrive as `bytes` and are borrowed, not extracted as Vec<u8>: pyo3 would
    // convert a `bytes` to a Vec one element at a time (a Python int per byte).
    #[allow(clippy::type_complexity)]
    fn advance(
        &self,
        py: Python<'_>,
        name: &str,
        cursor: i64,
        received: Vec<(i64, Bound<'_, PyBytes>, Bound<'_, PyBytes>)>,
    ) -> PyResult<()> {
        let rows: Vec<(i64, &[u8], &[u8])> = received
            .iter()
            .map(|(seq, sender, payload)| (*seq, sender.as_bytes(), payload.as_bytes()))
            .collect();
        py.allow_threads(|| self.inner.advance(name, cursor, &rows))
            .map_err(to_py)
    }

    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (name, after=0, limit=None))]
    fn inbox<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        after: i64,
        limit: Option<i64>,
    ) -> PyResult<Vec<(i64, Bound<'py, PyBytes>, Bound<'py, PyBytes>)>> {
        let rows = py
            .allow_threads(|| self.inner.inbox(name, after, limit))
            .map_err(to_py)?;
        Ok(rows
            .into_iter()
            .map(|(seq, sender, payload)| (seq, bytes(py, &sender), bytes(py, &payload)))
            .collect())
    }

    #[pyo3(signature = (name, after=0))]
    fn inbox_count(&self, py: Python<'_>, name: &str, after: i64) -> PyResult<i64> {
        py.allow_threads(|| self.inner.inbox_count(name, after)).map_err(to_py)
    }

    fn consumed(&self, py: Python<'_>, name: &str, through_seq: i64, extra: Vec<i64>, cursor: i64) -> PyResult<()> {
        py.allow_threads(|| self.inner.consumed(name, through_seq, &extra, cursor))
            .map_err(to_py)
    }
}

/// Re-encrypts every database of `data_dir` from `from_key` to `to_key` (None: plaintext),
/// crash-safely; no process may have the data_dir open. svc_sdk.state wraps it.
#[pyfunction]
#[pyo3(signature = (data_dir, from_key, to_key))]
fn convert_state(py: Python<'_>, data_dir: PathBuf, from_key: Option<&[u8]>, to_key: Option<&[u8]>) -> PyResult<()> {
    let from = from_key.map(StateKey::from_bytes).transpose().map_err(to_py)?;
    let to = to_key.map(StateKey::from_bytes).transpose().map_err(to_py)?;
    py.allow_threads(|| state_key::convert(&data_dir, from.as_ref(), to.as_ref()))
        .map_err(to_py)
}

/// "encrypted", "plaintext" or "empty": how `data_dir`'s databases are stored, read from
/// their headers alone (no key needed; an encrypted-looking file may also be damaged).
#[pyfunction]
fn state_encryption(data_dir: PathBuf) -> PyResult<&'static str> {
    let mut verdict = "empty";
    for name in state_key::STATE_FILES {
        match state_key::kind(&data_dir.join(name)).map_err(to_py)? {
            state_key::FileKind::Encrypted => return Ok("encrypted"),
            state_key::FileKind::Plain => verdict = "plaintext",
            state_key::FileKind::New => {}
        }
    }
    Ok(verdict)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLocalStore>()?;
    m.add_function(wrap_pyfunction!(convert_state, m)?)?;
    m.add_function(wrap_pyfunction!(state_encryption, m)?)?;
    Ok(())
}
