//! The names agentmux uses in Redis. A stream's keys share the hash tag `{id}`, so a Redis Cluster keeps them
//! in one slot, as the append script needs.

/// The secret every node signs stream tokens with (32 bytes).
pub(crate) const SECRET: &str = "agentmux:secret";

/// A node's lease: its URL, for as long as the node renews it (see `lease.rs`).
pub(crate) fn node(node: &str) -> String {
    format!("agentmux:node:{node}")
}

/// The stream's entries: a Redis Stream whose entry ids are `<sequence>-0`, one field `m`, the message as
/// stamped, in JSON.
pub(crate) fn log(stream: &str) -> String {
    format!("agentmux:{{{stream}}}:log")
}

/// The stream's facts (`epoch`, `created_ms`, `model`), its owner (`owner`, `url`), its last sequence
/// (`last`), and once it has ended its `outcome` (JSON) and `ended_ms`.
pub(crate) fn meta(stream: &str) -> String {
    format!("agentmux:{{{stream}}}:meta")
}

/// The channel the owner publishes the last sequence on after each append.
pub(crate) fn notices(stream: &str) -> String {
    format!("agentmux:{{{stream}}}:notices")
}

/// The stream a notice channel is for.
pub(crate) fn stream_of_notices(channel: &str) -> Option<&str> {
    channel.strip_prefix("agentmux:{")?.strip_suffix("}:notices")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_channel_names_its_stream() {
        assert_eq!(stream_of_notices(&notices("s_1")), Some("s_1"));
        assert_eq!(stream_of_notices(&log("s_1")), None);
    }
}
