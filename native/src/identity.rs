//! [`SvcIdentityProvider`]: the mls-rs identity provider for agent credentials.
//!
//! Every leaf and key package of an svc group carries an [`AgentCredential`] as
//! `Credential::Custom` of type [`SVC_CREDENTIAL_TYPE`]. mls-rs asks this provider:
//!
//! - whether a member is valid ([`validate_member`](IdentityProvider::validate_member)):
//!   a known issuer signed it, it certifies the key the leaf signs with, and, when mls-rs
//!   passes a time, it is valid at that time;
//! - who a member is ([`identity`](IdentityProvider::identity)): `account || identity`,
//!   so agents of two accounts that chose the same identity are distinct members;
//! - whether a leaf may replace another ([`valid_successor`](IdentityProvider::valid_successor)):
//!   only a credential for the same account and identity (a renewal, or the same one).
//!
//! # Time
//!
//! mls-rs passes a time only where it knows one: a committer checks the key packages it
//! adds at the commit time (`commit_builder().commit_time(..)`, else now). Receivers of a
//! commit (`process_incoming_message`) and joiners (`join_group(.., None)`) pass `None`,
//! and then the validity period is deliberately not checked: a member whose credential
//! expired while it was offline must not make the group impossible to join.
//!
//! mls-rs does not ask the provider about the sender's own leaf except when creating a
//! group: neither key package generation nor a commit (even one that sets a new signing
//! identity) validates it, so a bad credential surfaces only when others refuse it. The
//! engine has to check its own credential before publishing or committing it.

use std::error::Error as StdError;
use std::sync::{Arc, Mutex, RwLock};

use mls_rs_core::error::IntoAnyError;
use mls_rs_core::extension::ExtensionList;
use mls_rs_core::identity::{Credential, CredentialType, IdentityProvider, MemberValidationContext, SigningIdentity};
use mls_rs_core::time::MlsTime;

use mls_rs_core::crypto::SignaturePublicKey;

use crate::credential::{
    check_unsigned, verify_mls_credential, verify_signatures, AgentCredential, TrustAnchors, SVC_CREDENTIAL_TYPE,
};
use crate::error::EngineError;

/// The issuer-signature checks a join's tree validation puts off (see
/// [`SvcIdentityProvider::joining`]).
type Deferred = Vec<(AgentCredential, SignaturePublicKey)>;

fn defer(
    list: &mut Deferred,
    signing_identity: &SigningIdentity,
    anchors: &TrustAnchors,
    timestamp: Option<MlsTime>,
) -> Result<(), SvcIdentityError> {
    let data = match &signing_identity.credential {
        Credential::Custom(custom) if custom.credential_type.raw_value() == SVC_CREDENTIAL_TYPE => &custom.data,
        other => {
            return Err(EngineError::WrongCredentialType {
                got: other.credential_type().raw_value(),
            }
            .into())
        }
    };
    let checked = check_unsigned(
        data,
        anchors,
        Some(signing_identity.signature_key.as_bytes()),
        timestamp.map(|t| t.seconds_since_epoch()),
    )?;
    list.push(checked);
    Ok(())
}

/// Why [`SvcIdentityProvider`] refused a member. mls-rs wraps it in
/// `MlsError::IdentityProviderError`; its text is the specific reason ("expired",
/// "unknown key", "key substitution", ...), and
/// `AnyError::inner_dyn_error().downcast_ref::<SvcIdentityError>()` recovers it.
#[derive(Debug, thiserror::Error)]
pub enum SvcIdentityError {
    /// The credential failed decoding or verification.
    #[error(transparent)]
    Credential(#[from] EngineError),
    /// svc groups have no external senders.
    #[error("external senders are not supported in svc groups")]
    ExternalSender,
}

impl SvcIdentityError {
    /// The credential error, if that is what this is.
    pub fn engine_error(&self) -> Option<&EngineError> {
        match self {
            Self::Credential(e) => Some(e),
            Self::ExternalSender => None,
        }
    }
}

impl IntoAnyError for SvcIdentityError {
    fn into_dyn_error(self) -> Result<Box<dyn StdError + Send + Sync>, Self> {
        Ok(Box::new(self))
    }
}

/// Validates agent credentials against the account API's issuer keys. Clones share the
/// anchors, so replacing them (after the API rotated its key) reaches every group at once.
#[derive(Clone, Debug)]
pub struct SvcIdentityProvider {
    anchors: Arc<RwLock<TrustAnchors>>,
    // While a join runs: the signature checks its tree validation put off.
    join: Arc<Mutex<Option<Deferred>>>,
    // Held for a whole `joining` call: one join at a time defers, so no validation can
    // land in another join's list.
    joins: Arc<Mutex<()>>,
}

impl SvcIdentityProvider {
    pub fn new(anchors: TrustAnchors) -> Self {
        Self {
            anchors: Arc::new(RwLock::new(anchors)),
            join: Arc::default(),
            joins: Arc::default(),
        }
    }

    /// Runs `join` (a join from a Welcome by a client using this provider) with the
    /// issuer-signature checks of its tree validation collected instead of done, then
    /// checks them all at once ([`verify_signatures`]: Ed25519 batch verification across
    /// the cores, about three times the rate of one by one as mls-rs meets each leaf).
    /// Every other check runs as usual, inside `join`, and so do the signature checks of
    /// every other kind of validation.
    ///
    /// The caller must discard what `join` produced if the second result is an error, and
    /// must not create a group with this provider meanwhile (the engine holds its group
    /// table's lock across both): tree validation does not say which group it is for
    /// until the Welcome is decrypted. Joins through one provider run one at a time.
    pub fn joining<T>(&self, join: impl FnOnce() -> T) -> (T, Result<(), SvcIdentityError>) {
        /// Clears the slot even if `join` panics: a collector left behind would let later
        /// validations skip their signature checks.
        struct Slot<'a>(&'a SvcIdentityProvider);
        impl Drop for Slot<'_> {
            fn drop(&mut self) {
                self.0.lock_join().take();
            }
        }
        let _one_at_a_time = self.joins.lock().unwrap_or_else(|p| p.into_inner());
        *self.lock_join() = Some(Vec::new());
        let guard = Slot(self);
        let out = join();
        let collected = self.lock_join().take().unwrap_or_default();
        drop(guard);
        (out, verify_signatures(&collected).map_err(SvcIdentityError::from))
    }

    fn lock_join(&self) -> std::sync::MutexGuard<'_, Option<Deferred>> {
        self.join.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn anchors(&self) -> TrustAnchors {
        self.anchors.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_anchors(&self, anchors: TrustAnchors) {
        *self.anchors.write().unwrap_or_else(|p| p.into_inner()) = anchors;
    }
}

/// Decodes an agent credential without verifying it (no signature, no validity period):
/// enough to name a member or compare two leaves; [`verify_mls_credential`] is what
/// authenticates one, and mls-rs runs `validate_member` on every leaf before trusting it.
pub(crate) fn decode(credential: &Credential) -> Result<AgentCredential, EngineError> {
    match credential {
        Credential::Custom(custom) if custom.credential_type.raw_value() == SVC_CREDENTIAL_TYPE => {
            AgentCredential::from_bytes(&custom.data)
        }
        other => Err(EngineError::WrongCredentialType {
            got: other.credential_type().raw_value(),
        }),
    }
}

/// `account || identity`: the account is a fixed 16 bytes, so this is unambiguous.
pub(crate) fn member_id(cred: &AgentCredential) -> Vec<u8> {
    [cred.content.account.as_slice(), cred.content.identity.as_slice()].concat()
}

/// The member id of a leaf mls-rs has already validated; empty if it is not an agent
/// credential (which the provider never admits).
pub fn member_id_of(credential: &Credential) -> Vec<u8> {
    decode(credential).map(|c| member_id(&c)).unwrap_or_default()
}

impl IdentityProvider for SvcIdentityProvider {
    type Error = SvcIdentityError;

    fn validate_member(
        &self,
        signing_identity: &SigningIdentity,
        timestamp: Option<MlsTime>,
        context: MemberValidationContext<'_>,
    ) -> Result<(), Self::Error> {
        // Only tree validation (join, group creation) has this context.
        if let MemberValidationContext::ForNewGroup { .. } = context {
            if let Some(list) = self.lock_join().as_mut() {
                return defer(list, signing_identity, &self.anchors(), timestamp);
            }
        }
        verify_mls_credential(
            &signing_identity.credential,
            &self.anchors(),
            Some(signing_identity.signature_key.as_bytes()),
            timestamp.map(|t| t.seconds_since_epoch()),
        )?;
        Ok(())
    }

    fn validate_external_sender(
        &self,
        _signing_identity: &SigningIdentity,
        _timestamp: Option<MlsTime>,
        _extensions: Option<&ExtensionList>,
    ) -> Result<(), Self::Error> {
        Err(SvcIdentityError::ExternalSender)
    }

    fn identity(
        &self,
        signing_identity: &SigningIdentity,
        _extensions: &ExtensionList,
    ) -> Result<Vec<u8>, Self::Error> {
        Ok(member_id(&decode(&signing_identity.credential)?))
    }

    fn valid_successor(
        &self,
        predecessor: &SigningIdentity,
        successor: &SigningIdentity,
        _extensions: &ExtensionList,
    ) -> Result<bool, Self::Error> {
        let (Ok(pred), Ok(succ)) = (decode(&predecessor.credential), decode(&successor.credential)) else {
            return Ok(false);
        };
        Ok(pred.content.account == succ.content.account && pred.content.identity == succ.content.identity)
    }

    fn supported_types(&self) -> Vec<CredentialType> {
        vec![CredentialType::new(SVC_CREDENTIAL_TYPE)]
    }
}
