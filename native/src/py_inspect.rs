//! What anyone can read without keys: an MLS message's public framing (`inspect`), and
//! agent credentials and credential requests, verified.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::credential::{AgentCredentialContent, CredentialRequestContent, TrustAnchors};
use crate::python::{bytes, to_py};

/// Public framing of an MLS message, read without keys.
#[pyclass(module = "svc_sdk._native", name = "MessageInfo", frozen)]
struct PyMessageInfo(crate::engine::MessageInfo);

#[pymethods]
impl PyMessageInfo {
    /// "private_message", "public_message", "welcome", "group_info" or "key_package".
    #[getter]
    fn wire_format(&self) -> &'static str {
        self.0.wire_format
    }

    #[getter]
    fn group_id<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.0.group_id.as_deref().map(|g| bytes(py, g))
    }

    #[getter]
    fn epoch(&self) -> Option<u64> {
        self.0.epoch
    }

    /// "application", "proposal" or "commit" for group messages, else None.
    #[getter]
    fn content_type(&self) -> Option<&'static str> {
        self.0.content_type
    }

    /// For a key package: its credential type (0xF5C1 for an agent credential).
    #[getter]
    fn credential_type(&self) -> Option<u16> {
        self.0.key_package.as_ref().map(|kp| kp.credential_type)
    }

    /// For a key package: its credential's data, not verified (for an agent credential,
    /// the bytes `verify_agent_credential` takes).
    #[getter]
    fn credential<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.0.key_package.as_ref().map(|kp| bytes(py, &kp.credential))
    }

    /// For a key package: the signature key its leaf signs with.
    #[getter]
    fn signature_key<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.0.key_package.as_ref().map(|kp| bytes(py, &kp.signature_key))
    }

    /// For a key package: its KeyPackageRef (RFC 9420 §5.2), which Welcomes name it by.
    #[getter]
    fn key_package_ref<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.0
            .key_package
            .as_ref()
            .and_then(|kp| kp.reference.as_deref())
            .map(|r| bytes(py, r))
    }

    /// For a key package, Welcome or GroupInfo: the cipher suite it is made for, else None.
    #[getter]
    fn cipher_suite(&self) -> Option<u16> {
        self.0.cipher_suite
    }

    /// For a Welcome: the KeyPackageRefs of the key packages it is addressed to.
    #[getter]
    fn welcome_refs<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.0.welcome_refs.iter().map(|r| bytes(py, r)).collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "MessageInfo(wire_format={:?}, epoch={:?}, content_type={:?})",
            self.0.wire_format, self.0.epoch, self.0.content_type
        )
    }
}

/// Reads wire format, group id, epoch and content type from a serialized MLS message.
#[pyfunction]
fn inspect(py: Python<'_>, message: &[u8]) -> PyResult<PyMessageInfo> {
    // Parsing a small message takes well under a microsecond: releasing the GIL for it
    // would cost more than it saves (the relay calls this on its event loop per message).
    let info = if message.len() > INSPECT_GIL_RELEASE_BYTES {
        py.allow_threads(|| crate::engine::inspect(message))
    } else {
        crate::engine::inspect(message)
    };
    info.map(PyMessageInfo).map_err(to_py)
}

const INSPECT_GIL_RELEASE_BYTES: usize = 64 * 1024;

/// A verified agent credential's content.
#[pyclass(module = "svc_sdk._native", name = "AgentCredentialInfo", frozen)]
pub(crate) struct PyAgentCredentialInfo(pub(crate) AgentCredentialContent);

#[pymethods]
impl PyAgentCredentialInfo {
    /// Key id of the API key that signed it.
    #[getter]
    fn issuer(&self) -> String {
        self.0.issuer_kid()
    }

    /// The account's UUID (16 bytes).
    #[getter]
    fn account<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        bytes(py, &self.0.account)
    }

    #[getter]
    fn identity<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        bytes(py, &self.0.identity)
    }

    #[getter]
    fn cipher_suite(&self) -> u16 {
        self.0.cipher_suite
    }

    #[getter]
    fn signature_key<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        bytes(py, &self.0.signature_key)
    }

    #[getter]
    fn not_before(&self) -> u64 {
        self.0.not_before
    }

    #[getter]
    fn not_after(&self) -> u64 {
        self.0.not_after
    }

    fn __repr__(&self) -> String {
        format!(
            "AgentCredentialInfo(issuer={:?}, identity={:?}, cipher_suite={}, not_before={}, not_after={})",
            self.0.issuer_kid(),
            String::from_utf8_lossy(&self.0.identity),
            self.0.cipher_suite,
            self.0.not_before,
            self.0.not_after
        )
    }
}

/// A credential request whose proof of possession checked out.
#[pyclass(module = "svc_sdk._native", name = "CredentialRequestInfo", frozen)]
struct PyCredentialRequestInfo(CredentialRequestContent);

#[pymethods]
impl PyCredentialRequestInfo {
    #[getter]
    fn account<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        bytes(py, &self.0.account)
    }

    #[getter]
    fn identity<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        bytes(py, &self.0.identity)
    }

    #[getter]
    fn cipher_suite(&self) -> u16 {
        self.0.cipher_suite
    }

    #[getter]
    fn signature_key<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        bytes(py, &self.0.signature_key)
    }

    #[getter]
    fn issued_at(&self) -> u64 {
        self.0.issued_at
    }

    fn __repr__(&self) -> String {
        format!(
            "CredentialRequestInfo(identity={:?}, cipher_suite={}, issued_at={})",
            String::from_utf8_lossy(&self.0.identity),
            self.0.cipher_suite,
            self.0.issued_at
        )
    }
}

/// Verifies an agent credential against `anchors` (kid -> raw Ed25519 public key): known
/// issuer, signature, that it certifies `signature_key` when given, and validity at `now`
/// (unix seconds) when given.
#[pyfunction]
#[pyo3(signature = (credential, anchors, signature_key=None, now=None))]
fn verify_agent_credential(
    py: Python<'_>,
    credential: &[u8],
    anchors: HashMap<String, Bound<'_, PyBytes>>,
    signature_key: Option<&[u8]>,
    now: Option<u64>,
) -> PyResult<PyAgentCredentialInfo> {
    let anchors =
        TrustAnchors::new(anchors.iter().map(|(kid, key)| (kid.clone(), key.as_bytes().to_vec()))).map_err(to_py)?;
    py.allow_threads(|| crate::credential::verify_credential(credential, &anchors, signature_key, now))
        .map(|c| PyAgentCredentialInfo(c.content))
        .map_err(to_py)
}

/// Checks a credential request's proof of possession against the key it names.
#[pyfunction]
fn verify_credential_request(py: Python<'_>, content: &[u8], proof: &[u8]) -> PyResult<PyCredentialRequestInfo> {
    py.allow_threads(|| crate::credential::verify_credential_request(content, proof))
        .map(PyCredentialRequestInfo)
        .map_err(to_py)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMessageInfo>()?;
    m.add_class::<PyAgentCredentialInfo>()?;
    m.add_class::<PyCredentialRequestInfo>()?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(verify_agent_credential, m)?)?;
    m.add_function(wrap_pyfunction!(verify_credential_request, m)?)?;
    Ok(())
}
