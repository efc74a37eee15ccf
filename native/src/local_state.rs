//! The client's own database in `data_dir` (`client.sqlite3`): the channels it is in,
//! each one's relay cursor, and the inbox of decrypted messages not yet handed to the
//! application. svc_sdk.local_state documents the semantics; this is its storage.
//!
//! It lives in the extension, not in Python's `sqlite3`, because the standard library's
//! SQLite cannot be keyed: here it links the same SQLCipher as the engine and opens the
//! file under the data_dir's state key (state_key.rs). The schema is the one the Python
//! module used, so existing data_dirs open unchanged.

use std::path::Path;

use rusqlite::{params, Connection};

use crate::checkpoints::{pages_for, Checkpointer};
use crate::data_dir;
use crate::error::{EngineError, Result};
use crate::state_key::{self, StateKey, CLIENT_FILE};
use crate::storage::{self, SharedConnection};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS channels (
    name TEXT PRIMARY KEY,
    cursor INTEGER NOT NULL,
    joined_epoch INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS inbox (
    channel TEXT NOT NULL,
    seq INTEGER NOT NULL,
    sender BLOB NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (channel, seq)
);";

/// One stored message: (seq, sender, payload).
pub type InboxRow = (i64, Vec<u8>, Vec<u8>);

pub struct LocalStore {
    conn: SharedConnection,
    checkpoints: Checkpointer,
}

impl LocalStore {
    /// Opens (creating 0600 if missing) `data_dir/client.sqlite3` under `key`.
    pub fn open(data_dir: &Path, key: Option<&StateKey>) -> Result<Self> {
        let path = data_dir.join(CLIENT_FILE);
        state_key::check(&path, key)?;
        // Created 0600 and exclusively before SQLite opens it; a file that exists already
        // was checked (ours, private) when the engine took data_dir.
        let sidecars = state_key::NewSidecars::watch(data_dir);
        data_dir::private_file(data_dir, CLIENT_FILE)?;
        let conn = Self::connect(&path, key).map_err(|e| EngineError::DataDir {
            path: data_dir.display().to_string(),
            detail: format!("{CLIENT_FILE} is not a usable database ({e})"),
        })?;
        sidecars.keep();
        let conn = storage::shared(conn);
        let checkpoints = Self::connect(&path, key).map_err(EngineError::from).and_then(|own| {
            Checkpointer::start(own, conn.clone())
                .map_err(|e| EngineError::Storage(format!("cannot start the checkpoint thread: {e}")))
        })?;
        Ok(Self { conn, checkpoints })
    }

    fn connect(path: &Path, key: Option<&StateKey>) -> rusqlite::Result<Connection> {
        let conn = Connection::open(path)?;
        state_key::apply(&conn, key)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // Inbox rows are written and deleted again once read: as for the group store,
        // checkpoints run on a thread (checkpoints.rs), not in the reading thread.
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        conn.execute_batch(SCHEMA)?;
        Ok(conn)
    }

    /// Runs `f` on the connection; `Closed` once the store was closed (the client was).
    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T> {
        let mut conn = storage::lock(&self.conn)?;
        Ok(f(&mut conn)?)
    }

    /// Runs the write `f`, then counts the WAL pages of about `bytes` it wrote.
    fn write<T>(&self, bytes: usize, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T> {
        let done = self.with(f)?;
        self.checkpoints.wrote(pages_for(bytes));
        Ok(done)
    }

    pub fn close(&self) {
        storage::close(&self.conn);
        self.checkpoints.stop();
    }

    /// (name, cursor, joined_epoch) of every channel.
    pub fn channels(&self) -> Result<Vec<(String, i64, i64)>> {
        self.with(|c| {
            let mut stmt = c.prepare("SELECT name, cursor, joined_epoch FROM channels")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            rows.collect()
        })
    }

    pub fn add_channel(&self, name: &str, cursor: i64, joined_epoch: i64) -> Result<()> {
        self.write(0, |c| {
            c.execute(
                "INSERT OR REPLACE INTO channels VALUES (?1, ?2, ?3)",
                params![name, cursor, joined_epoch],
            )
            .map(drop)
        })
    }

    pub fn remove_channel(&self, name: &str) -> Result<()> {
        self.write(0, |c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM inbox WHERE channel = ?1", [name])?;
            tx.execute("DELETE FROM channels WHERE name = ?1", [name])?;
            tx.commit()
        })
    }

    /// Stores the rows `(seq, sender, payload)` and the new cursor in one transaction.
    pub fn advance(&self, name: &str, cursor: i64, received: &[(i64, &[u8], &[u8])]) -> Result<()> {
        let bytes = received
            .iter()
            .map(|(_, sender, payload)| sender.len() + payload.len())
            .sum();
        self.write(bytes, |c| {
            let tx = c.transaction()?;
            {
                let mut insert = tx.prepare_cached("INSERT OR IGNORE INTO inbox VALUES (?1, ?2, ?3, ?4)")?;
                for (seq, sender, payload) in received {
                    insert.execute(params![name, seq, sender, payload])?;
                }
            }
            tx.execute(
                "UPDATE channels SET cursor = MAX(cursor, ?1) WHERE name = ?2",
                params![cursor, name],
            )?;
            tx.commit()
        })
    }

    /// Stored messages after `after`, in order, at most `limit` of them (None: all).
    pub fn inbox(&self, name: &str, after: i64, limit: Option<i64>) -> Result<Vec<InboxRow>> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT seq, sender, payload FROM inbox WHERE channel = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
            )?;
            let rows = stmt.query_map(params![name, after, limit.unwrap_or(-1)], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
            rows.collect()
        })
    }

    /// How many stored messages come after `after`.
    pub fn inbox_count(&self, name: &str, after: i64) -> Result<i64> {
        self.with(|c| {
            c.prepare_cached("SELECT count(*) FROM inbox WHERE channel = ?1 AND seq > ?2")?
                .query_row(params![name, after], |r| r.get(0))
        })
    }

    /// The application took every message up to `through_seq` and those numbered
    /// `extra`; the channel was handled through `cursor`.
    pub fn consumed(&self, name: &str, through_seq: i64, extra: &[i64], cursor: i64) -> Result<()> {
        self.write(0, |c| {
            let tx = c.transaction()?;
            if through_seq > 0 {
                tx.execute(
                    "DELETE FROM inbox WHERE channel = ?1 AND seq <= ?2",
                    params![name, through_seq],
                )?;
            }
            {
                let mut delete = tx.prepare_cached("DELETE FROM inbox WHERE channel = ?1 AND seq = ?2")?;
                for seq in extra {
                    delete.execute(params![name, seq])?;
                }
            }
            tx.execute(
                "UPDATE channels SET cursor = MAX(cursor, ?1) WHERE name = ?2",
                params![cursor, name],
            )?;
            tx.commit()
        })
    }
}
