//! The relay's concurrent scenarios (`relay-50`, `relay-200`, issue "The gateway under load"): that many
//! streaming chat runs in flight at once through each target, the way a gateway is used, where the
//! one-request `relay` scenario measures a lone run.
//!
//! A round visits every target in turn (each round starting one target further on, as `relay` does), one
//! target at a time so that no two servers share the machine's two cores while measured: during a visit,
//! `concurrency` clients (each with its own keep-alive connection, `stream.rs`) send two streaming requests
//! one after the other. The clients start spread evenly over one answer's length, so the visit holds about
//! `concurrency` runs in flight from the start rather than a burst of them all arriving together and all
//! chunks of all runs falling on the same upstream timer tick. One round of one request per client warms
//! every target up (its connections, its pool to the upstream, LiteLLM's imports), then `rounds` rounds
//! are counted. Every answer is timed as in `relay`: time to first token from the request's write, each
//! chunk against the upstream's stamp.
//!
//! All clients run on the load generator's one client thread: at 200 runs of a chunk every 20 ms that is
//! 10,000 events a second to parse, a small share of one core; the run reports that share over its busiest
//! visit (`load_cpu_cores` on the direct row), so a client that fell behind would show.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::stream::{Answer, Client};
use super::{GIVE_UP, Marks, Measured, Outcome, Plan, chat_body, wall_ns};
use crate::procfs;

/// Requests each client sends one after the other in a visit.
pub(super) const PER_VISIT: usize = 2;

/// `rounds` counted rounds (after one warm-up round) of `concurrency` runs at once against each target.
pub(super) async fn measure(plan: Plan, concurrency: usize, rounds: usize) -> Outcome {
    let body = chat_body();
    let mut out: Vec<Measured> = plan.targets.iter().map(|_| Measured::default()).collect();
    let mut marks = Marks::now(&plan);
    let stagger = plan.stream / concurrency.max(1) as u32;
    // The load generator's CPU over its busiest counted visit, in cores.
    let mut busiest: f64 = 0.0;
    for round in 0..=rounds {
        let counted = round > 0;
        if round == 1 {
            marks = Marks::now(&plan);
        }
        let per_client = if counted { PER_VISIT } else { 1 };
        let n = plan.targets.len();
        for i in (0..n).map(|i| (i + round) % n) {
            if out[i].failing >= GIVE_UP {
                continue;
            }
            let (addr, key) = (plan.targets[i].1, plan.keys[i].clone());
            let (load, began) = (procfs::cpu_seconds(&std::process::id().to_string()), wall_ns());
            let answers = visit(addr, key, &body, concurrency, per_client, stagger, plan.limit).await;
            let load = procfs::cpu_seconds(&std::process::id().to_string()).since(load).total();
            let wall = wall_ns().saturating_sub(began) as f64 / 1e9;
            if counted && wall > 0.0 {
                busiest = busiest.max(load / wall);
            }
            for (answer, took) in answers {
                out[i].record(answer, took, plan.chunks, counted);
            }
        }
    }
    let mut outcome = marks.outcome(&plan, out);
    outcome.load_cores = Some(busiest);
    outcome
}

/// `clients` clients against `addr`, the `i`-th starting `i` staggers in, each sending `per_client`
/// requests; every answer with its time from write to end.
async fn visit(
    addr: SocketAddr,
    key: Option<String>,
    body: &[u8],
    clients: usize,
    per_client: usize,
    stagger: Duration,
    limit: Duration,
) -> Vec<(io::Result<Answer>, u64)> {
    let runs = (0..clients).map(|i| {
        let key = key.clone();
        async move {
            tokio::time::sleep(stagger * i as u32).await;
            let mut client = Client::new(addr, key);
            let mut answers = Vec::with_capacity(per_client);
            for _ in 0..per_client {
                let began = wall_ns();
                let answer = client.stream("/v1/chat/completions", body, limit).await;
                answers.push((answer, wall_ns().saturating_sub(began)));
            }
            answers
        }
    });
    futures::future::join_all(runs).await.into_iter().flatten().collect()
}
