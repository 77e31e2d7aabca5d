//! The crate's layering: every module of src/ has a layer, and a module only uses modules of
//! lower layers (docs/design.md "How the code is laid out"). Reads the `crate::` paths of every file,
//! in `use` lines and inline; a new module must be given a layer here.

use std::collections::BTreeMap;
use std::path::Path;

/// Top to bottom. A module may use only modules of a later row.
const LAYERS: &[&[&str]] = &[
    &["app"],
    &["cli"],
    &["inject_args"],
    &["apply", "demo", "inject", "inspect", "merge", "status"],
    &["shard", "sticky"],
    &["volume"],
    &["lifecycle"],
    &["pass"],
    &["resume"],
    &["caps", "fix", "frontier", "guard", "marker", "progress", "walk"],
    &["report"],
    &["verify"],
    &["apps"],
    &["error", "logsink", "options", "runid", "spec", "special", "sys"],
    &["bounded", "escape", "state", "sync"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|row| row.contains(&module))
}

/// The text with comments and string literals blanked out.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            c => out.push(c),
        }
    }
    out
}

/// The first module name of every `crate::` path in `code` (`crate::{a, b::c}` gives a and b).
fn crate_uses(code: &str) -> Vec<String> {
    let ident = |s: &str| s.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut item) = (0, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.push(ident(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 || c != '{' {
                    item.push(c);
                }
            }
            found.push(ident(&item));
        } else {
            found.push(ident(rest));
        }
    }
    found.retain(|m| !m.is_empty() && m != "self");
    found
}

/// Every .rs file under src/ with the top-level module it belongs to.
fn modules(src: &Path) -> BTreeMap<String, Vec<std::path::PathBuf>> {
    let mut out: BTreeMap<String, Vec<_>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).unwrap();
                let top = rel.components().next().unwrap().as_os_str().to_str().unwrap();
                out.entry(top.trim_end_matches(".rs").to_string()).or_default().push(p.clone());
            }
        }
    }
    out
}

#[test]
fn every_module_has_a_layer_and_imports_only_go_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    let mut problems = Vec::new();
    for (module, files) in &mods {
        if module == "main" {
            continue;
        }
        let Some(mine) = layer_of(module) else {
            problems.push(format!("{module}: no layer in tests/layers.rs"));
            continue;
        };
        for f in files {
            let code = code_only(&std::fs::read_to_string(f).unwrap());
            for used in crate_uses(&code) {
                if used == *module {
                    continue;
                }
                match layer_of(&used) {
                    Some(l) if l > mine => {}
                    Some(_) => problems.push(format!(
                        "{} uses crate::{used}, which is not below it",
                        f.strip_prefix(&src).unwrap().display()
                    )),
                    None if mods.contains_key(&used) => problems.push(format!("{used}: no layer in tests/layers.rs")),
                    None => {}
                }
            }
        }
    }
    for row in LAYERS {
        for m in *row {
            if !mods.contains_key(*m) {
                problems.push(format!("{m}: in tests/layers.rs but not in src/"));
            }
        }
    }
    assert!(problems.is_empty(), "layering broken:\n{}", problems.join("\n"));
}

#[test]
fn the_checker_sees_groups_inline_paths_and_skips_comments() {
    let code = code_only(
        "use crate::{a, b::{c, d}, e::F};\nlet x = crate::g::h();\n// crate::comment\nlet s = \"crate::string\";",
    );
    assert_eq!(crate_uses(&code), ["a", "b", "e", "g"]);
    assert_eq!(layer_of("app"), Some(0));
    assert!(layer_of("sys") > layer_of("walk"));
}
