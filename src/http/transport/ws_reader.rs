//! [`ClientFrames`]: the frames a WebSocket client sends, read from the connection's socket and parsed here
//! (RFC 6455 §5), and what cannot be read refused with the close code that fits ([`Refusal`]).
//!
//! The server writes its own frames itself (`ws.rs`, from the stream's renditions, which render each frame
//! whole: `crate::render::ws`), so all it needs of the protocol on the way in is this: a client's frames
//! are masked (one that is not breaks the protocol, 1002), control frames are whole and at most 125 bytes
//! (1002), a message may come in fragments (assembled here, never more than the limit: 1009), text is
//! UTF-8 (1007), binary messages are not spoken (1003), and a frame with a reserved bit or opcode set
//! breaks the protocol (1002).
//!
//! A connection waits for its client nearly all its life, so nothing is held for it while it waits: the
//! buffer is allocated when bytes come, grows only as far as a frame needs (a read of [`READ`] bytes at a
//! time), and is given back once everything in it was parsed.

use std::io;

use tokio::net::TcpStream;

/// The most one read takes: clients send small ops (a subscribe, a token's publish fit in a few hundred
/// bytes); a larger frame is read this much at a time, the buffer growing as it needs.
const READ: usize = 1 << 10;

/// What a client sent, whole.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// A text message, its fragments joined.
    Text(String),
    /// A ping, to be answered with a pong carrying its payload.
    Ping(Vec<u8>),
    /// A pong (the answer to a ping), or anything else that only says the client is there.
    Pong,
    /// The client closes, with its close frame's payload (its code and reason, if any), which a reply echoes.
    Close(Vec<u8>),
}

/// Why a client's frame could not be read: the close code and the reason sent to the client.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) code: u16,
    pub(crate) reason: String,
}

/// Close codes (RFC 6455 §7.4.1).
pub(crate) mod code {
    /// The stream ended.
    pub(crate) const NORMAL: u16 = 1000;
    /// The server is shutting down.
    pub(crate) const AWAY: u16 = 1001;
    /// The frame breaks the protocol.
    pub(crate) const PROTOCOL: u16 = 1002;
    /// A binary message.
    pub(crate) const UNSUPPORTED: u16 = 1003;
    /// Text that is not UTF-8.
    pub(crate) const INVALID: u16 = 1007;
    /// A client that answers no ping.
    pub(crate) const POLICY: u16 = 1008;
    /// A message over the limit.
    pub(crate) const SIZE: u16 = 1009;
}

/// Unmasks (or masks) `payload` with `mask` (RFC 6455 §5.3).
fn apply_mask(payload: &mut [u8], mask: [u8; 4]) {
    for (byte, key) in payload.iter_mut().zip(mask.iter().cycle()) {
        *byte ^= key;
    }
}

fn refuse(code: u16, reason: impl Into<String>) -> Refusal {
    Refusal { code, reason: reason.into() }
}

fn broken(why: &str) -> Refusal {
    refuse(code::PROTOCOL, format!("the frame breaks the WebSocket protocol: {why}"))
}

const CONTINUATION: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
pub(crate) const CLOSE: u8 = 0x8;
pub(crate) const PING: u8 = 0x9;
pub(crate) const PONG: u8 = 0xa;

/// A connection's reader of client frames; see the module doc.
#[derive(Debug)]
pub(crate) struct ClientFrames {
    /// Bytes read and not parsed yet (no allocation while there are none).
    buffer: Vec<u8>,
    /// The fragments of a text message not yet whole.
    message: Option<Vec<u8>>,
    /// The most a message may hold, in bytes.
    max: usize,
}

impl ClientFrames {
    /// A reader with `initial` bytes already read (what came after the upgrade request), taking messages of
    /// at most `max` bytes.
    pub(crate) fn new(initial: Vec<u8>, max: usize) -> Self {
        ClientFrames { buffer: initial, message: None, max }
    }

    /// Reads what the socket has now into the buffer: the bytes read (0: the client closed its side), or
    /// `WouldBlock` when there was nothing after all.
    pub(crate) fn read(&mut self, tcp: &TcpStream) -> io::Result<usize> {
        // Read on the stack, kept as long as it needs: a socket that is readable may have only its end to
        // give (the client went), and the buffer takes only what came.
        let mut chunk = [0u8; READ];
        let read = tcp.try_read(&mut chunk)?;
        self.buffer.extend_from_slice(&chunk[..read]);
        Ok(read)
    }

    /// Takes `bytes` the connection read itself.
    pub(crate) fn take(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole thing the client sent, if the buffer holds it (`Ok(None)`: read more first); a
    /// [`Refusal`] for what cannot be read, after which the connection closes.
    pub(crate) fn next(&mut self) -> Result<Option<Incoming>, Refusal> {
        loop {
            let Some((header, length)) = self.header()? else { return Ok(None) };
            let end = header.len + length;
            if self.buffer.len() < end {
                return Ok(None);
            }
            let mut payload = self.buffer[header.len..end].to_vec();
            apply_mask(&mut payload, header.mask);
            self.buffer.drain(..end);
            if self.buffer.is_empty() {
                // Given back while the client is quiet: see the module doc.
                self.buffer = Vec::new();
            }
            match header.opcode {
                CLOSE => return Ok(Some(Incoming::Close(payload))),
                PING => return Ok(Some(Incoming::Ping(payload))),
                PONG => return Ok(Some(Incoming::Pong)),
                _ => {}
            }
            let mut message = match self.message.take() {
                Some(mut message) => {
                    message.extend_from_slice(&payload);
                    message
                }
                None => payload,
            };
            if !header.fin {
                message.shrink_to_fit();
                self.message = Some(message);
                continue;
            }
            return match String::from_utf8(message) {
                Ok(text) => Ok(Some(Incoming::Text(text))),
                Err(_) => Err(refuse(code::INVALID, "a text frame is not valid UTF-8")),
            };
        }
    }

    /// The next frame's header and payload length once the buffer holds the header, checked.
    fn header(&self) -> Result<Option<(Header, usize)>, Refusal> {
        let buffer = &self.buffer;
        let [first, second, ..] = buffer[..] else { return Ok(None) };
        let (fin, opcode) = (first & 0x80 != 0, first & 0x0f);
        if first & 0x70 != 0 {
            return Err(broken("a reserved bit is set"));
        }
        let (length, at) = match second & 0x7f {
            126 => match buffer.get(2..4) {
                Some(bytes) => (u64::from(u16::from_be_bytes([bytes[0], bytes[1]])), 4),
                None => return Ok(None),
            },
            127 => match buffer.get(2..10).and_then(|bytes| <[u8; 8]>::try_from(bytes).ok()) {
                Some(bytes) => (u64::from_be_bytes(bytes), 10),
                None => return Ok(None),
            },
            short => (u64::from(short), 2),
        };
        match opcode {
            CLOSE | PING | PONG if !fin => return Err(broken("a control frame is fragmented")),
            CLOSE | PING | PONG if length > 125 => return Err(broken("a control frame is over 125 bytes")),
            CLOSE | PING | PONG => {}
            BINARY => return Err(refuse(code::UNSUPPORTED, "binary frames are not supported; send JSON text")),
            TEXT if self.message.is_some() => return Err(broken("a new message before the last one ended")),
            CONTINUATION if self.message.is_none() => return Err(broken("a continuation with no message to continue")),
            TEXT | CONTINUATION => {}
            _ => return Err(broken("an unknown opcode")),
        }
        if second & 0x80 == 0 {
            return Err(broken("a client frame is not masked"));
        }
        let held = self.message.as_ref().map_or(0, Vec::len) as u64;
        if opcode < CLOSE && held + length > self.max as u64 {
            return Err(refuse(code::SIZE, format!("a message is over the limit of {} bytes", self.max)));
        }
        let Some(mask) = buffer.get(at..at + 4).and_then(|mask| <[u8; 4]>::try_from(mask).ok()) else {
            return Ok(None);
        };
        // Under the limit, so it fits a `usize`.
        let length = usize::try_from(length).unwrap_or(usize::MAX);
        Ok(Some((Header { fin, opcode, mask, len: at + 4 }, length)))
    }
}

/// A client frame's header, parsed.
struct Header {
    fin: bool,
    opcode: u8,
    mask: [u8; 4],
    /// Its length in bytes, the mask included.
    len: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client frame: masked with `mask` unless it is `None`.
    fn frame(first: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut out = vec![first];
        let masked = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            len @ 0..=125 => out.push(masked | len as u8),
            len @ 126..=65535 => {
                out.push(masked | 126);
                out.extend_from_slice(&(len as u16).to_be_bytes());
            }
            len => {
                out.push(masked | 127);
                out.extend_from_slice(&(len as u64).to_be_bytes());
            }
        }
        let mut payload = payload.to_vec();
        if let Some(mask) = mask {
            out.extend_from_slice(&mask);
            apply_mask(&mut payload, mask);
        }
        out.extend_from_slice(&payload);
        out
    }

    const MASK: Option<[u8; 4]> = Some([1, 2, 3, 4]);

    fn read(bytes: Vec<u8>, max: usize) -> Result<Option<Incoming>, Refusal> {
        ClientFrames::new(bytes, max).next()
    }

    #[test]
    fn reads_text_pings_pongs_and_closes_and_waits_for_a_whole_frame() {
        assert_eq!(read(frame(0x81, b"{}", MASK), 1024), Ok(Some(Incoming::Text("{}".into()))));
        assert_eq!(read(frame(0x89, b"hi", MASK), 1024), Ok(Some(Incoming::Ping(b"hi".to_vec()))));
        assert_eq!(read(frame(0x8a, b"", MASK), 1024), Ok(Some(Incoming::Pong)));
        assert_eq!(read(frame(0x88, &[3, 232], MASK), 1024), Ok(Some(Incoming::Close(vec![3, 232]))));
        let long = "x".repeat(300);
        let whole = frame(0x81, long.as_bytes(), MASK);
        for cut in [1, 3, 7, whole.len() - 1] {
            assert_eq!(read(whole[..cut].to_vec(), 1024), Ok(None), "cut at {cut}");
        }
        assert_eq!(read(whole, 1024), Ok(Some(Incoming::Text(long))));
    }

    #[test]
    fn joins_fragments_and_answers_a_ping_between_them() {
        let mut bytes = frame(0x01, b"{\"op\":", MASK);
        bytes.extend(frame(0x89, b"p", MASK));
        bytes.extend(frame(0x80, b"1}", MASK));
        let mut frames = ClientFrames::new(bytes, 1024);
        assert_eq!(frames.next(), Ok(Some(Incoming::Ping(b"p".to_vec()))));
        assert_eq!(frames.next(), Ok(Some(Incoming::Text("{\"op\":1}".into()))));
        assert_eq!(frames.next(), Ok(None));
        assert_eq!(frames.buffer.capacity(), 0, "the buffer is given back once parsed");
    }

    #[test]
    fn refuses_what_breaks_the_protocol_or_the_limits() {
        let code = |bytes: Vec<u8>| read(bytes, 16).err().map(|refusal| refusal.code);
        assert_eq!(code(frame(0x81, b"{}", None)), Some(code::PROTOCOL), "unmasked");
        assert_eq!(code(frame(0x09, b"", MASK)), Some(code::PROTOCOL), "a fragmented ping");
        assert_eq!(code(frame(0x89, &[0; 126], MASK)), Some(code::PROTOCOL), "a ping over 125 bytes");
        assert_eq!(code(frame(0x80, b"x", MASK)), Some(code::PROTOCOL), "a continuation of nothing");
        assert_eq!(code(frame(0xc1, b"x", MASK)), Some(code::PROTOCOL), "a reserved bit");
        assert_eq!(code(frame(0x83, b"x", MASK)), Some(code::PROTOCOL), "a reserved opcode");
        assert_eq!(code(frame(0x82, b"x", MASK)), Some(code::UNSUPPORTED), "binary");
        assert_eq!(code(frame(0x81, &[0xff, 0xfe], MASK)), Some(code::INVALID), "not UTF-8");
        assert_eq!(code(frame(0x81, &[b'x'; 17], MASK)), Some(code::SIZE), "one frame over the limit");
        let mut two = frame(0x01, &[b'x'; 10], MASK);
        two.extend(frame(0x80, &[b'x'; 10], MASK));
        assert_eq!(code(two), Some(code::SIZE), "fragments over the limit together");
        let mut interleaved = frame(0x01, b"x", MASK);
        interleaved.extend(frame(0x81, b"y", MASK));
        assert_eq!(code(interleaved), Some(code::PROTOCOL), "a new message inside a fragmented one");
        let refusal = read(frame(0x81, &vec![b'x'; 70_000], MASK), 1024).expect_err("over");
        assert_eq!(refusal.reason, "a message is over the limit of 1024 bytes");
    }
}
