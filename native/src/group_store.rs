//! Where groups persist: mls-rs's group tables, and each group's outbox beside them.
//!
//! The outbox holds what the agent encrypted and the delivery service has not
//! acknowledged yet. A message's row is written in the same SQLite transaction as the
//! ratchet state that encrypted it: after a crash either both exist (the message goes out
//! on restart) or neither (its key generation was never stored as used, so no
//! ciphertext under it can have left the process). One write per send instead of two.
//!
//! The group tables are mls-rs's own (`mls_group`, `epoch`; created by
//! mls-rs-provider-sqlite's migration), written here the way its
//! `SqLiteGroupStateStorage` writes them, plus the staged outbox rows.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use mls_rs_core::group::{EpochRecord, GroupState, GroupStateStorage};
use rusqlite::{params, OptionalExtension};
use zeroize::Zeroizing;

use crate::checkpoints::{pages_for, Checkpointer};
use crate::error::{EngineError, Result};
use crate::key_packages::KeyPackages;
use crate::storage::{self, Locked, SharedConnection};

/// How many prior epochs a group keeps, as mls-rs-provider-sqlite's default.
const EPOCH_RETENTION: u64 = 3;

// A rowid table: its rows (payload and ciphertext) are far larger than the 1/20 of a
// page that suits WITHOUT ROWID, where they would spread the key's B-tree over overflow
// chains and cost every insert and delete more page writes.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS svc_outbox (
    group_id BLOB NOT NULL,
    pos INTEGER NOT NULL,
    id BLOB NOT NULL,
    epoch INTEGER NOT NULL,
    payload BLOB NOT NULL,
    ciphertext BLOB NOT NULL,
    UNIQUE (group_id, pos)
);";

/// Data dirs written before the rowid layout hold a WITHOUT ROWID `svc_outbox`: in one
/// transaction it is renamed, the new table created ([`SCHEMA`]) and the rows moved.
const MIGRATE_RENAME: &str = "ALTER TABLE svc_outbox RENAME TO svc_outbox_without_rowid;";
const MIGRATE_MOVE: &str = "INSERT INTO svc_outbox (group_id, pos, id, epoch, payload, ciphertext)
        SELECT group_id, pos, id, epoch, payload, ciphertext FROM svc_outbox_without_rowid ORDER BY group_id, pos;
    DROP TABLE svc_outbox_without_rowid;";

/// A release kept only the plaintext in each row (a restart encrypted it again, which
/// cost receivers a generation per message the relay already had). Its rows come back
/// with an empty ciphertext, which the client encrypts before it sends them.
const MIGRATE_ADD_CIPHERTEXT: &str = "ALTER TABLE svc_outbox ADD COLUMN ciphertext BLOB NOT NULL DEFAULT x'';";

/// One outbox row: its position in send order, the message id the relay dedupes by,
/// the epoch it was encrypted in, the plaintext (re-encrypted if that epoch goes stale)
/// and the ciphertext to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    pub pos: u64,
    pub id: Vec<u8>,
    pub epoch: u64,
    pub payload: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

/// Shared by every group of one engine (mls-rs clones it into each group).
#[derive(Clone)]
pub struct GroupStore {
    conn: SharedConnection,
    checkpoints: Arc<Checkpointer>,
    key_packages: KeyPackages,
    /// Rows to write with the next state write of their group, by group id. Only a
    /// caller holding that group's lock stages rows, so no other write of the group can
    /// take them.
    staged: Arc<Mutex<HashMap<Vec<u8>, Vec<OutboxRow>>>>,
}

fn int(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| EngineError::Storage(format!("{v} does not fit SQLite's INTEGER")))
}

impl GroupStore {
    /// Opens the store on `db`, where mls-rs's migration has created its tables.
    pub fn open(db: &Path, key: Option<&crate::state_key::StateKey>) -> Result<Self> {
        let mut conn = crate::storage::open_connection(db, key)?;
        let without_rowid: Option<bool> = conn
            .query_row(
                "SELECT sql LIKE '%WITHOUT ROWID%' FROM sqlite_master WHERE type = 'table' AND name = 'svc_outbox'",
                [],
                |row| row.get(0),
            )
            .optional()?;
        if without_rowid == Some(true) {
            let tx = conn.transaction()?;
            tx.execute_batch(MIGRATE_RENAME)?;
            tx.execute_batch(SCHEMA)?;
            tx.execute_batch(MIGRATE_MOVE)?;
            tx.commit()?;
        }
        // Columns of the existing table (0: none yet), and whether one is the ciphertext.
        let (columns, ciphertext): (i64, i64) = conn.query_row(
            "SELECT count(*), coalesce(sum(name = 'ciphertext'), 0) FROM pragma_table_info('svc_outbox')",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?;
        if columns > 0 && ciphertext == 0 {
            conn.execute_batch(MIGRATE_ADD_CIPHERTEXT)?;
        }
        conn.execute_batch(SCHEMA)?;
        // Not inside a send (two fsyncs, 20–40 ms every few thousand sends): on a thread.
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        let conn = storage::shared(conn);
        let checkpoints = Checkpointer::start(crate::storage::open_connection(db, key)?, conn.clone())
            .map_err(|e| EngineError::Storage(format!("cannot start the checkpoint thread: {e}")))?;
        let checkpoints = Arc::new(checkpoints);
        Ok(Self {
            key_packages: KeyPackages::new(conn.clone(), checkpoints.clone()),
            conn,
            checkpoints,
            staged: Arc::default(),
        })
    }

    fn conn(&self) -> Result<Locked<'_>> {
        storage::lock(&self.conn)
    }

    /// Ends the checkpoint thread after a last checkpoint and closes the connection, for
    /// every clone of the store: later reads and writes fail with `Closed`.
    pub fn close(&self) {
        self.checkpoints.stop();
        storage::close(&self.conn);
    }

    /// The key package storage for this store's clients (one set of deleted ids for all).
    pub fn key_packages(&self) -> KeyPackages {
        self.key_packages.clone()
    }

    fn staged(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Vec<OutboxRow>>> {
        self.staged.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rows the next state write of `group_id` stores with it (replacing rows at the
    /// same positions). Caller holds the group's lock and calls [`unstage`] after the
    /// write, whether it succeeded or not.
    pub(crate) fn stage(&self, group_id: &[u8], rows: Vec<OutboxRow>) {
        self.staged().insert(group_id.to_vec(), rows);
    }

    /// Takes back the rows staged for `group_id` (the caller's ciphertexts, uncopied).
    pub(crate) fn unstage(&self, group_id: &[u8]) -> Option<Vec<OutboxRow>> {
        self.staged().remove(group_id)
    }

    /// The group's unacknowledged messages, in send order.
    pub fn outbox(&self, group_id: &[u8]) -> Result<Vec<OutboxRow>> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(
            "SELECT pos, id, epoch, payload, ciphertext FROM svc_outbox WHERE group_id = ?1 ORDER BY pos",
        )?;
        let rows = stmt.query_map([group_id], |row| {
            Ok(OutboxRow {
                pos: row.get::<_, i64>(0)? as u64,
                id: row.get(1)?,
                epoch: row.get::<_, i64>(2)? as u64,
                payload: row.get(3)?,
                ciphertext: row.get(4)?,
            })
        })?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    /// Deletes the rows up to `through` (acknowledged, or given up on).
    pub fn retire(&self, group_id: &[u8], through: u64) -> Result<()> {
        let deleted = self
            .conn()?
            .prepare_cached("DELETE FROM svc_outbox WHERE group_id = ?1 AND pos <= ?2")?
            .execute(params![group_id, int(through)?])?;
        // Freed rows change the pages that list free pages, not each freed page.
        self.checkpoints.wrote(pages_for(0) + deleted as u64 / 8);
        Ok(())
    }

    pub fn group_ids(&self) -> Result<Vec<Vec<u8>>> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare("SELECT group_id FROM mls_group")?;
        let ids = stmt.query_map([], |row| row.get(0))?;
        Ok(ids.collect::<std::result::Result<_, _>>()?)
    }

    /// Deletes a group's state, prior epochs and outbox in one transaction.
    pub fn delete_group(&self, group_id: &[u8]) -> Result<()> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        tx.execute("DELETE FROM svc_outbox WHERE group_id = ?1", [group_id])?;
        tx.execute("DELETE FROM epoch WHERE group_id = ?1", [group_id])?;
        tx.execute("DELETE FROM mls_group WHERE group_id = ?1", [group_id])?;
        tx.commit()?;
        self.checkpoints.wrote(pages_for(0));
        Ok(())
    }

    fn write_state(&self, state: &GroupState, inserts: &[EpochRecord], updates: &[EpochRecord]) -> Result<()> {
        // Held through the write instead of copying the rows out: always taken before
        // `conn`, never the other way round.
        let staged = self.staged();
        let staged = staged.get(&state.id);
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        tx.prepare_cached(
            "INSERT INTO mls_group (group_id, snapshot) VALUES (?1, ?2)
             ON CONFLICT(group_id) DO UPDATE SET snapshot = excluded.snapshot",
        )?
        .execute(params![state.id, &*state.data])?;
        let mut bytes = state.data.len();
        let mut newest = None;
        for epoch in inserts {
            bytes += epoch.data.len();
            newest = Some(epoch.id);
            tx.prepare_cached("INSERT INTO epoch (group_id, epoch_id, epoch_data) VALUES (?1, ?2, ?3)")?
                .execute(params![state.id, int(epoch.id)?, &*epoch.data])?;
        }
        for epoch in updates {
            bytes += epoch.data.len();
            tx.prepare_cached("UPDATE epoch SET epoch_data = ?1 WHERE group_id = ?2 AND epoch_id = ?3")?
                .execute(params![&*epoch.data, state.id, int(epoch.id)?])?;
        }
        if let Some(newest) = newest.filter(|n| *n >= EPOCH_RETENTION) {
            tx.prepare_cached("DELETE FROM epoch WHERE group_id = ?1 AND epoch_id <= ?2")?
                .execute(params![state.id, int(newest - EPOCH_RETENTION)?])?;
        }
        for row in staged.into_iter().flatten() {
            bytes += row.payload.len() + row.ciphertext.len();
            tx.prepare_cached(
                "INSERT OR REPLACE INTO svc_outbox (group_id, pos, id, epoch, payload, ciphertext)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                state.id,
                int(row.pos)?,
                row.id,
                int(row.epoch)?,
                row.payload,
                row.ciphertext
            ])?;
        }
        tx.commit()?;
        self.checkpoints.wrote(pages_for(bytes));
        Ok(())
    }
}

impl GroupStateStorage for GroupStore {
    type Error = EngineError;

    fn state(&self, group_id: &[u8]) -> Result<Option<Zeroizing<Vec<u8>>>> {
        Ok(self
            .conn()?
            .prepare_cached("SELECT snapshot FROM mls_group WHERE group_id = ?1")?
            .query_row([group_id], |row| row.get::<_, Vec<u8>>(0))
            .optional()?
            .map(Zeroizing::new))
    }

    fn epoch(&self, group_id: &[u8], epoch_id: u64) -> Result<Option<Zeroizing<Vec<u8>>>> {
        Ok(self
            .conn()?
            .prepare_cached("SELECT epoch_data FROM epoch WHERE group_id = ?1 AND epoch_id = ?2")?
            .query_row(params![group_id, int(epoch_id)?], |row| row.get::<_, Vec<u8>>(0))
            .optional()?
            .map(Zeroizing::new))
    }

    fn write(&mut self, state: GroupState, inserts: Vec<EpochRecord>, updates: Vec<EpochRecord>) -> Result<()> {
        self.write_state(&state, &inserts, &updates)
    }

    fn max_epoch_id(&self, group_id: &[u8]) -> Result<Option<u64>> {
        let max: Option<i64> = self
            .conn()?
            .prepare_cached("SELECT MAX(epoch_id) FROM epoch WHERE group_id = ?1")?
            .query_row([group_id], |row| row.get(0))?;
        Ok(max.map(|v| v as u64))
    }
}
