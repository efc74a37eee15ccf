//! PyO3 bindings: `svc_sdk._native`. Every call that does crypto or storage releases the
//! GIL; every failure is `MlsError` (a RuntimeError) starting with `MLS engine error: `.
//!
//! The exceptions are the library's own, defined in Python (`svc_sdk/errors.py`) and
//! raised from here, as pyca/cryptography does: one hierarchy under `SvcError`, whose
//! constructor adds the message prefix, so what we pass is the detail alone.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::import_exception;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::credential::{AgentCredentialContent, CredentialRequestContent, TrustAnchors};
use crate::engine::{Engine, DEFAULT_CIPHER_SUITE, PQ_CIPHER_SUITE};
use crate::error::EngineError;
use crate::group::{CommitInfo, GroupHandle, PendingCommit, Received};
use crate::local_state::LocalStore;
use crate::policy::{Role, RolesExt};
use crate::state_key::{self, StateKey};
use crate::tracker::{Observed, TrackedGroup, Tracker};

// Imported on first use, not when the extension loads: svc_sdk.errors imports nothing of
// the library, so it is importable whenever an engine call can fail.
import_exception!(svc_sdk.errors, MlsError);
import_exception!(svc_sdk.errors, PolicyError);
import_exception!(svc_sdk.errors, InternalError);

fn to_py(e: EngineError) -> PyErr {
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
        None if matches!(e, EngineError::Policy { .. }) => PolicyError::new_err(e.to_string()),
        None => MlsError::new_err(e.to_string()),
    }
}

fn bytes<'py>(py: Python<'py>, data: &[u8]) -> Bound<'py, PyBytes> {
    PyBytes::new(py, data)
}

/// One agent's MLS state in `data_dir`, created on first use.
///
/// >>> engine = Engine("/tmp/agent-a", b"agent-a")
/// >>> group = engine.create_group(b"org/ns/svc")
#[pyclass(module = "svc_sdk._native", name = "Engine", frozen)]
struct PyEngine {
    inner: Arc<Engine>,
}

#[pymethods]
impl PyEngine {
    #[new]
    #[pyo3(signature = (data_dir, identity, cipher_suite=None, *, state_key=None))]
    fn new(
        py: Python<'_>,
        data_dir: PathBuf,
        identity: &[u8],
        cipher_suite: Option<u16>,
        state_key: Option<&[u8]>,
    ) -> PyResult<Self> {
        let key = state_key.map(StateKey::from_bytes).transpose().map_err(to_py)?;
        let engine = py
            .allow_threads(|| Engine::open_keyed(&data_dir, identity, cipher_suite, key))
            .map_err(to_py)?;
        Ok(Self {
            inner: Arc::new(engine),
        })
    }

    #[getter]
    fn identity<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        bytes(py, self.inner.identity())
    }

    #[getter]
    fn cipher_suite(&self) -> u16 {
        self.inner.cipher_suite()
    }

    #[getter]
    fn data_dir(&self) -> PathBuf {
        self.inner.data_dir().to_owned()
    }

    /// The client's database (client.sqlite3) in this data_dir, under the engine's state
    /// key: the key is not handed back to Python.
    fn local_store(&self, py: Python<'_>) -> PyResult<PyLocalStore> {
        let inner = py
            .allow_threads(|| LocalStore::open(self.inner.data_dir(), self.inner.state_key.as_ref()))
            .map_err(to_py)?;
        Ok(PyLocalStore { inner })
    }

    /// Releases `data_dir` for another process (it is locked from the constructor on, and
    /// released too when the engine is garbage-collected). Don't use the engine afterwards.
    fn close(&self) {
        self.inner.close();
    }

    /// The cipher suites this agent can make key packages and groups for: its own, and
    /// the post-quantum ``PQ_CIPHER_SUITE`` (65100) when its own is 1 (Ed25519).
    #[getter]
    fn channel_cipher_suites(&self) -> Vec<u16> {
        self.inner.channel_cipher_suites()
    }

    /// A single-use MLS key package (bytes) to hand to a member who will add this agent,
    /// for groups of ``cipher_suite`` (default: this agent's own).
    #[pyo3(signature = (cipher_suite=None))]
    fn generate_key_package<'py>(&self, py: Python<'py>, cipher_suite: Option<i64>) -> PyResult<Bound<'py, PyBytes>> {
        let cipher_suite = self.inner.suite_arg(cipher_suite).map_err(to_py)?;
        let kp = py
            .allow_threads(|| self.inner.generate_key_package_for(cipher_suite))
            .map_err(to_py)?;
        Ok(bytes(py, &kp))
    }

    /// Creates a group of ``cipher_suite`` (default: this agent's own) with this agent as
    /// its only member.
    #[pyo3(signature = (group_id, cipher_suite=None))]
    fn create_group(&self, py: Python<'_>, group_id: &[u8], cipher_suite: Option<i64>) -> PyResult<PyGroup> {
        let cipher_suite = self.inner.suite_arg(cipher_suite).map_err(to_py)?;
        py.allow_threads(|| self.inner.create_group_with_suite(group_id, cipher_suite))
            .map(PyGroup::from)
            .map_err(to_py)
    }

    /// Joins the group a Welcome (addressed to one of this agent's key packages) describes.
    fn join_group(&self, py: Python<'_>, welcome: &[u8]) -> PyResult<PyGroup> {
        py.allow_threads(|| self.inner.join_group(welcome))
            .map(PyGroup::from)
            .map_err(to_py)
    }

    /// The stored group with this id; every call returns a handle to the same state.
    fn group(&self, py: Python<'_>, group_id: &[u8]) -> PyResult<PyGroup> {
        py.allow_threads(|| self.inner.group(group_id))
            .map(PyGroup::from)
            .map_err(to_py)
    }

    /// Ids of every group stored in data_dir, sorted.
    fn group_ids<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let ids = py.allow_threads(|| self.inner.group_ids()).map_err(to_py)?;
        Ok(ids.iter().map(|id| bytes(py, id)).collect())
    }

    /// Deletes a group and its secrets from data_dir.
    fn delete_group(&self, py: Python<'_>, group_id: &[u8]) -> PyResult<()> {
        py.allow_threads(|| self.inner.delete_group(group_id)).map_err(to_py)
    }

    /// Replaces the issuer keys credentials are checked against (kid -> raw Ed25519
    /// public key: the account API's /.well-known/svc-credential-keys.json), in every
    /// open group too, and stores them in data_dir.
    fn set_trust_anchors(&self, py: Python<'_>, anchors: HashMap<String, Vec<u8>>) -> PyResult<()> {
        let anchors: Vec<(String, Vec<u8>)> = anchors.into_iter().collect();
        py.allow_threads(|| self.inner.set_trust_anchors(anchors))
            .map_err(to_py)
    }

    /// Key ids of the trust anchors in use, sorted.
    #[getter]
    fn trust_anchors(&self) -> Vec<String> {
        self.inner.trust_anchors().kids()
    }

    /// Installs a credential from the account API once it checks out: valid now, signed
    /// by a trust anchor, for this agent's identity and signature key (and the account of
    /// the credential it replaces). Stored in data_dir.
    fn install_credential(&self, py: Python<'_>, credential: &[u8]) -> PyResult<PyAgentCredentialInfo> {
        py.allow_threads(|| self.inner.install_credential(credential))
            .map(PyAgentCredentialInfo)
            .map_err(to_py)
    }

    /// The installed credential (possibly expired since), or None.
    #[getter]
    fn credential(&self) -> Option<PyAgentCredentialInfo> {
        self.inner.credential().map(PyAgentCredentialInfo)
    }

    /// `account (16 bytes) || identity`: how groups name this agent; None before a
    /// credential is installed.
    #[getter]
    fn member_id<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.inner.member_id().map(|id| bytes(py, &id))
    }

    /// This agent's MLS signature public key.
    #[getter]
    fn signature_key<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        bytes(py, self.inner.signature_key())
    }

    /// A credential request for `account` (16-byte UUID): (encoded request content, proof
    /// signed by this agent's MLS key) for the account API to verify before issuing.
    fn credential_request<'py>(
        &self,
        py: Python<'py>,
        account: &[u8],
        issued_at: u64,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let (content, proof) = py
            .allow_threads(|| self.inner.credential_request(account, issued_at))
            .map_err(to_py)?;
        Ok((bytes(py, &content), bytes(py, &proof)))
    }

    fn __repr__(&self) -> String {
        format!(
            "Engine(identity={:?}, cipher_suite={}, data_dir={:?})",
            String::from_utf8_lossy(self.inner.identity()),
            self.inner.cipher_suite(),
            self.inner.data_dir()
        )
    }
}

/// One MLS group. Safe to share between threads: operations on it are serialised by a
/// per-group lock, and different groups never wait for each other.
#[pyclass(module = "svc_sdk._native", name = "Group", frozen)]
struct PyGroup {
    inner: Arc<GroupHandle>,
}

impl From<Arc<GroupHandle>> for PyGroup {
    fn from(inner: Arc<GroupHandle>) -> Self {
        Self { inner }
    }
}

#[pymethods]
impl PyGroup {
    #[getter]
    fn group_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        bytes(py, self.inner.group_id())
    }

    #[getter]
    fn epoch(&self) -> PyResult<u64> {
        self.inner.epoch().map_err(to_py)
    }

    #[getter]
    fn cipher_suite(&self) -> PyResult<u16> {
        self.inner.cipher_suite().map_err(to_py)
    }

    #[getter]
    fn has_pending_commit(&self) -> PyResult<bool> {
        self.inner.has_pending_commit().map_err(to_py)
    }

    /// Identities of the members, in leaf order.
    fn members<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let members = self.inner.members().map_err(to_py)?;
        Ok(members.iter().map(|(_, id)| bytes(py, id)).collect())
    }

    /// Encrypts an application message for every member.
    #[pyo3(signature = (plaintext, authenticated_data=b"".as_slice()))]
    fn encrypt<'py>(
        &self,
        py: Python<'py>,
        plaintext: &[u8],
        authenticated_data: &[u8],
    ) -> PyResult<Bound<'py, PyBytes>> {
        let ct = py
            .allow_threads(|| self.inner.encrypt(plaintext, authenticated_data))
            .map_err(to_py)?;
        Ok(bytes(py, &ct))
    }

    /// Encrypts several messages with one state write; all ciphertexts or an error.
    #[pyo3(signature = (plaintexts, authenticated_data=b"".as_slice()))]
    fn encrypt_batch<'py>(
        &self,
        py: Python<'py>,
        plaintexts: Vec<Bound<'py, PyBytes>>,
        authenticated_data: &[u8],
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let slices: Vec<&[u8]> = plaintexts.iter().map(|p| p.as_bytes()).collect();
        let cts = py
            .allow_threads(|| self.inner.encrypt_batch(&slices, authenticated_data))
            .map_err(to_py)?;
        Ok(cts.iter().map(|c| bytes(py, c)).collect())
    }

    /// Encrypts outbox entries ``(pos, id, payload)`` and stores them as outbox rows in
    /// the same transaction as the ratchet state; returns ``(epoch, ciphertexts)``.
    fn encrypt_queued<'py>(
        &self,
        py: Python<'py>,
        entries: Vec<(u64, Bound<'py, PyBytes>, Bound<'py, PyBytes>)>,
    ) -> PyResult<(u64, Vec<Bound<'py, PyBytes>>)> {
        let slices: Vec<(u64, &[u8], &[u8])> = entries
            .iter()
            .map(|(pos, id, payload)| (*pos, id.as_bytes(), payload.as_bytes()))
            .collect();
        let (epoch, cts) = py.allow_threads(|| self.inner.encrypt_queued(&slices)).map_err(to_py)?;
        Ok((epoch, cts.iter().map(|c| bytes(py, c)).collect()))
    }

    /// The outbox rows ``(pos, id, epoch, payload, ciphertext)``, in send order.
    #[allow(clippy::type_complexity)]
    fn outbox<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Vec<(u64, Bound<'py, PyBytes>, u64, Bound<'py, PyBytes>, Bound<'py, PyBytes>)>> {
        let rows = py.allow_threads(|| self.inner.outbox()).map_err(to_py)?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.pos,
                    bytes(py, &r.id),
                    r.epoch,
                    bytes(py, &r.payload),
                    bytes(py, &r.ciphertext),
                )
            })
            .collect())
    }

    /// Deletes the outbox rows up to position ``through``.
    fn retire_outbox(&self, py: Python<'_>, through: u64) -> PyResult<()> {
        py.allow_threads(|| self.inner.retire_outbox(through)).map_err(to_py)
    }

    /// Processes a message from the delivery service: decrypts an application message,
    /// applies a commit (our own pending one included), or records a proposal.
    fn process(&self, py: Python<'_>, message: &[u8]) -> PyResult<PyReceived> {
        py.allow_threads(|| self.inner.process(message))
            .map(PyReceived::from)
            .map_err(to_py)
    }

    /// Processes messages in delivery order with one state write. Returns one item per
    /// message: a Received, or the MlsError (not raised) for a message that failed.
    /// With `save=False` the state is written by `save()` (or the next change) instead:
    /// store the decrypted messages first, and a crash in between loses none of them.
    #[pyo3(signature = (messages, save=true))]
    fn process_batch<'py>(
        &self,
        py: Python<'py>,
        messages: Vec<Bound<'py, PyBytes>>,
        save: bool,
    ) -> PyResult<Vec<PyObject>> {
        let slices: Vec<&[u8]> = messages.iter().map(|m| m.as_bytes()).collect();
        let results = py.allow_threads(|| self.inner.process_batch(&slices, save));
        results
            .into_iter()
            .map(|r| match r {
                Ok(received) => Ok(Py::new(py, PyReceived::from(received))?.into_any()),
                Err(e) => Ok(to_py(e).into_value(py).into_any()),
            })
            .collect()
    }

    /// Writes the state that `process_batch(..., save=False)` left in memory.
    fn save(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.save()).map_err(to_py)
    }

    /// Forgets what `process_batch(..., save=False)` left in memory and returns to the
    /// stored state: those messages can be processed again (their keys were not used up
    /// on disk). For when storing what they decrypted failed.
    fn discard_unsaved(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.discard_unsaved()).map_err(to_py)
    }

    /// A pending commit adding the members whose key packages are given, with their Welcome.
    fn add_members(&self, py: Python<'_>, key_packages: Vec<Bound<'_, PyBytes>>) -> PyResult<PyPendingCommit> {
        let kps: Vec<Vec<u8>> = key_packages.iter().map(|k| k.as_bytes().to_vec()).collect();
        py.allow_threads(|| self.inner.add_members(&kps))
            .map(PyPendingCommit)
            .map_err(to_py)
    }

    /// A pending commit removing the members with these identities.
    fn remove_members(&self, py: Python<'_>, identities: Vec<Bound<'_, PyBytes>>) -> PyResult<PyPendingCommit> {
        let ids: Vec<Vec<u8>> = identities.iter().map(|i| i.as_bytes().to_vec()).collect();
        py.allow_threads(|| self.inner.remove_members(&ids))
            .map(PyPendingCommit)
            .map_err(to_py)
    }

    /// A proposal (to publish) asking the other members to remove this agent.
    fn propose_leave<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let msg = py.allow_threads(|| self.inner.propose_leave()).map_err(to_py)?;
        Ok(bytes(py, &msg))
    }

    /// A pending commit that refreshes this member's keys (an update path).
    fn self_update(&self, py: Python<'_>) -> PyResult<PyPendingCommit> {
        py.allow_threads(|| self.inner.self_update())
            .map(PyPendingCommit)
            .map_err(to_py)
    }

    /// The delivery service accepted the pending commit: enter the new epoch.
    fn apply_pending_commit(&self, py: Python<'_>) -> PyResult<PyReceived> {
        py.allow_threads(|| self.inner.apply_pending_commit())
            .map(|c| PyReceived::from(Received::Commit(c)))
            .map_err(to_py)
    }

    /// The delivery service rejected the pending commit: drop it and stay in this epoch.
    fn clear_pending_commit(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.clear_pending_commit()).map_err(to_py)
    }

    /// The channel's roles in the current epoch.
    fn roles(&self) -> PyResult<PyRoles> {
        self.inner.roles().map(PyRoles).map_err(to_py)
    }

    /// A pending commit giving ``member`` (a member id) ``role``: "owner" (hands
    /// ownership over; the old owner becomes an admin), "admin" or "member".
    fn set_role(&self, py: Python<'_>, member: &[u8], role: &str) -> PyResult<PyPendingCommit> {
        let role = parse_role(role)?;
        py.allow_threads(|| self.inner.set_role(member, role))
            .map(PyPendingCommit)
            .map_err(to_py)
    }

    /// A pending commit setting whether plain members may create invites.
    fn set_members_invite(&self, py: Python<'_>, allowed: bool) -> PyResult<PyPendingCommit> {
        py.allow_threads(|| self.inner.set_members_invite(allowed))
            .map(PyPendingCommit)
            .map_err(to_py)
    }

    /// GroupInfo with the ratchet tree: what the relay observes the group from.
    fn group_info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let gi = py.allow_threads(|| self.inner.group_info()).map_err(to_py)?;
        Ok(bytes(py, &gi))
    }

    fn __repr__(&self) -> String {
        let epoch = self
            .inner
            .epoch()
            .map(|e| e.to_string())
            .unwrap_or_else(|_| "removed".into());
        format!(
            "Group(group_id={:?}, epoch={epoch})",
            String::from_utf8_lossy(self.inner.group_id())
        )
    }
}

/// A commit waiting for the delivery service: send `commit` (and, once accepted, `welcome`).
#[pyclass(module = "svc_sdk._native", name = "PendingCommit", frozen)]
struct PyPendingCommit(PendingCommit);

#[pymethods]
impl PyPendingCommit {
    #[getter]
    fn commit<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        bytes(py, &self.0.commit)
    }

    #[getter]
    fn welcome<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.0.welcome.as_deref().map(|w| bytes(py, w))
    }

    /// The epoch the commit was built in.
    #[getter]
    fn epoch(&self) -> u64 {
        self.0.epoch
    }

    fn __repr__(&self) -> String {
        format!(
            "PendingCommit(epoch={}, commit={} bytes, welcome={})",
            self.0.epoch,
            self.0.commit.len(),
            self.0
                .welcome
                .as_ref()
                .map(|w| format!("{} bytes", w.len()))
                .unwrap_or_else(|| "None".into())
        )
    }
}

/// The result of processing a message. `kind` is "application", "commit" or "proposal".
#[pyclass(module = "svc_sdk._native", name = "Received", frozen)]
struct PyReceived(Received);

impl From<Received> for PyReceived {
    fn from(r: Received) -> Self {
        Self(r)
    }
}

impl PyReceived {
    fn commit(&self) -> Option<&CommitInfo> {
        match &self.0 {
            Received::Commit(c) => Some(c),
            _ => None,
        }
    }
}

#[pymethods]
impl PyReceived {
    #[getter]
    fn kind(&self) -> &'static str {
        match self.0 {
            Received::Application { .. } => "application",
            Received::Commit(_) => "commit",
            Received::Proposal { .. } => "proposal",
        }
    }

    /// Identity of the sender (application, proposal) or committer (commit).
    #[getter]
    fn sender<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        match &self.0 {
            Received::Application { sender, .. } => Some(bytes(py, sender)),
            Received::Commit(c) => Some(bytes(py, &c.committer)),
            Received::Proposal { sender, .. } => sender.as_deref().map(|s| bytes(py, s)),
        }
    }

    /// Decrypted application data; None for commits and proposals.
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        match &self.0 {
            Received::Application { data, .. } => Some(bytes(py, data)),
            _ => None,
        }
    }

    #[getter]
    fn authenticated_data<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        match &self.0 {
            Received::Application { authenticated_data, .. } => Some(bytes(py, authenticated_data)),
            _ => None,
        }
    }

    /// The message's epoch, or for a commit the epoch it created.
    #[getter]
    fn epoch(&self) -> u64 {
        match &self.0 {
            Received::Application { epoch, .. } | Received::Proposal { epoch, .. } => *epoch,
            Received::Commit(c) => c.epoch,
        }
    }

    #[getter]
    fn added<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.commit()
            .map(|c| c.added.iter().map(|id| bytes(py, id)).collect())
            .unwrap_or_default()
    }

    #[getter]
    fn removed<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.commit()
            .map(|c| c.removed.iter().map(|id| bytes(py, id)).collect())
            .unwrap_or_default()
    }

    /// True when this commit removed this agent; the group is then gone from data_dir.
    #[getter]
    fn self_removed(&self) -> bool {
        self.commit().is_some_and(|c| c.self_removed)
    }

    fn __repr__(&self) -> String {
        format!("Received(kind={:?}, epoch={})", self.kind(), self.epoch())
    }
}

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
struct PyAgentCredentialInfo(AgentCredentialContent);

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

fn parse_role(role: &str) -> PyResult<Role> {
    match role {
        "owner" => Ok(Role::Owner),
        "admin" => Ok(Role::Admin),
        "member" => Ok(Role::Member),
        other => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "role must be 'owner', 'admin' or 'member', not {other:?}"
        ))),
    }
}

/// A channel's roles: its owner, its admins (member ids) and whether plain members may
/// create invites.
#[pyclass(module = "svc_sdk._native", name = "Roles", frozen)]
struct PyRoles(RolesExt);

#[pymethods]
impl PyRoles {
    #[getter]
    fn owner<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        bytes(py, &self.0.owner)
    }

    #[getter]
    fn admins<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.0.admins.iter().map(|a| bytes(py, &a.0)).collect()
    }

    #[getter]
    fn members_invite(&self) -> bool {
        self.0.members_invite
    }

    /// "owner", "admin" or "member" (anyone not named is a member).
    fn role(&self, member: &[u8]) -> &'static str {
        self.0.role(member).as_str()
    }

    fn __repr__(&self) -> String {
        format!(
            "Roles(owner={:?}, admins={})",
            hex::encode(&self.0.owner),
            self.0.admins.len()
        )
    }
}

/// The relay's observer of groups: validates handshake messages with no group secrets.
///
/// >>> tracker = GroupTracker()
/// >>> tracker.set_trust_anchors({"kid": issuer_public_key})
/// >>> group = tracker.observe(creator_group.group_info())
/// >>> event = group.process(commit)  # raises MlsError if it does not validate
#[pyclass(module = "svc_sdk._native", name = "GroupTracker", frozen)]
struct PyGroupTracker(Tracker);

#[pymethods]
impl PyGroupTracker {
    #[new]
    fn new() -> Self {
        PyGroupTracker(Tracker::new())
    }

    /// Replaces the issuer keys (kid -> raw Ed25519 public key) credentials must verify under.
    fn set_trust_anchors(&self, anchors: HashMap<String, Vec<u8>>) -> PyResult<()> {
        let anchors = TrustAnchors::new(anchors).map_err(to_py)?;
        self.0.set_trust_anchors(anchors);
        Ok(())
    }

    /// Starts following a group from its creator's GroupInfo (with the ratchet tree).
    fn observe(&self, py: Python<'_>, group_info: &[u8]) -> PyResult<PyTrackedGroup> {
        py.allow_threads(|| self.0.observe(group_info))
            .map(PyTrackedGroup::from)
            .map_err(to_py)
    }

    /// A group from ``TrackedGroup.snapshot()``.
    fn load(&self, py: Python<'_>, snapshot: &[u8]) -> PyResult<PyTrackedGroup> {
        py.allow_threads(|| self.0.load(snapshot))
            .map(PyTrackedGroup::from)
            .map_err(to_py)
    }
}

/// One group as the relay follows it. ``process`` changes it only when the message
/// validates.
#[pyclass(module = "svc_sdk._native", name = "TrackedGroup", frozen)]
struct PyTrackedGroup(std::sync::Mutex<TrackedGroup>);

impl From<TrackedGroup> for PyTrackedGroup {
    fn from(g: TrackedGroup) -> Self {
        PyTrackedGroup(std::sync::Mutex::new(g))
    }
}

impl PyTrackedGroup {
    fn lock(&self) -> std::sync::MutexGuard<'_, TrackedGroup> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl PyTrackedGroup {
    #[getter]
    fn epoch(&self) -> u64 {
        self.lock().epoch()
    }

    /// The group's cipher suite (1, 2, or the post-quantum 65100).
    #[getter]
    fn cipher_suite(&self) -> u16 {
        self.lock().cipher_suite()
    }

    #[getter]
    fn group_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        bytes(py, self.lock().group_id())
    }

    /// (member id, role) of every member, in leaf order.
    fn members<'py>(&self, py: Python<'py>) -> Vec<(Bound<'py, PyBytes>, &'static str)> {
        self.lock()
            .members()
            .into_iter()
            .map(|(id, role)| (bytes(py, &id), role.as_str()))
            .collect()
    }

    fn roles(&self) -> PyRoles {
        PyRoles(self.lock().roles())
    }

    /// The whole state, for the store (``GroupTracker.load`` reads it back).
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let snap = py.allow_threads(|| self.lock().snapshot()).map_err(to_py)?;
        Ok(bytes(py, &snap))
    }

    /// An independent copy, to validate on without touching this one.
    fn copy(&self) -> PyTrackedGroup {
        PyTrackedGroup::from(self.lock().clone())
    }

    /// Validates a commit or a leave proposal and applies it; raises MlsError, changing
    /// nothing, if it does not validate.
    fn process(&self, py: Python<'_>, message: &[u8]) -> PyResult<PyObserved> {
        py.allow_threads(|| self.lock().process(message))
            .map(PyObserved)
            .map_err(to_py)
    }
}

/// What a validated handshake message did: ``kind`` is "commit" or "leave".
#[pyclass(module = "svc_sdk._native", name = "Observed", frozen)]
struct PyObserved(Observed);

#[pymethods]
impl PyObserved {
    #[getter]
    fn kind(&self) -> &'static str {
        match self.0 {
            Observed::Commit(_) => "commit",
            Observed::Leave { .. } => "leave",
        }
    }

    /// The epoch a commit moved the group to (0 for a proposal).
    #[getter]
    fn epoch(&self) -> u64 {
        match &self.0 {
            Observed::Commit(c) => c.epoch,
            Observed::Leave { .. } => 0,
        }
    }

    /// The committer, or the member that proposes to leave.
    #[getter]
    fn sender<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        match &self.0 {
            Observed::Commit(c) => bytes(py, &c.committer),
            Observed::Leave { member } => bytes(py, member),
        }
    }

    /// (member id, KeyPackageRef) of each member a commit adds.
    #[getter]
    fn added<'py>(&self, py: Python<'py>) -> Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        match &self.0 {
            Observed::Commit(c) => c.added.iter().map(|(m, r)| (bytes(py, m), bytes(py, r))).collect(),
            Observed::Leave { .. } => Vec::new(),
        }
    }

    /// The HPKE init key of each key package a commit adds, in the order of ``added``.
    #[getter]
    fn added_init_keys<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        match &self.0 {
            Observed::Commit(c) => c.added_init_keys.iter().map(|k| bytes(py, k)).collect(),
            Observed::Leave { .. } => Vec::new(),
        }
    }

    #[getter]
    fn removed<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        match &self.0 {
            Observed::Commit(c) => c.removed.iter().map(|m| bytes(py, m)).collect(),
            Observed::Leave { .. } => Vec::new(),
        }
    }

    /// Members that left: removed by their own proposal.
    #[getter]
    fn left<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        match &self.0 {
            Observed::Commit(c) => c.left.iter().map(|m| bytes(py, m)).collect(),
            Observed::Leave { .. } => Vec::new(),
        }
    }

    #[getter]
    fn roles_changed(&self) -> bool {
        matches!(&self.0, Observed::Commit(c) if c.roles_changed)
    }

    fn __repr__(&self) -> String {
        format!("Observed(kind={:?}, epoch={})", self.kind(), self.epoch())
    }
}

/// `data_dir/client.sqlite3`: see svc_sdk.local_state, which wraps it.
#[pyclass(module = "svc_sdk._native", name = "LocalStore", frozen)]
struct PyLocalStore {
    inner: LocalStore,
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

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngine>()?;
    m.add_class::<PyGroup>()?;
    m.add_class::<PyPendingCommit>()?;
    m.add_class::<PyReceived>()?;
    m.add_class::<PyMessageInfo>()?;
    m.add_class::<PyAgentCredentialInfo>()?;
    m.add_class::<PyCredentialRequestInfo>()?;
    m.add_class::<PyRoles>()?;
    m.add_class::<PyGroupTracker>()?;
    m.add_class::<PyTrackedGroup>()?;
    m.add_class::<PyObserved>()?;
    m.add_class::<PyLocalStore>()?;
    m.add_function(wrap_pyfunction!(convert_state, m)?)?;
    m.add_function(wrap_pyfunction!(state_encryption, m)?)?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(verify_agent_credential, m)?)?;
    m.add_function(wrap_pyfunction!(verify_credential_request, m)?)?;
    m.add("DEFAULT_CIPHER_SUITE", DEFAULT_CIPHER_SUITE)?;
    m.add("PQ_CIPHER_SUITE", PQ_CIPHER_SUITE)?;
    crate::py_frames::register(m)?;
    crate::py_transport::register(m)?;
    crate::py_server::register(m)?;
    Ok(())
}
