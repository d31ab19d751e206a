//! The one script that writes a stream's entries to Redis: the owner's append, checked and applied in one
//! step on the Redis server, so that no other node's write can come between the check and the write.
//!
//! It refuses a node that does not own the stream (`FENCED`) and an append that would leave a gap
//! (`GAP`), skips the entries a retry of an append that did reach Redis would write twice, and publishes
//! the new last sequence on the stream's notice channel for the nodes that follow it. A stream's first
//! append registers it: its facts, its owner and the owner's URL, in the stream's `meta` hash.

use redis::Script;

use super::keys;

/// KEYS: the stream's log and meta. ARGV: node, url, channel, ttl (ms; 0: none), first sequence, count of
/// messages, register (1 on the stream's first append), epoch, created_ms, model, the messages as JSON,
/// then, when the append ends the stream, the outcome as JSON and when it ended (ms).
const APPEND: &str = r"
local log, meta = KEYS[1], KEYS[2]
local owner = redis.call('HGET', meta, 'owner')
if not owner then
  if ARGV[7] ~= '1' then
    return redis.error_reply('FENCED the stream is not registered')
  end
  redis.call('HSET', meta, 'owner', ARGV[1], 'url', ARGV[2], 'last', 0,
    'epoch', ARGV[8], 'created_ms', ARGV[9], 'model', ARGV[10])
elseif owner ~= ARGV[1] then
  return redis.error_reply('FENCED the stream is owned by node ' .. owner)
end
local last = tonumber(redis.call('HGET', meta, 'last'))
local first = tonumber(ARGV[5])
local count = tonumber(ARGV[6])
if count > 0 and first > last + 1 then
  return redis.error_reply('GAP the log ends at ' .. last .. ' and the append starts at ' .. first)
end
for i = 0, count - 1 do
  local sequence = first + i
  if sequence > last then
    redis.call('XADD', log, sequence .. '-0', 'm', ARGV[11 + i])
    last = sequence
  end
end
redis.call('HSET', meta, 'last', last)
local outcome = ARGV[11 + count]
if outcome and redis.call('HEXISTS', meta, 'outcome') == 0 then
  redis.call('HSET', meta, 'outcome', outcome, 'ended_ms', ARGV[12 + count])
end
local ttl = tonumber(ARGV[4])
if ttl > 0 then
  redis.call('PEXPIRE', meta, ttl)
  redis.call('PEXPIRE', log, ttl)
end
redis.call('PUBLISH', ARGV[3], last)
return last
";

/// KEYS: the stream's meta. ARGV: the owner seen dead, the new owner, its URL. Makes the new owner the
/// stream's writer if the dead one still is and the stream has not ended; returns the last sequence then.
const CLAIM: &str = r"
local meta = KEYS[1]
if redis.call('HGET', meta, 'owner') ~= ARGV[1] or redis.call('HEXISTS', meta, 'outcome') == 1 then
  return false
end
redis.call('HSET', meta, 'owner', ARGV[2], 'url', ARGV[3])
return tonumber(redis.call('HGET', meta, 'last'))
";

/// Takes stream `stream` over from `dead` (a node whose lease has lapsed) as `node`, reachable at `url`: the
/// stream's last sequence when this node is its writer now, `None` when another node was quicker or the
/// stream has ended. From then on the dead node's appends are fenced.
pub(crate) async fn claim(
    connection: &mut super::connection::RedisConnection,
    stream: &str,
    dead: &str,
    node: &str,
    url: &str,
) -> redis::RedisResult<Option<u64>> {
    Script::new(CLAIM).key(keys::meta(stream)).arg(dead).arg(node).arg(url).invoke_async(connection).await
}

/// What one call of the script writes.
#[derive(Debug, Default)]
pub(crate) struct Append {
    /// Sequence of the first message (when there are messages).
    pub(crate) first: u64,
    /// The messages as JSON, in order (as they were logged).
    pub(crate) messages: Vec<bytes::Bytes>,
    /// The outcome as JSON and when the stream ended, when this append ends it.
    pub(crate) outcome: Option<(String, u64)>,
    /// The stream's facts, on its first append: epoch, created_ms, model.
    pub(crate) register: Option<(String, u64, String)>,
}

/// The script, loaded once per process (`invoke_async` loads it again into a Redis that lost it).
pub(crate) fn append_script() -> Script {
    Script::new(APPEND)
}

/// Runs the script for `stream`'s `append` as `node` (reachable at `url`); returns the log's last sequence.
pub(crate) async fn append(
    connection: &mut super::connection::RedisConnection,
    script: &Script,
    node: &str,
    url: &str,
    stream: &str,
    ttl_ms: u64,
    append: &Append,
) -> redis::RedisResult<u64> {
    let mut invocation = script.key(keys::log(stream));
    invocation.key(keys::meta(stream)).arg(node).arg(url).arg(keys::notices(stream)).arg(ttl_ms);
    invocation.arg(append.first).arg(append.messages.len());
    match &append.register {
        Some((epoch, created_ms, model)) => invocation.arg(1).arg(epoch).arg(*created_ms).arg(model),
        None => invocation.arg(0).arg("").arg(0).arg(""),
    };
    for message in &append.messages {
        invocation.arg(&message[..]);
    }
    if let Some((outcome, ended_ms)) = &append.outcome {
        invocation.arg(outcome).arg(*ended_ms);
    }
    invocation.invoke_async(connection).await
}
