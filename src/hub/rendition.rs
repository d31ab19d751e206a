//! [`Rendition`]: one `Render`'s frames for a stream's whole log, rendered once and shared.
//!
//! Renderers are deterministic, so the frames for message N are the same for every subscriber of a render
//! key. A rendition renders the log lazily, a chunk of entries at a time, when a subscriber needs frames
//! past what is rendered, and keeps every frame: a subscriber joining late or resuming from sequence N
//! starts at the first frame of message N+1 (`ends`).
//!
//! Each rendition sits behind its own mutex, not the stream's: a first subscriber in a format rendering a
//! long log holds only this rendition (and the log's lock for the moment it takes to copy out a chunk of
//! `Arc`s), so the producer appends on undisturbed.
//!
//! The frames rendered in one go are written back to back into one block, and a subscriber's batch is
//! slices of the blocks it spans: fan-out of a block costs one reference-count bump per subscriber, not one
//! per frame, and copies nothing (a transport writes the slices together); only runs of short slices, a
//! few tokens each, are copied into one, so a backlog of tokens is still one piece. A subscriber that never
//! reads costs nothing.
//!
//! # A window, not the whole log
//!
//! A rendition shared by subscribers keeps only the frames some subscriber may still read: once it holds
//! more than twice [`WINDOW`] frames, it drops the blocks before the last [`WINDOW`] frames that every
//! subscriber has passed (each registers where it reads, see [`Rendition::reader`]). Frame numbers stay
//! absolute, and renderers are deterministic, so frame N is the same bytes whoever renders it. A subscriber
//! that needs frames already dropped (one joining late, or resuming, from before the window) renders the log
//! again for itself, from the start, in a private rendition that keeps only what it has not read yet, and
//! goes on in the shared one once it reaches the window: its cursor means the same frame in both.
//!
//! Memory: every byte a rendition adds (frames, their offsets, its renderer's state) is counted against
//! the hub's limit as it is rendered, after the stream counted an estimate for it when the entry was
//! appended (see `stream/ledger.rs`); the estimate is given back as the real figure is counted.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use bytes::{Bytes, BytesMut};

use super::log::{Entry, Gone, Log};
use super::render::Renderer;

/// Entries rendered per read from the log: bounds how long one catch-up holds the rendition.
const CHUNK: usize = 1024;

/// Bytes of bookkeeping per frame and per message (an offset, an end).
const BOOKKEEPING: u64 = 8;

/// Frames a shared rendition keeps behind its readers at least (it trims at twice as many).
pub(crate) const WINDOW: usize = 1024;

/// Where a reader reads: the first frame it may still ask for.
pub(crate) type ReaderAt = Arc<AtomicUsize>;

pub(crate) struct Rendition {
    renderer: Box<dyn Renderer>,
    /// Messages rendered in this rendition's render key, hub-wide (see [`super::Hub::rendered`]).
    renders: Arc<AtomicU64>,
    /// The frames kept, back to back in blocks; `starts[b]` is the number of the first frame of `blocks[b]`.
    blocks: Vec<Bytes>,
    starts: Vec<usize>,
    /// `offsets[i]`: bytes in frames `0..base + i`; frames before `base` were dropped.
    offsets: Vec<u64>,
    base: usize,
    /// `ends[i]`: number of frames after rendering the message with sequence `ends_from + i`.
    ends: Vec<usize>,
    ends_from: u64,
    /// Shared: trims behind its readers. Private: its one reader trims it.
    shared: bool,
    readers: Vec<Weak<AtomicUsize>>,
    /// The log's end was rendered, or the renderer will render nothing more.
    pub(crate) finished: bool,
    /// The log no longer keeps what this rendition needs next.
    pub(crate) gone: Option<Gone>,
    /// The renderer's state as last counted.
    held: u64,
    /// The log's bytes rendered so far: the estimate given back.
    estimated: u64,
    /// Kept between catch-ups so that reading and rendering allocate nothing once warm.
    entries: Vec<Entry>,
    frames: Vec<Bytes>,
}

/// What a catch-up changed in the hub's count: bytes to count, and the estimate to give back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CountChange {
    pub(crate) added: u64,
    pub(crate) estimated: u64,
    /// Bytes of frames dropped, to give back.
    pub(crate) dropped: u64,
    /// The rendition finished: nothing more will be counted for it.
    pub(crate) finished: bool,
}

impl Rendition {
    /// A rendition its subscribers share, trimmed behind them.
    pub(crate) fn new(renderer: Box<dyn Renderer>, renders: Arc<AtomicU64>) -> Self {
        Rendition {
            renderer,
            renders,
            blocks: Vec::new(),
            starts: Vec::new(),
            offsets: vec![0],
            base: 0,
            ends: Vec::new(),
            ends_from: 1,
            shared: true,
            readers: Vec::new(),
            finished: false,
            gone: None,
            held: 0,
            estimated: 0,
            entries: Vec::new(),
            frames: Vec::new(),
        }
    }

    /// A rendition of one subscriber's own, which it trims as it reads ([`Rendition::trim_before`]).
    pub(crate) fn private(renderer: Box<dyn Renderer>, renders: Arc<AtomicU64>) -> Self {
        Rendition { shared: false, ..Rendition::new(renderer, renders) }
    }

    /// The count of messages rendered it adds to.
    pub(crate) fn renders(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.renders)
    }

    /// Registers a reader at frame `at`: the rendition keeps what it may still ask for. The reader moves it
    /// on as it reads (`usize::MAX`: it asks for nothing here for now); dropping it unregisters.
    pub(crate) fn reader(&mut self, at: usize) -> ReaderAt {
        let reader = Arc::new(AtomicUsize::new(at));
        self.readers.retain(|r| r.strong_count() > 0);
        self.readers.push(Arc::downgrade(&reader));
        reader
    }

    /// The last sequence rendered.
    pub(crate) fn rendered(&self) -> u64 {
        self.ends_from - 1 + self.ends.len() as u64
    }

    /// The first frame still kept.
    pub(crate) fn first_kept(&self) -> usize {
        self.base
    }

    /// Renders the next chunk of the log not rendered yet (and the end once the log has one) as one new
    /// block; `false` when there was nothing to render.
    pub(crate) fn catch_up(&mut self, log: &dyn Log, counted: &mut CountChange) -> bool {
        if self.finished || self.gone.is_some() {
            return false;
        }
        let rendered = self.rendered();
        let last = log.last_sequence();
        if last == rendered && !log.is_ended() {
            // Caught up, learnt without the log's lock (a forgotten log reports its old length, so a
            // rendition behind it still reads and learns it is gone).
            return false;
        }
        let mut entries = std::mem::take(&mut self.entries);
        if let Err(gone) = log.read(rendered, CHUNK, &mut entries) {
            self.gone = Some(gone);
            return false;
        }
        if entries.is_empty() {
            self.entries = entries;
            return false;
        }
        let (first, mut frames) = (self.len(), std::mem::take(&mut self.frames));
        let messages = self.ends.len();
        for entry in entries.drain(..) {
            let entry = &entry;
            let rendered = frames.len();
            self.renderer.render(entry, &mut frames);
            self.count(&frames[rendered..]);
            match entry {
                Entry::Message { .. } => {
                    let bytes = entry.bytes();
                    self.ends.push(self.len());
                    counted.estimated += bytes;
                    self.estimated += bytes;
                    counted.added += BOOKKEEPING;
                }
                Entry::End(_) => self.finished = true,
            }
            if self.renderer.ended() {
                // Nothing more will be rendered: whatever else the log holds or gets is not this view's.
                self.finished = true;
                break;
            }
        }
        self.renders.fetch_add((self.ends.len() - messages) as u64, Ordering::Relaxed);
        // The chunk's frames, copied once into a block of exactly their size.
        let mut block = BytesMut::with_capacity(frames.iter().map(Bytes::len).sum());
        frames.drain(..).for_each(|frame| block.extend_from_slice(&frame));
        counted.added += block.len() as u64 + BOOKKEEPING * (self.len() - first) as u64;
        let held = self.renderer.held_bytes();
        counted.added += held.saturating_sub(self.held);
        self.held = self.held.max(held);
        if !block.is_empty() {
            self.starts.push(first);
            self.blocks.push(block.freeze());
        }
        entries.clear();
        (self.entries, self.frames) = (entries, frames);
        counted.finished |= self.finished;
        if self.shared && self.len() - self.base > 2 * WINDOW {
            let behind = self.len() - WINDOW;
            self.readers.retain(|r| r.strong_count() > 0);
            let passed = self.readers.iter().filter_map(Weak::upgrade).map(|r| r.load(Ordering::Acquire)).min();
            counted.dropped += self.trim_before(passed.unwrap_or(usize::MAX).min(behind));
        }
        true
    }

    /// Drops the blocks whose frames all lie before frame `frame`, and their bookkeeping; returns the bytes
    /// it gave back.
    pub(crate) fn trim_before(&mut self, frame: usize) -> u64 {
        let keep = self.starts.partition_point(|&start| start <= frame).saturating_sub(1);
        if keep == 0 {
            return 0;
        }
        let dropped: u64 = self.blocks.drain(..keep).map(|b| b.len() as u64).sum();
        self.starts.drain(..keep);
        let base = self.starts.first().copied().unwrap_or_else(|| self.len());
        let frames = base - self.base;
        self.offsets.drain(..frames);
        self.base = base;
        let ends = self.ends.partition_point(|&end| end < base);
        self.ends.drain(..ends);
        self.ends_from += ends as u64;
        dropped + BOOKKEEPING * (frames + ends) as u64
    }

    /// Counts frames just rendered: their offsets (the frames are copied into the block at the end).
    fn count(&mut self, frames: &[Bytes]) {
        for frame in frames {
            let total = self.offsets.last().copied().unwrap_or(0);
            self.offsets.push(total + frame.len() as u64);
        }
    }

    /// What it holds, counted as the stream counts it: its frames, their bookkeeping and its renderer's state,
    /// and for the part of a log of `log_bytes` not rendered yet, the estimate.
    pub(crate) fn held_bytes(&self, log_bytes: u64) -> u64 {
        let frames: u64 = self.blocks.iter().map(|b| b.len() as u64).sum();
        frames
            + BOOKKEEPING * (self.offsets.len() + self.ends.len()) as u64
            + self.held
            + log_bytes.saturating_sub(self.estimated)
    }

    /// Drops every frame (the stream was evicted): subscribers still behind get the interruption.
    pub(crate) fn forget(&mut self, gone: Gone) {
        self.blocks = Vec::new();
        self.starts = Vec::new();
        self.gone = Some(gone);
    }

    /// True when frame `cursor` was dropped by [`Rendition::forget`].
    pub(crate) fn is_forgotten(&self, cursor: usize) -> bool {
        self.gone.is_some() && self.blocks.is_empty() && cursor < self.len()
    }

    /// Number of frames rendered (kept or not).
    pub(crate) fn len(&self) -> usize {
        self.base + self.offsets.len() - 1
    }

    /// Bytes in frames `0..frame`, for a frame kept (or the nearest kept).
    fn offset(&self, frame: usize) -> u64 {
        let at = frame.saturating_sub(self.base).min(self.offsets.len() - 1);
        self.offsets[at]
    }

    /// Frames `from..to`, back to back, in pieces: slices of the blocks they lie in, shared rather than
    /// copied, except that runs of short pieces (under [`SHARED_PIECE`] bytes: a block of a few tokens) are
    /// copied into one, so a batch spanning many small blocks is still a few pieces to write.
    pub(crate) fn pieces(&self, from: usize, to: usize) -> Vec<Bytes> {
        let to = to.min(self.len());
        if from >= to || self.blocks.is_empty() {
            return Vec::new();
        }
        let first = self.starts.partition_point(|&start| start <= from).saturating_sub(1);
        let spanned = self.starts[first..].iter().zip(&self.blocks[first..]).take_while(|(start, _)| **start < to);
        let piece = |(&start, block): (&usize, &Bytes)| {
            let base = self.offset(start);
            let at = |frame: usize| (self.offset(frame) - base) as usize;
            block.slice(at(from.max(start))..at(to).min(block.len()))
        };
        let mut pieces = Vec::new();
        // Consecutive short pieces, copied into one when there are several.
        let mut short = Vec::new();
        for piece in spanned.map(piece).filter(|piece| !piece.is_empty()) {
            if piece.len() < SHARED_PIECE {
                short.push(piece);
            } else {
                pieces.extend(joined(&mut short));
                pieces.push(piece);
            }
        }
        pieces.extend(joined(&mut short));
        pieces
    }

    /// The lengths of frames `from..to`.
    pub(crate) fn frame_lengths(&self, from: usize, to: usize) -> Vec<u32> {
        let to = to.min(self.len());
        (from..to).map(|i| self.frame_len(i) as u32).collect()
    }

    /// The first frame after the message with sequence `sequence` (0: the start), if that frame is kept.
    pub(crate) fn frame_after(&self, sequence: u64) -> Option<usize> {
        let frame = match sequence.checked_sub(self.ends_from) {
            _ if sequence == 0 => 0,
            None => return None,
            Some(index) => self.ends.get(index as usize).copied().unwrap_or(self.len()),
        };
        (frame >= self.base).then_some(frame)
    }

    /// The last sequence whose frames all lie before frame `cursor` (a frame kept).
    pub(crate) fn sequence_before(&self, cursor: usize) -> u64 {
        self.ends_from - 1 + self.ends.partition_point(|&end| end <= cursor) as u64
    }

    /// Bytes in frames `from..to` (none when `to <= from`), of frames kept.
    pub(crate) fn bytes_between(&self, from: usize, to: usize) -> u64 {
        self.offset(to).saturating_sub(self.offset(from))
    }

    /// Where a run of frames from `from` that fits in `budget` bytes ends (before `end` at most): at least
    /// one frame past `from`, whatever its size. A binary search over the frames' offsets, so a subscriber's
    /// batch costs the same however many frames it takes.
    pub(crate) fn fitting(&self, from: usize, end: usize, budget: u64) -> usize {
        let end = end.min(self.len());
        if from >= end {
            return end;
        }
        let limit = self.offset(from).saturating_add(budget);
        let (first, last) = (from.saturating_sub(self.base) + 1, end - self.base);
        let within = self.offsets[first.min(last)..=last].partition_point(|&offset| offset <= limit);
        from + within.max(1)
    }

    /// Bytes of frame `index`.
    pub(crate) fn frame_len(&self, index: usize) -> u64 {
        self.bytes_between(index, index + 1)
    }

    /// The frames that end a subscriber's view whose next entry is gone.
    pub(crate) fn interrupt(&self, gone: &Gone) -> (Bytes, Vec<u32>) {
        let mut frames = Vec::new();
        self.renderer.interrupt(gone, &mut frames);
        (frames.concat().into(), frames.iter().map(|f| f.len() as u32).collect())
    }
}

/// Pieces of a batch this long or longer are shared slices of their blocks; shorter ones next to each other
/// are copied into one (see [`Rendition::pieces`]).
pub(crate) const SHARED_PIECE: usize = 1024;

/// A run of short pieces as one: a lone one as it is, several copied together; the run is emptied.
fn joined(run: &mut Vec<Bytes>) -> Option<Bytes> {
    match run.len() {
        0 | 1 => run.pop(),
        _ => {
            let joined = Bytes::from(run.concat());
            run.clear();
            Some(joined)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::hub::Render;
    use crate::hub::{MemoryLog, StreamInfo};
    use crate::output::{Outcome, OutputMessage};
    use crate::render::{Format, encode_sse};

    fn info() -> StreamInfo {
        StreamInfo { id: "s".into(), epoch: "e".into(), created_ms: 1_000, model: "test".into() }
    }

    fn entry(n: u64) -> Entry {
        let mut message = OutputMessage::text(format!("part {n} "));
        message.metadata.get_or_insert_with(Default::default).sequence = Some(n);
        Entry::message(message)
    }

    /// Renders a log appended in the given pieces (one catch-up each) and ended, and also all at once with
    /// a fresh adapter, frame by frame.
    fn rendered(format: Format, count: u64, pieces: &[u64]) -> (Rendition, Vec<Bytes>) {
        let render: Arc<dyn Render> = format.into();
        let mut rendition = Rendition::new(render.renderer(&info()), Arc::default());
        let log = MemoryLog::default();
        let mut next = 1;
        let mut counted = CountChange::default();
        for &piece in pieces {
            log.append((next..next + piece).map(entry).collect());
            next += piece;
            while rendition.catch_up(&log, &mut counted) {}
        }
        log.append((next..=count).map(entry).chain([Entry::End(Arc::new(Outcome::completed()))]).collect());
        while rendition.catch_up(&log, &mut counted) {}
        let mut adapter = format.adapter(&info());
        let mut frames = Vec::new();
        for n in 1..=count {
            if let Entry::Message { message, .. } = entry(n) {
                adapter.push(&message, &mut frames);
            }
        }
        adapter.finish(&Outcome::completed(), &mut frames);
        (rendition, frames.iter().map(encode_sse).collect())
    }

    #[test]
    fn every_slice_is_the_frames_it_covers_whether_in_one_block_or_across_several() {
        for format in [Format::Cui, Format::OPENAI] {
            let (rendition, frames) = rendered(format, 9, &[1, 3, 0, 4]);
            assert!(rendition.finished);
            assert_eq!(rendition.len(), frames.len());
            assert!(rendition.blocks.len() >= 3, "several blocks: {}", rendition.blocks.len());
            for from in 0..=frames.len() {
                for to in from..=frames.len() {
                    let expected = frames[from..to].concat();
                    assert_eq!(rendition.pieces(from, to).concat(), expected, "{format:?} frames {from}..{to}");
                    let lengths: Vec<u32> = frames[from..to].iter().map(|f| f.len() as u32).collect();
                    assert_eq!(rendition.frame_lengths(from, to), lengths);
                }
            }
        }
    }

    /// The binary search takes what adding frames one at a time up to the budget would: at least one frame,
    /// never past `end`, also when frames before the window were trimmed.
    #[test]
    fn a_run_that_fits_a_budget_is_what_taking_frames_one_by_one_takes() {
        let (mut rendition, frames) = rendered(Format::Cui, 40, &[3, 7, 1, 12]);
        for trimmed in [0, 9] {
            rendition.trim_before(trimmed);
            let base = rendition.first_kept();
            for from in base..=frames.len() {
                for end in from..=frames.len() + 1 {
                    for budget in [0, 1, 40, 100, 250, 1_000, u64::MAX] {
                        let mut until = from;
                        let mut taken = 0;
                        while until < end.min(frames.len())
                            && (until == from || taken + frames[until].len() as u64 <= budget)
                        {
                            taken += frames[until].len() as u64;
                            until += 1;
                        }
                        let fitting = rendition.fitting(from, end, budget);
                        assert_eq!(fitting, until, "from {from}, end {end}, budget {budget}, base {base}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_slice_within_one_block_shares_its_memory() {
        let (rendition, _) = rendered(Format::Cui, 4, &[4]);
        let pieces = rendition.pieces(0, 2);
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces[0].as_ptr(), rendition.blocks[0].as_ptr(), "no copy for frames of one block");
    }

    /// Frames across long blocks are slices of each block, shared; short blocks next to each other are
    /// copied into one piece, so a backlog of single tokens is still one piece to write.
    #[test]
    fn long_blocks_are_shared_and_runs_of_short_ones_copied_into_one() {
        let long = (SHARED_PIECE / 30) as u64;
        let (rendition, frames) = rendered(Format::Cui, 3 * long + 3, &[long, long, 1, 1, 1, long]);
        let spans: Vec<(usize, usize)> =
            rendition.starts.iter().zip(&rendition.blocks).map(|(s, b)| (*s, b.len())).collect();
        let pieces = rendition.pieces(0, rendition.len());
        assert_eq!(pieces.concat(), frames.concat());
        let shared: Vec<bool> =
            pieces.iter().map(|p| rendition.blocks.iter().any(|b| b.as_ptr_range().contains(&p.as_ptr()))).collect();
        let lengths: Vec<usize> = pieces.iter().map(Bytes::len).collect();
        // The three short blocks (a frame each) are one copied piece between the long ones.
        assert_eq!(shared, [true, true, false, true], "blocks {spans:?}, pieces {lengths:?}");
        assert_eq!(lengths[2], spans[2].1 + spans[3].1 + spans[4].1);
        // A batch from inside a long block to inside another: a slice of each, nothing copied.
        let (from, to) = (spans[0].0 + 3, spans[5].0 + 20);
        let pieces = rendition.pieces(from, to);
        assert_eq!(pieces.concat(), frames[from..to].concat());
        let shared: Vec<bool> =
            pieces.iter().map(|p| rendition.blocks.iter().any(|b| b.as_ptr_range().contains(&p.as_ptr()))).collect();
        assert_eq!(shared, [true, true, false, true]);
    }

    #[test]
    fn a_long_log_is_rendered_a_chunk_at_a_time_and_counted() {
        let render: Arc<dyn Render> = Format::Cui.into();
        let mut rendition = Rendition::new(render.renderer(&info()), Arc::default());
        let log = MemoryLog::default();
        log.append((1..=2_500).map(entry).collect());
        let mut counted = CountChange::default();
        assert!(rendition.catch_up(&log, &mut counted));
        assert_eq!(rendition.rendered(), CHUNK as u64, "one chunk per catch-up");
        let logged: u64 = (1..=CHUNK as u64).map(|n| entry(n).bytes()).sum();
        assert_eq!(counted.estimated, logged, "gives back the estimate of what it rendered");
        assert!(counted.added > rendition.bytes_between(0, rendition.len()), "counts frames and bookkeeping");
        while rendition.catch_up(&log, &mut counted) {}
        assert_eq!(rendition.rendered(), 2_500);
    }

    #[test]
    fn a_forgotten_log_leaves_the_rendition_gone_where_its_frames_end() {
        let render: Arc<dyn Render> = Format::Cui.into();
        let mut rendition = Rendition::new(render.renderer(&info()), Arc::default());
        let log = MemoryLog::default();
        log.append((1..=3).map(entry).collect());
        let mut counted = CountChange::default();
        while rendition.catch_up(&log, &mut counted) {}
        log.append((4..=5).map(entry).collect());
        log.forget();
        assert!(!rendition.catch_up(&log, &mut counted));
        assert_eq!(rendition.gone, Some(Gone { asked: 3, kept_after: 5 }));
        assert!(!rendition.is_forgotten(0), "rendered frames are still there until the stream forgets them");
        rendition.forget(Gone { asked: 0, kept_after: 5 });
        assert!(rendition.is_forgotten(0));
        let (bytes, lengths) = rendition.interrupt(&Gone { asked: 1, kept_after: 5 });
        assert_eq!(lengths, vec![bytes.len() as u32]);
        assert!(std::str::from_utf8(&bytes).is_ok_and(|text| text.contains("\"lagged\"")));
    }
}
