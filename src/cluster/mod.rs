//! Several agentmux nodes serving the same streams through Redis (`--engine redis`).
//!
//! # One writer per stream
//!
//! Every stream has one owner, the node that created it: that node's [`crate::hub::Stream`] validates,
//! stamps and reduces its appends, adds its lifecycle events and decides its outcome, exactly as on a single
//! node, and its log ([`writer::OwnedLog`]) writes the stamped entries to Redis. So the order of a stream is
//! decided in one place, by the same code as without Redis, and the reducer's view, the lifecycle and the
//! outcome cannot disagree with it. The other designs were weighed: stamping sequences on the Redis server
//! (a script per append that takes the next sequence) orders the entries but not what depends on their
//! order: whether a delta applies, which `message_start` goes before it, where `stream_end` falls; those
//! would have to move into Redis too, or be decided twice.
//!
//! The owner's writes go through one script ([`script`]) that checks, on the Redis server and in the same
//! step as the write, that the node is still the stream's owner and that the entries continue the log without
//! a gap; a node that is not the owner cannot write. Readers anywhere, the owner's own included, see only what
//! Redis holds (the owner's log moves a committed watermark as the writes are acknowledged), and a
//! producer's acknowledgement waits for it, as with the embedded store's disk. So a node that dies mid-append
//! loses only what nobody was told about: entries not yet in Redis were neither acknowledged nor read.
//!
//! # Followers
//!
//! A node asked for a stream it does not hold looks it up in Redis and follows it ([`Cluster::follow`],
//! `follow.rs`): its history into a log in memory, then each new entry as the owner's notice says it is
//! there. The followed stream is a [`crate::hub::Stream`] like any other for its readers: renditions made
//! once per format on this node and shared by its subscribers, resume, snapshots. Redis carries entries,
//! never rendered frames. The followed stream refuses its producer's side
//! ([`crate::hub::AppendError::Elsewhere`]). A node holds only the streams its own clients use: a followed
//! stream that nothing on the node has held for `--drop-followed-after` (no subscriber, no request) is let
//! go, and followed again from Redis when asked for.
//!
//! # A writer that dies
//!
//! Every node holds a lease in Redis, lapsing after `--redis-lease` (five seconds) unless renewed, and
//! renewed five times as often (`lease.rs`). A node that
//! follows an open stream whose writer's lease has lapsed claims the stream (a script that makes it the
//! writer only if the dead node still is, so one node wins and the dead one is fenced) and ends it with the
//! error `interrupted` after the last entry Redis holds, as a single node ends at restart what was open when
//! it stopped. A node judges another's lease only after its own renewals have gone through for a lease
//! and a second in a row, so that when Redis comes back from an outage, during which every lease lapsed,
//! live writers have renewed theirs before anyone judges. Nothing acknowledged is lost (acknowledgements waited for Redis), nothing a reader saw is
//! contradicted (readers saw only what Redis held), and every node's readers get the end within seconds.
//! A stream nobody follows is ended the same way by the first node asked for it.
//!
//! # Redis away
//!
//! Nothing handed to the writer is dropped while Redis is away: what Redis did not take waits in the
//! writer's backlog (`backlog.rs`), in order, and goes once Redis is back. Past `--redis-write-timeout` the
//! stream's producer is refused and the stream ends `store_unavailable`; that end is written behind the rest,
//! so every node reads the same log and the same end. A follower that has no answer from Redis for a lease
//! lets its stream go, telling its readers `lagged` where they are, and follows it again from Redis once
//! Redis answers (`follow.rs`): no reader waits on a node that cannot hear the writer.
//!
//! # Keys
//!
//! Threads and their audit log are shared through the same Redis (`thread_storage.rs`, the threads'
//! storage).
//!
//! `keys.rs`: per stream a Redis Stream of entries (entry id `<sequence>-0`), a hash of its facts, owner and
//! outcome, and a notice channel. The keys expire with the stream: its idle timeout and retention after each
//! append, its retention once it has ended.
//!
//! # TLS
//!
//! A `rediss://` URL is dialled with rustls (`tls.rs`), trusting the system's roots or the CA of
//! `--redis-ca-file`.

mod backlog;
mod connection;
mod follow;
mod keys;
mod lease;
mod script;
mod thread_storage;
mod tls;
mod writer;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo};
use tokio::sync::{Notify, mpsc};

use crate::hub::{Hub, Ids, Log, RandomIds, Storage, Stream, StreamInfo};
use connection::RedisConnection;
pub(crate) use thread_storage::RedisThreads;
use writer::{OwnedLog, Owner, Writer};

/// How long a command waits for Redis's answer.
const RESPONSE_WITHIN: Duration = Duration::from_secs(5);

/// This node's link to the others through Redis; cheap to clone.
#[derive(Debug, Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    connection: RedisConnection,
    /// Subscribed to the notice channels of the streams followed here (RESP3 pushes).
    notices: RedisConnection,
    writer: Writer,
    owner: Owner,
    /// Whether this node's lease renewals succeed, and since when (`lease.rs`).
    steady: Arc<lease::Steady>,
    /// How long leases last (`ClusterConfig::lease`).
    lease: lease::Lease,
    /// How long a followed stream nobody here uses is kept (`ClusterConfig::let_go_after`).
    let_go_after: Duration,
    /// The followed streams waiting for notices, by id.
    followers: Mutex<HashMap<String, Arc<Notify>>>,
    /// Held while a stream is being taken in, so two requests for it take it in once.
    following: tokio::sync::Mutex<()>,
    /// Ids Redis had no stream for, a moment ago.
    absent: Absent,
    /// For writes forwarded to the node that writes a stream.
    http: reqwest::Client,
    /// The secret stream tokens are signed with, the same on every node.
    secret: [u8; 32],
}

/// How a node joins: where Redis is, where the other nodes reach this one, and its streams' lifetimes.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// `redis://host:port/db`, or `rediss://` for TLS.
    pub redis_url: String,
    /// The CA a `rediss://` server's certificate chains to (PEM); `None`: the system's roots
    /// (`--redis-ca-file`).
    pub ca_pem: Option<Vec<u8>>,
    /// The URL other nodes reach this one at (its writes are forwarded there).
    pub advertise_url: String,
    /// The hub's idle timeout: an open stream's keys live this long plus the retention past its last append.
    pub idle_timeout: Duration,
    /// The hub's retention: an ended stream's keys live this long.
    pub retention: Duration,
    /// How long a stream written on another node stays followed here once nothing on this node uses it.
    pub let_go_after: Duration,
    /// How long a node's lease lasts unless renewed (`--redis-lease`); the same on every node. It also bounds
    /// how long a follower waits for an answer from Redis before it tells its readers.
    pub lease: Duration,
    /// How long the writer tries an append Redis does not take before the stream ends `store_unavailable`
    /// (`--redis-write-timeout`); what Redis did not take is still written, in order, once it is back.
    pub write_timeout: Duration,
}

impl Cluster {
    /// Connects to Redis and starts this node's writer.
    pub async fn connect(config: ClusterConfig) -> redis::RedisResult<Cluster> {
        // RESP3, so the notices arrive as pushes on a connection that still takes commands.
        let info = config.redis_url.as_str().into_connection_info()?;
        let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
        let info = info.set_redis_settings(settings);
        let client = tls::redis_client(info, config.ca_pem.as_deref())?;
        let settings = || {
            ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(Some(RESPONSE_WITHIN))
        };
        // Commands fail fast while Redis is away (a client gets its 503 in a moment, not after the manager's
        // default six reconnect attempts, ten seconds or more); every caller tries again on its own terms (the
        // writer for 10 s, the lease and followers each second), and each new command reconnects: the one that
        // finds the connection refused is sent once more on the new connection (`connection.rs`).
        let commands = settings().set_number_of_retries(2).set_max_delay(Duration::from_millis(500));
        let connection = RedisConnection::new(client.get_connection_manager_with_config(commands).await?);
        let (pushes, received) = mpsc::unbounded_channel();
        let notices = RedisConnection::new(
            client
                .get_connection_manager_with_config(settings().set_push_sender(pushes).set_automatic_resubscription())
                .await?,
        );
        let owner = Owner {
            node: Arc::from(RandomIds.epoch()),
            url: Arc::from(config.advertise_url.as_str()),
            open_ttl: config.idle_timeout + config.retention,
            ended_ttl: config.retention,
        };
        let secret = shared_secret(&mut connection.clone()).await?;
        // The lease is taken before any stream is made here, and kept for as long as the node runs.
        let lease = lease::Lease { lasts: config.lease };
        lease::renew(&mut connection.clone(), lease, &owner.node, &owner.url).await?;
        let steady = Arc::new(lease::Steady::from_now(lease));
        tokio::spawn(lease::keep(
            [connection.clone(), notices.clone()],
            lease,
            Arc::clone(&owner.node),
            Arc::clone(&owner.url),
            Arc::clone(&steady),
        ));
        let writer = Writer::start(connection.clone(), owner.clone(), config.write_timeout);
        let inner = Arc::new(Inner {
            connection,
            notices,
            writer,
            owner,
            steady,
            lease,
            let_go_after: config.let_go_after,
            followers: Mutex::new(HashMap::new()),
            following: tokio::sync::Mutex::new(()),
            absent: Absent::default(),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .build()
                .map_err(|e| redis::RedisError::from((redis::ErrorKind::Client, "an HTTP client", e.to_string())))?,
            secret,
        });
        tokio::spawn(route_notices(received, Arc::downgrade(&inner)));
        tracing::info!(node = %inner.owner.node, url = %inner.owner.url, "joined the cluster");
        Ok(Cluster { inner })
    }

    /// Waits, for at most `patience`, until Redis has everything this node's writer was handed before the
    /// call (what Redis refused included, see `writer.rs`): what a shutdown wrote (the ends of the streams it
    /// ended) reaches the other nodes before the process goes. False when `patience` ran out first.
    pub async fn flush(&self, patience: Duration) -> bool {
        tokio::time::timeout(patience, self.inner.writer.flush()).await.is_ok()
    }

    /// The storage the hub keeps the streams this node creates in.
    pub fn storage(&self) -> Arc<dyn Storage> {
        Arc::new(RedisStorage { writer: self.inner.writer.clone() })
    }

    /// The threads every node shares, kept in Redis for `ttl` without a change.
    pub(crate) fn threads(&self, ttl: Duration) -> RedisThreads {
        RedisThreads::new(self.clone(), self.inner.connection.clone(), ttl)
    }

    /// This node's id, as Redis names the owner of its streams.
    pub fn node(&self) -> &str {
        &self.inner.owner.node
    }

    /// True while this node reaches Redis (its last lease renewal, at most a second ago, succeeded).
    pub fn reaches_redis(&self) -> bool {
        self.inner.steady.reaches_redis()
    }

    /// The URL other nodes reach this one at.
    pub fn url(&self) -> &str {
        &self.inner.owner.url
    }

    /// The URL of the node that writes stream `id` (`None`: Redis has no such stream).
    pub async fn writer_url(&self, id: &str) -> redis::RedisResult<Option<String>> {
        use redis::AsyncCommands;
        self.inner.connection.clone().hget(keys::meta(id), "url").await
    }

    /// The secret stream tokens are signed with: made by the first node, the same on every node, so a
    /// token one node gave works on all of them.
    pub fn secret(&self) -> [u8; 32] {
        self.inner.secret
    }

    /// The client writes are forwarded to other nodes with.
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }

    /// The stream `id`: the one `hub` holds, or else one written on another node, followed from now on
    /// (`None` when Redis has no such stream either).
    pub async fn follow(&self, hub: &Hub, id: &str) -> redis::RedisResult<Option<Arc<Stream>>> {
        if let Some(held) = hub.get(id) {
            return Ok(Some(held));
        }
        if self.inner.absent.known(id) {
            return Ok(None);
        }
        // Bounded as one Redis answer is: however the connection fares while Redis comes and goes, a reader
        // gets its answer (a 503 it may retry) rather than wait.
        match tokio::time::timeout(RESPONSE_WITHIN, self.take_in(hub, id)).await {
            Ok(taken) => taken,
            Err(_) => Err(redis::RedisError::from((redis::ErrorKind::Io, "Redis did not answer in time"))),
        }
    }

    /// [`Cluster::follow`]'s part that asks Redis: the stream looked up, its history read, and its follower
    /// started.
    async fn take_in(&self, hub: &Hub, id: &str) -> redis::RedisResult<Option<Arc<Stream>>> {
        // Looked up before the lock, so ids Redis does not have (made up, mistyped, expired) never wait
        // behind the take-in of real streams, nor hold it up.
        let mut connection = self.inner.connection.clone();
        let Some(meta) = follow::meta(&mut connection, id).await? else {
            self.inner.absent.insert(id);
            return Ok(None);
        };
        let _one = self.inner.following.lock().await;
        if let Some(held) = hub.get(id) {
            return Ok(Some(held));
        }
        let notices = Arc::new(Notify::new());
        let open = meta.outcome.is_none();
        if open {
            // Subscribed before the history is read, so no append falls between the two.
            self.inner.listen(id, &notices).await?;
        }
        let log = match follow::history(&mut connection, id).await {
            Ok(log) => log,
            Err(error) => {
                self.inner.stop_listening(id).await;
                return Err(error);
            }
        };
        let stream = hub.follow(meta.info, Box::new(log));
        if open && stream.log().is_ended() {
            self.inner.stop_listening(id).await;
        }
        let (inner, hub, weak) = (Arc::clone(&self.inner), hub.clone(), Arc::downgrade(&stream));
        tokio::spawn(follow::keep_up(inner, hub, id.to_owned(), weak, connection, notices));
        tracing::debug!(stream = id, "following a stream written on another node");
        Ok(Some(stream))
    }
}

impl Inner {
    async fn listen(&self, id: &str, notices: &Arc<Notify>) -> redis::RedisResult<()> {
        if let Ok(mut followers) = self.followers.lock() {
            followers.insert(id.to_owned(), Arc::clone(notices));
        }
        self.notices.subscribe(keys::notices(id)).await
    }

    /// Stops the notices of a follower that is done with its stream (`notices` being its own), unless a
    /// newer follower of the same stream listens already: taken in under the same lock as a new follower,
    /// so an unsubscribe never lands after a newer subscribe.
    async fn done_following(&self, id: &str, notices: &Arc<Notify>) {
        let _one = self.following.lock().await;
        let mine = self.followers.lock().is_ok_and(|f| f.get(id).is_some_and(|n| Arc::ptr_eq(n, notices)));
        if mine {
            self.stop_listening(id).await;
        }
    }

    async fn stop_listening(&self, id: &str) {
        if let Ok(mut followers) = self.followers.lock() {
            followers.remove(id);
        }
        if let Err(error) = self.notices.unsubscribe(keys::notices(id)).await {
            tracing::debug!(stream = id, %error, "unsubscribing from a stream's notices");
        }
    }
}

/// Ids Redis had no stream for, each remembered for [`Absent::FOR`]: a client asking again and again for
/// a stream that does not exist is answered without asking Redis each time. Safe because stream ids are
/// made by the nodes, at random, and given out only once Redis has the stream: nobody holds an id before
/// its stream exists. Bounded: past [`Absent::MOST`] ids, those remembered longest are forgotten.
#[derive(Debug, Default)]
struct Absent(Mutex<HashMap<String, std::time::Instant>>);

impl Absent {
    const FOR: Duration = Duration::from_secs(1);
    const MOST: usize = 10_000;

    fn known(&self, id: &str) -> bool {
        self.0.lock().is_ok_and(|absent| absent.get(id).is_some_and(|at| at.elapsed() < Self::FOR))
    }

    fn insert(&self, id: &str) {
        let Ok(mut absent) = self.0.lock() else { return };
        if absent.len() >= Self::MOST {
            absent.retain(|_, at| at.elapsed() < Self::FOR);
            if absent.len() >= Self::MOST {
                absent.clear();
            }
        }
        absent.insert(id.to_owned(), std::time::Instant::now());
    }
}

/// The cluster's token secret: made by the first node that asks (`SET NX`), read by every other.
async fn shared_secret(connection: &mut RedisConnection) -> redis::RedisResult<[u8; 32]> {
    use redis::AsyncCommands;
    let made = crate::hub::random_secret();
    let _: Option<String> =
        redis::cmd("SET").arg(keys::SECRET).arg(&made[..]).arg("NX").query_async(connection).await?;
    let kept: Vec<u8> = connection.get(keys::SECRET).await?;
    kept.try_into()
        .map_err(|_| redis::RedisError::from((redis::ErrorKind::Parse, "the cluster's secret is not 32 bytes")))
}

/// Hands each notice to the follower of its stream.
async fn route_notices(mut pushes: mpsc::UnboundedReceiver<PushInfo>, inner: std::sync::Weak<Inner>) {
    while let Some(push) = pushes.recv().await {
        if push.kind != redis::PushKind::Message {
            continue;
        }
        let Some(channel) = push.data.first().and_then(|c| redis::from_redis_value::<String>(c.clone()).ok()) else {
            continue;
        };
        let Some(id) = keys::stream_of_notices(&channel) else { continue };
        let Some(inner) = inner.upgrade() else { return };
        let notices = inner.followers.lock().ok().and_then(|f| f.get(id).cloned());
        if let Some(notices) = notices {
            notices.notify_one();
        }
    }
}

/// The streams this node creates, written to Redis by its writer.
#[derive(Debug)]
struct RedisStorage {
    writer: Writer,
}

impl Storage for RedisStorage {
    fn log(&self, info: &StreamInfo, _client: Option<&str>) -> Box<dyn Log> {
        Box::new(OwnedLog::new(info, self.writer.clone()))
    }

    /// Redis expires a stream's keys itself.
    fn evict(&self, _id: &str) {}
}
