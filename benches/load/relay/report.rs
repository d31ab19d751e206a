//! The relay's report: a table per relay scenario from the median rows, the JSON summary of each (its
//! settings, LiteLLM, the targets and whether the medians meet them), and the notes of a relay row in
//! the main table.
//!
//! Targets: `relay` (one request at a time): agentmux's added TTFT p50 under 1 ms and at least 5× less than
//! LiteLLM's; a concurrent scenario (`relay-N`): added TTFT p99 under 2 ms and at least 10× less than
//! LiteLLM's p99 at the same concurrency, and with a TLS upstream an added TTFT p50 within 0.2 ms of the
//! plain one's.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{LITELLM, LITELLM_TARGET, LITELLM_TLS_TARGET, Relay, TARGETS};
use crate::scenarios::RunResult;

/// What the relay's JSON report adds for one scenario.
#[derive(Debug, Serialize)]
pub(crate) struct Summary {
    scenario: String,
    /// Runs in flight at once.
    concurrency: usize,
    chunks: usize,
    interval_ms: f64,
    /// Counted requests per target and run.
    requests: usize,
    litellm_version: Option<String>,
    litellm_missing: Option<String>,
    /// Added TTFT p50 and p99 (ms) per target, from the medians.
    added_ttft_ms: BTreeMap<String, [Option<f64>; 2]>,
    /// LiteLLM's added TTFT p50 and p99 over agentmux's (each in front of the same upstream).
    litellm_over_agentmux: [Option<f64>; 2],
    litellm_tls_over_agentmux_tls: [Option<f64>; 2],
    /// The targets for this scenario, and whether they are met.
    targets: BTreeMap<String, Option<bool>>,
}

fn figure(rows: &[RunResult], scenario: &str, target: &str, key: &str) -> Option<f64> {
    rows.iter().find(|r| r.scenario == scenario && r.target == target).and_then(|r| r.extra.get(key).copied())
}

/// The name of a relay scenario.
fn scenario_name(relay: &Relay) -> String {
    if relay.concurrency > 1 { format!("relay-{}", relay.concurrency) } else { "relay".into() }
}

/// Counted requests per target and run.
fn counted(relay: &Relay) -> usize {
    if relay.concurrency > 1 { relay.concurrency * relay.rounds * super::concurrent::PER_VISIT } else { relay.requests }
}

fn one_summary(relay: &Relay, rows: &[RunResult]) -> Option<Summary> {
    let scenario = scenario_name(relay);
    rows.iter().find(|r| r.scenario == scenario)?;
    let get = |target: &str, key: &str| figure(rows, &scenario, target, key);
    let added = |target: &str| [get(target, "added_ttft_p50_ms"), get(target, "added_ttft_p99_ms")];
    let over = |litellm: &str, agentmux: &str| {
        let (l, a) = (added(litellm), added(agentmux));
        let ratio = |i: usize| match (l[i], a[i]) {
            (Some(l), Some(a)) if a > 0.0 => Some(l / a),
            _ => None,
        };
        [ratio(0), ratio(1)]
    };
    let state = LITELLM.get().cloned();
    let (agentmux, tls, litellm) = (added(TARGETS[1]), added(TARGETS[2]), added(LITELLM_TARGET));
    let mut targets = BTreeMap::new();
    let both = |a: Option<f64>, b: Option<f64>, met: fn(f64, f64) -> bool| a.zip(b).map(|(a, b)| met(a, b));
    if relay.concurrency > 1 {
        targets.insert("added_ttft_p99_under_2ms".into(), agentmux[1].map(|a| a < 2.0));
        targets
            .insert("added_ttft_p99_10x_less_than_litellm".into(), both(agentmux[1], litellm[1], |a, l| a * 10.0 <= l));
        targets.insert("tls_added_ttft_p50_within_0.2ms".into(), both(agentmux[0], tls[0], |a, t| t - a <= 0.2));
    } else {
        targets.insert("added_ttft_p50_under_1ms".into(), agentmux[0].map(|a| a < 1.0));
        targets
            .insert("added_ttft_p50_5x_less_than_litellm".into(), both(agentmux[0], litellm[0], |a, l| a * 5.0 <= l));
    }
    Some(Summary {
        concurrency: relay.concurrency,
        chunks: relay.pace.chunks,
        interval_ms: relay.pace.interval.as_secs_f64() * 1e3,
        requests: counted(relay),
        litellm_version: state.as_ref().and_then(|s| s.as_ref().ok()).map(|l| l.version.clone()),
        litellm_missing: match (&state, litellm[0]) {
            (Some(Err(why)), _) => Some(why.clone()),
            (_, None) => Some(if relay.no_litellm { "left out (--relay-no-litellm)" } else { "did not start" }.into()),
            _ => None,
        },
        added_ttft_ms: TARGETS[1..].iter().map(|&t| (t.to_owned(), added(t))).collect(),
        litellm_over_agentmux: over(LITELLM_TARGET, TARGETS[1]),
        litellm_tls_over_agentmux_tls: over(LITELLM_TLS_TARGET, TARGETS[2]),
        targets,
        scenario,
    })
}

/// The summary of each relay scenario that ran, from the median `rows`.
pub(crate) fn summary(relays: &[Relay], rows: &[RunResult]) -> Option<Vec<Summary>> {
    let all: Vec<Summary> = relays.iter().filter_map(|relay| one_summary(relay, rows)).collect();
    (!all.is_empty()).then_some(all)
}

fn ms(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.3}"))
}

fn ratio(value: Option<f64>) -> String {
    value.map_or("-".into(), |r| format!("{r:.1}x"))
}

/// A table per relay scenario, from the median rows.
pub(crate) fn print_tables(relays: &[Relay], rows: &[RunResult], runs: usize) {
    for relay in relays {
        print_table(relay, rows, runs);
    }
}

/// One relay scenario's table.
fn print_table(relay: &Relay, rows: &[RunResult], runs: usize) {
    let Some(summary) = one_summary(relay, rows) else { return };
    let header = [
        "target",
        "TTFT p50",
        "TTFT p99",
        "chunk p50",
        "chunk p99",
        "added TTFT p50",
        "added TTFT p99",
        "added chunk p50",
        "added chunk p99",
        "request",
        "CPU ms/req",
        "RSS MiB",
        "requests",
        "errors",
    ];
    let mut lines = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for row in rows.iter().filter(|r| r.scenario == summary.scenario) {
        let get = |key: &str| row.extra.get(key).copied();
        lines.push(vec![
            row.target.clone(),
            ms(get("ttft_p50_ms")),
            ms(get("ttft_p99_ms")),
            ms(get("chunk_p50_ms")),
            ms(get("chunk_p99_ms")),
            ms(get("added_ttft_p50_ms")),
            ms(get("added_ttft_p99_ms")),
            ms(get("added_chunk_p50_ms")),
            ms(get("added_chunk_p99_ms")),
            get("request_ms").map_or("-".into(), |v| format!("{v:.1}")),
            get("cpu_ms_per_request").map_or("-".into(), |v| format!("{v:.2}")),
            format!("{:.0}", row.server_peak_rss_mib),
            row.messages.to_string(),
            row.errors.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..header.len()).map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0)).collect();
    println!();
    let how = if relay.concurrency > 1 {
        format!("{} runs at once, {} requests per target after a warm-up round", relay.concurrency, summary.requests)
    } else {
        format!("{} requests per target after {} warm-up, interleaved", summary.requests, relay.warmup)
    };
    let medians = if runs > 1 { format!("medians of {runs} runs") } else { "one run".into() };
    println!(
        "{} ({} content chunks {:.1} ms apart; {how}; {medians}; ms):",
        summary.scenario, summary.chunks, summary.interval_ms
    );
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .enumerate()
            .map(|(i, c)| if i == 0 { format!("{c:<w$}", w = widths[i]) } else { format!("{c:>w$}", w = widths[i]) })
            .collect();
        println!("{}", cells.join("  "));
    }
    print_verdicts(&summary, rows);
}

/// The lines under a table: LiteLLM, the ratios, TLS, the targets, what the columns mean.
fn print_verdicts(summary: &Summary, rows: &[RunResult]) {
    match (&summary.litellm_version, &summary.litellm_missing) {
        (Some(version), None) => println!("LiteLLM {version} (litellm[proxy], one worker, its defaults)"),
        (version, Some(why)) => {
            println!("LiteLLM{} not measured: {why}", version.as_ref().map(|v| format!(" {v}")).unwrap_or_default())
        }
        (None, None) => {}
    }
    let [p50, p99] = summary.litellm_over_agentmux;
    let [tls50, tls99] = summary.litellm_tls_over_agentmux_tls;
    println!(
        "LiteLLM's added TTFT / agentmux's: p50 {}, p99 {}; with the TLS upstream: p50 {}, p99 {}",
        ratio(p50),
        ratio(p99),
        ratio(tls50),
        ratio(tls99)
    );
    let added = |target: &str| summary.added_ttft_ms.get(target).copied().unwrap_or([None, None]);
    println!(
        "TLS to the upstream: agentmux-tls's added TTFT p50 {} ms against agentmux's {} ms over plain HTTP",
        ms(added(TARGETS[2])[0]),
        ms(added(TARGETS[1])[0])
    );
    if let Some(load) = figure(rows, &summary.scenario, TARGETS[0], "load_cpu_cores") {
        println!("load generator: {load:.2} of a core (its client runs on one thread; concurrent: its busiest visit)");
    }
    let verdict = |met: &Option<bool>| match met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    };
    let targets: Vec<String> = summary.targets.iter().map(|(name, met)| format!("{name}: {}", verdict(met))).collect();
    println!("targets: {}", targets.join("; "));
    println!(
        "TTFT: request written to first content chunk read; chunk: a content chunk read less the time the upstream \
         stamped in it; added TTFT: per request, its TTFT less the upstream's own (request received to first chunk \
         made), the direct row's being the loopback hops and the client; added chunk: the proxy's quantile less the \
         direct one of the same run (median over runs); request: \
         the mean time from writing a request to the end of its answer; CPU: the server process per counted \
         request (direct: the upstream, which served every target); RSS: the server's peak."
    );
}

/// The keys of a relay row's figures, for the main table's notes.
pub(crate) fn notes(extra: &BTreeMap<String, f64>) -> Option<String> {
    let chunk_p50 = extra.get("chunk_p50_ms")?;
    let get = |key: &str| extra.get(key).map_or("-".into(), |v| format!("{v:.3}"));
    let mut text =
        format!("p50/p99: time to first token; per chunk p50 {chunk_p50:.3} / p99 {} ms", get("chunk_p99_ms"));
    if extra.contains_key("added_ttft_p50_ms") {
        text.push_str(&format!(
            "; added TTFT p50 {} / p99 {} ms, per chunk p50 {} / p99 {} ms",
            get("added_ttft_p50_ms"),
            get("added_ttft_p99_ms"),
            get("added_chunk_p50_ms"),
            get("added_chunk_p99_ms")
        ));
    }
    if let Some(cpu) = extra.get("cpu_ms_per_request") {
        text.push_str(&format!("; {cpu:.2} ms CPU/request"));
    }
    Some(text)
}
