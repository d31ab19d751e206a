//! The `agentmux` command: a thin shell over the library.
//!
//! `agentmux render` reads a producer's messages (JSON Lines on standard input), validates each one, and
//! prints what a client of the chosen format receives: a way to see how an agent's output will look to a
//! CUI frontend or an OpenAI client before wiring anything up. A message that fails validation, or a delta
//! the reducer refuses, stops it with the reason and exit code 2, as a stream would refuse it.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use agentmux::adapter::{Adapter, CuiAdapter, OpenAiAdapter, OpenAiCompletion, OpenAiOptions, ReasoningField};
use agentmux::output::{Metadata, Outcome, OutputMessage, Reducer};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "agentmux", version, about = "Carries the output of LLM agents to every client that watches it")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Render messages (JSON Lines on stdin) as a client of FORMAT receives them.
    Render {
        /// The wire format.
        #[arg(long, value_enum, default_value = "openai")]
        format: Format,
        /// The model name OpenAI chunks report.
        #[arg(long, default_value = "agentmux")]
        model: String,
        /// Send the usage chunk (needs --outcome with usage).
        #[arg(long)]
        include_usage: bool,
        /// Where OpenAI chunks carry reasoning.
        #[arg(long, value_enum, default_value = "reasoning-content")]
        reasoning: Reasoning,
        /// How the stream ends, as JSON: {"status": "completed" | "cancelled" | "error", "usage"?, "error"?}.
        #[arg(long)]
        outcome: Option<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// The typed messages as SSE events.
    Cui,
    /// `chat.completion.chunk` SSE events.
    Openai,
    /// One non-streaming `chat.completion`.
    OpenaiJson,
    /// The final state of every message after its deltas, as JSON Lines.
    State,
}

#[derive(Clone, Copy, ValueEnum)]
enum Reasoning {
    /// `reasoning_content`
    #[value(name = "reasoning-content")]
    Content,
    /// `reasoning`
    #[value(name = "reasoning")]
    Plain,
    /// Both.
    Both,
}

fn main() -> ExitCode {
    let Cli { command: Command::Render { format, model, include_usage, reasoning, outcome } } = Cli::parse();
    let outcome = match outcome.as_deref().map(serde_json::from_str::<Outcome>).transpose() {
        Ok(outcome) => outcome.unwrap_or_default(),
        Err(e) => return fail(&format!("--outcome: {e}")),
    };
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut options = OpenAiOptions::new(format!("chatcmpl-{created}"), created, model);
    options.include_usage = include_usage;
    options.reasoning = match reasoning {
        Reasoning::Content => ReasoningField::ReasoningContent,
        Reasoning::Plain => ReasoningField::Reasoning,
        Reasoning::Both => ReasoningField::Both,
    };

    let mut messages = Vec::new();
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let line = match line {
            Ok(line) => line,
            Err(e) => return fail(&format!("reading stdin: {e}")),
        };
        if line.trim().is_empty() {
            continue;
        }
        match OutputMessage::from_json(&line) {
            Ok(mut message) => {
                let trace_id = message.metadata.take().and_then(|m| m.trace_id);
                message.metadata =
                    Some(Metadata { sequence: Some(messages.len() as u64 + 1), timestamp: None, trace_id });
                messages.push(message);
            }
            Err(e) => return fail(&format!("line {}: {e}", i + 1)),
        }
    }

    // Refuse what a stream would refuse: a delta that cannot apply.
    let mut reducer = Reducer::default();
    for (i, message) in messages.iter().enumerate() {
        if let Err(e) = reducer.apply(message) {
            return fail(&format!("message {}: {e}", i + 1));
        }
    }

    let mut out = Vec::new();
    match format {
        Format::Cui => render(&mut CuiAdapter, &messages, &outcome, &mut out),
        Format::Openai => render(&mut OpenAiAdapter::new(options), &messages, &outcome, &mut out),
        Format::OpenaiJson => {
            let mut completion = OpenAiCompletion::new(options);
            messages.iter().for_each(|m| completion.push(m));
            let body = completion.finish(&outcome).unwrap_or_else(|error| error.to_json());
            out.extend_from_slice(&body);
            out.push(b'\n');
        }
        Format::State => {
            for state in reducer.messages() {
                match serde_json::to_vec(state) {
                    Ok(json) => out.extend_from_slice(&json),
                    Err(e) => return fail(&e.to_string()),
                }
                out.push(b'\n');
            }
        }
    }
    match std::io::stdout().lock().write_all(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("writing stdout: {e}")),
    }
}

fn render(adapter: &mut dyn Adapter, messages: &[OutputMessage], outcome: &Outcome, out: &mut Vec<u8>) {
    let mut frames = Vec::new();
    for message in messages {
        adapter.push(message, &mut frames);
    }
    adapter.finish(outcome, &mut frames);
    frames.iter().for_each(|frame| out.extend_from_slice(frame));
}

fn fail(message: &str) -> ExitCode {
    eprintln!("agentmux: {message}");
    ExitCode::from(2)
}
