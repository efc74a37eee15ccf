//! Agent credentials: the account API's signed statement that an agent identity of an
//! account owns an MLS signature key, and the proof of possession an agent sends to get one.
//!
//! Wire format (RFC 9420 §2.1 presentation language; `opaque x<V>` is a minimal-length
//! QUIC-style varint length, then the bytes; integers big-endian):
//!
//! ```text
//! struct {
//!     opaque issuer<V>;        // kid of the API key that signed it, ASCII
//!     opaque account<V>;       // the account's UUID, 16 bytes
//!     opaque identity<V>;      // the agent identity, 1..=1024 bytes
//!     uint16 cipher_suite;     // MLS cipher suite of signature_key (1 or 2)
//!     opaque signature_key<V>; // the agent's MLS SignaturePublicKey
//!     uint64 not_before;       // unix seconds
//!     uint64 not_after;        // unix seconds
//! } AgentCredentialContent;
//!
//! struct {
//!     AgentCredentialContent content;
//!     opaque signature<V>;     // Ed25519 by the issuer over CREDENTIAL_LABEL || content
//! } AgentCredential;
//!
//! struct {
//!     opaque account<V>;
//!     opaque identity<V>;
//!     uint16 cipher_suite;
//!     opaque signature_key<V>;
//!     uint64 issued_at;        // unix seconds
//! } CredentialRequestContent;  // proof: the agent's MLS key over REQUEST_LABEL || content
//! ```
//!
//! In a group the credential travels as `Credential::Custom` with type
//! [`SVC_CREDENTIAL_TYPE`] whose data is the encoded [`AgentCredential`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use mls_rs::{CipherSuite, CipherSuiteProvider, CryptoProvider};
use mls_rs_codec::{MlsDecode, MlsEncode, MlsSize};
use mls_rs_core::crypto::SignaturePublicKey;
use mls_rs_core::identity::{Credential, CredentialType, CustomCredential};

use crate::engine::{Crypto, MAX_IDENTITY_LEN};
// Not `Result`: the codec derives expand to code that names `Result` unqualified.
use crate::error::{EngineError, Result as EngineResult};

/// The MLS credential type of an agent credential (RFC 9420 private-use range).
pub const SVC_CREDENTIAL_TYPE: u16 = 0xF5C1;
/// Prefix of the data the issuer signs: `CREDENTIAL_LABEL || encode(content)`.
pub const CREDENTIAL_LABEL: &[u8] = b"svc agent credential v1\x00";
/// Prefix of the data the agent signs: `REQUEST_LABEL || encode(request content)`.
pub const REQUEST_LABEL: &[u8] = b"svc credential request v1\x00";
/// An account id is a UUID.
pub const ACCOUNT_ID_LEN: usize = 16;
/// Clock skew tolerated on `not_before`: an agent whose clock runs behind the issuer's
/// can use a credential issued a moment ago.
pub const CLOCK_SKEW_SECS: u64 = 300;

const ED25519_KEY_LEN: usize = 32;
const P256_UNCOMPRESSED_LEN: usize = 65;
/// The issuer's signature scheme: Ed25519, which is suite 1's.
const ISSUER_SUITE: CipherSuite = CipherSuite::CURVE25519_AES128;

/// What the issuer signs.
#[derive(Clone, Debug, PartialEq, Eq, MlsSize, MlsEncode, MlsDecode)]
pub struct AgentCredentialContent {
    #[mls_codec(with = "mls_rs_codec::byte_vec")]
    pub issuer: Vec<u8>,
    #[mls_codec(with = "mls_rs_codec::byte_vec")]
    pub account: Vec<u8>,
    #[mls_codec(with = "mls_rs_codec::byte_vec")]
    pub identity: Vec<u8>,
    pub cipher_suite: u16,
    #[mls_codec(with = "mls_rs_codec::byte_vec")]
    pub signature_key: Vec<u8>,
    pub not_before: u64,
    pub not_after: u64,
}

/// A credential: content and the issuer's Ed25519 signature over
/// `CREDENTIAL_LABEL || encode(content)`.
#[derive(Clone, Debug, PartialEq, Eq, MlsSize, MlsEncode, MlsDecode)]
pub struct AgentCredential {
    pub content: AgentCredentialContent,
    #[mls_codec(with = "mls_rs_codec::byte_vec")]
    pub signature: Vec<u8>,
}

/// What an agent signs with its MLS key to prove it holds the key it asks a credential for.
#[derive(Clone, Debug, PartialEq, Eq, MlsSize, MlsEncode, MlsDecode)]
pub struct CredentialRequestContent {
    #[mls_codec(with = "mls_rs_codec::byte_vec")]
    pub account: Vec<u8>,
    #[mls_codec(with = "mls_rs_codec::byte_vec")]
    pub identity: Vec<u8>,
    pub cipher_suite: u16,
    #[mls_codec(with = "mls_rs_codec::byte_vec")]
    pub signature_key: Vec<u8>,
    pub issued_at: u64,
}

impl AgentCredentialContent {
    /// The encoding the issuer signs (without the label).
    pub fn to_bytes(&self) -> EngineResult<Vec<u8>> {
        encode(self, "agent credential")
    }

    /// `CREDENTIAL_LABEL || encode(self)`: the exact bytes the issuer's signature covers.
    pub fn signed_data(&self) -> EngineResult<Vec<u8>> {
        Ok([CREDENTIAL_LABEL, &self.to_bytes()?].concat())
    }

    fn check(&self) -> EngineResult<()> {
        let bad = |detail: String| EngineError::Malformed {
            what: "agent credential",
            detail,
        };
        if self.issuer.is_empty() || !self.issuer.is_ascii() {
            return Err(bad(format!(
                "issuer must be a non-empty ASCII key id, got {:?}",
                String::from_utf8_lossy(&self.issuer)
            )));
        }
        check_common(
            "agent credential",
            &self.account,
            &self.identity,
            self.cipher_suite,
            &self.signature_key,
        )?;
        if self.not_before > self.not_after {
            return Err(bad(format!(
                "not_before {} is after not_after {}",
                self.not_before, self.not_after
            )));
        }
        Ok(())
    }

    /// The issuer's key id as text (checked ASCII by every decoding path).
    pub fn issuer_kid(&self) -> String {
        String::from_utf8_lossy(&self.issuer).into_owned()
    }
}

impl AgentCredential {
    /// Decodes strictly: the whole input, well-formed fields. No signature check: use
    /// [`verify_credential`] for anything you trust.
    pub fn from_bytes(bytes: &[u8]) -> EngineResult<Self> {
        let cred = AgentCredential::mls_decode_exhaustive(bytes).map_err(|e| EngineError::Malformed {
            what: "agent credential",
            detail: e.to_string(),
        })?;
        cred.content.check()?;
        Ok(cred)
    }

    pub fn to_bytes(&self) -> EngineResult<Vec<u8>> {
        encode(self, "agent credential")
    }

    /// The credential as it travels in an MLS leaf or key package.
    pub fn to_mls_credential(&self) -> EngineResult<Credential> {
        Ok(Credential::Custom(CustomCredential::new(
            CredentialType::new(SVC_CREDENTIAL_TYPE),
            self.to_bytes()?,
        )))
    }
}

impl CredentialRequestContent {
    pub fn to_bytes(&self) -> EngineResult<Vec<u8>> {
        encode(self, "credential request")
    }

    /// `REQUEST_LABEL || encode(self)`: the exact bytes the proof covers.
    pub fn signed_data(&self) -> EngineResult<Vec<u8>> {
        Ok([REQUEST_LABEL, &self.to_bytes()?].concat())
    }

    /// Decodes strictly: the whole input, well-formed fields.
    pub fn from_bytes(bytes: &[u8]) -> EngineResult<Self> {
        let req = CredentialRequestContent::mls_decode_exhaustive(bytes).map_err(|e| EngineError::Malformed {
            what: "credential request",
            detail: e.to_string(),
        })?;
        check_common(
            "credential request",
            &req.account,
            &req.identity,
            req.cipher_suite,
            &req.signature_key,
        )?;
        Ok(req)
    }
}

fn encode<T: MlsEncode>(value: &T, what: &'static str) -> EngineResult<Vec<u8>> {
    value.mls_encode_to_vec().map_err(|e| EngineError::Malformed {
        what,
        detail: e.to_string(),
    })
}

/// The checks a credential and a credential request share.
fn check_common(what: &'static str, account: &[u8], identity: &[u8], suite: u16, key: &[u8]) -> EngineResult<()> {
    let bad = |detail: String| EngineError::Malformed { what, detail };
    if account.len() != ACCOUNT_ID_LEN {
        return Err(bad(format!(
            "account must be a {ACCOUNT_ID_LEN}-byte UUID, got {} bytes",
            account.len()
        )));
    }
    if identity.is_empty() || identity.len() > MAX_IDENTITY_LEN {
        return Err(bad(format!(
            "identity must be 1 to {MAX_IDENTITY_LEN} bytes, got {}",
            identity.len()
        )));
    }
    let key_ok = match suite {
        1 => key.len() == ED25519_KEY_LEN,
        2 => key.len() == P256_UNCOMPRESSED_LEN && key[0] == 0x04,
        _ => {
            return Err(bad(format!(
                "unsupported cipher suite {suite}; supported: 1 (X25519/Ed25519) and 2 (P-256)"
            )))
        }
    };
    if !key_ok {
        let want = if suite == 1 {
            "a 32-byte Ed25519 key"
        } else {
            "a 65-byte uncompressed P-256 point"
        };
        return Err(bad(format!(
            "signature_key for cipher suite {suite} must be {want}, got {} bytes",
            key.len()
        )));
    }
    Ok(())
}

fn suite_provider(suite: u16) -> EngineResult<impl CipherSuiteProvider> {
    Crypto::default()
        .cipher_suite_provider(CipherSuite::from(suite))
        .ok_or(EngineError::UnsupportedCipherSuite(suite))
}

/// The issuer keys credentials are checked against: key id (kid) to Ed25519 public key.
/// Cloning shares one map.
#[derive(Clone, Default)]
pub struct TrustAnchors(Arc<BTreeMap<String, SignaturePublicKey>>);

impl TrustAnchors {
    /// Each key must be a raw 32-byte Ed25519 public key; each kid non-empty ASCII.
    pub fn new<K, V, I>(anchors: I) -> EngineResult<Self>
    where
        K: Into<String>,
        V: Into<Vec<u8>>,
        I: IntoIterator<Item = (K, V)>,
    {
        let mut map = BTreeMap::new();
        for (kid, key) in anchors {
            let kid: String = kid.into();
            let key: Vec<u8> = key.into();
            if kid.is_empty() || !kid.is_ascii() {
                return Err(EngineError::Malformed {
                    what: "trust anchor",
                    detail: format!("key id must be non-empty ASCII, got {kid:?}"),
                });
            }
            if key.len() != ED25519_KEY_LEN {
                return Err(EngineError::Malformed {
                    what: "trust anchor",
                    detail: format!(
                        "key {kid:?} must be a raw {ED25519_KEY_LEN}-byte Ed25519 public key, got {} bytes",
                        key.len()
                    ),
                });
            }
            map.insert(kid, SignaturePublicKey::from(key));
        }
        Ok(Self(Arc::new(map)))
    }

    /// The very same set (a clone of it), not merely equal keys.
    pub fn same(&self, other: &TrustAnchors) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    pub fn get(&self, kid: &str) -> Option<&SignaturePublicKey> {
        self.0.get(kid)
    }

    /// Key ids, sorted.
    pub fn kids(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for TrustAnchors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TrustAnchors").field(&self.kids()).finish()
    }
}

/// Decodes and verifies an encoded [`AgentCredential`] (the data of an MLS custom
/// credential of type [`SVC_CREDENTIAL_TYPE`]).
///
/// Checks, in order: strict decoding, a known issuer, the issuer's signature, that the
/// credential certifies `expected_signature_key` (when given: the key the member actually
/// signs with, so a credential can't be replayed under another key), and validity at `now`
/// (unix seconds) allowing [`CLOCK_SKEW_SECS`] on `not_before`.
///
/// `now: None` skips the validity period on purpose: MLS re-validates every leaf of the
/// tree on join, and a member whose credential expired while it was offline must not make
/// the group impossible to join.
pub fn verify_credential(
    bytes: &[u8],
    anchors: &TrustAnchors,
    expected_signature_key: Option<&[u8]>,
    now: Option<u64>,
) -> EngineResult<AgentCredential> {
    let (cred, issuer_key) = check_unsigned(bytes, anchors, expected_signature_key, now)?;
    check_signature(&cred, &issuer_key)?;
    Ok(cred)
}

/// Every check of [`verify_credential`] but the issuer's signature; returns the issuer key
/// that signature must verify under (see [`verify_signatures`]).
pub fn check_unsigned(
    bytes: &[u8],
    anchors: &TrustAnchors,
    expected_signature_key: Option<&[u8]>,
    now: Option<u64>,
) -> EngineResult<(AgentCredential, SignaturePublicKey)> {
    let cred = AgentCredential::from_bytes(bytes)?;
    let content = &cred.content;
    let kid = content.issuer_kid();
    let issuer_key = anchors.get(&kid).ok_or_else(|| EngineError::UnknownIssuer {
        kid: kid.clone(),
        trusted: anchors.kids(),
    })?;
    if let Some(expected) = expected_signature_key {
        if expected != content.signature_key.as_slice() {
            return Err(EngineError::CredentialKeyMismatch {
                certified: key_fingerprint(&content.signature_key),
                presented: key_fingerprint(expected),
            });
        }
    }
    if let Some(now) = now {
        if content.not_before > now.saturating_add(CLOCK_SKEW_SECS) {
            return Err(EngineError::CredentialNotYetValid {
                not_before: content.not_before,
                now,
            });
        }
        if now > content.not_after {
            return Err(EngineError::CredentialExpired {
                not_after: content.not_after,
                now,
            });
        }
    }
    Ok((cred, issuer_key.clone()))
}

fn check_signature(cred: &AgentCredential, issuer_key: &SignaturePublicKey) -> EngineResult<()> {
    suite_provider(ISSUER_SUITE.into())?
        .verify(issuer_key, &cred.signature, &cred.content.signed_data()?)
        .map_err(|_| EngineError::CredentialSignature {
            kid: cred.content.issuer_kid(),
        })
}

/// Below this many credentials, one-by-one verification is as fast as a batch.
const BATCH_MIN: usize = 8;

/// Verifies the issuer signatures of many credentials that passed [`check_unsigned`],
/// e.g. every leaf of a ratchet tree on join. Ed25519 batch verification (about twice the
/// speed of one-by-one), split across the cores; if a batch fails, its credentials are
/// checked one by one so the error names the bad one.
///
/// A batch accepts what one-by-one verification accepts; it may also accept a malleated
/// copy of a valid signature (a different encoding of the same statement by the same
/// issuer), which binds nothing new.
pub fn verify_signatures(items: &[(AgentCredential, SignaturePublicKey)]) -> EngineResult<()> {
    if items.len() < BATCH_MIN {
        return items.iter().try_for_each(|(c, k)| check_signature(c, k));
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    let chunk = items.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = items
            .chunks(chunk)
            .map(|part| scope.spawn(move || verify_batch(part)))
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join().unwrap_or_else(|_| {
                Err(EngineError::Malformed {
                    what: "agent credential",
                    detail: "signature check panicked".into(),
                })
            })
        })
    })
}

fn verify_batch(items: &[(AgentCredential, SignaturePublicKey)]) -> EngineResult<()> {
    let prepared: Option<Vec<_>> = items
        .iter()
        .map(|(cred, key)| {
            let key = ed25519_dalek::VerifyingKey::try_from(key.as_bytes()).ok()?;
            let sig = ed25519_dalek::Signature::from_slice(&cred.signature).ok()?;
            Some((cred.content.signed_data().ok()?, sig, key))
        })
        .collect();
    if let Some(prepared) = prepared {
        let messages: Vec<&[u8]> = prepared.iter().map(|(m, _, _)| m.as_slice()).collect();
        let signatures: Vec<_> = prepared.iter().map(|(_, s, _)| *s).collect();
        let keys: Vec<_> = prepared.iter().map(|(_, _, k)| *k).collect();
        if ed25519_dalek::verify_batch(&messages, &signatures, &keys).is_ok() {
            return Ok(());
        }
    }
    items.iter().try_for_each(|(c, k)| check_signature(c, k))
}

/// [`verify_credential`] for a credential as it appears in an MLS leaf or key package:
/// anything but a custom credential of type [`SVC_CREDENTIAL_TYPE`] is rejected.
pub fn verify_mls_credential(
    credential: &Credential,
    anchors: &TrustAnchors,
    expected_signature_key: Option<&[u8]>,
    now: Option<u64>,
) -> EngineResult<AgentCredential> {
    match credential {
        Credential::Custom(custom) if custom.credential_type.raw_value() == SVC_CREDENTIAL_TYPE => {
            verify_credential(&custom.data, anchors, expected_signature_key, now)
        }
        other => Err(EngineError::WrongCredentialType {
            got: other.credential_type().raw_value(),
        }),
    }
}

/// Signs a credential request with an MLS signature secret key of `content.cipher_suite`:
/// `sign(REQUEST_LABEL || encode(content))`.
pub(crate) fn sign_request(
    content: &CredentialRequestContent,
    secret_key: &mls_rs_core::crypto::SignatureSecretKey,
) -> EngineResult<Vec<u8>> {
    suite_provider(content.cipher_suite)?
        .sign(secret_key, &content.signed_data()?)
        .map_err(|e| EngineError::Mls {
            op: "credential request signing",
            detail: format!("{e:?}"),
        })
}

/// Decodes a credential request and checks its proof of possession against the
/// signature key it names (Ed25519 for suite 1, ECDSA P-256/SHA-256 DER for suite 2).
/// Freshness of `issued_at` is the caller's policy.
pub fn verify_credential_request(content: &[u8], proof: &[u8]) -> EngineResult<CredentialRequestContent> {
    let req = CredentialRequestContent::from_bytes(content)?;
    // Verify over the bytes as received: decoding is strict, so they re-encode identically.
    let signed = [REQUEST_LABEL, content].concat();
    suite_provider(req.cipher_suite)?
        .verify(&SignaturePublicKey::from(req.signature_key.clone()), proof, &signed)
        .map_err(|_| EngineError::CredentialRequestSignature)?;
    Ok(req)
}

/// First 8 bytes of a key in hex, enough to tell keys apart in an error message.
fn key_fingerprint(key: &[u8]) -> String {
    let shown = &key[..key.len().min(8)];
    let more = if key.len() > 8 { "…" } else { "" };
    format!("{}{more} ({} bytes)", hex::encode(shown), key.len())
}
