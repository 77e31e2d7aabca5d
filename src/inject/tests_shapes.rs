//! Every shape of node the parser gives, driven from [`Node`]: each tag (none, the core ones,
//! `!`, local, a `%TAG` handle, verbatim) × each text form (plain, single- and double-quoted,
//! literal and folded blocks, plain over lines, empty in each form; flow and block collections,
//! empty or not) × each position (value, implicit key, complex `?` key, block and flow sequence
//! item, flow mapping value, document root, alias target). Each round writes every
//! combination once (the texts picked by a seeded generator), then checks: parse → emit → parse
//! means the same (the self-check's comparison), and inside a workload `inject` rewrites, the
//! workload is injected (the self-check passed) with the shape read back as it was.
//!
//! `VOLPREP_YAML_ROUNDS` sets the rounds (CI runs more); `VOLPREP_YAML_SEED` the seed.

use std::fmt::Write as _;
use std::path::Path;

use super::check::first_difference;
use super::config::Config;
use super::emit;
use super::parse::parse;
use super::tests_roundtrip::{PLAIN, Rng, workload};
use super::{Outcome, inject_stream};

pub const TAGS: &[&str] = &[
    "",
    "!!str",
    "!!int",
    "!!bool",
    "!!null",
    "!!float",
    "!!binary",
    "!!map",
    "!!seq",
    "!",
    "!custom",
    "!e!thing",
    "!<tag:example.com,2000:v>",
];

/// How a node is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Plain,
    PlainLines,
    Single,
    Double,
    Literal,
    Folded,
    EmptyPlain,
    EmptySingle,
    EmptyDouble,
    EmptyLiteral,
    FlowSeq,
    FlowMap,
    EmptyFlowSeq,
    EmptyFlowMap,
    BlockSeq,
    BlockMap,
}

pub const FORMS: &[Form] = &[
    Form::Plain,
    Form::PlainLines,
    Form::Single,
    Form::Double,
    Form::Literal,
    Form::Folded,
    Form::EmptyPlain,
    Form::EmptySingle,
    Form::EmptyDouble,
    Form::EmptyLiteral,
    Form::FlowSeq,
    Form::FlowMap,
    Form::EmptyFlowSeq,
    Form::EmptyFlowMap,
    Form::BlockSeq,
    Form::BlockMap,
];

/// Where the node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    Value,
    Key,
    ComplexKey,
    SeqItem,
    FlowItem,
    FlowValue,
    Root,
    AliasTarget,
}

pub const POSITIONS: &[Position] = &[
    Position::Value,
    Position::Key,
    Position::ComplexKey,
    Position::SeqItem,
    Position::FlowItem,
    Position::FlowValue,
    Position::Root,
    Position::AliasTarget,
];

/// Texts a quoted or block scalar holds: YAML 1.1 words and numbers, indicators, escapes.
const CONTENT: &[&str] = &[
    "app",
    "0644",
    "yes",
    "No",
    "null",
    "~",
    "1:30",
    "0o17",
    "1e3",
    "a b",
    "it's",
    "tab\there",
    "é",
    "#x",
    "- x",
    "a: b",
    " lead",
    "trail ",
    "<<",
    "=",
    "\"q\"",
    "back\\slash",
    "2001-12-14",
];

/// Multi-line texts (blocks, double-quoted, plain over lines).
const LINES: &[&str] = &["one\ntwo", "one\n\ntwo\n", "key: v\n- item", "x\n  indented\n"];

/// The node's text after its properties, continued lines at `indent`; None when the form
/// cannot stand there (a block or a text over lines in a flow or an implicit key).
fn body(form: Form, rng: &mut Rng, indent: usize, inline: bool) -> Option<String> {
    let pad = " ".repeat(indent);
    let pick = |rng: &mut Rng, from: &[&'static str]| from[rng.below(from.len())];
    let multi = matches!(form, Form::PlainLines | Form::Literal | Form::Folded | Form::BlockSeq | Form::BlockMap);
    if inline && (multi || form == Form::EmptyLiteral) {
        return None;
    }
    Some(match form {
        Form::Plain => pick(rng, PLAIN).to_string(),
        Form::PlainLines => format!("plain\n{pad}over lines"),
        Form::Single => format!("'{}'", pick(rng, CONTENT).replace('\'', "''").replace('\t', " ")),
        Form::Double => {
            let from = if rng.chance(30) { LINES } else { CONTENT };
            serde_json::to_string(pick(rng, from)).unwrap()
        }
        Form::Literal | Form::Folded => {
            let text = pick(rng, LINES);
            let head = if form == Form::Literal { "|" } else { ">" };
            let mut s = format!("{head}{}", if text.ends_with('\n') { "" } else { "-" });
            for line in text.trim_end_matches('\n').split('\n') {
                let _ = write!(s, "\n{}{line}", if line.is_empty() { "" } else { &pad });
            }
            s
        }
        Form::EmptyPlain => String::new(),
        Form::EmptySingle => "''".into(),
        Form::EmptyDouble => "\"\"".into(),
        Form::EmptyLiteral => "|-".into(),
        Form::FlowSeq => {
            format!("[{}, '{}']", pick(rng, &["a", "0644", "yes", "~"]), pick(rng, CONTENT).replace('\'', "''"))
        }
        Form::FlowMap => format!("{{k: {}, \"q\": !!str 1}}", pick(rng, &["a", "0644", "yes", "~", ""])),
        Form::EmptyFlowSeq => "[]".into(),
        Form::EmptyFlowMap => "{}".into(),
        Form::BlockSeq => format!("\n{pad}- {}\n{pad}- - nested", pick(rng, &["a", "0644", "yes", "'q'"])),
        Form::BlockMap => format!("\n{pad}k1: {}\n{pad}k2:\n{pad}  - x", pick(rng, &["a", "0644", "yes", "\"\""])),
    })
}

/// A node: its properties (tag, maybe an anchor) then its body.
fn node(tag: &str, form: Form, rng: &mut Rng, indent: usize, inline: bool, anchor: Option<&str>) -> Option<String> {
    let body = body(form, rng, indent, inline)?;
    let mut props = Vec::new();
    if !tag.is_empty() {
        props.push(tag.to_string());
    }
    if let Some(a) = anchor {
        props.insert(rng.below(props.len() + 1), format!("&{a}"));
    }
    let mut s = props.join(" ");
    if !s.is_empty() && !body.is_empty() && !body.starts_with('\n') {
        s.push(' ');
    }
    s.push_str(&body);
    Some(s)
}

/// The block mapping (at indent 0) that holds the node at `pos`, or (Root) the document.
fn place(tag: &str, form: Form, pos: Position, rng: &mut Rng) -> Option<String> {
    // A plain scalar in a flow may not hold `,[]{}`, nor start with an indicator.
    let flow_safe = |s: &str| !s.contains([',', '[', ']', '{', '}', '#']) && !s.starts_with(['-', '<', '=']);
    Some(match pos {
        Position::Value => format!("k: {}\n", node(tag, form, rng, 2, false, None)?),
        Position::Key => {
            let n = node(tag, form, rng, 0, true, None)?;
            if n.is_empty() || (form == Form::Plain && (n.ends_with("<<") || n.contains(": ") || n.starts_with('-'))) {
                return None;
            }
            format!("{n} : v\n")
        }
        Position::ComplexKey => format!("? {}\n: v\n", node(tag, form, rng, 2, false, None)?),
        Position::SeqItem => format!("s:\n  - {}\n", node(tag, form, rng, 4, false, None)?),
        Position::FlowItem | Position::FlowValue => {
            let n = node(tag, form, rng, 2, true, None)?;
            if matches!(form, Form::Plain) && !flow_safe(&n) {
                return None;
            }
            // A space before the `,`: YAML 1.1 readers take `!!str,` for a tag.
            if pos == Position::FlowItem { format!("f: [{n} , z]\n") } else { format!("f: {{a: {n} , b: z}}\n") }
        }
        Position::Root => format!("--- {}\n", node(tag, form, rng, 0, false, None)?),
        Position::AliasTarget => {
            format!("a: {}\nb: *x\nc:\n  - *x\n", node(tag, form, rng, 2, false, Some("x"))?)
        }
    })
}

fn rounds_and_seed() -> (usize, u64) {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
    (env("VOLPREP_YAML_ROUNDS").unwrap_or(3) as usize, env("VOLPREP_YAML_SEED").unwrap_or(0x5eed_2026))
}

/// The shape's text with the `%TAG` its tag needs.
fn with_directive(tag: &str, text: &str) -> String {
    if tag.starts_with("!e!") {
        let doc = if text.starts_with("---") { text.to_string() } else { format!("---\n{text}") };
        format!("%TAG !e! tag:example.com,2000:\n{doc}")
    } else {
        text.to_string()
    }
}

/// Every shape, `rounds` times: (tag, form, position, text), parser-rejected ones left out
/// (counted in the second value).
pub fn shapes(rounds: usize, seed: u64) -> (Vec<(&'static str, Form, Position, String)>, usize) {
    let mut rng = Rng(seed ^ 3);
    let (mut out, mut rejected) = (Vec::new(), 0);
    for _ in 0..rounds {
        for &tag in TAGS {
            for &form in FORMS {
                for &pos in POSITIONS {
                    let Some(text) = place(tag, form, pos, &mut rng) else { continue };
                    let text = with_directive(tag, &text);
                    if parse(&text).is_err() {
                        rejected += 1;
                        continue;
                    }
                    out.push((tag, form, pos, text));
                }
            }
        }
    }
    (out, rejected)
}

/// A workload holding a shape (not a root) under `x-data`, with the `%TAG` it needs.
pub fn shape_workload(tag: &str, text: &str) -> String {
    let body = text.strip_prefix("%TAG !e! tag:example.com,2000:\n---\n").unwrap_or(text);
    with_directive(tag, &workload(body))
}

#[test]
fn every_shape_round_trips_and_survives_a_rewrite() {
    let (rounds, seed) = rounds_and_seed();
    let (all, rejected) = shapes(rounds, seed);
    let mut combos = std::collections::HashSet::new();
    for (tag, form, pos, text) in &all {
        combos.insert((*tag, *form as usize, *pos as usize));
        let docs = parse(text).unwrap();
        for d in &docs {
            let out = emit::document(d, emit::Seqs::of(text))
                .unwrap_or_else(|e| panic!("{tag} {form:?} {pos:?}: {e}\n{text}"));
            let back =
                parse(&out).unwrap_or_else(|e| panic!("{tag} {form:?} {pos:?}: wrote no YAML: {e:?}\n{text}=>\n{out}"));
            if let Some(d) = first_difference(std::slice::from_ref(d), &back) {
                panic!("{tag} {form:?} {pos:?}: {d}\n{text}=>\n{out}");
            }
        }
        if *pos == Position::Root {
            continue;
        }
        let input = shape_workload(tag, text);
        let out = inject_stream(&input, Path::new("-"), &Config::default(), &[]).unwrap();
        let outcome = &out.events[0].outcome;
        if parse(&input).unwrap()[0].has_merge_key() {
            // A `<<` key: inject does not expand merges and leaves the workload as it is.
            assert!(matches!(outcome, Outcome::Unsupported(_)) && out.text == input, "{input}");
            continue;
        }
        assert_eq!(outcome, &Outcome::Injected, "{tag} {form:?} {pos:?}:\n{input}=>\n{}", out.text);
        let (a, b) = (parse(&input).unwrap().remove(0), parse(&out.text).unwrap().remove(0));
        let (a, b) = (a.get("x-data").unwrap().clone(), b.get("x-data").unwrap().clone());
        assert_eq!(first_difference(&[a], &[b]), None, "{tag} {form:?} {pos:?}:\n{input}=>\n{}", out.text);
    }
    let possible = TAGS.len() * FORMS.len() * POSITIONS.len();
    eprintln!(
        "shapes: seed {seed:#x}, {rounds} rounds, {} documents checked; {} of {possible} tag x form x position combinations written (the rest cannot be written there), {rejected} texts the parser rejected",
        all.len(),
        combos.len()
    );
    assert!(combos.len() * 10 >= possible * 7, "{} of {possible}", combos.len());
}
