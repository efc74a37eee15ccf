//! Channel roles and the membership policy every member and the relay enforce.
//!
//! The roles live in the group context as the [`RolesExt`] extension, so they are part of
//! what every member agrees on in each epoch, and they change only by a commit that all
//! members (and the relay's observer) check with the same rules, [`SvcRules`]:
//!
//! - the creator is the owner; admins are listed; everyone else is a member;
//! - only the owner and admins commit. They add members, remove others, change roles or
//!   the policy; only the owner hands ownership over, and the owner is never removed, not
//!   even by leaving (hand it over first);
//! - a plain member proposes: its own key update (an update proposal) and its leaving (a
//!   remove proposal of its own), which an admin's commit carries. A commit carries
//!   secrets that only members can check (its membership and confirmation tags, the path
//!   secrets it encrypts to each member), so one that is spoiled passes the relay and
//!   strands the members; keeping commits to the agents that hold authority over the
//!   channel anyway means a plain member cannot strand anyone (docs/security.md);
//! - a role held by an agent that leaves or is removed goes with it: the rules add the
//!   roles change to that commit on every side alike (a local proposal, RFC 9420 leaves
//!   such policy to the application), so a re-added agent starts as a plain member;
//! - nothing else: no pre-shared keys, re-initialisation, external joins or senders, and
//!   no change of other group context extensions.
//!
//! mls-rs calls [`MlsRules::filter_proposals`] when a member builds a commit, when a
//! member processes one and when the relay's `ExternalGroup` validates one, so a commit
//! that breaks the policy is refused by all three even if one of them were to accept it.

use mls_rs::error::IntoAnyError;
use mls_rs::group::proposal::{Proposal, UpdateProposal};
use mls_rs::group::{Roster, Sender};
use mls_rs::mls_rules::{
    CommitDirection, CommitOptions, CommitSource, EncryptionOptions, ProposalBundle, ProposalInfo, ProposalSource,
};
use mls_rs::{ExtensionList, MlsRules};
use mls_rs_codec::{MlsDecode, MlsEncode, MlsSize};
use mls_rs_core::crypto::HpkePublicKey;
use mls_rs_core::extension::{ExtensionType, MlsCodecExtension};
use mls_rs_core::group::GroupContext;

use crate::identity::member_id_of;

/// The group context extension holding a channel's roles (private-use range of the
/// IANA MLS Extension Types registry).
pub const ROLES_EXTENSION: u16 = 0xF5A0;

/// Who holds authority in a channel. Members are named by member id (`account(16) ||
/// identity`), as the identity provider names them.
#[derive(Clone, Debug, PartialEq, Eq, MlsSize, MlsEncode, MlsDecode)]
pub struct RolesExt {
    #[mls_codec(with = "mls_rs_codec::byte_vec")]
    pub owner: Vec<u8>,
    pub admins: Vec<MemberId>,
    /// Whether plain members may create invites (the relay and API enforce it).
    pub members_invite: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, MlsSize, MlsEncode, MlsDecode)]
pub struct MemberId(#[mls_codec(with = "mls_rs_codec::byte_vec")] pub Vec<u8>);

impl MlsCodecExtension for RolesExt {
    fn extension_type() -> ExtensionType {
        ExtensionType::new(ROLES_EXTENSION)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Owner,
    Admin,
    Member,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Admin => "admin",
            Role::Member => "member",
        }
    }
}

impl RolesExt {
    pub fn new(owner: Vec<u8>) -> Self {
        RolesExt {
            owner,
            admins: Vec::new(),
            members_invite: false,
        }
    }

    pub fn role(&self, member: &[u8]) -> Role {
        if self.owner == member {
            Role::Owner
        } else if self.admins.iter().any(|a| a.0 == member) {
            Role::Admin
        } else {
            Role::Member
        }
    }

    pub fn is_admin(&self, member: &[u8]) -> bool {
        self.role(member) != Role::Member
    }

    /// The roles after giving `member` `role`. Handing over ownership makes the old owner
    /// an admin.
    pub fn with_role(&self, member: &[u8], role: Role) -> RolesExt {
        let mut next = self.clone();
        next.admins.retain(|a| a.0 != member);
        match role {
            Role::Owner => {
                if next.owner != member {
                    next.admins
                        .push(MemberId(std::mem::replace(&mut next.owner, member.to_vec())));
                }
            }
            Role::Admin => next.admins.push(MemberId(member.to_vec())),
            Role::Member => {}
        }
        next.admins.sort();
        next.admins.dedup();
        next
    }

    pub fn from_extensions(extensions: &ExtensionList) -> Option<RolesExt> {
        extensions.get_as::<RolesExt>().ok().flatten()
    }

    fn names(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.owner.as_slice()).chain(self.admins.iter().map(|a| a.0.as_slice()))
    }
}

/// The group context extensions a group is created with: the roles, and the requirement
/// that every member's leaf supports them.
pub fn initial_extensions(owner: Vec<u8>) -> ExtensionList {
    let mut list = ExtensionList::new();
    list.set_from(RolesExt::new(owner)).expect("roles encode");
    list.set_from(mls_rs::extension::built_in::RequiredCapabilitiesExt {
        extensions: vec![ExtensionType::new(ROLES_EXTENSION)],
        proposals: Vec::new(),
        credentials: vec![mls_rs_core::identity::CredentialType::new(
            crate::credential::SVC_CREDENTIAL_TYPE,
        )],
    })
    .expect("capabilities encode");
    list
}

/// The extension list `current` with its roles replaced by `roles`.
pub fn with_roles(current: &ExtensionList, roles: RolesExt) -> ExtensionList {
    let mut list = current.clone();
    list.set_from(roles).expect("roles encode");
    list
}

/// Why a commit or proposal breaks the channel's policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy: {0}")]
pub struct PolicyError(pub String);

impl IntoAnyError for PolicyError {
    fn into_dyn_error(self) -> Result<Box<dyn std::error::Error + Send + Sync>, Self> {
        Ok(Box::new(self))
    }
}

fn deny<T>(why: impl Into<String>) -> Result<T, PolicyError> {
    Err(PolicyError(why.into()))
}

/// svc's [`MlsRules`]: handshakes in the clear (so the relay can validate them), the
/// ratchet tree in Welcomes, one Welcome per commit, and the roles policy.
#[derive(Clone, Copy, Debug, Default)]
pub struct SvcRules;

impl MlsRules for SvcRules {
    type Error = PolicyError;

    fn filter_proposals(
        &self,
        direction: CommitDirection,
        source: CommitSource,
        roster: &Roster,
        context: &GroupContext,
        proposals: ProposalBundle,
    ) -> Result<ProposalBundle, PolicyError> {
        check(direction, source, roster, &context.extensions, proposals)
    }

    fn commit_options(&self, _: &Roster, _: &GroupContext, _: &ProposalBundle) -> Result<CommitOptions, PolicyError> {
        Ok(CommitOptions::new()
            .with_ratchet_tree_extension(true)
            .with_single_welcome_message(true))
    }

    fn encryption_options(&self, _: &Roster, _: &GroupContext) -> Result<EncryptionOptions, PolicyError> {
        // Commits and proposals as PublicMessages: the relay validates every handshake
        // before it orders it. Application messages are always PrivateMessages.
        Ok(EncryptionOptions::new(false, Default::default()))
    }
}

struct Checker<'a> {
    roster: &'a Roster<'a>,
    roles: RolesExt,
    committer: Vec<u8>,
    committer_index: u32,
}

impl Checker<'_> {
    fn member(&self, index: u32) -> Result<Vec<u8>, PolicyError> {
        match self.roster.member_with_index(index) {
            Ok(m) => Ok(member_id_of(&m.signing_identity.credential)),
            Err(_) => deny(format!("no member at leaf {index}")),
        }
    }

    fn proposer(&self, sender: &Sender) -> Result<Vec<u8>, PolicyError> {
        match sender {
            Sender::Member(index) => self.member(*index),
            _ => deny("proposals come only from members"),
        }
    }

    /// The proposer needs to be an admin for `what` (the committer is one: [`check`]).
    fn admin_only<T>(&self, p: &ProposalInfo<T>, what: &str) -> Result<(), PolicyError> {
        let proposer = self.proposer(&p.sender)?;
        if !self.roles.is_admin(&proposer) {
            return deny(format!("only the owner and admins {what}"));
        }
        Ok(())
    }
}

fn check(
    direction: CommitDirection,
    source: CommitSource,
    roster: &Roster,
    extensions: &ExtensionList,
    mut proposals: ProposalBundle,
) -> Result<ProposalBundle, PolicyError> {
    let CommitSource::ExistingMember(committer) = source else {
        return deny("only members commit (no external joins)");
    };
    let Some(roles) = RolesExt::from_extensions(extensions) else {
        return deny("the group has no svc roles extension");
    };
    let checker = Checker {
        roster,
        roles,
        committer: member_id_of(&committer.signing_identity.credential),
        committer_index: committer.index,
    };
    if !checker.roles.is_admin(&checker.committer) {
        return deny("only the owner and admins commit; a member proposes its key updates and its leaving");
    }
    // Building a commit, an invalid by-reference proposal is left out rather than
    // blocking every commit; receiving, anything invalid refuses the commit.
    let lenient = matches!(direction, CommitDirection::Send);
    proposals.retain_by_type::<mls_rs::group::proposal::AddProposal, _, _>(|p| {
        keep(lenient, p, checker.admin_only(p, "add members"))
    })?;
    proposals.retain_by_type::<mls_rs::group::proposal::RemoveProposal, _, _>(|p| {
        keep(lenient, p, check_remove(&checker, p))
    })?;
    proposals
        .retain_by_type::<ExtensionList, _, _>(|p| keep(lenient, p, check_roles_change(&checker, extensions, p)))?;
    // Updates are by reference, so a member's update waits in every cache while the
    // admins' commits go on: each must stay out of a commit it would spoil.
    let removed: Vec<u32> = proposals
        .remove_proposals()
        .iter()
        .map(|p| p.proposal.to_remove())
        .collect();
    let added_keys: Vec<Vec<u8>> = proposals
        .add_proposals()
        .iter()
        .map(|p| key_package_leaf_key(p.proposal.key_package()))
        .collect::<Result<_, _>>()?;
    let mut updates = 0;
    proposals.retain_by_type::<UpdateProposal, _, _>(|p| {
        let verdict = check_update(&removed, &added_keys, &p.sender, &p.proposal).and_then(|()| {
            // mls-rs applies a commit's updates together and, when one fails (a leaf key
            // that duplicates another's, which two members can arrange between their
            // updates), cannot undo the others in the committer's tree: its commit and
            // state then disagree with everyone's. One update per commit always undoes.
            updates += 1;
            if updates > 1 {
                deny("a commit carries one member's key update; the others wait for the next")
            } else {
                Ok(())
            }
        });
        keep(lenient, p, verdict)
    })?;
    if proposals.psk_proposals().len()
        + proposals.reinit_proposals().len()
        + proposals.external_init_proposals().len()
        + proposals.custom_proposals().len()
        > 0
    {
        return deny("pre-shared keys, re-initialisation, external init and custom proposals are not allowed");
    }
    drop_departed_roles(&checker, extensions, &mut proposals)?;
    Ok(proposals)
}

/// Whether a commit may carry `sender`'s `update`, given the leaves it removes and the
/// leaf keys of the key packages it adds. RFC 9420 (12.2) forbids a commit to update a
/// leaf it removes, and mls-rs leaves such an update in a commit it builds when another
/// member's update applies too; and an update whose leaf key is a joiner's would make
/// the add fail. Either way the update is the one left out (its member proposes again
/// in the next epoch).
pub fn check_update(
    removed: &[u32],
    added_keys: &[Vec<u8>],
    sender: &Sender,
    update: &UpdateProposal,
) -> Result<(), PolicyError> {
    if matches!(sender, Sender::Member(index) if removed.contains(index)) {
        return deny("a commit does not update a leaf it removes");
    }
    if added_keys.contains(&update_leaf_key(update)?) {
        return deny("an update's leaf key is a joiner's");
    }
    Ok(())
}

fn malformed(e: mls_rs_codec::Error) -> PolicyError {
    PolicyError(format!("cannot read a leaf node: {e}"))
}

/// The encryption key of an update proposal's new leaf: the first field of the leaf node
/// it carries (mls-rs keeps the leaf node itself private).
pub fn update_leaf_key(update: &UpdateProposal) -> Result<Vec<u8>, PolicyError> {
    let encoded = update.mls_encode_to_vec().map_err(malformed)?;
    let key = HpkePublicKey::mls_decode(&mut encoded.as_slice()).map_err(malformed)?;
    Ok(key.as_ref().to_vec())
}

/// The encryption key of a key package's leaf: after its version, cipher suite and init
/// key, the first field of its leaf node (private in mls-rs, like an update's).
pub fn key_package_leaf_key(kp: &mls_rs::KeyPackage) -> Result<Vec<u8>, PolicyError> {
    let encoded = kp.mls_encode_to_vec().map_err(malformed)?;
    let mut rest = encoded.as_slice();
    u16::mls_decode(&mut rest).map_err(malformed)?; // version
    u16::mls_decode(&mut rest).map_err(malformed)?; // cipher suite
    HpkePublicKey::mls_decode(&mut rest).map_err(malformed)?; // init key
    let key = HpkePublicKey::mls_decode(&mut rest).map_err(malformed)?;
    Ok(key.as_ref().to_vec())
}

fn keep<T>(lenient: bool, p: &ProposalInfo<T>, verdict: Result<(), PolicyError>) -> Result<bool, PolicyError> {
    match verdict {
        Ok(()) => Ok(true),
        Err(_) if lenient && p.is_by_reference() => Ok(false),
        Err(e) => Err(e),
    }
}

fn check_remove(c: &Checker, p: &ProposalInfo<mls_rs::group::proposal::RemoveProposal>) -> Result<(), PolicyError> {
    let target_index = p.proposal.to_remove();
    let target = c.member(target_index)?;
    if c.roles.role(&target) == Role::Owner {
        return deny("the owner cannot be removed, nor leave; hand ownership over first");
    }
    if target_index == c.committer_index {
        // An admin's own leave proposal waits in its cache like anyone's; mls-rs drops it
        // from the admin's commits, but only after these rules took the departing role
        // away in a change no other member would see.
        return deny("a committer does not remove itself; another admin commits its leave");
    }
    if p.sender == Sender::Member(target_index) {
        return Ok(()); // leaving: a member's own remove proposal, which an admin commits
    }
    c.admin_only(p, "remove other members")
}

fn check_roles_change(
    c: &Checker,
    current: &ExtensionList,
    p: &ProposalInfo<ExtensionList>,
) -> Result<(), PolicyError> {
    c.admin_only(p, "change roles or the channel policy")?;
    let Some(next) = RolesExt::from_extensions(&p.proposal) else {
        return deny("a group context change must keep the roles extension");
    };
    let mut rest = p.proposal.clone();
    rest.remove(ExtensionType::new(ROLES_EXTENSION));
    let mut before = current.clone();
    before.remove(ExtensionType::new(ROLES_EXTENSION));
    if rest != before {
        return deny("only the roles extension of the group context may change");
    }
    if next.owner != c.roles.owner && c.roles.owner != c.committer {
        return deny("only the owner hands ownership over");
    }
    Ok(())
}

/// Every role must name a member after the commit. Roles of members this commit removes
/// go with them: when the commit carries no roles change, the rules add one (a local
/// proposal, which every side derives the same way); an explicit change must drop them.
fn drop_departed_roles(
    c: &Checker,
    current: &ExtensionList,
    proposals: &mut ProposalBundle,
) -> Result<(), PolicyError> {
    let mut after: Vec<Vec<u8>> = c
        .roster
        .members_iter()
        .map(|m| member_id_of(&m.signing_identity.credential))
        .collect();
    let removed: Vec<Vec<u8>> = proposals
        .remove_proposals()
        .iter()
        .map(|p| c.member(p.proposal.to_remove()))
        .collect::<Result<_, _>>()?;
    after.retain(|m| !removed.contains(m));
    for p in proposals.add_proposals() {
        after.push(member_id_of(&p.proposal.signing_identity().credential));
    }
    let explicit = proposals
        .group_context_ext_proposals()
        .first()
        .map(|p| p.proposal.clone());
    let roles = match &explicit {
        Some(list) => RolesExt::from_extensions(list).expect("checked above"),
        None => c.roles.clone(),
    };
    if !after.contains(&roles.owner) {
        return deny("the owner must be a member");
    }
    let departed: Vec<&[u8]> = roles.names().filter(|n| !after.iter().any(|m| m == n)).collect();
    if departed.is_empty() {
        return Ok(());
    }
    if explicit.is_some() {
        return deny("a roles change names agents that are not members");
    }
    let mut next = roles.clone();
    next.admins.retain(|a| after.contains(&a.0));
    proposals.add(
        Proposal::GroupContextExtensions(with_roles(current, next)),
        Sender::Member(c.committer_index),
        ProposalSource::Local,
    );
    Ok(())
}
