//! Every volume type by the kubelet's table, refusals only where a container loses access,
//! mode unprivileged with emptyDirs only, pod-template kinds beyond the core ones.

use std::path::Path;

use super::config::Config;
use super::node::Node;
use super::parse::parse;
use super::{Outcome, inject_stream};

/// A pod with fsGroup 1000 whose container `app` mounts each of `volumes` (YAML flow maps).
fn pod(kind_head: &str, volumes: &[&str], extra_containers: &str) -> String {
    let mounts: String = volumes
        .iter()
        .map(|v| {
            let name = parse(v).unwrap()[0].get("name").and_then(Node::as_str).unwrap().to_string();
            format!("        - {{name: {name}, mountPath: /m/{name}}}\n")
        })
        .collect();
    let vols: String = volumes.iter().map(|v| format!("    - {v}\n")).collect();
    format!(
        "{kind_head}spec:\n  securityContext: {{runAsUser: 1000, fsGroup: 1000}}\n  containers:\n    - name: app\n      image: app\n      volumeMounts:\n{mounts}{extra_containers}  volumes:\n{vols}"
    )
}

const POD_HEAD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n";

fn run_with(text: &str, sets: &[&str]) -> super::Output {
    let mut cfg = Config::default();
    for s in sets {
        cfg.set_pair(s).unwrap();
    }
    inject_stream(text, Path::new("-"), &cfg, &[]).unwrap()
}

fn volume_args(text: &str, path: &[&str]) -> Vec<String> {
    let d = parse(text).unwrap().remove(0);
    let init = d.at(path).and_then(|p| p.get("initContainers")).map(Node::as_seq).unwrap_or(&[]);
    let Some(c) = init.first() else { return Vec::new() };
    c.get("args")
        .map(Node::as_seq)
        .unwrap_or(&[])
        .iter()
        .filter_map(Node::as_str)
        .filter(|a| a.starts_with("--volume") || a.starts_with("--sticky"))
        .map(str::to_string)
        .collect()
}

/// The in-tree disks, CSI-migrated or not, are walked by the kubelet unless read-only: volprep
/// prepares them.
#[test]
fn disks_the_kubelet_walks_are_prepared() {
    for disk in [
        "iscsi: {targetPortal: 'p:3260', iqn: 'iqn.x', lun: 0, fsType: ext4}",
        "fc: {wwids: [w]}",
        "rbd: {monitors: [m], image: i}",
        "awsElasticBlockStore: {volumeID: v}",
        "gcePersistentDisk: {pdName: d}",
        "azureDisk: {diskName: d, diskURI: u}",
        "cinder: {volumeID: v}",
        "flexVolume: {driver: d}",
        "gitRepo: {repository: r}",
    ] {
        let text = pod(
            POD_HEAD,
            &["{name: data, persistentVolumeClaim: {claimName: c}}", &format!("{{name: disk, {disk}}}")],
            "",
        );
        let out = run_with(&text, &[]);
        assert_eq!(out.events[0].outcome, Outcome::Injected, "{disk}");
        assert_eq!(
            volume_args(&out.text, &["spec"]),
            ["--volume=/volumes/data,fs-group=1000", "--volume=/volumes/disk,fs-group=1000"],
            "{disk}"
        );
        if disk.starts_with("gitRepo") {
            continue;
        }
        let ro = text.replace("}}\n", ", readOnly: true}}\n");
        let out = run_with(&ro, &[]);
        assert!(
            !volume_args(&out.text, &["spec"]).iter().any(|a| a.contains("disk")),
            "{disk} read-only is not walked"
        );
    }
}

/// Inline CSI (and azureFile) get the fsGroup by their driver's rules: refused, naming the
/// volume and the container; read-only inline CSI is never walked.
#[test]
fn inline_csi_is_refused_naming_volume_and_container() {
    let text = pod(
        POD_HEAD,
        &[
            "{name: data, persistentVolumeClaim: {claimName: c}}",
            "{name: scratch, csi: {driver: ebs.csi.aws.com, fsType: ext4}}",
        ],
        "",
    );
    let out = run_with(&text, &["annotateRefusals=false"]);
    assert_eq!(out.text, text);
    let Outcome::Refused(why) = &out.events[0].outcome else { panic!("{:?}", out.events) };
    assert!(why[0].starts_with("volume scratch (csi) mounted by app: "), "{why:?}");
    let ro = pod(
        POD_HEAD,
        &[
            "{name: data, persistentVolumeClaim: {claimName: c}}",
            "{name: secrets, csi: {driver: secrets-store.csi.k8s.io, readOnly: true}}",
        ],
        "",
    );
    assert_eq!(run_with(&ro, &[]).events[0].outcome, Outcome::Injected);
}

/// A sidecar running as another user that mounts no walked volume (prometheus'
/// configmap-reload) does not stop the rewrite; one that mounts the data volume does, named.
#[test]
fn refusals_only_where_a_container_mounting_the_volume_would_lose_access() {
    let reload = "    - name: configmap-reload\n      image: reload\n      securityContext: {runAsUser: 65534}\n      volumeMounts: [{name: config, mountPath: /etc/config, readOnly: true}]\n";
    let text = pod(
        POD_HEAD,
        &["{name: data, persistentVolumeClaim: {claimName: c}}", "{name: config, configMap: {name: c}}"],
        reload,
    );
    let text = text.replace("        - {name: config, mountPath: /m/config}\n", "");
    assert_eq!(run_with(&text, &[]).events[0].outcome, Outcome::Injected);
    let sharing =
        text.replace("{name: config, mountPath: /etc/config, readOnly: true}", "{name: data, mountPath: /data}");
    let Outcome::Refused(why) = &run_with(&sharing, &[]).events[0].outcome else { panic!() };
    assert_eq!(why.len(), 1, "{why:?}");
    assert!(why[0].starts_with("containers mounting volume data run as different users (app 1000:image default, configmap-reload 65534:image default)"), "{why:?}");
    // A group-only secret mounted only by a root container: root keeps access.
    let root = pod(
        POD_HEAD,
        &["{name: data, persistentVolumeClaim: {claimName: c}}"],
        "    - name: agent\n      image: a\n      securityContext: {runAsUser: 0}\n      volumeMounts: [{name: token, mountPath: /t}]\n",
    );
    let root = format!("{root}    - {{name: token, secret: {{secretName: t, defaultMode: 0440}}}}\n");
    assert_eq!(run_with(&root, &[]).events[0].outcome, Outcome::Injected);
}

/// Mode unprivileged cannot prepare an emptyDir (root's): with nothing else to prepare the
/// pod is refused with that reason, not skipped with a wrong one.
#[test]
fn unprivileged_with_empty_dirs_only_is_refused_with_the_reason() {
    let text = pod(POD_HEAD, &["{name: cache, emptyDir: {}}"], "");
    let out = run_with(&text, &["mode=unprivileged"]);
    let Outcome::Refused(why) = &out.events[0].outcome else { panic!("{:?}", out.events) };
    assert!(why[0].starts_with("mode unprivileged cannot prepare emptyDir cache"), "{why:?}");
    assert_eq!(run_with(&text, &[]).events[0].outcome, Outcome::Injected, "mode root prepares it");
}

/// Argo Rollouts are injected like Deployments; a kind inject does not know that carries a pod
/// template with fsGroup is refused with the reason, not passed over in silence.
#[test]
fn rollouts_are_injected_and_unknown_pod_template_kinds_said() {
    let inner = pod("", &["{name: data, persistentVolumeClaim: {claimName: c}}"], "");
    let template: String = inner.lines().map(|l| format!("    {l}\n")).collect();
    let rollout = format!(
        "apiVersion: argoproj.io/v1alpha1\nkind: Rollout\nmetadata: {{name: r}}\nspec:\n  template:\n{template}"
    );
    let out = run_with(&rollout, &[]);
    assert_eq!(out.events[0].outcome, Outcome::Injected);
    assert_eq!(volume_args(&out.text, &["spec", "template", "spec"]), ["--volume=/volumes/data,fs-group=1000"]);
    let other = rollout.replace("kind: Rollout", "kind: Workflowish");
    let Outcome::Refused(why) = &run_with(&other, &[]).events[0].outcome else { panic!() };
    assert!(why[0].starts_with("Workflowish is not a kind inject knows"), "{why:?}");
}
