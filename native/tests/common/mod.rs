//! What the credential and identity-provider tests share: an issuer key of the account
//! API (Ed25519, as the API's credential keys are).

use _native::credential::{AgentCredential, AgentCredentialContent};
use mls_rs::{CipherSuite, CipherSuiteProvider, CryptoProvider};
use mls_rs_core::crypto::{SignaturePublicKey, SignatureSecretKey};
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
