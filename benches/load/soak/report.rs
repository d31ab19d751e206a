//! The soak's samples and figures: the server's RSS and the counts every few seconds, the least-squares
//! slope of the RSS over the steady part, the verdict, the printed summary, the CSV of the samples and the
//! row of the benchmark table.
//!
//! The steady part starts after the warm-up (by default the first fifth of the duration: the streams,
//! the retained ones and the allocator reach their level). "RSS flat" is a figure: the growth the slope
//! projects over the steady part must stay under [`FLAT_GROWTH`] of the RSS at its start, and the RSS at
//! the end under [`FLAT_END`] times it.

use std::fmt::Write as _;
use std::io;
use std::path::Path;
use std::time::Duration;

use crate::procfs::{self, Server};
use crate::scenarios::RunResult;

use super::shared::{Counters, Shared};

/// The most the slope may add over the steady part, as a share of the RSS at its start.
const FLAT_GROWTH: f64 = 0.05;
/// The most the RSS at the end may be, as a multiple of the RSS at the start of the steady part.
const FLAT_END: f64 = 1.10;

/// The state of the soak at one time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// Seconds since the ramp ended.
    pub(crate) t: f64,
    pub(crate) rss_kib: u64,
    pub(crate) client_rss_kib: u64,
    pub(crate) held: i64,
    pub(crate) active_streams: usize,
    pub(crate) streams_created: u64,
    pub(crate) streams_ended: u64,
    pub(crate) deliveries: u64,
    pub(crate) errors: u64,
    pub(crate) lagged: u64,
}

impl Sample {
    pub(crate) fn take(t: f64, server: &Server, shared: &Shared) -> Sample {
        let c = &shared.counters;
        Sample {
            t,
            rss_kib: server.rss_kib(),
            client_rss_kib: procfs::status_kib("self", "VmRSS"),
            held: c.held(),
            active_streams: shared.board.active(),
            streams_created: Counters::get(&c.streams_created),
            streams_ended: Counters::get(&c.streams_ended),
            deliveries: Counters::get(&c.deliveries),
            errors: Counters::get(&c.errors),
            lagged: Counters::get(&c.lagged),
        }
    }

    /// One progress line.
    pub(crate) fn progress(&self) -> String {
        format!(
            "  soak {:>5.0}s  server RSS {:>7.1} MiB  held {:>6}  open streams {:>4}  created {:>6}  ended {:>6}  \
             delivered {:>11}  errors {}  lagged {}",
            self.t,
            mib(self.rss_kib),
            self.held,
            self.active_streams,
            self.streams_created,
            self.streams_ended,
            self.deliveries,
            self.errors,
            self.lagged
        )
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let (mx, my) = points.iter().fold((0.0, 0.0), |(sx, sy), &(x, y)| (sx + x / n, sy + y / n));
    let (sxy, sxx) =
        points.iter().fold((0.0, 0.0), |(sxy, sxx), &(x, y)| (sxy + (x - mx) * (y - my), sxx + (x - mx) * (x - mx)));
    if sxx > 0.0 { sxy / sxx } else { 0.0 }
}

/// What the run was, beside its samples.
pub(crate) struct Run<'a> {
    pub(crate) warmup: Duration,
    pub(crate) ramp_s: f64,
    pub(crate) target: usize,
    pub(crate) mix: &'a str,
    pub(crate) server_args: &'a [String],
    pub(crate) server_cpu: procfs::Cpu,
    pub(crate) client_cpu: procfs::Cpu,
    pub(crate) peak_rss_kib: u64,
}

/// Fills `result`, prints the summary and writes the samples to `csv`.
pub(crate) fn finish(run: &Run, samples: &[Sample], shared: &Shared, csv: &Path, result: &mut RunResult) {
    let c = &shared.counters;
    let get = Counters::get;
    let seconds = samples.last().map_or(0.0, |s| s.t);
    let warmup = run.warmup.as_secs_f64();
    let steady: Vec<&Sample> = samples.iter().filter(|s| s.t >= warmup).collect();
    let (start, end) = (steady.first().map_or(0, |s| s.rss_kib), steady.last().map_or(0, |s| s.rss_kib));
    let max = steady.iter().map(|s| s.rss_kib).max().unwrap_or(0);
    let points: Vec<(f64, f64)> = steady.iter().map(|s| (s.t / 60.0, mib(s.rss_kib))).collect();
    let slope = slope(&points);
    let steady_min = steady.last().zip(steady.first()).map_or(0.0, |(l, f)| (l.t - f.t) / 60.0);
    let projected = slope * steady_min;
    let start_mib = mib(start).max(1e-9);
    let (growth, end_ratio, max_ratio) = (projected / start_mib, mib(end) / start_mib, mib(max) / start_mib);
    let flat = growth < FLAT_GROWTH && end_ratio < FLAT_END;
    let held: Vec<i64> = steady.iter().map(|s| s.held).collect();
    let held_min = held.iter().copied().min().unwrap_or(0);
    let held_mean = held.iter().sum::<i64>() as f64 / held.len().max(1) as f64;
    let held_end = held.last().copied().unwrap_or(0);

    result.messages = get(&c.messages_appended);
    result.deliveries = get(&c.deliveries);
    result.seconds = seconds;
    result.deliveries_per_s = result.deliveries as f64 / seconds.max(1e-9);
    result.server_cpu_s = run.server_cpu.total();
    result.client_cpu_s = run.client_cpu.total();
    result.server_peak_rss_mib = mib(run.peak_rss_kib);
    result.errors = get(&c.errors);
    result.lagged = get(&c.lagged);
    for (key, value) in [
        ("soak_rss_start_mib", mib(start)),
        ("soak_rss_end_mib", mib(end)),
        ("soak_rss_max_mib", mib(max)),
        ("soak_rss_slope_mib_per_min", slope),
        ("soak_rss_end_over_start", end_ratio),
        ("soak_flat", f64::from(u8::from(flat))),
        ("soak_held_min", held_min as f64),
        ("soak_held_mean", held_mean),
        ("soak_held_end", held_end as f64),
        ("soak_opened", get(&c.opened) as f64),
        ("soak_streams_created", get(&c.streams_created) as f64),
        ("soak_streams_ended", get(&c.streams_ended) as f64),
        ("soak_subscriptions", get(&c.subscriptions) as f64),
        ("soak_completed", get(&c.completed) as f64),
        ("soak_http_errors", get(&c.http_errors) as f64),
        ("soak_died", get(&c.died) as f64),
        ("soak_ramp_s", run.ramp_s),
    ] {
        result.extra.insert(key.into(), value);
    }
    let notes = c.notes();
    for (note, count) in &notes {
        result.note(format!("{note} ×{count}"));
    }

    let mut out = String::new();
    let minutes = |s: f64| format!("{}m{:02.0}s", (s / 60.0).floor(), s % 60.0);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "soak: {} after a ramp of {:.1} s; target {} connections ({}); server flags: {}",
        minutes(seconds),
        run.ramp_s,
        run.target,
        run.mix,
        run.server_args.join(" ")
    );
    let _ = writeln!(
        out,
        "  connections held: {held_end} at the end, {held_min} min / {held_mean:.0} mean over the steady part; \
         {} opened in all",
        get(&c.opened)
    );
    let _ = writeln!(
        out,
        "  streams: {} created, {} ended; {} appends of {} messages",
        get(&c.streams_created),
        get(&c.streams_ended),
        get(&c.appends),
        get(&c.messages_appended)
    );
    let _ = writeln!(
        out,
        "  subscriptions: {} started, {} ended normally, {} lagged; delivered {} events and messages ({:.0}/s), \
         {} pings, {:.2} GiB",
        get(&c.subscriptions),
        get(&c.completed),
        get(&c.lagged),
        get(&c.deliveries),
        result.deliveries_per_s,
        get(&c.pings),
        get(&c.received_bytes) as f64 / (1u64 << 30) as f64
    );
    let _ = writeln!(
        out,
        "  errors: {} (non-2xx {}, connections died {}){}",
        get(&c.errors),
        get(&c.http_errors),
        get(&c.died),
        if notes.is_empty() {
            String::new()
        } else {
            format!(": {}", notes.iter().map(|(n, k)| format!("{n} ×{k}")).collect::<Vec<_>>().join("; "))
        }
    );
    let _ = writeln!(
        out,
        "  server RSS: {:.1} MiB at the start of the steady part (t = {}), {:.1} MiB at the end, max {:.1} MiB \
         (VmHWM {:.1} MiB)",
        mib(start),
        minutes(warmup),
        mib(end),
        mib(max),
        mib(run.peak_rss_kib)
    );
    let _ = writeln!(
        out,
        "  RSS slope: {slope:+.3} MiB/min (least squares over {} samples, {steady_min:.1} min); end/start \
         {end_ratio:.3}; max/start {max_ratio:.3}",
        steady.len()
    );
    let _ = writeln!(
        out,
        "  CPU: server {:.2} cores (user {:.0} s, system {:.0} s), load generator {:.2} cores",
        run.server_cpu.total() / seconds.max(1e-9),
        run.server_cpu.user,
        run.server_cpu.system,
        run.client_cpu.total() / seconds.max(1e-9)
    );
    let _ = writeln!(
        out,
        "  verdict: RSS flat: {} (projected growth over the steady part {projected:+.1} MiB = {:+.1}% of the start, \
         under {:.0}%: {}; end/start {end_ratio:.3}, under {FLAT_END:.2}: {})",
        if flat { "yes" } else { "no" },
        growth * 100.0,
        FLAT_GROWTH * 100.0,
        if growth < FLAT_GROWTH { "yes" } else { "no" },
        if end_ratio < FLAT_END { "yes" } else { "no" },
    );
    match write_csv(csv, samples) {
        Ok(()) => {
            let _ = writeln!(out, "  samples: {}", csv.display());
        }
        Err(e) => {
            let _ = writeln!(out, "  samples: writing {}: {e}", csv.display());
        }
    }
    print!("{out}");
}

fn write_csv(path: &Path, samples: &[Sample]) -> io::Result<()> {
    let mut csv = String::from(
        "t_s,server_rss_mib,client_rss_mib,held,open_streams,streams_created,streams_ended,deliveries,errors,lagged\n",
    );
    for s in samples {
        let _ = writeln!(
            csv,
            "{:.1},{:.1},{:.1},{},{},{},{},{},{},{}",
            s.t,
            mib(s.rss_kib),
            mib(s.client_rss_kib),
            s.held,
            s.active_streams,
            s.streams_created,
            s.streams_ended,
            s.deliveries,
            s.errors,
            s.lagged
        );
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, csv)
}
