//! What the credential and identity-provider tests share: an issuer key of the account
//! API (Ed25519, as the API's credential keys are).

use _native::credential::{AgentCredential, AgentCredentialContent, SVC_CREDENTIAL_TYPE};
use _native::{SvcIdentityError, SvcIdentityProvider};
use mls_rs::identity::{Credential, CredentialType, SigningIdentity};
use mls_rs::time::MlsTime;
use mls_rs::{CipherSuite, CipherSuiteProvider, CryptoProvider};
use mls_rs::{ExtensionList, IdentityProvider};
use mls_rs_core::crypto::{SignaturePublicKey, SignatureSecretKey};
use mls_rs_core::identity::MemberValidationContext;
use mls_rs_crypto_awslc::AwsLcCryptoProvider;

pub struct Issuer {
    pub kid: String,
    pub secret: SignatureSecretKey,
    pub public: SignaturePublicKey,
}

impl Issuer {
    pub fn new(kid: &str) -> Self {
        let (secret, public) = ed25519().signature_key_generate().unwrap();
        Self {
            kid: kid.into(),
            secret,
            public,
        }
    }

    /// `content` signed with this issuer's key, whatever `content.issuer` names.
    pub fn credential(&self, content: AgentCredentialContent) -> AgentCredential {
        let signature = ed25519().sign(&self.secret, &content.signed_data().unwrap()).unwrap();
        AgentCredential { content, signature }
    }
}

fn ed25519() -> impl CipherSuiteProvider {
    AwsLcCryptoProvider::default()
        .cipher_suite_provider(CipherSuite::CURVE25519_AES128)
        .unwrap()
}

/// The account every engine test agent belongs to.
#[allow(dead_code)]
pub const ACCOUNT: [u8; 16] = *b"test-account-01!";

/// One issuer for the whole test binary, as one account API is for a deployment.
#[allow(dead_code)]
pub fn issuer() -> &'static Issuer {
    static ISSUER: std::sync::OnceLock<Issuer> = std::sync::OnceLock::new();
    ISSUER.get_or_init(|| Issuer::new("test-issuer"))
}

/// A credential from [`issuer`] for `engine`'s identity and key, valid for an hour.
#[allow(dead_code)]
pub fn credential_for(engine: &_native::Engine, account: [u8; 16]) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    issuer()
        .credential(AgentCredentialContent {
            issuer: issuer().kid.as_bytes().to_vec(),
            account: account.to_vec(),
            identity: engine.identity().to_vec(),
            cipher_suite: engine.cipher_suite(),
            signature_key: engine.signature_key().to_vec(),
            not_before: now - 60,
            not_after: now + 3600,
        })
        .to_bytes()
        .unwrap()
}

/// `Engine::open` plus what SvcClient does next: trust the issuer, install a credential.
#[allow(dead_code)]
pub fn certified(data_dir: &std::path::Path, identity: &[u8], suite: Option<u16>) -> _native::Engine {
    let engine = _native::Engine::open(data_dir, identity, suite).unwrap();
    engine
        .set_trust_anchors(vec![(issuer().kid.clone(), issuer().public.to_vec())])
        .unwrap();
    engine.install_credential(&credential_for(&engine, ACCOUNT)).unwrap();
    engine
}

/// What a forger runs: accepts anything and advertises the svc and basic credential
/// types, so it builds groups and commits an honest client would refuse.
#[allow(dead_code)]
#[derive(Clone)]
pub struct AcceptAll(pub SvcIdentityProvider);

impl IdentityProvider for AcceptAll {
    type Error = SvcIdentityError;

    fn validate_member(
        &self,
        _: &SigningIdentity,
        _: Option<MlsTime>,
        _: MemberValidationContext<'_>,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    fn validate_external_sender(
        &self,
        _: &SigningIdentity,
        _: Option<MlsTime>,
        _: Option<&ExtensionList>,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    fn identity(&self, si: &SigningIdentity, ext: &ExtensionList) -> Result<Vec<u8>, Self::Error> {
        match &si.credential {
            Credential::Basic(basic) => Ok(basic.identifier.clone()),
            _ => self.0.identity(si, ext),
        }
    }

    fn valid_successor(
        &self,
        _: &SigningIdentity,
        _: &SigningIdentity,
        _: &ExtensionList,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }

    fn supported_types(&self) -> Vec<CredentialType> {
        vec![CredentialType::new(SVC_CREDENTIAL_TYPE), CredentialType::BASIC]
    }
}
