//! The chunked transfer coding as the event connections write it (`event_connection.rs`, and the feeds for
//! them, `feed.rs`): a chunk per batch of frames (its size line, the frames, the CRLF), written straight from
//! the frames in one vectored write, and the last chunk that ends the body.
//!
//! The writes go to the socket itself (`try_write_vectored`), not through an `AsyncWrite`: a feed writes
//! for many connections from one task, so it must never wait for one of them ([`try_write`] hands back
//! what the socket did not take); a connection waits for its socket's readiness itself ([`write`],
//! [`write_all_to`]).

use std::io::{self, IoSlice};

use bytes::Bytes;
use tokio::net::TcpStream;

/// The most frames one chunk holds: what one vectored write takes of a batch (see `event_connection.rs`).
pub(crate) const GATHERED_FRAMES: usize = 16;

/// The chunk that ends a chunked body.
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// A chunk's size line (hexadecimal, then CRLF), written on the stack: one per frame sent.
#[derive(Default)]
pub(crate) struct ChunkSize([u8; 18]);

impl ChunkSize {
    /// The size line of a chunk of `len` bytes.
    pub(crate) fn of(&mut self, len: usize) -> &[u8] {
        let digits = (usize::BITS - len.leading_zeros()).div_ceil(4).max(1) as usize;
        for (i, byte) in self.0[..digits].iter_mut().enumerate() {
            let nibble = (len >> (4 * (digits - 1 - i))) & 0xf;
            *byte = b"0123456789abcdef"[nibble];
        }
        self.0[digits..digits + 2].copy_from_slice(b"\r\n");
        &self.0[..digits + 2]
    }
}

/// `pieces` (at most [`GATHERED_FRAMES`]) as one chunk in `slices`: its size line, the pieces, the CRLF.
/// The count of slices used; none when the pieces hold no bytes (an empty chunk would end the body).
pub(crate) fn frame<'a>(
    size: &'a mut ChunkSize,
    pieces: &'a [Bytes],
    slices: &mut [IoSlice<'a>; GATHERED_FRAMES + 2],
) -> usize {
    let bytes: usize = pieces.iter().map(Bytes::len).sum();
    if bytes == 0 {
        return 0;
    }
    slices[0] = IoSlice::new(size.of(bytes));
    for (slice, piece) in slices[1..].iter_mut().zip(pieces) {
        *slice = IoSlice::new(piece);
    }
    slices[pieces.len() + 1] = IoSlice::new(b"\r\n");
    pieces.len() + 2
}

/// Writes `frames` (at most [`GATHERED_FRAMES`]) as one chunk, waiting for the socket to take it.
pub(crate) async fn write(tcp: &TcpStream, frames: &[Bytes]) -> io::Result<()> {
    let mut size = ChunkSize::default();
    let mut slices = [IoSlice::new(&[]); GATHERED_FRAMES + 2];
    let count = frame(&mut size, frames, &mut slices);
    write_all_to(tcp, &mut slices[..count]).await
}

/// Writes `pieces` in chunked encoding (a chunk per [`GATHERED_FRAMES`] pieces) as far as the socket takes
/// them now, without waiting: `Err` with the framed bytes it did not take, which the connection sends
/// itself (all of them after an error, which its own write then meets).
pub(crate) fn try_write(tcp: &TcpStream, pieces: &[Bytes]) -> Result<(), Vec<Bytes>> {
    let mut groups = pieces.chunks(GATHERED_FRAMES);
    while let Some(group) = groups.next() {
        let mut size = ChunkSize::default();
        let mut slices = [IoSlice::new(&[]); GATHERED_FRAMES + 2];
        let count = frame(&mut size, group, &mut slices);
        let total: usize = slices[..count].iter().map(|slice| slice.len()).sum();
        let written = tcp.try_write_vectored(&slices[..count]).unwrap_or(0);
        if written < total {
            let mut skip = written;
            let mut rest = Vec::new();
            for group in std::iter::once(group).chain(groups) {
                let bytes: usize = group.iter().map(Bytes::len).sum();
                if bytes == 0 {
                    continue;
                }
                let head = Bytes::copy_from_slice(ChunkSize::default().of(bytes));
                let parts = std::iter::once(head).chain(group.iter().cloned()).chain([Bytes::from_static(b"\r\n")]);
                skip = unwritten(parts, skip, &mut rest);
            }
            return Err(rest);
        }
    }
    Ok(())
}

/// Puts into `rest` what of `parts` a write that took `written` bytes of them left (the first one cut where
/// the write stopped); returns what of `written` is left to skip in the parts that follow (0 once one was
/// cut).
pub(crate) fn unwritten(parts: impl IntoIterator<Item = Bytes>, mut written: usize, rest: &mut Vec<Bytes>) -> usize {
    for part in parts {
        if written >= part.len() {
            written -= part.len();
        } else {
            rest.push(part.slice(written..));
            written = 0;
        }
    }
    written
}

/// Writes every byte of `slices` to `tcp`, waiting for it to take them.
pub(crate) async fn write_all_to(tcp: &TcpStream, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !slices.is_empty() {
        match tcp.try_write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => IoSlice::advance_slices(&mut slices, written),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => tcp.writable().await?,
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ChunkSize;

    #[test]
    fn a_chunk_size_line_is_its_length_in_hexadecimal() {
        for len in [0, 1, 9, 10, 255, 256, 4096, 23_456, usize::MAX] {
            let mut size = ChunkSize::default();
            assert_eq!(size.of(len), format!("{len:x}\r\n").as_bytes(), "{len}");
        }
    }
}
