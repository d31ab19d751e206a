//! [`Rendition`]: one format's frames for a stream's whole log, rendered once and shared.
//!
//! Adapters are deterministic, so the frames for message N are the same for every subscriber of a format.
//! A rendition renders the log lazily, when the first subscriber of its format needs frames past what is
//! rendered, and keeps every frame: a subscriber joining late or resuming from sequence N starts at the
//! first frame of message N+1 (`ends`), and lag is a subtraction of cumulative byte counts (`offsets`).
//! Fan-out is therefore a reference-count bump per frame, and a subscriber that never reads costs nothing.

use bytes::Bytes;

use super::Format;
use crate::adapter::{Adapter, OpenAiOptions};
use crate::output::{ErrorProps, Outcome, OutputMessage};

pub(crate) struct Rendition {
    pub(crate) format: Format,
    adapter: Box<dyn Adapter + Send>,
    /// Every frame so far.
    pub(crate) frames: Vec<Bytes>,
    /// `offsets[i]`: bytes in frames `0..i`; one longer than `frames`.
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
            frames: Vec::new(),
            offsets: vec![0],
            ends: Vec::new(),
            finished: false,
        }
    }

    /// Renders the messages of `log` not rendered yet, and the end once there is one.
    pub(crate) fn catch_up(&mut self, log: &[OutputMessage], end: Option<&Outcome>) {
        let mut new = Vec::new();
        for message in log.get(self.ends.len()..).unwrap_or_default() {
            self.adapter.push(message, &mut new);
            self.extend(&mut new);
            self.ends.push(self.frames.len());
        }
        if let (Some(outcome), false, true) = (end, self.finished, self.ends.len() == log.len()) {
            self.adapter.finish(outcome, &mut new);
            self.extend(&mut new);
            self.finished = true;
        }
    }

    fn extend(&mut self, new: &mut Vec<Bytes>) {
        for frame in new.drain(..) {
            let total = self.offsets.last().copied().unwrap_or(0);
            self.offsets.push(total + frame.len() as u64);
            self.frames.push(frame);
        }
    }

    /// The first frame after the message with sequence `sequence` (0: the start).
    pub(crate) fn frame_after(&self, sequence: u64) -> usize {
        match sequence.checked_sub(1) {
            None => 0,
            Some(index) => self.ends.get(index as usize).copied().unwrap_or(self.frames.len()),
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
        self.frames.get(index).map_or(0, |f| f.len() as u64)
    }

    /// The frames that tell a subscriber of this format its view ends with `error`.
    pub(crate) fn interrupt(&self, error: &ErrorProps) -> Vec<Bytes> {
        let mut frames = Vec::new();
        self.adapter.interrupt(error, &mut frames);
        frames
    }
}
