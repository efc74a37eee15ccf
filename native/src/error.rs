//! Engine errors. Every failure crosses into Python as `MlsError`, a RuntimeError whose
//! message starts with `MLS engine error: ` (docs/client.md, Errors); the text here is what follows.

use mls_rs::error::MlsError as RsError;

use crate::policy::PolicyError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot use data_dir {path}: {detail}")]
    DataDir { path: String, detail: String },

    #[error("data_dir {path} is in use by another process{}; one process per data_dir: stop that one, or give this agent another data_dir", holder_text(.holder))]
    DataDirInUse { path: String, holder: String },

    #[error("storage failure: {0}")]
    Storage(String),

    #[error("bad state key: {0}")]
    StateKey(String),

    #[error("data_dir belongs to identity {stored:?}, not {requested:?}; use one data_dir per agent")]
    IdentityMismatch { stored: String, requested: String },

    #[error("identity must be 1 to {max} bytes, got {len}")]
    BadIdentity { len: usize, max: usize },

    #[error("unsupported cipher suite {0}; supported: 1 (X25519/Ed25519) and 2 (P-256)")]
    UnsupportedCipherSuite(u16),

    #[error("cipher suite {got} is not one a channel of this agent can use; supported: {}", crate::engine::suite_list(.supported))]
    ChannelCipherSuite { got: i64, supported: Vec<u16> },

    #[error("data_dir was created with cipher suite {stored}, not {requested}")]
    CipherSuiteMismatch { stored: u16, requested: u16 },

    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },

    #[error("expected {expected}, got {got}")]
    WrongKind { expected: &'static str, got: String },

    #[error("bad key package: it uses cipher suite {got}, the group uses {want}")]
    KeyPackageSuite { got: u16, want: u16 },

    #[error("bad key package: {0:?} is already a member")]
    AlreadyMember(String),

    #[error("invalid Welcome: it is not addressed to any key package of this agent (already used, or made for someone else)")]
    WelcomeNotForUs,

    #[error("message belongs to group {got}, not {want}")]
    WrongGroup { got: String, want: String },

    #[error("wrong epoch: message is for epoch {message}, group is at epoch {group}")]
    WrongEpoch { message: u64, group: u64 },

    #[error("group {0} not found in this data_dir")]
    GroupNotFound(String),

    #[error("group {0} already exists in this data_dir")]
    GroupExists(String),

    #[error("{0:?} is not a member of this group")]
    NotAMember(String),

    #[error("a commit is already pending in epoch {0}; apply it once the relay accepted it, or clear it")]
    CommitPending(u64),

    #[error("no commit is pending")]
    NoPendingCommit,

    #[error("this agent was removed from the group")]
    Removed,

    #[error("the engine is closed: its data_dir may be in use by another engine")]
    Closed,

    #[error("{op}: {detail}")]
    Mls { op: &'static str, detail: String },

    /// The commit or proposal breaks the channel's policy (roles): Python's `PolicyError`.
    #[error("{op}: {policy}")]
    Policy { op: &'static str, policy: PolicyError },

    #[error("agent credential was issued by unknown key {kid:?}; trusted keys: {}", list_or_none(.trusted))]
    UnknownIssuer { kid: String, trusted: Vec<String> },

    #[error("agent credential signature check failed: not signed by issuer key {kid:?}, or altered")]
    CredentialSignature { kid: String },

    #[error(
        "agent credential certifies signature key {certified}, not the presented key {presented} (key substitution)"
    )]
    CredentialKeyMismatch { certified: String, presented: String },

    #[error("agent credential expired at {} (not_after {not_after}); now is {} ({now})", utc(*.not_after), utc(*.now))]
    CredentialExpired { not_after: u64, now: u64 },

    #[error("agent credential is not valid before {} (not_before {not_before}); now is {} ({now})", utc(*.not_before), utc(*.now))]
    CredentialNotYetValid { not_before: u64, now: u64 },

    #[error("expected an svc agent credential (credential type 0xf5c1), got credential type {got:#06x}{}", credential_type_name(*.got))]
    WrongCredentialType { got: u16 },

    #[error("credential request proof check failed: not signed by the signature key it names, or altered")]
    CredentialRequestSignature,

    #[error("this agent has no agent credential yet; SvcClient installs one from the account API (Engine.install_credential)")]
    NoCredential,

    #[error("no trust anchors: set the account API's credential keys first (Engine.set_trust_anchors)")]
    NoTrustAnchors,

    #[error("this agent's own credential cannot be used: {0}; renew it from the account API")]
    OwnCredential(Box<EngineError>),

    #[error("agent credential is for {what} {got:?}, not this agent's {want:?}")]
    NotOurCredential {
        what: &'static str,
        got: String,
        want: String,
    },
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ")
    }
}

fn credential_type_name(t: u16) -> &'static str {
    match t {
        1 => " (basic)",
        2 => " (x509)",
        _ => "",
    }
}

/// Unix seconds as an RFC 3339 UTC time, e.g. `2023-11-14T22:13:20Z`.
pub(crate) fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

fn holder_text(holder: &str) -> String {
    if holder.is_empty() {
        String::new()
    } else {
        format!(" (pid {holder})")
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;

impl EngineError {
    /// A local write or read of data_dir failed (disk full, I/O error, read-only file
    /// system): not an MLS failure, and nothing was changed.
    pub fn is_storage(&self) -> bool {
        matches!(
            self,
            EngineError::Storage(_)
                | EngineError::Mls {
                    op: "group storage",
                    ..
                }
        )
    }

    /// Wraps an mls-rs error with the operation that failed and a plain description.
    pub fn mls(op: &'static str, err: RsError) -> Self {
        // The store refusing because the engine was closed meanwhile stays `Closed`.
        if let RsError::KeyPackageRepoError(inner) | RsError::GroupStorageError(inner) = &err {
            if matches!(
                inner.inner_dyn_error().downcast_ref::<EngineError>(),
                Some(EngineError::Closed)
            ) {
                return EngineError::Closed;
            }
        }
        if let RsError::MlsRulesError(inner) = &err {
            if let Some(policy) = inner.inner_dyn_error().downcast_ref::<PolicyError>() {
                return EngineError::Policy {
                    op,
                    policy: policy.clone(),
                };
            }
        }
        let detail = match &err {
            RsError::CantProcessMessageFromSelf => "message was sent by this agent itself".into(),
            RsError::InvalidSignature => "signature check failed (forged or corrupted message)".into(),
            RsError::InvalidMembershipTag => "membership tag check failed (not from a member)".into(),
            RsError::KeyMissing(generation) => {
                format!("decryption failure: no key for generation {generation} (replayed or too old)")
            }
            RsError::InvalidEpoch => "message is for an epoch this agent has no secrets for".into(),
            RsError::EpochNotFound => "message is for an epoch this agent has no secrets for".into(),
            RsError::CryptoProviderError(_) => format!("decryption failure ({err})"),
            RsError::GroupNotFound => "group not found".into(),
            RsError::WelcomeKeyPackageNotFound => {
                "invalid Welcome: no matching key package secret (already used, or made for someone else)".into()
            }
            RsError::CommitRequired => "a proposal was received; a commit is required before sending".into(),
            _ => err.to_string(),
        };
        EngineError::Mls { op, detail }
    }
}

impl From<rusqlite::Error> for EngineError {
    fn from(e: rusqlite::Error) -> Self {
        EngineError::Storage(e.to_string())
    }
}

/// The group store (`group_store.rs`) hands these to mls-rs, which wraps them.
impl mls_rs_core::error::IntoAnyError for EngineError {
    fn into_dyn_error(self) -> std::result::Result<Box<dyn std::error::Error + Send + Sync>, Self> {
        Ok(Box::new(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mls_rs_core::error::IntoAnyError;

    #[test]
    fn a_store_closed_under_mls_rs_stays_closed() {
        let closed = |e: EngineError| RsError::KeyPackageRepoError(e.into_any_error());
        assert!(matches!(
            EngineError::mls("op", closed(EngineError::Closed)),
            EngineError::Closed
        ));
        let storage = RsError::GroupStorageError(EngineError::Closed.into_any_error());
        assert!(matches!(EngineError::mls("op", storage), EngineError::Closed));
        let other = closed(EngineError::Storage("disk full".into()));
        assert!(matches!(EngineError::mls("op", other), EngineError::Mls { .. }));
    }
}
