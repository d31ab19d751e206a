//! Golden files: every fixture case rendered through every adapter must equal its checked-in files byte for
//! byte. The files are written and reviewed by a person; this test never rewrites them. On a mismatch it
//! leaves what it rendered under `target/golden-actual/<case>/` so the difference can be read with `diff`.

mod common;

use std::path::Path;

#[test]
fn every_case_matches_its_golden_files() {
    let cases = common::cases();
    assert!(cases.len() >= 15, "expected at least 15 golden cases, found {}", cases.len());
    let actual_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/golden-actual");
    let mut failures = Vec::new();
    for case in &cases {
        for (file, rendered) in common::render_case(case) {
            let golden_path = common::fixtures_dir().join(case).join(file);
            let golden = std::fs::read(&golden_path).ok();
            if golden.as_deref() != Some(&rendered[..]) {
                let dir = actual_root.join(case);
                std::fs::create_dir_all(&dir).expect("create target/golden-actual");
                std::fs::write(dir.join(file), &rendered).expect("write actual");
                failures.push(format!("diff {} {}", golden_path.display(), dir.join(file).display()));
            }
        }
    }
    assert!(failures.is_empty(), "{} golden files differ:\n{}", failures.len(), failures.join("\n"));
}

/// Every SSE golden file obeys the framing rules clients depend on.
#[test]
fn sse_framing_is_clean() {
    for case in common::cases() {
        for file in [
            "cui.sse",
            "openai.sse",
            "openai-usage.sse",
            "ui-message.sse",
            "ag-ui.sse",
            "anthropic.sse",
            "responses.sse",
        ] {
            let text = String::from_utf8(common::read(&case, file)).expect("utf-8");
            assert!(!text.contains('\r'), "{case}/{file}: CR in an SSE body");
            for event in text.split_terminator("\n\n") {
                for line in event.lines() {
                    let ok = line.starts_with("data: ")
                        || (file == "cui.sse" && line.starts_with("id: "))
                        || (matches!(file, "anthropic.sse" | "responses.sse") && line.starts_with("event: "));
                    assert!(ok, "{case}/{file}: unexpected line {line:?}");
                }
            }
            if matches!(file, "ag-ui.sse" | "anthropic.sse" | "responses.sse") {
                assert!(!text.contains("[DONE]"), "{case}/{file}: its clients parse every frame as JSON");
            } else if file != "cui.sse" {
                assert!(text.ends_with("data: [DONE]\n\n"), "{case}/{file}: must end with [DONE]");
                assert_eq!(text.matches("data: [DONE]").count(), 1, "{case}/{file}");
            }
        }
    }
}
