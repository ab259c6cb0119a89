use proptest::prelude::*;

use super::*;

#[test]
fn roots_and_relative_paths() {
    let p = SandboxPath::parse("/workspace").unwrap();
    assert_eq!(
        (p.root(), p.relative(), p.is_root(), p.to_string()),
        (Root::Workspace, "", true, "/workspace".into())
    );
    let p = SandboxPath::parse("/tmp//a/./b/").unwrap();
    assert_eq!((p.root(), p.relative(), p.to_string()), (Root::Tmp, "a/b", "/tmp/a/b".into()));
    assert_eq!(p.file_name(), Some("b"));
    let p = SandboxPath::parse("notes/todo.txt").unwrap();
    assert_eq!(p.to_string(), "/workspace/notes/todo.txt");
    let p = SandboxPath::parse(".").unwrap();
    assert!(p.is_root() && p.file_name().is_none());
    // Names that only start with dots are names.
    assert_eq!(SandboxPath::parse("/tmp/...").unwrap().relative(), "...");
    assert_eq!(SandboxPath::parse("..x/.y").unwrap().relative(), "..x/.y");
}

#[test]
fn refusals_name_the_input() {
    assert_eq!(SandboxPath::parse(""), Err(PathError::Empty));
    assert_eq!(SandboxPath::parse("/etc/passwd"), Err(PathError::OutsideRoots("/etc/passwd".into())));
    assert_eq!(SandboxPath::parse("/workspacex"), Err(PathError::OutsideRoots("/workspacex".into())));
    assert_eq!(SandboxPath::parse("//workspace"), Err(PathError::OutsideRoots("//workspace".into())));
    assert_eq!(SandboxPath::parse("/"), Err(PathError::OutsideRoots("/".into())));
    assert_eq!(
        SandboxPath::parse("/workspace/../../etc"),
        Err(PathError::DotDot("/workspace/../../etc".into()))
    );
    assert_eq!(SandboxPath::parse("../x"), Err(PathError::DotDot("../x".into())));
    assert_eq!(SandboxPath::parse("a\0b"), Err(PathError::Nul("a\0b".into())));
    let long = "a".repeat(MAX_PATH_CHARS + 1);
    assert_eq!(SandboxPath::parse(&long), Err(PathError::TooLong(MAX_PATH_CHARS + 1)));
    let long_name = format!("/tmp/{}", "é".repeat(MAX_NAME_CHARS + 1));
    assert_eq!(SandboxPath::parse(&long_name), Err(PathError::NameTooLong(long_name.clone())));
    assert!(
        SandboxPath::parse(&format!("/tmp/{}", "é".repeat(MAX_NAME_CHARS))).is_ok(),
        "characters, not bytes"
    );
    assert!(
        SandboxPath::parse("/workspace/../../etc").unwrap_err().to_string().contains("/workspace/../../etc")
    );
}

#[test]
fn entry_kinds_round_trip() {
    for kind in [EntryKind::File, EntryKind::Directory, EntryKind::Symlink, EntryKind::Other] {
        assert_eq!(EntryKind::parse(kind.as_str()), Some(kind));
    }
    assert_eq!(EntryKind::parse("dir"), None);
}

fn path_text() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just("...".to_owned()),
        Just(String::new()),
        "[a-z.\\x00\n é]{1,6}",
        Just("n".repeat(MAX_NAME_CHARS)),
        Just("n".repeat(MAX_NAME_CHARS + 1)),
        Just(format!(".{}", "n".repeat(MAX_NAME_CHARS - 1))),
        Just(format!("..{}", "n".repeat(MAX_NAME_CHARS - 1))),
    ];
    let root = prop_oneof![
        Just("/workspace".to_owned()),
        Just("/tmp".to_owned()),
        Just("/etc".to_owned()),
        Just("/workspacex".to_owned()),
        Just("/".to_owned()),
        Just(String::new()),
    ];
    (root, proptest::collection::vec(name, 0..5)).prop_map(|(root, names)| {
        if root.is_empty() { names.join("/") } else { format!("{root}/{}", names.join("/")) }
    })
}

proptest! {
    /// The schema's pattern (with its length bound) accepts exactly what parse accepts.
    #[test]
    fn the_pattern_is_the_rule(text in prop_oneof![path_text(), ".{0,20}"]) {
        static PATTERN: std::sync::LazyLock<regex::Regex> =
            std::sync::LazyLock::new(|| regex::Regex::new(PATH_PATTERN).unwrap());
        let pattern = &*PATTERN;
        let by_pattern = pattern.is_match(&text) && text.chars().count() <= MAX_PATH_CHARS;
        prop_assert_eq!(SandboxPath::parse(&text).is_ok(), by_pattern, "{:?}", text);
    }

    /// A parsed path prints as an absolute path that parses back to itself, and never
    /// holds a `..` component.
    #[test]
    fn parsed_paths_round_trip(text in path_text()) {
        if let Ok(path) = SandboxPath::parse(&text) {
            let shown = path.to_string();
            prop_assert!(shown.starts_with("/workspace") || shown.starts_with("/tmp"));
            prop_assert!(!shown.split('/').any(|n| n == ".."));
            // The length bound is the text's (as the schema's `maxLength`): a relative path
            // near it can be longer once `/workspace/` is put before it, and then parses back
            // in its relative form.
            if shown.chars().count() <= MAX_PATH_CHARS {
                prop_assert_eq!(SandboxPath::parse(&shown), Ok(path));
            } else {
                prop_assert!(!text.starts_with('/'));
                prop_assert_eq!(SandboxPath::parse(&shown), Err(PathError::TooLong(shown.chars().count())));
                prop_assert_eq!(SandboxPath::parse(path.relative()), Ok(path.clone()));
            }
        }
    }
}
