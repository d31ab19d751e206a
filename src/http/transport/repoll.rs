//! [`Repolled`]: a connection that wakes itself while it is being polled is polled again at once, instead
//! of being queued behind every other task.
//!
//! hyper's connection passes a request's body to the handler through channels whose ends wake the
//! connection's own task while that task is running them; the request is answered in that same poll, so
//! the wake is stale by the time the poll ends. tokio treats a task woken while it runs as one that yielded and
//! queues it at the back of the worker's run queue, and a task already queued is not queued again: the next
//! request arriving on the socket cannot move it forward. Under a fan-out, where one POST wakes a thousand
//! subscribers, the back of the queue is a thousand writes away, and a producer posting one token at a time
//! waited 2–5 ms for each answer (`strace` of the load generator's producer). Polled once more at once, the
//! connection finds nothing to do, waits on its socket, and its next request is read as soon as it arrives.
//!
//! A wake in that second poll, or one that comes when the task's budget is spent (tokio's way of asking a
//! task to yield), is passed on as it would have been: a connection with work left still yields.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// Polls of the inner future in one poll of the task at most; past these a self-wake is passed on.
const REPOLLS: usize = 2;

/// Wraps a connection's future; see the module doc.
pub(crate) struct Repolled<F> {
    inner: F,
    wake: Arc<Recorder>,
    waker: Waker,
}

impl<F> Repolled<F> {
    pub(crate) fn new(inner: F) -> Self {
        let wake = Arc::new(Recorder::default());
        let waker = Waker::from(Arc::clone(&wake));
        Self { inner, wake, waker }
    }

    /// The wrapped future, to act on it between polls.
    pub(crate) fn inner_mut(&mut self) -> &mut F {
        &mut self.inner
    }
}

/// Not being polled: a wake goes to the task.
const IDLE: u8 = 0;
/// Being polled: a wake is recorded.
const POLLING: u8 = 1;
/// Being polled, and woken since the last look.
const WOKEN: u8 = 2;

/// Records a wake that comes while the inner future is being polled; passes on any other. One atomic holds
/// whether the future is being polled and whether it was woken, and every change of it is one read-modify-
/// write, so a wake from another thread is either seen by the poll's last look or passed on itself: never
/// lost between the two.
#[derive(Default)]
struct Recorder {
    state: AtomicU8,
    task: Mutex<Option<Waker>>,
}

impl Recorder {
    fn wake_task(&self) {
        let task = self.task.lock().ok().and_then(|task| task.clone());
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl Wake for Recorder {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let recorded = self.state.compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire);
        // IDLE: nobody is polling, so the task must be. (WOKEN: recorded already.)
        if recorded == Err(IDLE) {
            self.wake_task();
        }
    }
}

impl<F: Future + Unpin> Future for Repolled<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        if let Ok(mut task) = this.wake.task.lock()
            && !task.as_ref().is_some_and(|t| t.will_wake(cx.waker()))
        {
            *task = Some(cx.waker().clone());
        }
        this.wake.state.store(POLLING, Ordering::Release);
        let mut inner_cx = Context::from_waker(&this.waker);
        let mut polls = 0;
        let result = loop {
            if let Poll::Ready(output) = Pin::new(&mut this.inner).poll(&mut inner_cx) {
                break Poll::Ready(output);
            }
            polls += 1;
            // A self-wake that spent the task's budget is tokio asking the task to yield: it does.
            if polls == REPOLLS || !tokio::task::coop::has_budget_remaining() {
                break Poll::Pending;
            }
            if this.wake.state.swap(POLLING, Ordering::AcqRel) != WOKEN {
                break Poll::Pending;
            }
        };
        // A wake recorded and not answered by a poll (or one that came from another thread just now) is
        // passed on.
        if this.wake.state.swap(IDLE, Ordering::AcqRel) == WOKEN && result.is_pending() {
            cx.waker().wake_by_ref();
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts the wakes it gets.
    #[derive(Default)]
    struct WakeCount(AtomicUsize);

    impl Wake for WakeCount {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes itself in each of its first `self_wakes` polls, then waits for someone else.
    struct SelfWaking {
        polls: usize,
        self_wakes: usize,
        waker: Option<Waker>,
    }

    impl Future for SelfWaking {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls += 1;
            self.waker = Some(cx.waker().clone());
            if self.polls <= self.self_wakes {
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        }
    }

    fn poll_once<F: Future + Unpin>(future: &mut Repolled<F>, task: &Arc<WakeCount>) -> Poll<F::Output> {
        let waker = Waker::from(Arc::clone(task));
        Pin::new(future).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_wake_of_its_own_is_answered_by_polling_again_not_by_queueing_the_task() {
        let task = Arc::new(WakeCount::default());
        let mut future = Repolled::new(SelfWaking { polls: 0, self_wakes: 1, waker: None });
        assert!(poll_once(&mut future, &task).is_pending());
        assert_eq!(future.inner_mut().polls, 2, "polled again at once");
        assert_eq!(task.0.load(Ordering::SeqCst), 0, "the task is not woken for it");
    }

    #[test]
    fn a_future_that_keeps_waking_itself_still_yields() {
        let task = Arc::new(WakeCount::default());
        let mut future = Repolled::new(SelfWaking { polls: 0, self_wakes: usize::MAX, waker: None });
        assert!(poll_once(&mut future, &task).is_pending());
        assert_eq!(future.inner_mut().polls, REPOLLS);
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the last wake is passed on, so nothing hangs");
    }

    #[test]
    fn a_wake_between_polls_reaches_the_task() {
        let task = Arc::new(WakeCount::default());
        let mut future = Repolled::new(SelfWaking { polls: 0, self_wakes: 0, waker: None });
        assert!(poll_once(&mut future, &task).is_pending());
        assert_eq!(future.inner_mut().polls, 1);
        let waker = future.inner_mut().waker.take();
        std::thread::spawn(move || waker.into_iter().for_each(Waker::wake)).join().ok();
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_output_comes_through() {
        let task = Arc::new(WakeCount::default());
        let mut future = Repolled::new(std::future::ready(7));
        assert_eq!(poll_once(&mut future, &task), Poll::Ready(7));
    }

    /// Another thread wakes the future while it is being polled, at every moment it can: no wake is lost
    /// (a lost one would leave `block_on` waiting for good).
    #[test]
    fn a_wake_from_another_thread_is_never_lost() {
        use std::sync::atomic::AtomicBool;

        /// Ready once `done` is set; registers its waker for whoever sets it.
        struct Flagged {
            done: Arc<AtomicBool>,
            waker: Arc<Mutex<Option<Waker>>>,
        }

        impl Future for Flagged {
            type Output = ();

            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                if let Ok(mut waker) = self.waker.lock() {
                    *waker = Some(cx.waker().clone());
                }
                if self.done.load(Ordering::SeqCst) { Poll::Ready(()) } else { Poll::Pending }
            }
        }

        let (finished, waited) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for _ in 0..20_000 {
                let done = Arc::new(AtomicBool::new(false));
                let waker: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
                let future = Repolled::new(Flagged { done: Arc::clone(&done), waker: Arc::clone(&waker) });
                let setter = std::thread::spawn(move || {
                    while waker.lock().map(|w| w.is_none()).unwrap_or(true) {
                        std::hint::spin_loop();
                    }
                    done.store(true, Ordering::SeqCst);
                    let registered = waker.lock().ok().and_then(|w| w.clone());
                    registered.into_iter().for_each(Waker::wake);
                });
                futures::executor::block_on(future);
                let _ = setter.join();
            }
            let _ = finished.send(());
        });
        assert!(waited.recv_timeout(std::time::Duration::from_secs(60)).is_ok(), "a wake was lost");
    }
}
