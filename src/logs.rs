//! Where the service's log lines go: gathered in memory and written to stderr by one thread, a batch at a
//! time.
//!
//! Every request writes an access line. Written straight to stderr that is one `write` system call per
//! request on the thread that serves it (7% of the server's CPU with 10,000 small POSTs a second, measured in
//! `docs/benchmarks-history.md`); handed to a writer thread one line at a time (as `tracing-appender` does) it is a
//! wake-up of that thread per line instead. So a line is only copied into a shared buffer, and the writer
//! thread writes whatever gathered every [`INTERVAL`], or at once after a warning or an error. The buffer is
//! bounded: when the writer cannot keep up (stderr blocked), lines past [`CAPACITY`] are dropped and counted,
//! and the count is written as a line of its own once it can be. Dropping the [`LogFlush`] guard writes what
//! is left and stops the thread, so a clean exit loses nothing.
//!
//! ```
//! let (log, flush) = agentmux::logs::LogBuffer::stderr();
//! let subscriber = tracing_subscriber::fmt().with_writer(log).finish();
//! tracing::subscriber::with_default(subscriber, || tracing::info!("hello"));
//! drop(flush); // "hello" is on stderr now
//! ```

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// How long a line may wait in the buffer.
pub const INTERVAL: Duration = Duration::from_millis(50);
/// The most bytes the buffer holds; lines beyond are dropped and counted.
pub const CAPACITY: usize = 4 << 20;

/// The writing end handed to `tracing_subscriber::fmt().with_writer(..)`.
#[derive(Clone)]
pub struct LogBuffer {
    shared: Arc<Shared>,
}

/// Writes what is left and stops the writer thread when dropped.
pub struct LogFlush {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    dropped: AtomicU64,
}

#[derive(Default)]
struct State {
    lines: Vec<u8>,
    urgent: bool,
    closed: bool,
}

impl LogBuffer {
    /// A buffer whose lines a new thread writes to stderr.
    pub fn stderr() -> (LogBuffer, LogFlush) {
        Self::to(io::stderr(), INTERVAL)
    }

    fn to(out: impl Write + Send + 'static, interval: Duration) -> (LogBuffer, LogFlush) {
        let shared = Arc::new(Shared { state: Mutex::default(), wake: Condvar::new(), dropped: AtomicU64::new(0) });
        let writer = Arc::clone(&shared);
        let thread =
            std::thread::Builder::new().name("agentmux-log".into()).spawn(move || writer.write_out(out, interval));
        // Without a thread (none could be started), lines go nowhere rather than stopping the service.
        (LogBuffer { shared: Arc::clone(&shared) }, LogFlush { shared, thread: thread.ok() })
    }

    fn push(&self, line: &[u8], urgent: bool) {
        let mut state = self.shared.lock();
        if state.closed || state.lines.len() + line.len() > CAPACITY {
            drop(state);
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        state.lines.extend_from_slice(line);
        if urgent && !state.urgent {
            state.urgent = true;
            drop(state);
            self.shared.wake.notify_one();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// The writer thread: every `interval` (or when woken), take what gathered and write it.
    fn write_out(&self, mut out: impl Write, interval: Duration) {
        let mut batch = Vec::new();
        loop {
            let closed = {
                let mut state = self.lock();
                let deadline = Instant::now() + interval;
                while !state.urgent && !state.closed {
                    let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else {
                        break;
                    };
                    state = self.wake.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0;
                }
                state.urgent = false;
                std::mem::swap(&mut state.lines, &mut batch);
                state.closed
            };
            let dropped = self.dropped.swap(0, Ordering::Relaxed);
            if dropped > 0 {
                let _ =
                    writeln!(batch, "agentmux: {dropped} log lines dropped: stderr could not take them fast enough");
            }
            if !batch.is_empty() {
                // Nowhere to report a failed write to: the lines are dropped.
                let _ = out.write_all(&batch).and_then(|()| out.flush());
                batch.clear();
                batch.shrink_to(CAPACITY / 16);
            }
            if closed {
                return;
            }
        }
    }
}

impl Drop for LogFlush {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One line's writer: tracing's formatter writes each line whole, once.
pub struct LineWriter<'a> {
    buffer: &'a LogBuffer,
    urgent: bool,
}

impl Write for LineWriter<'_> {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        self.buffer.push(line, self.urgent);
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogBuffer {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter { buffer: self, urgent: false }
    }

    /// Warnings and errors are written at once.
    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        LineWriter { buffer: self, urgent: *meta.level() <= tracing::Level::WARN }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` the test can read back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            crate::sync::lock(&self.0).extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8_lossy(&crate::sync::lock(&self.0)).into_owned()
        }
    }

    #[test]
    fn lines_come_out_in_order_and_all_by_the_guard() {
        let sink = Sink::default();
        let (log, flush) = LogBuffer::to(sink.clone(), INTERVAL);
        for i in 0..1000 {
            log.make_writer().write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        drop(flush);
        let expected: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(sink.text(), expected);
    }

    #[test]
    fn lines_wait_for_the_interval_and_a_warning_takes_them_at_once() {
        let sink = Sink::default();
        let (log, _flush) = LogBuffer::to(sink.clone(), Duration::from_secs(3600));
        log.make_writer().write_all(b"info\n").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(sink.text(), "", "an info line waits for the interval");
        LineWriter { buffer: &log, urgent: true }.write_all(b"warn\n").unwrap();
        let started = Instant::now();
        while sink.text() != "info\nwarn\n" {
            assert!(started.elapsed() < Duration::from_secs(10), "a warning was not written: {:?}", sink.text());
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn lines_are_written_every_interval() {
        let sink = Sink::default();
        let (log, _flush) = LogBuffer::to(sink.clone(), Duration::from_millis(5));
        log.make_writer().write_all(b"info\n").unwrap();
        let started = Instant::now();
        while sink.text() != "info\n" {
            assert!(started.elapsed() < Duration::from_secs(10), "an info line was never written");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_full_buffer_drops_lines_and_says_how_many() {
        /// Blocks every write until told to go on: stderr that nobody reads.
        struct Blocked(Arc<(Mutex<bool>, Condvar)>, Sink);
        impl Write for Blocked {
            fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
                let (open, turn) = &*self.0;
                let mut open = crate::sync::lock(open);
                while !*open {
                    open = turn.wait(open).unwrap_or_else(PoisonError::into_inner);
                }
                self.1.write(bytes)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let sink = Sink::default();
        let (log, flush) = LogBuffer::to(Blocked(Arc::clone(&gate), sink.clone()), INTERVAL);
        // The first line goes to the writer (at once: an error), which then blocks on it.
        LineWriter { buffer: &log, urgent: true }.write_all(b"first\n").unwrap();
        while !log.shared.lock().lines.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut line = vec![b'x'; 1023];
        line.push(b'\n');
        let fits = CAPACITY / line.len();
        for _ in 0..fits + 10 {
            log.make_writer().write_all(&line).unwrap();
        }
        *crate::sync::lock(&gate.0) = true;
        gate.1.notify_all();
        drop(flush);
        let text = sink.text();
        assert!(text.starts_with("first\n"));
        assert_eq!(text.matches(&"x".repeat(1023)).count(), fits);
        assert!(text.ends_with("agentmux: 10 log lines dropped: stderr could not take them fast enough\n"), "{text}");
    }
}
