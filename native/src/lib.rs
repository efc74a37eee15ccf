//! svc's MLS engine: the only code in svc that touches key material.
//!
//! A thin layer over [mls-rs](https://github.com/awslabs/mls-rs): one signing identity
//! and one SQLite store per agent `data_dir`, groups that persist after every state
//! change, commits that stay pending until the delivery service decides. The `python`
//! feature adds the PyO3 bindings that ship as `svc_sdk._native`.

#[cfg(feature = "attacker")]
pub mod attacker;
pub mod checkpoints;
pub mod credential;
pub mod data_dir;
pub mod engine;
pub mod error;
pub mod frames;
pub mod group;
pub mod group_store;
pub mod identity;
pub mod key_packages;
pub mod local_state;
pub mod message;
pub mod policy;
pub mod state_key;
pub mod storage;
pub mod tracker;
pub mod transport;

#[cfg(feature = "python")]
mod py_engine;
#[cfg(feature = "python")]
mod py_frames;
#[cfg(feature = "python")]
mod py_inspect;
#[cfg(feature = "python")]
mod py_local;
#[cfg(feature = "python")]
mod py_server;
#[cfg(feature = "python")]
mod py_tracker;
#[cfg(feature = "python")]
mod py_transport;
#[cfg(feature = "python")]
mod python;

pub use credential::{
    verify_credential, verify_credential_request, verify_mls_credential, AgentCredential, AgentCredentialContent,
    CredentialRequestContent, TrustAnchors, SVC_CREDENTIAL_TYPE,
};
pub use engine::{inspect, Engine, MessageInfo, DEFAULT_CIPHER_SUITE, PQ_CIPHER_SUITE};
pub use error::{EngineError, Result};
pub use group::{CommitInfo, GroupHandle, PendingCommit, Received};
pub use identity::{SvcIdentityError, SvcIdentityProvider};
