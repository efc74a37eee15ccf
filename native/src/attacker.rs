//! A member whose client does not enforce svc's policy: it builds the commits an honest
//! engine refuses (remove the owner, promote itself, add a member as a plain member), so
//! the test suite can check that a running relay and the other members refuse them.
//!
//! A plain member's commit of its own key update is among them: the policy keeps
//! commits to the owner and admins.
//!
//! Only in builds with the `attacker` feature (the `rogue_commit` example the tests run);
//! the extension that ships does not have it. It gives an attacker nothing new: any member
//! can build mls-rs with permissive rules and sign such commits with its own key.

use mls_rs::client_builder::ClientBuilder;
use mls_rs::mls_rules::{CommitOptions, DefaultMlsRules, EncryptionOptions};
use mls_rs::MlsMessage;

use crate::engine::{Crypto, Engine};
use crate::error::{EngineError, Result};
use crate::identity::member_id_of;
use crate::policy::{with_roles, Role, RolesExt, ROLES_EXTENSION};
use crate::storage;

/// What the rogue commit does.
pub enum Attack {
    /// Removes the channel's owner.
    RemoveOwner,
    /// Makes the committer the owner.
    PromoteSelf,
    /// Adds the member of this key package.
    Add(Vec<u8>),
    /// Updates its own keys: an empty commit with an update path, which only the owner
    /// and admins may make.
    Update,
}

impl Engine {
    /// A commit for `attack` in `group_id`'s current epoch, signed with this agent's key
    /// and built without svc's policy. Nothing is stored: the group stays as it was.
    pub fn rogue_commit(&self, group_id: &[u8], attack: Attack) -> Result<Vec<u8>> {
        let agent = &self.agent;
        let rules = DefaultMlsRules::new()
            .with_encryption_options(EncryptionOptions::new(false, Default::default()))
            .with_commit_options(
                CommitOptions::new()
                    .with_ratchet_tree_extension(true)
                    .with_single_welcome_message(true),
            );
        let client = ClientBuilder::new_sqlite(storage::storage_engine(&self.db, self.state_key.as_ref()))
            .map_err(|e| EngineError::Storage(e.to_string()))?
            .extension_type(mls_rs_core::extension::ExtensionType::new(ROLES_EXTENSION))
            .mls_rules(rules)
            .crypto_provider(Crypto::default())
            .identity_provider(agent.provider.clone())
            .signing_identity(agent.usable()?, agent.secret_key.clone(), self.cipher_suite)
            .build();
        let mut group = client
            .load_group(group_id)
            .map_err(|e| EngineError::mls("group load", e))?;
        let roles = RolesExt::from_extensions(&group.context().extensions).ok_or(EngineError::Mls {
            op: "rogue commit",
            detail: "the group has no roles extension".into(),
        })?;
        let no_owner = || EngineError::Mls {
            op: "rogue commit",
            detail: "the group has no owner".into(),
        };
        let owner = group
            .roster()
            .members_iter()
            .find(|m| roles.role(&member_id_of(&m.signing_identity.credential)) == Role::Owner)
            .ok_or_else(no_owner)?
            .index;
        let me = group
            .current_member_signing_identity()
            .map_err(|e| EngineError::mls("rogue commit", e))?;
        let promoted = with_roles(&group.context().extensions, RolesExt::new(member_id_of(&me.credential)));
        let builder = group.commit_builder();
        let builder = match attack {
            Attack::Update => Ok(builder),
            Attack::RemoveOwner => builder.remove_member(owner),
            Attack::PromoteSelf => builder.set_group_context_ext(promoted),
            Attack::Add(key_package) => {
                let kp = MlsMessage::from_bytes(&key_package).map_err(|e| EngineError::mls("key package", e))?;
                builder.add_member(kp)
            }
        }
        .map_err(|e| EngineError::mls("rogue commit", e))?;
        let out = builder.build().map_err(|e| EngineError::mls("rogue commit", e))?;
        out.commit_message
            .to_bytes()
            .map_err(|e| EngineError::mls("rogue commit encoding", e))
    }
}
