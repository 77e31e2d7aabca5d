//! The self-check on every document `inject` rewrites: its own output, read back, compared
//! node by node with the tree it meant to write, as a YAML 1.2 reader and as a YAML 1.1 reader
//! (Kubernetes' go-yaml, PyYAML) type each plain scalar. Aliases are expanded by the parser, so
//! an anchor's content is compared wherever it is used.

use super::node::{Node, Style};

/// What a plain scalar is to a schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Null,
    Bool,
    Int,
    Float,
    /// YAML 1.1 only: a date or a date and time.
    Timestamp,
    /// YAML 1.1 only: `<<` (merge) or `=` (value).
    Special,
    Str,
}

/// The path (`spec.template.x[2]`, `?k` for the key `k` itself) and the cause of the first
/// difference between the tree meant and the tree read back, or None when they mean the same.
pub fn first_difference(meant: &[Node], read: &[Node]) -> Option<String> {
    if meant.len() != read.len() {
        return Some(format!("(stream): {} documents meant, {} read back", meant.len(), read.len()));
    }
    meant.iter().zip(read).enumerate().find_map(|(i, (m, r))| {
        let (mut parts, why) = differ(m, r)?;
        if meant.len() > 1 {
            parts.push(format!("(document {})", i + 1));
        }
        let mut path = String::new();
        for p in parts.iter().rev() {
            if !path.is_empty() && !p.starts_with('[') {
                path.push('.');
            }
            path.push_str(p);
        }
        Some(format!("{}: {why}", if path.is_empty() { "(root)" } else { &path }))
    })
}

/// The first difference: the path's parts from the node up (innermost first), and why. Equal
/// nodes are passed at once; the path is built only on a difference.
fn differ(m: &Node, r: &Node) -> Option<(Vec<String>, String)> {
    if m == r {
        return None;
    }
    let here = |why: String| Some((Vec::new(), why));
    let under = |part: String, found: Option<(Vec<String>, String)>| {
        found.map(|(mut parts, why)| {
            parts.push(part);
            (parts, why)
        })
    };
    match (m, r) {
        (Node::Scalar { tag: mt, .. }, Node::Scalar { tag: rt, .. }) if mt != rt => here(tags(mt, rt)),
        (Node::Scalar { .. }, Node::Scalar { .. }) => scalar(m, r).map(|why| (Vec::new(), why)),
        (Node::Seq { items: mi, tag: mt }, Node::Seq { items: ri, tag: rt }) => {
            if mt != rt {
                return here(tags(mt, rt));
            }
            if mi.len() != ri.len() {
                return here(format!("{} items meant, {} read back", mi.len(), ri.len()));
            }
            mi.iter().zip(ri).enumerate().find_map(|(i, (a, b))| under(format!("[{i}]"), differ(a, b)))
        }
        (Node::Map { entries: me, tag: mt }, Node::Map { entries: re, tag: rt }) => {
            if mt != rt {
                return here(tags(mt, rt));
            }
            if me.len() != re.len() {
                return here(format!("{} keys meant, {} read back", me.len(), re.len()));
            }
            me.iter().zip(re).find_map(|((mk, mv), (rk, rv))| {
                under(format!("?{}", key_name(mk)), differ(mk, rk)).or_else(|| under(key_name(mk), differ(mv, rv)))
            })
        }
        _ => here(format!("a {} meant, a {} read back", shape(m), shape(r))),
    }
}

/// A key as a path part: its text, `(mapping key)` for a collection key.
fn key_name(k: &Node) -> String {
    match k {
        Node::Scalar { text, .. } if text.len() <= 64 && !text.contains(['\n', '\r']) => text.clone(),
        _ => format!("({} key)", shape(k)),
    }
}

fn shape(n: &Node) -> &'static str {
    match n {
        Node::Scalar { .. } => "scalar",
        Node::Seq { .. } => "sequence",
        Node::Map { .. } => "mapping",
    }
}

fn tags(m: &Option<String>, r: &Option<String>) -> String {
    let show = |t: &Option<String>| t.clone().unwrap_or_else(|| "no tag".into());
    format!("tag {} meant, {} read back", show(m), show(r))
}

/// Two scalars of one tag: the same text, typed alike by both schemas (a null may be written
/// `~`, `null` or nothing).
fn scalar(m: &Node, r: &Node) -> Option<String> {
    let (Node::Scalar { text: mt, .. }, Node::Scalar { text: rt, .. }) = (m, r) else { return None };
    let (m11, m12, r11, r12) = (kind_1_1(m), kind_1_2(m), kind_1_1(r), kind_1_2(r));
    if m11 != r11 || m12 != r12 {
        return Some(format!(
            "{mt:?} meant as a {m12:?} (YAML 1.2) and {m11:?} (YAML 1.1), {rt:?} read back as a {r12:?} and {r11:?}"
        ));
    }
    let null = m11 == Kind::Null && m12 == Kind::Null;
    (mt != rt && !null).then(|| format!("{mt:?} meant, {rt:?} read back"))
}

/// How a YAML 1.1 reader types a scalar: a quoted or tagged one by its tag (a string here).
pub fn kind_1_1(n: &Node) -> Kind {
    let Some(t) = untagged_plain(n) else { return Kind::Str };
    let lower = t.to_ascii_lowercase();
    let cased = t == lower || t == t.to_ascii_uppercase() || t == capitalised(&lower);
    if t.is_empty() || t == "~" || (cased && lower == "null") {
        Kind::Null
    } else if cased && ["y", "n", "yes", "no", "true", "false", "on", "off"].contains(&lower.as_str()) {
        Kind::Bool
    } else if t == "<<" || t == "=" {
        Kind::Special
    } else if int_1_1(t) {
        Kind::Int
    } else if float_1_1(t) || special_float(t) {
        Kind::Float
    } else if timestamp(t) {
        Kind::Timestamp
    } else {
        Kind::Str
    }
}

/// How a YAML 1.2 (core schema) reader types a scalar.
pub fn kind_1_2(n: &Node) -> Kind {
    let Some(t) = untagged_plain(n) else { return Kind::Str };
    let lower = t.to_ascii_lowercase();
    let cased = t == lower || t == t.to_ascii_uppercase() || t == capitalised(&lower);
    let digits = |s: &str, radix| !s.is_empty() && s.chars().all(|c| c.is_digit(radix));
    let unsigned = t.strip_prefix(['+', '-']).unwrap_or(t);
    if t.is_empty() || t == "~" || (cased && lower == "null") {
        Kind::Null
    } else if cased && (lower == "true" || lower == "false") {
        Kind::Bool
    } else if digits(unsigned, 10)
        || t.strip_prefix("0o").is_some_and(|d| digits(d, 8))
        || t.strip_prefix("0x").is_some_and(|d| digits(d, 16))
    {
        Kind::Int
    } else if float_1_2(unsigned) || special_float(t) {
        Kind::Float
    } else {
        Kind::Str
    }
}

/// `.inf`, `-.Inf`, `+.INF`, `.nan`, `.NaN`, `.NAN` (both schemas).
fn special_float(t: &str) -> bool {
    let u = t.strip_prefix(['+', '-']).unwrap_or(t);
    [".inf", ".Inf", ".INF"].contains(&u) || [".nan", ".NaN", ".NAN"].contains(&t)
}

fn untagged_plain(n: &Node) -> Option<&str> {
    match n {
        Node::Scalar { text, style: Style::Plain, tag: None } => Some(text),
        _ => None,
    }
}

fn capitalised(lower: &str) -> String {
    let mut c = lower.chars();
    c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
}

/// YAML 1.1 ints: `0b1_0`, `0644` (octal), `1_000`, `0x1F`, `190:20:30` (base 60), signed.
fn int_1_1(t: &str) -> bool {
    let u = t.strip_prefix(['+', '-']).unwrap_or(t);
    let set = |s: &str, ok: &dyn Fn(char) -> bool| !s.is_empty() && s.chars().all(|c| c == '_' || ok(c));
    if let Some(b) = u.strip_prefix("0b") {
        return set(b, &|c| c == '0' || c == '1');
    }
    if let Some(x) = u.strip_prefix("0x") {
        return set(x, &|c| c.is_ascii_hexdigit());
    }
    if u == "0" || (u.starts_with('0') && set(u, &|c| ('0'..='7').contains(&c))) {
        return true;
    }
    if !u.starts_with(|c: char| ('1'..='9').contains(&c)) {
        return false;
    }
    let mut parts = u.split(':');
    let head = parts.next().unwrap_or("");
    set(head, &|c| c.is_ascii_digit()) && parts.all(sexagesimal_part)
}

/// A base-60 part after a `:`: `[0-5]?[0-9]`.
fn sexagesimal_part(p: &str) -> bool {
    let b = p.as_bytes();
    match b {
        [d] => d.is_ascii_digit(),
        [a, d] => (b'0'..=b'5').contains(a) && d.is_ascii_digit(),
        _ => false,
    }
}

/// YAML 1.1 floats (PyYAML's resolver): `1.5`, `1.`, `6.8e+5`, `.5`, `190:20:30.15`.
fn float_1_1(t: &str) -> bool {
    let u = t.strip_prefix(['+', '-']).unwrap_or(t);
    let digits_ = |s: &str| s.chars().all(|c| c.is_ascii_digit() || c == '_');
    let Some((whole, rest)) = u.split_once('.') else { return false };
    let (frac, exp) = match rest.split_once(['e', 'E']) {
        Some((f, e)) => (f, Some(e)),
        None => (rest, None),
    };
    let exp_ok = exp.is_none_or(|e| {
        e.strip_prefix(['+', '-']).is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
    });
    let whole_ok = if whole.contains(':') {
        let mut parts = whole.split(':');
        parts.next().is_some_and(|h| h.starts_with(|c: char| c.is_ascii_digit()) && digits_(h))
            && parts.all(sexagesimal_part)
            && exp.is_none()
    } else if whole.is_empty() {
        !frac.is_empty() && frac.starts_with(|c: char| c.is_ascii_digit()) && t == u
    } else {
        whole.starts_with(|c: char| c.is_ascii_digit()) && digits_(whole)
    };
    whole_ok && digits_(frac) && exp_ok
}

/// YAML 1.2 core floats (sign taken off): `1.5`, `1.`, `.5`, `1e3`, `6.8523015e+5`.
fn float_1_2(u: &str) -> bool {
    let (mant, exp) = match u.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (u, None),
    };
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let mant_ok = match mant.split_once('.') {
        Some((w, f)) => (digits(w) && (f.is_empty() || digits(f))) || (w.is_empty() && digits(f)),
        None => digits(mant),
    };
    let exp_ok = exp.is_none_or(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)));
    mant_ok && exp_ok && (mant.contains('.') || exp.is_some())
}

/// A YAML 1.1 timestamp: `2001-12-14`, or with a time (`t`, `T` or spaces) and a zone.
fn timestamp(t: &str) -> bool {
    let b = t.as_bytes();
    let d = |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    if b.len() < 8 || !d(0..4) || b[4] != b'-' {
        return false;
    }
    let rest = &t[5..];
    let mut it = rest.splitn(3, '-');
    let (m, day) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
    let short = |s: &str| (1..=2).contains(&s.len()) && s.bytes().all(|c| c.is_ascii_digit());
    if !short(m) {
        return false;
    }
    let day_digits: String = day.chars().take_while(char::is_ascii_digit).collect();
    if !(1..=2).contains(&day_digits.len()) {
        return false;
    }
    let after = &day[day_digits.len()..];
    let date_only = it.next().is_none() && after.is_empty();
    date_only || (after.starts_with(['t', 'T', ' ', '\t']) && after.contains(':'))
}

#[cfg(test)]
mod tests {
    use super::super::parse::parse;
    use super::*;

    fn kinds(t: &str) -> (Kind, Kind) {
        (kind_1_1(&Node::plain(t)), kind_1_2(&Node::plain(t)))
    }

    #[test]
    fn plain_scalars_typed_as_each_schema_does() {
        use Kind::*;
        for (t, k11, k12) in [
            ("0644", Int, Int),
            ("0o17", Str, Int),
            ("0x1F", Int, Int),
            ("0b101", Int, Str),
            ("1_000", Int, Str),
            ("190:20:30", Int, Str),
            ("1:30", Int, Str),
            ("1:60", Str, Str),
            ("yes", Bool, Str),
            ("No", Bool, Str),
            ("OFF", Bool, Str),
            ("y", Bool, Str),
            ("True", Bool, Bool),
            ("tRue", Str, Str),
            ("~", Null, Null),
            ("", Null, Null),
            ("NULL", Null, Null),
            ("1.5", Float, Float),
            ("1e3", Str, Float),
            ("6.8523015e+5", Float, Float),
            (".inf", Float, Float),
            ("-.Inf", Float, Float),
            ("190:20:30.15", Float, Str),
            ("2001-12-14", Timestamp, Str),
            ("2002-12-14 21:59:43.10 -5", Timestamp, Str),
            ("<<", Special, Str),
            ("08", Str, Int),
            ("app", Str, Str),
            ("v1.2.3", Str, Str),
        ] {
            assert_eq!(kinds(t), (k11, k12), "{t}");
        }
        assert_eq!(kind_1_1(&Node::str("yes")), Str);
    }

    #[test]
    fn the_first_difference_is_named_with_its_path() {
        let d = |t: &str| parse(t).unwrap();
        let a = d("spec:\n  k: [a, {b: 1}]\n!!str 0644: m\n");
        assert_eq!(first_difference(&a, &a), None);
        let why = first_difference(&a, &d("spec:\n  k: [a, {b: 2}]\n!!str 0644: m\n")).unwrap();
        assert_eq!(why, "spec.k[1].b: \"1\" meant, \"2\" read back");
        let why = first_difference(&a, &d("spec:\n  k: [a, {b: 1}]\n0644: m\n")).unwrap();
        assert_eq!(why, "?0644: tag !!str meant, no tag read back");
        let why = first_difference(&d("a: \"yes\"\n"), &d("a: yes\n")).unwrap();
        assert!(why.starts_with("a: \"yes\" meant as a Str (YAML 1.2) and Str (YAML 1.1)"), "{why}");
        assert_eq!(first_difference(&d("a: 'app'\nb: ~\n"), &d("a: app\nb:\n")), None);
        assert!(first_difference(&d("a: !!str\n"), &d("a: !!str null\n")).unwrap().starts_with("a: \"\" meant"));
    }
}
