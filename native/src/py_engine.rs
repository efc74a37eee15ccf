//! The agent side of the bindings: `Engine` (one agent's MLS state in its `data_dir`),
//! `Group`, and what group operations return (`PendingCommit`, `Received`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::engine::Engine;
use crate::group::{CommitInfo, GroupHandle, PendingCommit, Received};
use crate::local_state::LocalStore;
use crate::py_inspect::PyAgentCredentialInfo;
use crate::py_local::PyLocalStore;
use crate::py_tracker::{parse_role, PyRoles};
use crate::python::{bytes, to_py};
use crate::state_key::StateKey;

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

    /// Releases `data_dir` for another engine (it is locked from the constructor on, and
    /// released too when the engine is garbage-collected). Waits for group operations
    /// under way; afterwards the engine's groups, and its group calls, raise
    /// ChannelClosedError.
    fn close(&self, py: Python<'_>) {
        py.allow_threads(|| self.inner.close());
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

    /// A proposal (to publish) refreshing this member's leaf, for an admin to commit.
    fn propose_update<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let msg = py.allow_threads(|| self.inner.propose_update()).map_err(to_py)?;
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

    /// Members whose key updates (update proposals) this commit applied.
    #[getter]
    fn updated<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.commit()
            .map(|c| c.updated.iter().map(|id| bytes(py, id)).collect())
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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngine>()?;
    m.add_class::<PyGroup>()?;
    m.add_class::<PyPendingCommit>()?;
    m.add_class::<PyReceived>()?;
    Ok(())
}
