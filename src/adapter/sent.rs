//! [`SentText`]: what of one message's streaming text a client has been sent, and what is new after each
//! message; the rule the chunk-stream adapters that only ever add (UI message stream, AG-UI) share.
//!
//! A message's main text (a text's or a thinking's content, a tool call's arguments) goes out as deltas. What
//! is new after a message is the text past what was sent, when the text still starts with it. A `replace`,
//! `merge`, `set`, a resend or a `type_change` that leaves the text not starting with what was sent is a
//! correction ([`SentText::new_text`] answers `None`): a text or reasoning then goes out again whole as a new
//! part or message (the client cannot drop what it has, but what it shows last is the corrected text) and
//! the adapter says so with [`SentText::corrected`]; a tool call's arguments, which cannot be sent twice, send
//! nothing until they extend what was sent again. An append at the main
//! field of a message in step with its client takes a fast path: the fragment is what is new, with no
//! comparison, so a long answer streamed in small deltas costs O(fragment) per delta, not O(text).

use crate::output::{DeltaAction, OutputMessage, main_field};

/// What of one message's text went out; see the module doc. By default, nothing.
#[derive(Debug, Clone)]
pub(crate) struct SentText {
    /// `None`: exactly the text the message had before the latest message. `Some(text)`: what was sent, which
    /// the text no longer extends (the empty string while nothing was).
    stale: Option<String>,
}

/// What a message's text was, taken before a message is applied to it.
#[derive(Debug, Clone)]
pub(crate) enum Before<'m> {
    /// The message appends this fragment at the main field of a message in step with its client.
    Fragment(&'m str),
    /// The text before (none for a new message, or a type without a main field).
    Text(Option<String>),
}

impl Default for SentText {
    fn default() -> Self {
        SentText { stale: Some(String::new()) }
    }
}

impl SentText {
    /// What `message` does to the text of `state` (its message before it), for [`SentText::new_text`]: a
    /// fragment on the fast path (only while this is in step with its client), otherwise the text before.
    pub(crate) fn before<'m>(&self, state: Option<&OutputMessage>, message: &'m OutputMessage) -> Before<'m> {
        let Some(state) = state else { return Before::Text(None) };
        let main = main_field(&state.kind);
        let fast = main.filter(|&main| {
            let same_place = message.kind == state.kind
                && message.action_or_default() == DeltaAction::Append
                && message.delta_path.as_deref().is_none_or(|p| p == main);
            let appendable = state.props.get(main).is_none_or(|v| v.is_string() || v.is_null());
            message.delta && !message.type_change && same_place && appendable && self.stale.is_none()
        });
        match fast.and_then(|main| message.prop_str(main)) {
            Some(fragment) => Before::Fragment(fragment),
            None => Before::Text(main.and_then(|field| state.prop_str(field)).map(str::to_owned)),
        }
    }

    /// What of `text` (the message's text now) is new to the client, noting it as sent; `None` when `text` no
    /// longer starts with what was sent, which stays noted until [`SentText::corrected`].
    pub(crate) fn new_text<'a>(&mut self, text: &'a str, before: &Before<'a>) -> Option<&'a str> {
        let before = match before {
            Before::Fragment(fragment) => return Some(fragment),
            Before::Text(before) => before.as_deref(),
        };
        let sent = self.stale.as_deref().or(before).unwrap_or("");
        match text.strip_prefix(sent) {
            Some(rest) => {
                self.stale = None;
                Some(rest)
            }
            None => {
                self.stale = Some(sent.to_owned());
                None
            }
        }
    }

    /// The message's whole text (as it is now) went out again, correcting what was sent: in step from here.
    pub(crate) fn corrected(&mut self) {
        self.stale = None;
    }

    /// Where what is new of `text` starts, and whether it is a correction: past what was sent, or at 0 when
    /// `text` no longer starts with it (the whole text goes out again, noted as [`SentText::corrected`]).
    pub(crate) fn resume<'a>(&mut self, text: &'a str, before: &Before<'a>) -> (usize, bool) {
        match self.new_text(text, before) {
            Some(new) => (text.len() - new.len(), false),
            None => {
                self.corrected();
                (0, true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{DeltaAction, OutputMessage};

    #[test]
    fn appends_take_the_fast_path_and_a_replace_that_takes_text_back_is_a_correction() {
        let mut sent = SentText::default();
        let first = OutputMessage::text("The fare is 41");
        assert_eq!(sent.new_text("The fare is 41", &sent.before(None, &first)), Some("The fare is 41"));
        let state = first.clone();
        let more = OutputMessage::text(" EUR").as_delta(DeltaAction::Append, None);
        let before = sent.before(Some(&state), &more);
        assert!(matches!(before, Before::Fragment(" EUR")));
        assert_eq!(sent.new_text("The fare is 41 EUR", &before), Some(" EUR"));
        let state = OutputMessage::text("The fare is 41 EUR");
        let replace = OutputMessage::text("The fare is 42").as_delta(DeltaAction::Replace, None);
        let before = sent.before(Some(&state), &replace);
        assert_eq!(sent.new_text("The fare is 42", &before), None, "taken back: a correction");
        let state = OutputMessage::text("The fare is 42");
        let again = OutputMessage::text("The fare is 41 EUR, or less").as_delta(DeltaAction::Replace, None);
        let before = sent.before(Some(&state), &again);
        assert_eq!(sent.new_text("The fare is 41 EUR, or less", &before), Some(", or less"), "uncorrected: extends");
        let state = OutputMessage::text("The fare is 41 EUR, or less");
        let replace = OutputMessage::text("The fare is 42").as_delta(DeltaAction::Replace, None);
        let before = sent.before(Some(&state), &replace);
        assert_eq!(sent.new_text("The fare is 42", &before), None);
        sent.corrected();
        let state = OutputMessage::text("The fare is 42");
        let more = OutputMessage::text(" EUR").as_delta(DeltaAction::Append, None);
        let before = sent.before(Some(&state), &more);
        assert!(matches!(before, Before::Fragment(" EUR")), "in step again after the correction");
        assert_eq!(sent.new_text("The fare is 42 EUR", &before), Some(" EUR"));
    }
}
