//! The per-agent MLS engine: one signing identity and one store per `data_dir`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use mls_rs::client_builder::{
    BaseConfig, WithCryptoProvider, WithGroupStateStorage, WithIdentityProvider, WithKeyPackageRepo, WithMlsRules,
};
use mls_rs::identity::{Credential, SigningIdentity};
use mls_rs::{CipherSuite, CipherSuiteProvider, Client, CryptoProvider, ExtensionList};
use mls_rs_core::crypto::{SignaturePublicKey, SignatureSecretKey};
use mls_rs_core::group::GroupStateStorage;

use mls_rs_core::time::MlsTime;

use crate::credential::{
    check_unsigned, sign_request, verify_credential, verify_mls_credential, AgentCredential, AgentCredentialContent,
    CredentialRequestContent, TrustAnchors, ACCOUNT_ID_LEN,
};
use crate::data_dir::{self, DataDirLock};
use crate::error::{EngineError, Result};
use crate::group::GroupHandle;
use crate::group_store::GroupStore;
use crate::identity::{member_id, SvcIdentityProvider};
use crate::key_packages::KeyPackages;
use crate::message::{expect_kind, parse};
use crate::policy::{initial_extensions, SvcRules, ROLES_EXTENSION};
use crate::state_key::{self, StateKey};
use crate::storage::{self, IdentityStore, StoredIdentity};
use mls_rs_core::error::IntoAnyError;

/// The crypto provider, chosen by measurement (docs/performance.md).
pub type Crypto = mls_rs_crypto_awslc::AwsLcCryptoProvider;
pub type Config = WithIdentityProvider<
    SvcIdentityProvider,
    WithCryptoProvider<
        Crypto,
        WithMlsRules<SvcRules, WithGroupStateStorage<GroupStore, WithKeyPackageRepo<KeyPackages, BaseConfig>>>,
    >,
>;
pub type MlsClient = Client<Config>;

/// Suite 1, MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519: with aws-lc it signs 1.7x and
/// verifies 1.4x faster than P-256 (suite 2), and verification bounds receive throughput.
pub const DEFAULT_CIPHER_SUITE: u16 = 1;
/// The suites an agent's signature key (its data_dir) can be made for.
pub const SUPPORTED_CIPHER_SUITES: [u16; 2] = [1, 2];
/// The hybrid post-quantum suite a channel can use instead of its creator's: HPKE with
/// X-Wing (ML-KEM-768 combined with X25519), AES-128-GCM, SHA-256 and Ed25519 signatures
/// (mls-rs's `ML_KEM_768_X25519`). 65100 is from the private-use range (0xF000-0xFFFF):
/// the IETF has assigned no post-quantum MLS suite yet, so only svc agents speak it.
pub const PQ_CIPHER_SUITE: u16 = 65100;
pub const MAX_IDENTITY_LEN: usize = 1024;

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    MlsTime::now().seconds_since_epoch()
}

/// What the engine and every group handle share: the identity provider (whose trust
/// anchors can be replaced in place) and the agent's current credential, which every
/// commit brings the committer's own leaf up to.
pub struct Agent {
    pub(crate) provider: SvcIdentityProvider,
    pub(crate) secret_key: SignatureSecretKey,
    pub(crate) public_key: SignaturePublicKey,
    current: RwLock<Option<(SigningIdentity, AgentCredentialContent)>>,
    // The anchors the current credential's issuer signature last verified under: the
    // signature is checked again only when the credential or the anchors change.
    verified_under: Mutex<Option<TrustAnchors>>,
}

impl Agent {
    /// The current signing identity, checked valid now against the current anchors.
    ///
    /// mls-rs never validates the sender's own leaf (key packages, commits, renewals), so
    /// without this an agent with an expired or foreign credential would publish it and
    /// learn only from other members' refusals.
    pub(crate) fn usable(&self) -> Result<SigningIdentity> {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        let (signing, _) = current.as_ref().ok_or(EngineError::NoCredential)?;
        let anchors = self.provider.anchors();
        if anchors.is_empty() {
            return Err(EngineError::NoTrustAnchors);
        }
        let mut verified = self.verified_under.lock().unwrap_or_else(|p| p.into_inner());
        let key = Some(self.public_key.as_bytes());
        let checked = match (&*verified, &signing.credential) {
            (Some(under), Credential::Custom(custom)) if under.same(&anchors) => {
                check_unsigned(&custom.data, &anchors, key, Some(unix_now())).map(|_| ())
            }
            _ => verify_mls_credential(&signing.credential, &anchors, key, Some(unix_now())).map(|_| ()),
        };
        checked.map_err(|e| EngineError::OwnCredential(Box::new(e)))?;
        *verified = Some(anchors);
        Ok(signing.clone())
    }

    fn set_current(&self, signing: SigningIdentity, content: AgentCredentialContent) {
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        *self.verified_under.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *current = Some((signing, content));
    }

    pub(crate) fn credential(&self) -> Option<AgentCredentialContent> {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        current.as_ref().map(|(_, content)| content.clone())
    }
}

/// One mls-rs client per channel suite the agent can use, all signing with its one key:
/// its data_dir's suite, and the post-quantum suite when that key is Ed25519 (suite 1).
#[derive(Clone)]
struct Clients {
    own: MlsClient,
    pq: Option<MlsClient>,
}

pub struct Engine {
    clients: RwLock<Clients>,
    pub(crate) agent: Arc<Agent>,
    identity: Vec<u8>,
    pub(crate) cipher_suite: CipherSuite,
    // Read by the attacker harness's own client only (attacker.rs).
    #[cfg_attr(not(feature = "attacker"), allow(dead_code))]
    pub(crate) db: PathBuf,
    /// The data_dir's SQLCipher key, if it is encrypted (state_key.rs); the bindings open
    /// the local state with it.
    #[cfg_attr(not(any(feature = "python", feature = "attacker")), allow(dead_code))]
    pub(crate) state_key: Option<StateKey>,
    store: Mutex<IdentityStore>,
    data_dir: PathBuf,
    group_storage: GroupStore,
    // One handle per group, so every caller shares one ratchet state and one lock.
    groups: Mutex<HashMap<Vec<u8>, Arc<GroupHandle>>>,
    // Set by `close`, under `groups`' lock: no group is opened, made or deleted after it.
    closed: AtomicBool,
    // Held until `close` or drop: no other process uses this data_dir meanwhile.
    lock: Mutex<Option<DataDirLock>>,
}

impl Engine {
    /// Opens (or initialises) the engine in `data_dir` for `identity`.
    ///
    /// `cipher_suite` applies when the data_dir is new; an existing data_dir keeps its own
    /// and rejects a different explicit request. The trust anchors and credential stored
    /// in data_dir are loaded; until both exist the engine can read nothing and make
    /// nothing (see [`set_trust_anchors`](Self::set_trust_anchors) and
    /// [`install_credential`](Self::install_credential)).
    pub fn open(data_dir: &Path, identity: &[u8], cipher_suite: Option<u16>) -> Result<Self> {
        Self::open_keyed(data_dir, identity, cipher_suite, None)
    }

    /// [`open`](Self::open) for a data_dir encrypted with `state_key` (or to be created
    /// encrypted). Fails closed: an encrypted data_dir without its key, a plaintext one
    /// with a key, or a wrong key is refused before anything in it is created or written.
    pub fn open_keyed(
        data_dir: &Path,
        identity: &[u8],
        cipher_suite: Option<u16>,
        state_key: Option<StateKey>,
    ) -> Result<Self> {
        if identity.is_empty() || identity.len() > MAX_IDENTITY_LEN {
            return Err(EngineError::BadIdentity {
                len: identity.len(),
                max: MAX_IDENTITY_LEN,
            });
        }
        if let Some(cs) = cipher_suite {
            if !SUPPORTED_CIPHER_SUITES.contains(&cs) {
                return Err(EngineError::UnsupportedCipherSuite(cs));
            }
        }
        let lock = data_dir::take(data_dir)?;
        state_key::recover(data_dir)?;
        state_key::check_data_dir(data_dir, state_key.as_ref())?;
        // Declared before the connections, so dropped after them (an error path).
        let sidecars = state_key::NewSidecars::watch(data_dir);
        let db = data_dir::private_file(data_dir, storage::DB_FILE)?;
        let ids = IdentityStore::open(&db, state_key.as_ref())?;
        let stored = match ids.load()? {
            Some(stored) => stored,
            None => ids.insert_or_get(&Self::new_identity(
                identity,
                cipher_suite.unwrap_or(DEFAULT_CIPHER_SUITE),
            )?)?,
        };
        if stored.identity != identity {
            return Err(EngineError::IdentityMismatch {
                stored: String::from_utf8_lossy(&stored.identity).into_owned(),
                requested: String::from_utf8_lossy(identity).into_owned(),
            });
        }
        if let Some(cs) = cipher_suite {
            if cs != stored.cipher_suite {
                return Err(EngineError::CipherSuiteMismatch {
                    stored: stored.cipher_suite,
                    requested: cs,
                });
            }
        }

        let suite = CipherSuite::from(stored.cipher_suite);
        let agent = Arc::new(Agent {
            provider: SvcIdentityProvider::new(TrustAnchors::new(ids.anchors()?)?),
            secret_key: SignatureSecretKey::from(stored.secret_key.clone()),
            public_key: SignaturePublicKey::from(stored.public_key.clone()),
            current: RwLock::new(None),
            verified_under: Mutex::new(None),
        });
        if let Some(bytes) = ids.credential()? {
            // Stored after verification; decoded again, not re-verified: it may have expired
            // meanwhile, and the engine must still open to read its channels.
            let cred = AgentCredential::from_bytes(&bytes)?;
            let signing = SigningIdentity::new(cred.to_mls_credential()?, agent.public_key.clone());
            agent.set_current(signing, cred.content);
        }
        storage::migrate(&db, state_key.as_ref())?;
        let group_storage = GroupStore::open(&db, state_key.as_ref())?;
        let clients = build_clients(&group_storage, &agent, suite)?;
        sidecars.keep();
        Ok(Self {
            clients: RwLock::new(clients),
            agent,
            identity: stored.identity,
            cipher_suite: suite,
            db: db.clone(),
            state_key,
            store: Mutex::new(ids),
            data_dir: data_dir.to_owned(),
            group_storage,
            groups: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            lock: Mutex::new(Some(lock)),
        })
    }

    /// Releases the data_dir for another engine, in this process or another. First waits
    /// for the group operations under way and closes every group: from then on, groups
    /// (those handed out before too) and the engine's group calls fail with `Closed`, so
    /// nothing of this engine's writes the state another engine may be using.
    pub fn close(&self) {
        let mut groups = self.lock_groups();
        self.closed.store(true, Ordering::Relaxed);
        for handle in groups.values() {
            handle.close();
        }
        groups.clear();
        drop(groups);
        // Every group is closed: nothing uses the connections any more.
        self.group_storage.close();
        self.store.lock().unwrap_or_else(|e| e.into_inner()).close();
        self.lock.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn lock_groups(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Arc<GroupHandle>>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The groups' map, for a call that may add or remove a group: `Closed` once the
    /// engine is closed (checked under the map's lock, which `close` holds).
    fn open_groups(&self) -> Result<MutexGuard<'_, HashMap<Vec<u8>, Arc<GroupHandle>>>> {
        let groups = self.lock_groups();
        if self.closed.load(Ordering::Relaxed) {
            return Err(EngineError::Closed);
        }
        Ok(groups)
    }

    fn new_identity(identity: &[u8], cipher_suite: u16) -> Result<StoredIdentity> {
        let provider = Crypto::default()
            .cipher_suite_provider(CipherSuite::from(cipher_suite))
            .ok_or(EngineError::UnsupportedCipherSuite(cipher_suite))?;
        let (secret, public) = provider.signature_key_generate().map_err(|e| EngineError::Mls {
            op: "signature key generation",
            detail: format!("{e:?}"),
        })?;
        Ok(StoredIdentity {
            identity: identity.to_vec(),
            cipher_suite,
            public_key: public.to_vec(),
            secret_key: secret.to_vec(),
        })
    }

    pub fn identity(&self) -> &[u8] {
        &self.identity
    }

    pub fn cipher_suite(&self) -> u16 {
        self.cipher_suite.into()
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// This agent's MLS signature public key (what a credential certifies).
    pub fn signature_key(&self) -> &[u8] {
        &self.agent.public_key
    }

    fn client(&self) -> MlsClient {
        self.clients.read().unwrap_or_else(|p| p.into_inner()).own.clone()
    }

    /// The cipher suites this agent can make key packages and channels for: its own, and
    /// the post-quantum one when its signature key is Ed25519.
    pub fn channel_cipher_suites(&self) -> Vec<u16> {
        channel_suites(self.cipher_suite())
    }

    /// `cipher_suite` as a caller gave it (any integer), checked to be a suite number.
    pub fn suite_arg(&self, cipher_suite: Option<i64>) -> Result<Option<u16>> {
        cipher_suite
            .map(|cs| {
                u16::try_from(cs).map_err(|_| EngineError::ChannelCipherSuite {
                    got: cs,
                    supported: self.channel_cipher_suites(),
                })
            })
            .transpose()
    }

    /// The client for channels of `suite` (None: this agent's own), or a clear refusal.
    fn client_for(&self, suite: Option<u16>, op: &'static str) -> Result<MlsClient> {
        let clients = self.clients.read().unwrap_or_else(|p| p.into_inner());
        match suite {
            None => Ok(clients.own.clone()),
            Some(cs) if cs == self.cipher_suite() => Ok(clients.own.clone()),
            Some(PQ_CIPHER_SUITE) => clients.pq.clone().ok_or_else(|| EngineError::Mls {
                op,
                detail: format!(
                    "cipher suite {PQ_CIPHER_SUITE} (ML-KEM-768+X25519, Ed25519 signatures) needs an Ed25519 \
                     signature key; this agent's data_dir uses cipher suite {} (P-256), so it cannot make key \
                     packages for or join post-quantum channels",
                    self.cipher_suite()
                ),
            }),
            Some(cs) => Err(EngineError::ChannelCipherSuite {
                got: cs.into(),
                supported: self.channel_cipher_suites(),
            }),
        }
    }

    /// Replaces the issuer keys credentials are checked against (the account API's
    /// published credential keys), here and in every open group, and stores them.
    pub fn set_trust_anchors(&self, anchors: Vec<(String, Vec<u8>)>) -> Result<()> {
        let parsed = TrustAnchors::new(anchors.clone())?;
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set_anchors(&anchors)?;
        self.agent.provider.set_anchors(parsed);
        Ok(())
    }

    pub fn trust_anchors(&self) -> TrustAnchors {
        self.agent.provider.anchors()
    }

    /// Installs a credential from the account API after checking that it is valid now,
    /// signed by a trust anchor, for this agent's identity and signature key. New key
    /// packages and groups use it at once; each existing group's leaf moves to it with the
    /// group's next commit (`self_update` makes one).
    pub fn install_credential(&self, bytes: &[u8]) -> Result<AgentCredentialContent> {
        let anchors = self.agent.provider.anchors();
        if anchors.is_empty() {
            return Err(EngineError::NoTrustAnchors);
        }
        let cred = verify_credential(bytes, &anchors, Some(self.signature_key()), Some(unix_now()))?;
        if cred.content.identity != self.identity {
            return Err(EngineError::NotOurCredential {
                what: "identity",
                got: String::from_utf8_lossy(&cred.content.identity).into_owned(),
                want: String::from_utf8_lossy(&self.identity).into_owned(),
            });
        }
        if let Some(current) = self.agent.credential() {
            if current.account != cred.content.account {
                return Err(EngineError::NotOurCredential {
                    what: "account",
                    got: hex::encode(&cred.content.account),
                    want: hex::encode(&current.account),
                });
            }
        }
        let signing = SigningIdentity::new(cred.to_mls_credential()?, self.agent.public_key.clone());
        let mut clients = self.clients.write().unwrap_or_else(|p| p.into_inner());
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set_credential(bytes)?;
        self.agent.set_current(signing, cred.content.clone());
        *clients = build_clients(&self.group_storage, &self.agent, self.cipher_suite)?;
        Ok(cred.content)
    }

    /// The credential installed last, if any (it may have expired since).
    pub fn credential(&self) -> Option<AgentCredentialContent> {
        self.agent.credential()
    }

    /// `account || identity` of this agent once it has a credential: how groups name it.
    pub fn member_id(&self) -> Option<Vec<u8>> {
        self.agent.credential().map(|content| {
            member_id(&AgentCredential {
                content,
                signature: Vec::new(),
            })
        })
    }

    /// A credential request for `account` (a 16-byte UUID) and its proof of possession:
    /// (encoded `CredentialRequestContent`, signature by this agent's MLS key over
    /// `REQUEST_LABEL || content`). The account API verifies both before issuing.
    pub fn credential_request(&self, account: &[u8], issued_at: u64) -> Result<(Vec<u8>, Vec<u8>)> {
        if account.len() != ACCOUNT_ID_LEN {
            return Err(EngineError::Malformed {
                what: "account id",
                detail: format!("must be a {ACCOUNT_ID_LEN}-byte UUID, got {} bytes", account.len()),
            });
        }
        let content = CredentialRequestContent {
            account: account.to_vec(),
            identity: self.identity.clone(),
            cipher_suite: self.cipher_suite(),
            signature_key: self.agent.public_key.to_vec(),
            issued_at,
        };
        let proof = sign_request(&content, &self.agent.secret_key)?;
        Ok((content.to_bytes()?, proof))
    }

    /// A fresh single-use key package carrying the current credential, for channels of
    /// this agent's own suite; its private keys go to the store.
    pub fn generate_key_package(&self) -> Result<Vec<u8>> {
        self.generate_key_package_for(None)
    }

    /// [`generate_key_package`](Self::generate_key_package) for channels of `cipher_suite`
    /// (None: this agent's own).
    pub fn generate_key_package_for(&self, cipher_suite: Option<u16>) -> Result<Vec<u8>> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(EngineError::Closed);
        }
        let client = self.client_for(cipher_suite, "key package generation")?;
        self.agent.usable()?;
        let msg = client
            .generate_key_package_message(ExtensionList::default(), ExtensionList::default(), None)
            .map_err(|e| EngineError::mls("key package generation", e))?;
        msg.to_bytes().map_err(|e| EngineError::mls("key package encoding", e))
    }

    fn handle(&self, client: MlsClient, group: crate::group::MlsGroup) -> Arc<GroupHandle> {
        Arc::new(GroupHandle::new(client, group, self.agent.clone()))
    }

    /// Creates a group of this agent's own suite with this agent its only member and owner.
    pub fn create_group(&self, group_id: &[u8]) -> Result<Arc<GroupHandle>> {
        self.create_group_with_suite(group_id, None)
    }

    /// [`create_group`](Self::create_group) for `cipher_suite` (None: this agent's own).
    pub fn create_group_with_suite(&self, group_id: &[u8], cipher_suite: Option<u16>) -> Result<Arc<GroupHandle>> {
        let client = self.client_for(cipher_suite, "group creation")?;
        if group_id.is_empty() || group_id.len() > 255 {
            return Err(EngineError::Malformed {
                what: "group id",
                detail: format!("must be 1 to 255 bytes, got {}", group_id.len()),
            });
        }
        let mut groups = self.open_groups()?;
        if groups.contains_key(group_id) || self.stored(group_id)? {
            return Err(EngineError::GroupExists(hex::encode(group_id)));
        }
        self.agent.usable()?;
        let owner = self.member_id().ok_or(EngineError::NoCredential)?;
        let mut group = client
            .create_group_with_id(
                group_id.to_vec(),
                initial_extensions(owner),
                ExtensionList::default(),
                Some(MlsTime::now()),
            )
            .map_err(|e| EngineError::mls("group creation", e))?;
        group
            .write_to_storage()
            .map_err(|e| EngineError::mls("group storage", e))?;
        let handle = self.handle(client, group);
        groups.insert(group_id.to_vec(), handle.clone());
        Ok(handle)
    }

    /// Joins from a Welcome addressed to one of this agent's key packages.
    pub fn join_group(&self, welcome: &[u8]) -> Result<Arc<GroupHandle>> {
        let msg = parse(welcome, "Welcome")?;
        expect_kind(&msg, mls_rs::WireFormat::Welcome, "a Welcome")?;
        let suite = msg.cipher_suite().map(u16::from).unwrap_or(self.cipher_suite());
        if !self.channel_cipher_suites().contains(&suite) {
            return Err(EngineError::Mls {
                op: "join",
                detail: format!(
                    "invalid Welcome: cipher suite {suite} is not one this agent can use ({})",
                    suite_list(&self.channel_cipher_suites())
                ),
            });
        }
        let client = self.client_for(Some(suite), "join")?;
        if self.agent.provider.anchors().is_empty() {
            return Err(EngineError::NoTrustAnchors);
        }
        // The Welcome answers a key package made under some credential of ours; the
        // current one may have expired since, which does not matter for joining.
        self.agent.credential().ok_or(EngineError::NoCredential)?;
        let mut groups = self.open_groups()?;
        // No time: every leaf's issuer, signature and key are checked, not its validity
        // period, so a member whose credential lapsed while offline cannot block joins.
        // The tree's issuer signatures are checked in one batch after mls-rs has walked it
        // (a join re-validates every leaf: at 1,000 members, one by one would double its
        // cost); the group is used and stored only if they all hold.
        let (joined, signatures) = self.agent.provider.joining(|| client.join_group(None, &msg, None));
        let (mut group, _info) = joined.map_err(|e| match e {
            mls_rs::error::MlsError::WelcomeKeyPackageNotFound => EngineError::WelcomeNotForUs,
            e => EngineError::mls("join from Welcome", e),
        })?;
        signatures.map_err(|e| {
            EngineError::mls(
                "join from Welcome",
                mls_rs::error::MlsError::IdentityProviderError(e.into_any_error()),
            )
        })?;
        let id = group.group_id().to_vec();
        if groups.contains_key(&id) || self.stored(&id)? {
            return Err(EngineError::GroupExists(hex::encode(&id)));
        }
        group
            .write_to_storage()
            .map_err(|e| EngineError::mls("group storage", e))?;
        let handle = self.handle(client, group);
        groups.insert(id, handle.clone());
        Ok(handle)
    }

    /// The group as stored in data_dir (loaded once, then shared).
    pub fn group(&self, group_id: &[u8]) -> Result<Arc<GroupHandle>> {
        let mut groups = self.open_groups()?;
        if let Some(handle) = groups.get(group_id) {
            if !handle.is_removed() {
                return Ok(handle.clone());
            }
        }
        let client = self.client();
        let group = client.load_group(group_id).map_err(|e| match e {
            mls_rs::error::MlsError::GroupNotFound => EngineError::GroupNotFound(hex::encode(group_id)),
            e => EngineError::mls("group load", e),
        })?;
        let handle = self.handle(client, group);
        groups.insert(group_id.to_vec(), handle.clone());
        Ok(handle)
    }

    pub fn group_ids(&self) -> Result<Vec<Vec<u8>>> {
        let mut ids = self.group_storage.group_ids()?;
        ids.sort();
        Ok(ids)
    }

    /// Forgets a group and its secrets. Messages for it can no longer be decrypted here.
    pub fn delete_group(&self, group_id: &[u8]) -> Result<()> {
        let mut groups = self.open_groups()?;
        if let Some(handle) = groups.remove(group_id) {
            handle.mark_removed();
        }
        self.group_storage.delete_group(group_id)
    }

    fn stored(&self, group_id: &[u8]) -> Result<bool> {
        Ok(self.group_storage.state(group_id)?.is_some())
    }
}

/// The channel suites an agent whose own suite is `own` can use.
fn channel_suites(own: u16) -> Vec<u16> {
    let mut suites = vec![own];
    if own == DEFAULT_CIPHER_SUITE {
        suites.push(PQ_CIPHER_SUITE);
    }
    suites
}

/// `1, 65100`: suites for an error message.
pub(crate) fn suite_list(suites: &[u16]) -> String {
    suites.iter().map(u16::to_string).collect::<Vec<_>>().join(", ")
}

/// The crypto provider for a client of `suite`. Its list of suites is what the client's
/// new leaves (key packages, created groups) advertise: the classical ones, as before the
/// post-quantum suite existed, plus that suite for its own client.
fn crypto_for(suite: CipherSuite) -> Crypto {
    let mut suites = Crypto::supported_classical_cipher_suites();
    if suite == CipherSuite::ML_KEM_768_X25519 {
        suites.push(suite);
    }
    Crypto::with_enabled_cipher_suites(suites)
}

fn build_clients(groups: &GroupStore, agent: &Agent, suite: CipherSuite) -> Result<Clients> {
    let own = build_client(groups, agent, suite);
    let pq =
        (u16::from(suite) == DEFAULT_CIPHER_SUITE).then(|| build_client(groups, agent, CipherSuite::ML_KEM_768_X25519));
    Ok(Clients { own, pq })
}

/// A client on the engine's own storage: group state and key packages in `mls.sqlite3`;
/// pre-shared keys in memory, because svc's rules refuse PSK proposals (policy.rs) and
/// so never store one (no SQLite connection is held open for that store).
fn build_client(groups: &GroupStore, agent: &Agent, suite: CipherSuite) -> MlsClient {
    let builder = mls_rs::client_builder::ClientBuilder::new()
        .key_package_repo(groups.key_packages())
        .group_state_storage(groups.clone())
        .extension_type(mls_rs_core::extension::ExtensionType::new(ROLES_EXTENSION))
        .mls_rules(SvcRules)
        .crypto_provider(crypto_for(suite))
        .identity_provider(agent.provider.clone());
    let current = agent.current.read().unwrap_or_else(|p| p.into_inner());
    match current.as_ref() {
        Some((signing, _)) => builder
            .signing_identity(signing.clone(), agent.secret_key.clone(), suite)
            .build(),
        None => builder.build(),
    }
}

/// Public framing of a message, readable without keys: what the relay needs to order it.
pub struct MessageInfo {
    pub wire_format: &'static str,
    pub group_id: Option<Vec<u8>>,
    pub epoch: Option<u64>,
    pub content_type: Option<&'static str>,
    /// For a key package: its leaf's credential data (an encoded agent credential when the
    /// credential type is svc's; not verified), the key its leaf signs with, and its
    /// KeyPackageRef (RFC 9420 §5.2), which a Welcome names it by.
    pub key_package: Option<KeyPackageInfo>,
    /// For a key package, Welcome or GroupInfo: the cipher suite it is made for.
    pub cipher_suite: Option<u16>,
    /// For a Welcome: the KeyPackageRefs of the key packages it is addressed to.
    pub welcome_refs: Vec<Vec<u8>>,
}

pub struct KeyPackageInfo {
    pub credential_type: u16,
    pub credential: Vec<u8>,
    pub signature_key: Vec<u8>,
    pub reference: Option<Vec<u8>>,
}

pub fn inspect(bytes: &[u8]) -> Result<MessageInfo> {
    let msg = parse(bytes, "MLS message")?;
    Ok(crate::message::info(&msg))
}
