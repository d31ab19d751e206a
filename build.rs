//! Embeds every `fixtures/<name>/input.jsonl` (and its `outcome.json`) so the `replay/<name>` agents work
//! from any working directory, with nothing to install beside the binary.
//!
//! The generated table names each file relative to `CARGO_MANIFEST_DIR`, read when the crate compiles, not
//! by an absolute path written now: a target directory shared by two checkouts of the repository must
//! compile each against its own fixtures.

use std::fmt::Write;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=fixtures");
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let fixtures = Path::new(&root).join("fixtures");
    let mut cases: Vec<_> = std::fs::read_dir(&fixtures)
        .map(|dir| dir.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.join("input.jsonl").is_file()).collect())
        .unwrap_or_default();
    cases.sort();
    let mut out = String::from("/// (name, input.jsonl, outcome.json) of every fixture.\n");
    out.push_str("pub(crate) const FIXTURES: &[(&str, &str, Option<&str>)] = &[\n");
    let embed = |name: &str, file: &str| {
        format!("include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), {:?}))", format!("/fixtures/{name}/{file}"))
    };
    for case in cases {
        let name = case.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        let outcome = if case.join("outcome.json").is_file() {
            format!("Some({})", embed(&name, "outcome.json"))
        } else {
            "None".into()
        };
        let _ = writeln!(out, "    ({name:?}, {}, {outcome}),", embed(&name, "input.jsonl"));
    }
    out.push_str("];\n");
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into())).join("fixtures.rs");
    if let Err(e) = std::fs::write(&dest, out) {
        panic!("writing {}: {e}", dest.display());
    }
}
