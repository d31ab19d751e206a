//! The store's schema and its migrations, versioned by SQLite's `user_version`: each migration runs once,
//! in order, in one transaction with the version it brings, so a store opened by a newer agentmux is brought
//! up to date at start, and one from an agentmux newer than this one is refused rather than misread.

use rusqlite::Connection;

/// The migrations, in order: migration `i` brings the store to version `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: streams and their entries (a row per run of consecutive entries a commit wrote, one JSON message
    // per line); threads and their audit log.
    "CREATE TABLE streams (
        id TEXT PRIMARY KEY,
        epoch TEXT NOT NULL,
        model TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        client TEXT,
        outcome TEXT,
        ended_ms INTEGER
    );
    CREATE TABLE chunks (
        stream TEXT NOT NULL,
        first INTEGER NOT NULL,
        last INTEGER NOT NULL,
        messages TEXT NOT NULL,
        PRIMARY KEY (stream, first)
    ) WITHOUT ROWID;
    CREATE TABLE threads (
        id TEXT PRIMARY KEY,
        created_ms INTEGER NOT NULL,
        used_ms INTEGER NOT NULL,
        pending TEXT NOT NULL
    );
    CREATE TABLE audit (
        thread TEXT NOT NULL,
        position INTEGER NOT NULL,
        entry TEXT NOT NULL,
        PRIMARY KEY (thread, position)
    ) WITHOUT ROWID;",
    // 2: the service's secrets (the key stream tokens are signed with), so tokens outlive a restart.
    "CREATE TABLE secrets (
        name TEXT PRIMARY KEY,
        value BLOB NOT NULL
    ) WITHOUT ROWID;",
    // 3: the API key (by name) a thread belongs to, with keys configured.
    "ALTER TABLE threads ADD COLUMN owner TEXT;",
];

/// Brings the store to the latest version.
pub(crate) fn migrate(connection: &Connection) -> rusqlite::Result<()> {
    let version: i64 = connection.pragma_query_value(None, "user_version", |row| row.get(0))?;
    let latest = MIGRATIONS.len() as i64;
    if version > latest {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "the store is at schema version {version}, newer than this agentmux knows ({latest})"
        )));
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        let tx = connection.unchecked_transaction()?;
        tx.execute_batch(migration)?;
        tx.pragma_update(None, "user_version", index as i64 + 1)?;
        tx.commit()?;
    }
    Ok(())
}
