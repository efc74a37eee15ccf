//! What agent credentials cost: the same MLS group operations with mls-rs's basic
//! credentials (no validation beyond MLS's own) and with svc's agent credentials
//! (`SvcIdentityProvider`: one Ed25519 issuer-signature check per leaf, plus decoding),
//! measured in one run, in memory, so the difference is the validation alone.
//!
//! Joins with agent credentials go the engine's way: mls-rs walks the tree, and the
//! issuer signatures are checked afterwards in one batch, split across the cores
//! (`SvcIdentityProvider::joining`); the one-by-one figure is beside it.
//!
//!     cargo run --release -p svc-identity-bench -- [--rounds 5] [--sizes 10,100,1000]
//!
//! Prints markdown tables: per-operation medians and ratios, then message sizes.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use _native::credential::{AgentCredential, AgentCredentialContent, TrustAnchors};
use _native::SvcIdentityProvider;
use mls_rs::client_builder::{ClientBuilder, MlsConfig};
use mls_rs::identity::basic::{BasicCredential, BasicIdentityProvider};
use mls_rs::identity::{Credential, SigningIdentity};
use mls_rs::mls_rules::{CommitOptions, DefaultMlsRules, EncryptionOptions};
use mls_rs::time::MlsTime;
use mls_rs::{CipherSuite, CipherSuiteProvider, Client, CryptoProvider, ExtensionList, Group, MlsMessage};
use mls_rs_core::crypto::{SignaturePublicKey, SignatureSecretKey};
use mls_rs_crypto_awslc::AwsLcCryptoProvider;

const SUITE: CipherSuite = CipherSuite::CURVE25519_AES128;
const MESSAGES: usize = 500;

fn suite() -> impl CipherSuiteProvider {
    AwsLcCryptoProvider::default().cipher_suite_provider(SUITE).unwrap()
}

/// The engine's rules (native/src/engine.rs): encrypted handshakes, the ratchet tree in
/// the Welcome, one Welcome per commit.
fn rules() -> DefaultMlsRules {
    DefaultMlsRules::new()
        .with_encryption_options(EncryptionOptions::new(true, Default::default()))
        .with_commit_options(
            CommitOptions::new()
                .with_ratchet_tree_extension(true)
                .with_single_welcome_message(true),
        )
}

/// Makes agents of one kind: basic credentials, or agent credentials from one issuer.
trait Kind {
    type C: MlsConfig;
    const NAME: &'static str;
    fn client(&self, name: &str) -> Client<Self::C>;

    /// Joins as the engine does.
    fn join(&self, client: &Client<Self::C>, welcome: &MlsMessage) {
        client.join_group(None, welcome, None).unwrap();
    }
}

fn key_pair() -> (SignatureSecretKey, SignaturePublicKey) {
    suite().signature_key_generate().unwrap()
}

struct Basic;

impl Kind for Basic {
    type C = impl_config::Basic;
    const NAME: &'static str = "basic credential";
    fn client(&self, name: &str) -> Client<Self::C> {
        let (secret, public) = key_pair();
        let credential = BasicCredential::new(name.as_bytes().to_vec()).into_credential();
        impl_config::basic(SigningIdentity::new(credential, public), secret)
    }
}

struct Agent {
    kid: String,
    secret: SignatureSecretKey,
    anchors: TrustAnchors,
    provider: SvcIdentityProvider,
}

impl Agent {
    fn new() -> Self {
        let (secret, public) = key_pair();
        let kid = "bench-issuer".to_string();
        let anchors = TrustAnchors::new([(kid.clone(), public.to_vec())]).unwrap();
        let provider = SvcIdentityProvider::new(anchors.clone());
        Self {
            kid,
            secret,
            anchors,
            provider,
        }
    }

    fn credential(&self, name: &str, key: &SignaturePublicKey) -> Credential {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let content = AgentCredentialContent {
            issuer: self.kid.as_bytes().to_vec(),
            account: vec![0x42; 16],
            identity: name.as_bytes().to_vec(),
            cipher_suite: SUITE.into(),
            signature_key: key.to_vec(),
            not_before: now - 60,
            not_after: now + 86_400,
        };
        let signature = suite().sign(&self.secret, &content.signed_data().unwrap()).unwrap();
        AgentCredential { content, signature }.to_mls_credential().unwrap()
    }
}

impl Kind for Agent {
    type C = impl_config::Svc;
    const NAME: &'static str = "agent credential";
    fn client(&self, name: &str) -> Client<Self::C> {
        let (secret, public) = key_pair();
        let credential = self.credential(name, &public);
        impl_config::svc(SigningIdentity::new(credential, public), secret, self.provider.clone())
    }

    fn join(&self, client: &Client<Self::C>, welcome: &MlsMessage) {
        let (joined, signatures) = self.provider.joining(|| client.join_group(None, welcome, None));
        joined.unwrap();
        signatures.unwrap();
    }
}

/// Agent credentials, each issuer signature checked by itself as mls-rs meets the leaf.
struct OneByOne(Agent);

impl Kind for OneByOne {
    type C = impl_config::Svc;
    const NAME: &'static str = "agent credential, one by one";
    fn client(&self, name: &str) -> Client<Self::C> {
        self.0.client(name)
    }
}

/// Named client configurations (the builder's types are long).
mod impl_config {
    use super::*;
    use mls_rs::client_builder::{BaseInMemoryConfig, WithCryptoProvider, WithIdentityProvider, WithMlsRules};

    type Base = WithCryptoProvider<AwsLcCryptoProvider, WithMlsRules<DefaultMlsRules, BaseInMemoryConfig>>;
    pub type Basic = WithIdentityProvider<BasicIdentityProvider, Base>;
    pub type Svc = WithIdentityProvider<SvcIdentityProvider, Base>;

    pub fn basic(id: SigningIdentity, secret: SignatureSecretKey) -> Client<Basic> {
        ClientBuilder::new()
            .mls_rules(rules())
            .crypto_provider(AwsLcCryptoProvider::default())
            .identity_provider(BasicIdentityProvider::new())
            .signing_identity(id, secret, SUITE)
            .build()
    }

    pub fn svc(id: SigningIdentity, secret: SignatureSecretKey, provider: SvcIdentityProvider) -> Client<Svc> {
        ClientBuilder::new()
            .mls_rules(rules())
            .crypto_provider(AwsLcCryptoProvider::default())
            .identity_provider(provider)
            .signing_identity(id, secret, SUITE)
            .build()
    }
}

fn key_package<C: MlsConfig>(client: &Client<C>) -> MlsMessage {
    client
        .generate_key_package_message(ExtensionList::new(), ExtensionList::new(), None)
        .unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[derive(Default, Clone, Copy)]
struct Sizes {
    key_package: usize,
    welcome: usize,
}

/// (add-member commit + apply µs, join µs, sizes) at group `size`, medians of `rounds`.
fn membership<K: Kind>(kind: &K, size: usize, rounds: usize) -> (f64, f64, Sizes) {
    let creator = kind.client("creator");
    let mut group: Group<K::C> = creator
        .create_group(ExtensionList::new(), ExtensionList::new(), Some(MlsTime::now()))
        .unwrap();
    let mut builder = group.commit_builder();
    for i in 1..size {
        builder = builder.add_member(key_package(&kind.client(&format!("m{i}")))).unwrap();
    }
    builder.build().unwrap();
    group.apply_pending_commit().unwrap();
    let (mut add_us, mut join_us, mut sizes) = (Vec::new(), Vec::new(), Sizes::default());
    for r in 0..rounds {
        let joiner = kind.client(&format!("joiner{r}"));
        let kp = key_package(&joiner);
        sizes.key_package = kp.to_bytes().unwrap().len();
        let start = Instant::now();
        let out = group
            .commit_builder()
            .add_member(kp)
            .unwrap()
            .commit_time(MlsTime::now())
            .build()
            .unwrap();
        group.apply_pending_commit().unwrap();
        add_us.push(start.elapsed().as_secs_f64() * 1e6);
        let welcome = &out.welcome_messages[0];
        sizes.welcome = welcome.to_bytes().unwrap().len();
        let start = Instant::now();
        kind.join(&joiner, welcome);
        join_us.push(start.elapsed().as_secs_f64() * 1e6);
    }
    (median(add_us), median(join_us), sizes)
}

/// (encrypt µs, decrypt µs) per 256-byte application message between two members.
fn messaging<K: Kind>(kind: &K, rounds: usize) -> (f64, f64) {
    let (a, b) = (kind.client("a"), kind.client("b"));
    let mut ga = a
        .create_group(ExtensionList::new(), ExtensionList::new(), Some(MlsTime::now()))
        .unwrap();
    let out = ga
        .commit_builder()
        .add_member(key_package(&b))
        .unwrap()
        .build()
        .unwrap();
    ga.apply_pending_commit().unwrap();
    let (mut gb, _) = b.join_group(None, &out.welcome_messages[0], None).unwrap();
    let (mut enc, mut dec) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let start = Instant::now();
        let cts: Vec<MlsMessage> = (0..MESSAGES)
            .map(|_| ga.encrypt_application_message(&[0x5a; 256], vec![]).unwrap())
            .collect();
        enc.push(start.elapsed().as_secs_f64() * 1e6 / MESSAGES as f64);
        let start = Instant::now();
        for ct in cts {
            gb.process_incoming_message(ct).unwrap();
        }
        dec.push(start.elapsed().as_secs_f64() * 1e6 / MESSAGES as f64);
    }
    (median(enc), median(dec))
}

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

struct Timings {
    encrypt: f64,
    decrypt: f64,
    membership: Vec<(f64, f64, Sizes)>,
}

fn run<K: Kind>(kind: &K, sizes: &[usize], rounds: usize) -> Timings {
    let (encrypt, decrypt) = messaging(kind, rounds);
    let membership = sizes.iter().map(|&n| membership(kind, n, rounds)).collect();
    Timings {
        encrypt,
        decrypt,
        membership,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = arg(&args, "--rounds", "5").parse().expect("--rounds: a whole number");
    let sizes: Vec<usize> = arg(&args, "--sizes", "10,100,1000")
        .split(',')
        .map(|s| s.trim().parse().expect("--sizes: comma-separated whole numbers"))
        .collect();
    assert!(
        rounds >= 1 && sizes.iter().all(|&s| s >= 2),
        "--rounds >= 1, sizes >= 2"
    );
    let check_us = {
        let agent = Agent::new();
        let Credential::Custom(custom) = agent.credential("x", &key_pair().1) else {
            unreachable!("agent credentials are custom credentials")
        };
        let start = Instant::now();
        for _ in 0..1000 {
            _native::verify_credential(&custom.data, &agent.anchors, None, None).unwrap();
        }
        start.elapsed().as_secs_f64() * 1e6 / 1000.0
    };
    let batch_us = {
        let agent = Agent::new();
        let items: Vec<_> = (0..1000)
            .map(|i| {
                let Credential::Custom(c) = agent.credential(&format!("m{i}"), &key_pair().1) else {
                    unreachable!()
                };
                _native::credential::check_unsigned(&c.data, &agent.anchors, None, None).unwrap()
            })
            .collect();
        let start = Instant::now();
        _native::credential::verify_signatures(&items).unwrap();
        start.elapsed().as_secs_f64() * 1e6 / 1000.0
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let basic = run(&Basic, &sizes, rounds);
    let agent = run(&Agent::new(), &sizes, rounds);
    let one_by_one = run(&OneByOne(Agent::new()), &sizes, rounds);

    println!(
        "MLS group operations with basic vs agent credentials; suite 1 (X25519/Ed25519), aws-lc, in memory; median of {rounds} rounds"
    );
    println!("one agent-credential check (decode + Ed25519 verify), measured in this run: {check_us:.1} µs; in a batch of 1,000 over {threads} cores: {batch_us:.1} µs each\n");
    println!(
        "| operation (µs) | {} | {} (svc) | svc / basic | {} |",
        Basic::NAME,
        Agent::NAME,
        OneByOne::NAME
    );
    println!("|---|---:|---:|---:|---:|");
    let row = |name: String, b: f64, a: f64, o: f64| {
        println!("| {name} | {b:.1} | {a:.1} | {:.2}x | {o:.1} |", a / b);
    };
    row(
        "encrypt 256 B application message".into(),
        basic.encrypt,
        agent.encrypt,
        one_by_one.encrypt,
    );
    row(
        "decrypt 256 B application message".into(),
        basic.decrypt,
        agent.decrypt,
        one_by_one.decrypt,
    );
    for (i, &n) in sizes.iter().enumerate() {
        let (b, a, o) = (&basic.membership[i], &agent.membership[i], &one_by_one.membership[i]);
        row(format!("add-member commit + apply, group of {n}"), b.0, a.0, o.0);
        row(format!("join from Welcome, group of {n}"), b.1, a.1, o.1);
    }
    println!("\n| message (bytes) | {} | {} |", Basic::NAME, Agent::NAME);
    println!("|---|---:|---:|");
    if let (Some(b), Some(a)) = (basic.membership.first(), agent.membership.first()) {
        println!("| key package | {} | {} |", b.2.key_package, a.2.key_package);
    }
    for (i, &n) in sizes.iter().enumerate() {
        println!(
            "| Welcome, group of {n} | {} | {} |",
            basic.membership[i].2.welcome, agent.membership[i].2.welcome
        );
    }
}
