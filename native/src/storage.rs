//! The agent's `data_dir`: one SQLite file holding the signing identity, group state,
//! prior-epoch secrets and key-package secrets, private to the agent's user.

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

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

/// Creates mls-rs's own tables (`mls_group`, `epoch`, `key_package`), or migrates them,
/// through its provider's schema; the group store and key packages write them.
pub fn migrate(db: &Path, key: Option<&StateKey>) -> Result<()> {
    storage_engine(db, key)
        .group_state_storage()
        .map_err(|e| EngineError::Storage(format!("mls-rs schema: {e}")))?;
    Ok(())
}

/// One connection shared by every clone of a store (mls-rs clones the storage into each
/// group), which `close` takes from all of them at once.
pub(crate) type SharedConnection = Arc<Mutex<Option<Connection>>>;

pub(crate) fn shared(conn: Connection) -> SharedConnection {
    Arc::new(Mutex::new(Some(conn)))
}

/// The shared connection, locked; `Closed` once it was taken.
pub(crate) fn lock(conn: &SharedConnection) -> Result<Locked<'_>> {
    let guard = conn.lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        return Err(EngineError::Closed);
    }
    Ok(Locked(guard))
}

/// Takes the connection away (it closes once no statement uses it).
pub(crate) fn close(conn: &SharedConnection) {
    conn.lock().unwrap_or_else(|p| p.into_inner()).take();
}

pub(crate) struct Locked<'a>(MutexGuard<'a, Option<Connection>>);

impl Deref for Locked<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.0.as_ref().expect("checked by lock()")
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.0.as_mut().expect("checked by lock()")
    }
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
    conn: Option<Connection>,
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
        Ok(Self { conn: Some(conn) })
    }

    /// Closes the connection: later calls fail with `Closed`.
    pub fn close(&mut self) {
        self.conn = None;
    }

    fn conn(&self) -> Result<&Connection> {
        self.conn.as_ref().ok_or(EngineError::Closed)
    }

    pub fn load(&self) -> Result<Option<StoredIdentity>> {
        Ok(self
            .conn()?
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
        self.conn()?.execute(
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
            .conn()?
            .query_row("SELECT credential FROM svc_credential WHERE singleton = 1", [], |row| {
                row.get(0)
            })
            .optional()?)
    }

    pub fn set_credential(&self, credential: &[u8]) -> Result<()> {
        self.conn()?.execute(
            "INSERT INTO svc_credential (singleton, credential) VALUES (1, ?1)
             ON CONFLICT (singleton) DO UPDATE SET credential = excluded.credential",
            [credential],
        )?;
        Ok(())
    }

    /// The issuer keys last fetched from the account API, by kid.
    pub fn anchors(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare("SELECT kid, key FROM svc_trust_anchor ORDER BY kid")?;
        let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    /// Replaces the stored issuer keys in one transaction.
    pub fn set_anchors(&mut self, anchors: &[(String, Vec<u8>)]) -> Result<()> {
        let tx = self.conn.as_mut().ok_or(EngineError::Closed)?.transaction()?;
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
