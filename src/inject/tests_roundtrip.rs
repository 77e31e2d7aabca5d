//! Round-trip properties of the YAML tree and emitter, on documents a seeded generator writes
//! (tags, anchors and aliases, comments, block scalars, flow collections, CRLF, directives):
//! parse → emit → parse gives the same tree; a stream inject leaves alone comes back byte for
//! byte; a subtree of a rewritten workload means the same, to this parser and (the ignored
//! differential test) to a YAML 1.1 reader, PyYAML.
//!
//! `VOLPREP_YAML_SEED` picks the seed, `VOLPREP_YAML_CASES` the number of cases (and the
//! differential also reads every shape of tests_shapes, `VOLPREP_YAML_ROUNDS` times).

use std::fmt::Write as _;
use std::path::Path;

use super::config::Config;
use super::emit::{self, plain_safe};
use super::node::{Node, Style};
use super::parse::parse;
use super::{Outcome, inject_stream};

/// splitmix64: small, seeded, good enough to pick shapes.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub(super) fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// Plain scalars whose meaning differs between readers: YAML 1.1 octals, bases, underscores,
/// sexagesimals, booleans, nulls, floats, timestamps, and plain strings.
pub(super) const PLAIN: &[&str] = &[
    "app",
    "0644",
    "0o17",
    "0x1F",
    "0b101",
    "1_000",
    "+12",
    "-3",
    "1.5",
    "1e3",
    "6.8523015e+5",
    ".inf",
    "-.Inf",
    ".NaN",
    "190:20:30",
    "1:30",
    "yes",
    "No",
    "on",
    "OFF",
    "y",
    "n",
    "Y",
    "true",
    "False",
    "null",
    "Null",
    "~",
    "2001-12-14",
    "2001-12-14t21:59:43.10-05:00",
    "2002-12-14 21:59:43.10 -5",
    "a b c",
    "/volumes/data",
    "http://x:80/y",
    "--fs-group=1000",
    "=",
    "<<",
    "é",
    "v1.2.3",
    "0",
    "00",
    "08",
    "0.",
    "-0",
    "12e",
    "0x",
    "registry.example.com/app:1.0@sha256:ab",
];

/// Quoted scalars, as written.
const QUOTED: &[&str] = &[
    "'it''s'",
    "''",
    "\"\"",
    "\"yes\"",
    "'0644'",
    "\"tab\\there\"",
    "\"line\\nbreak\"",
    "\"\\u00e9\\\"q\\\\\"",
    "'# not a comment'",
    "\"a: b\"",
    "'- x'",
    "\"  lead\"",
    "\"trail  \"",
    "'multi\n  line'",
];

const WORDS: &[&str] = &["alpha", "beta", "gamma", "d e", "x-1", "0644", "yes", "#x", "a: b", "é"];

/// One generated document (or stream) and its anchors.
struct Gen<'r> {
    rng: &'r mut Rng,
    anchors: Vec<String>,
    next_anchor: usize,
    tag_handle: bool,
}

impl Gen<'_> {
    fn scalar(&mut self) -> String {
        let mut s = String::new();
        if self.rng.chance(10) {
            let tag = self.rng.pick(&["!!str ", "!custom ", "!!binary "]);
            if tag == "!!binary " {
                return "!!binary aGVsbG8=".into();
            }
            s.push_str(tag);
        } else if self.tag_handle && self.rng.chance(10) {
            s.push_str("!e!thing ");
        }
        if self.rng.chance(8) {
            let a = format!("a{}", self.next_anchor);
            self.next_anchor += 1;
            let _ = write!(s, "&{a} ");
            self.anchors.push(a);
        }
        let v = if self.rng.chance(65) { self.rng.pick(PLAIN) } else { self.rng.pick(QUOTED) };
        s.push_str(v);
        s
    }

    fn flow(&mut self, depth: usize) -> String {
        let n = self.rng.below(4);
        if self.rng.chance(50) {
            let items: Vec<String> = (0..n).map(|_| self.flow_item(depth)).collect();
            format!("[{}]", items.join(", "))
        } else {
            let items: Vec<String> = (0..n).map(|i| format!("f{i}: {}", self.flow_item(depth))).collect();
            format!("{{{}}}", items.join(", "))
        }
    }

    fn flow_item(&mut self, depth: usize) -> String {
        if depth < 2 && self.rng.chance(25) {
            return self.flow(depth + 1);
        }
        // In flow context a plain scalar may not hold `,[]{}` nor start with an indicator.
        loop {
            let anchors = self.anchors.len();
            let s = self.scalar();
            if !s.contains([',', '[', ']', '{', '}', '\n']) && !s.contains(" #") && !s.starts_with(['#', '<']) {
                return s;
            }
            self.anchors.truncate(anchors);
        }
    }

    fn comment(&mut self) -> &'static str {
        if self.rng.chance(15) { "  # a comment: with [brackets], 'quotes'" } else { "" }
    }

    /// A block scalar's header and lines at `indent`.
    fn block_scalar(&mut self, indent: usize) -> String {
        let header = self.rng.pick(&["|", "|-", "|+", ">", ">-", "|2"]);
        let mut s = format!(" {header}\n");
        let lines = 1 + self.rng.below(4);
        let extra = if header == "|2" { 0 } else { self.rng.below(2) * 2 };
        for i in 0..lines {
            if i > 0 && self.rng.chance(20) {
                s.push('\n');
            }
            let _ = writeln!(s, "{}{} {}", " ".repeat(indent + extra), self.rng.pick(WORDS), self.rng.pick(WORDS));
        }
        s
    }

    /// The text after `key:` (or `-`), newline included, children at `indent`.
    fn value(&mut self, indent: usize, depth: usize) -> String {
        let c = self.rng.below(100);
        if depth < 4 && c < 22 {
            let mut head = String::new();
            if self.rng.chance(10) {
                head.push_str(self.rng.pick(&[" !!map", " !custom"]));
            }
            let anchor = self.rng.chance(10).then(|| {
                let a = format!("a{}", self.next_anchor);
                self.next_anchor += 1;
                a
            });
            if let Some(a) = &anchor {
                let _ = write!(head, " &{a}");
            }
            let body = self.map(indent, depth + 1);
            if let Some(a) = anchor {
                self.anchors.push(a);
            }
            return format!("{head}{}\n{body}", self.comment());
        }
        if depth < 4 && c < 40 {
            let compact = if self.rng.chance(50) { 0 } else { 2 };
            return format!("{}\n{}", self.comment(), self.seq(indent - 2 + compact, depth + 1));
        }
        if c < 50 {
            return self.block_scalar(indent);
        }
        if c < 60 {
            return format!(" {}{}\n", self.flow(0), self.comment());
        }
        if c < 65 && !self.anchors.is_empty() {
            let a = self.anchors[self.rng.below(self.anchors.len())].clone();
            return format!(" *{a}\n");
        }
        if c < 68 {
            return "\n".into();
        }
        let s = self.scalar();
        if s.contains('\n') {
            // A multi-line quoted scalar continues at the children's indentation.
            return format!(" {}\n", s.replace('\n', &format!("\n{}", " ".repeat(indent))));
        }
        format!(" {s}{}\n", self.comment())
    }

    /// A block mapping at `indent` (1 to 4 entries, keys distinct).
    fn map(&mut self, indent: usize, depth: usize) -> String {
        let mut s = String::new();
        for i in 0..1 + self.rng.below(4) {
            if self.rng.chance(8) {
                let _ = writeln!(s, "{}# full-line comment", " ".repeat(self.rng.below(indent + 1)));
            }
            let key = if self.rng.chance(15) { format!("\"k{i} q\"") } else { format!("k{i}") };
            let _ = write!(s, "{}{key}:{}", " ".repeat(indent), self.value(indent + 2, depth));
        }
        s
    }

    /// A block sequence at `indent` (1 to 3 items).
    fn seq(&mut self, indent: usize, depth: usize) -> String {
        let mut s = String::new();
        for _ in 0..1 + self.rng.below(3) {
            let pad = " ".repeat(indent);
            if depth < 4 && self.rng.chance(30) {
                // A mapping item: its first entry on the `- ` line.
                let m = self.map(indent + 2, depth + 1);
                let mut lines = m.split_inclusive('\n');
                for line in lines.by_ref() {
                    if line.trim_start().starts_with('#') {
                        s.push_str(line);
                    } else {
                        let _ = write!(s, "{pad}- {}", line.trim_start());
                        break;
                    }
                }
                s.extend(lines);
            } else {
                let _ = write!(s, "{pad}-{}", self.value(indent + 2, depth + 1));
            }
        }
        s
    }
}

/// One document's text: maybe directives, maybe a tagged root, maybe CRLF.
fn document(rng: &mut Rng) -> String {
    let tag_handle = rng.chance(20);
    let mut g = Gen { rng, anchors: Vec::new(), next_anchor: 0, tag_handle };
    let mut text = String::new();
    if g.rng.chance(20) {
        text.push_str("%YAML 1.1\n");
    }
    if tag_handle {
        text.push_str("%TAG !e! tag:example.com,2000:\n");
    }
    let root_tag = g.rng.chance(10);
    if !text.is_empty() || root_tag || g.rng.chance(50) {
        text.push_str(if root_tag { "--- !!map\n" } else { "---\n" });
    }
    if g.rng.chance(20) {
        text.push_str("# leading comment\n");
    }
    text.push_str(&g.map(0, 0));
    if g.rng.chance(15) {
        text.push_str("...\n");
    }
    if g.rng.chance(20) { text.replace('\n', "\r\n") } else { text }
}

/// Quoted scalars that read as plain strings are the same string when written plain.
fn normal(n: &Node) -> Node {
    match n {
        Node::Scalar { text, style: Style::Quoted, tag } if plain_safe(text) => {
            Node::Scalar { text: text.clone(), style: Style::Plain, tag: tag.clone() }
        }
        Node::Scalar { .. } => n.clone(),
        Node::Seq { items, tag } => Node::Seq { items: items.iter().map(normal).collect(), tag: tag.clone() },
        Node::Map { entries, tag } => {
            Node::Map { entries: entries.iter().map(|(k, v)| (normal(k), normal(v))).collect(), tag: tag.clone() }
        }
    }
}

fn seed_and_cases() -> (u64, usize) {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
    (env("VOLPREP_YAML_SEED").unwrap_or(SEED), env("VOLPREP_YAML_CASES").unwrap_or(4000) as usize)
}

/// The default seed (fixed, so a failure replays).
const SEED: u64 = 0x5eed_2026;

/// A Pod that gets injected, holding `data` (a generated block mapping) under `x-data`.
pub(super) fn workload(data: &str) -> String {
    let data: String = data.lines().map(|l| if l.is_empty() { "\n".to_string() } else { format!("  {l}\n") }).collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nx-data:\n{data}spec:\n  securityContext: {{fsGroup: 1000}}\n  containers:\n    - name: c\n      image: i\n      volumeMounts: [{{name: d, mountPath: /d}}]\n  volumes:\n    - name: d\n      persistentVolumeClaim: {{claimName: d}}\n"
    )
}

/// parse → emit → parse is the same tree, for every generated document.
#[test]
fn parse_emit_parse_is_the_same_tree() {
    let (seed, cases) = seed_and_cases();
    let mut rng = Rng(seed);
    let mut docs = 0;
    for case in 0..cases {
        let text = document(&mut rng);
        let parsed =
            parse(&text).unwrap_or_else(|e| panic!("seed {seed} case {case}: generated no YAML: {e:?}\n{text}"));
        for d in &parsed {
            let out = emit::document(d, emit::Seqs::of(&text)).unwrap();
            let back = parse(&out)
                .unwrap_or_else(|e| panic!("seed {seed} case {case}: wrote no YAML: {e:?}\n{text}\n=>\n{out}"));
            assert_eq!(
                back.iter().map(normal).collect::<Vec<_>>(),
                vec![normal(d)],
                "seed {seed} case {case}:\n{text}\n=>\n{out}"
            );
            docs += 1;
        }
    }
    eprintln!("round trip: seed {seed:#x}, {cases} generated texts, {docs} documents parsed, written and parsed again");
    assert!(docs >= cases * 9 / 10);
}

/// A stream of generated documents that inject leaves alone comes back byte for byte; the same
/// documents inside a workload that inject rewrites mean what they meant.
#[test]
fn untouched_streams_are_byte_identical_and_rewritten_subtrees_mean_the_same() {
    let (seed, cases) = seed_and_cases();
    let mut rng = Rng(seed ^ 1);
    let mut stream = String::new();
    let mut rewritten = 0;
    for case in 0..cases / 4 {
        let doc = document(&mut rng);
        if !stream.is_empty() && (doc.starts_with('%') || !doc.starts_with("---")) {
            stream.push_str(if doc.starts_with('%') { "...\n" } else { "---\n" });
        }
        stream.push_str(&doc);
        let (input, out) = rewrite_case(&mut rng);
        let (a, b) = (parse(&input).unwrap().remove(0), parse(&out).unwrap().remove(0));
        assert!(b.at(&["spec", "initContainers"]).is_some(), "seed {seed} case {case}: not injected:\n{input}");
        if input.contains("\r\n") {
            assert!(!out.replace("\r\n", "").contains('\n'), "seed {seed} case {case}: mixed line endings");
        }
        assert_eq!(input.ends_with("...\n"), out.ends_with("...\n"), "seed {seed} case {case}: the document end");
        assert_eq!(
            a.get("x-data").map(normal),
            b.get("x-data").map(normal),
            "seed {seed} case {case}:\n{input}\n=>\n{out}"
        );
        rewritten += 1;
    }
    let out = inject_stream(&stream, Path::new("-"), &Config::default(), &[]).unwrap();
    assert!(out.events.iter().all(|e| matches!(e.outcome, Outcome::Skipped(_))));
    assert!(out.text == stream, "seed {seed}: an untouched stream changed");
    eprintln!("round trip: {} untouched documents byte for byte, {rewritten} rewritten workloads", out.events.len());
}

/// A workload holding a generated subtree, and what inject writes for it.
fn rewrite_case(rng: &mut Rng) -> (String, String) {
    let mut g = Gen { rng, anchors: Vec::new(), next_anchor: 0, tag_handle: false };
    let data = g.map(0, 1);
    let mut input = workload(&data);
    if g.rng.chance(20) {
        input = format!("%YAML 1.1\n--- !!map\n{input}...\n");
    }
    if g.rng.chance(20) {
        input = input.replace('\n', "\r\n");
    }
    let out = inject_stream(&input, Path::new("-"), &Config::default(), &[]).unwrap();
    (input, out.text)
}

/// The differential check: PyYAML (a YAML 1.1 reader, as Kubernetes' is) reads every rewritten
/// workload's generated subtree as it read the input's.
#[test]
#[ignore = "needs python3 with PyYAML: VOLPREP_PYTHON (source .ci/k8s-tools.sh)"]
fn a_yaml_1_1_reader_reads_rewritten_subtrees_the_same() {
    let python =
        std::env::var("VOLPREP_PYTHON").expect("VOLPREP_PYTHON: a python3 with PyYAML (source .ci/k8s-tools.sh)");
    let (seed, cases) = seed_and_cases();
    let mut rng = Rng(seed ^ 2);
    let dir = tempfile::tempdir().unwrap();
    let mut pairs = String::new();
    for _ in 0..cases / 4 {
        let (input, out) = rewrite_case(&mut rng);
        let _ = writeln!(pairs, "{}", serde_json::json!([input, out]));
    }
    // Every shape of node the parser gives (tests_shapes), inside a rewritten workload.
    let rounds = std::env::var("VOLPREP_YAML_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    for (tag, _, pos, text) in super::tests_shapes::shapes(rounds, seed).0 {
        if pos != super::tests_shapes::Position::Root {
            let input = super::tests_shapes::shape_workload(tag, &text);
            let out = inject_stream(&input, Path::new("-"), &Config::default(), &[]).unwrap();
            let _ = writeln!(pairs, "{}", serde_json::json!([input, out.text]));
        }
    }
    let file = dir.path().join("pairs.jsonl");
    std::fs::write(&file, pairs).unwrap();
    let script = r#"
import json, sys, yaml, math
class Loader(yaml.SafeLoader): pass
def tagged(loader, suffix, node):
    if isinstance(node, yaml.ScalarNode): return ("tag", suffix, loader.construct_scalar(node))
    if isinstance(node, yaml.SequenceNode): return ("tag", suffix, loader.construct_sequence(node, deep=True))
    return ("tag", suffix, loader.construct_mapping(node, deep=True))
Loader.add_multi_constructor("!", tagged)
Loader.add_multi_constructor("tag:example.com", tagged)
for t in ("value", "merge"):
    Loader.add_constructor("tag:yaml.org,2002:" + t, lambda loader, node, t=t: (t, loader.construct_scalar(node)))
def canon(x):
    if isinstance(x, float) and math.isnan(x): return "NaN"
    if isinstance(x, dict): return sorted((repr(canon(k)), canon(v)) for k, v in x.items())
    if isinstance(x, (list, tuple)): return [canon(i) for i in x]
    return (type(x).__name__, repr(x))
def load(text):
    # A tag PyYAML cannot construct (`!!int yes`, an unhashable key) fails alike on both sides.
    try: return canon(yaml.load(text, Loader)["x-data"])
    except Exception as e: return ("error", type(e).__name__, str(getattr(e, "problem", e)))
bad = n = 0
for line in open(sys.argv[1]):
    a, b = json.loads(line)
    n += 1
    x, y = load(a), load(b)
    if x != y:
        bad += 1
        if bad <= 3: print("DIFFERS:\n" + a + "\n=>\n" + b + "\n" + repr(x) + "\n" + repr(y))
print(f"{n} workloads, {bad} read differently by PyYAML {yaml.__version__}")
sys.exit(1 if bad else 0)
"#;
    let out = std::process::Command::new(&python).arg("-c").arg(script).arg(&file).output().expect("run python");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "seed {seed}: {text}");
}
