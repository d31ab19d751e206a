//! Waiting for something to have happened: the one way a test synchronises with what it cannot await.
//!
//! A test that needs a server, a task or a process to have done something (a subscriber counted, a stream
//! ended, a process exited) asks for that condition again and again, a short [`POLL`] apart, until it holds
//! or a generous deadline passes; then it fails naming what it waited for. A sleep would have to guess how
//! long the thing takes: too short and the test is flaky on a busy machine, too long and it is slow.
//!
//! [`eventually`] is for async tests, [`eventually_blocking`] for code on a plain thread; both panic at the
//! deadline. [`until`] and [`until_blocking`] are the same polls without the panic, for the few callers that
//! report a timeout in their own way (with a process's log, or as an error value). A condition answers a
//! `bool`, or an `Option` whose value the wait returns (see [`Reached`]).
//!
//! The sleeps left in the tests are the scenario itself (a producer that paces its writes, a client that
//! stalls, a silence long enough for pings), each with a comment saying so.

use std::time::{Duration, Instant};

/// How long a wait sleeps between two looks at its condition.
pub(crate) const POLL: Duration = Duration::from_millis(10);

/// What a condition answers: whether it holds, and what a wait for it returns.
pub(crate) trait Reached {
    /// What the wait returns once the condition holds.
    type Value;
    /// `Some` once the condition holds.
    fn reached(self) -> Option<Self::Value>;
}

impl Reached for bool {
    type Value = ();

    fn reached(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Reached for Option<T> {
    type Value = T;

    fn reached(self) -> Option<T> {
        self
    }
}

/// Waits until `condition` holds, looking every [`POLL`]; what it answered then, or `None` once `within`
/// has passed (the condition is asked a last time at the deadline).
pub(crate) async fn until<R: Reached>(within: Duration, mut condition: impl AsyncFnMut() -> R) -> Option<R::Value> {
    let deadline = Instant::now() + within;
    loop {
        let late = Instant::now() >= deadline;
        if let Some(value) = condition().await.reached() {
            return Some(value);
        }
        if late {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until `condition` holds and returns what it answered then; fails the test, naming `what` it waited
/// for, once `within` has passed.
pub(crate) async fn eventually<R: Reached>(
    what: &str,
    within: Duration,
    condition: impl AsyncFnMut() -> R,
) -> R::Value {
    until(within, condition).await.unwrap_or_else(|| panic!("waited {within:?} for {what}, in vain"))
}

/// [`until`] on a plain thread.
pub(crate) fn until_blocking<R: Reached>(within: Duration, mut condition: impl FnMut() -> R) -> Option<R::Value> {
    let deadline = Instant::now() + within;
    loop {
        let late = Instant::now() >= deadline;
        if let Some(value) = condition().reached() {
            return Some(value);
        }
        if late {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// [`eventually`] on a plain thread.
pub(crate) fn eventually_blocking<R: Reached>(what: &str, within: Duration, condition: impl FnMut() -> R) -> R::Value {
    until_blocking(within, condition).unwrap_or_else(|| panic!("waited {within:?} for {what}, in vain"))
}
