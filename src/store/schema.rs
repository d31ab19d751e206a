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
    // 4: chunks in a rowid table, found through an index on (stream, first). A chunk is a commit's entries of
    // a stream (a 128-message POST is about 23 KB), far larger than a page: as a WITHOUT ROWID table, whose
    // rows are the keys of its b-tree, every insert compared its key with neighbouring rows by reading
    // them whole, overflow pages and all (about 40 page reads, 160 KB, for each 23 KB chunk written).
    // Rowid tables append and compare nothing but the small index entry.
    "CREATE TABLE chunks_by_rowid (
        stream TEXT NOT NULL,
        first INTEGER NOT NULL,
        last INTEGER NOT NULL,
        messages TEXT NOT NULL
    );
    INSERT INTO chunks_by_rowid (stream, first, last, messages)
        SELECT stream, first, last, messages FROM chunks ORDER BY stream, first;
    DROP TABLE chunks;
    ALTER TABLE chunks_by_rowid RENAME TO chunks;
    CREATE UNIQUE INDEX chunks_by_stream ON chunks (stream, first);",
    // 5: a chunk's length as lines, since long chunks are kept compressed (`chunk.rs`): what a stream's
    // entries count at start, and what a compressed value must decompress to. Rows from before are text,
    // whose length is their own.
    "ALTER TABLE chunks ADD COLUMN bytes INTEGER;",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_written_before_versions_4_and_5_are_read_the_same_after_them() {
        let connection = Connection::open_in_memory().expect("open");
        for migration in &MIGRATIONS[..3] {
            connection.execute_batch(migration).expect("migrate to 3");
        }
        connection.pragma_update(None, "user_version", 3).expect("version");
        for (stream, first, last) in [("b", 1, 128), ("a", 129, 130), ("a", 1, 128), ("b", 129, 129)] {
            let messages = format!("{stream}:{first}..{last}");
            connection
                .execute(
                    "INSERT INTO chunks (stream, first, last, messages) VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![stream, first, last, messages],
                )
                .expect("insert");
        }
        migrate(&connection).expect("migrate to the latest");
        let version: i64 = connection.pragma_query_value(None, "user_version", |r| r.get(0)).expect("version");
        assert_eq!(version, MIGRATIONS.len() as i64);
        // Read as the store reads them (`chunk.rs`): rows from before 5 are text, with no `bytes`.
        let mut statement =
            connection.prepare("SELECT messages, bytes FROM chunks WHERE stream = ?1 ORDER BY first").expect("select");
        let mut read = |stream: &str| -> Vec<String> {
            let lines =
                |r: &rusqlite::Row<'_>| Ok(super::super::chunk::lines(r.get_ref(0)?, r.get(1)?).map(String::from));
            statement.query_map([stream], lines).expect("query").map(|r| r.expect("row").expect("text")).collect()
        };
        assert_eq!(read("a"), ["a:1..128", "a:129..130"]);
        assert_eq!(read("b"), ["b:1..128", "b:129..129"]);
        // One row per (stream, first), as before: a chunk written again replaces the first.
        connection
            .execute("INSERT OR REPLACE INTO chunks (stream, first, last, messages) VALUES ('a', 1, 128, 'again')", [])
            .expect("replace");
        assert_eq!(read("a"), ["again", "a:129..130"]);
        let plan: String = connection
            .query_row("EXPLAIN QUERY PLAN SELECT messages FROM chunks WHERE stream = 'a' AND first >= 2", [], |r| {
                r.get(3)
            })
            .expect("plan");
        assert!(plan.contains("chunks_by_stream"), "found through the index: {plan}");
    }
}
