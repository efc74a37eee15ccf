//! The relay's view of a group: mls-rs's external client, which follows a group's
//! handshake messages (PublicMessages) without any of its secrets.
//!
//! The relay observes each channel from its creator's GroupInfo and then validates every
//! commit and proposal before ordering it: the sender is a member, the signature and
//! epoch hold, the update path is well formed, added and updated leaves carry valid agent
//! credentials ([`SvcIdentityProvider`], checked at the relay's clock), and the channel's
//! roles policy ([`SvcRules`]) allows it. A handshake that fails any of these is never
//! stored. Without the group's secrets it cannot check a handshake's membership tag: a
//! commit whose tag its committer spoiled passes here and is refused by every member.
//! The policy keeps commits to the owner and admins, which is checked here from the
//! signature and the roles (docs/security.md, "A commit members cannot process").

use mls_rs::external_client::builder::{ExternalBaseConfig, WithCryptoProvider, WithIdentityProvider, WithMlsRules};
use mls_rs::external_client::{ExternalClient, ExternalGroup, ExternalReceivedMessage, ExternalSnapshot};
use mls_rs::group::proposal::Proposal;
use mls_rs::group::{CommitEffect, ProposalSender, Sender};
use mls_rs::{CipherSuiteProvider, CryptoProvider, WireFormat};
use mls_rs_core::crypto::HpkePublicKey;
use mls_rs_core::extension::ExtensionType;
use mls_rs_core::time::MlsTime;

use crate::credential::TrustAnchors;
use crate::engine::Crypto;
use crate::error::{EngineError, Result};
use crate::identity::{member_id_of, SvcIdentityProvider};
use crate::message::parse;
use crate::policy::{key_package_leaf_key, update_leaf_key, PolicyError, Role, RolesExt, SvcRules, ROLES_EXTENSION};

type TrackerConfig =
    WithIdentityProvider<SvcIdentityProvider, WithMlsRules<SvcRules, WithCryptoProvider<Crypto, ExternalBaseConfig>>>;

/// Observes groups for the relay. The trust anchors are the account API's credential
/// keys, replaceable in place when they rotate.
pub struct Tracker {
    client: ExternalClient<TrackerConfig>,
    provider: SvcIdentityProvider,
}

/// One group as the relay follows it.
#[derive(Clone)]
pub struct TrackedGroup {
    group: ExternalGroup<TrackerConfig>,
}

/// What a validated commit changed.
#[derive(Debug, Clone, Default)]
pub struct CommitEvent {
    /// The epoch the commit moved the group to.
    pub epoch: u64,
    pub committer: Vec<u8>,
    /// Added members: (member id, the KeyPackageRef a Welcome names them by).
    pub added: Vec<(Vec<u8>, Vec<u8>)>,
    /// The HPKE init key of each added key package, in the order of `added`: what makes a
    /// key package single-use. Unlike its KeyPackageRef, a copy with a re-encoded
    /// signature (ECDSA's `s` and `n - s`) has the same one.
    pub added_init_keys: Vec<Vec<u8>>,
    /// Members removed by another member.
    pub removed: Vec<Vec<u8>>,
    /// Members removed by their own proposal (they left).
    pub left: Vec<Vec<u8>>,
    /// The commit changed the roles or the policy.
    pub roles_changed: bool,
}

/// What the relay learnt from a validated handshake message.
#[derive(Debug, Clone)]
pub enum Observed {
    Commit(CommitEvent),
    /// A member's proposal to remove itself.
    Leave {
        member: Vec<u8>,
    },
    /// A member's proposal to update its own leaf (fresh keys, or a renewed credential).
    Update {
        member: Vec<u8>,
    },
    /// A proposal the group holds already (a resent Publish): it changes nothing.
    Repeat {
        member: Vec<u8>,
    },
}

/// Whether members can encrypt to `key` in suite `cipher_suite`: commits encrypt path
/// secrets to the leaves of the tree, so a leaf whose key HPKE refuses (an X25519 point of
/// small order, say), from a plain member's update or a joiner's key package, would make
/// every later commit fail to build, and with it every admin's add, removal and role
/// change. The relay tries the encryption itself before it accepts the leaf.
/// `what` names the key in the refusal.
pub fn check_encryption_key(cipher_suite: u16, key: &[u8], what: &str) -> Result<()> {
    let cs = Crypto::default()
        .cipher_suite_provider(cipher_suite.into())
        .ok_or_else(|| rejected("unsupported cipher suite"))?;
    let key = HpkePublicKey::from(key.to_vec());
    cs.kem_public_key_validate(&key)
        .map_err(|e| rejected(format!("{what} is not a valid public key: {e}")))?;
    cs.hpke_seal(&key, b"svc relay: key check", None, b"")
        .map_err(|e| rejected(format!("members cannot encrypt to {what}: {e}")))?;
    Ok(())
}

fn policy(e: PolicyError) -> EngineError {
    rejected(e.0)
}

fn rejected(detail: impl Into<String>) -> EngineError {
    EngineError::Mls {
        op: "validate handshake",
        detail: detail.into(),
    }
}

impl Default for Tracker {
    fn default() -> Self {
        Self::new()
    }
}

impl Tracker {
    pub fn new() -> Self {
        let provider = SvcIdentityProvider::new(TrustAnchors::default());
        let client = ExternalClient::builder()
            .crypto_provider(Crypto::default())
            .mls_rules(SvcRules)
            .identity_provider(provider.clone())
            .extension_type(ExtensionType::new(ROLES_EXTENSION))
            .build();
        Tracker { client, provider }
    }

    pub fn set_trust_anchors(&self, anchors: TrustAnchors) {
        self.provider.set_anchors(anchors);
    }

    /// Starts following a new group from its creator's GroupInfo (with the ratchet tree):
    /// its signature, tree and every leaf's credential are checked now.
    pub fn observe(&self, group_info: &[u8]) -> Result<TrackedGroup> {
        if self.provider.anchors().is_empty() {
            return Err(EngineError::NoTrustAnchors);
        }
        let msg = parse(group_info, "GroupInfo")?;
        if msg.wire_format() != WireFormat::GroupInfo {
            return Err(EngineError::Malformed {
                what: "GroupInfo",
                detail: format!("expected a GroupInfo, got {:?}", msg.wire_format()),
            });
        }
        let group = self
            .client
            .observe_group(msg, None, Some(MlsTime::now()))
            .map_err(|e| EngineError::mls("observe group", e))?;
        if RolesExt::from_extensions(&group.group_context().extensions).is_none() {
            return Err(rejected("the group has no svc roles extension"));
        }
        Ok(TrackedGroup { group })
    }

    /// A group from [`TrackedGroup::snapshot`].
    pub fn load(&self, snapshot: &[u8]) -> Result<TrackedGroup> {
        let snapshot =
            ExternalSnapshot::from_bytes(snapshot).map_err(|e| EngineError::mls("load group snapshot", e))?;
        let group = self
            .client
            .load_group(snapshot)
            .map_err(|e| EngineError::mls("load group snapshot", e))?;
        Ok(TrackedGroup { group })
    }
}

impl TrackedGroup {
    pub fn cipher_suite(&self) -> u16 {
        self.group.group_context().cipher_suite.into()
    }

    pub fn epoch(&self) -> u64 {
        self.group.group_context().epoch
    }

    pub fn group_id(&self) -> &[u8] {
        &self.group.group_context().group_id
    }

    pub fn roles(&self) -> RolesExt {
        RolesExt::from_extensions(&self.group.group_context().extensions).expect("checked when observed")
    }

    /// Every member's id and role, in leaf order.
    pub fn members(&self) -> Vec<(Vec<u8>, Role)> {
        let roles = self.roles();
        self.group
            .roster()
            .members_iter()
            .map(|m| {
                let id = member_id_of(&m.signing_identity.credential);
                let role = roles.role(&id);
                (id, role)
            })
            .collect()
    }

    pub fn snapshot(&self) -> Result<Vec<u8>> {
        self.group
            .snapshot()
            .to_bytes()
            .map_err(|e| EngineError::mls("group snapshot", e))
    }

    fn member_at(&self, index: u32) -> Vec<u8> {
        self.group
            .roster()
            .member_with_index(index)
            .map(|m| member_id_of(&m.signing_identity.credential))
            .unwrap_or_default()
    }

    /// Validates a commit or proposal (a PublicMessage of this group) and, if it holds,
    /// applies it. Nothing changes when it fails.
    pub fn process(&mut self, message: &[u8]) -> Result<Observed> {
        let msg = parse(message, "handshake message")?;
        if msg.wire_format() != WireFormat::PublicMessage {
            return Err(rejected("handshake messages must be MLS PublicMessages"));
        }
        let before = self.clone();
        let mut scratch = self.group.clone();
        let received = scratch
            .process_incoming_message_with_time(msg, MlsTime::now())
            .map_err(|e| EngineError::mls("validate handshake", e))?;
        let observed = match received {
            ExternalReceivedMessage::Commit(desc) => {
                let CommitEffect::NewEpoch(new_epoch) = &desc.effect else {
                    return Err(rejected("re-initialisation is not allowed"));
                };
                let cs = Crypto::default()
                    .cipher_suite_provider(self.group.group_context().cipher_suite)
                    .ok_or_else(|| rejected("unsupported cipher suite"))?;
                let mut event = CommitEvent {
                    epoch: new_epoch.epoch,
                    committer: before.member_at(desc.committer),
                    ..Default::default()
                };
                for p in &new_epoch.applied_proposals {
                    match &p.proposal {
                        Proposal::Add(add) => {
                            let kp = add.key_package();
                            // The joiner's leaf key is what later commits encrypt to.
                            let suite = u16::from(kp.cipher_suite);
                            check_encryption_key(suite, kp.hpke_init_key.as_ref(), "an added key package's init key")?;
                            let leaf_key = key_package_leaf_key(kp).map_err(policy)?;
                            check_encryption_key(suite, &leaf_key, "an added key package's leaf key")?;
                            let reference = kp
                                .to_reference(&cs)
                                .map_err(|e| EngineError::mls("key package ref", e))?;
                            event
                                .added
                                .push((member_id_of(&kp.signing_identity().credential), reference.to_vec()));
                            event.added_init_keys.push(kp.hpke_init_key.as_ref().to_vec());
                        }
                        Proposal::Remove(rm) => {
                            let who = before.member_at(rm.to_remove());
                            if p.sender == Sender::Member(rm.to_remove()) {
                                event.left.push(who);
                            } else {
                                event.removed.push(who);
                            }
                        }
                        Proposal::GroupContextExtensions(_) => event.roles_changed = true,
                        _ => {}
                    }
                }
                Observed::Commit(event)
            }
            ExternalReceivedMessage::Proposal(desc) => {
                let observed = match (&desc.sender, &desc.proposal) {
                    (ProposalSender::Member(index), Proposal::Remove(rm)) if rm.to_remove() == *index => {
                        Observed::Leave {
                            member: before.member_at(*index),
                        }
                    }
                    (ProposalSender::Member(index), Proposal::Update(update)) => {
                        check_encryption_key(
                            self.group.group_context().cipher_suite.into(),
                            &update_leaf_key(update).map_err(policy)?,
                            "the update's leaf key",
                        )?;
                        Observed::Update {
                            member: before.member_at(*index),
                        }
                    }
                    _ => {
                        return Err(rejected(
                            "a member proposes only its own key update or its own removal (leave)",
                        ))
                    }
                };
                // The proposals of an epoch live in the tracked group until a commit ends
                // it: one of each kind per member bounds them. The same proposal sent
                // again has the same reference and replaces itself.
                let ProposalSender::Member(index) = desc.sender else {
                    unreachable!("matched above")
                };
                let same_kind = |p: &Proposal| {
                    matches!(
                        (p, &desc.proposal),
                        (Proposal::Remove(_), Proposal::Remove(_)) | (Proposal::Update(_), Proposal::Update(_))
                    )
                };
                let held = scratch
                    .get_cached_proposals()
                    .iter()
                    .filter(|c| *c.sender() == Sender::Member(index) && same_kind(c.proposal()))
                    .count();
                if held > 1 {
                    return Err(rejected(
                        "a member has one key update and one leave proposal per epoch; this epoch holds one already",
                    ));
                }
                if scratch.get_cached_proposals().len() == self.group.get_cached_proposals().len() {
                    // The same proposal again (its reference is the key): nothing to store.
                    let (Observed::Leave { member } | Observed::Update { member }) = observed else {
                        unreachable!("a proposal")
                    };
                    return Ok(Observed::Repeat { member });
                }
                observed
            }
            _ => return Err(rejected("expected a commit or a proposal")),
        };
        self.group = scratch;
        Ok(observed)
    }
}
