//! The relay's view of groups: `GroupTracker` follows each channel's public ratchet tree
//! through the commits it accepts, so the relay validates what it cannot decrypt.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::credential::TrustAnchors;
use crate::policy::{Role, RolesExt};
use crate::python::{bytes, to_py};
use crate::tracker::{Observed, TrackedGroup, Tracker};

pub(crate) fn parse_role(role: &str) -> PyResult<Role> {
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
pub(crate) struct PyRoles(pub(crate) RolesExt);

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

    /// Validates a commit or a member's proposal (its leave or its key update) and
    /// applies it; raises MlsError, changing nothing, if it does not validate.
    fn process(&self, py: Python<'_>, message: &[u8]) -> PyResult<PyObserved> {
        py.allow_threads(|| self.lock().process(message))
            .map(PyObserved)
            .map_err(to_py)
    }
}

/// What a validated handshake message did: ``kind`` is "commit", "leave", "update" or
/// "repeat" (a proposal the group holds already).
#[pyclass(module = "svc_sdk._native", name = "Observed", frozen)]
struct PyObserved(Observed);

#[pymethods]
impl PyObserved {
    #[getter]
    fn kind(&self) -> &'static str {
        match self.0 {
            Observed::Commit(_) => "commit",
            Observed::Leave { .. } => "leave",
            Observed::Update { .. } => "update",
            Observed::Repeat { .. } => "repeat",
        }
    }

    /// The epoch a commit moved the group to (0 for a proposal).
    #[getter]
    fn epoch(&self) -> u64 {
        match &self.0 {
            Observed::Commit(c) => c.epoch,
            Observed::Leave { .. } | Observed::Update { .. } | Observed::Repeat { .. } => 0,
        }
    }

    /// The committer, or the member that proposes.
    #[getter]
    fn sender<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        match &self.0 {
            Observed::Commit(c) => bytes(py, &c.committer),
            Observed::Leave { member } | Observed::Update { member } | Observed::Repeat { member } => bytes(py, member),
        }
    }

    /// (member id, KeyPackageRef) of each member a commit adds.
    #[getter]
    fn added<'py>(&self, py: Python<'py>) -> Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        match &self.0 {
            Observed::Commit(c) => c.added.iter().map(|(m, r)| (bytes(py, m), bytes(py, r))).collect(),
            _ => Vec::new(),
        }
    }

    /// The HPKE init key of each key package a commit adds, in the order of ``added``.
    #[getter]
    fn added_init_keys<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        match &self.0 {
            Observed::Commit(c) => c.added_init_keys.iter().map(|k| bytes(py, k)).collect(),
            _ => Vec::new(),
        }
    }

    #[getter]
    fn removed<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        match &self.0 {
            Observed::Commit(c) => c.removed.iter().map(|m| bytes(py, m)).collect(),
            _ => Vec::new(),
        }
    }

    /// Members that left: removed by their own proposal.
    #[getter]
    fn left<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        match &self.0 {
            Observed::Commit(c) => c.left.iter().map(|m| bytes(py, m)).collect(),
            _ => Vec::new(),
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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRoles>()?;
    m.add_class::<PyGroupTracker>()?;
    m.add_class::<PyTrackedGroup>()?;
    m.add_class::<PyObserved>()?;
    Ok(())
}
