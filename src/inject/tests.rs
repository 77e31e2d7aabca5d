//! The rewrite on text, without I/O: selection, the chart's pattern, refusals, idempotence,
//! untouched documents byte for byte, KRM ResourceLists.

use std::path::Path;

use super::config::Config;
use super::node::Node;
use super::parse::parse;
use super::{Outcome, REFUSED_ANNOTATION, inject_stream};
use crate::error::InjectErrorKind;

const STS: &str = "\
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: db
spec:
  serviceName: db
  selector:
    matchLabels: {app: db}
  template:
    metadata:
      labels: {app: db}
    spec:
      securityContext:
        runAsUser: 1001
        runAsGroup: 1001
        fsGroup: 1001
        fsGroupChangePolicy: OnRootMismatch
      containers:
        - name: db
          image: postgres:17
          env:
            - name: FLAG
              value: \"yes\"
          volumeMounts:
            - name: data
              mountPath: /var/lib/postgresql
            - name: tmp
              mountPath: /tmp
            - name: conf
              mountPath: /etc/db
      volumes:
        - name: tmp
          emptyDir: {}
        - name: conf
          configMap:
            name: db
            defaultMode: 0644
  volumeClaimTemplates:
    - metadata:
        name: data
      spec:
        accessModes: [ReadWriteOnce]
        resources:
          requests:
            storage: 1Gi
";

fn run(text: &str) -> super::Output {
    run_with(text, &[])
}

fn run_with(text: &str, sets: &[&str]) -> super::Output {
    let mut cfg = Config::default();
    for s in sets {
        cfg.set_pair(s).unwrap();
    }
    inject_stream(text, Path::new("-"), &cfg, &[]).unwrap()
}

fn doc(text: &str) -> Node {
    parse(text).unwrap().remove(0)
}

fn strs(n: Option<&Node>) -> Vec<String> {
    n.map(Node::as_seq).unwrap_or(&[]).iter().map(|x| x.as_str().unwrap_or("").to_string()).collect()
}

#[test]
fn statefulset_gets_the_chart_pattern() {
    let out = run(STS);
    assert_eq!(out.events[0].outcome, Outcome::Injected);
    let d = doc(&out.text);
    let pod = d.at(&["spec", "template", "spec"]).unwrap();
    let psc = pod.get("securityContext").unwrap();
    assert!(psc.get("fsGroup").is_none() && psc.get("fsGroupChangePolicy").is_none(), "{}", out.text);
    assert_eq!(psc.get("supplementalGroups").unwrap().as_seq()[0].as_u64(), Some(1001));
    let init = &pod.get("initContainers").unwrap().as_seq()[0];
    assert_eq!(init.get("name").and_then(Node::as_str), Some("volprep"));
    assert_eq!(
        strs(init.get("args")),
        [
            "apply",
            "--log-format=json",
            "--termination-log=/dev/termination-log",
            "--sticky=/volumes/tmp",
            "--volume=/volumes/data,fs-group=1001"
        ]
    );
    let mounts: Vec<String> = init
        .get("volumeMounts")
        .unwrap()
        .as_seq()
        .iter()
        .map(|m| {
            format!("{}={}", m.get("name").unwrap().as_str().unwrap(), m.get("mountPath").unwrap().as_str().unwrap())
        })
        .collect();
    assert_eq!(mounts, ["tmp=/volumes/tmp", "data=/volumes/data"]);
    let sc = init.get("securityContext").unwrap();
    assert_eq!(sc.get("runAsUser").and_then(Node::as_u64), Some(0));
    assert_eq!(strs(sc.at(&["capabilities", "add"])), ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"]);
    assert_eq!(init.get("image").and_then(Node::as_str), Some(Config::default().container.image.reference().as_str()));
    // The rest of the document means what it meant to a YAML 1.1 reader.
    assert!(out.text.contains("defaultMode: 0644") && out.text.contains("value: \"yes\""), "{}", out.text);
    assert!(out.text.contains("matchLabels:\n      app: db\n"), "{}", out.text);
}

#[test]
fn injecting_twice_is_injecting_once() {
    let once = run(STS).text;
    let twice = run(&once);
    assert_eq!(twice.text, once);
    assert_eq!(twice.events[0].outcome, Outcome::Skipped("already injected".into()));
}

#[test]
fn untouched_documents_are_copied_byte_for_byte() {
    let other = "---\n# a comment\napiVersion: v1\nkind:   Service   # odd spacing\nmetadata: {name: db}\nspec:\n    ports: [{port: 5432}]\n";
    let plain = "---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n    spec:\n      containers: [{name: w, image: nginx}]\n";
    let input = format!("# leading\n{other}---\n# Source: chart/templates/sts.yaml\n{STS}{plain}");
    let out = run(&input);
    assert!(
        out.text
            .starts_with(&format!("# leading\n{other}---\n# Source: chart/templates/sts.yaml\napiVersion: apps/v1\n"))
    );
    assert!(out.text.ends_with(plain), "{}", out.text);
    assert_eq!(out.events.len(), 3);
    assert_eq!(run(&format!("{other}{plain}")).text, format!("{other}{plain}"));
}

#[test]
fn opt_out_and_opt_in_by_annotation() {
    let annotated = |v: &str| {
        STS.replacen("  name: db\n", &format!("  name: db\n  annotations:\n    volprep.io/inject: \"{v}\"\n"), 1)
    };
    let out = run(&annotated("false"));
    assert!(matches!(&out.events[0].outcome, Outcome::Skipped(w) if w.contains("opted out")));
    assert_eq!(out.text, annotated("false"));
    let out = run_with(STS, &["select=opt-in"]);
    assert!(matches!(&out.events[0].outcome, Outcome::Skipped(w) if w.contains("not opted in")));
    assert_eq!(run_with(&annotated("true"), &["select=opt-in"]).events[0].outcome, Outcome::Injected);
}

#[test]
fn refusals_leave_the_workload_unchanged_and_say_why() {
    let secret = STS.replace(
        "configMap:\n            name: db\n            defaultMode: 0644",
        "secret:\n            secretName: db\n            defaultMode: 0440",
    );
    let mixed = STS.replace(
        "      containers:\n",
        "      containers:\n        - name: exporter\n          image: exporter\n          securityContext: {runAsUser: 999}\n",
    );
    let items = STS.replace("            defaultMode: 0644", "            items: [{key: a, path: a, mode: 416}]");
    let mixed = mixed.replace(
        "securityContext: {runAsUser: 999}\n",
        "securityContext: {runAsUser: 999}\n          volumeMounts: [{name: data, mountPath: /data}]\n",
    );
    for (input, expect) in [
        (
            secret,
            "volume conf (secret, mode 0440) is readable through its group only: without fsGroup its files keep group root and db could no longer read them",
        ),
        (mixed, "containers mounting volume data run as different users (exporter 999:1001, db 1001:1001)"),
        (items, "volume conf (configMap, mode 0640)"),
    ] {
        // Left byte for byte without the annotation ...
        let out = run_with(&input, &["annotateRefusals=false"]);
        assert_eq!(out.text, input);
        let Outcome::Refused(why) = &out.events[0].outcome else { panic!("{:?}", out.events) };
        assert!(why[0].contains(expect), "{why:?}");
        // ... and with it, the only change is the annotation on the workload, saying why.
        let annotated = doc(&run(&input).text);
        let note = annotated.at(&["metadata", "annotations", REFUSED_ANNOTATION]).and_then(Node::as_str).unwrap();
        assert!(note.contains(expect), "{note}");
        let mut back = annotated.clone();
        back.get_mut("metadata").unwrap().remove("annotations");
        assert_eq!(back, doc(&input));
        assert_eq!(run(&run(&input).text).text, run(&input).text, "annotating twice is annotating once");
    }
    let out = run_with(&STS.replace("        runAsUser: 1001\n", ""), &["mode=unprivileged"]);
    let Outcome::Refused(why) = &out.events[0].outcome else { panic!("{:?}", out.events) };
    assert!(why[0].contains("mode unprivileged runs volprep as the app's uid"), "{why:?}");
}

#[test]
fn unprivileged_runs_as_the_app_and_leaves_empty_dirs() {
    let d = doc(&run_with(STS, &["mode=unprivileged", "allowForeign=true"]).text);
    let init = &d.at(&["spec", "template", "spec", "initContainers"]).unwrap().as_seq()[0];
    assert_eq!(
        strs(init.get("args")),
        [
            "apply",
            "--unprivileged",
            "--allow-foreign",
            "--log-format=json",
            "--termination-log=/dev/termination-log",
            "--volume=/volumes/data,fs-group=1001"
        ]
    );
    let sc = init.get("securityContext").unwrap();
    assert_eq!(
        (sc.get("runAsUser").unwrap().as_u64(), sc.get("runAsNonRoot").unwrap().as_bool()),
        (Some(1001), Some(true))
    );
    assert!(sc.at(&["capabilities", "add"]).is_none());
}

#[test]
fn cronjob_pvc_read_only_mounts_and_pull_secrets() {
    let cron = "\
apiVersion: batch/v1
kind: CronJob
metadata: {name: backup}
spec:
  schedule: '@daily'
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          securityContext: {fsGroup: 2000}
          containers:
            - name: b
              image: busybox
              env: [{name: TMPDIR, value: /scratch}]
              volumeMounts:
                - {name: src, mountPath: /src, readOnly: true}
                - {name: scratch, mountPath: /scratch}
                - {name: frozen, mountPath: /frozen}
          volumes:
            - name: src
              persistentVolumeClaim: {claimName: src}
            - name: scratch
              ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}}}
            - name: frozen
              persistentVolumeClaim: {claimName: frozen, readOnly: true}
";
    let out = run_with(cron, &["pullSecrets=[regcred]", "extraArgs=[--verify=full]", "image.digest=sha256:00"]);
    let d = doc(&out.text);
    let pod = d.at(&["spec", "jobTemplate", "spec", "template", "spec"]).unwrap();
    let init = &pod.get("initContainers").unwrap().as_seq()[0];
    let args = strs(init.get("args"));
    assert_eq!(
        &args[3..],
        ["--verify=full", "--volume=/volumes/src,fs-group=2000", "--volume=/volumes/scratch,fs-group=2000"],
        "the kubelet walks src read-write (the volume is not readOnly), whatever the mounts say"
    );
    assert!(init.get("image").unwrap().as_str().unwrap().ends_with("@sha256:00"));
    assert_eq!(pod.at(&["imagePullSecrets"]).unwrap().as_seq()[0].get("name").unwrap().as_str(), Some("regcred"));
}

#[test]
fn pods_without_fs_group_or_walked_volumes_are_left_alone() {
    let no_group = STS.replace("        fsGroup: 1001\n", "");
    assert_eq!(run(&no_group).text, no_group);
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  securityContext: {fsGroup: 1}\n  containers: [{name: c, image: x}]\n";
    let out = run(pod);
    assert_eq!(out.text, pod);
    assert!(matches!(&out.events[0].outcome, Outcome::Skipped(w) if w.contains("no volume")));
}

#[test]
fn lists_and_krm_resource_lists() {
    let list = format!("apiVersion: v1\nkind: List\nitems:\n{}", indent(STS));
    let d = doc(&run(&list).text);
    assert!(d.at(&["items"]).unwrap().as_seq()[0].at(&["spec", "template", "spec", "initContainers"]).is_some());
    let secret = STS.replace(
        "configMap:\n            name: db\n            defaultMode: 0644",
        "secret:\n            secretName: db\n            defaultMode: 0440",
    );
    let rl = format!(
        "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nfunctionConfig:\n  apiVersion: volprep.io/v1alpha1\n  kind: Inject\n  metadata: {{name: x}}\n  spec:\n    image: {{tag: \"9.9\"}}\nitems:\n{}{}",
        indent(STS),
        indent(&secret.replace("name: db\nspec:\n  serviceName", "name: other\nspec:\n  serviceName"))
    );
    let out = run(&rl);
    let d = doc(&out.text);
    let items = d.get("items").unwrap().as_seq();
    let init = &items[0].at(&["spec", "template", "spec", "initContainers"]).unwrap().as_seq()[0];
    assert!(init.get("image").unwrap().as_str().unwrap().ends_with(":9.9"));
    assert!(items[1].at(&["spec", "template", "spec", "initContainers"]).is_none());
    let r = &d.get("results").unwrap().as_seq()[0];
    assert_eq!(r.at(&["resourceRef", "name"]).and_then(Node::as_str), Some("other"));
    assert_eq!(r.get("severity").and_then(Node::as_str), Some("warning"));
}

#[test]
fn malformed_yaml_is_one_error_with_its_place() {
    let bad = format!("{STS}---\nkind: Pod\n  bad: indent\n");
    let source = Path::new("in\\.yaml");
    let e = inject_stream(&bad, source, &Config::default(), &[]).unwrap_err();
    let line = STS.lines().count() + 3;
    assert_eq!((e.source.as_path(), e.line), (source, Some(line)), "{e:?}");
    assert!(e.col.is_some() && matches!(&e.kind, InjectErrorKind::NotYaml(m) if !m.contains('\n')), "{e:?}");
    let shown = e.to_string();
    assert!(shown.starts_with(&format!("in\\\\.yaml:{line}:")), "escaped once: {shown}");
}

fn indent(doc: &str) -> String {
    let mut out = String::new();
    for (i, line) in doc.lines().enumerate() {
        out.push_str(if i == 0 { "  - " } else { "    " });
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The init container's args of the first document of `out`.
fn init_args(out: &super::Output) -> Vec<String> {
    let d = doc(&out.text);
    let inits = d.at(&["spec", "template", "spec", "initContainers"]).map(Node::as_seq).unwrap_or(&[]);
    strs(inits.first().and_then(|c| c.get("args")))
}

/// STS with `volprep.io/modes: VALUE` on the workload.
fn modes_on_workload(value: &str) -> String {
    STS.replacen("  name: db\n", &format!("  name: db\n  annotations:\n    volprep.io/modes: {value}\n"), 1)
}

/// `text` with `volprep.io/modes: VALUE` on its pod template.
fn modes_on_template(text: &str, value: &str) -> String {
    text.replacen(
        "      labels: {app: db}\n",
        &format!("      labels: {{app: db}}\n      annotations:\n        volprep.io/modes: {value}\n"),
        1,
    )
}

#[test]
fn modes_key_puts_the_policy_on_every_volume() {
    let out = run_with(STS, &["modes=app-safe"]);
    assert_eq!(out.events[0].outcome, Outcome::Injected);
    assert_eq!(
        init_args(&out)[3..],
        ["--sticky=/volumes/tmp", "--volume=/volumes/data,fs-group=1001,modes=app-safe,app-uid=1001"],
        "a --volume gets modes=, a --sticky has no spec"
    );
    let patches: Vec<&str> = out.patches.iter().filter_map(|p| p.get("patch").and_then(Node::as_str)).collect();
    assert!(
        patches.iter().any(|p| p.contains("--volume=/volumes/data,fs-group=1001,modes=app-safe,app-uid=1001")),
        "--emit patches carries it: {patches:?}"
    );
    assert_eq!(
        init_args(&run_with(STS, &["modes=App-Safe", "mode=unprivileged"]))[2..],
        [
            "--log-format=json",
            "--termination-log=/dev/termination-log",
            "--volume=/volumes/data,fs-group=1001,modes=app-safe,app-uid=1001"
        ],
        "written as apply spells it, in mode unprivileged too"
    );
}

#[test]
fn modes_annotation_overrides_the_key_the_templates_winning() {
    let walked = |out: &super::Output| init_args(out).last().cloned().unwrap();
    let safe = "--volume=/volumes/data,fs-group=1001,modes=app-safe,app-uid=1001";
    let plain = "--volume=/volumes/data,fs-group=1001";
    assert_eq!(walked(&run(&modes_on_workload("app-safe"))), safe);
    assert_eq!(walked(&run(&modes_on_workload("\"app-safe\""))), safe);
    assert_eq!(walked(&run_with(&modes_on_workload("kubelet"), &["modes=app-safe"])), plain, "the workload's wins");
    assert_eq!(walked(&run(&modes_on_template(STS, "app-safe"))), safe);
    let both = modes_on_template(&modes_on_workload("app-safe"), "kubelet");
    assert_eq!(walked(&run_with(&both, &["modes=app-safe"])), plain, "the template's wins over the workload's");
    let both = modes_on_template(&modes_on_workload("kubelet"), "app-safe");
    assert_eq!(walked(&run(&both)), safe);
    // A `--modes` among extraArgs is what a --volume without modes= gets: inject says modes=
    // whenever its choice differs from it, and only then.
    // The app's uid (the runAsUser of the containers mounting the volume) goes with app-safe.
    let uid_only = "--volume=/volumes/data,fs-group=1001,app-uid=1001";
    assert_eq!(walked(&run_with(STS, &["extraArgs=[--modes=app-safe]"])), uid_only);
    assert_eq!(walked(&run_with(STS, &["extraArgs=[--modes, app-safe]", "modes=app-safe"])), uid_only);
    assert_eq!(
        walked(&run_with(&modes_on_workload("kubelet"), &["extraArgs=[--modes=app-safe]"])),
        "--volume=/volumes/data,fs-group=1001,modes=kubelet"
    );
}

#[test]
fn app_safe_takes_the_uid_of_the_containers_mounting_the_volume() {
    let walked = |out: &super::Output| init_args(out).last().cloned().unwrap();
    let base = "--volume=/volumes/data,fs-group=1001,modes=app-safe";
    // No runAsUser anywhere (the image's user), or root's: no app uid, app-safe is the
    // kubelet's rule.
    let unset = STS.replace("        runAsUser: 1001\n", "");
    assert!(!unset.contains("runAsUser"), "{unset}");
    assert_eq!(walked(&run_with(&unset, &["modes=app-safe"])), base);
    let root = STS.replace("runAsUser: 1001", "runAsUser: 0");
    assert_eq!(walked(&run_with(&root, &["modes=app-safe"])), base);
    assert_eq!(walked(&run_with(STS, &["modes=app-safe"])), format!("{base},app-uid=1001"));
}

#[test]
fn the_rules_annotation_puts_each_rule_on_its_volume() {
    let walked = |out: &super::Output| init_args(out).last().cloned().unwrap();
    let on = |value: &str| {
        STS.replacen("  name: db\n", &format!("  name: db\n  annotations:\n    volprep.io/rules: \"{value}\"\n"), 1)
    };
    // Rules choose app-safe, with the app's uid.
    assert_eq!(
        walked(&run(&on("data/certs/tls.key=owner-only; data=0750"))),
        "--volume=/volumes/data,fs-group=1001,modes=app-safe,app-uid=1001,rule=certs/tls.key=owner-only,rule=.=0750"
    );
    for (value, why) in [
        ("tmp/x=keep", "tmp is no volume volprep walks here"),
        ("data/x=private", "'private' is not a rule"),
        ("data/../x=keep", "without '..'"),
    ] {
        let out = run(&on(value));
        let Outcome::Refused(reasons) = &out.events[0].outcome else { panic!("{value}: {:?}", out.events[0]) };
        assert!(reasons.iter().any(|r| r.contains(why)), "{value}: {reasons:?}");
    }
    let kubelet = on("data/x=keep").replacen("  annotations:\n", "  annotations:\n    volprep.io/modes: kubelet\n", 1);
    let out = run(&kubelet);
    let Outcome::Refused(reasons) = &out.events[0].outcome else { panic!("{:?}", out.events[0]) };
    assert!(reasons.iter().any(|r| r.contains("rules are rules of app-safe")), "{reasons:?}");
}

#[test]
fn an_app_image_under_the_kubelets_rule_is_said_and_annotated() {
    let annotation = |out: &super::Output| {
        doc(&out.text)
            .at(&["metadata", "annotations", super::APP_MODES_ANNOTATION])
            .and_then(Node::as_str)
            .map(str::to_string)
    };
    // A PostgreSQL StatefulSet injected with the kubelet's rule.
    let out = run(STS);
    assert_eq!(out.events[0].apps, ["postgres:17 (PostgreSQL)"]);
    let said = annotation(&out).expect("annotated");
    assert!(said.contains("postgres:17 (PostgreSQL)") && said.contains("volprep.io/modes: app-safe"), "{said}");
    // Not on the pod template: nothing rolls out for it.
    assert!(doc(&out.text).at(&["spec", "template", "metadata", "annotations", super::APP_MODES_ANNOTATION]).is_none());
    // With app-safe, however chosen, nothing is said.
    for out in [
        run_with(STS, &["modes=app-safe"]),
        run_with(STS, &["extraArgs=[--modes=app-safe]"]),
        run(&modes_on_workload("app-safe")),
    ] {
        assert!(out.events[0].apps.is_empty() && annotation(&out).is_none(), "{:?}", out.events[0]);
    }
    // Another image: nothing.
    let other = run(&STS.replace("postgres:17", "registry.example.com/team/api:1.2"));
    assert!(other.events[0].apps.is_empty() && annotation(&other).is_none());
    let bitnami = run(&STS.replace("postgres:17", "docker.io/bitnami/postgresql:16@sha256:ab"));
    assert_eq!(bitnami.events[0].apps, ["docker.io/bitnami/postgresql:16@sha256:ab (PostgreSQL)"]);
}

#[test]
fn an_invalid_modes_annotation_refuses_the_workload_and_says_why() {
    let why = "annotation volprep.io/modes: 'strict' is not a mode policy: kubelet or app-safe";
    for input in [modes_on_workload("strict"), modes_on_template(&modes_on_workload("app-safe"), "strict")] {
        let out = run_with(&input, &["annotateRefusals=false", "modes=app-safe"]);
        assert_eq!(out.text, input, "left byte for byte");
        assert_eq!(out.events[0].outcome, Outcome::Refused(vec![why.to_string()]));
        let annotated = doc(&run(&input).text);
        assert_eq!(annotated.at(&["metadata", "annotations", REFUSED_ANNOTATION]).and_then(Node::as_str), Some(why));
        assert!(annotated.at(&["spec", "template", "spec", "initContainers"]).is_none());
    }
    // Refused with the other reasons, not instead of them.
    let mixed = modes_on_workload("\"\"").replace(
        "configMap:\n            name: db\n            defaultMode: 0644",
        "secret:\n            secretName: db\n            defaultMode: 0440",
    );
    let Outcome::Refused(reasons) = &run(&mixed).events[0].outcome else { panic!("refused") };
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(reasons[1].contains("'' is not a mode policy"), "{reasons:?}");
    // An opted-out workload is left alone, whatever it says.
    let out_opted = modes_on_workload("strict")
        .replace("    volprep.io/modes", "    volprep.io/inject: \"false\"\n    volprep.io/modes");
    assert!(matches!(&run(&out_opted).events[0].outcome, Outcome::Skipped(w) if w.contains("opted out")));
}

#[test]
fn the_kubelet_policy_adds_nothing() {
    let default = run(STS).text;
    assert!(!default.contains("modes="), "{default}");
    assert_eq!(run_with(STS, &["modes=kubelet"]).text, default, "byte for byte");
    assert_eq!(run_with(STS, &["modes=null"]).text, default);
    assert_eq!(init_args(&run_with(&modes_on_workload("kubelet"), &[])), init_args(&run(STS)));
}
