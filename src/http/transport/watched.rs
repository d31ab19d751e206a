//! [`Watched`]: a future run until it completes or a watcher of it does first, with the watcher polled only
//! when its own waker was woken; [`WakeFlag`], that waker, which event connections also poll their bodies
//! with.
//!
//! `tokio::select!` polls every branch each time its task is woken, since the task has one waker for all of
//! them. An event connection's task is woken for every batch it writes, while its watchers (the client
//! going away, the service shutting down) almost never complete; polled on every wake-up, they took two
//! locks per delivery (the socket's read readiness and the cancellation token's) and about a twentieth of
//! the user-space CPU a delivery costs (`docs/benchmarks-history.md`, session 22). Here the watcher gets a waker of its
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
    woken: WakeFlag,
}

/// A waker of its own for a part of a task: a wake notes that the part was woken, then wakes the task. The
/// task polls the part only when it was, and once at the start, so that the part registers this waker.
pub(crate) struct WakeFlag {
    shared: Arc<Woken>,
    waker: Waker,
}

impl WakeFlag {
    pub(crate) fn new() -> Self {
        // Woken to begin with: the first look polls the part.
        let shared = Arc::new(Woken { flag: AtomicBool::new(true), task: AtomicWaker::new() });
        let waker = Waker::from(Arc::clone(&shared));
        WakeFlag { shared, waker }
    }

    /// Registers the task polling now (whom a wake wakes) and says whether the part was woken since the
    /// last look: poll it then, with [`WakeFlag::context`]. The flag is cleared first, so a wake during that
    /// poll is seen at the next look.
    pub(crate) fn woken(&self, cx: &Context<'_>) -> bool {
        self.shared.task.register(cx.waker());
        self.shared.flag.swap(false, Ordering::AcqRel)
    }

    /// The context to poll the part with.
    pub(crate) fn context(&self) -> Context<'_> {
        Context::from_waker(&self.waker)
    }
}

/// A [`WakeFlag`]'s shared part: whether the part was woken since it was last polled, and the task to wake.
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
        Watched { work, watcher, woken: WakeFlag::new() }
    }
}

impl<F: Future + Unpin, W: Future<Output = ()> + Unpin> Future for Watched<F, W> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // The task registered first, so that a watcher woken from here on wakes it.
        let woken = this.woken.woken(cx);
        if let Poll::Ready(output) = Pin::new(&mut this.work).poll(cx) {
            // A wake taken here is not lost: the work is done, and with it the watching.
            return Poll::Ready(Some(output));
        }
        if woken && Pin::new(&mut this.watcher).poll(&mut this.woken.context()).is_ready() {
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
