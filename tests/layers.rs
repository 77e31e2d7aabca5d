//! The crate's layering: every module of src/ has a layer, and a module only uses modules of
//! lower layers. The layers are the table of docs/design.md "How the code is laid out" (its one
//! source): this test reads the table, then the `crate::` paths of every file, in `use` lines and
//! inline; a new module gets its row there.

use std::collections::BTreeMap;
use std::path::Path;

/// Module name to layer number (1 the top; a module may use only modules of a larger number),
/// read from the table of docs/design.md. `main` (layer `–`) is above every layer.
type Layers = BTreeMap<String, u32>;

const DESIGN: &str = "docs/design.md";
const SECTION: &str = "## How the code is laid out";

fn design_layers() -> Layers {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DESIGN);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{DESIGN}: {e}"));
    parse_layers(&text).unwrap_or_else(|e| panic!("{DESIGN}, {SECTION:?}: {e}"))
}

/// The layer table of the section `SECTION`: rows `| floor | layer | modules | what it owns |`,
/// every backquoted name of the modules cell on that row's layer.
fn parse_layers(text: &str) -> Result<Layers, String> {
    let section = text.split_once(SECTION).ok_or("section not found")?.1;
    let section = section.split("\n## ").next().unwrap_or_default();
    let mut layers = Layers::new();
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, _floor, layer, modules, ..] = cells[..] else {
            return Err(format!("row with fewer than 4 cells: {line}"));
        };
        if layer == "layer" || layer.starts_with("--") {
            continue;
        }
        let names: Vec<&str> = modules.split('`').skip(1).step_by(2).collect();
        if names.is_empty() {
            return Err(format!("row names no module: {line}"));
        }
        let number = match layer.parse::<u32>() {
            Ok(n) => Some(n),
            Err(_) if names == ["main"] => None,
            Err(_) => return Err(format!("layer {layer:?} is not a number: {line}")),
        };
        for name in names {
            if let Some(n) = number
                && layers.insert(name.to_string(), n).is_some()
            {
                return Err(format!("{name} has two rows"));
            }
        }
    }
    if layers.is_empty() { Err("no table rows".into()) } else { Ok(layers) }
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
    let layers = design_layers();
    let layer_of = |m: &str| layers.get(m).copied();
    let mut problems = Vec::new();
    for (module, files) in &mods {
        if module == "main" {
            continue;
        }
        let Some(mine) = layer_of(module) else {
            problems.push(format!("{module}: no row in the table of {DESIGN}"));
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
                    None if mods.contains_key(&used) => {
                        problems.push(format!("{used}: no row in the table of {DESIGN}"))
                    }
                    None => {}
                }
            }
        }
    }
    for m in layers.keys() {
        if !mods.contains_key(m) {
            problems.push(format!("{m}: in the table of {DESIGN} but not in src/"));
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
    let layers = design_layers();
    assert_eq!(layers.get("app"), Some(&1));
    assert!(layers["sys"] > layers["walk"]);
    assert!(!layers.contains_key("main"), "main is above every layer");
}

#[test]
fn the_table_parser_reads_rows_and_refuses_what_it_cannot_place() {
    let table = |rows: &str| {
        format!(
            "{SECTION}\n\n| floor | layer | module | what |\n|---|--:|---|---|\n{rows}\n## Next\n| x | 1 | `late` | x |"
        )
    };
    let layers =
        parse_layers(&table("| top | – | `main` | x |\n| | 1 | `a`, `b` | x `c` |\n| | 2 | `d` | x |")).unwrap();
    assert_eq!(layers, Layers::from([("a".into(), 1), ("b".into(), 1), ("d".into(), 2)]));
    assert!(parse_layers(&table("| | x | `a` | x |")).unwrap_err().contains("not a number"));
    assert!(parse_layers(&table("| | 1 | a | x |")).unwrap_err().contains("names no module"));
    assert!(parse_layers(&table("| | 1 | `a` | x |\n| | 2 | `a` | x |")).unwrap_err().contains("two rows"));
    assert!(parse_layers("no table").is_err());
}
