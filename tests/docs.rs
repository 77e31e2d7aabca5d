//! The reference material that could drift from the program: docs/reference.md's flag tables
//! against `volprep --help`, its report keys against a real report, and the README's links.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::volprep;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `volprep ARGS --help`: each long flag with its env variable (if any).
fn help_flags(args: &[&str]) -> BTreeMap<String, Option<String>> {
    let out = volprep().args(args).arg("--help").output().expect("run volprep --help");
    assert!(out.status.success(), "volprep {args:?} --help");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // A flag's line, then its description's lines (long help), up to the next flag.
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        // `-j, --threads` or `--modes`; not `- kubelet: ...`, a possible value's line.
        let is_flag =
            t.starts_with("--") || t.starts_with('-') && t[1..].starts_with(|c: char| c.is_ascii_alphanumeric());
        let flag = is_flag.then(|| t.split_whitespace().find(|w| w.starts_with("--"))).flatten();
        match flag {
            Some(f) => entries.push((f.trim_end_matches(',').split('=').next().unwrap().to_string(), t.to_string())),
            None => {
                if let Some(last) = entries.last_mut() {
                    last.1 += " ";
                    last.1 += t;
                }
            }
        }
    }
    let mut flags = BTreeMap::new();
    for (flag, text) in entries {
        if flag == "--help" || flag == "--version" {
            continue;
        }
        let env = text.split("[env: ").nth(1).and_then(|r| r.split('=').next()).map(String::from);
        flags.insert(flag, env);
    }
    flags
}

/// The rows of the markdown table that follows `heading` in `text`: first cell → whole row.
fn table_rows<'t>(text: &'t str, heading: &str) -> Vec<&'t str> {
    let at = text.find(heading).unwrap_or_else(|| panic!("{heading:?} in the doc"));
    text[at..].lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).skip(2).collect()
}

/// The `--flags` named in the first cell of each row.
fn first_cell_flags(rows: &[&str]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for row in rows {
        let first = row.split(" | ").next().unwrap();
        for w in first.split('`').filter(|w| w.starts_with("--")) {
            out.insert(w.split_whitespace().next().unwrap().to_string(), row.to_string());
        }
    }
    out
}

/// Every flag of `apply`/`check` is in the Spec or Options table with its env variable, every
/// flag of the tables exists, the other commands' flags are named in the reference, and the
/// threads default the tables give is the one `--help` gives.
#[test]
fn reference_flag_tables_match_help() {
    let doc = read("docs/reference.md");
    let mut rows = table_rows(&doc, "## Spec");
    rows.extend(table_rows(&doc, "## Options"));
    let documented = first_cell_flags(&rows);
    for cmd in ["apply", "check"] {
        let help = help_flags(&[cmd]);
        for (flag, env) in &help {
            if flag == "--log-format" || flag == "--log-level" || documented.contains_key(flag) {
                if let (Some(env), Some(row)) = (env, documented.get(flag)) {
                    assert!(row.contains(&format!("`{env}`")), "docs/reference.md: {flag} row lacks `{env}`: {row}");
                }
                continue;
            }
            panic!("docs/reference.md: `{cmd} {flag}` is not in the Spec or Options table");
        }
        for flag in documented.keys() {
            assert!(help.contains_key(flag), "docs/reference.md documents {flag}, which `{cmd} --help` lacks");
        }
    }
    for cmd in [&["inspect"][..], &["status"], &["clear"], &["demo"], &["report", "merge"], &[]] {
        for flag in help_flags(cmd).keys() {
            assert!(doc.contains(flag.as_str()), "docs/reference.md never names `{}` {flag}", cmd.join(" "));
        }
    }
    let threads = &documented["--threads"];
    let out = volprep().args(["apply", "--help"]).output().unwrap();
    // Whitespace collapsed: clap wraps long help.
    let help = String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    for fact in ["4 per core", "32 to 64", "at most 1024"] {
        assert!(help.contains(fact), "apply --help: threads: {fact}");
        assert!(threads.contains(fact), "docs/reference.md: threads: {fact}");
    }
    assert!(help.contains("requests in flight, not cores"), "apply --help says why threads outnumber cores");
}

/// The report sample and the report key table of docs/reference.md have exactly the keys of a
/// real report (the table's "Only ..." rows aside, which a plain pass does not write).
#[test]
fn reference_report_keys_match_a_real_report() {
    let doc = read("docs/reference.md");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("vol")).unwrap();
    std::fs::write(dir.path().join("vol/f"), b"x").unwrap();
    let gid = rustix::process::getegid().as_raw().to_string();
    let out = volprep()
        .args(["check", "--fs-group", &gid, "--report", "-", "--termination-log"])
        .arg(dir.path().join("termination-log"))
        .arg(dir.path().join("vol"))
        .output()
        .unwrap();
    let real: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("report: {e}\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<BTreeSet<_>>();
    let real_keys = keys(&real["volumes"][0]);

    let start = doc.find("```json\n{\n  \"version\"").expect("a report sample") + "```json\n".len();
    let sample: serde_json::Value = serde_json::from_str(&doc[start..][..doc[start..].find("```").unwrap()]).unwrap();
    assert_eq!(keys(&sample), keys(&real), "sample: top level");
    assert_eq!(keys(&sample["volumes"][0]), real_keys, "sample: a volume's keys");

    let mut always = BTreeSet::new();
    let mut optional = BTreeSet::new();
    for row in table_rows(&doc, "### Report keys") {
        let cells: Vec<&str> = row.split(" | ").collect();
        let only = cells[1].starts_with("Only");
        for k in cells[0].split('`').filter(|w| !w.is_empty() && !w.starts_with('|') && !w.contains(',')) {
            let k = k.trim().to_string();
            if !k.is_empty() {
                if only {
                    optional.insert(k)
                } else {
                    always.insert(k)
                };
            }
        }
    }
    assert_eq!(always, real_keys, "docs/reference.md report key table vs a real report");
    for k in ["shard", "sticky", "fatal", "interrupted"] {
        assert!(optional.contains(k), "docs/reference.md: the optional key {k}");
    }
}

/// The README stays short, and every relative link in it and in docs/ names a file that exists.
#[test]
fn readme_is_short_and_links_resolve() {
    let readme = read("README.md");
    assert!(readme.lines().count() <= 320, "README.md has {} lines", readme.lines().count());
    let mut docs: Vec<String> = vec!["README.md".into()];
    for e in std::fs::read_dir(Path::new(ROOT).join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(format!("docs/{}", p.file_name().unwrap().to_string_lossy()));
        }
    }
    for rel in docs {
        let text = read(&rel);
        let base = Path::new(ROOT).join(&rel).parent().unwrap().to_path_buf();
        for link in text.split("](").skip(1).filter_map(|r| r.split(')').next()) {
            if link.starts_with("http") || link.starts_with('#') || link.starts_with("mailto:") {
                continue;
            }
            let file = link.split('#').next().unwrap();
            // docs/guarantees.md is written separately; the link may come before the file.
            if file.ends_with("guarantees.md") {
                continue;
            }
            assert!(base.join(file).exists(), "{rel}: link to {link}: no such file");
        }
    }
}

/// docs/inject.md names every flag of `volprep inject --help`, and every VOLPREP_INJECT_*
/// variable of a flag it gives one.
#[test]
fn inject_doc_names_every_flag() {
    let doc = read("docs/inject.md");
    for (flag, env) in help_flags(&["inject"]) {
        if flag == "--log-format" || flag == "--log-level" {
            continue;
        }
        assert!(doc.contains(flag.as_str()), "docs/inject.md never names `inject {flag}`");
        if let Some(env) = env.filter(|e| e.starts_with("VOLPREP_INJECT_") && e != "VOLPREP_INJECT_STRICT") {
            assert!(doc.contains(env.as_str()), "docs/inject.md never names {env} ({flag})");
        }
    }
}
