//! [`Watched`]: a future run until it completes or a watcher of it does first, with the watcher polled only
//! when its own waker was woken.
//!
//! `tokio::select!` polls every branch each time its task is woken, since the task has one waker for all of
//! them. An event connection's task is woken for every batch it writes, while its watchers (the client
//! going away, the service shutting down) almost never complete; polled on every wake-up, they took two
//! locks per delivery (the socket's read readiness and the cancellation token's) and about a twentieth of
//! the user-space CPU a delivery costs (`BENCHMARKS.md`, session 22). Here the watcher gets a waker of its
//! own, which notes that it was woken before it wakes the task, and is polled only after such a wake.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// `work` run until it completes (`Some` of its output) or `watcher` completes first (`None`).
pub(crate) struct Watched<F, W> {
    work: F,
    watcher: W,
    woken: Arc<Woken>,
    waker: Waker,
}

/// The watcher's waker: whether it was woken since the watcher was last polled, and the task to wake.
struct Woken {
    flag: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.flag.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F, W> Watched<F, W> {
    pub(crate) fn new(work: F, watcher: W) -> Self {
        // Woken to begin with: the first poll polls the watcher, which registers its waker.
        let woken = Arc::new(Woken { flag: AtomicBool::new(true), task: AtomicWaker::new() });
        let waker = Waker::from(Arc::clone(&woken));
        Watched { work, watcher, woken, waker }
    }
}

impl<F: Future + Unpin, W: Future<Output = ()> + Unpin> Future for Watched<F, W> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // The task first, so that a watcher woken from here on wakes this task.
        this.woken.task.register(cx.waker());
        if let Poll::Ready(output) = Pin::new(&mut this.work).poll(cx) {
            return Poll::Ready(Some(output));
        }
        // Cleared before the poll: a wake during it is seen by the next one.
        if this.woken.flag.swap(false, Ordering::AcqRel)
            && Pin::new(&mut this.watcher).poll(&mut Context::from_waker(&this.waker)).is_ready()
        {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    /// A watcher that counts its polls and completes once `fire` is notified.
    async fn counted(polls: &AtomicUsize, fire: &tokio::sync::Notify) {
        let mut notified = std::pin::pin!(fire.notified());
        std::future::poll_fn(|cx| {
            polls.fetch_add(1, Ordering::SeqCst);
            notified.as_mut().poll(cx)
        })
        .await;
    }

    /// Work that wakes its task a hundred times polls a quiet watcher once, and gives its output when it
    /// completes; a watcher that completes ends work that never would.
    #[tokio::test]
    async fn the_watcher_is_polled_only_when_woken_and_ends_the_work() {
        let (polls, fire) = (AtomicUsize::new(0), tokio::sync::Notify::new());
        // The shape the service uses: work and watcher pinned on the stack.
        let work = std::pin::pin!(async {
            for _ in 0..100 {
                tokio::task::yield_now().await;
            }
            7
        });
        let watcher = std::pin::pin!(counted(&polls, &fire));
        assert_eq!(Watched::new(work, watcher).await, Some(7));
        assert_eq!(polls.load(Ordering::SeqCst), 1, "polled once, to register its waker");

        let never = std::pin::pin!(std::future::pending::<u32>());
        let watcher = std::pin::pin!(counted(&polls, &fire));
        let fired = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            fire.notify_waiters();
        };
        let (ended, ()) = tokio::join!(Watched::new(never, watcher), fired);
        assert_eq!(ended, None);
    }
}
