//! The agent's `data_dir`: one SQLite file holding the signing identity, group state,
//! prior-epoch secrets and key-package secrets, private to the agent's user.

use std::path::{Path, PathBuf};

use mls_rs::storage_provider::sqlite::{
    connection_strategy::ConnectionStrategy, SqLiteDataStorageEngine, SqLiteDataStorageError,
};
use rusqlite::{Connection, OptionalExtension};

use crate::error::{EngineError, Result};
use crate::state_key::StateKey;

pub const DB_FILE: &str = "mls.sqlite3";

/// Opens the store with the settings every connection needs.
///
/// WAL lets readers and the writer proceed together; `synchronous=NORMAL` makes each
/// state write survive a process crash (the case that could otherwise reuse a sender
/// ratchet key). After power loss the last writes may be lost; RFC 9420's reuse_guard,
/// which mls-rs randomises per message, keeps nonces distinct in that case.
pub struct SecureFileStrategy {
    path: PathBuf,
    key: Option<StateKey>,
}

impl ConnectionStrategy for SecureFileStrategy {
    fn make_connection(&self) -> std::result::Result<Connection, SqLiteDataStorageError> {
        open_connection(&self.path, self.key.as_ref()).map_err(|e| SqLiteDataStorageError::SqlEngineError(e.into()))
    }
}

/// `key` (SQLCipher) is applied first, before anything reads a page: see state_key.rs.
pub(crate) fn open_connection(path: &Path, key: Option<&StateKey>) -> std::result::Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    crate::state_key::apply(&conn, key)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(conn)
}

pub fn storage_engine(db: &Path, key: Option<&StateKey>) -> SqLiteDataStorageEngine<SecureFileStrategy> {
    // `new` only records the strategy; it cannot fail in this version.
    SqLiteDataStorageEngine::new(SecureFileStrategy {
        path: db.to_owned(),
        key: key.cloned(),
    })
    .expect("SqLiteDataStorageEngine::new is infallible")
}

/// The agent's signing identity as persisted in the store.
pub struct StoredIdentity {
    pub identity: Vec<u8>,
    pub cipher_suite: u16,
    pub public_key: Vec<u8>,
    pub secret_key: Vec<u8>,
}

/// A small table of our own beside mls-rs's schema: the identity is ours, not mls-rs's.
pub struct IdentityStore {
    conn: Connection,
}

impl IdentityStore {
    pub fn open(db: &Path, key: Option<&StateKey>) -> Result<Self> {
        let conn = open_connection(db, key)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS svc_identity (
                singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
                identity BLOB NOT NULL,
                cipher_suite INTEGER NOT NULL,
                public_key BLOB NOT NULL,
                secret_key BLOB NOT NULL
            );
            CREATE TABLE IF NOT EXISTS svc_credential (
                singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
                credential BLOB NOT NULL
            );
            CREATE TABLE IF NOT EXISTS svc_trust_anchor (
                kid TEXT PRIMARY KEY,
                key BLOB NOT NULL
            );",
        )?;
        Ok(Self { conn })
    }

    pub fn load(&self) -> Result<Option<StoredIdentity>> {
        Ok(self
            .conn
            .query_row(
                "SELECT identity, cipher_suite, public_key, secret_key FROM svc_identity WHERE singleton = 1",
                [],
                |row| {
                    Ok(StoredIdentity {
                        identity: row.get(0)?,
                        cipher_suite: row.get(1)?,
                        public_key: row.get(2)?,
                        secret_key: row.get(3)?,
                    })
                },
            )
            .optional()?)
    }

    /// Stores the identity unless one exists; returns whichever is stored afterwards, so
    /// two processes racing on a fresh data_dir agree on one key.
    pub fn insert_or_get(&self, id: &StoredIdentity) -> Result<StoredIdentity> {
        self.conn.execute(
            "INSERT OR IGNORE INTO svc_identity (singleton, identity, cipher_suite, public_key, secret_key)
             VALUES (1, ?1, ?2, ?3, ?4)",
            rusqlite::params![id.identity, id.cipher_suite, id.public_key, id.secret_key],
        )?;
        self.load()?
            .ok_or_else(|| EngineError::Storage("identity row vanished after insert".into()))
    }
}

impl IdentityStore {
    /// The agent credential last installed (encoded), if any.
    pub fn credential(&self) -> Result<Option<Vec<u8>>> {
        Ok(self
            .conn
            .query_row("SELECT credential FROM svc_credential WHERE singleton = 1", [], |row| {
                row.get(0)
            })
            .optional()?)
    }

    pub fn set_credential(&self, credential: &[u8]) -> Result<()> {
        self.conn.execute(
            "INSERT INTO svc_credential (singleton, credential) VALUES (1, ?1)
             ON CONFLICT (singleton) DO UPDATE SET credential = excluded.credential",
            [credential],
        )?;
        Ok(())
    }

    /// The issuer keys last fetched from the account API, by kid.
    pub fn anchors(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut stmt = self
            .conn
            .prepare("SELECT kid, key FROM svc_trust_anchor ORDER BY kid")?;
        let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    /// Replaces the stored issuer keys in one transaction.
    pub fn set_anchors(&mut self, anchors: &[(String, Vec<u8>)]) -> Result<()> {
        let tx = self.conn.transaction()?;
        tx.execute("DELETE FROM svc_trust_anchor", [])?;
        for (kid, key) in anchors {
            tx.execute(
                "INSERT INTO svc_trust_anchor (kid, key) VALUES (?1, ?2)",
                rusqlite::params![kid, key],
            )?;
        }
        tx.commit()?;
        Ok(())
    }
}
