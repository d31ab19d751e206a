//! [`Format`]: which adapter a subscriber reads a stream through.
//!
//! A stream keeps one rendition per format in use, so the format is the key that decides which subscribers
//! share bytes: everything that changes a single byte of output (the usage chunk, the reasoning field) is
//! part of it. Per-stream constants (the completion id, the model) come from the stream itself.

use crate::adapter::{Adapter, CuiAdapter, OpenAiAdapter, OpenAiOptions, ReasoningField};

/// A wire format a subscriber reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Format {
    /// The typed messages as SSE events.
    #[default]
    Cui,
    /// OpenAI `chat.completion.chunk` SSE events.
    OpenAi {
        /// Send the usage chunk at the end when usage is known.
        include_usage: bool,
        /// Where reasoning goes.
        reasoning: ReasoningField,
    },
}

impl Format {
    /// OpenAI chunks with the defaults: no usage chunk, reasoning in `reasoning_content`.
    pub const OPENAI: Format = Format::OpenAi { include_usage: false, reasoning: ReasoningField::ReasoningContent };

    /// A fresh adapter for this format; `options` carries the stream's completion id, clock and model.
    pub(crate) fn adapter(self, options: &OpenAiOptions) -> Box<dyn Adapter + Send> {
        match self {
            Format::Cui => Box::new(CuiAdapter),
            Format::OpenAi { include_usage, reasoning } => {
                let mut options = options.clone();
                options.include_usage = include_usage;
                options.reasoning = reasoning;
                Box::new(OpenAiAdapter::new(options))
            }
        }
    }
}
