//! Safe retries: the [`Condition`] an append may carry, and the receipts of the conditional appends a
//! [`Stream`](super::Stream) remembers.
//!
//! A producer that lost an append's answer (a timeout, a cut connection) cannot know whether it landed. So
//! an append may carry a condition: the sequence it must follow (`after`), an idempotency key, or both. The
//! stream keeps a receipt of each of its last [`RECEIPTS`] conditional appends: the condition, a fingerprint
//! of the batch as the producer sent it (before stamping), and the answer. A retry that matches a receipt
//! with the same fingerprint is a repeat: it appends nothing and gets the first answer again, even after
//! the stream ended. The receipts are checked and kept under the producer's lock, with the append itself, so
//! "the last sequence is N, then append" is atomic, and a repeat sent while the first still waits for its
//! commit finds the first's receipt.
//!
//! One ring serves both conditions: a key names its receipt; `after` alone names the one append that could
//! follow N (an empty batch changes nothing, so a second one is the same answer). An unconditional append
//! never comes here: it hashes nothing and keeps nothing.
//!
//! What the receipts hold is counted against the hub like the stream's entries ([`Receipt::bytes`]): a key
//! is at most [`KEY_BYTES`], and the sequences of all the receipts together are at most the stream's own
//! entries, each of which is counted many times larger.

use std::collections::VecDeque;
use std::hash::Hasher;

use crate::output::OutputMessage;

/// How many conditional appends a stream remembers.
pub const RECEIPTS: usize = 64;

/// The longest idempotency key, in bytes.
pub const KEY_BYTES: usize = 256;

/// What makes an append safe to retry: the sequence it must follow, an idempotency key, or both. The
/// default (neither) is an unconditional append.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Condition {
    /// The batch must follow this sequence: it is appended only when the stream's last sequence is this.
    pub after: Option<u64>,
    /// A key the producer chose for this batch (1 to [`KEY_BYTES`] visible ASCII characters, see
    /// [`Condition::valid_key`]): a repeat of it is answered as the first was.
    pub key: Option<String>,
}

impl Condition {
    /// True when it asks for nothing: an unconditional append.
    pub fn is_none(&self) -> bool {
        self.after.is_none() && self.key.is_none()
    }

    /// Whether `key` may be an idempotency key: 1 to [`KEY_BYTES`] visible ASCII characters.
    pub fn valid_key(key: &str) -> bool {
        (1..=KEY_BYTES).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
    }
}

/// What an append answers: the sequences its messages got, and the stream's last sequence right after it
/// (the lifecycle events it caused included).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Appended {
    /// The sequence of each message of the batch, in order.
    pub sequences: Vec<u64>,
    /// The stream's last sequence once the batch was appended: what the producer's next append follows.
    pub last_sequence: u64,
    /// True when this is a repeat of a conditional append that landed before: nothing was appended, and
    /// this is the first answer again.
    pub replayed: bool,
}

/// One remembered conditional append.
#[derive(Debug)]
struct Receipt {
    key: Option<Box<str>>,
    after: Option<u64>,
    fingerprint: u64,
    sequences: Box<[u64]>,
    last_sequence: u64,
}

impl Receipt {
    /// What it holds, for the hub's count.
    fn bytes(&self) -> u64 {
        (size_of::<Receipt>() + self.key.as_ref().map_or(0, |k| k.len()) + self.sequences.len() * size_of::<u64>())
            as u64
    }
}

/// What a conditional append meets among the receipts.
#[derive(Debug, PartialEq)]
pub(super) enum Found {
    /// A repeat: its first answer.
    Repeat(Appended),
    /// Its key names a receipt of another batch (or another `after`).
    KeyReused,
    /// Nothing remembered: the append goes on, checked against `after`.
    New,
}

/// The last [`RECEIPTS`] conditional appends of a stream, oldest first.
#[derive(Debug, Default)]
pub(super) struct Receipts {
    ring: VecDeque<Receipt>,
}

impl Receipts {
    /// What a conditional append with `fingerprint` meets.
    pub(super) fn find(&self, condition: &Condition, fingerprint: u64) -> Found {
        let matched = match &condition.key {
            Some(key) => self.ring.iter().rev().find(|r| r.key.as_deref() == Some(key.as_str())),
            None => self.ring.iter().rev().find(|r| r.after == condition.after && r.fingerprint == fingerprint),
        };
        match matched {
            None => Found::New,
            Some(r) if r.fingerprint == fingerprint && r.after == condition.after => Found::Repeat(Appended {
                sequences: r.sequences.to_vec(),
                last_sequence: r.last_sequence,
                replayed: true,
            }),
            Some(_) => Found::KeyReused,
        }
    }

    /// Remembers an append's answer; returns the bytes it added to the count and the bytes of the receipt it
    /// let go of (the oldest, once there are [`RECEIPTS`]).
    pub(super) fn keep(&mut self, condition: &Condition, fingerprint: u64, answer: &Appended) -> (u64, u64) {
        let receipt = Receipt {
            key: condition.key.as_deref().map(Box::from),
            after: condition.after,
            fingerprint,
            sequences: answer.sequences.clone().into_boxed_slice(),
            last_sequence: answer.last_sequence,
        };
        let added = receipt.bytes();
        let dropped = if self.ring.len() >= RECEIPTS { self.ring.pop_front().map_or(0, |r| r.bytes()) } else { 0 };
        self.ring.push_back(receipt);
        (added, dropped)
    }

    /// Bytes held by every receipt.
    pub(super) fn bytes(&self) -> u64 {
        self.ring.iter().map(Receipt::bytes).sum()
    }
}

/// The fingerprint of a batch as its producer sent it: a hash of each message's JSON, in order.
pub(super) fn fingerprint(messages: &[OutputMessage]) -> u64 {
    struct Hashing(std::hash::DefaultHasher);
    impl std::io::Write for Hashing {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.write(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut hashing = Hashing(std::hash::DefaultHasher::new());
    for message in messages {
        // The separator keeps `[a, b]` apart from one message whose JSON is a and b back to back.
        let _ = serde_json::to_writer(&mut hashing, message);
        hashing.0.write_u8(b'\n');
    }
    hashing.0.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(sequences: &[u64], last: u64) -> Appended {
        Appended { sequences: sequences.to_vec(), last_sequence: last, replayed: false }
    }

    fn keyed(key: &str, after: Option<u64>) -> Condition {
        Condition { after, key: Some(key.into()) }
    }

    #[test]
    fn a_repeat_needs_the_same_key_after_and_batch() {
        let mut receipts = Receipts::default();
        receipts.keep(&keyed("k", Some(3)), 7, &answer(&[5], 5));
        let replayed = Found::Repeat(Appended { sequences: vec![5], last_sequence: 5, replayed: true });
        assert_eq!(receipts.find(&keyed("k", Some(3)), 7), replayed);
        assert_eq!(receipts.find(&keyed("k", Some(3)), 8), Found::KeyReused, "another batch");
        assert_eq!(receipts.find(&keyed("k", None), 7), Found::KeyReused, "another condition");
        assert_eq!(receipts.find(&keyed("other", Some(3)), 7), Found::New);
        // `after` alone finds the append that followed 3 with that batch, whatever its key.
        assert_eq!(receipts.find(&Condition { after: Some(3), key: None }, 7), replayed);
        assert_eq!(receipts.find(&Condition { after: Some(3), key: None }, 8), Found::New);
    }

    #[test]
    fn the_ring_keeps_the_last_receipts_and_counts_what_it_lets_go() {
        let mut receipts = Receipts::default();
        for n in 0..RECEIPTS as u64 {
            let (added, dropped) = receipts.keep(&keyed(&format!("k{n}"), None), n, &answer(&[n], n));
            assert!(added > 0);
            assert_eq!(dropped, 0);
        }
        let before = receipts.bytes();
        let (added, dropped) = receipts.keep(&keyed("last", None), 1, &answer(&[99], 99));
        assert!(dropped > 0);
        assert_eq!(receipts.bytes(), before + added - dropped);
        assert_eq!(receipts.find(&keyed("k0", None), 0), Found::New, "the oldest went");
        assert!(matches!(receipts.find(&keyed("k1", None), 1), Found::Repeat(_)));
    }

    #[test]
    fn keys_are_visible_ascii_of_bounded_length() {
        assert!(Condition::valid_key("a"));
        assert!(Condition::valid_key(&"k".repeat(KEY_BYTES)));
        assert!(!Condition::valid_key(""));
        assert!(!Condition::valid_key(&"k".repeat(KEY_BYTES + 1)));
        assert!(!Condition::valid_key("a b"));
        assert!(!Condition::valid_key("é"));
    }
}
