//! The dependency rules of `src/` (ARCHITECTURE.md, invariant 28), read from the code itself:
//! every `crate::` path and every mention of clap outside comments and test modules (a
//! `tests.rs` file, or a `#[cfg(test)] mod`), by the folder of `src/` it sits in. A rule broken
//! names the file, the line and the rule.

use std::path::Path;

/// The ground floors, each below the next: a floor imports only floors under it.
const GROUND: [(&str, u32); 5] = [
    ("sys", 0),
    ("metrics", 0),
    ("trace", 1),
    ("wire", 2),
    ("result", 3),
];
/// The command modules and the command line.
const COMMANDS: [&str; 8] = [
    "replay", "record", "mock", "report", "synth", "inspect", "convert", "cli",
];
/// Only these import clap or the command line.
const CLAP_AND_CLI: [&str; 3] = ["lib", "main", "cli"];

/// The room of a file under `src/`: its folder, or `lib` / `main`; `None` for a loose file.
fn room(rel: &str) -> Option<&str> {
    match rel.split_once('/') {
        Some((dir, _)) => Some(dir),
        None if rel == "lib.rs" || rel == "main.rs" => Some(rel.trim_end_matches(".rs")),
        None => None,
    }
}

/// The `crate::` roots a line names, and whether it names clap.
fn names(line: &str) -> (Vec<&str>, bool) {
    let roots = line
        .match_indices("crate::")
        .filter(|(i, _)| !line[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
        .map(|(i, m)| {
            let rest = &line[i + m.len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    let clap = line.contains("clap::") || line.trim_start().starts_with("use clap");
    (roots, clap)
}

/// Every rule a file breaks, as `file:line: rule`.
fn violations(files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (rel, text) in files {
        let Some(from) = room(rel) else {
            out.push(format!(
                "src/{rel}: src/ holds lib.rs, main.rs and folders only"
            ));
            continue;
        };
        if rel.ends_with("/tests.rs") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let next = lines.get(n + 1).copied().unwrap_or("");
            let module = next
                .split_once("mod ")
                .is_some_and(|(vis, _)| vis.starts_with("pub") || vis.is_empty());
            if line.starts_with("#[cfg(test)]") && module {
                break;
            }
            // the code before a comment (a `//` inside a string cuts it short: a miss, never a
            // false alarm)
            let code = line.split("//").next().unwrap_or("");
            let at = format!("src/{rel}:{}", n + 1);
            let (roots, clap) = names(code);
            if clap && !CLAP_AND_CLI.contains(&from) {
                out.push(format!("{at}: only lib.rs, main.rs and cli/ use clap"));
            }
            for to in roots.into_iter().filter(|&to| to != from) {
                out.extend(rule(from, to).map(|r| format!("{at}: {from} imports {to}: {r}")));
            }
        }
    }
    out
}

/// The rule an import from room `from` of room `to` breaks, if any.
fn rule(from: &str, to: &str) -> Option<&'static str> {
    let floor = |r: &str| GROUND.iter().find(|(g, _)| *g == r).map(|(_, f)| *f);
    if to == "cli" && !CLAP_AND_CLI.contains(&from) {
        return Some("only lib.rs, main.rs and cli/ import the command line");
    }
    if from == "report" && to == "replay" {
        return Some("report never imports replay");
    }
    match (floor(from), floor(to)) {
        (Some(_), None) if COMMANDS.contains(&to) || to == "lib" => {
            Some("trace, wire, metrics, result and sys import no command module")
        }
        (Some(a), Some(b)) if b >= a => Some("a ground floor imports only the floors under it"),
        _ => None,
    }
}

fn sources(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, root, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            out.push((rel, std::fs::read_to_string(&p).unwrap()));
        }
    }
}

#[test]
fn the_code_keeps_the_dependency_rules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    assert!(files.len() > 50, "read {} files", files.len());
    let broken = violations(&files);
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn each_rule_broken_is_named_with_its_file_and_line() {
    let f = |rel: &str, text: &str| (rel.to_string(), text.to_string());
    let files = [
        f("loose.rs", "fn f() {}"),
        f("trace/x.rs", "use crate::replay::Config;"),
        f("mock/mod.rs", "\nuse clap::Parser;"),
        f("record/a.rs", "fn f(a: &crate::cli::RecordArgs) {}"),
        f("report/load.rs", "use crate::replay::plan;"),
        f("trace/y.rs", "use crate::wire::sse;"),
        f(
            "wire/z.rs",
            "use crate::trace::Request; // crate::mock in a comment is fine",
        ),
        f(
            "replay/a.rs",
            "// use crate::cli::ReplayArgs;\nuse crate::mock::MockConfig;",
        ),
        f(
            "sys/t.rs",
            "#[cfg(test)]\nmod tests { use crate::replay::x; }",
        ),
        f("sys/tests.rs", "use crate::replay::x;"),
        f("sys/u.rs", "#[cfg(test)]\nfn f() {}\nuse crate::mock::y;"),
        f("cli/mod.rs", "use clap::Parser; use crate::replay::Config;"),
    ];
    let broken = violations(&files);
    let want = [
        "src/loose.rs: src/ holds lib.rs, main.rs and folders only",
        "src/trace/x.rs:1: trace imports replay: trace, wire, metrics, result and sys import no command module",
        "src/mock/mod.rs:2: only lib.rs, main.rs and cli/ use clap",
        "src/record/a.rs:1: record imports cli: only lib.rs, main.rs and cli/ import the command line",
        "src/report/load.rs:1: report imports replay: report never imports replay",
        "src/trace/y.rs:1: trace imports wire: a ground floor imports only the floors under it",
        "src/sys/u.rs:3: sys imports mock: trace, wire, metrics, result and sys import no command module",
    ];
    assert_eq!(broken, want);
}
