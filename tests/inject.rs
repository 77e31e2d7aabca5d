//! `volprep inject` run as the real binary: manifests on stdin or in files, the rewrite of
//! charts shaped like third-party ones (tests/charts/thirdparty) rendered by the real helm,
//! refusals and their exit codes, malformed input, configuration precedence, helm's
//! post-renderer and kustomize, and the wiring examples of examples/inject.
//!
//! The tests that need helm, kubectl, kubernetes-validate or yamllint are
//! `#[ignore = "needs ..."]` (`source .ci/k8s-tools.sh`, then `--include-ignored`).

mod common;

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::k8s::*;
use serde_norway::Value;

const BIN: &str = env!("CARGO_BIN_EXE_volprep");

/// `volprep inject ARGS` with `stdin`, the environment cleared of VOLPREP_INJECT_*.
fn inject(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("inject").args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("VOLPREP_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("VOLPREP_LOG_FORMAT", "text").envs(env.iter().copied());
    let mut child = cmd.spawn().expect("spawn volprep");
    let mut input = child.stdin.take().expect("stdin");
    let text = stdin.to_string();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(text.as_bytes());
    });
    let out = child.wait_with_output().expect("wait");
    writer.join().unwrap();
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("UTF-8 stdout")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(0), "stderr:\n{}", stderr(o));
    stdout(o)
}

/// The chart rendered once (helm template, the thirdparty test chart), cached in a file by
/// the caller: the tests that need no helm use tests/charts/thirdparty.rendered.yaml.
fn rendered() -> String {
    read("tests/charts/thirdparty.rendered.yaml")
}

fn by_name<'a>(all: &'a [Value], kind: &str, name: &str) -> &'a Value {
    all.iter()
        .find(|o| o["kind"].as_str() == Some(kind) && o["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind}/{name}"))
}

fn init_args(obj: &Value) -> Vec<String> {
    strs(&pod_spec_of(obj)["initContainers"][0]["args"])
}

/// The pod spec of any workload kind, CronJob included.
fn pod_spec_of(obj: &Value) -> &Value {
    match obj["kind"].as_str() {
        Some("CronJob") => &obj["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => pod_spec(obj),
    }
}

/// The documents of a stream with their source text, split at `---` lines.
fn doc_texts(text: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    for line in text.split_inclusive('\n') {
        if line.trim_end() == "---" && !out.last().unwrap().is_empty() {
            out.push(String::new());
        }
        out.last_mut().unwrap().push_str(line);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Without tools: the rendered chart kept in tests/charts

#[test]
fn rendered_chart_is_injected_refused_and_left_alone_as_it_should() {
    let input = rendered();
    let out = inject(&[], &input, &[]);
    let text = ok(&out);
    let err = stderr(&out);
    let all = docs(&text);
    // Injected: the database, the web app, the backup CronJob.
    let pg = by_name(&all, "StatefulSet", "rel-postgres");
    assert_eq!(
        init_args(pg),
        [
            "apply",
            "--log-format=json",
            "--termination-log=/dev/termination-log",
            "--sticky=/volumes/tmp",
            "--volume=/volumes/run,fs-group=1001",
            "--volume=/volumes/data,fs-group=1001"
        ]
    );
    let web = by_name(&all, "Deployment", "rel-web");
    assert_eq!(init_args(web)[3..], ["--volume=/volumes/data,fs-group=1001", "--sticky=/volumes/tmp"]);
    let backup = by_name(&all, "CronJob", "rel-backup");
    assert_eq!(
        init_args(backup)[3..],
        ["--volume=/volumes/data,fs-group=1001", "--volume=/volumes/backup,fs-group=1001"],
        "the kubelet walks the PVC read-write (the volume is not readOnly) though the mount is read-only"
    );
    for (obj, at) in [(pg, "postgres"), (web, "web"), (backup, "backup")] {
        check_volprep_pod(pod_spec_of(obj), at);
    }
    // Refused, unchanged but for an annotation on the workload, and said why (on stderr and in
    // the annotation, where a user of Helm, which hides a post-renderer's stderr, sees it).
    let runner = "containers mounting volume builds run as different users (build 1001:1001, helper 1002:1001)";
    let reader = "volume token (secret, mode 0440) is readable through its group only";
    for (kind, name, why) in [("Pod", "rel-runner", runner), ("Deployment", "rel-reader", reader)] {
        let obj = by_name(&all, kind, name);
        assert!(pod_spec_of(obj)["initContainers"].is_null(), "{kind}/{name}");
        assert_eq!(pod_spec_of(obj)["securityContext"]["fsGroup"].as_u64(), Some(1001));
        let note = obj["metadata"]["annotations"]["volprep.io/inject-refused"].as_str().unwrap_or_default();
        assert!(note.starts_with(why), "{kind}/{name}: {note}");
        assert!(err.contains(&format!("{kind}/{name}: left unchanged: {why}")), "{err}");
    }
    assert_eq!(err.matches("volprep injected").count(), 3, "{err}");
    assert!(
        err.contains(
            "volprep inject: 3 injected, 2 refused (left to the kubelet, annotated volprep.io/inject-refused)"
        ),
        "{err}"
    );
    // Every document neither injected nor refused is the input's, byte for byte.
    let (before, after) = (doc_texts(&input), doc_texts(&text));
    assert_eq!(before.len(), after.len());
    let changed: Vec<usize> = (0..before.len()).filter(|i| before[*i] != after[*i]).collect();
    assert_eq!(changed.len(), 5, "only the three injected and two refused documents differ");
    for i in changed {
        assert!(after[i].starts_with("---\n# Source: thirdparty/templates/"), "the head is kept:\n{}", after[i]);
    }
}

#[test]
fn inject_twice_is_inject_once() {
    let once = ok(&inject(&[], &rendered(), &[]));
    let twice = inject(&[], &once, &[]);
    assert_eq!(ok(&twice), once);
    assert!(!stderr(&twice).contains("volprep injected"), "{}", stderr(&twice));
}

#[test]
fn files_stdin_and_strict_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.yaml");
    fs::write(&file, rendered()).unwrap();
    let from_file = ok(&inject(&[file.to_str().unwrap()], "", &[]));
    assert_eq!(from_file, ok(&inject(&["-"], &rendered(), &[])));
    // --strict: a refusal is an error, exit 5, and nothing is written.
    let strict = inject(&["--strict", file.to_str().unwrap()], "", &[]);
    assert_eq!(strict.status.code(), Some(5), "{}", stderr(&strict));
    assert!(strict.stdout.is_empty());
    let err = stderr(&strict);
    assert!(
        err.contains("refused: containers mounting volume builds run as different users")
            && err.contains("2 workload(s) refused"),
        "{err}"
    );
    let env_strict = inject(&[], &rendered(), &[("VOLPREP_INJECT_STRICT", "true")]);
    assert_eq!(env_strict.status.code(), Some(5));
    // Two files: each keeps its documents, separated.
    let one = dir.path().join("one.yaml");
    fs::write(&one, "kind: ConfigMap\napiVersion: v1\nmetadata: {name: a}").unwrap();
    let both = ok(&inject(&[one.to_str().unwrap(), one.to_str().unwrap()], "", &[]));
    assert_eq!(
        both,
        "kind: ConfigMap\napiVersion: v1\nmetadata: {name: a}\n---\nkind: ConfigMap\napiVersion: v1\nmetadata: {name: a}"
    );
}

/// A Pod that inject rewrites, holding the two shapes its emitter once changed: a tagged empty
/// string (an env var's `""` read back as the string `null`) and tagged keys (`!!str 0644`
/// read back as the integer key 420, `? !!str yes` as a boolean key).
const TAGGED_POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: tagged
  annotations:
    !!str 0644: mode
    ? !!str yes
    : yes-key
spec:
  securityContext: {fsGroup: 1000}
  containers:
    - name: app
      image: app
      args: [!!str , --x]
      env:
        - name: EMPTY
          value: !!str
      volumeMounts: [{name: data, mountPath: /data}]
  volumes:
    - name: data
      persistentVolumeClaim: {claimName: data}
";

#[test]
fn tagged_empty_strings_and_tagged_keys_keep_their_meaning() {
    let out = ok(&inject(&[], TAGGED_POD, &[]));
    assert!(stderr(&inject(&[], TAGGED_POD, &[])).contains("Pod/tagged: volprep injected"));
    for kept in ["!!str 0644: mode\n", "!!str yes: yes-key\n", "value: !!str\n", "- !!str\n"] {
        assert!(out.contains(kept), "{kept:?} lost:\n{out}");
    }
    assert!(!out.contains("null"), "{out}");
    let pod: Value = serde_norway::from_str(&out).unwrap();
    assert_eq!(pod["spec"]["containers"][0]["env"][0]["value"].as_str(), Some(""), "{out}");
    assert_eq!(pod["spec"]["containers"][0]["args"][0].as_str(), Some(""), "{out}");
    assert_eq!(pod["metadata"]["annotations"]["0644"].as_str(), Some("mode"), "{out}");
}

/// A test build whose emitter drops keys' tags (VOLPREP_TEST_INJECT_BREAK_EMITTER): the
/// self-check reads the output back, finds the first difference and leaves the document as it
/// came, refused with that path; the other documents are injected; `--strict` exits 5.
#[test]
#[cfg_attr(not(feature = "test-hooks"), ignore = "needs --features test-hooks")]
fn the_self_check_catches_a_broken_emitter() {
    let broken = [("VOLPREP_TEST_INJECT_BREAK_EMITTER", "1")];
    let plain = TAGGED_POD.replace("!!str 0644", "mode0644").replace("? !!str yes\n    :", "yes-key:");
    let stream = format!("{TAGGED_POD}---\n{}", plain.replace("name: tagged", "name: plain"));
    let out = inject(&[], &stream, &broken);
    let (text, err) = (ok(&out), stderr(&out));
    assert!(text.starts_with(TAGGED_POD), "the document is left byte for byte:\n{text}");
    assert!(text[TAGGED_POD.len()..].contains("initContainers"), "the next one is injected:\n{text}");
    assert!(
        err.contains("Pod/tagged: left unchanged: inject's output of this document would read differently at metadata.annotations.?0644: tag !!str meant, no tag read back")
            && err.contains("a volprep bug")
            && err.contains("1 injected, 1 refused"),
        "{err}"
    );
    let strict = inject(&["--strict"], &stream, &broken);
    assert_eq!(strict.status.code(), Some(5), "{}", stderr(&strict));
    assert!(strict.stdout.is_empty() && stderr(&strict).contains("Pod/tagged: refused: inject's output"));
    // The same in a kustomize ResourceList: the list comes back as it came.
    let list = format!(
        "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n{}",
        TAGGED_POD
            .lines()
            .enumerate()
            .map(|(i, l)| format!("{}{l}\n", if i == 0 { "- " } else { "  " }))
            .collect::<String>()
    );
    let out = inject(&[], &list, &broken);
    assert_eq!(ok(&out), list);
    assert!(stderr(&out).contains("items[0]: Pod/tagged: left unchanged: inject's output"), "{}", stderr(&out));
    assert!(ok(&inject(&[], &list, &[])).contains("initContainers"));
}

/// `--errors-on-stdout` (the Helm 4 plugin's): the reasons of a `--strict` refusal, of bad
/// input and of a bad setting go to stdout as a YAML scalar document, exit 0; a success is
/// the manifests as ever.
#[test]
fn errors_on_stdout_for_helm_4() {
    let out = inject(&["--strict", "--errors-on-stdout"], &rendered(), &[]);
    let text = ok(&out);
    assert!(text.starts_with("# volprep inject failed (exit status 5): nothing rendered\n|-\n  "), "{text}");
    assert!(text.contains("Pod/rel-runner: refused: containers mounting volume builds"), "{text}");
    let doc: Value = serde_norway::from_str(&text).unwrap();
    assert!(doc.is_string(), "a scalar, no object: {text}");
    assert!(stderr(&out).contains("refused"), "stderr as ever");
    let bad = ok(&inject(&["--errors-on-stdout"], "kind: Pod\nmetadata:\n  name: [x\n", &[]));
    assert!(bad.starts_with("# volprep inject failed (exit status 1)") && bad.contains("not YAML"), "{bad}");
    let usage = ok(&inject(&["--errors-on-stdout", "--set", "nonsense"], &rendered(), &[]));
    assert!(usage.starts_with("# volprep inject failed (exit status 2)") && usage.contains("KEY=VALUE"), "{usage}");
    assert_eq!(ok(&inject(&["--errors-on-stdout"], &rendered(), &[])), ok(&inject(&[], &rendered(), &[])));
}

#[test]
fn malformed_yaml_is_one_line_and_nothing_on_stdout() {
    let bad = format!("{}---\nkind: Pod\nmetadata:\n  name: [x\n", rendered());
    let out = inject(&[], &bad, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "nothing on stdout");
    let err = stderr(&out);
    let line = bad.lines().count() + 1;
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(&format!("-:{line}:")) && err.contains("not YAML"), "{err}");
    let missing = inject(&["/nonexistent/x.yaml"], "", &[]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).contains("/nonexistent/x.yaml: open failed"), "{}", stderr(&missing));
    let binary = inject(&[], "kind: Pod\nx: \u{0}\u{1}\n", &[]);
    assert_eq!(binary.status.code(), Some(1), "{}", stderr(&binary));
    assert!(binary.stdout.is_empty());
}

/// An input's name is escaped once in every message: where its YAML breaks, where it is too big
/// or not text, and in the line of each object injected.
#[test]
fn input_names_are_escaped_once() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("x\\y.yaml");
    fs::write(&bad, "a: [\n").unwrap();
    let shown = format!("{}/x\\\\y.yaml", dir.path().display());
    let err = stderr(&inject(&[bad.to_str().unwrap()], "", &[]));
    assert!(err.contains(&format!("{shown}:2:1: not YAML")), "{err}");
    fs::write(&bad, [b'a', 0xff, b'\n']).unwrap();
    let err = stderr(&inject(&[bad.to_str().unwrap()], "", &[]));
    assert!(err.contains(&format!("{shown}: not UTF-8")), "{err}");
    fs::write(&bad, rendered()).unwrap();
    let out = inject(&[bad.to_str().unwrap()], "", &[]);
    assert!(stderr(&out).contains(&format!("{shown}:")), "{}", stderr(&out));
    assert!(!stderr(&out).contains("\\\\\\\\"), "{}", stderr(&out));
}

#[test]
fn configuration_from_file_env_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("inject.yaml");
    fs::write(
        &cfg,
        "image:\n  registry: mirror.example.com\n  tag: \"1.0\"\npullSecrets: [regcred]\nresources:\n  requests: {cpu: 10m, memory: 16Mi}\n  limits: {cpu: 100m, memory: 64Mi}\nextraArgs: [--verify=full]\n",
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let out = ok(&inject(
        &["--config", c, "--image-tag", "2.0", "--set", "threads=4"],
        &rendered(),
        &[("VOLPREP_INJECT_IMAGE_TAG", "9.9"), ("VOLPREP_INJECT_IMAGE_DIGEST", "sha256:abc")],
    ));
    let all = docs(&out);
    let pg = pod_spec_of(by_name(&all, "StatefulSet", "rel-postgres"));
    let init = &pg["initContainers"][0];
    assert_eq!(
        init["image"].as_str(),
        Some("mirror.example.com/volprep/volprep:2.0@sha256:abc"),
        "flag over env over file"
    );
    assert_eq!(strs(&init["args"])[1..3], ["--threads=4", "--log-format=json"]);
    assert!(strs(&init["args"]).contains(&"--verify=full".to_string()));
    assert_eq!(init["resources"]["limits"]["memory"].as_str(), Some("64Mi"));
    assert_eq!(pg["imagePullSecrets"][0]["name"].as_str(), Some("regcred"));
    // Usage errors: exit 2, nothing on stdout.
    for args in [&["--set", "fsgroup=1"][..], &["--mode", "privileged"], &["--config", "/nonexistent"]] {
        let o = inject(args, &rendered(), &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(o.stdout.is_empty());
    }
    let o = inject(&[], &rendered(), &[("VOLPREP_INJECT_SET", "mode=unprivileged;select=opt-in")]);
    assert!(!ok(&o).contains("name: volprep"), "opt-in: nothing annotated, nothing injected");
}

#[test]
fn unprivileged_mode_meets_restricted() {
    let out = ok(&inject(&["--mode", "unprivileged", "--set", "allowForeign=true"], &rendered(), &[]));
    let all = docs(&out);
    for (kind, name) in [("StatefulSet", "rel-postgres"), ("Deployment", "rel-web"), ("CronJob", "rel-backup")] {
        let spec = pod_spec_of(by_name(&all, kind, name));
        let args = check_volprep_pod(spec, name);
        assert!(args.unprivileged && args.sticky.is_empty(), "{name}: {args:?}");
    }
}

/// `rendered` with `volprep.io/modes: VALUE` on the pod template of the workload whose template
/// labels it `app.kubernetes.io/name: NAME`.
fn modes_on_template(rendered: &str, name: &str, value: &str) -> String {
    let labels = format!("      labels:\n        app.kubernetes.io/name: {name}\n");
    assert!(rendered.contains(&labels), "no pod template labelled {name}");
    rendered.replacen(&labels, &format!("      annotations:\n        volprep.io/modes: {value}\n{labels}"), 1)
}

/// The args of the default injection with `,modes=app-safe` on each `--volume`.
fn with_app_safe(default: &[String]) -> Vec<String> {
    default.iter().map(|a| if a.starts_with("--volume=") { format!("{a},modes=app-safe") } else { a.clone() }).collect()
}

/// `args` without the `,app-uid=UID` of each `--volume` (the runAsUser of the workload's
/// containers, which app-safe adds: see the unit test `app_safe_takes_the_uid_of_the_containers_mounting_the_volume`).
fn no_app_uid(args: Vec<String>) -> Vec<String> {
    args.into_iter().map(|a| a.split(",app-uid=").next().unwrap().to_string()).collect()
}

/// `--modes` (VOLPREP_INJECT_MODES, the `modes` key of a config file or `--set`) puts the mode
/// policy on every `--volume` of every injected workload, and into `--emit patches`; the
/// kubelet's rule (the default) adds nothing: the output is the default's, byte for byte.
#[test]
fn modes_option_env_and_config_key() {
    let input = rendered();
    let default = ok(&inject(&[], &input, &[]));
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("inject.yaml");
    fs::write(&cfg, "modes: app-safe\n").unwrap();
    let c = cfg.to_str().unwrap();
    let safe = ok(&inject(&["--modes", "app-safe"], &input, &[]));
    for (args, env) in [
        (&["--config", c][..], &[][..]),
        (&["--set", "modes=app-safe"], &[]),
        (&[], &[("VOLPREP_INJECT_MODES", "app-safe")]),
        (&["--config", c, "--set", "modes=kubelet", "--modes", "APP-SAFE"], &[]),
    ] {
        assert_eq!(ok(&inject(args, &input, env)), safe, "{args:?} {env:?}");
    }
    let (before, after) = (docs(&default), docs(&safe));
    for (kind, name) in [("StatefulSet", "rel-postgres"), ("Deployment", "rel-web"), ("CronJob", "rel-backup")] {
        let obj = by_name(&after, kind, name);
        assert_eq!(no_app_uid(init_args(obj)), with_app_safe(&init_args(by_name(&before, kind, name))), "{name}");
        check_volprep_pod(pod_spec_of(obj), name);
    }
    let changed = doc_texts(&default).iter().zip(doc_texts(&safe)).filter(|(d, s)| *d != s).count();
    assert_eq!(changed, 3, "only the injected workloads differ");
    // The kubelet's rule, however chosen, is the default output.
    for (args, env) in [
        (&["--modes", "kubelet"][..], &[][..]),
        (&["--config", c, "--modes", "kubelet"], &[]),
        (&[], &[("VOLPREP_INJECT_MODES", "Kubelet")]),
    ] {
        assert_eq!(ok(&inject(args, &input, env)), default, "{args:?} {env:?}");
    }
    let patches = ok(&inject(&["--emit", "patches", "--modes", "app-safe"], &input, &[]));
    assert_eq!(patches.matches(",modes=app-safe").count(), 5, "--emit patches carries it:\n{patches}");
    assert!(!ok(&inject(&["--emit", "patches"], &input, &[])).contains("modes="));
    for bad in [&["--modes", "strict"][..], &["--set", "modes=strict"]] {
        let o = inject(bad, &input, &[]);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("strict") && o.stdout.is_empty(), "{}", stderr(&o));
    }
}

/// A workload's `volprep.io/modes` annotation (on it or on its pod template, the template's
/// winning) chooses its policy over the option.
#[test]
fn modes_annotation_overrides_the_option() {
    let input = rendered();
    let default = docs(&ok(&inject(&[], &input, &[])));
    let pg = |all: &[Value]| init_args(by_name(all, "StatefulSet", "rel-postgres"));
    let web = |all: &[Value]| init_args(by_name(all, "Deployment", "rel-web"));
    // The annotation alone: that workload only.
    let out = docs(&ok(&inject(&[], &modes_on_template(&input, "postgres", "app-safe"), &[])));
    assert_eq!(no_app_uid(pg(&out)), with_app_safe(&pg(&default)));
    assert_eq!(web(&out), web(&default));
    // Against the option: the annotated workload keeps the kubelet's rule, the others follow it.
    let kubelet = modes_on_template(&input, "postgres", "kubelet");
    let out = docs(&ok(&inject(&["--modes", "app-safe"], &kubelet, &[])));
    assert_eq!(pg(&out), pg(&default));
    assert_eq!(no_app_uid(web(&out)), with_app_safe(&web(&default)));
    // On the workload; its pod template's wins.
    let sts = "kind: StatefulSet\nmetadata:\n  name: rel-postgres\n";
    assert!(input.contains(sts));
    let on_workload = input.replacen(sts, &format!("{sts}  annotations:\n    volprep.io/modes: app-safe\n"), 1);
    assert_eq!(no_app_uid(pg(&docs(&ok(&inject(&[], &on_workload, &[]))))), with_app_safe(&pg(&default)));
    let both = modes_on_template(&on_workload, "postgres", "kubelet");
    assert_eq!(pg(&docs(&ok(&inject(&[], &both, &[])))), pg(&default));
}

/// A `volprep.io/modes` that is no mode policy refuses the workload, as inject's other refusals
/// do: unchanged but for the annotation saying why, a warning, exit 5 under `--strict`.
#[test]
fn invalid_modes_annotation_is_refused_with_the_reason() {
    let input = modes_on_template(&rendered(), "web", "safe");
    let why = "annotation volprep.io/modes: 'safe' is not a mode policy: kubelet or app-safe";
    let out = inject(&["--modes", "app-safe"], &input, &[]);
    let all = docs(&ok(&out));
    let web = by_name(&all, "Deployment", "rel-web");
    assert!(pod_spec_of(web)["initContainers"].is_null());
    assert_eq!(pod_spec_of(web)["securityContext"]["fsGroup"].as_u64(), Some(1001));
    assert_eq!(web["metadata"]["annotations"]["volprep.io/inject-refused"].as_str(), Some(why));
    assert!(stderr(&out).contains(&format!("Deployment/rel-web: left unchanged: {why}")), "{}", stderr(&out));
    assert!(stderr(&out).contains("3 refused"), "{}", stderr(&out));
    assert!(init_args(by_name(&all, "StatefulSet", "rel-postgres")).iter().any(|a| a.contains(",modes=app-safe")));
    let bare = ok(&inject(&["--set", "annotateRefusals=false"], &input, &[]));
    let web_doc = |t: &str| {
        doc_texts(t).into_iter().find(|d| d.contains("kind: Deployment\nmetadata:\n  name: rel-web\n")).unwrap()
    };
    assert_eq!(web_doc(&bare), web_doc(&input), "left byte for byte");
    let strict = inject(&["--strict"], &input, &[]);
    assert_eq!(strict.status.code(), Some(5), "{}", stderr(&strict));
    assert!(strict.stdout.is_empty());
    assert!(stderr(&strict).contains(&format!("Deployment/rel-web: refused: {why}")), "{}", stderr(&strict));
}

/// A StatefulSet like a PostgreSQL chart's: the claim `data` at /var/lib/postgresql/data,
/// PGDATA a directory in it, a /tmp emptyDir; `annotation` is its pod template's
/// `volprep.io/modes`.
fn postgres_statefulset(uid: u32, fs_group: u32, annotation: Option<&str>) -> String {
    let annotations = annotation.map_or(String::new(), |v| format!("      annotations: {{volprep.io/modes: {v}}}\n"));
    format!(
        "apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: pg}}
spec:
  serviceName: pg
  selector: {{matchLabels: {{app: pg}}}}
  template:
    metadata:
{annotations}      labels: {{app: pg}}
    spec:
      securityContext: {{runAsUser: {uid}, runAsGroup: {fs_group}, fsGroup: {fs_group}}}
      containers:
        - name: postgres
          image: postgres:17
          env: [{{name: PGDATA, value: /var/lib/postgresql/data/pgdata}}]
          volumeMounts:
            - {{name: data, mountPath: /var/lib/postgresql/data}}
            - {{name: tmp, mountPath: /tmp}}
      volumes:
        - {{name: tmp, emptyDir: {{}}}}
  volumeClaimTemplates:
    - metadata: {{name: data}}
      spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}
"
    )
}

/// Under `root`, a claim `data` holding a PostgreSQL data directory as initdb leaves it
/// (`pgdata` 0700 with PG_VERSION, global/, base/1/, server.key 0600), and `tmp`; returns pgdata.
fn postgres_volume(root: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let data = root.join("data/pgdata");
    for d in ["global", "base/1"] {
        fs::create_dir_all(data.join(d)).unwrap();
    }
    for (f, text) in [("PG_VERSION", "17\n"), ("global/pg_control", "x"), ("base/1/1259", "x"), ("server.key", "k")] {
        fs::write(data.join(f), text).unwrap();
        fs::set_permissions(data.join(f), fs::Permissions::from_mode(0o600)).unwrap();
    }
    for d in ["", "global", "base", "base/1"] {
        fs::set_permissions(data.join(d), fs::Permissions::from_mode(0o700)).unwrap();
    }
    fs::create_dir(root.join("tmp")).unwrap();
    data
}

/// Runs the init container's args, as inject wrote them, on the host: /volumes/NAME is
/// ROOT/NAME (where the pod mounts it), the termination log ROOT/termination-log.
fn apply_injected(injected: &str, root: &Path) -> common::Run {
    let args: Vec<String> = init_args(&docs(injected)[0])
        .iter()
        .map(|a| {
            a.replace("=/volumes/", &format!("={}/", root.display()))
                .replace("=/dev/termination-log", &format!("={}/termination-log", root.display()))
        })
        .collect();
    common::run(common::volprep().args(&args)).expect_code(0)
}

fn mode_and_group(p: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt as _;
    let m = fs::symlink_metadata(p).unwrap();
    (m.mode() & 0o7777, m.gid())
}

/// What inject writes for `volprep.io/modes: app-safe` is what `volprep apply` takes: run as
/// the init container would, on a PostgreSQL data directory, it keeps the modes PostgreSQL
/// insists on, where the default injection widens them to what PostgreSQL refuses. As any
/// user (with its own group; the change of group: the test below).
#[test]
fn injected_app_safe_args_are_accepted_by_apply() {
    let (me, gid) = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
    // The app runs as this user; as root, the pod runs the app as uid 2000, who owns its data
    // (a pod running as root gives app-safe no app's uid: the kubelet's rule).
    let uid = if me == 0 { 2000 } else { me };
    for (annotation, dir_mode, key_mode) in [(Some("app-safe"), 0o700, 0o600), (None, 0o2770, 0o660)] {
        let injected = ok(&inject(&[], &postgres_statefulset(uid, gid, annotation), &[]));
        assert_eq!(injected.contains(&format!(",modes=app-safe,app-uid={uid}")), annotation.is_some(), "{injected}");
        let root = tempfile::tempdir().unwrap();
        let pgdata = postgres_volume(root.path());
        if me == 0 {
            for e in walkdir(&root.path().join("data")) {
                std::os::unix::fs::lchown(&e, Some(uid), None).unwrap();
            }
        }
        let run = apply_injected(&injected, root.path());
        let safe = format!(" modes=app-safe app-uid={uid}");
        let spec = format!("fs-group={gid}{}", if annotation.is_some() { safe.as_str() } else { "" });
        assert!(run.stderr.contains(&format!("\"spec\":\"{spec}\"")), "{}", run.describe());
        for d in ["", "global", "base/1"] {
            assert_eq!(mode_and_group(&pgdata.join(d)), (dir_mode, gid), "{annotation:?} {d:?}\n{}", run.describe());
        }
        assert_eq!(mode_and_group(&pgdata.join("server.key")), (key_mode, gid), "{annotation:?}");
        assert_eq!(mode_and_group(&root.path().join("tmp")).0, 0o1777, "--sticky at the temp dir");
    }
}

/// The same as root, as the init container runs: a data directory restored as uid 999 with group
/// 70 gets the pod's group 2000 and keeps 0700 and its key 0600.
#[test]
#[ignore = "needs root and loop devices"]
fn injected_app_safe_args_change_the_group_and_keep_private_modes() {
    common::privileged(&[]);
    let fs = common::Tmpfs::new();
    let injected = ok(&inject(&["--modes", "app-safe"], &postgres_statefulset(999, 2000, None), &[]));
    let pgdata = postgres_volume(fs.path());
    for e in walkdir(&fs.path().join("data")) {
        std::os::unix::fs::lchown(&e, Some(999), Some(70)).unwrap();
    }
    let run = apply_injected(&injected, fs.path());
    assert!(run.stderr.contains("\"spec\":\"fs-group=2000 modes=app-safe app-uid=999\""), "{}", run.describe());
    for d in ["", "global", "base", "base/1"] {
        assert_eq!(mode_and_group(&pgdata.join(d)), (0o700, 2000), "{d:?}\n{}", run.describe());
    }
    for f in ["PG_VERSION", "server.key", "global/pg_control", "base/1/1259"] {
        assert_eq!(mode_and_group(&pgdata.join(f)), (0o600, 2000), "{f}");
    }
    assert_eq!(mode_and_group(&fs.path().join("data")).1, 2000, "the claim's root");
    let again = apply_injected(&injected, fs.path());
    assert!(again.stderr.contains("\"action\":\"skipped\""), "the marker keeps the policy:\n{}", again.describe());
}

/// Every path under `root` (itself included), parents first.
fn walkdir(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if out[i].is_dir() && !out[i].is_symlink() {
            let mut children: Vec<PathBuf> = fs::read_dir(&out[i]).unwrap().map(|e| e.unwrap().path()).collect();
            children.sort();
            out.extend(children);
        }
        i += 1;
    }
    out
}

#[test]
fn krm_resource_list_in_and_out() {
    // kustomize hands the items over as Go's YAML writes them: 0440 as 288.
    let items: Vec<Value> = docs(&rendered().replace("defaultMode: 0440", "defaultMode: 288"));
    let mut rl = serde_norway::Mapping::new();
    rl.insert("apiVersion".into(), "config.kubernetes.io/v1".into());
    rl.insert("kind".into(), "ResourceList".into());
    rl.insert("items".into(), Value::Sequence(items));
    let fc = "apiVersion: volprep.io/v1alpha1\nkind: Inject\nmetadata: {name: x}\nspec:\n  image: {tag: \"7.7\"}\n";
    rl.insert("functionConfig".into(), serde_norway::from_str(fc).unwrap());
    let input = serde_norway::to_string(&Value::Mapping(rl)).unwrap();
    let out = ok(&inject(&[], &input, &[]));
    let list = &docs(&out)[0];
    assert_eq!(list["kind"].as_str(), Some("ResourceList"));
    let items = list["items"].as_sequence().unwrap();
    let pg = by_name(items, "StatefulSet", "rel-postgres");
    assert!(pod_spec(pg)["initContainers"][0]["image"].as_str().unwrap().ends_with(":7.7"));
    let results = list["results"].as_sequence().unwrap();
    let refs: Vec<&str> = results.iter().filter_map(|r| r["resourceRef"]["name"].as_str()).collect();
    assert_eq!(refs, ["rel-runner", "rel-reader"]);
}

// ---------------------------------------------------------------------------------------------
// With helm, kubectl, kubernetes-validate, yamllint

fn tools(test: &str) -> (PathBuf, PathBuf, PathBuf) {
    let helm = tool("VOLPREP_HELM", test).unwrap();
    let kv = tool("VOLPREP_K8S_VALIDATE", test).unwrap();
    let yl = tool("VOLPREP_YAMLLINT", test).unwrap();
    (helm, kv, yl)
}

fn validate(kv: &Path, yl: &Path, name: &str, text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(format!("{name}.yaml"));
    fs::write(&file, text).unwrap();
    k8s_validate(kv, std::slice::from_ref(&file));
    yamllint(yl, &[file]);
}

/// The helm rendering kept in tests/charts is what helm renders today, and the injected
/// result validates against the Kubernetes schemas and yamllint.
#[test]
#[ignore = "needs helm, kubernetes-validate, yamllint: source .ci/k8s-tools.sh"]
fn helm_rendered_chart_injected_validates() {
    let (helm_bin, kv, yl) = tools("helm_rendered_chart_injected_validates");
    let home = tempfile::tempdir().unwrap();
    let chart = Path::new(ROOT).join("tests/charts/thirdparty");
    let text = run_ok(helm(&helm_bin, home.path()).args(["template", "rel"]).arg(&chart));
    assert_eq!(text, rendered(), "tests/charts/thirdparty.rendered.yaml is stale: re-render it");
    run_ok(helm(&helm_bin, home.path()).args(["lint", "--strict"]).arg(&chart));
    let out = ok(&inject(&[], &text, &[]));
    validate(&kv, &yl, "injected", &out);
    let unprivileged = ok(&inject(&["--mode=unprivileged"], &text, &[]));
    validate(&kv, &yl, "injected-unprivileged", &unprivileged);
}

/// Helm 4: `--post-renderer` takes a postrenderer/v1 plugin (examples/inject/helm-plugin), and
/// gives the same manifests as piping `helm template` through `volprep inject`.
#[test]
#[ignore = "needs helm (v4): source .ci/k8s-tools.sh"]
fn helm_post_renderer_plugin() {
    let test = "helm_post_renderer_plugin";
    let helm_bin = tool("VOLPREP_HELM", test).unwrap();
    let home = tempfile::tempdir().unwrap();
    let version = run_ok(helm(&helm_bin, home.path()).args(["version", "--short"]));
    if !version.starts_with("v4.") {
        panic!("{test}: helm {version}: this test is for Helm 4's plugin post-renderers");
    }
    // `volprep` on the PATH, as the plugin expects.
    let bin_dir = home.path().join("bin");
    fs::create_dir_all(&bin_dir).unwrap();
    std::os::unix::fs::symlink(BIN, bin_dir.join("volprep")).unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let plugin = Path::new(ROOT).join("examples/inject/helm-plugin");
    run_ok(helm(&helm_bin, home.path()).env("PATH", &path).args(["plugin", "install"]).arg(&plugin));
    let chart = Path::new(ROOT).join("tests/charts/thirdparty");
    let mut cmd = helm(&helm_bin, home.path());
    cmd.env("PATH", &path).env("VOLPREP_INJECT_IMAGE_TAG", "4.4.4");
    cmd.args(["template", "rel"]).arg(&chart).args(["--post-renderer", "volprep-inject"]);
    say(&format!("{test}: {}", describe(&cmd)));
    let post = run_ok(&mut cmd);
    let piped = ok(&inject(&[], &rendered(), &[("VOLPREP_INJECT_IMAGE_TAG", "4.4.4")]));
    assert_eq!(docs(&post), docs(&piped), "post-renderer and pipe agree");
    assert!(post.contains("image: ghcr.io/volprep/volprep:4.4.4"), "{post}");
    // --strict: Helm 4 drops the plugin's stderr; the plugin's --errors-on-stdout makes the
    // reasons reach the user in Helm's own error.
    let mut strict = helm(&helm_bin, home.path());
    strict.env("PATH", &path).args(["template", "rel"]).arg(&chart);
    strict.args(["--post-renderer", "volprep-inject", "--post-renderer-args=--strict"]);
    let o = output(&mut strict);
    let err = String::from_utf8_lossy(&o.stderr);
    say(&format!("{test}: --strict: {err}"));
    assert!(!o.status.success() && o.stdout.is_empty(), "{err}");
    assert!(
        err.contains("volprep inject failed (exit status 5)")
            && err.contains("Pod/rel-runner: refused: containers mounting volume builds run as different users")
            && err.contains("2 workload(s) refused (--strict)"),
        "{err}"
    );
    let mut bad = helm(&helm_bin, home.path());
    bad.env("PATH", &path).args(["template", "rel"]).arg(&chart);
    bad.args(["--post-renderer", "volprep-inject", "--post-renderer-args=--set=modes=nonsense"]);
    let o = output(&mut bad);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("exit status 2") && err.contains("modes"), "{err}");
    // An executable path is Helm 3's post-renderer; Helm 4 refuses it.
    let mut old = helm(&helm_bin, home.path());
    old.args(["template", "rel"]).arg(&chart).args(["--post-renderer", BIN, "--post-renderer-args", "inject"]);
    let o = output(&mut old);
    assert!(!o.status.success(), "Helm 4 took an executable as post-renderer");
}

/// Helm 3: `--post-renderer` takes an executable, `--post-renderer-args` its arguments (what
/// examples/inject/helmfile.yaml sets); `--strict` refusals fail the render.
#[test]
#[ignore = "needs helm v3: source .ci/k8s-tools.sh"]
fn helm3_post_renderer_executable() {
    let test = "helm3_post_renderer_executable";
    let helm_bin = tool("VOLPREP_HELM3", test).unwrap();
    let home = tempfile::tempdir().unwrap();
    let version = run_ok(helm(&helm_bin, home.path()).args(["version", "--short"]));
    assert!(version.starts_with("v3."), "{test}: VOLPREP_HELM3 is helm {version}");
    let chart = Path::new(ROOT).join("tests/charts/thirdparty");
    let mut cmd = helm(&helm_bin, home.path());
    cmd.args(["template", "rel"]).arg(&chart).args(["--post-renderer", BIN, "--post-renderer-args", "inject"]);
    say(&format!("{test}: {}", describe(&cmd)));
    let post = run_ok(&mut cmd);
    assert_eq!(docs(&post), docs(&ok(&inject(&[], &rendered(), &[]))), "post-renderer and pipe agree");
    let mut strict = helm(&helm_bin, home.path());
    strict.args(["template", "rel"]).arg(&chart).args(["--post-renderer", BIN, "--post-renderer-args", "inject"]);
    strict.arg("--post-renderer-args=--strict");
    let o = output(&mut strict);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("exit status 5") && err.contains("refused"), "{err}");
    // The mode policy as a post-renderer argument (a Helmfile release's postRendererArgs).
    let mut safe = helm(&helm_bin, home.path());
    safe.args(["template", "rel"]).arg(&chart).args(["--post-renderer", BIN, "--post-renderer-args", "inject"]);
    safe.arg("--post-renderer-args=--modes=app-safe");
    let post = run_ok(&mut safe);
    assert!(post.contains(",modes=app-safe"), "{post}");
    assert_eq!(docs(&post), docs(&ok(&inject(&["--modes", "app-safe"], &rendered(), &[]))));
}

/// kustomize's KRM exec function: `kubectl kustomize` (kustomize built into kubectl) has no
/// --enable-exec; the ResourceList it would send is what `volprep inject` gets here, built
/// from `kubectl kustomize` of the example's base plus the function config.
#[test]
#[ignore = "needs kubectl, kubernetes-validate, yamllint: source .ci/k8s-tools.sh"]
fn kustomize_exec_function_example() {
    let test = "kustomize_exec_function_example";
    let kubectl = tool("VOLPREP_KUBECTL", test).unwrap();
    let kv = tool("VOLPREP_K8S_VALIDATE", test).unwrap();
    let yl = tool("VOLPREP_YAMLLINT", test).unwrap();
    let dir = Path::new(ROOT).join("examples/inject/kustomize");
    let help = run_ok(Command::new(&kubectl).args(["kustomize", "--help"]));
    assert!(!help.contains("--enable-exec"), "kubectl kustomize runs exec functions now: build the example with it");
    // Without --enable-exec, kubectl kustomize leaves the exec function out, silently.
    let mut silent = Command::new(&kubectl);
    silent.args(["kustomize", "--enable-alpha-plugins"]).arg(&dir);
    say(&format!("{test}: {}", describe(&silent)));
    let silent = run_ok(&mut silent);
    assert!(silent.contains("fsGroup: 1000") && !silent.contains("volprep"), "{silent}");
    let base = run_ok(Command::new(&kubectl).arg("kustomize").arg(Path::new(ROOT).join("examples/kustomize/base")));
    let fc: Value = serde_norway::from_str(&read("examples/inject/kustomize/volprep-inject.yaml")).unwrap();
    let fn_spec = fc["metadata"]["annotations"]["config.kubernetes.io/function"].as_str().unwrap();
    assert!(fn_spec.contains("path: ./volprep-inject") && dir.join("volprep-inject").is_file());
    let mut rl = serde_norway::Mapping::new();
    rl.insert("apiVersion".into(), "config.kubernetes.io/v1".into());
    rl.insert("kind".into(), "ResourceList".into());
    rl.insert("items".into(), Value::Sequence(docs(&base)));
    rl.insert("functionConfig".into(), fc);
    let input = serde_norway::to_string(&Value::Mapping(rl)).unwrap();
    let out = ok(&inject(&[], &input, &[]));
    let list = &docs(&out)[0];
    let items = list["items"].as_sequence().unwrap();
    let spec = pod_spec(&items[0]);
    let args = check_volprep_pod(spec, "kustomize exec function");
    assert_eq!(args.sticky, ["/volumes/tmp"]);
    assert!(strs(&spec["initContainers"][0]["args"]).contains(&"--reverify-after=7d".to_string()));
    assert_eq!(spec["initContainers"][1]["name"].as_str(), Some("migrate-schema"), "volprep first");
    validate(&kv, &yl, "kustomize-inject", &serde_norway::to_string(&items[0]).unwrap());
}

/// The wiring examples agree with the command: the plugin runs `volprep inject
/// --errors-on-stdout` (Helm 4 shows no plugin's stderr), Helmfile names
/// it, Argo CD's generate step renders to a file before injecting.
#[test]
fn wiring_examples_name_the_command() {
    let plugin: Value = serde_norway::from_str(&read("examples/inject/helm-plugin/plugin.yaml")).unwrap();
    assert_eq!(plugin["type"].as_str(), Some("postrenderer/v1"));
    let cmd = &plugin["runtimeConfig"]["platformCommand"][0];
    assert_eq!(
        (cmd["command"].as_str(), strs(&cmd["args"])),
        (Some("volprep"), vec!["inject".into(), "--errors-on-stdout".into()])
    );
    let helmfile: Value = serde_norway::from_str(&read("examples/inject/helmfile.yaml")).unwrap();
    assert_eq!(helmfile["helmDefaults"]["postRenderer"].as_str(), Some("volprep"));
    assert_eq!(strs(&helmfile["helmDefaults"]["postRendererArgs"]), ["inject"]);
    let cmp: Value = serde_norway::from_str(&read("examples/inject/argocd/plugin.yaml")).unwrap();
    let script = strs(&cmp["spec"]["generate"]["args"]).join("\n");
    assert!(script.contains("set -eu") && script.contains("volprep inject --strict <&4"), "{script}");
    let wrapper = read("examples/inject/kustomize/volprep-inject");
    assert!(wrapper.contains("exec volprep inject \"$@\""));
    let help = ok(&inject(&["--help"], "", &[]));
    for flag in ["--config", "--set", "--mode", "--strict", "--opt-in", "--image-tag", "--pull-secret", "--extra-arg"] {
        assert!(help.contains(flag), "{flag} not in `volprep inject --help`");
    }
}

// ---------------------------------------------------------------------------------------------
// Played under podman

/// What the app stand-in does: says who it is, writes to the volume, and where /tmp is a
/// mount (the app container's emptyDir) checks that it is a sticky temp dir.
const PROBE: &str = r#"set -eu
echo "probe uid=$(id -u) groups=$(id -G)"
f=$(mktemp -p "$1" app-wrote-XXXXXX); echo written > "$f"
if grep -q " /tmp " /proc/mounts; then
  mode=$(stat -c %a /tmp)
  echo "tmp mode $mode"
  [ "$mode" = 1777 ]
  t=$(mktemp -p /tmp); rm "$t"
fi
echo PROBE-OK"#;

/// Removes the pods and podman volumes of a play, on drop too.
struct Played(Vec<String>, Vec<String>);

impl Played {
    fn clean(&self) {
        for pod in &self.0 {
            let _ = common::containers::podman().args(["pod", "rm", "--force", "--ignore", pod]).output();
        }
        for vol in &self.1 {
            let _ = common::containers::podman().args(["volume", "rm", "--force", vol]).output();
        }
    }
}

impl Drop for Played {
    fn drop(&mut self) {
        self.clean();
    }
}

/// The kustomize base StatefulSet (fsGroup, a PVC, an emptyDir /tmp, an init container of its
/// own) through `volprep inject`, played twice by `podman kube play` on a loop-mounted ext4
/// volume holding root's files: the first play's volprep prepares the volume and makes /tmp
/// sticky, the non-root app writes; the second play's volprep skips (marker).
#[test]
#[ignore = "needs podman, kubectl and the static binary: source .ci/containers.sh, .ci/static.sh and .ci/k8s-tools.sh"]
fn injected_pod_plays_under_podman() {
    use common::containers;
    use common::play::{self, PlayOpts};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let test = "injected_pod_plays_under_podman";
    containers::require();
    let kubectl = tool("VOLPREP_KUBECTL", test).unwrap();
    let base = run_ok(Command::new(&kubectl).arg("kustomize").arg(Path::new(ROOT).join("examples/kustomize/base")));
    let injected = ok(&inject(&["--strict"], &base, &[]));
    say(&format!("{test}: kubectl kustomize examples/kustomize/base | volprep inject --strict"));
    let volume = common::LoopFs::new(common::FsKind::Ext4, 64);
    let root = volume.path();
    fs::create_dir(root.join("db")).unwrap();
    fs::write(root.join("db/table"), "rows").unwrap();
    fs::set_permissions(root.join("db/table"), fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(root.join("db/table"), Some(1000), Some(0)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let term_dir = dir.path().join("termination");
    fs::create_dir(&term_dir).unwrap();
    let image = containers::image();
    let volprep_image = docs(&injected)
        .iter()
        .find_map(|d| pod_spec(d)["initContainers"][0]["image"].as_str().map(str::to_string))
        .unwrap();
    let opts = PlayOpts {
        images: vec![(volprep_image, image.tag.clone())],
        claims: vec![("data-ledger-0".into(), root.to_path_buf())],
        app: Some((
            containers::probe_image().to_string(),
            vec!["/bin/sh".into(), "-c".into(), PROBE.into(), "probe".into(), "/data".into()],
        )),
        termination_dir: term_dir,
    };
    let (yaml, pods) = play::translate(&docs(&injected), &opts);
    let yaml_path = dir.path().join("play.yaml");
    fs::write(&yaml_path, &yaml).unwrap();
    // The second play finds the PVC's volume there (podman refuses to make it again).
    let pods_only: Vec<String> = docs(&yaml)
        .iter()
        .filter(|d| d["kind"].as_str() != Some("PersistentVolumeClaim"))
        .map(|d| serde_norway::to_string(d).unwrap())
        .collect();
    let replay_path = dir.path().join("replay.yaml");
    fs::write(&replay_path, pods_only.join("---\n")).unwrap();
    let played = Played(pods.iter().map(|p| p.name.clone()).collect(), vec!["data-ledger-0".into()]);
    let mut messages = Vec::new();
    played.clean();
    for round in 1..=2 {
        // The pod goes, its PVC stays (podman chowns a new volume's root to the first
        // container's user, which no kubelet does: the second play must find the volume as the
        // first one left it).
        for pod in &played.0 {
            let _ = containers::podman().args(["pod", "rm", "--force", "--ignore", pod]).output();
        }
        for pod in &pods {
            for c in pod.init_containers.iter().chain(&pod.containers) {
                fs::write(pod.termination_file(&opts, c), "").unwrap();
            }
        }
        let path = if round == 1 { &yaml_path } else { &replay_path };
        let out = output(containers::podman().args(["kube", "play"]).arg(path));
        assert!(out.status.success(), "play {round}: {}\n{yaml}", String::from_utf8_lossy(&out.stderr));
        let pod = &pods[0];
        assert_eq!(pod.init_containers, ["volprep", "migrate-schema"], "volprep first");
        for c in pod.init_containers.iter().chain(&pod.containers) {
            let name = pod.container(c);
            let (code, logs) = (containers::wait(&name), containers::logs(&name));
            assert_eq!(code, 0, "play {round}: {name} exited {code}\n{logs}");
            if c != "volprep" {
                assert!(logs.contains("probe uid=1000 ") && logs.contains("PROBE-OK"), "play {round}: {name}:\n{logs}");
            }
            if pod.containers.contains(c) {
                assert!(logs.contains("tmp mode 1777"), "play {round}: {name}: /tmp sticky\n{logs}");
            }
        }
        let msg = fs::read_to_string(pod.termination_file(&opts, "volprep")).unwrap();
        say(&format!("{test}: play {round}: volprep's termination message:\n{msg}"));
        messages.push(msg);
    }
    assert!(messages[0].lines().any(|l| l.starts_with("/volumes/data: prepared ")), "{}", messages[0]);
    assert!(messages[0].lines().any(|l| l.starts_with("/volumes/tmp: sticky temp dir")), "{}", messages[0]);
    assert!(messages[1].lines().any(|l| l.starts_with("/volumes/data: skipped (")), "{}", messages[1]);
    let table = fs::metadata(root.join("db/table")).unwrap();
    assert_eq!((table.gid(), table.mode() & 0o7777), (1000, 0o660), "the kubelet's fsGroup policy");
    let wrote: Vec<_> = fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("app-wrote-"))
        .collect();
    assert_eq!(wrote.len(), 4, "two plays, the app's init container and the app each wrote");
    for e in wrote {
        assert_eq!(
            (e.metadata().unwrap().uid(), e.metadata().unwrap().gid()),
            (1000, 1000),
            "setgid root: the group is inherited"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// GitOps: Flux (kustomize patches), Argo CD (config management plugin)

/// The objects of a stream by `Kind/name`, for comparing what two tools wrote.
fn by_kind_name(text: &str) -> std::collections::BTreeMap<String, Value> {
    docs(text)
        .into_iter()
        .filter(|d| !d.is_null())
        .map(|d| (format!("{}/{}", d["kind"].as_str().unwrap_or(""), d["metadata"]["name"].as_str().unwrap_or("")), d))
        .collect()
}

/// Renders shaped like the official alertmanager and Atlantis charts are injected (the
/// alertmanager's configmap-reload sidecar, another user that mounts no walked volume, does not
/// stop it), and nothing but the workloads changes.
#[test]
fn official_chart_renders_are_injected() {
    for (chart, workload, volume, group) in [
        ("alertmanager", "StatefulSet/alertmanager", "storage", 65534),
        ("atlantis", "StatefulSet/atlantis", "atlantis-data", 1000),
    ] {
        let input = read(&format!("tests/charts/official/{chart}.yaml"));
        let out = ok(&inject(&["--strict"], &input, &[]));
        let (before, after) = (by_kind_name(&input), by_kind_name(&out));
        for (name, obj) in &after {
            if name != workload {
                assert_eq!(obj, &before[name], "{chart}: {name} changed");
            }
        }
        let spec = pod_spec(&after[workload]);
        let args = check_volprep_pod(spec, chart);
        assert_eq!(args.paths, [format!("/volumes/{volume}")], "{chart}");
        assert_eq!(spec["securityContext"]["supplementalGroups"][0].as_u64(), Some(group), "{chart}");
        assert_eq!(ok(&inject(&[], &out, &[])), out, "{chart}: injecting twice is injecting once");
    }
}

/// `inject --emit patches`: kustomize (as Flux's post-renderer runs it) applies the patches to
/// the same rendered manifests and gets what `inject` writes, object for object (with `--modes
/// app-safe` too); the Flux
/// example's HelmRelease carries exactly the patches printed for the alertmanager render.
#[test]
#[ignore = "needs kubectl (kustomize) and PyYAML: source .ci/k8s-tools.sh"]
fn flux_patches_applied_by_kustomize_give_inject_output() {
    let test = "flux_patches_applied_by_kustomize_give_inject_output";
    let kubectl = tool("VOLPREP_KUBECTL", test).unwrap();
    let python = tool("VOLPREP_PYTHON", test).unwrap();
    for (chart, opts) in
        [("alertmanager", &[][..]), ("atlantis", &[]), ("thirdparty", &[]), ("thirdparty", &["--modes", "app-safe"])]
    {
        let file = if chart == "thirdparty" {
            "tests/charts/thirdparty.rendered.yaml".to_string()
        } else {
            format!("tests/charts/official/{chart}.yaml")
        };
        let input = read(&file);
        let patches = ok(&inject(&[&["--emit", "patches"][..], opts].concat(), &input, &[]));
        assert_eq!(patches.contains(",modes=app-safe"), !opts.is_empty(), "{patches}");
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("rendered.yaml"), &input).unwrap();
        let mut k = String::from(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - rendered.yaml\npatches:\n",
        );
        for line in patches.lines() {
            k.push_str(&format!("  {line}\n"));
        }
        fs::write(dir.path().join("kustomization.yaml"), &k).unwrap();
        let mut cmd = Command::new(&kubectl);
        cmd.arg("kustomize").arg(dir.path());
        say(&format!("{test}: {chart} {opts:?}: {}", describe(&cmd)));
        fs::write(dir.path().join("patched.yaml"), run_ok(&mut cmd)).unwrap();
        fs::write(dir.path().join("injected.yaml"), ok(&inject(opts, &input, &[]))).unwrap();
        // Compared as a YAML 1.1 reader reads them (kustomize writes `0440` as 288).
        let same = same_objects_yaml_1_1(&python, &dir.path().join("patched.yaml"), &dir.path().join("injected.yaml"));
        assert!(
            same.status.success(),
            "{chart}: kustomize with the patches differs from inject:\n{}\n{k}",
            String::from_utf8_lossy(&same.stdout)
        );
        if chart == "alertmanager" {
            let release: Value = serde_norway::from_str(&read("examples/inject/flux/helmrelease.yaml")).unwrap();
            let example = &release["spec"]["postRenderers"][0]["kustomize"]["patches"];
            assert_eq!(
                example,
                &docs(&patches)[0],
                "examples/inject/flux/helmrelease.yaml: re-paste `volprep inject --emit patches`"
            );
        }
    }
}

/// A core `apps/v1` StatefulSet and an OpenKruise `apps.kruise.io/v1beta1` StatefulSet of one
/// name and namespace (different fsGroups), a core Pod and an `x.io/v1` Pod of one name, and a
/// Pod whose name holds a `.` next to one it would match as a regular expression.
const SAME_NAMES: &str = "apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: ns}
spec:
  serviceName: db
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      securityContext: {fsGroup: 1000}
      containers: [{name: c, image: i, volumeMounts: [{name: d, mountPath: /d}]}]
      volumes: [{name: d, persistentVolumeClaim: {claimName: d}}]
---
apiVersion: apps.kruise.io/v1beta1
kind: StatefulSet
metadata: {name: db, namespace: ns}
spec:
  serviceName: db
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      securityContext: {fsGroup: 2000}
      containers: [{name: c, image: i, volumeMounts: [{name: d, mountPath: /d}]}]
      volumes: [{name: d, persistentVolumeClaim: {claimName: d}}]
---
apiVersion: v1
kind: Pod
metadata: {name: p.q, namespace: ns}
spec:
  securityContext: {fsGroup: 3000}
  containers: [{name: c, image: i, volumeMounts: [{name: d, mountPath: /d}]}]
  volumes: [{name: d, persistentVolumeClaim: {claimName: d}}]
---
apiVersion: x.io/v1
kind: Pod
metadata: {name: p.q, namespace: ns}
spec: {securityContext: {fsGroup: 4000}}
---
apiVersion: v1
kind: Pod
metadata: {name: pxq, namespace: ns}
spec: {securityContext: {fsGroup: 5000}}
";

/// SAME_NAMES as the items of a KRM ResourceList.
fn as_resource_list(stream: &str) -> String {
    let mut list = String::from("apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n");
    for doc in stream.split("---\n") {
        for (i, l) in doc.lines().enumerate() {
            list.push_str(&format!("{}{l}\n", if i == 0 { "- " } else { "  " }));
        }
    }
    list
}

/// `--emit patches` on a KRM ResourceList gives the patches of its items, those of the same
/// objects in a stream.
#[test]
fn patches_of_a_resource_list_are_its_items_patches() {
    let patches = ok(&inject(&["--emit", "patches"], SAME_NAMES, &[]));
    let from_list = inject(&["--emit", "patches"], &as_resource_list(SAME_NAMES), &[]);
    assert_eq!(ok(&from_list), patches);
    assert_eq!(docs(&patches)[0].as_sequence().map(Vec::len), Some(3), "{patches}");
    assert!(stderr(&from_list).contains("3 injected"), "{}", stderr(&from_list));
}

/// The patches' targets select one object each (group, version, kind, name, namespace, as
/// regular expressions): kustomize applies them to the objects of one name and gets what
/// `inject` writes, and no patch lands on the OpenKruise StatefulSet, the `x.io` Pod or `pxq`.
#[test]
#[ignore = "needs kubectl (kustomize) and PyYAML: source .ci/k8s-tools.sh"]
fn patch_targets_select_one_object_under_kustomize() {
    let test = "patch_targets_select_one_object_under_kustomize";
    let kubectl = tool("VOLPREP_KUBECTL", test).unwrap();
    let python = tool("VOLPREP_PYTHON", test).unwrap();
    for (name, input) in [("stream", SAME_NAMES.to_string()), ("ResourceList", as_resource_list(SAME_NAMES))] {
        let patches = ok(&inject(&["--emit", "patches"], &input, &[]));
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("rendered.yaml"), SAME_NAMES).unwrap();
        let mut k = String::from("resources:\n  - rendered.yaml\npatches:\n");
        for line in patches.lines() {
            k.push_str(&format!("  {line}\n"));
        }
        fs::write(dir.path().join("kustomization.yaml"), &k).unwrap();
        let mut cmd = Command::new(&kubectl);
        cmd.arg("kustomize").arg(dir.path());
        say(&format!("{test}: {name}: {}", describe(&cmd)));
        let patched = run_ok(&mut cmd);
        fs::write(dir.path().join("patched.yaml"), &patched).unwrap();
        fs::write(dir.path().join("injected.yaml"), ok(&inject(&[], SAME_NAMES, &[]))).unwrap();
        let same = same_objects_yaml_1_1(&python, &dir.path().join("patched.yaml"), &dir.path().join("injected.yaml"));
        assert!(same.status.success(), "{name}: {}\n{k}", String::from_utf8_lossy(&same.stdout));
        assert_eq!(patched.matches("name: volprep\n").count(), 3, "{patched}");
    }
}

/// Runs PyYAML over two streams: exit 0 when they hold the same objects (by `Kind/name`), read as
/// YAML 1.1; else the differing objects on stdout.
fn same_objects_yaml_1_1(python: &Path, a: &Path, b: &Path) -> Output {
    let script = r#"
import sys, yaml
def objs(path):
    return {(d["apiVersion"], d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(open(path)) if d}
a, b = objs(sys.argv[1]), objs(sys.argv[2])
bad = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
for k in bad:
    print(k, "\n", a.get(k), "\n", b.get(k))
sys.exit(1 if bad else 0)
"#;
    output(Command::new(python).arg("-c").arg(script).arg(a).arg(b))
}

/// Runs examples/inject/argocd/plugin.yaml as Argo CD's cmp-server does, in `app` (a copy of the
/// Application's source path): `init`, then `generate`, each as its argv, with only the
/// sidecar's PATH (helm and volprep) and HOME, plus Argo CD's environment.
fn argocd_generate(helm_bin: &Path, app: &Path, plugin_env: &[(&str, &str)]) -> Output {
    let plugin: Value = serde_norway::from_str(&read("examples/inject/argocd/plugin.yaml")).unwrap();
    let file = plugin["spec"]["discover"]["fileName"].as_str().unwrap();
    assert!(app.join(file).is_file(), "the plugin's discover rule ({file}) matches the app");
    let bin = app.parent().unwrap().join("sidecar-bin");
    fs::create_dir_all(&bin).unwrap();
    for (name, target) in [("helm", helm_bin), ("volprep", Path::new(BIN))] {
        let _ = std::os::unix::fs::symlink(target, bin.join(name));
    }
    let home = app.parent().unwrap().join("home");
    fs::create_dir_all(&home).unwrap();
    let mut last = None;
    for step in ["init", "generate"] {
        let argv = cmp_step(&plugin, step);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]).current_dir(app).env_clear();
        cmd.env("PATH", format!("{}:/usr/bin:/bin", bin.display())).env("HOME", &home);
        cmd.envs(argocd_env("rel", "apps", plugin_env));
        let out = output(&mut cmd);
        if step == "init" {
            assert!(out.status.success(), "init: {}", String::from_utf8_lossy(&out.stderr));
        }
        last = Some(out);
    }
    last.unwrap()
}

/// The Argo CD plugin, run the way Argo CD runs it on a chart: the injected manifests on stdout
/// (values from the Application's plugin env); a refused workload fails the generate step
/// (`--strict`), naming the workload and why, where Argo CD shows it.
#[test]
#[ignore = "needs helm: source .ci/k8s-tools.sh"]
fn argocd_plugin_runs_as_argo_cd_runs_it() {
    let test = "argocd_plugin_runs_as_argo_cd_runs_it";
    let helm_bin = tool("VOLPREP_HELM", test).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("app");
    copy_dir(&Path::new(ROOT).join("tests/charts/thirdparty"), &app);
    let values = "--set runner.enabled=false --set reader.enabled=false --set postgres.size=3Gi";
    let out = argocd_generate(&helm_bin, &app, &[("HELM_ARGS", values)]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "generate: {}", String::from_utf8_lossy(&out.stderr));
    say(&format!(
        "{test}: generate with ARGOCD_ENV_HELM_ARGS='{values}': {} documents, first lines:\n{}",
        docs(&text).len(),
        text.lines().take(12).collect::<Vec<_>>().join("\n")
    ));
    let all = docs(&text);
    let pg = by_name(&all, "StatefulSet", "rel-postgres");
    check_volprep_pod(pod_spec(pg), "argocd");
    assert_eq!(pg["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"].as_str(), Some("3Gi"));
    assert!(all.iter().all(|d| d["metadata"]["name"].as_str() != Some("rel-runner")), "values applied");
    let refused = argocd_generate(&helm_bin, &app, &[]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(5), "{err}");
    assert!(
        refused.stdout.is_empty() && err.contains("Pod/rel-runner: refused: containers mounting volume builds"),
        "{err}"
    );
}

/// The Argo CD plugin's generate step, with a stand-in `helm` (a script that prints FAKE_RENDER,
/// touches FAKE_MARK, sleeps FAKE_SLEEP seconds, exits FAKE_EXIT) and TMPDIR a directory of
/// the test's own, spawned in a process group of its own.
fn spawn_generate(dir: &Path, env: &[(&str, &str)]) -> std::process::Child {
    use std::os::unix::process::CommandExt as _;
    let plugin: Value = serde_norway::from_str(&read("examples/inject/argocd/plugin.yaml")).unwrap();
    let bin = dir.join("bin");
    let app = dir.join("app");
    fs::create_dir_all(&bin).unwrap();
    fs::create_dir_all(&app).unwrap();
    fs::create_dir_all(dir.join("tmp")).unwrap();
    let _ = std::os::unix::fs::symlink(BIN, bin.join("volprep"));
    let helm = "#!/bin/sh\ncat \"$FAKE_RENDER\"\n[ -z \"${FAKE_MARK:-}\" ] || : >\"$FAKE_MARK\"\nsleep \"${FAKE_SLEEP:-0}\"\nexit \"${FAKE_EXIT:-0}\"\n";
    fs::write(bin.join("helm"), helm).unwrap();
    fs::set_permissions(bin.join("helm"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let argv = cmp_step(&plugin, "generate");
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).current_dir(&app).env_clear().process_group(0);
    cmd.env("PATH", format!("{}:/usr/bin:/bin", bin.display())).env("TMPDIR", dir.join("tmp"));
    cmd.envs(argocd_env("rel", "apps", &[])).envs(env.iter().copied());
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().expect("spawn the generate step")
}

/// What is left in the generate step's TMPDIR.
fn leftovers(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir.join("tmp")).unwrap().map(|e| e.unwrap().path()).collect()
}

/// The generate step leaves no temporary file (rendered manifests hold the chart's Secrets)
/// after a success, a failed `helm template`, a `--strict` refusal, a SIGTERM to its process
/// group and a SIGKILL to its shell.
#[test]
fn argocd_generate_leaves_no_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let (pod, all) = (dir.path().join("pod.yaml"), dir.path().join("all.yaml"));
    fs::write(&pod, TAGGED_POD).unwrap();
    fs::write(&all, rendered()).unwrap();
    let (pod, all) = (pod.to_str().unwrap(), all.to_str().unwrap());
    for (case, env, code) in [
        ("success", vec![("FAKE_RENDER", pod)], Some(0)),
        ("helm fails", vec![("FAKE_RENDER", pod), ("FAKE_EXIT", "1")], Some(1)),
        ("refused", vec![("FAKE_RENDER", all)], Some(5)),
    ] {
        let out = spawn_generate(dir.path(), &env).wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), code, "{case}: {err}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).contains("initContainers"), code == Some(0), "{case}");
        assert_eq!(leftovers(dir.path()), Vec::<PathBuf>::new(), "{case}: left in TMPDIR");
    }
    for (case, signal, group) in
        [("SIGTERM to the group", libc::SIGTERM, true), ("SIGKILL to sh", libc::SIGKILL, false)]
    {
        let mark = dir.path().join("helm-running");
        let _ = fs::remove_file(&mark);
        let env = [("FAKE_RENDER", pod), ("FAKE_MARK", mark.to_str().unwrap()), ("FAKE_SLEEP", "30")];
        let mut child = spawn_generate(dir.path(), &env);
        let pid = child.id() as i32;
        let start = std::time::Instant::now();
        while !mark.exists() && start.elapsed() < std::time::Duration::from_secs(20) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(mark.exists(), "{case}: helm never ran");
        // SAFETY: kill has no memory preconditions; pid is our child, its group its own.
        unsafe { libc::kill(if group { -pid } else { pid }, signal) };
        let status = child.wait().unwrap();
        // SAFETY: as above: the stand-in helm's sleep, left by a SIGKILL to its shell.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        assert!(!status.success(), "{case}");
        assert_eq!(leftovers(dir.path()), Vec::<PathBuf>::new(), "{case}: left in TMPDIR");
    }
}

/// An ELF64 little-endian header and one program header of `p_type` (3: PT_INTERP, what a
/// dynamically linked executable has; 1: PT_LOAD).
fn tiny_elf(p_type: u32) -> Vec<u8> {
    let mut b = vec![0u8; 64 + 56];
    b[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
    b[32..40].copy_from_slice(&64u64.to_le_bytes());
    b[54..56].copy_from_slice(&56u16.to_le_bytes());
    b[56..58].copy_from_slice(&1u16.to_le_bytes());
    b[64..68].copy_from_slice(&p_type.to_le_bytes());
    b
}

/// build-sidecar.sh takes only statically linked programs (the image has no C library): a
/// dynamically linked volprep (this test build, as `cargo install` makes) or helm stops it with
/// a message naming the file, before any image is built.
#[test]
fn argocd_sidecar_build_refuses_a_dynamic_binary() {
    let dir = tempfile::tempdir().unwrap();
    let (stat, dynamic) = (dir.path().join("static"), dir.path().join("dynamic"));
    fs::write(&stat, tiny_elf(1)).unwrap();
    fs::write(&dynamic, tiny_elf(3)).unwrap();
    let script = Path::new(ROOT).join("examples/inject/argocd/build-sidecar.sh");
    let build = |volprep: &Path, helm: &Path| {
        let mut cmd = Command::new("sh");
        cmd.arg(&script).arg("localhost/never-built").env("VOLPREP", volprep).env("HELM", helm).env("BUSYBOX", &stat);
        cmd.env("PATH", "/usr/bin:/bin");
        output(&mut cmd)
    };
    let o = build(Path::new(BIN), &stat);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{BIN}: dynamically linked (it names an ELF interpreter)"))
            && err.contains("volprep must be statically linked (set VOLPREP)"),
        "{err}"
    );
    let o = build(&stat, &dynamic);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(1) && err.contains("helm must be statically linked (set HELM)"), "{err}");
    let o = build(&dir.path().join("missing"), &stat);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(1) && err.contains("no volprep: set VOLPREP"), "{err}");
}

/// The wrapper-chart route for a chart from a Helm repository (Argo CD's plugins apply to git
/// sources only): a chart in git that depends on it, built by the plugin's `init` (`helm
/// dependency build`). Here the dependency is a local chart (no repository is reachable);
/// examples/inject/argocd/wrapper-chart names the real one.
#[test]
#[ignore = "needs helm: source .ci/k8s-tools.sh"]
fn argocd_wrapper_chart_route() {
    let helm_bin = tool("VOLPREP_HELM", "argocd_wrapper_chart_route").unwrap();
    let example: Value = serde_norway::from_str(&read("examples/inject/argocd/wrapper-chart/Chart.yaml")).unwrap();
    let dep = &example["dependencies"][0];
    assert!(dep["repository"].as_str().unwrap().starts_with("https://"), "{dep:?}");
    let values: Value = serde_norway::from_str(&read("examples/inject/argocd/wrapper-chart/values.yaml")).unwrap();
    assert!(values[dep["name"].as_str().unwrap()].is_mapping(), "values go under the dependency's name");
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&Path::new(ROOT).join("tests/charts/thirdparty"), &dir.path().join("thirdparty"));
    let app = dir.path().join("app");
    fs::create_dir_all(&app).unwrap();
    fs::write(app.join("Chart.yaml"), "apiVersion: v2\nname: wrapper\nversion: 0.1.0\ndependencies:\n  - name: thirdparty\n    version: \"*\"\n    repository: file://../thirdparty\n").unwrap();
    fs::write(app.join("values.yaml"), "thirdparty:\n  runner:\n    enabled: false\n  reader:\n    enabled: false\n")
        .unwrap();
    let out = argocd_generate(&helm_bin, &app, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all = docs(&String::from_utf8_lossy(&out.stdout));
    check_volprep_pod(pod_spec(by_name(&all, "StatefulSet", "rel-postgres")), "wrapper chart");
}

/// Helm 3 and Helm 4 sharing one HELM_DATA_HOME: Helm 3 refuses every plugin when one
/// plugin.yaml is Helm 4's (`unknown field "apiVersion"`), so the Helm 4 plugin lives in a
/// directory only Helm 4 reads (its HELM_PLUGINS lists the shared plugins directory and that
/// one), as examples/inject/README.md says. Both then work, Helm 3's own plugins included.
#[test]
#[ignore = "needs helm v3 and v4: source .ci/k8s-tools.sh"]
fn helm3_and_helm4_plugins_coexist_in_one_data_home() {
    let test = "helm3_and_helm4_plugins_coexist_in_one_data_home";
    let (helm4, helm3) = (tool("VOLPREP_HELM", test).unwrap(), tool("VOLPREP_HELM3", test).unwrap());
    let home = tempfile::tempdir().unwrap();
    let bin = home.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(BIN, bin.join("volprep")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let shared = home.path().join("data/plugins");
    // A Helm 3 plugin of the user's, in the shared directory.
    let theirs = shared.join("hello");
    fs::create_dir_all(&theirs).unwrap();
    fs::write(
        theirs.join("plugin.yaml"),
        "name: hello\nversion: 0.1.0\nusage: says hello\ndescription: a Helm 3 plugin\ncommand: echo hello\n",
    )
    .unwrap();
    let plugin = Path::new(ROOT).join("examples/inject/helm-plugin");
    let chart = Path::new(ROOT).join("tests/charts/thirdparty");
    // What breaks: the Helm 4 plugin in the shared directory.
    std::os::unix::fs::symlink(&plugin, shared.join("volprep-inject")).unwrap();
    let broken = output(helm(&helm3, home.path()).args(["plugin", "list"]));
    assert!(
        !broken.status.success() && String::from_utf8_lossy(&broken.stderr).contains("unknown field \"apiVersion\""),
        "Helm 3 now loads a Helm 4 plugin: simplify examples/inject/README.md"
    );
    fs::remove_file(shared.join("volprep-inject")).unwrap();
    // The documented layout: a Helm 4 only directory.
    let helm4_only = home.path().join("helm4-plugins");
    fs::create_dir_all(&helm4_only).unwrap();
    std::os::unix::fs::symlink(&plugin, helm4_only.join("volprep-inject")).unwrap();
    let listed = run_ok(helm(&helm3, home.path()).env("PATH", &path).args(["plugin", "list"]));
    assert!(listed.contains("hello"), "{listed}");
    let v3 = run_ok(helm(&helm3, home.path()).env("PATH", &path).args(["template", "rel"]).arg(&chart).args([
        "--post-renderer",
        "volprep",
        "--post-renderer-args",
        "inject",
    ]));
    let mut cmd = helm(&helm4, home.path());
    cmd.env("PATH", &path).env("HELM_PLUGINS", format!("{}:{}", shared.display(), helm4_only.display()));
    cmd.args(["template", "rel"]).arg(&chart).args(["--post-renderer", "volprep-inject"]);
    say(&format!("{test}: HELM_PLUGINS=shared:helm4-only {}", describe(&cmd)));
    let v4 = run_ok(&mut cmd);
    assert_eq!(docs(&v3), docs(&v4), "Helm 3 and Helm 4 render the same injected manifests");
    assert_eq!(v4.matches("name: volprep\n").count(), 3, "{v4}");
}

/// A PostgreSQL StatefulSet injected with the kubelet's rule is said in the summary and in the
/// workload's annotation, naming the setting that keeps it working; with app-safe, nothing.
#[test]
fn a_postgresql_statefulset_under_the_kubelets_rule_is_flagged() {
    let sts = postgres_statefulset(999, 2000, None);
    let out = inject(&[], &sts, &[]);
    let text = ok(&out);
    assert!(text.contains("volprep.io/app-modes:"), "{text}");
    let err = stderr(&out);
    assert!(err.contains("StatefulSet/pg: runs postgres:17 (PostgreSQL) under the kubelet's rule"), "{err}");
    assert!(err.contains("1 injected with the kubelet's rule run an app that insists on private modes"), "{err}");
    let safe = inject(&["--modes", "app-safe"], &sts, &[]);
    assert!(!ok(&safe).contains("volprep.io/app-modes") && !stderr(&safe).contains("insists"), "{}", stderr(&safe));
}
