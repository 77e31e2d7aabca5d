//! Which pod templates `inject` rewrites, and how, decided without changing anything: a
//! [`Decision`] per object, from its pod spec and the configuration.

use std::collections::BTreeSet;

use super::config::{Config, Mode, Select};
use super::node::Node;

/// The annotation that opts a workload out (`"false"`) or, with `--opt-in`, in (`"true"`).
pub const ANNOTATION: &str = "volprep.io/inject";

/// What to do with one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Left as it is, and why (not a pod template, not selected, already injected).
    Skip(String),
    /// Left as it is because the rewrite would change what the app may read or do.
    Refuse(Vec<String>),
    Inject(Plan),
}

/// The rewrite of one pod template.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub fs_group: u64,
    pub volumes: Vec<Volume>,
    /// The uid and gid of the init container in mode unprivileged.
    pub run_as: Option<(u64, u64)>,
}

/// A volume the init container mounts at /volumes/NAME.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub prep: Prep,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prep {
    /// `--volume /volumes/NAME,fs-group=GID[,read-only]`: what the kubelet's fsGroup pass did.
    Walk { read_only: bool },
    /// `--sticky /volumes/NAME`: an emptyDir the app uses as its temp dir, made 01777.
    Sticky,
}

/// Where the pod spec of a kind is, from the object's root.
pub fn pod_spec_path(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "Pod" => &["spec"],
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" | "ReplicationController" => {
            &["spec", "template", "spec"]
        }
        "CronJob" => &["spec", "jobTemplate", "spec", "template", "spec"],
        "PodTemplate" => &["template", "spec"],
        _ => return None,
    })
}

/// The annotation's value on the object or on its pod template (the template's wins).
fn annotation(obj: &Node, path: &[&str]) -> Option<bool> {
    let meta = &path[..path.len() - 1];
    let on =
        |p: &[&str]| obj.at(p).and_then(|m| m.at(&["metadata", "annotations", ANNOTATION])).and_then(Node::as_bool);
    if meta.is_empty() { on(&[]) } else { on(meta).or_else(|| on(&[])) }
}

/// The decision for one object.
pub fn decide(obj: &Node, cfg: &Config) -> Decision {
    let kind = obj.get("kind").and_then(Node::as_str).unwrap_or("");
    let Some(path) = pod_spec_path(kind) else { return Decision::Skip("not a pod template".into()) };
    let Some(pod) = obj.at(path) else { return Decision::Skip("no pod spec".into()) };
    let wanted = annotation(obj, path);
    if wanted == Some(false) {
        return Decision::Skip(format!("opted out ({ANNOTATION}: \"false\")"));
    }
    let opted_in = wanted == Some(true);
    if cfg.select == Select::OptIn && !opted_in {
        return Decision::Skip(format!("not opted in ({ANNOTATION}: \"true\")"));
    }
    if containers(pod).iter().any(|c| is_volprep(c, cfg)) {
        return Decision::Skip("already injected".into());
    }
    let not_here = |why: &str| if opted_in { Decision::Refuse(vec![why.into()]) } else { Decision::Skip(why.into()) };
    let Some(fs_group_node) = pod.at(&["securityContext", "fsGroup"]).filter(|n| !n.is_null()) else {
        return not_here("no fsGroup to move");
    };
    let Some(fs_group) = fs_group_node.as_u64() else {
        return Decision::Refuse(vec!["fsGroup is not a number".into()]);
    };
    let volumes = walked_volumes(obj, pod, cfg);
    let mut refusals = group_only_volumes(pod);
    let users = users(pod);
    if users.len() > 1 {
        let list: Vec<String> = users.iter().map(|(c, u)| format!("{c} {u}")).collect();
        refusals.push(format!(
            "containers run as different users ({}): they share files through the fsGroup the kubelet re-applies at every start, volprep does once",
            list.join(", ")
        ));
    }
    let run_as = match cfg.mode {
        Mode::Root => None,
        Mode::Unprivileged => match unprivileged_ids(pod, cfg) {
            Ok(ids) => Some(ids),
            Err(e) => {
                refusals.push(e);
                None
            }
        },
    };
    if !refusals.is_empty() {
        return Decision::Refuse(refusals);
    }
    if volumes.is_empty() {
        return not_here("no volume the kubelet's fsGroup pass walks");
    }
    Decision::Inject(Plan { fs_group, volumes, run_as })
}

/// Init containers, then containers.
fn containers(pod: &Node) -> Vec<&Node> {
    ["initContainers", "containers"].iter().flat_map(|k| pod.get(k).map(Node::as_seq).unwrap_or(&[])).collect()
}

fn is_volprep(c: &Node, cfg: &Config) -> bool {
    let image = c.get("image").and_then(Node::as_str).unwrap_or("");
    let base = image.split(['@']).next().unwrap_or("").rsplit('/').next().unwrap_or("");
    let repo = base.split(':').next().unwrap_or("");
    c.get("name").and_then(Node::as_str) == Some(cfg.container.name.as_str()) || repo == cfg.container.image.repository
}

/// The volumes the kubelet's fsGroup pass walks (PVC, generic ephemeral, emptyDir, and the
/// claim templates of a StatefulSet) that a container mounts, in the pod's order.
fn walked_volumes(obj: &Node, pod: &Node, cfg: &Config) -> Vec<Volume> {
    let mut kinds: Vec<(String, bool)> = Vec::new(); // (name, is emptyDir)
    for v in pod.get("volumes").map(Node::as_seq).unwrap_or(&[]) {
        let Some(name) = v.get("name").and_then(Node::as_str) else { continue };
        let pvc_read_only = v.at(&["persistentVolumeClaim", "readOnly"]).and_then(Node::as_bool) == Some(true);
        if (v.get("persistentVolumeClaim").is_some() && !pvc_read_only) || v.get("ephemeral").is_some() {
            kinds.push((name.to_string(), false));
        } else if v.get("emptyDir").is_some() && cfg.mode == Mode::Root {
            kinds.push((name.to_string(), true));
        }
    }
    if obj.get("kind").and_then(Node::as_str) == Some("StatefulSet") {
        for t in obj.at(&["spec", "volumeClaimTemplates"]).map(Node::as_seq).unwrap_or(&[]) {
            if let Some(name) = t.at(&["metadata", "name"]).and_then(Node::as_str) {
                kinds.push((name.to_string(), false));
            }
        }
    }
    let mut out = Vec::new();
    for (name, empty_dir) in kinds {
        let mounts: Vec<(&Node, &Node)> = containers(pod)
            .into_iter()
            .flat_map(|c| c.get("volumeMounts").map(Node::as_seq).unwrap_or(&[]).iter().map(move |m| (c, m)))
            .filter(|(_, m)| m.get("name").and_then(Node::as_str) == Some(name.as_str()))
            .collect();
        if mounts.is_empty() || out.iter().any(|v: &Volume| v.name == name) {
            continue;
        }
        let tmp = mounts.iter().any(|(c, m)| is_tmp_dir(c, m, cfg));
        let read_only = mounts.iter().all(|(_, m)| m.get("readOnly").and_then(Node::as_bool) == Some(true));
        let prep = if empty_dir && tmp { Prep::Sticky } else { Prep::Walk { read_only } };
        out.push(Volume { name, prep });
    }
    out
}

/// A mount at one of the temp dir paths, or at the container's $TMPDIR.
fn is_tmp_dir(c: &Node, m: &Node, cfg: &Config) -> bool {
    let Some(path) = m.get("mountPath").and_then(Node::as_str) else { return false };
    let path = path.trim_end_matches('/');
    let tmpdir = c
        .get("env")
        .map(Node::as_seq)
        .unwrap_or(&[])
        .iter()
        .find(|e| e.get("name").and_then(Node::as_str) == Some("TMPDIR"))
        .and_then(|e| e.get("value"))
        .and_then(Node::as_str);
    cfg.tmp_dirs.iter().map(|t| t.trim_end_matches('/')).chain(tmpdir).any(|t| t == path)
}

/// Secret, configMap, projected and downwardAPI volumes with a file mode that lets the group
/// read but not others: the kubelet gives those files the fsGroup only when fsGroup is set.
fn group_only_volumes(pod: &Node) -> Vec<String> {
    let mut out = Vec::new();
    for v in pod.get("volumes").map(Node::as_seq).unwrap_or(&[]) {
        let name = v.get("name").and_then(Node::as_str).unwrap_or("?");
        for kind in ["secret", "configMap", "projected", "downwardAPI"] {
            let Some(src) = v.get(kind) else { continue };
            let mut modes: Vec<u64> = vec![src.get("defaultMode").and_then(Node::as_u64).unwrap_or(0o644)];
            let mut item_modes = |s: &Node| {
                modes.extend(
                    s.get("items").map(Node::as_seq).unwrap_or(&[]).iter().filter_map(|i| i.get("mode")?.as_u64()),
                )
            };
            item_modes(src);
            for s in src.get("sources").map(Node::as_seq).unwrap_or(&[]) {
                for sub in ["secret", "configMap", "downwardAPI"] {
                    s.get(sub).into_iter().for_each(&mut item_modes);
                }
            }
            if let Some(m) = modes.into_iter().find(|m| m & 0o040 != 0 && m & 0o004 == 0) {
                out.push(format!(
                    "volume {name} ({kind}, mode {m:04o}) is readable through its group only: without fsGroup its files keep group root and the app could no longer read them"
                ));
            }
        }
    }
    out
}

/// Each distinct (runAsUser, runAsGroup) of the containers with the first container having it.
fn users(pod: &Node) -> Vec<(String, String)> {
    let psc = pod.get("securityContext");
    let id = |c: &Node, key: &str| {
        c.at(&["securityContext", key])
            .or_else(|| psc.and_then(|p| p.get(key)))
            .and_then(Node::as_u64)
            .map_or("image default".to_string(), |n| n.to_string())
    };
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for c in containers(pod) {
        let u = format!("{}:{}", id(c, "runAsUser"), id(c, "runAsGroup"));
        if seen.insert(u.clone()) {
            out.push((c.get("name").and_then(Node::as_str).unwrap_or("?").to_string(), u));
        }
    }
    out
}

/// Mode unprivileged: the app's uid and gid (config first, then the pod and its containers).
fn unprivileged_ids(pod: &Node, cfg: &Config) -> Result<(u64, u64), String> {
    let from_pod = |key: &str| {
        containers(pod)
            .iter()
            .find_map(|c| c.at(&["securityContext", key]).and_then(Node::as_u64))
            .or_else(|| pod.at(&["securityContext", key]).and_then(Node::as_u64))
    };
    let uid = cfg.container.run_as_user.or_else(|| from_pod("runAsUser"));
    match uid {
        Some(0) | None => Err("mode unprivileged runs volprep as the app's uid: the pod sets no non-root runAsUser (set runAsUser in the configuration)".into()),
        Some(uid) => Ok((uid, cfg.container.run_as_group.or_else(|| from_pod("runAsGroup")).unwrap_or(uid))),
    }
}
