//! Reading and writing back what Kubernetes reads: tagged roots, duplicate keys, CRLF, `...`,
//! directives, merge keys.

use std::path::Path;

use super::config::Config;
use super::node::Node;
use super::parse::parse;
use super::{Outcome, inject_stream};

const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: p
spec:
  securityContext:
    runAsUser: 1000
    fsGroup: 1000
  containers:
    - name: app
      image: app
      volumeMounts:
        - name: data
          mountPath: /data
  volumes:
    - name: data
      persistentVolumeClaim:
        claimName: data
";

fn run(text: &str) -> super::Output {
    inject_stream(text, Path::new("-"), &Config::default(), &[]).unwrap()
}

fn injected(text: &str) -> bool {
    let docs = parse(text).unwrap();
    docs.iter().any(|d| d.at(&["spec", "initContainers"]).is_some())
}

#[test]
fn a_tagged_root_is_injected_not_erased() {
    let input = format!("--- !!map\n{POD}");
    let out = run(&input);
    assert_eq!(out.events[0].outcome, Outcome::Injected);
    assert!(out.text.starts_with("---\n!!map\napiVersion: v1\n"), "{}", out.text);
    let d = parse(&out.text).unwrap().remove(0);
    assert_eq!(d.at(&["metadata", "name"]).and_then(Node::as_str), Some("p"), "{}", out.text);
    assert!(injected(&out.text));
}

#[test]
fn duplicate_keys_refuse_the_workload_unchanged() {
    for (dup, key) in [
        (POD.replace("    fsGroup: 1000\n", "    fsGroup: 1000\n    fsGroup: 2000\n"), "spec.securityContext.fsGroup"),
        (format!("{POD}  volumes:\n    - name: other\n      emptyDir: {{}}\n"), "spec.volumes"),
    ] {
        let out = run(&dup);
        assert_eq!(out.text, dup, "left byte for byte (no annotation either)");
        let Outcome::Refused(why) = &out.events[0].outcome else { panic!("{:?}", out.events) };
        assert!(why[0].starts_with(&format!("duplicate key {key}: ")), "{why:?}");
        assert!(why[0].contains("kubectl apply fails"), "{why:?}");
    }
}

#[test]
fn crlf_stays_crlf() {
    let input = format!("kind: ConfigMap\r\n---\r\n# Source: x\r\n{}", POD.replace('\n', "\r\n"));
    let out = run(&input);
    assert!(injected(&out.text));
    assert!(!out.text.replace("\r\n", "").contains('\n'), "mixed line endings:\n{:?}", out.text);
}

#[test]
fn a_trailing_document_end_is_kept() {
    let input = format!("---\n{POD}...\n# after\n");
    let out = run(&input);
    assert!(injected(&out.text));
    assert!(out.text.ends_with("\n...\n# after\n"), "{}", out.text);
}

#[test]
fn directives_are_yaml() {
    let input = format!(
        "%YAML 1.1\n%TAG !k! tag:k8s.io,2024:\n---\n{POD}...\n%TAG !k! tag:k8s.io,2024:\n---\nkind: ConfigMap\nx: !k!y 1\n"
    );
    let out = run(&input);
    assert!(out.text.starts_with("%YAML 1.1\n%TAG !k! tag:k8s.io,2024:\n---\napiVersion: v1\n"), "{}", out.text);
    assert!(out.text.ends_with("...\n%TAG !k! tag:k8s.io,2024:\n---\nkind: ConfigMap\nx: !k!y 1\n"), "{}", out.text);
    assert!(injected(&out.text));
    assert_eq!(run(&input.replace("fsGroup", "fsGroupX")).text, input.replace("fsGroup", "fsGroupX"));
}

#[test]
fn merge_keys_are_said_at_info_and_left() {
    let input = "x-base: &base\n  securityContext: {fsGroup: 1000}\napiVersion: v1\nkind: Pod\nmetadata: {name: m}\nspec:\n  <<: *base\n  containers: [{name: c, image: i}]\n";
    let out = run(input);
    assert_eq!(out.text, input);
    assert!(
        matches!(&out.events[0].outcome, Outcome::Unsupported(w) if w.contains("merge keys (<<)")),
        "{:?}",
        out.events
    );
}

/// Documents over a MiB are skimmed first: a big ConfigMap is copied byte for byte without a
/// tree, a big workload under the rewrite limit is injected, a `List` over it is refused and
/// left as it is (`--strict`: an error).
#[test]
fn big_documents_are_skimmed_copied_or_refused() {
    let mut cm = String::from("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n");
    let mut i = 0;
    while cm.len() <= super::SKIM_OVER + 1000 {
        cm.push_str(&format!("  key{i}: \"value {i}\"\n"));
        i += 1;
    }
    let stream = format!("{cm}---\n{POD}");
    let out = run(&stream);
    assert!(out.text.starts_with(&cm), "the ConfigMap is copied");
    assert_eq!(out.events[0].what, "ConfigMap/big");
    assert!(matches!(&out.events[0].outcome, Outcome::Skipped(w) if w.contains("without building its tree")));
    assert_eq!(out.events[1].outcome, Outcome::Injected);
    // A Pod over a MiB (a big annotation) is still rewritten.
    let big_pod =
        POD.replace("  name: p\n", &format!("  name: p\n  annotations:\n    big: \"{}\"\n", "x".repeat(1 << 20)));
    assert!(big_pod.len() > super::SKIM_OVER);
    assert!(injected(&run(&big_pod).text));
    // A List over MAX_REWRITE is refused, as it came.
    let item: String =
        POD.lines().enumerate().map(|(n, l)| format!("{}{l}\n", if n == 0 { "- " } else { "  " })).collect();
    let mut list = String::from("apiVersion: v1\nkind: List\nitems:\n");
    while list.len() <= super::MAX_REWRITE {
        list.push_str(&item);
    }
    let out = run(&list);
    assert_eq!(out.text, list);
    assert_eq!(out.events.len(), 1);
    assert!(
        matches!(&out.events[0].outcome, Outcome::Refused(w) if w[0].contains("over the 2 MiB inject rewrites")),
        "{:?}",
        out.events
    );
}
