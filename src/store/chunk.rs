//! How a chunk's lines are kept in its row: as text when short, compressed (LZ4) when long.
//!
//! A chunk is a commit's entries of one stream, one compact JSON message per line. A producer's batch makes
//! a chunk of tens of kilobytes, and a commit writes every page of it to the write-ahead log (a page and a
//! frame header each: two `pwrite`s per 4 KiB), then a checkpoint copies each page into the file again.
//! Those writes are most of what a commit costs, and a producer that waits for its acknowledgement waits
//! for them: with the lines cut to a sixth, a 128-message commit went from 142 to 99 µs and fan-out to 100
//! subscribers behind such a producer from 0.91× to 0.99× of memory's (`docs/benchmarks-history.md`, session 13). JSON
//! lines of one stream repeat their keys and much of their values, so LZ4 (which compresses at memory
//! speed) keeps them in a fraction of the pages. A short chunk (one message per commit, a token stream's
//! usual) would save no page, so it is kept as text, readable as it is.
//!
//! The column's type tells the two apart (SQLite keeps a value's own type: text, or a blob); rows written
//! before chunks were compressed are text and read as before. A compressed value is the LZ4 block with the
//! uncompressed length in front (4 bytes, little-endian), which must equal the row's `bytes` column: a
//! value that decompresses to anything else is refused as corrupt rather than misread.

use std::borrow::Cow;

use rusqlite::ToSql;
use rusqlite::types::{ToSqlOutput, ValueRef};

/// Lines at least this long are compressed: below it a chunk fits in one page or two as it is.
const COMPRESS_FROM: usize = 1024;

/// A chunk's lines as bound to its row; see the module doc.
pub(crate) enum Stored<'a> {
    Text(&'a [u8]),
    Compressed(Vec<u8>),
}

impl<'a> Stored<'a> {
    /// `lines`: UTF-8 (serde_json writes it), one message per line.
    pub(crate) fn of(lines: &'a [u8]) -> Self {
        if lines.len() < COMPRESS_FROM {
            Stored::Text(lines)
        } else {
            Stored::Compressed(lz4_flex::block::compress_prepend_size(lines))
        }
    }
}

impl ToSql for Stored<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Stored::Text(lines) => ValueRef::Text(lines),
            Stored::Compressed(block) => ValueRef::Blob(block),
        }))
    }
}

/// A stored chunk that is not what was written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Corrupt {
    #[error("a chunk's text is not UTF-8")]
    Utf8,
    #[error("a compressed chunk does not decompress: {0}")]
    Block(String),
    #[error("a compressed chunk holds {found} bytes where its row says {expected}")]
    Length { found: u64, expected: u64 },
    #[error("a chunk is neither text nor a blob")]
    Type,
}

/// The lines of a stored chunk; `bytes`: its row's `bytes` column (`None` in rows from before it).
pub(crate) fn lines(value: ValueRef<'_>, bytes: Option<i64>) -> Result<Cow<'_, str>, Corrupt> {
    match value {
        ValueRef::Text(text) => std::str::from_utf8(text).map(Cow::Borrowed).map_err(|_| Corrupt::Utf8),
        ValueRef::Blob(block) => {
            let expected = bytes.unwrap_or(-1);
            let found = block.get(..4).map_or(0, |n| u32::from_le_bytes([n[0], n[1], n[2], n[3]]));
            // Checked before decompressing: the length in front is what the output is allocated to.
            if i64::from(found) != expected {
                return Err(Corrupt::Length { found: found.into(), expected: expected.max(0) as u64 });
            }
            let lines =
                lz4_flex::block::decompress_size_prepended(block).map_err(|error| Corrupt::Block(error.to_string()))?;
            String::from_utf8(lines).map(Cow::Owned).map_err(|_| Corrupt::Utf8)
        }
        _ => Err(Corrupt::Type),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(n: usize) -> String {
        (1..=n)
            .map(|i| format!(r#"{{"type":"text","props":{{"content":"word {i}"}},"metadata":{{"sequence":{i}}}}}"#))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn round_trip(lines: &str) -> (bool, String) {
        let connection = rusqlite::Connection::open_in_memory().expect("open");
        connection.execute_batch("CREATE TABLE t (messages TEXT NOT NULL, bytes INTEGER)").expect("table");
        let stored = Stored::of(lines.as_bytes());
        connection
            .execute("INSERT INTO t VALUES (?1, ?2)", rusqlite::params![stored, lines.len() as i64])
            .expect("insert");
        connection
            .query_row("SELECT messages, bytes, typeof(messages) FROM t", [], |row| {
                let read = lines_of(row.get_ref(0)?, row.get(1)?);
                Ok((row.get::<_, String>(2)? == "blob", read))
            })
            .expect("select")
    }

    fn lines_of(value: ValueRef<'_>, bytes: Option<i64>) -> String {
        lines(value, bytes).expect("lines").into_owned()
    }

    #[test]
    fn a_long_chunk_is_kept_compressed_and_read_back_whole() {
        let lines = chunk(128);
        let (compressed, read) = round_trip(&lines);
        assert!(compressed, "a 128-message chunk is a blob");
        assert_eq!(read, lines);
        let Stored::Compressed(block) = Stored::of(lines.as_bytes()) else { panic!("compressed") };
        assert!(block.len() * 3 < lines.len(), "{} bytes kept for {}", block.len(), lines.len());
    }

    #[test]
    fn a_short_chunk_is_kept_as_text() {
        let lines = chunk(1);
        assert_eq!(round_trip(&lines), (false, lines));
    }

    #[test]
    fn a_compressed_chunk_that_is_not_what_its_row_says_is_refused() {
        let text = chunk(64);
        let Stored::Compressed(mut block) = Stored::of(text.as_bytes()) else { panic!("compressed") };
        let len = text.len() as i64;
        assert!(matches!(lines_of_result(&block, Some(len + 1)), Err(Corrupt::Length { .. })));
        assert!(matches!(lines_of_result(&block, None), Err(Corrupt::Length { .. })));
        assert!(matches!(lines_of_result(&block[..3], Some(len)), Err(Corrupt::Length { .. })));
        let at = block.len() / 2;
        block.truncate(at);
        assert!(matches!(lines_of_result(&block, Some(len)), Err(Corrupt::Block(_))));
        assert!(matches!(lines(ValueRef::Integer(1), Some(len)), Err(Corrupt::Type)));
    }

    fn lines_of_result(block: &[u8], bytes: Option<i64>) -> Result<Cow<'_, str>, Corrupt> {
        lines(ValueRef::Blob(block), bytes)
    }
}
