//! Every command's help: `--help` lists every flag and ends with examples that parse into the
//! command's options; `-h` shows the first-run flags only, in their groups.

use super::{Cli, Command};
use clap::CommandFactory;

/// The most lines a command's `-h` may take (at 100 columns).
const SHORT_HELP_LINES: usize = 60;

/// The built command line, at a fixed width.
fn cli() -> clap::Command {
    let mut c = Cli::command().term_width(100);
    c.build();
    c
}

/// Every subcommand's name (`help` aside).
fn names() -> Vec<String> {
    let c = cli();
    let names: Vec<String> = c
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .filter(|n| n != "help")
        .collect();
    assert!(names.len() >= 10, "{names:?}");
    names
}

/// `retrace NAME --help` (`long`) or `-h`.
fn help(name: &str, long: bool) -> String {
    let mut c = cli();
    let sub = c.find_subcommand_mut(name).expect("a subcommand");
    let text = if long {
        sub.render_long_help()
    } else {
        sub.render_help()
    };
    text.to_string()
}

/// The command lines of the help's closing `Examples:` section (comments left out, `\`
/// continuations joined); panics when the section is missing or is not the last.
fn examples(name: &str, text: &str) -> Vec<String> {
    let (_, tail) = text
        .rsplit_once("\nExamples:\n")
        .unwrap_or_else(|| panic!("{name}: no Examples section:\n{text}"));
    let mut out = Vec::new();
    let mut open = false;
    for line in tail.lines().filter(|l| !l.trim().is_empty()) {
        let (indent, body) = (line.len() - line.trim_start().len(), line.trim());
        let (cmd, more) = match body.strip_suffix(" \\") {
            Some(c) => (c, true),
            None => (body, false),
        };
        if open {
            assert_eq!(indent, 4, "{name}: continuation line {line:?}");
            let last: &mut String = out.last_mut().expect("a command before");
            last.push(' ');
            last.push_str(cmd);
        } else if !body.starts_with("# ") {
            assert!(
                indent == 2 && body.starts_with("retrace "),
                "{name}: Examples must be the last section; {line:?}"
            );
            out.push(cmd.to_string());
        }
        open = more;
    }
    assert!(!open, "{name}: the last example ends in a continuation");
    out
}

/// `line` split into words as a shell splits it (double quotes only).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut word, mut quoted, mut any) = (String::new(), false, false);
    for ch in line.chars() {
        match ch {
            '"' => (quoted, any) = (!quoted, true),
            ' ' if !quoted => {
                if any {
                    out.push(std::mem::take(&mut word));
                }
                any = false;
            }
            c => {
                word.push(c);
                any = true;
            }
        }
    }
    assert!(!quoted, "unbalanced quotes in {line:?}");
    if any {
        out.push(word);
    }
    out
}

/// The command line `argv` parsed and turned into its command's options: `Ok` when both work.
fn options_of(argv: &[String]) -> anyhow::Result<()> {
    match <Cli as clap::Parser>::try_parse_from(argv)?.command {
        Command::Replay(a) => a.config().map(drop),
        Command::Capacity(a) => a.options().map(drop),
        Command::Convert(a) => a.options().map(drop),
        Command::Synth(a) => a.options().map(drop),
        Command::Compare(a) => a.options().map(drop),
        Command::Report(a) => a.options().map(drop),
        // These two cannot fail.
        Command::Merge(a) => {
            let _ = a.options();
            Ok(())
        }
        Command::Inspect(a) => {
            let _ = a.options();
            Ok(())
        }
        Command::Mock(a) => a.config().map(drop),
        Command::Record(a) => a.config().map(drop),
    }
}

#[test]
fn every_help_ends_with_examples_that_parse_and_name_shipped_files() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in names() {
        let long = help(&name, true);
        let lines = examples(&name, &long);
        let own = format!("retrace {name} ");
        assert!(
            lines.iter().any(|l| l.starts_with(&own)),
            "{name}: no example of {own:?}: {lines:?}"
        );
        assert!((1..=3).contains(&lines.len()), "{name}: {lines:?}");
        for line in &lines {
            let argv = words(line);
            if let Err(e) = options_of(&argv) {
                panic!("{name}: example {line:?} does not parse: {e}");
            }
            for w in argv
                .iter()
                .filter(|w| w.starts_with("traces/") || w.starts_with("fixtures/"))
            {
                assert!(root.join(w).is_file(), "{name}: {line:?}: no file {w}");
            }
        }
        let short = help(&name, false);
        assert_eq!(
            examples(&name, &short),
            lines,
            "{name}: -h ends with the same examples"
        );
    }
}

/// `line` is `flag`'s own line of a help (`      --flag ...` or `  -o, --flag ...`), not a
/// description that mentions it.
fn flag_line(line: &str, flag: &str) -> bool {
    let rest = match line.strip_prefix("  -") {
        Some(r) if r.get(1..3) == Some(", ") => &r[3..],
        _ => match line.strip_prefix("      ") {
            Some(r) => r,
            None => return false,
        },
    };
    rest.strip_prefix(flag)
        .is_some_and(|after| !after.starts_with(|c: char| c.is_alphanumeric() || c == '-'))
}

#[test]
fn long_help_lists_every_flag_and_short_help_is_short() {
    let c = cli();
    for sub in c.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = sub.get_name();
        let (long, short) = (help(name, true), help(name, false));
        let lines = short.lines().count();
        assert!(
            lines < SHORT_HELP_LINES,
            "{name} -h: {lines} lines:\n{short}"
        );
        assert!(short.contains("-h, --help"), "{name} -h: {short}");
        for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(l) = arg.get_long() {
                let flag = format!("--{l}");
                let shown = |t: &str| t.lines().any(|x| flag_line(x, &flag));
                assert!(shown(&long), "{name} --help lacks {flag}");
                let in_short = !arg.is_hide_short_help_set();
                assert_eq!(shown(&short), in_short, "{name} -h and {flag}");
            }
        }
    }
}

#[test]
fn replay_short_help_has_the_first_run_flags_in_groups() {
    let short = help("replay", false);
    for flag in [
        "--target <URL>",
        "--model <NAME>",
        "--api-key-env <VAR>",
        "--speed <X>",
        "--request-rate <R>",
        "--limit <N>",
        "--window <START..END>",
        "--max-concurrency <C>",
        "--result-json <FILE>",
        "--dry-run",
        "-h, --help",
    ] {
        assert!(short.contains(flag), "replay -h lacks {flag}:\n{short}");
    }
    for heading in ["Target:", "Workload shaping:", "Results:"] {
        assert!(
            short.contains(&format!("\n{heading}\n")),
            "{heading}:\n{short}"
        );
    }
    for later in [
        "--tokenizer",
        "--overlay",
        "--scrape-metrics",
        "--header",
        "--goodput",
    ] {
        assert!(!short.contains(later), "replay -h shows {later}");
    }
    let long = help("replay", true);
    assert!(long.contains("--tokenizer <FILE>") && long.contains("--overlay <K>"));
}
