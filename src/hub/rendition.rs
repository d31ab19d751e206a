//! [`Rendition`]: one format's frames for a stream's whole log, rendered once and shared.
//!
//! Adapters are deterministic, so the frames for message N are the same for every subscriber of a format.
//! A rendition renders the log lazily, when the first subscriber of its format needs frames past what is
//! rendered, and keeps every frame: a subscriber joining late or resuming from sequence N starts at the
//! first frame of message N+1 (`ends`), and lag is a subtraction of cumulative byte counts (`offsets`).
//!
//! The frames rendered in one go (what one append brought) are written back to back into one block, and a
//! subscriber's batch is a slice of it: fan-out of a block costs one reference-count bump per subscriber,
//! not one per frame, and copies nothing; only a batch that spans blocks is copied into one buffer. A
//! subscriber that never reads costs nothing.

use bytes::{Bytes, BytesMut};

use super::Format;
use crate::adapter::{Adapter, OpenAiOptions};
use crate::output::{ErrorProps, Outcome, OutputMessage};

pub(crate) struct Rendition {
    pub(crate) format: Format,
    adapter: Box<dyn Adapter + Send>,
    /// Every frame so far, back to back in blocks; `starts[b]` is the first frame of `blocks[b]`.
    blocks: Vec<Bytes>,
    starts: Vec<usize>,
    /// `offsets[i]`: bytes in frames `0..i`; one longer than the number of frames.
    offsets: Vec<u64>,
    /// `ends[i]`: number of frames after rendering message `i` (sequence `i + 1`).
    ends: Vec<usize>,
    /// The adapter's `finish` has run.
    pub(crate) finished: bool,
}

impl Rendition {
    pub(crate) fn new(format: Format, options: &OpenAiOptions) -> Self {
        Rendition {
            format,
            adapter: format.adapter(options),
            blocks: Vec::new(),
            starts: Vec::new(),
            offsets: vec![0],
            ends: Vec::new(),
            finished: false,
        }
    }

    /// Renders the messages of `log` not rendered yet, and the end once there is one, as one new block.
    pub(crate) fn catch_up(&mut self, log: &[OutputMessage], end: Option<&Outcome>) {
        let (first, mut frames, mut block) = (self.len(), Vec::new(), BytesMut::new());
        for message in log.get(self.ends.len()..).unwrap_or_default() {
            self.adapter.push(message, &mut frames);
            self.extend(&mut frames, &mut block);
            self.ends.push(self.len());
        }
        if let (Some(outcome), false, true) = (end, self.finished, self.ends.len() == log.len()) {
            self.adapter.finish(outcome, &mut frames);
            self.extend(&mut frames, &mut block);
            self.finished = true;
        }
        if !block.is_empty() {
            self.starts.push(first);
            self.blocks.push(block.freeze());
        }
    }

    fn extend(&mut self, frames: &mut Vec<Bytes>, block: &mut BytesMut) {
        for frame in frames.drain(..) {
            let total = self.offsets.last().copied().unwrap_or(0);
            self.offsets.push(total + frame.len() as u64);
            block.extend_from_slice(&frame);
        }
    }

    /// Number of frames.
    pub(crate) fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Frames `from..to`, back to back: a slice of one block, or a copy when they span blocks.
    pub(crate) fn slice(&self, from: usize, to: usize) -> Bytes {
        let to = to.min(self.len());
        if from >= to {
            return Bytes::new();
        }
        let first = self.starts.partition_point(|&start| start <= from).saturating_sub(1);
        let mut pieces = self.starts[first..].iter().zip(&self.blocks[first..]).take_while(|(start, _)| **start < to);
        let piece = |(&start, block): (&usize, &Bytes)| {
            let base = self.offsets[start];
            let at = |frame: usize| (self.offsets[frame] - base) as usize;
            block.slice(at(from.max(start))..at(to).min(block.len()))
        };
        let Some(head) = pieces.next().map(piece) else { return Bytes::new() };
        if head.len() as u64 == self.bytes_between(from, to) {
            return head;
        }
        let mut out = BytesMut::with_capacity(self.bytes_between(from, to) as usize);
        out.extend_from_slice(&head);
        pieces.map(piece).for_each(|p| out.extend_from_slice(&p));
        out.freeze()
    }

    /// The first frame after the message with sequence `sequence` (0: the start).
    pub(crate) fn frame_after(&self, sequence: u64) -> usize {
        match sequence.checked_sub(1) {
            None => 0,
            Some(index) => self.ends.get(index as usize).copied().unwrap_or(self.len()),
        }
    }

    /// The last sequence whose frames all lie before frame `cursor`.
    pub(crate) fn sequence_before(&self, cursor: usize) -> u64 {
        self.ends.partition_point(|&end| end <= cursor) as u64
    }

    /// Bytes in frames `from..to` (none when `to <= from`).
    pub(crate) fn bytes_between(&self, from: usize, to: usize) -> u64 {
        let at = |i: usize| self.offsets.get(i).or(self.offsets.last()).copied().unwrap_or(0);
        at(to).saturating_sub(at(from))
    }

    /// Bytes of frame `index`.
    pub(crate) fn frame_len(&self, index: usize) -> u64 {
        self.bytes_between(index, index + 1)
    }

    /// The frames that tell a subscriber of this format its view ends with `error`.
    pub(crate) fn interrupt(&self, error: &ErrorProps) -> Vec<Bytes> {
        let mut frames = Vec::new();
        self.adapter.interrupt(error, &mut frames);
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::Format;

    /// Renders `log` in the given pieces (one block each) and the end, and also all at once with a fresh
    /// adapter, frame by frame.
    fn rendered(format: Format, log: &[OutputMessage], pieces: &[usize]) -> (Rendition, Vec<Bytes>) {
        let options = OpenAiOptions::new("chatcmpl-test", 1, "test");
        let mut rendition = Rendition::new(format, &options);
        let mut upto = 0;
        for &piece in pieces {
            upto += piece;
            rendition.catch_up(&log[..upto], None);
        }
        rendition.catch_up(log, Some(&Outcome::completed()));
        let mut adapter = format.adapter(&options);
        let mut frames = Vec::new();
        log.iter().for_each(|message| adapter.push(message, &mut frames));
        adapter.finish(&Outcome::completed(), &mut frames);
        (rendition, frames)
    }

    #[test]
    fn every_slice_is_the_frames_it_covers_whether_in_one_block_or_across_several() {
        let log: Vec<OutputMessage> = (1..=9u64)
            .map(|n| {
                let mut message = OutputMessage::text(format!("part {n} "));
                message.metadata.get_or_insert_with(Default::default).sequence = Some(n);
                message
            })
            .collect();
        for format in [Format::Cui, Format::OPENAI] {
            let (rendition, frames) = rendered(format, &log, &[1, 3, 0, 4]);
            assert_eq!(rendition.len(), frames.len());
            assert!(rendition.blocks.len() >= 3, "several blocks: {}", rendition.blocks.len());
            for from in 0..=frames.len() {
                for to in from..=frames.len() {
                    let expected = frames[from..to].concat();
                    assert_eq!(rendition.slice(from, to), expected, "{format:?} frames {from}..{to}");
                }
            }
        }
    }

    #[test]
    fn a_slice_within_one_block_shares_its_memory() {
        let log: Vec<OutputMessage> = (0..4).map(|n| OutputMessage::text(format!("word{n} "))).collect();
        let (rendition, _) = rendered(Format::Cui, &log, &[4]);
        let whole = rendition.slice(0, 2);
        assert_eq!(whole.as_ptr(), rendition.blocks[0].as_ptr(), "no copy for frames of one block");
    }
}
