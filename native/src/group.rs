//! One MLS group: every operation under the group's lock, state written after each change.
//!
//! A commit made here is *pending* until the delivery service accepts it
//! (`apply_pending_commit`) or rejects it because another commit won the epoch
//! (`clear_pending_commit`, then `process` the winner and build again).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mls_rs::group::proposal::Proposal;
use mls_rs::group::{CommitEffect, CommitMessageDescription, ReceivedMessage, Sender};
use mls_rs::identity::SigningIdentity;
use mls_rs::{Group, WireFormat};

use crate::engine::{Agent, Config, MlsClient};
use crate::error::{EngineError, Result};
use crate::group_store::OutboxRow;
use crate::identity::member_id_of;
use crate::message::{expect_kind, is_commit, parse};
use crate::policy::{with_roles, Role, RolesExt};

pub type MlsGroup = Group<Config>;

/// A commit waiting for the delivery service's verdict.
#[derive(Debug, Clone)]
pub struct PendingCommit {
    pub commit: Vec<u8>,
    pub welcome: Option<Vec<u8>>,
    /// The epoch the commit was built in; the relay accepts it only while that is current.
    pub epoch: u64,
}

/// What a commit changed, as this member sees it.
#[derive(Debug, Clone, Default)]
pub struct CommitInfo {
    pub epoch: u64,
    pub committer: Vec<u8>,
    pub added: Vec<Vec<u8>>,
    pub removed: Vec<Vec<u8>>,
    /// Members whose update proposals the commit applied (their leaves have new keys).
    pub updated: Vec<Vec<u8>>,
    /// This agent was removed; the group is gone from its store.
    pub self_removed: bool,
}

#[derive(Debug, Clone)]
pub enum Received {
    Application {
        sender: Vec<u8>,
        data: Vec<u8>,
        epoch: u64,
        authenticated_data: Vec<u8>,
    },
    Commit(CommitInfo),
    Proposal {
        sender: Option<Vec<u8>>,
        epoch: u64,
    },
}

pub struct GroupHandle {
    group_id: Vec<u8>,
    client: MlsClient,
    agent: Arc<Agent>,
    // None once this agent has been removed or the group was deleted, or (`unloaded`)
    // until the stored state can be read back after a failed change.
    state: Mutex<Option<MlsGroup>>,
    // Messages processed with `save: false` and not written yet. Read and changed only
    // under `state`'s lock; every other change writes these first, so that an operation
    // that fails and reloads the stored state never loses them.
    unsaved: AtomicBool,
    // `state` is None because reading the stored state back failed, not for removal.
    unloaded: AtomicBool,
    // The engine was closed (`close`): `state` is None and nothing is written any more.
    closed: AtomicBool,
}

/// A member's id, `account || identity`, from the credential mls-rs validated.
fn identity_of(member: &mls_rs::group::Member) -> Vec<u8> {
    member_id_of(&member.signing_identity.credential)
}

fn roster(group: &MlsGroup) -> Vec<(u32, Vec<u8>)> {
    group
        .roster()
        .members_iter()
        .map(|m| (m.index, identity_of(&m)))
        .collect()
}

fn lookup(roster: &[(u32, Vec<u8>)], index: u32) -> Vec<u8> {
    roster
        .iter()
        .find(|(i, _)| *i == index)
        .map(|(_, id)| id.clone())
        .unwrap_or_default()
}

fn commit_info(desc: &CommitMessageDescription, before: &[(u32, Vec<u8>)]) -> CommitInfo {
    let (new_epoch, self_removed) = match &desc.effect {
        CommitEffect::NewEpoch(e) => (Some(e), false),
        CommitEffect::Removed { new_epoch, .. } => (Some(new_epoch), true),
        CommitEffect::ReInit(_) => (None, false),
    };
    let mut info = CommitInfo {
        committer: lookup(before, desc.committer),
        self_removed,
        ..Default::default()
    };
    if let Some(e) = new_epoch {
        info.epoch = e.epoch;
        for p in &e.applied_proposals {
            match &p.proposal {
                Proposal::Add(add) => info.added.push(member_id_of(&add.signing_identity().credential)),
                Proposal::Remove(rm) => info.removed.push(lookup(before, rm.to_remove())),
                Proposal::Update(_) => {
                    if let Sender::Member(index) = p.sender {
                        info.updated.push(lookup(before, index));
                    }
                }
                _ => {}
            }
        }
    }
    info
}

/// `identity@account-uuid` for error messages, as `AgentId` prints in Python: readable,
/// and unambiguous across accounts.
fn display_member(id: &[u8]) -> String {
    if id.len() <= 16 {
        return hex::encode(id);
    }
    let h = hex::encode(&id[..16]);
    format!(
        "{}@{}-{}-{}-{}-{}",
        String::from_utf8_lossy(&id[16..]),
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A message that passed the state-free checks, with what its processing needs.
struct Checked {
    msg: mls_rs::MlsMessage,
    epoch: u64,
    roster_before: Vec<(u32, Vec<u8>)>,
}

fn apply_message(g: &mut MlsGroup, checked: Checked) -> Result<Received> {
    let Checked {
        msg,
        epoch,
        roster_before,
    } = checked;
    let received = g
        .process_incoming_message(msg)
        .map_err(|e| EngineError::mls("process message", e))?;
    Ok(match received {
        ReceivedMessage::ApplicationMessage(app) => Received::Application {
            sender: g
                .member_at_index(app.sender_index)
                .map(|m| identity_of(&m))
                .unwrap_or_default(),
            data: app.data().to_vec(),
            epoch,
            authenticated_data: app.authenticated_data,
        },
        ReceivedMessage::Commit(desc) => Received::Commit(commit_info(&desc, &roster_before)),
        ReceivedMessage::Proposal(p) => Received::Proposal {
            sender: match p.sender {
                mls_rs::group::ProposalSender::Member(i) => Some(lookup(&roster(g), i)),
                _ => None,
            },
            epoch,
        },
        _ => {
            return Err(EngineError::WrongKind {
                expected: "a group message",
                got: "another message type".into(),
            })
        }
    })
}

impl GroupHandle {
    pub(crate) fn new(client: MlsClient, group: MlsGroup, agent: Arc<Agent>) -> Self {
        Self {
            group_id: group.group_id().to_vec(),
            client,
            agent,
            state: Mutex::new(Some(group)),
            unsaved: AtomicBool::new(false),
            unloaded: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// The engine is closing: waits for the operation under way, if any, and refuses
    /// every later one with `Closed`, so that nothing of this handle writes to the
    /// data_dir once another engine may own it. What `process_batch(.., save: false)`
    /// left in memory goes: those messages decrypt again from the stored state.
    pub(crate) fn close(&self) {
        let mut guard = self.lock();
        *guard = None;
        self.closed.store(true, Ordering::Relaxed);
    }

    /// Writes what `process_batch(.., save: false)` left in memory. Caller holds the lock.
    fn write_unsaved(&self, group: &mut MlsGroup) -> Result<()> {
        if self.unsaved.load(Ordering::Relaxed) {
            group
                .write_to_storage()
                .map_err(|e| EngineError::mls("group storage", e))?;
            self.unsaved.store(false, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Returns to the stored state if `process_batch(.., save: false)` left anything in
    /// memory: those messages decrypt again, since their keys were only used up in memory.
    pub fn discard_unsaved(&self) -> Result<()> {
        let mut guard = self.lock();
        if let Some(group) = guard.as_mut() {
            if self.unsaved.load(Ordering::Relaxed) {
                *group = self
                    .client
                    .load_group(&self.group_id)
                    .map_err(|e| EngineError::mls("group load", e))?;
                self.unsaved.store(false, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Writes the state that `process_batch(.., save: false)` left in memory.
    pub fn save(&self) -> Result<()> {
        let mut guard = self.lock();
        match guard.as_mut() {
            Some(group) => self.write_unsaved(group),
            None if self.closed.load(Ordering::Relaxed) => Err(EngineError::Closed),
            None => Ok(()), // removed: nothing is kept
        }
    }

    pub fn group_id(&self) -> &[u8] {
        &self.group_id
    }

    fn lock(&self) -> MutexGuard<'_, Option<MlsGroup>> {
        // A panic inside mls-rs must not make the group unusable for every other thread.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_removed(&self) -> bool {
        self.lock().is_none() && !self.unloaded.load(Ordering::Relaxed) && !self.closed.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_removed(&self) {
        *self.lock() = None;
        self.unloaded.store(false, Ordering::Relaxed);
    }

    /// After a failed change the stored state could not be read back (an I/O error):
    /// the in-memory state may be half-applied, so it goes, and the next use reads the
    /// stored state again (see [`Self::live`]) instead of calling the agent removed.
    fn unload(&self, guard: &mut Option<MlsGroup>) {
        *guard = None;
        self.unloaded.store(true, Ordering::Relaxed);
    }

    /// The live group, read back from storage first if an earlier read-back failed.
    fn live<'a>(&self, guard: &'a mut Option<MlsGroup>) -> Result<&'a mut MlsGroup> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(EngineError::Closed);
        }
        if guard.is_none() && self.unloaded.load(Ordering::Relaxed) {
            let stored = self
                .client
                .load_group(&self.group_id)
                .map_err(|e| EngineError::Storage(format!("reading the group's stored state: {e}")))?;
            *guard = Some(stored);
            self.unloaded.store(false, Ordering::Relaxed);
            self.unsaved.store(false, Ordering::Relaxed);
        }
        guard.as_mut().ok_or(EngineError::Removed)
    }

    /// Runs `op` on the live group. If it fails, the in-memory state is replaced by the
    /// last stored state, so a bad message can never leave half-applied changes behind.
    fn mutate<T>(&self, op: impl FnOnce(&mut MlsGroup) -> Result<T>) -> Result<T> {
        let mut guard = self.lock();
        let group = self.live(&mut guard)?;
        self.write_unsaved(group)?;
        match op(group) {
            Ok(v) => Ok(v),
            Err(e) => {
                match self.client.load_group(&self.group_id) {
                    Ok(stored) => *group = stored,
                    Err(_) => self.unload(&mut guard),
                }
                Err(e)
            }
        }
    }

    fn read<T>(&self, op: impl FnOnce(&MlsGroup) -> T) -> Result<T> {
        let mut guard = self.lock();
        Ok(op(self.live(&mut guard)?))
    }

    pub fn epoch(&self) -> Result<u64> {
        self.read(|g| g.current_epoch())
    }

    pub fn cipher_suite(&self) -> Result<u16> {
        self.read(|g| g.cipher_suite().into())
    }

    /// (leaf index, identity) of every member, in leaf order.
    pub fn members(&self) -> Result<Vec<(u32, Vec<u8>)>> {
        self.read(roster)
    }

    pub fn has_pending_commit(&self) -> Result<bool> {
        self.read(|g| g.has_pending_commit())
    }

    /// GroupInfo with the ratchet tree: what the relay observes the group from.
    pub fn group_info(&self) -> Result<Vec<u8>> {
        self.read(|g| {
            g.group_info_message(true)
                .and_then(|m| m.to_bytes())
                .map_err(|e| EngineError::mls("group info", e))
        })?
    }

    pub fn encrypt(&self, plaintext: &[u8], authenticated_data: &[u8]) -> Result<Vec<u8>> {
        Ok(self
            .encrypt_batch(&[plaintext], authenticated_data)?
            .pop()
            .expect("one message in, one out"))
    }

    /// Encrypts several messages with a single state write (group commit). The advanced
    /// ratchet is persisted before any ciphertext is returned, so a crash can never make
    /// the next process encrypt under a key generation that was already used.
    pub fn encrypt_batch(&self, plaintexts: &[&[u8]], authenticated_data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.mutate(|g| {
            let mut out = Vec::with_capacity(plaintexts.len());
            for plaintext in plaintexts {
                let msg = g
                    .encrypt_application_message(plaintext, authenticated_data.to_vec())
                    .map_err(|e| EngineError::mls("encrypt", e))?;
                out.push(msg.to_bytes().map_err(|e| EngineError::mls("encode", e))?);
            }
            g.write_to_storage().map_err(|e| EngineError::mls("group storage", e))?;
            Ok(out)
        })
    }

    /// Encrypts outbox entries `(pos, id, payload)` and stores each as an outbox row in
    /// the same transaction as the advanced ratchet (`group_store.rs`): after a crash the
    /// rows exist exactly when their key generations were recorded as used. An entry at
    /// a position already queued replaces it (a message re-encrypted in a newer epoch).
    /// Returns the epoch and the ciphertexts, in order.
    pub fn encrypt_queued(&self, entries: &[(u64, &[u8], &[u8])]) -> Result<(u64, Vec<Vec<u8>>)> {
        let store = self.client.group_state_storage();
        self.mutate(|g| {
            let epoch = g.current_epoch();
            let mut rows = Vec::with_capacity(entries.len());
            for &(pos, id, payload) in entries {
                let ciphertext = g
                    .encrypt_application_message(payload, Vec::new())
                    .map_err(|e| EngineError::mls("encrypt", e))?
                    .to_bytes()
                    .map_err(|e| EngineError::mls("encode", e))?;
                rows.push(OutboxRow {
                    pos,
                    id: id.to_vec(),
                    epoch,
                    payload: payload.to_vec(),
                    ciphertext,
                });
            }
            store.stage(&self.group_id, rows);
            let written = g.write_to_storage();
            let rows = store.unstage(&self.group_id);
            written.map_err(|e| EngineError::mls("group storage", e))?;
            let rows = rows.ok_or_else(|| EngineError::Storage("the staged outbox rows are gone".into()))?;
            Ok((epoch, rows.into_iter().map(|r| r.ciphertext).collect()))
        })
    }

    /// This group's outbox: what was encrypted and not yet acknowledged, in order.
    pub fn outbox(&self) -> Result<Vec<OutboxRow>> {
        self.client.group_state_storage().outbox(&self.group_id)
    }

    /// Deletes the outbox rows up to position `through` (acknowledged or given up on).
    pub fn retire_outbox(&self, through: u64) -> Result<()> {
        self.client.group_state_storage().retire(&self.group_id, through)
    }

    pub fn process(&self, bytes: &[u8]) -> Result<Received> {
        self.process_batch(&[bytes], true)
            .pop()
            .expect("one message in, one result out")
    }

    /// Processes messages in delivery order with a single state write at the end. Each
    /// message gets its own result; a bad one is rolled back without losing the good ones
    /// around it.
    ///
    /// With `save: false` the new state stays in memory until `save` (or the next change
    /// of any kind) writes it: a caller can first store the decrypted messages, so that a
    /// crash in between leaves them decryptable again instead of lost.
    pub fn process_batch(&self, messages: &[&[u8]], save: bool) -> Vec<Result<Received>> {
        let mut guard = self.lock();
        let ready = match self.live(&mut guard) {
            Ok(group) => self.write_unsaved(group),
            Err(EngineError::Removed) => Ok(()), // each message gets Removed below
            Err(e) => Err(e),
        };
        if let Err(e) = ready {
            if matches!(e, EngineError::Closed) {
                return messages.iter().map(|_| Err(EngineError::Closed)).collect();
            }
            let err = e.to_string();
            return messages
                .iter()
                .map(|_| Err(EngineError::Storage(err.clone())))
                .collect();
        }
        let mut results: Vec<Result<Received>> = Vec::with_capacity(messages.len());
        // Indices applied since the stored state was written: replayed if a later one fails.
        let mut unsaved: Vec<usize> = Vec::new();
        let mut removed: Option<usize> = None;
        for (i, bytes) in messages.iter().enumerate() {
            let Some(group) = guard.as_mut().filter(|_| removed.is_none()) else {
                results.push(Err(EngineError::Removed));
                continue;
            };
            let checked = match self.precheck(group, bytes) {
                Ok(checked) => checked,
                Err(e) => {
                    results.push(Err(e));
                    continue;
                }
            };
            match apply_message(group, checked) {
                Ok(received) => {
                    if matches!(&received, Received::Commit(c) if c.self_removed) {
                        removed = Some(i);
                    }
                    unsaved.push(i);
                    results.push(Ok(received));
                }
                Err(e) => {
                    results.push(Err(e));
                    if let Err(fatal) = self.restore(group, messages, &unsaved, save) {
                        // The stored state cannot be reached now: read it on next use.
                        self.unload(&mut guard);
                        results.resize_with(messages.len(), || Err(EngineError::Storage(fatal.to_string())));
                        return results;
                    }
                    if save {
                        unsaved.clear(); // written by restore
                    } // else the stored state is still the one from before this batch
                }
            }
        }
        if let Some(i) = removed {
            drop(guard);
            // If the secrets cannot be deleted, say so rather than report a clean removal.
            if let Err(e) = self.forget() {
                results[i] = Err(e);
            }
            return results;
        }
        if let Some(group) = guard.as_mut() {
            if !unsaved.is_empty() && !save {
                self.unsaved.store(true, Ordering::Relaxed);
            } else if !unsaved.is_empty() {
                if let Err(e) = group.write_to_storage() {
                    // Nothing of this batch is durable: report every applied message as failed
                    // and return to the stored state, so the caller retries them all.
                    let err = EngineError::mls("group storage", e);
                    for i in unsaved {
                        results[i] = Err(EngineError::Storage(err.to_string()));
                    }
                    match self.client.load_group(&self.group_id) {
                        Ok(stored) => *group = stored,
                        Err(_) => self.unload(&mut guard),
                    }
                }
            }
        }
        results
    }

    /// Checks a message against the group without touching its state.
    fn precheck(&self, group: &MlsGroup, bytes: &[u8]) -> Result<Checked> {
        let msg = parse(bytes, "MLS message")?;
        if !matches!(
            msg.wire_format(),
            WireFormat::PrivateMessage | WireFormat::PublicMessage
        ) {
            expect_kind(&msg, WireFormat::PrivateMessage, "a group message (private or public)")?;
        }
        if msg.group_id() != Some(self.group_id.as_slice()) {
            return Err(EngineError::WrongGroup {
                got: hex::encode(msg.group_id().unwrap_or_default()),
                want: hex::encode(&self.group_id),
            });
        }
        let commit = is_commit(&msg);
        let current = group.current_epoch();
        let epoch = msg.epoch().unwrap_or_default();
        if epoch > current || (commit && epoch != current) {
            return Err(EngineError::WrongEpoch {
                message: epoch,
                group: current,
            });
        }
        let roster_before = if commit { roster(group) } else { Vec::new() };
        Ok(Checked {
            msg,
            epoch,
            roster_before,
        })
    }

    /// Returns to the stored state and re-applies the messages that succeeded since it
    /// was written, then writes: a failed message leaves no trace, the good ones stay.
    fn restore(&self, group: &mut MlsGroup, messages: &[&[u8]], unsaved: &[usize], save: bool) -> Result<()> {
        *group = self
            .client
            .load_group(&self.group_id)
            .map_err(|e| EngineError::mls("group load", e))?;
        for &j in unsaved {
            let checked = self.precheck(group, messages[j])?;
            apply_message(group, checked)?;
        }
        if !unsaved.is_empty() && save {
            group
                .write_to_storage()
                .map_err(|e| EngineError::mls("group storage", e))?;
        }
        Ok(())
    }

    /// Removed from the group: drop its state and secrets, here and on disk.
    fn forget(&self) -> Result<()> {
        *self.lock() = None;
        self.client.group_state_storage().delete_group(&self.group_id)
    }

    fn ensure_no_pending(g: &MlsGroup) -> Result<()> {
        if g.has_pending_commit() {
            Err(EngineError::CommitPending(g.current_epoch()))
        } else {
            Ok(())
        }
    }

    /// A commit builder whose commit also moves this agent's leaf to its current
    /// credential when the leaf still carries an older one (a renewal). Fails while the
    /// agent's credential is missing or not valid now: mls-rs would not check it.
    fn commit_builder<'a>(&self, g: &'a mut MlsGroup) -> Result<mls_rs::group::CommitBuilder<'a, Config>> {
        let current = self.agent.usable()?;
        let stale = Self::leaf_is_stale(g, &current)?;
        let builder = g.commit_builder().commit_time(mls_rs_core::time::MlsTime::now());
        Ok(if stale {
            builder.set_new_signing_identity(self.agent.secret_key.clone(), current)
        } else {
            builder
        })
    }

    /// Whether this agent's leaf still carries an older credential than `current`.
    fn leaf_is_stale(g: &MlsGroup, current: &SigningIdentity) -> Result<bool> {
        let leaf = g
            .current_member_signing_identity()
            .map_err(|e| EngineError::mls("own leaf", e))?;
        Ok(leaf != current)
    }

    fn finish_commit(g: &mut MlsGroup, out: mls_rs::group::CommitOutput) -> Result<PendingCommit> {
        // The pending commit is part of the stored state: a restart can still apply or clear it.
        g.write_to_storage().map_err(|e| EngineError::mls("group storage", e))?;
        Ok(PendingCommit {
            commit: out
                .commit_message
                .to_bytes()
                .map_err(|e| EngineError::mls("encode", e))?,
            welcome: match out.welcome_messages.first() {
                Some(w) => Some(w.to_bytes().map_err(|e| EngineError::mls("encode", e))?),
                None => None,
            },
            epoch: g.current_epoch(),
        })
    }

    /// Adds members by key package: a pending commit plus the Welcome for the joiners.
    pub fn add_members(&self, key_packages: &[Vec<u8>]) -> Result<PendingCommit> {
        if key_packages.is_empty() {
            return Err(EngineError::Malformed {
                what: "key package list",
                detail: "no key packages given".into(),
            });
        }
        let mut parsed = Vec::with_capacity(key_packages.len());
        for kp in key_packages {
            let msg = parse(kp, "key package")?;
            expect_kind(&msg, WireFormat::KeyPackage, "a key package")?;
            parsed.push(msg);
        }
        self.mutate(|g| {
            Self::ensure_no_pending(g)?;
            let want: u16 = g.cipher_suite().into();
            let members = roster(g);
            let mut seen: Vec<Vec<u8>> = Vec::new();
            for msg in &parsed {
                let kp = msg.as_key_package().expect("checked wire format");
                let got: u16 = kp.cipher_suite.into();
                if got != want {
                    return Err(EngineError::KeyPackageSuite { got, want });
                }
                let id = member_id_of(&kp.signing_identity().credential);
                if members.iter().any(|(_, m)| *m == id) || seen.contains(&id) {
                    return Err(EngineError::AlreadyMember(display_member(&id)));
                }
                seen.push(id);
            }
            let mut builder = self.commit_builder(g)?;
            for msg in parsed {
                builder = builder
                    .add_member(msg)
                    .map_err(|e| EngineError::mls("add member (bad key package)", e))?;
            }
            let out = builder.build().map_err(|e| EngineError::mls("add member commit", e))?;
            Self::finish_commit(g, out)
        })
    }

    /// Removes members by identity.
    pub fn remove_members(&self, identities: &[Vec<u8>]) -> Result<PendingCommit> {
        if identities.is_empty() {
            return Err(EngineError::Malformed {
                what: "identity list",
                detail: "no identities given".into(),
            });
        }
        self.mutate(|g| {
            Self::ensure_no_pending(g)?;
            let members = roster(g);
            let me = g.current_member_index();
            let mut builder = self.commit_builder(g)?;
            for id in identities {
                let (index, _) = members
                    .iter()
                    .find(|(_, m)| m == id)
                    .ok_or_else(|| EngineError::NotAMember(display_member(id)))?;
                if *index == me {
                    return Err(EngineError::Mls {
                        op: "remove member",
                        detail: "an agent cannot remove itself by commit; another member must remove it".into(),
                    });
                }
                builder = builder
                    .remove_member(*index)
                    .map_err(|e| EngineError::mls("remove member", e))?;
            }
            let out = builder
                .build()
                .map_err(|e| EngineError::mls("remove member commit", e))?;
            Self::finish_commit(g, out)
        })
    }

    /// The channel's roles as this member's current epoch has them.
    pub fn roles(&self) -> Result<RolesExt> {
        self.read(|g| RolesExt::from_extensions(&g.context().extensions))?
            .ok_or_else(|| EngineError::Mls {
                op: "roles",
                detail: "the group has no svc roles extension".into(),
            })
    }

    /// Gives a member a role (owner hands ownership over; the old owner becomes an
    /// admin). Only the owner and admins may; the policy refuses anything else.
    pub fn set_role(&self, member: &[u8], role: Role) -> Result<PendingCommit> {
        self.change_roles(|roles, members| {
            if !members.iter().any(|(_, m)| m == member) {
                return Err(EngineError::NotAMember(display_member(member)));
            }
            Ok(roles.with_role(member, role))
        })
    }

    /// Whether plain members may create invites (default: only the owner and admins).
    pub fn set_members_invite(&self, allowed: bool) -> Result<PendingCommit> {
        self.change_roles(|roles, _| {
            let mut next = roles.clone();
            next.members_invite = allowed;
            Ok(next)
        })
    }

    fn change_roles(
        &self,
        change: impl FnOnce(&RolesExt, &[(u32, Vec<u8>)]) -> Result<RolesExt>,
    ) -> Result<PendingCommit> {
        self.mutate(|g| {
            Self::ensure_no_pending(g)?;
            let current = g.context().extensions.clone();
            let roles = RolesExt::from_extensions(&current).ok_or_else(|| EngineError::Mls {
                op: "roles",
                detail: "the group has no svc roles extension".into(),
            })?;
            let next = change(&roles, &roster(g))?;
            let out = self
                .commit_builder(g)?
                .set_group_context_ext(with_roles(&current, next))
                .map_err(|e| EngineError::mls("roles change", e))?
                .build()
                .map_err(|e| EngineError::mls("roles change commit", e))?;
            Self::finish_commit(g, out)
        })
    }

    /// A proposal to remove this agent, for another member to commit (RFC 9420 forbids
    /// removing yourself by your own commit). Stays valid for the current epoch only.
    pub fn propose_leave(&self) -> Result<Vec<u8>> {
        self.mutate(|g| {
            Self::ensure_no_pending(g)?;
            let me = g.current_member_index();
            let msg = g
                .propose_remove(me, Vec::new())
                .map_err(|e| EngineError::mls("leave proposal", e))?;
            g.write_to_storage().map_err(|e| EngineError::mls("group storage", e))?;
            msg.to_bytes().map_err(|e| EngineError::mls("encode", e))
        })
    }

    /// A proposal to refresh this agent's leaf — fresh keys, and its current credential
    /// when the leaf still carries an older one — for an admin to commit (a plain member
    /// does not commit). mls-rs keeps the new private keys in the group state until a
    /// commit applies the update or ends the epoch without it.
    pub fn propose_update(&self) -> Result<Vec<u8>> {
        let current = self.agent.usable()?;
        self.mutate(|g| {
            Self::ensure_no_pending(g)?;
            let msg = if Self::leaf_is_stale(g, &current)? {
                g.propose_update_with_identity(self.agent.secret_key.clone(), current, Vec::new())
            } else {
                g.propose_update(Vec::new())
            }
            .map_err(|e| EngineError::mls("update proposal", e))?;
            g.write_to_storage().map_err(|e| EngineError::mls("group storage", e))?;
            msg.to_bytes().map_err(|e| EngineError::mls("encode", e))
        })
    }

    /// An empty commit with an update path: fresh leaf keys for post-compromise security,
    /// and the agent's current credential in its leaf (how a renewal reaches a group).
    pub fn self_update(&self) -> Result<PendingCommit> {
        self.mutate(|g| {
            Self::ensure_no_pending(g)?;
            let out = self
                .commit_builder(g)?
                .build()
                .map_err(|e| EngineError::mls("self-update commit", e))?;
            Self::finish_commit(g, out)
        })
    }

    /// The delivery service accepted our commit: move to the new epoch.
    pub fn apply_pending_commit(&self) -> Result<CommitInfo> {
        self.mutate(|g| {
            if !g.has_pending_commit() {
                return Err(EngineError::NoPendingCommit);
            }
            let before = roster(g);
            let desc = g
                .apply_pending_commit()
                .map_err(|e| EngineError::mls("apply commit", e))?;
            g.write_to_storage().map_err(|e| EngineError::mls("group storage", e))?;
            Ok(commit_info(&desc, &before))
        })
    }

    /// The delivery service rejected our commit: forget it (the epoch is unchanged).
    pub fn clear_pending_commit(&self) -> Result<()> {
        self.mutate(|g| {
            if !g.has_pending_commit() {
                return Err(EngineError::NoPendingCommit);
            }
            g.clear_pending_commit();
            g.write_to_storage().map_err(|e| EngineError::mls("group storage", e))
        })
    }
}
