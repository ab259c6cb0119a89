//! The `sandlane` command line as a user meets it: `--help` lists the commands the README
//! names, and an unknown command is a usage error (exit 2).
//!
//! Being an integration test of the `app` package, this target also makes cargo build the
//! `sandlane` binary before any test of the same run starts, so the end-to-end tests in
//! `tests/`, which spawn `target/debug/sandlane`, find it under a plain
//! `cargo test --workspace` as under the test command.

use std::process::{Command, Output};

fn sandlane(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sandlane"))
        .args(args)
        .env_remove("SANDLANE_DATA_DIR")
        .output()
        .expect("run the sandlane binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The names in the `Commands:` block of a help text.
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn help_lists_the_commands_the_readme_names() {
    for (args, names) in [
        (&["--help"][..], &["serve", "caller", "keys", "audit"][..]),
        (&["caller", "--help"], &["add", "list", "revoke"]),
        (&["keys", "--help"], &["rotate"]),
        (&["audit", "--help"], &["verify"]),
    ] {
        let out = sandlane(args);
        assert!(out.status.success(), "sandlane {args:?}: {}", text(&out.stderr));
        let listed = commands(&text(&out.stdout));
        for name in names {
            assert!(listed.iter().any(|l| l == name), "sandlane {args:?} lists {listed:?}, not {name}");
        }
    }
}

#[test]
fn an_unknown_command_is_a_usage_error() {
    let out = sandlane(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
    assert!(text(&out.stderr).contains("unrecognized subcommand 'frobnicate'"), "{}", text(&out.stderr));
}
